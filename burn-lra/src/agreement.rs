//! Whether a backend trains as the default backend (`flex`) does: check 7 of docs/attention.md,
//! behind `burn-lra check-backend` (which a GPU machine runs without Rust) and the integration
//! test of every compiled-in backend.
//!
//! The ListOps `tiny` classifier is built once on flex; its record is loaded on both backends,
//! which run the same AdamW steps on the same batches, and the logits are compared after every
//! step and once more in evaluation mode. Dropout is off so that the runs are deterministic.
//! Tolerance: [`ABSOLUTE`] plus [`RELATIVE`] on logits of order 1; backends reassociate f32 sums
//! differently, and three Adam steps can amplify those round-off differences by the ratio
//! lr / sqrt(v).

use anyhow::{Context, Result};
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamWConfig, GradientsParams};
use burn::prelude::*;

use crate::backend::{BackendDevice, BackendKind};
use crate::config::RunConfig;
use crate::data::{Batch, Example, listops};
use crate::model::{ClassifierSpec, LraClassifier};

/// The absolute part of the tolerance on logits.
pub const ABSOLUTE: f32 = 2e-3;
/// The relative part of the tolerance on logits.
pub const RELATIVE: f32 = 2e-3;

/// The ListOps `tiny` preset without dropout.
pub fn config() -> RunConfig {
    let mut config = RunConfig::preset("listops", "tiny").expect("the tiny preset is built in");
    config.model.dropout = 0.0;
    config.model.attention_dropout = 0.0;
    config
}

/// 24 generated ListOps examples (8 to 40 tokens), three batches of 8.
pub fn examples() -> Vec<Example> {
    let generator = listops::GeneratorConfig {
        min_length: 8,
        max_length: 40,
        max_depth: 4,
        max_args: 5,
        n_train: 24,
        n_val: 1,
        n_test: 1,
        seed: 11,
    };
    let [train, ..] = listops::generate(&generator).expect("a valid generator");
    train
        .into_iter()
        .map(|(text, label)| {
            Example::new(
                listops::tokenize(&text).expect("generated text tokenizes"),
                label as usize,
            )
        })
        .collect()
}

/// The ListOps classifier of `config` with `attention`.
pub fn classifier(config: &RunConfig, attention: &str, device: &Device) -> Result<LraClassifier> {
    let task = crate::tasks::find("listops").context("the listops task is registered")?;
    Ok(LraClassifier::new(
        &ClassifierSpec::resolve(config, task, attention)?,
        device,
    ))
}

/// The starting weights: the classifier with `attention` drawn on flex from seed 5.
pub fn starting_record(attention: &str) -> Result<burn::store::ModuleRecord> {
    let flex = BackendKind::Flex.device()?.autodiff();
    flex.seed(5);
    Ok(classifier(&config(), attention, &flex)?.into_record())
}

/// Logits after each of three training steps from `record` on `backend`, then of the trained
/// model in evaluation mode.
pub fn trajectory(
    backend: BackendKind,
    attention: &str,
    record: burn::store::ModuleRecord,
) -> Result<Vec<TensorData>> {
    let device = backend.device()?.autodiff();
    let config = config();
    let mut model = classifier(&config, attention, &device)?.load_record(record);
    let mut optim = AdamWConfig::new().with_weight_decay(0.01).init();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let examples = examples();
    let mut out = Vec::new();
    for chunk in examples.chunks(8) {
        let refs: Vec<&Example> = chunk.iter().collect();
        let batch = Batch::new(&refs, &device);
        let logits = model.forward(batch.tokens, batch.pair, batch.positions);
        let loss = loss_fn.forward(logits.clone(), batch.labels);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        // Read the logits after the backward pass, holding them until then, as the training
        // loop does. On wgpu (Burn 0.22.1, lavapipe) reading a clone and then moving the
        // original into the loss returned values that matched no backend, while the trained
        // weights still agreed; this order reads the same values on every backend.
        out.push(logits.into_data().convert::<f32>());
        model = optim.step(1e-3, model, grads);
    }
    let refs: Vec<&Example> = examples.iter().collect();
    let batch = Batch::new(&refs, &backend.device()?);
    out.push(
        model
            .valid()
            .forward(batch.tokens, batch.pair, batch.positions)
            .into_data()
            .convert::<f32>(),
    );
    Ok(out)
}

/// How far one step's logits on the checked backend lie from flex's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepGap {
    /// The largest `|got − expected|`.
    pub max_abs: f32,
    /// The largest `|got − expected| − ABSOLUTE − RELATIVE · |expected|`: at most 0 where the
    /// step agrees.
    pub max_excess: f32,
}

impl StepGap {
    /// The gap between `got` and `expected` (of one shape).
    pub fn between(got: &TensorData, expected: &TensorData) -> Self {
        let (got, expected) = (got.iter::<f32>(), expected.iter::<f32>());
        let mut gap = StepGap {
            max_abs: 0.0,
            max_excess: f32::NEG_INFINITY,
        };
        for (g, e) in got.zip(expected) {
            let diff = (g - e).abs();
            // NaN on either side fails the step.
            let excess = if diff.is_nan() {
                f32::INFINITY
            } else {
                diff - ABSOLUTE - RELATIVE * e.abs()
            };
            gap.max_abs = gap.max_abs.max(diff);
            gap.max_excess = gap.max_excess.max(excess);
        }
        gap
    }

    /// Whether the step is within the tolerance.
    pub fn agrees(&self) -> bool {
        self.max_excess <= 0.0
    }
}

/// `attention` trained on `backend` and on flex from the same weights: the gap at each step (an
/// error if the shapes differ).
pub fn check(backend: BackendKind, attention: &str) -> Result<Vec<StepGap>> {
    let record = starting_record(attention)?;
    let expected = trajectory(BackendKind::Flex, attention, record.clone())?;
    let got = trajectory(backend, attention, record)?;
    expected
        .iter()
        .zip(&got)
        .enumerate()
        .map(|(step, (e, g))| {
            anyhow::ensure!(
                e.shape() == g.shape(),
                "{attention} step {step}: logits of shape {:?} on {backend}, {:?} on flex",
                g.shape(),
                e.shape()
            );
            Ok(StepGap::between(g, e))
        })
        .collect()
}
