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

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn::optim::{AdamWConfig, GradientsAccumulator, GradientsParams};
use burn::prelude::*;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::backend::BackendDevice;
use crate::budget::ParamBudget;
use crate::config::{OptimizerConfig, RunConfig, Selection};
use crate::data::loader::{BatchPlan, evaluation_batches, training_batches};
use crate::data::{Dataset, Splits, write_atomic};
use crate::model::LraClassifier;
use crate::plan::{ResumeMode, RunPlan, TrainOptions};
use crate::run_dir::{
    CHECKPOINT, CheckpointContents, ConfigChange, RESTART_ADVICE, RESUMABLE_FIELDS, RunDirLock,
    VerifiedCheckpoint, check_run_dir, clear_unfinished_run, config_changes, find_checkpoint,
    metrics_fingerprint, read_json, save_weights, sha256_file, sha256_hex, verify_checkpoint,
    write_checkpoint,
};
use lra_runs::layout::{
    CHECKPOINT_BEST, CHECKPOINT_MODEL, CHECKPOINT_OPTIMIZER, CONFIG, LOCK, METRICS, MODEL_BEST,
    MODEL_LAST, RESULT,
};
use lra_runs::layout::{RunState, run_state};

/// What in a configuration and its data works but is likely a mistake, one sentence each: a
/// run prints them once at its start and records them in `result.json`. (What cannot work is an
/// error, raised by the configuration and the data readers.)
pub fn suspicious_settings(plan: &RunPlan, data: &Splits) -> Vec<String> {
    let config = &plan.config;
    let mut warnings = plan.classifier.attention().warnings();
    for split in [Some(&data.train), data.val.as_ref(), Some(&data.test)]
        .into_iter()
        .flatten()
    {
        warnings.extend(split.warnings.iter().cloned());
    }
    let batch = config.training.batch_size;
    if batch > data.train.len() {
        warnings.push(format!(
            "`training.batch_size` ({batch}) is larger than the training split ({} examples): \
             every batch is the whole split",
            data.train.len()
        ));
    }
    if config.data.validation == crate::config::Validation::Test && plan.task.has_validation_split()
    {
        warnings.push(format!(
            "`data.validation = \"test\"`: model selection sees the test split, although {} has \
             a validation split of its own",
            config.task
        ));
    }
    if let Some(n) = config.data.test_subset
        && n > data.test.len()
    {
        warnings.push(format!(
            "`data.test_subset` ({n}) is larger than the test split ({} examples): the whole \
             split is measured",
            data.test.len()
        ));
    }
    if let crate::config::Schedule::Rsqrt { warmup, .. } = config.training.schedule
        && warmup > config.training.steps
    {
        warnings.push(format!(
            "`training.schedule.warmup` ({warmup}) is beyond `training.steps` ({}): the learning \
             rate is still rising at the last step",
            config.training.steps
        ));
    }
    warnings
}

pub use lra_runs::RunResult;

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
            let (loss, right) = batch_stats(loss, logits, batch.labels);
            loss_sum += loss * n as f64;
            correct += right;
        }
    });
    (
        correct as f64 / data.len() as f64,
        loss_sum / data.len() as f64,
    )
}

/// A batch's mean loss and its number of correct predictions, read from the device in one
/// transfer (one host synchronisation per batch, not one per figure).
fn batch_stats(loss: Tensor<1>, logits: Tensor<2>, labels: Tensor<1, Int>) -> (f64, i64) {
    let [batch, _] = logits.dims();
    let correct = logits
        .argmax(1)
        .reshape([batch])
        .equal(labels)
        .int()
        .sum()
        .float();
    let values = Tensor::cat(vec![loss.reshape([1]), correct.reshape([1])], 0)
        .into_data()
        .convert::<f64>()
        .try_to_vec::<f64>()
        .expect("two f64 values");
    (values[0], values[1] as i64)
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
    /// Micro-batches drawn so far (the data order's position).
    micro_batches: usize,
    /// Length of `metrics.jsonl` when the checkpoint was written (a resume cuts it back to this).
    metrics_bytes: u64,
    /// SHA-256 of those bytes, checked before a resume keeps them.
    metrics_sha256: String,
    /// The commits of the builds that trained the steps so far ([`RunResult::commits`]).
    #[serde(default)]
    commits: Vec<String>,
}

