//! Our `small` ListOps classifier against a PyTorch classifier written from the PyTorch LRA
//! re-runs' published model code (Xiong et al. 2021, Nyströmformer's `LRA/code`: `model.py`,
//! `attention.py`, `model_wrapper.py`), through libtorch's own operations (`tch`, the C++ core
//! PyTorch's Python calls: `embedding`, `layer_norm`, `linear`, `gelu`, `softmax`,
//! `cross_entropy_loss` and torch's AdamW). One set of weights goes into both; the same padded
//! batch gives the same logits, loss and gradient of every parameter (relative 1e-4), and 50
//! AdamW steps with the preset's optimiser and schedule, dropout off, give the same weights.
//!
//! The reference follows the published code where our model does the same thing, and keeps
//! these differences, each a property of our model that the test makes the reference share:
//! - **No biases on the attention's Q, K, V and output projections** (ours have none, as the
//!   LRA reference's Flax attention; the re-runs' `nn.Linear` have them).
//! - **LayerNorm epsilon 1e-6** (Flax's, as the LRA reference; PyTorch's default is 1e-5).
//! - **Mean pooling over the real tokens** (`Σ mask · h / Σ mask`); the re-runs average over the
//!   padded length (`(norm(h) · mask).mean(1)`, every ListOps batch padded to 2,000), which
//!   makes a document's vector depend on the padding.
//! - **Padded keys' scores replaced** by −10⁴ (ours) where the re-runs subtract 10⁶: both give
//!   padded keys zero weight in `f32` while a row has a real key.
//! - Initialisation is outside the comparison (the weights are loaded): ours draws the token
//!   embeddings from N(0, 0.02²) in `small` (`model.embedding_std`), positions from N(0, 0.02²),
//!   as the re-runs; projections Xavier-uniform where the re-runs keep PyTorch's default.

#![cfg(feature = "tch")]

use std::collections::BTreeMap;

use burn::module::Param;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{LayerNorm, Linear};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::Gradients;
use burn_attention_zoo::Attention;
use burn_lra::config::RunConfig;
use burn_lra::data::Tokens;
use burn_lra::model::{ClassifierSpec, LraClassifier};
use burn_lra::train::{adamw, objective};
use tch::Kind;

/// Batch, sequence length (the `small` model at a short maximum length keeps the test fast;
/// the architecture is the preset's), and the real lengths of the padded batch.
const BATCH: usize = 4;
const MAX_LEN: usize = 300;
const LENGTHS: [usize; BATCH] = [300, 211, 97, 256];
/// AdamW steps compared.
const STEPS: usize = 50;

fn config() -> RunConfig {
    let mut config = RunConfig::preset("listops", "small").expect("the small preset");
    config.data.max_len = MAX_LEN;
    config.model.dropout = 0.0;
    config.model.attention_dropout = 0.0;
    config.validate().expect("a valid configuration");
    config
}

/// One parameter as libtorch holds it (PyTorch's layout: `nn.Linear` weights `[out, in]`).
fn torch_tensor(values: Vec<f32>, shape: &[usize], transpose: bool) -> tch::Tensor {
    let dims: Vec<i64> = shape.iter().map(|&x| x as i64).collect();
    let t = tch::Tensor::from_slice(&values).reshape(&dims);
    if transpose {
        t.transpose(0, 1).contiguous()
    } else {
        t
    }
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 values")
}

/// Every parameter of our model by the reference's name: its values in Burn's layout (or its
/// gradient's, given `grads`), its Burn shape, and whether PyTorch holds it transposed (an
/// `nn.Linear` weight, `[out, in]` where Burn's is `[in, out]`).
struct Named<'a> {
    grads: Option<&'a Gradients>,
    params: BTreeMap<String, (Vec<f32>, Vec<usize>, bool)>,
}

