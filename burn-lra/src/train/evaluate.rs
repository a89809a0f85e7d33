//! Measuring a model: accuracy and loss on a split, and the validation that writes a metrics
//! line.

use std::io::Write as _;
use std::time::Instant;

use anyhow::{Context, Result};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::prelude::*;
use lra_runs::MetricsLine;

use crate::data::Dataset;
use crate::data::loader::evaluation_batches;
use crate::model::LraClassifier;
use lra_runs::CheckpointState;
use lra_runs::layout::METRICS;

use super::Session;

/// Accuracy and mean loss of `model` on `data` over its predictions (one per example, or one
/// per target of a token-level task), in batches of `batch_size` examples, without autodiff.
/// Batches are padded on a worker thread.
pub fn evaluate(
    model: &LraClassifier,
    data: &Dataset,
    batch_size: usize,
    device: &Device,
) -> (f64, f64) {
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let (mut correct, mut loss_sum, mut count) = (0i64, 0f64, 0usize);
    std::thread::scope(|scope| {
        for batch in evaluation_batches(scope, data, batch_size) {
            let batch = batch.to_device(device);
            let n = batch.labels.dims()[0];
            let logits = model.forward(batch.tokens, batch.pair, batch.positions);
            let loss = loss_fn.forward(logits.clone(), batch.labels.clone());
            let (loss, right) = batch_stats(loss, logits, batch.labels);
            loss_sum += loss * n as f64;
            correct += right;
            count += n;
        }
    });
    let count = count.max(1) as f64;
    (correct as f64 / count, loss_sum / count)
}

/// A batch's mean loss and its number of correct predictions, read from the device in one
/// transfer (one host synchronisation per batch, not one per figure).
pub(super) fn batch_stats(
    loss: Tensor<1>,
    logits: Tensor<2>,
    labels: Tensor<1, Int>,
) -> (f64, i64) {
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

impl Session<'_> {
    /// Measures `valid` on the validation split, appends the metrics line (with the training
    /// sums since the last validation, which it resets) and returns the validation accuracy.
    pub(super) fn validate(
        &self,
        step: usize,
        lr: f64,
        valid: &LraClassifier,
        state: &mut CheckpointState,
        metrics: &mut std::fs::File,
        started: Instant,
    ) -> Result<f64> {
        let batch_size = self.config.training.batch_size;
        let (val_acc, val_loss) =
            evaluate(valid, self.data.validation(), batch_size, &self.eval_device);
        let train_loss = state.loss_sum / state.seen as f64;
        let train_acc = state.correct as f64 / state.seen as f64;
        let line = MetricsLine {
            elapsed_s: state.elapsed_s + started.elapsed().as_secs_f64(),
            lr,
            step,
            train_accuracy: train_acc,
            train_loss,
            val_accuracy: val_acc,
            val_loss,
        };
        let path = self.opts.run_dir.join(METRICS);
        writeln!(metrics, "{}", line.to_line())
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
}
