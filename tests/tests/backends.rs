//! Check 7 of docs/attention.md and the backend promise of the harness: on every compiled-in backend,
//! the same weights and inputs give the default backend's (`flex`) outputs, through a few
//! training steps.
//!
//! Each test builds the LRA classifier once on flex, moves its record to the other backend,
//! runs the same AdamW steps on the same batches on both, and compares the logits after every
//! step. Dropout is off so that the runs are deterministic. Tolerance: 2e-3 absolute plus 2e-3
//! relative on logits of order 1; backends reassociate f32 sums differently, and three Adam
//! steps can amplify those round-off differences by the ratio lr / sqrt(v).

use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamWConfig, GradientsParams};
use burn::prelude::*;
use burn::tensor::Tolerance;
use burn_lra::backend::{BackendDevice, BackendKind};
use burn_lra::config::RunConfig;
use burn_lra::data::{Batch, Example, listops};
use burn_lra::model::{ClassifierSpec, LraClassifier};

fn config() -> RunConfig {
    let mut config = RunConfig::preset("listops", "tiny").unwrap();
    config.model.dropout = 0.0;
    config.model.attention_dropout = 0.0;
    config
}

fn examples() -> Vec<Example> {
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
    let [train, ..] = listops::generate(&generator).unwrap();
    train
        .into_iter()
        .map(|(text, label)| Example::new(listops::tokenize(&text).unwrap(), label as usize))
        .collect()
}

/// Logits after each of three training steps, then of the trained model in evaluation mode.
fn trajectory(
    backend: BackendKind,
    attention: &str,
    record: burn::store::ModuleRecord,
) -> Vec<TensorData> {
    let device = backend.device().unwrap().autodiff();
    let config = config();
    let mut model = classifier(&config, attention, &device).load_record(record);
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
    let eval_device = backend.device().unwrap();
    let batch = Batch::new(&refs, &eval_device);
    out.push(
        model
            .valid()
            .forward(batch.tokens, batch.pair, batch.positions)
            .into_data()
            .convert::<f32>(),
    );
    out
}

// Unused when no backend besides flex is compiled in (the default `cargo test`).
#[cfg_attr(
    not(any(
        feature = "ndarray",
        feature = "tch",
        feature = "wgpu",
        feature = "cuda"
    )),
    allow(dead_code)
)]
fn matches_flex(backend: BackendKind) {
    for attention in burn_attention_zoo::VARIANTS.iter().map(|v| v.name) {
        let flex = Device::flex().autodiff();
        flex.seed(5);
        let model = classifier(&config(), attention, &flex);
        let record = model.into_record();
        let expected = trajectory(BackendKind::Flex, attention, record.clone());
        let got = trajectory(backend, attention, record);
        assert_eq!(expected.len(), got.len());
        for (step, (e, g)) in expected.iter().zip(&got).enumerate() {
            eprintln!(
                "{backend} {attention} step {step}: comparing {:?}",
                g.shape()
            );
            g.assert_approx_eq::<f32>(e, Tolerance::absolute(2e-3).set_relative(2e-3));
        }
    }
}

#[test]
fn flex_is_deterministic() {
    // The reference itself: two flex runs from the same record agree exactly.
    let flex = Device::flex().autodiff();
    let model = classifier(&config(), "softmax", &flex);
    let record = model.into_record();
    let a = trajectory(BackendKind::Flex, "softmax", record.clone());
    let b = trajectory(BackendKind::Flex, "softmax", record);
    for (x, y) in a.iter().zip(&b) {
        x.assert_eq(y, true);
    }
}

#[cfg(feature = "ndarray")]
#[test]
fn ndarray_matches_flex() {
    matches_flex(BackendKind::Ndarray);
}

#[cfg(feature = "tch")]
#[test]
fn tch_matches_flex() {
    matches_flex(BackendKind::Tch);
}

/// Every attention, Transformer-XL, the Compressive Transformer and routing included: each
/// left flex's trajectory on wgpu (Burn 0.22.1, lavapipe) until it stopped reading a tensor
/// through `swap_dims` where wgpu mishandles it (the gradient of an expanded tensor read that
/// way; top-k over it without autodiff).
#[cfg(feature = "wgpu")]
#[test]
fn wgpu_matches_flex() {
    matches_flex(BackendKind::Wgpu);
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_matches_flex() {
    matches_flex(BackendKind::Cuda);
}

/// The ListOps classifier of `config` with `attention`.
fn classifier(config: &RunConfig, attention: &str, device: &Device) -> LraClassifier {
    let task = burn_lra::tasks::find("listops").unwrap();
    LraClassifier::new(
        &ClassifierSpec::resolve(config, task, attention).unwrap(),
        device,
    )
}
