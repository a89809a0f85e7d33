//! The step loop: batches, gradients (accumulated, clipped), the optimiser step, validation
//! and checkpoints on their cadence.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{GradientsAccumulator, GradientsParams};

use crate::data::loader::{BatchPlan, training_batches};
use crate::model::LraClassifier;
use crate::run_dir::{
    CheckpointContents, RESUMABLE_FIELDS, find_checkpoint, metrics_fingerprint, save_weights,
    write_checkpoint,
};
use lra_runs::layout::{METRICS, MODEL_BEST};

use super::evaluate::batch_stats;
use super::grads::{clip_global_norm, objective, step_seed, weights_finite};
use super::{Progress, Session};

impl Session<'_> {
    /// Trains from the step after `progress.state.step` to the last, validating, keeping the
    /// best weights and writing checkpoints on the way.
    pub(super) fn run_steps(&self, progress: Progress, started: Instant) -> Result<Progress> {
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
        state.trained_by(super::BUILD_COMMIT);
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
                if redraws_before(step, cfg.redraw_every) {
                    model.encoder = model.encoder.redraw();
                }
                let mut accumulator = GradientsAccumulator::<LraClassifier>::new();
                let mut step_loss = 0.0;
                for _ in 0..accumulation {
                    let batch = batches
                        .recv()
                        .context("the data loader stopped early")?
                        .to_device(&self.device);
                    micro_batches += 1;
                    let take = batch.labels.dims()[0];
                    let (logits, aux_loss) =
                        model.forward_with_loss(batch.tokens, batch.pair, batch.positions);
                    // The reported loss stays the cross-entropy, comparable across variants.
                    let (objective, loss) = objective(
                        &model,
                        (logits.clone(), aux_loss),
                        batch.labels.clone(),
                        &loss_fn,
                    );
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

/// Whether random attention features are redrawn before training step `step` (see
/// `TrainingConfig::redraw_every`): never after an update, so no validation, checkpoint or weight
/// file holds features the model has not trained with.
fn redraws_before(step: usize, redraw_every: Option<usize>) -> bool {
    redraw_every.is_some_and(|every| step > 1 && (step - 1).is_multiple_of(every))
}