impl<'a> Named<'a> {
    fn tensor<const D: usize>(&mut self, name: &str, p: &Param<Tensor<D>>, transpose: bool) {
        let t = match self.grads {
            Some(grads) => p.val().grad(grads).expect("every parameter has a gradient"),
            None => p.val(),
        };
        let shape = t.dims().to_vec();
        self.params
            .insert(name.to_string(), (values(t), shape, transpose));
    }

    fn linear(&mut self, name: &str, l: &Linear) {
        self.tensor(&format!("{name}.weight"), &l.weight, true);
        if let Some(b) = &l.bias {
            self.tensor(&format!("{name}.bias"), b, false);
        }
    }

    fn norm(&mut self, name: &str, n: &LayerNorm) {
        self.tensor(&format!("{name}.weight"), &n.gamma, false);
        if let Some(b) = &n.beta {
            self.tensor(&format!("{name}.bias"), b, false);
        }
    }
}

/// Our model's parameters (or, given `grads`, their gradients) by the reference's names.
fn named<'a>(model: &LraClassifier, grads: Option<&'a Gradients>) -> Named<'a> {
    let mut n = Named {
        grads,
        params: BTreeMap::new(),
    };
    n.tensor("embeddings.word", &model.embedding.weight, false);
    let positions = model
        .positions
        .as_ref()
        .expect("small learns its positions");
    n.tensor("embeddings.position", &positions.weight, false);
    for (i, block) in model.encoder.blocks.iter().enumerate() {
        let Attention::Softmax(attention) = &block.attention else {
            panic!("the test builds softmax attention");
        };
        let p = &attention.proj;
        n.norm(&format!("transformer_{i}.norm1"), &block.norm_attn);
        n.linear(&format!("transformer_{i}.mha.W_q"), &p.query);
        n.linear(&format!("transformer_{i}.mha.W_k"), &p.key);
        n.linear(&format!("transformer_{i}.mha.W_v"), &p.value);
        n.linear(&format!("transformer_{i}.mha.ff"), &p.output);
        n.norm(&format!("transformer_{i}.norm2"), &block.norm_ff);
        n.linear(&format!("transformer_{i}.mlp.0"), &block.ff_in);
        n.linear(&format!("transformer_{i}.mlp.3"), &block.ff_out);
    }
    n.norm("norm", &model.encoder.norm);
    n.linear("head.0", &model.head_hidden);
    n.linear("head.2", &model.head_out);
    n
}