/// The commit this harness was built from (`build.rs`), `unknown` outside a git checkout.
pub const BUILD_COMMIT: &str = match option_env!("BURN_LRA_COMMIT") {
    Some(commit) => commit,
    None => "unknown",
};

impl TrainState {
    /// Records that this build trains the steps from here on.
    fn trained_by_this_build(&mut self) {
        if self.commits.last().is_none_or(|last| last != BUILD_COMMIT) {
            self.commits.push(BUILD_COMMIT.to_string());
        }
    }
}

/// Seed of the device generator from `step` on (see the module docs).
fn step_seed(seed: u64, step: usize) -> u64 {
    crate::rng::Rng::new(seed ^ (step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64()
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

/// A checkpoint to continue from: its verified files, its state, the run's record it holds and
/// the changes this resume makes to it.
struct Resume {
    checkpoint: VerifiedCheckpoint,
    state: TrainState,
    /// The metrics the checkpoint recorded, where `metrics.jsonl` holds lines after them.
    metrics_cut: Option<Vec<u8>>,
    record: Value,
    changes: BTreeMap<String, [Value; 2]>,
}

/// Opens `opts.run_dir` for training as `opts.resume` asks: refuses a folder holding anything
/// but the harness's files, a finished run (returns it with [`ResumeMode::Continue`]), an
/// unfinished one with [`ResumeMode::Start`], a resume with nothing to resume, from a
/// checkpoint that fails its checks or with a field a resume may not change; takes the
/// directory's lock. A fresh run (or one killed before its first checkpoint, or restarted) gets
/// its `config.json` and an empty `metrics.jsonl`; a resumed one is returned, its files
/// untouched until its checkpoint has loaded.
fn open_run_dir(config: &RunConfig, opts: &TrainOptions, record: &Value) -> Result<Opened> {
    let run_dir = &opts.run_dir;
    check_run_dir(run_dir)?;
    let config_path = run_dir.join(CONFIG);
    // Only a run's record is ever replaced or resumed from.
    if config_path.is_file() && !is_run_record(&config_path) {
        bail!(
            "{} is not a run's configuration record; it is left as it is (choose another \
             --run-dir)",
            config_path.display()
        );
    }
    let finished = || {
        anyhow::anyhow!(
            "{} already holds a finished run (result.json); remove it to train again",
            run_dir.display()
        )
    };
    if opts.resume == ResumeMode::Resume
        && !config_path.is_file()
        && find_checkpoint(run_dir).is_none()
    {
        bail!(
            "{}: no run to resume (no config.json or checkpoint there); start it without --resume",
            run_dir.display()
        );
    }
    let finished_result = || -> Result<Opened> {
        match (opts.resume, run_state(run_dir)?) {
            (ResumeMode::Continue, RunState::Finished(result)) => Ok(Opened::Finished(result)),
            _ => Err(finished()),
        }
    };
    if run_dir.join(RESULT).exists() {
        return finished_result();
    }
    std::fs::create_dir_all(run_dir)
        .with_context(|| format!("cannot create run directory {}", run_dir.display()))?;
    let lock = RunDirLock::acquire(run_dir)?;
    if run_dir.join(RESULT).exists() {
        // Finished by another process between the first look and the lock.
        return finished_result();
    }
    let resume = match (opts.resume, find_checkpoint(run_dir)) {
        (ResumeMode::Resume | ResumeMode::Continue, Some(dir)) => {
            Some(Box::new(check_resume(config, record, run_dir, &dir)?))
        }
        (ResumeMode::Start, Some(_)) => bail!(
            "{} holds an unfinished run; pass --resume to continue it, --restart to start it \
             over, or choose another --run-dir",
            run_dir.display()
        ),
        (mode, _) => {
            // Restarted, or killed before its first checkpoint (nothing of value is lost), or
            // never started (nothing to clear).
            if mode == ResumeMode::Restart {
                eprintln!("{}: starting the run over (--restart)", run_dir.display());
            } else if mode != ResumeMode::Start && config_path.is_file() {
                eprintln!(
                    "{}: killed before its first checkpoint; starting it over from step 0",
                    run_dir.display()
                );
            }
            clear_unfinished_run(run_dir)?;
            write_atomic(
                &config_path,
                serde_json::to_string_pretty(record)?.as_bytes(),
            )?;
            write_atomic(&run_dir.join(METRICS), b"")?;
            eprintln!("training {} from step 0", run_dir.display());
            None
        }
    };
    Ok(Opened::Ready(lock, resume))
}

/// Whether `path` holds a run's `config.json` record (its `run` configuration and attention).
fn is_run_record(path: &Path) -> bool {
    read_json(path).is_ok_and(|v| v.get("run").is_some() && v.get("attention_name").is_some())
}

/// A run directory opened for training.
enum Opened {
    /// It already holds a finished run (only with [`ResumeMode::Continue`]): its result.
    Finished(Box<RunResult>),
    /// Its lock, and the checkpoint to continue from (`None`: a fresh run).
    Ready(RunDirLock, Option<Box<Resume>>),
}

/// The fields of the record a resume must find unchanged: what the run is (attention, seed,
/// backend) and what it reads (its data and tokenizer, by fingerprint).
const RUN_IDENTITY: [&str; 5] = [
    "attention_name",
    "seed",
    "backend",
    "data_sha256",
    "tokenizer_sha256",
];

/// Checks that the run in `run_dir` can continue from the checkpoint `dir` with `config`: every
/// checkpoint file as recorded, the same attention, seed, backend and data, a configuration that
/// differs only in the fields a resume may change.
fn check_resume(config: &RunConfig, record: &Value, run_dir: &Path, dir: &Path) -> Result<Resume> {
    let checkpoint = verify_checkpoint(dir)?;
    let saved = checkpoint.record.clone();
    let record_path = checkpoint.file(lra_runs::layout::CHECKPOINT_CONFIG);
    for key in RUN_IDENTITY {
        if saved[key] != record[key] {
            bail!(
                "cannot resume {}: its `{key}` differs from this command's (was {}, now {}); \
                 {RESTART_ADVICE}",
                run_dir.display(),
                saved[key],
                record[key]
            );
        }
    }
    let saved_run: RunConfig = serde_json::from_value(saved["run"].clone())
        .with_context(|| format!("{}: `run` is not a configuration", record_path.display()))?;
    let changes = config_changes(&saved_run, config)
        .with_context(|| format!("cannot resume {}", run_dir.display()))?;
    let state_path = checkpoint.file(lra_runs::layout::CHECKPOINT_STATE);
    let state: TrainState = serde_json::from_value(checkpoint.state.clone()).map_err(|e| {
        anyhow::anyhow!(
            "{}: not a checkpoint state ({e}); {RESTART_ADVICE}",
            state_path.display()
        )
    })?;
    // The metrics the checkpoint vouches for, checked before anything is loaded.
    let metrics_cut = crate::run_dir::verify_metrics(
        &run_dir.join(METRICS),
        state.metrics_bytes,
        &state.metrics_sha256,
    )?;
    if state.best.is_some() != checkpoint.has_best {
        let mismatch = match state.best {
            Some(_) => "records best-validation weights but the checkpoint lacks",
            None => "records no best-validation weights but the checkpoint holds",
        };
        bail!(
            "{}: {mismatch} {CHECKPOINT_BEST}; {RESTART_ADVICE}",
            state_path.display()
        );
    }
    if config.training.steps < state.step {
        bail!(
            "cannot resume {}: `training.steps` ({}) is below the checkpoint's step ({})",
            run_dir.display(),
            config.training.steps,
            state.step
        );
    }
    Ok(Resume {
        checkpoint,
        state,
        metrics_cut,
        record: saved,
        changes,
    })
}

/// Writes the checkpoint's record back as `config.json`, with this resume's configuration
/// changes (the new `run` and a `config_changes` entry), and returns every change the run has
/// had.
fn record_changes(
    run_dir: &Path,
    resume: &mut Resume,
    config: &RunConfig,
) -> Result<Vec<ConfigChange>> {
    let mut history: Vec<ConfigChange> =
        serde_json::from_value(resume.record["config_changes"].clone()).with_context(|| {
            format!(
                "{}: `config_changes` is not a list of changes",
                resume
                    .checkpoint
                    .file(lra_runs::layout::CHECKPOINT_CONFIG)
                    .display()
            )
        })?;
    if resume.changes.is_empty() {
        write_atomic(
            &run_dir.join(CONFIG),
            serde_json::to_string_pretty(&resume.record)?.as_bytes(),
        )?;
        return Ok(history);
    }
    let listed: Vec<String> = (resume.changes.iter())
        .map(|(field, [was, now])| format!("{field} {was} -> {now}"))
        .collect();
    eprintln!(
        "resuming from step {} with a changed configuration: {}",
        resume.state.step,
        listed.join(", ")
    );
    history.push(ConfigChange {
        from_step: resume.state.step,
        fields: std::mem::take(&mut resume.changes),
    });
    resume.record["run"] = serde_json::to_value(config)?;
    resume.record["config_changes"] = serde_json::to_value(&history)?;
    write_atomic(
        &run_dir.join(CONFIG),
        serde_json::to_string_pretty(&resume.record)?.as_bytes(),
    )?;
    Ok(history)
}

/// What the training loop works with besides the model and the optimiser.
struct Session<'a> {
    config: &'a RunConfig,
    data: &'a Splits,
    opts: &'a TrainOptions,
    /// The run's `config.json` record, as each checkpoint keeps a copy of it.
    record: Value,
    device: Device,
    eval_device: Device,
    bar: ProgressBar,
}

/// The model and optimiser state the loop carries, with the running record.
struct Progress {
    model: LraClassifier,
    optim: burn::optim::ModuleOptimizer,
    state: TrainState,
    best_model: Option<LraClassifier>,
    /// Validation accuracy of the final weights, when this process validated them.
    last_val_accuracy: Option<f64>,
}

/// Trains the model `plan` describes on `data` and writes its run directory (or continues it,
/// with `plan.opts.resume`).
pub fn train(plan: &RunPlan, data: &Splits) -> Result<RunResult> {
    let (config, opts, budget) = (&plan.config, &plan.opts, plan.budget);
    let base_device = opts.backend.device_at(opts.device)?;
    let warnings = suspicious_settings(plan, data);
    let record = json!({
        "run": config,
        "attention_name": opts.attention,
        "attention_resolved": plan.classifier.attention(),
        "seed": opts.seed,
        "backend": opts.backend,
        "preset": opts.preset,
        "n_params": budget.n_params,
        "n_params_softmax": budget.softmax_params,
        "param_increase": budget.increase(),
        "split_sizes": data.sizes(),
        "data_sha256": data.fingerprint(),
        "tokenizer": data.tokenizer.as_ref().map(|(path, _)| path),
        "tokenizer_sha256": data.tokenizer.as_ref().map(|(_, json)| sha256_hex(json.as_bytes())),
        "config_changes": [],
    });
    let (_lock, resume) = match open_run_dir(config, opts, &record)? {
        Opened::Finished(result) => {
            eprintln!(
                "{} holds a finished run: nothing to do",
                opts.run_dir.display()
            );
            return Ok(*result);
        }
        Opened::Ready(lock, resume) => (lock, resume),
    };
    if let Some((_, json)) = &data.tokenizer {
        crate::data::write_atomic(
            &opts.run_dir.join(lra_runs::layout::TOKENIZER),
            json.as_bytes(),
        )?;
    }
    for warning in &warnings {
        eprintln!("warning: {warning}");
    }
    eprintln!(
        "model: {} trainable parameters, {:+.2}% over softmax ({})",
        budget.n_params,
        100.0 * budget.increase(),
        budget.softmax_params
    );
    let device = base_device.clone().autodiff();
    device.seed(opts.seed);
    let model = LraClassifier::new(&plan.classifier, &device);
    let mut progress = Progress {
        model,
        optim: adamw(&config.training.optimizer).init(),
        state: TrainState::default(),
        best_model: None,
        last_val_accuracy: None,
    };
    let mut config_changes = Vec::new();
    let mut record = record;
    if let Some(mut resume) = resume {
        progress = progress.restore(&resume)?;
        if let Some(metrics) = &resume.metrics_cut {
            write_atomic(&opts.run_dir.join(METRICS), metrics)?;
        }
        config_changes = record_changes(&opts.run_dir, &mut resume, config)?;
        record = resume.record;
        device.seed(step_seed(opts.seed, resume.state.step));
        eprintln!(
            "resuming {} from step {}",
            opts.run_dir.display(),
            resume.state.step
        );
    }
    let bar = if opts.progress {
        ProgressBar::new(config.training.steps as u64)
    } else {
        ProgressBar::with_draw_target(
            Some(config.training.steps as u64),
            ProgressDrawTarget::hidden(),
        )
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
        )
        .expect("valid template"),
    );
    bar.set_position(progress.state.step as u64);
    let session = Session {
        config,
        data,
        opts,
        record,
        device,
        eval_device: base_device,
        bar,
    };
    let started = Instant::now();
    let progress = session.run_steps(progress, started)?;
    // The result line goes below the bar, not onto its line.
    session.bar.finish_and_clear();
    let train_seconds = progress.state.elapsed_s + started.elapsed().as_secs_f64();
    session.finish(progress, budget, train_seconds, warnings, config_changes)
}

impl Progress {
    /// Loads the checkpoint's weights, optimiser state and best-validation weights.
    fn restore(mut self, resume: &Resume) -> Result<Self> {
        let checkpoint = &resume.checkpoint;
        self.state = resume.state.clone();
        self.model = checkpoint.load_weights(self.model, CHECKPOINT_MODEL)?;
        self.optim = self
            .optim
            .load(checkpoint.file(CHECKPOINT_OPTIMIZER))
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot load the optimiser state from {}: {e}",
                    checkpoint.dir.display()
                )
            })?;
        if self.state.best.is_some() {
            self.best_model = Some(checkpoint.load_weights(self.model.valid(), CHECKPOINT_BEST)?);
        }
        Ok(self)
    }
}

