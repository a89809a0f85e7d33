//! The training loop: AdamW with the configured schedule, validation every N steps, test
//! accuracy of the last and of the best-validation weights, and a run directory holding
//! `config.json`, `metrics.jsonl`, `result.json` and the weights.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamWConfig, GradientsParams};
use burn::prelude::*;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::backend::BackendKind;
use crate::config::{RunConfig, Selection};
use crate::data::{Batch, Dataset, write_atomic};
use crate::model::{LraClassifier, ParamBudget};
use crate::rng::Rng;

/// The three splits of a task and its vocabulary size.
#[derive(Debug, Clone)]
pub struct Splits {
    /// Training split.
    pub train: Dataset,
    /// Validation split (model selection).
    pub val: Dataset,
    /// Test split (reported).
    pub test: Dataset,
    /// Token ids are below this.
    pub vocab_size: usize,
}

/// What a run is: which attention, seed and backend, and where it writes.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// Registry name of the attention.
    pub attention: String,
    /// Training seed (initialisation, data order, dropout).
    pub seed: u64,
    /// Backend to run on.
    pub backend: BackendKind,
    /// Run directory.
    pub run_dir: PathBuf,
    /// The preset's name or the config file's path, recorded with the results.
    pub preset: String,
    /// Draw a progress bar on the terminal.
    pub progress: bool,
}

/// The outcome of a run, as written to `result.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Task name.
    pub task: String,
    /// Attention name.
    pub attention: String,
    /// Preset name or config path.
    pub preset: String,
    /// Training seed.
    pub seed: u64,
    /// Backend.
    pub backend: BackendKind,
    /// Device, as Burn names it.
    pub device: String,
    /// Steps trained.
    pub steps: usize,
    /// Trainable parameters of the model (frozen random features not counted).
    pub n_params: usize,
    /// Trainable parameters of the softmax model of the same configuration.
    pub n_params_softmax: usize,
    /// Relative parameter increase over that softmax model.
    pub param_increase: f64,
    /// Which weights `test_accuracy` comes from.
    pub selection: Selection,
    /// Test accuracy of the selected weights.
    pub test_accuracy: f64,
    /// Test accuracy after the last step.
    pub test_accuracy_last: f64,
    /// Test accuracy of the best-validation weights.
    pub test_accuracy_best_val: f64,
    /// Best validation accuracy.
    pub best_val_accuracy: f64,
    /// Step of the best validation accuracy.
    pub best_val_step: usize,
    /// Share of the test set's most frequent class.
    pub test_majority_rate: f64,
    /// Examples in the train, validation and test splits.
    pub split_sizes: [usize; 3],
    /// Wall-clock training time, validation included.
    pub train_seconds: f64,
}

/// Accuracy and mean loss of `model` on `data`, in batches of `batch_size`, without autodiff.
pub fn evaluate(
    model: &LraClassifier,
    data: &Dataset,
    batch_size: usize,
    device: &Device,
) -> (f64, f64) {
    // Batches of similar lengths waste less work on padding; the order does not change the sums.
    let mut order: Vec<usize> = (0..data.len()).collect();
    order.sort_by_key(|&i| data.examples[i].tokens.len());
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let (mut correct, mut loss_sum) = (0i64, 0f64);
    for chunk in order.chunks(batch_size) {
        let examples: Vec<_> = chunk.iter().map(|&i| &data.examples[i]).collect();
        let batch = Batch::new(&examples, device);
        let logits = model.forward(batch.tokens, batch.mask_pad);
        let loss = loss_fn.forward(logits.clone(), batch.labels.clone());
        loss_sum += loss.into_scalar::<f64>() * chunk.len() as f64;
        correct += accuracy_count(logits, batch.labels);
    }
    (
        correct as f64 / data.len() as f64,
        loss_sum / data.len() as f64,
    )
}