/// The reference classifier's forward pass over `p` (PyTorch layouts), written from the
/// re-runs' model: embeddings + learned positions; per layer `X = mha(norm1(X), mask) + X`,
/// `X = mlp(norm2(X)) + X` with `mlp = Linear, GELU, Linear`; `norm(X) · mask`; pooling; head
/// `Linear, ReLU, Linear`. The kept differences are in the module docs.
fn reference_logits(
    p: &BTreeMap<String, tch::Tensor>,
    ids: &tch::Tensor,
    mask: &tch::Tensor,
    config: &RunConfig,
) -> tch::Tensor {
    let m = &config.model;
    let (b, n, d) = (BATCH as i64, MAX_LEN as i64, m.d_model as i64);
    let heads = m.n_heads as i64;
    let head_dim = d / heads;
    let eps = 1e-6;
    let w = |name: &str| &p[name];
    let linear = |x: &tch::Tensor, name: &str| {
        x.linear(w(&format!("{name}.weight")), p.get(&format!("{name}.bias")))
    };
    let norm = |x: &tch::Tensor, name: &str| {
        x.layer_norm(
            [d],
            Some(w(&format!("{name}.weight"))),
            Some(w(&format!("{name}.bias"))),
            eps,
            false,
        )
    };
    let positions = tch::Tensor::arange(n, (Kind::Int64, tch::Device::Cpu));
    let mut x = tch::Tensor::embedding(w("embeddings.word"), ids, -1, false, false)
        + tch::Tensor::embedding(w("embeddings.position"), &positions, -1, false, false)
            .unsqueeze(0);
    let split = |t: tch::Tensor| t.reshape([b, n, heads, head_dim]).transpose(1, 2);
    for i in 0..m.n_layers {
        let layer = format!("transformer_{i}");
        let h = norm(&x, &format!("{layer}.norm1"));
        let q = split(linear(&h, &format!("{layer}.mha.W_q")));
        let k = split(linear(&h, &format!("{layer}.mha.W_k")));
        let v = split(linear(&h, &format!("{layer}.mha.W_v")));
        let dot = q.matmul(&k.transpose(-2, -1)) / (head_dim as f64).sqrt();
        // Padded keys: the re-runs subtract 10⁶; ours replaces their scores (module docs).
        let padded = mask.reshape([b, 1, 1, n]).eq(0.0);
        let dot = dot.masked_fill(&padded, -1e4);
        let attn = dot.softmax(-1, Kind::Float);
        let out = attn.matmul(&v).transpose(1, 2).reshape([b, n, d]);
        x = linear(&out, &format!("{layer}.mha.ff")) + x;
        let h = norm(&x, &format!("{layer}.norm2"));
        let h = linear(&h, &format!("{layer}.mlp.0")).gelu("none");
        x = linear(&h, &format!("{layer}.mlp.3")) + x;
    }
    let x = norm(&x, "norm") * mask.unsqueeze(-1);
    // Mean over the real tokens (module docs).
    let pooled = x.sum_dim_intlist([1i64].as_slice(), false, Kind::Float)
        / mask.sum_dim_intlist([1i64].as_slice(), true, Kind::Float);
    let hidden = linear(&pooled, "head.0").relu();
    linear(&hidden, "head.2")
}

/// The padded batch: token ids (0 = padding) and labels, from a fixed generator.
fn batch(vocab: usize, classes: usize) -> (Vec<i64>, Vec<i64>) {
    let mut state = 12345u64;
    let mut next = |below: usize| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) % below as u64) as i64
    };
    let mut ids = Vec::with_capacity(BATCH * MAX_LEN);
    for len in LENGTHS {
        for j in 0..MAX_LEN {
            ids.push(if j < len { 1 + next(vocab - 1) } else { 0 });
        }
    }
    let labels = (0..BATCH).map(|_| next(classes)).collect();
    (ids, labels)
}

fn max_rel_diff(ours: &[f32], theirs: &[f32]) -> f64 {
    let scale = theirs.iter().fold(0.0f64, |m, &x| m.max((x as f64).abs()));
    let diff = ours
        .iter()
        .zip(theirs)
        .fold(0.0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs()));
    diff / scale.max(1e-12)
}

fn torch_values(t: &tch::Tensor) -> Vec<f32> {
    let t = t.to_kind(Kind::Float).contiguous().view(-1);
    Vec::<f32>::try_from(&t).expect("f32 values")
}

