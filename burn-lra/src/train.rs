//! The training loop: AdamW with the configured schedule, gradient accumulation and clipping,
//! validation every N steps, test accuracy of the last and of the best-validation weights, and
//! a run directory holding `config.json`, `metrics.jsonl`, `result.json`, the weights and a
//! resumable checkpoint.
//!
//! Resuming reproduces an unbroken run: the checkpoint holds the weights, the optimiser state,
//! the best-validation record and the running sums; the data order is a pure function of the
//! seed (replayed to the checkpoint's step); and the device's random generator (dropout, feature
//! redraws) is reseeded from (seed, step) at every checkpoint step, in unbroken and resumed runs
//! alike.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn::optim::{AdamWConfig, GradientsAccumulator, GradientsParams};
use burn::prelude::*;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::backend::BackendKind;
use crate::config::{OptimizerConfig, RunConfig, Selection};
use crate::data::loader::{BatchPlan, evaluation_batches, training_batches};
use crate::data::{Dataset, write_atomic};
use crate::model::{LraClassifier, ParamBudget, check_memory};

/// The three splits of a task and its vocabulary size.
#[derive(Debug, Clone)]
pub struct Splits {
    /// Training split.
    pub train: Dataset,
    /// Validation split (model selection); `None` when the test split is also the validation
    /// split (`data.validation = "test"`, LRA's choice for IMDB).
    pub val: Option<Dataset>,
    /// Test split (reported).
    pub test: Dataset,
    /// Token ids are below this.
    pub vocab_size: usize,
}

impl Splits {
    /// The split model selection uses.
    pub fn validation(&self) -> &Dataset {
        self.val.as_ref().unwrap_or(&self.test)
    }

    /// Examples in the train, validation and test splits.
    pub fn sizes(&self) -> [usize; 3] {
        [self.train.len(), self.validation().len(), self.test.len()]
    }
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
    /// Continue the unfinished run in `run_dir` from its checkpoint.
    pub resume: bool,
    /// Stop after this step as if killed (no result written): for testing resumption.
    pub stop_after: Option<usize>,
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
    /// Where validation examples came from (a file, a hold-out, or the test split).
    pub validation_source: String,
    /// Whether model selection saw the test split (`data.validation = "test"`).
    pub validated_on_test: bool,
    /// Wall-clock training time, validation included.
    pub train_seconds: f64,
}

/// Accuracy and mean loss of `model` on `data`, in batches of `batch_size`, without autodiff.
/// Batches are padded on a worker thread.
pub fn evaluate(
    model: &LraClassifier,
    data: &Dataset,
    batch_size: usize,
    device: &Device,
) -> (f64, f64) {
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let (mut correct, mut loss_sum) = (0i64, 0f64);
    std::thread::scope(|scope| {
        for batch in evaluation_batches(scope, data, batch_size) {
            let batch = batch.to_device(device);
            let n = batch.labels.dims()[0];
            let logits = model.forward(batch.tokens, batch.pair);
            let loss = loss_fn.forward(logits.clone(), batch.labels.clone());
            loss_sum += loss.into_scalar::<f64>() * n as f64;
            correct += accuracy_count(logits, batch.labels);
        }
    });
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

fn load_weights(model: LraClassifier, path: &Path) -> Result<LraClassifier> {
    model
        .try_load_file(path)
        .map_err(|e| anyhow::anyhow!("cannot load weights from {}: {e}", path.display()))
}

/// Scales `grads` so that their global L2 norm is at most `max_norm` (PyTorch's
/// `clip_grad_norm_`); returns the norm before clipping.
pub fn clip_global_norm(
    model: &LraClassifier,
    grads: GradientsParams,
    max_norm: f32,
) -> (GradientsParams, f64) {
    struct SumSquares<'a> {
        grads: &'a GradientsParams,
        total: Option<Tensor<1>>,
    }
    impl ModuleVisitor for SumSquares<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(g) = self.grads.get::<D>(param.id) {
                let s = g.powi_scalar(2).sum();
                self.total = Some(match self.total.take() {
                    Some(t) => t + s,
                    None => s,
                });
            }
        }
    }
    struct Scale {
        grads: GradientsParams,
        factor: f32,
    }
    impl ModuleVisitor for Scale {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(g) = self.grads.remove::<D>(param.id) {
                self.grads.register(param.id, g.mul_scalar(self.factor));
            }
        }
    }
    let mut sum = SumSquares {
        grads: &grads,
        total: None,
    };
    model.visit(&mut sum);
    let norm = sum.total.map_or(0.0, |t| t.into_scalar::<f64>().sqrt());
    if norm <= max_norm as f64 || !norm.is_finite() {
        return (grads, norm);
    }
    let mut scale = Scale {
        grads,
        factor: (max_norm as f64 / (norm + 1e-6)) as f32,
    };
    model.visit(&mut scale);
    (scale.grads, norm)
}