fn accuracy_count(logits: Tensor<2>, labels: Tensor<1, Int>) -> i64 {
    let [batch, _] = logits.dims();
    logits
        .argmax(1)
        .reshape([batch])
        .equal(labels)
        .int()
        .sum()
        .into_scalar::<i64>()
}

/// Saves `model`'s weights to `path` atomically.
fn save_weights(model: &LraClassifier, path: &Path) -> Result<()> {
    let tmp = path.with_extension("bpk.tmp");
    model
        .clone()
        .save_file(&tmp)
        .map_err(|e| anyhow::anyhow!("cannot save weights to {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// Trains one model and writes its run directory.
pub fn train(config: &RunConfig, data: &Splits, opts: &TrainOptions) -> Result<RunResult> {
    let cfg = &config.training;
    let base_device = opts.backend.device()?;
    // Counted before seeding: building the two models for the count draws random numbers, and
    // the run must not depend on it.
    let budget = ParamBudget::count(
        config,
        &opts.attention,
        data.vocab_size,
        data.train.n_classes,
        &base_device,
    )?;
    let n_params = budget.n_params;
    eprintln!(
        "model: {n_params} trainable parameters, {:+.2}% over softmax ({})",
        100.0 * budget.increase(),
        budget.softmax_params
    );
    let device = base_device.clone().autodiff();
    device.seed(opts.seed);
    let run_dir = &opts.run_dir;
    std::fs::create_dir_all(run_dir)
        .with_context(|| format!("cannot create run directory {}", run_dir.display()))?;
    if run_dir.join("result.json").exists() {
        bail!(
            "{} already holds a finished run (result.json); remove it to train again",
            run_dir.display()
        );
    }

    let mut model = LraClassifier::new(
        config,
        &opts.attention,
        data.vocab_size,
        data.train.n_classes,
        &device,
    )?;
    let resolved_attention = config.attention_config(&opts.attention)?;
    write_atomic(
        &run_dir.join("config.json"),
        serde_json::to_string_pretty(&json!({
            "run": config,
            "attention_name": opts.attention,
            "attention_resolved": resolved_attention,
            "seed": opts.seed,
            "backend": opts.backend,
            "preset": opts.preset,
            "n_params": n_params,
            "n_params_softmax": budget.softmax_params,
            "param_increase": budget.increase(),
            "split_sizes": [data.train.len(), data.val.len(), data.test.len()],
        }))?
        .as_bytes(),
    )?;
    let metrics_path = run_dir.join("metrics.jsonl");
    let mut metrics = std::fs::File::create(&metrics_path)
        .with_context(|| format!("cannot create {}", metrics_path.display()))?;

    let o = &cfg.optimizer;
    let mut optim = AdamWConfig::new()
        .with_beta_1(o.beta1)
        .with_beta_2(o.beta2)
        .with_epsilon(o.epsilon)
        .with_weight_decay(o.weight_decay)
        .init();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);

    let bar = if opts.progress {
        ProgressBar::new(cfg.steps as u64)
    } else {
        ProgressBar::with_draw_target(Some(cfg.steps as u64), ProgressDrawTarget::hidden())
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
        )
        .expect("valid template"),
    );

    let mut rng = Rng::new(opts.seed ^ 0x5EED_DA7A);
    let mut order: Vec<usize> = Vec::new();
    let mut cursor = 0;
    let mut best: Option<(f64, usize, LraClassifier)> = None;
    let (mut loss_sum, mut correct, mut seen) = (0f64, 0i64, 0usize);
    let started = Instant::now();
    let eval_device = base_device.clone();

    for step in 1..=cfg.steps {
        if cursor + cfg.batch_size > order.len() {
            order = (0..data.train.len()).collect();
            rng.shuffle(&mut order);
            cursor = 0;
        }
        let take = cfg.batch_size.min(order.len());
        let examples: Vec<_> = order[cursor..cursor + take]
            .iter()
            .map(|&i| &data.train.examples[i])
            .collect();
        cursor += take;
        let batch = Batch::new(&examples, &device);
        let logits = model.forward(batch.tokens, batch.mask_pad);
        let loss = loss_fn.forward(logits.clone(), batch.labels.clone());
        let lr = cfg.schedule.lr(step, cfg.steps);
        // The objective adds the attentions' regularisers (the orthogonality penalty); the
        // reported loss stays the cross-entropy, comparable across variants.
        let objective = match model.penalty() {
            Some(penalty) => loss.clone() + penalty,
            None => loss.clone(),
        };
        let grads = GradientsParams::from_grads(objective.backward(), &model);
        model = optim.step(lr, model, grads);
        if cfg.redraw_every.is_some_and(|every| step % every == 0) {
            model.encoder = model.encoder.redraw();
        }

        let loss_value = loss.into_scalar::<f64>();
        if !loss_value.is_finite() {
            bail!("training diverged at step {step}: loss is {loss_value}");
        }
        loss_sum += loss_value * take as f64;
        correct += accuracy_count(logits.detach(), batch.labels);
        seen += take;
        bar.set_position(step as u64);

        if step % cfg.eval_every == 0 || step == cfg.steps {
            let valid = model.valid();
            let (val_acc, val_loss) = evaluate(&valid, &data.val, cfg.batch_size, &eval_device);
            let train_loss = loss_sum / seen as f64;
            let train_acc = correct as f64 / seen as f64;
            let line = json!({
                "step": step,
                "lr": lr,
                "train_loss": train_loss,
                "train_accuracy": train_acc,
                "val_loss": val_loss,
                "val_accuracy": val_acc,
                "elapsed_s": started.elapsed().as_secs_f64(),
            });
            writeln!(metrics, "{line}")
                .and_then(|_| metrics.flush())
                .with_context(|| format!("cannot write {}", metrics_path.display()))?;
            let message = format!(
                "loss {train_loss:.3} acc {train_acc:.3} | val acc {val_acc:.3} loss {val_loss:.3}"
            );
            if !opts.progress {
                eprintln!("step {step}/{}: {message}", cfg.steps);
            }
            bar.set_message(message);
            (loss_sum, correct, seen) = (0.0, 0, 0);
            if best.as_ref().is_none_or(|(acc, ..)| val_acc > *acc) {
                save_weights(&valid, &run_dir.join("model-best.bpk"))?;
                best = Some((val_acc, step, valid));
            }
        }
    }
    bar.finish();
    let train_seconds = started.elapsed().as_secs_f64();

    let last = model.valid();
    save_weights(&last, &run_dir.join("model-last.bpk"))?;
    let (best_val_accuracy, best_val_step, best_model) = best.expect("the last step validates");
    let (test_last, _) = evaluate(&last, &data.test, cfg.batch_size, &eval_device);
    let (test_best, _) = evaluate(&best_model, &data.test, cfg.batch_size, &eval_device);
    let result = RunResult {
        task: config.task.name().to_string(),
        attention: opts.attention.clone(),
        preset: opts.preset.clone(),
        seed: opts.seed,
        backend: opts.backend,
        device: format!("{base_device:?}"),
        steps: cfg.steps,
        n_params,
        n_params_softmax: budget.softmax_params,
        param_increase: budget.increase(),
        selection: cfg.selection,
        test_accuracy: match cfg.selection {
            Selection::BestVal => test_best,
            Selection::Last => test_last,
        },
        test_accuracy_last: test_last,
        test_accuracy_best_val: test_best,
        best_val_accuracy,
        best_val_step,
        test_majority_rate: data.test.majority_rate(),
        split_sizes: [data.train.len(), data.val.len(), data.test.len()],
        train_seconds,
    };
    write_atomic(
        &run_dir.join("result.json"),
        serde_json::to_string_pretty(&result)?.as_bytes(),
    )?;
    Ok(result)
}