#[test]
fn small_listops_classifier_equals_pytorch_reference() {
    let config = config();
    let device = Device::flex().autodiff();
    device.seed(3);
    let listops = burn_lra::tasks::find("listops").expect("the ListOps task");
    let spec = ClassifierSpec::resolve(&config, listops, "softmax").expect("the model");
    let (vocab, classes) = (spec.vocab_size, spec.n_classes);
    let mut model = LraClassifier::new(&spec, &device);
    let (ids, labels) = batch(vocab, classes);

    // The reference, loaded with our initial weights.
    let start = named(&model, None);
    let mut vs_params = BTreeMap::new();
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    for (name, (v, shape, transpose)) in &start.params {
        let t = torch_tensor(v.clone(), shape, *transpose);
        let var = vs.root().var_copy(&name.replace('.', "_"), &t);
        vs_params.insert(name.clone(), var);
    }
    let t_ids = tch::Tensor::from_slice(&ids).reshape([BATCH as i64, MAX_LEN as i64]);
    let t_mask = t_ids.ne(0).to_kind(Kind::Float);
    let t_labels = tch::Tensor::from_slice(&labels);

    // Ours: the same batch.
    let b_ids =
        Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), [BATCH, MAX_LEN]), &device);
    let b_labels = Tensor::<1, Int>::from_data(TensorData::new(labels.clone(), [BATCH]), &device);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let forward = |model: &LraClassifier| {
        let tokens = Tokens {
            mask_pad: b_ids.clone().equal_elem(0),
            ids: b_ids.clone(),
        };
        let (logits, aux_loss) = model.forward_with_loss(tokens, None, None);
        let (loss, _) = objective(
            model,
            (logits.clone(), aux_loss),
            b_labels.clone(),
            &loss_fn,
        );
        (logits, loss)
    };

    // Logits, loss and every gradient.
    let (logits, loss) = forward(&model);
    let t_logits = reference_logits(&vs_params, &t_ids, &t_mask, &config);
    let t_loss = t_logits.cross_entropy_for_logits(&t_labels);
    let diff = max_rel_diff(&values(logits.inner()), &torch_values(&t_logits));
    eprintln!("logits: {diff:.2e}");
    assert!(diff < 1e-4, "logits differ by {diff} (relative)");
    let diff = max_rel_diff(&values(loss.clone().inner()), &torch_values(&t_loss));
    assert!(diff < 1e-4, "losses differ by {diff} (relative)");
    t_loss.backward();
    let grads = loss.backward();
    let ours = named(&model, Some(&grads));
    assert_eq!(ours.params.len(), vs_params.len());
    for (name, t) in &vs_params {
        let theirs = torch_values(&t.grad());
        let (ours, shape, transpose) = &ours.params[name];
        let ours = torch_values(&torch_tensor(ours.clone(), shape, *transpose));
        let diff = max_rel_diff(&ours, &theirs);
        eprintln!("gradient of {name}: {diff:.2e}");
        assert!(
            diff < 1e-4,
            "gradient of {name} differs by {diff} (relative)"
        );
    }

    // 50 AdamW steps with the preset's optimiser and schedule.
    let o = &config.training.optimizer;
    let mut optim = adamw(o).init();
    let t_optim = tch::nn::AdamW {
        beta1: o.beta1 as f64,
        beta2: o.beta2 as f64,
        wd: o.weight_decay as f64,
        eps: o.epsilon as f64,
        amsgrad: false,
    };
    let mut t_opt = tch::nn::OptimizerConfig::build(t_optim, &vs, 0.0).expect("torch's AdamW");
    let total = config.training.steps;
    for step in 1..=STEPS {
        let lr = config.training.schedule.lr(step, total);
        let (_, loss) = forward(&model);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(lr, model, grads);
        t_opt.set_lr(lr);
        t_opt.zero_grad();
        let t_loss = reference_logits(&vs_params, &t_ids, &t_mask, &config)
            .cross_entropy_for_logits(&t_labels);
        t_loss.backward();
        t_opt.step();
    }
    // The weights' changes over the 50 steps agree (the weights themselves would agree to
    // 1e-4 even if the updates did not).
    let end = named(&model, None);
    for (name, (after, shape, transpose)) in &end.params {
        let before = &start.params[name].0;
        let ours: Vec<f32> = after.iter().zip(before).map(|(a, b)| a - b).collect();
        let ours = torch_values(&torch_tensor(ours, shape, *transpose));
        let theirs_after = torch_values(&vs_params[name].detach());
        let theirs_before = torch_values(&torch_tensor(before.clone(), shape, *transpose));
        let theirs: Vec<f32> = theirs_after
            .iter()
            .zip(&theirs_before)
            .map(|(a, b)| a - b)
            .collect();
        let diff = max_rel_diff(&ours, &theirs);
        eprintln!("update of {name}: {diff:.2e}");
        assert!(
            diff < 1e-3,
            "the update of {name} over {STEPS} steps differs by {diff}"
        );
    }
}
