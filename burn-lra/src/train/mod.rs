//! Training one run, read as its sequence in [`train`]: open the run directory (resuming from its
//! checkpoint), build the model, run the steps (`step.rs`), validate (`evaluate.rs`), test and
//! write the result. Gradients and the schedule's pieces are in `grads.rs`.
//!
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

mod evaluate;
mod grads;
mod step;

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Result;
use burn::module::Module;
use burn::prelude::*;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::backend::BackendDevice;
use crate::budget::ParamBudget;
use crate::config::{RunConfig, Selection};
use crate::data::{Splits, write_atomic};
use crate::model::LraClassifier;
use crate::plan::{RunPlan, TrainOptions};
use crate::run_dir::open::{Opened, Resume, open_run_dir, record_changes};
use crate::run_dir::{CHECKPOINT, ConfigChange, Record, save_weights, sha256_file, sha256_hex};
use lra_runs::CheckpointState;
use lra_runs::layout::{
    CHECKPOINT_BEST, CHECKPOINT_MODEL, CHECKPOINT_OPTIMIZER, LOCK, METRICS, MODEL_BEST, MODEL_LAST,
    RESULT,
};

pub use evaluate::evaluate;
use grads::step_seed;
pub use grads::{adamw, clip_global_norm, objective};

/// The commit this harness was built from (`build.rs`), `unknown` outside a git checkout.
pub const BUILD_COMMIT: &str = match option_env!("BURN_LRA_COMMIT") {
    Some(commit) => commit,
    None => "unknown",
};

/// What in a configuration and its data works but is likely a mistake, one sentence each: a
/// run prints them once at its start and records them in `result.json`. (What cannot work is an
/// error, raised by the configuration and the data readers.)
pub fn suspicious_settings(plan: &RunPlan, data: &Splits) -> Vec<String> {
    let config = &plan.config;
    let mut warnings: Vec<String> = Vec::new();
    for attention in plan.classifier.attentions() {
        for warning in attention.warnings() {
            if !warnings.contains(&warning) {
                warnings.push(warning);
            }
        }
    }
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

/// What the training loop works with besides the model and the optimiser.
struct Session<'a> {
    config: &'a RunConfig,
    data: &'a Splits,
    opts: &'a TrainOptions,
    /// The run's `config.json` record, as each checkpoint keeps a copy of it.
    record: Record,
    device: Device,
    eval_device: Device,
    bar: ProgressBar,
}

/// The model and optimiser state the loop carries, with the running record.
struct Progress {
    model: LraClassifier,
    optim: burn::optim::ModuleOptimizer,
    state: CheckpointState,
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
    let device = base_device.clone().autodiff();
    // A fine-tuning run's starting point, checked before the run directory is opened.
    let pretrained = match &opts.init_from {
        Some(dir) => Some(crate::pretraining::load_pretrained(
            dir,
            config,
            &opts.attention,
            &base_device,
        )?),
        None => None,
    };
    let record = Record {
        run: config.clone(),
        attention_name: opts.attention.clone(),
        attention_resolved: match plan.classifier.attentions().as_slice() {
            [one] => serde_json::to_value(one)?,
            layers => serde_json::to_value(layers)?,
        },
        seed: opts.seed,
        backend: opts.backend,
        preset: opts.preset.clone(),
        n_params: budget.n_params,
        n_params_softmax: budget.softmax_params,
        param_increase: budget.increase(),
        split_sizes: data.sizes(),
        data_sha256: data.fingerprint(),
        init_from: pretrained.as_ref().map(|(_, init)| init.clone()),
        tokenizer: data.tokenizer.as_ref().map(|(path, _)| path.clone()),
        tokenizer_sha256: (data.tokenizer.as_ref()).map(|(_, json)| sha256_hex(json.as_bytes())),
        config_changes: Vec::new(),
    };
    let (_lock, resume) = match open_run_dir(
        &opts.run_dir,
        opts.resume,
        opts.change_backend,
        config,
        &record,
    )? {
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
    device.seed(opts.seed);
    let mut model = LraClassifier::new(&plan.classifier, &device);
    if let Some((pretrained, _)) = pretrained {
        model = crate::pretraining::transplant(pretrained, model)?;
    }
    let mut progress = Progress {
        model,
        optim: adamw(&config.training.optimizer).init(),
        state: CheckpointState::default(),
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
            causal: (last.per_position).then_some(last.causal),
            decoding_state_elements: (last.per_position)
                .then(|| last.decoding_state_elements(config.data.max_len))
                .flatten()
                .map(|e| e as u64),
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
            init_from: self.record.init_from.clone(),
            sha256: None,
        }
        .sealed();
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