/// Whether every parameter of `model` is finite.
fn weights_finite(model: &LraClassifier) -> bool {
    struct Finite(Vec<Tensor<1>>);
    impl ModuleVisitor for Finite {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push(param.val().sum().reshape([1]));
        }
    }
    let mut sums = Finite(Vec::new());
    model.visit(&mut sums);
    Tensor::cat(sums.0, 0)
        .sum()
        .into_scalar::<f64>()
        .is_finite()
}

/// What a checkpoint holds besides the weights and the optimiser state.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct TrainState {
    /// Steps done.
    step: usize,
    /// Best validation accuracy so far and its step (its weights are `model-best.bpk`).
    best: Option<(f64, usize)>,
    /// Running sums since the last validation: loss · examples, correct, examples.
    loss_sum: f64,
    correct: i64,
    seen: usize,
    /// Training time before this process.
    elapsed_s: f64,
}

const CHECKPOINT: &str = "checkpoint";

/// The files of a checkpoint whose SHA-256 it records (in `checksums.json`) and a resume checks.
const CHECKSUMMED: [&str; 2] = ["model.bpk", "optimizer.bpk"];

/// The SHA-256 of `path`'s bytes, in hex.
fn sha256_file(path: &Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Records the checksums of a checkpoint's files in `dir/checksums.json`.
fn write_checksums(dir: &Path) -> Result<()> {
    let mut sums = serde_json::Map::new();
    for name in CHECKSUMMED {
        sums.insert(name.into(), sha256_file(&dir.join(name))?.into());
    }
    write_atomic(
        &dir.join("checksums.json"),
        serde_json::to_string_pretty(&sums)?.as_bytes(),
    )
}

/// Checks a checkpoint's files against its `checksums.json`; a mismatch is an error naming the
/// file. A checkpoint written before checksums were kept is accepted with a warning.
fn verify_checksums(dir: &Path) -> Result<()> {
    let path = dir.join("checksums.json");
    if !path.exists() {
        eprintln!(
            "warning: {} has no checksums.json (written before checksums were kept); its files \
             are not verified",
            dir.display()
        );
        return Ok(());
    }
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let sums: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a checksum list", path.display()))?;
    for name in CHECKSUMMED {
        let file = dir.join(name);
        let expected = sums
            .get(name)
            .and_then(|v| v.as_str())
            .with_context(|| format!("{}: no checksum for {name}", path.display()))?;
        if sha256_file(&file)? != expected {
            bail!(
                "{}: corrupted (its SHA-256 differs from the one recorded when the checkpoint was \
                 written); the checkpoint cannot be resumed",
                file.display()
            );
        }
    }
    Ok(())
}

/// Seed of the device generator from `step` on (see the module docs).
fn step_seed(seed: u64, step: usize) -> u64 {
    crate::rng::Rng::new(seed ^ (step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64()
}

/// Writes the checkpoint atomically: a complete `checkpoint.new/`, then renames; a reader sees
/// the old checkpoint or the new one, never a mix.
fn write_checkpoint(
    run_dir: &Path,
    model: &LraClassifier,
    optim: &burn::optim::ModuleOptimizer,
    state: &TrainState,
) -> Result<()> {
    let new = run_dir.join("checkpoint.new");
    let old = run_dir.join("checkpoint.old");
    let current = run_dir.join(CHECKPOINT);
    if new.exists() {
        std::fs::remove_dir_all(&new)
            .with_context(|| format!("cannot remove {}", new.display()))?;
    }
    std::fs::create_dir_all(&new).with_context(|| format!("cannot create {}", new.display()))?;
    save_weights(model, &new.join("model.bpk"))?;
    optim.save(new.join("optimizer.bpk")).map_err(|e| {
        anyhow::anyhow!("cannot save the optimiser state in {}: {e}", new.display())
    })?;
    write_checksums(&new)?;
    write_atomic(
        &new.join("state.json"),
        serde_json::to_string_pretty(state)?.as_bytes(),
    )?;
    if current.exists() {
        if old.exists() {
            std::fs::remove_dir_all(&old)
                .with_context(|| format!("cannot remove {}", old.display()))?;
        }
        std::fs::rename(&current, &old)
            .with_context(|| format!("cannot move {}", current.display()))?;
    }
    std::fs::rename(&new, &current).with_context(|| format!("cannot move {}", new.display()))?;
    if old.exists() {
        std::fs::remove_dir_all(&old)
            .with_context(|| format!("cannot remove {}", old.display()))?;
    }
    Ok(())
}

/// The newest complete checkpoint of `run_dir`, if any (a kill between the two renames leaves
/// it as `checkpoint.old`).
fn find_checkpoint(run_dir: &Path) -> Option<PathBuf> {
    [CHECKPOINT, "checkpoint.old"]
        .iter()
        .map(|name| run_dir.join(name))
        .find(|dir| dir.join("state.json").is_file())
}

/// Keeps the lines of `metrics.jsonl` up to `step` (a resumed run rewrites the later ones).
fn truncate_metrics(path: &Path, step: usize) -> Result<()> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let kept: String = text
        .lines()
        .filter(|line| {
            serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| s as usize <= step)
        })
        .map(|line| format!("{line}\n"))
        .collect();
    write_atomic(path, kept.as_bytes())
}

/// The AdamW optimiser of a run configuration (Adam with decoupled weight decay).
pub fn adamw(o: &OptimizerConfig) -> AdamWConfig {
    AdamWConfig::new()
        .with_beta_1(o.beta1)
        .with_beta_2(o.beta2)
        .with_epsilon(o.epsilon)
        .with_weight_decay(o.weight_decay)
}

/// The training objective of one batch: the cross-entropy plus the attentions' regularisers
/// (the orthogonality penalty), and the cross-entropy alone.
pub fn objective(
    model: &LraClassifier,
    logits: Tensor<2>,
    labels: Tensor<1, Int>,
    loss_fn: &CrossEntropyLoss,
) -> (Tensor<1>, Tensor<1>) {
    let loss = loss_fn.forward(logits, labels);
    let objective = match model.penalty() {
        Some(penalty) => loss.clone() + penalty,
        None => loss.clone(),
    };
    (objective, loss)
}

/// Trains one model and writes its run directory (or continues it, with `opts.resume`).
pub fn train(config: &RunConfig, data: &Splits, opts: &TrainOptions) -> Result<RunResult> {
    let cfg = &config.training;
    let base_device = opts.backend.device()?;
    check_memory(
        config,
        &opts.attention,
        data.vocab_size,
        data.train.n_classes,
    )?;
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
    if opts.resume && !run_dir.join("config.json").is_file() {
        // Nothing to resume: refuse without creating the directory.
        bail!(
            "{}: no run to resume (no config.json there); start it without --resume",
            run_dir.display()
        );
    }
    std::fs::create_dir_all(run_dir)
        .with_context(|| format!("cannot create run directory {}", run_dir.display()))?;
    if run_dir.join("result.json").exists() {
        bail!(
            "{} already holds a finished run (result.json); remove it to train again",
            run_dir.display()
        );
    }
    let checkpoint = find_checkpoint(run_dir);
    let metrics_path = run_dir.join("metrics.jsonl");
    let config_json = json!({
        "run": config,
        "attention_name": opts.attention,
        "attention_resolved": config.attention_config(&opts.attention)?,
        "seed": opts.seed,
        "backend": opts.backend,
        "preset": opts.preset,
        "n_params": n_params,
        "n_params_softmax": budget.softmax_params,
        "param_increase": budget.increase(),
        "split_sizes": data.sizes(),
    });
    let config_path = run_dir.join("config.json");
    match (opts.resume, &checkpoint) {
        (true, Some(_)) => {
            let saved: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(&config_path)
                    .with_context(|| format!("cannot read {}", config_path.display()))?,
            )
            .with_context(|| format!("{} is not valid JSON", config_path.display()))?;
            // Compared as a configuration: floats may print differently after a JSON round trip.
            let saved_run: Option<RunConfig> = serde_json::from_value(saved["run"].clone()).ok();
            if saved_run.as_ref() != Some(config) {
                bail!(
                    "cannot resume {}: its configuration (config.json `run`) differs from this \
                     command's",
                    run_dir.display()
                );
            }
            for key in ["attention_name", "seed", "backend"] {
                if saved[key] != config_json[key] {
                    bail!(
                        "cannot resume {}: its `{key}` differs from this command's \
                         (was {}, now {})",
                        run_dir.display(),
                        saved[key],
                        config_json[key]
                    );
                }
            }
        }
        (false, Some(_)) => bail!(
            "{} holds an unfinished run; pass --resume to continue it, or remove it",
            run_dir.display()
        ),
        (resume, None) => {
            // A fresh run, or one killed before its first checkpoint: start the files over.
            if resume {
                eprintln!(
                    "{}: killed before its first checkpoint; starting it over from step 0",
                    run_dir.display()
                );
            }
            write_atomic(
                &config_path,
                serde_json::to_string_pretty(&config_json)?.as_bytes(),
            )?;
            write_atomic(&metrics_path, b"")?;
        }
    }

    let mut model = LraClassifier::new(
        config,
        &opts.attention,
        data.vocab_size,
        data.train.n_classes,
        &device,
    )?;
    let mut optim = adamw(&cfg.optimizer).init();
    let eval_device = base_device.clone();
    let mut state = TrainState::default();
    let mut best_model: Option<LraClassifier> = None;
    // Validation accuracy of the final weights, when this process validated them.
    let mut last_val_accuracy: Option<f64> = None;
    if let Some(dir) = &checkpoint {
        verify_checksums(dir)?;
        let text = std::fs::read_to_string(dir.join("state.json"))
            .with_context(|| format!("cannot read {}", dir.join("state.json").display()))?;
        state = serde_json::from_str(&text).with_context(|| {
            format!(
                "{}: not a checkpoint state",
                dir.join("state.json").display()
            )
        })?;
        model = load_weights(model, &dir.join("model.bpk"))?;
        optim = optim.load(dir.join("optimizer.bpk")).map_err(|e| {
            anyhow::anyhow!(
                "cannot load the optimiser state from {}: {e}",
                dir.display()
            )
        })?;
        if state.best.is_some() {
            best_model = Some(load_weights(
                model.valid(),
                &run_dir.join("model-best.bpk"),
            )?);
        }
        truncate_metrics(&metrics_path, state.step)?;
        device.seed(step_seed(opts.seed, state.step));
        eprintln!("resuming {} from step {}", run_dir.display(), state.step);
    }
    let mut metrics = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&metrics_path)
        .with_context(|| format!("cannot open {}", metrics_path.display()))?;
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
    bar.set_position(state.step as u64);

    let accumulation = cfg.grad_accumulation;
    let checkpoint_every = cfg.checkpoint_every.unwrap_or(cfg.eval_every);
    let mut plan = BatchPlan::new(data.train.len(), cfg.batch_size, opts.seed);
    plan.skip(state.step * accumulation);
    let started = Instant::now();
    let first_step = state.step + 1;
    let validation = data.validation();

    let model = std::thread::scope(|scope| -> Result<LraClassifier> {
        let mut model = model;
        let batches = training_batches(
            scope,
            &data.train,
            plan,
            (cfg.steps + 1 - first_step) * accumulation,
        );
        for step in first_step..=cfg.steps {
            let lr = cfg.schedule.lr(step, cfg.steps);
            let mut accumulator = GradientsAccumulator::<LraClassifier>::new();
            let mut step_loss = 0.0;
            for _ in 0..accumulation {
                let batch = batches
                    .recv()
                    .context("the data loader stopped early")?
                    .to_device(&device);
                let take = batch.labels.dims()[0];
                let logits = model.forward(batch.tokens, batch.pair);
                // The reported loss stays the cross-entropy, comparable across variants.
                let (objective, loss) =
                    objective(&model, logits.clone(), batch.labels.clone(), &loss_fn);
                let objective = objective.div_scalar(accumulation as f32);
                accumulator.accumulate(
                    &model,
                    GradientsParams::from_grads(objective.backward(), &model),
                );
                let loss_value = loss.into_scalar::<f64>();
                step_loss += loss_value;
                state.loss_sum += loss_value * take as f64;
                state.correct += accuracy_count(logits.detach(), batch.labels);
                state.seen += take;
            }
            if !step_loss.is_finite() {
                let kept = match find_checkpoint(run_dir) {
                    Some(dir) => format!(
                        "the last good checkpoint is {} (resume with --resume after lowering the \
                         learning rate, or enabling training.grad_clip)",
                        dir.display()
                    ),
                    None => "no checkpoint was written yet".to_string(),
                };
                bail!("training diverged at step {step}: the loss is {step_loss}; {kept}");
            }
            let mut grads = accumulator.grads();
            if let Some(max_norm) = cfg.grad_clip {
                grads = clip_global_norm(&model, grads, max_norm).0;
            }
            model = optim.step(lr, model, grads);
            if cfg.redraw_every.is_some_and(|every| step % every == 0) {
                model.encoder = model.encoder.redraw();
            }
            bar.set_position(step as u64);

            if step % cfg.eval_every == 0 || step == cfg.steps {
                let valid = model.valid();
                let (val_acc, val_loss) =
                    evaluate(&valid, validation, cfg.batch_size, &eval_device);
                if step == cfg.steps {
                    last_val_accuracy = Some(val_acc);
                }
                let train_loss = state.loss_sum / state.seen as f64;
                let train_acc = state.correct as f64 / state.seen as f64;
                let line = json!({
                    "step": step,
                    "lr": lr,
                    "train_loss": train_loss,
                    "train_accuracy": train_acc,
                    "val_loss": val_loss,
                    "val_accuracy": val_acc,
                    "elapsed_s": state.elapsed_s + started.elapsed().as_secs_f64(),
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
                (state.loss_sum, state.correct, state.seen) = (0.0, 0, 0);
                if state.best.is_none_or(|(acc, _)| val_acc > acc) {
                    save_weights(&valid, &run_dir.join("model-best.bpk"))?;
                    state.best = Some((val_acc, step));
                    best_model = Some(valid);
                }
            }
            if step % checkpoint_every == 0 || step == cfg.steps {
                if !weights_finite(&model) {
                    bail!(
                        "training diverged at step {step}: the weights are not finite; the last \
                         good checkpoint is kept in {}",
                        run_dir.join(CHECKPOINT).display()
                    );
                }
                state.step = step;
                let elapsed = state.elapsed_s;
                state.elapsed_s += started.elapsed().as_secs_f64();
                write_checkpoint(run_dir, &model, &optim, &state)?;
                state.elapsed_s = elapsed;
                device.seed(step_seed(opts.seed, step));
            }
            if opts.stop_after == Some(step) {
                bail!("stopped after step {step} (--stop-after)");
            }
        }
        Ok(model)
    })?;
    bar.finish();
    let train_seconds = state.elapsed_s + started.elapsed().as_secs_f64();

    let last = model.valid();
    save_weights(&last, &run_dir.join("model-last.bpk"))?;
    let (best_val_accuracy, best_val_step) = state.best.expect("the last step validates");
    let best_model = best_model.expect("the best weights are kept");
    let test = |model: &LraClassifier| evaluate(model, &data.test, cfg.batch_size, &eval_device).0;
    // When the test split is also the validation split, both weights were just measured on it.
    let validated_on_test = data.val.is_none();
    let test_last = match last_val_accuracy {
        Some(acc) if validated_on_test => acc,
        _ => test(&last),
    };
    let test_best = if validated_on_test {
        best_val_accuracy
    } else {
        test(&best_model)
    };
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
        split_sizes: data.sizes(),
        validation_source: validation.source.clone(),
        validated_on_test,
        train_seconds,
    };
    write_atomic(
        &run_dir.join("result.json"),
        serde_json::to_string_pretty(&result)?.as_bytes(),
    )?;
    // The run is complete: its last weights are model-last.bpk, the checkpoint is spent.
    let _ = std::fs::remove_dir_all(run_dir.join(CHECKPOINT));
    Ok(result)
}