impl Session<'_> {
    /// Trains from the step after `progress.state.step` to the last, validating, keeping the
    /// best weights and writing checkpoints on the way.
    fn run_steps(&self, progress: Progress, started: Instant) -> Result<Progress> {
        let cfg = &self.config.training;
        let run_dir = &self.opts.run_dir;
        let metrics_path = run_dir.join(METRICS);
        let mut metrics = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&metrics_path)
            .with_context(|| format!("cannot open {}", metrics_path.display()))?;
        let loss_fn = CrossEntropyLossConfig::new().init(&self.device);
        let accumulation = cfg.grad_accumulation;
        let checkpoint_every = cfg.checkpoint_every.unwrap_or(cfg.eval_every);
        let Progress {
            mut model,
            mut optim,
            mut state,
            mut best_model,
            mut last_val_accuracy,
        } = progress;
        state.trained_by_this_build();
        let mut micro_batches = state.micro_batches;
        let mut plan = BatchPlan::new(self.data.train.len(), cfg.batch_size, self.opts.seed);
        plan.skip(micro_batches);
        let first_step = state.step + 1;
        std::thread::scope(|scope| -> Result<Progress> {
            let batches = training_batches(
                scope,
                &self.data.train,
                plan,
                (cfg.steps + 1 - first_step).saturating_mul(accumulation),
            );
            for step in first_step..=cfg.steps {
                let lr = cfg.schedule.lr(step, cfg.steps);
                let mut accumulator = GradientsAccumulator::<LraClassifier>::new();
                let mut step_loss = 0.0;
                for _ in 0..accumulation {
                    let batch = batches
                        .recv()
                        .context("the data loader stopped early")?
                        .to_device(&self.device);
                    micro_batches += 1;
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
                    let (loss_value, correct) =
                        batch_stats(loss.detach(), logits.detach(), batch.labels);
                    step_loss += loss_value;
                    state.loss_sum += loss_value * take as f64;
                    state.correct += correct;
                    state.seen += take;
                }
                if !step_loss.is_finite() {
                    bail!(
                        "training diverged at step {step}: the loss is {step_loss}; {}",
                        recovery_advice(run_dir)
                    );
                }
                let mut grads = accumulator.grads();
                if let Some(max_norm) = cfg.grad_clip {
                    grads = clip_global_norm(&model, grads, max_norm).0;
                }
                model = optim.step(lr, model, grads);
                if cfg.redraw_every.is_some_and(|every| step % every == 0) {
                    model.encoder = model.encoder.redraw();
                }
                self.bar.set_position(step as u64);
                if step % cfg.eval_every == 0 || step == cfg.steps {
                    let valid = model.valid();
                    let val_accuracy =
                        self.validate(step, lr, &valid, &mut state, &mut metrics, started)?;
                    if step == cfg.steps {
                        last_val_accuracy = Some(val_accuracy);
                    }
                    if state.best.is_none_or(|(best, _)| val_accuracy > best) {
                        save_weights(&valid, &run_dir.join(MODEL_BEST))?;
                        state.best = Some((val_accuracy, step));
                        best_model = Some(valid);
                    }
                }
                if step % checkpoint_every == 0 || step == cfg.steps {
                    if !weights_finite(&model) {
                        bail!(
                            "training diverged at step {step}: the weights are not finite; {}",
                            recovery_advice(run_dir)
                        );
                    }
                    state.step = step;
                    state.micro_batches = micro_batches;
                    (state.metrics_bytes, state.metrics_sha256) =
                        metrics_fingerprint(&metrics_path)?;
                    let elapsed = state.elapsed_s;
                    state.elapsed_s += started.elapsed().as_secs_f64();
                    let contents = CheckpointContents {
                        model: &model,
                        optim: &optim,
                        best: best_model.as_ref(),
                        record: &self.record,
                    };
                    write_checkpoint(run_dir, &contents, &state)?;
                    state.elapsed_s = elapsed;
                    self.device.seed(step_seed(self.opts.seed, step));
                }
                if self.opts.stop_after == Some(step) {
                    bail!("stopped after step {step} (--stop-after)");
                }
            }
            Ok(Progress {
                model,
                optim,
                state,
                best_model,
                last_val_accuracy,
            })
        })
    }

    /// Measures `valid` on the validation split, appends the metrics line (with the training
    /// sums since the last validation, which it resets) and returns the validation accuracy.
    fn validate(
        &self,
        step: usize,
        lr: f64,
        valid: &LraClassifier,
        state: &mut TrainState,
        metrics: &mut std::fs::File,
        started: Instant,
    ) -> Result<f64> {
        let batch_size = self.config.training.batch_size;
        let (val_acc, val_loss) =
            evaluate(valid, self.data.validation(), batch_size, &self.eval_device);
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
        let path = self.opts.run_dir.join(METRICS);
        writeln!(metrics, "{line}")
            .and_then(|_| metrics.flush())
            .with_context(|| format!("cannot write {}", path.display()))?;
        let message = format!(
            "loss {train_loss:.3} acc {train_acc:.3} | val acc {val_acc:.3} loss {val_loss:.3}"
        );
        if !self.opts.progress {
            eprintln!("step {step}/{}: {message}", self.config.training.steps);
        }
        self.bar.set_message(message);
        (state.loss_sum, state.correct, state.seen) = (0.0, 0, 0);
        Ok(val_acc)
    }

    /// Writes the last weights, measures both weights on the test split and writes
    /// `result.json`; the spent checkpoint is removed.
    fn finish(
        &self,
        progress: Progress,
        budget: ParamBudget,
        train_seconds: f64,
        warnings: Vec<String>,
        config_changes: Vec<ConfigChange>,
    ) -> Result<RunResult> {
        let (config, data, opts) = (self.config, self.data, self.opts);
        let cfg = &config.training;
        let run_dir = &opts.run_dir;
        let last = progress.model.valid();
        let (best_val_accuracy, best_val_step) =
            progress.state.best.expect("the last step validates");
        let best_model = progress.best_model.expect("the best weights are kept");
        // Both weight files written from the weights measured below, and their checksums kept in
        // the result (a `model-best.bpk` saved by a validation after the checkpoint this process
        // resumed from is replaced by the checkpoint's own best weights).
        let mut weights_sha256 = BTreeMap::new();
        for (file, model) in [(MODEL_LAST, &last), (MODEL_BEST, &best_model)] {
            let path = run_dir.join(file);
            save_weights(model, &path)?;
            weights_sha256.insert(file.to_string(), sha256_file(&path)?);
        }
        let test = |model: &LraClassifier| {
            evaluate(model, &data.test, cfg.batch_size, &self.eval_device).0
        };
        // When the test split is also the validation split, both weights were just measured on it.
        let validated_on_test = data.val.is_none();
        let test_last = match progress.last_val_accuracy {
            Some(acc) if validated_on_test => acc,
            _ => test(&last),
        };
        let test_best = if validated_on_test {
            best_val_accuracy
        } else {
            test(&best_model)
        };
        let result = RunResult {
            task: config.task.clone(),
            attention: opts.attention.clone(),
            preset: opts.preset.clone(),
            seed: opts.seed,
            backend: opts.backend,
            device: format!("{:?}", self.eval_device),
            steps: cfg.steps,
            n_params: budget.n_params,
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
            validation_source: data.validation().source.clone(),
            validated_on_test,
            train_seconds,
            warnings,
            config_changes,
            weights_sha256,
            commits: progress.state.commits.clone(),
        };
        write_atomic(
            &run_dir.join(RESULT),
            serde_json::to_string_pretty(&result)?.as_bytes(),
        )?;
        // The run is complete: its last weights are model-last.bpk, the checkpoint is spent, and
        // the lock is no longer needed (result.json now refuses any other process).
        crate::run_dir::remove_checkpoint_dir(&run_dir.join(CHECKPOINT))?;
        let _ = std::fs::remove_file(run_dir.join(LOCK));
        Ok(result)
    }
}

/// What to do after a divergence: where the last good checkpoint is and how to resume from it.
fn recovery_advice(run_dir: &Path) -> String {
    match find_checkpoint(run_dir) {
        Some(dir) => format!(
            "the last good checkpoint is {}: resume it with --resume and a lower \
             `training.schedule` peak or base, or with `training.grad_clip` (a resume may change \
             {})",
            dir.display(),
            RESUMABLE_FIELDS.join(", ")
        ),
        None => "no checkpoint was written yet: start the run over with a lower learning rate"
            .to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build appends its commit where it takes over from another build, once.
    #[test]
    fn each_build_that_trains_is_recorded_once() {
        let mut state = TrainState::default();
        state.trained_by_this_build();
        state.trained_by_this_build();
        assert_eq!(state.commits, [BUILD_COMMIT]);
        state.commits = vec!["0123abc".into()];
        state.trained_by_this_build();
        state.trained_by_this_build();
        assert_eq!(state.commits, ["0123abc", BUILD_COMMIT]);
    }
}
