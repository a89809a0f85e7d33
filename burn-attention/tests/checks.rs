//! The checks of ATTENTION.md, run over every registered variant, plus each variant's own
//! limiting case and float64 reference.
//!
//! The shared checks iterate over `burn_attention::VARIANTS`: a new variant gets them by being
//! registered (and given small test parameters in `config_for`).

mod reference;

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::{Distribution, Tolerance};
use burn_attention::{
    Attention, AttentionConfig, AttentionError, AttentionInput, EncoderBlockConfig, EncoderConfig,
    LinformerConfig, LinformerSharing, VARIANTS, efficient_attention, linear_attention,
    linformer_attention, linformer_linear_attention, padding_mask_from_lengths, softmax_attention,
};
use burn_attention::{
    FeedForwardKernel, FeedForwardKernelConfig, NystromConfig, PerformerConfig, favor_attention,
    orthogonal_features,
};
use reference::{
    kernelized_head, matmul, max_rel_err, project, scale, softmax_head, softmax_rows, to_heads,
    transpose,
};

const D_MODEL: usize = 16;
const N_HEADS: usize = 2;
const N_MAX: usize = 12;

fn device() -> Device {
    Device::flex()
}

/// A small configuration of each registered variant, dropout off.
fn config_for(name: &str) -> AttentionConfig {
    let config = AttentionConfig::from_name(name, D_MODEL, N_HEADS, N_MAX)
        .unwrap()
        .with_dropout(0.0);
    match config {
        AttentionConfig::Linformer(c) => AttentionConfig::Linformer(c.with_k(5)),
        AttentionConfig::LinformerLinear(c) => AttentionConfig::LinformerLinear(c.with_k(5)),
        AttentionConfig::Performer(c) => AttentionConfig::Performer(c.with_n_features(24)),
        AttentionConfig::Nystrom(c) => AttentionConfig::Nystrom(c.with_n_landmarks(4)),
        other => other,
    }
}

/// Every configuration the shared checks run: each variant, each Linformer sharing mode,
/// Nyströmformer with its convolution skip, and the gated kernels at depth 2.
fn all_configs() -> Vec<AttentionConfig> {
    let mut configs: Vec<AttentionConfig> = VARIANTS.iter().map(|v| config_for(v.name)).collect();
    for sharing in [LinformerSharing::None, LinformerSharing::KeyValue] {
        configs.push(AttentionConfig::Linformer(
            LinformerConfig::new(D_MODEL, N_HEADS, N_MAX)
                .with_k(5)
                .with_dropout(0.0)
                .with_sharing(sharing),
        ));
    }
    configs.push(AttentionConfig::Nystrom(
        NystromConfig::new(D_MODEL, N_HEADS)
            .with_n_landmarks(3)
            .with_conv_kernel(Some(5)),
    ));
    for kernel in [FeedForwardKernel::Glu, FeedForwardKernel::Oglu] {
        configs.push(AttentionConfig::FeedForward(
            FeedForwardKernelConfig::new(D_MODEL, N_HEADS, kernel).with_depth(2),
        ));
    }
    configs
}

fn random(shape: [usize; 3], device: &Device) -> Tensor<3> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
}

fn tol() -> Tolerance<f32> {
    Tolerance::absolute(1e-5).set_relative(1e-4)
}

fn label(config: &AttentionConfig) -> String {
    match config {
        AttentionConfig::Linformer(c) => format!("linformer/{}", c.sharing.as_str()),
        AttentionConfig::Nystrom(c) => {
            format!("nystrom/m{}/conv{:?}", c.n_landmarks, c.conv_kernel)
        }
        AttentionConfig::FeedForward(c) => format!("{}/depth{}", c.kernel.name(), c.depth),
        other => other.name().to_string(),
    }
}

#[test]
fn check_1_shapes() {
    let device = device();
    for config in all_configs() {
        let attention = config.init(&device);
        for n in [1, 7, N_MAX] {
            let y = attention.forward(AttentionInput::new(random([3, n, D_MODEL], &device)));
            assert_eq!(y.dims(), [3, n, D_MODEL], "{}", label(&config));
        }
    }
}

#[test]
fn check_2_padding_invariance() {
    let device = device();
    device.seed(2);
    for config in all_configs() {
        let attention = config.init(&device);
        let x = random([2, 6, D_MODEL], &device);
        let plain = attention.forward(AttentionInput::new(x.clone()));
        // The same sequences followed by 4 padded positions holding arbitrary values.
        let padded_x = Tensor::cat(
            vec![x, random([2, 4, D_MODEL], &device).mul_scalar(50.0)],
            1,
        );
        let mask = padding_mask_from_lengths(&[6, 6], 10, &device);
        let padded = attention.forward(AttentionInput::new(padded_x).mask_pad(mask));
        padded
            .slice([0..2, 0..6])
            .into_data()
            .assert_approx_eq::<f32>(&plain.into_data(), tol());
    }
}

#[test]
fn check_3_batch_invariance() {
    let device = device();
    for config in all_configs() {
        let attention = config.init(&device);
        let x = random([2, 9, D_MODEL], &device);
        let mask = padding_mask_from_lengths(&[9, 5], 9, &device);
        let both = attention.forward(AttentionInput::new(x.clone()).mask_pad(mask.clone()));
        for i in 0..2 {
            let one = attention.forward(
                AttentionInput::new(x.clone().slice(s![i..i + 1]))
                    .mask_pad(mask.clone().slice(s![i..i + 1])),
            );
            both.clone()
                .slice(s![i..i + 1])
                .into_data()
                .assert_approx_eq::<f32>(&one.into_data(), tol());
        }
    }
}

fn qkv(b: usize, h: usize, n: usize, d: usize, device: &Device) -> [Tensor<4>; 3] {
    [0, 1, 2].map(|_| Tensor::random([b, h, n, d], Distribution::Normal(0.0, 1.0), device))
}

/// Check 4 for softmax: the functional form against the float64 formula, with and without a
/// padding mask, with and without the causal mask, on a plain device (without a padding mask:
/// Burn's fused attention operation, flash attention on flex) and an autodiff device (the
/// composed steps); tolerance 1e-4 relative. Outputs are weighted averages of unit-variance values
/// (magnitude ~0.1-1) and f32 round-off leaves absolute errors near 1e-7, so the error is taken
/// relative to max(|expected|, 0.01): entries near zero are held to 1e-6 absolute instead of
/// letting a 1e-5-sized entry inflate the ratio (seen with a 1e-3 floor: 1.6e-4 from round-off).
#[test]
fn check_4_softmax_matches_float64_reference() {
    for device in [device(), device().autodiff()] {
        for (causal, padded) in [(false, false), (true, false), (false, true), (true, true)] {
            let [q, k, v] = qkv(2, 3, 10, 8, &device);
            let lengths = if padded { [10, 6] } else { [10, 10] };
            let mask = padded.then(|| padding_mask_from_lengths(&lengths, 10, &device));
            let out = softmax_attention(q.clone(), k.clone(), v.clone(), mask, causal);
            let (q, k, v, out) = (to_heads(&q), to_heads(&k), to_heads(&v), to_heads(&out));
            for b in 0..2 {
                for h in 0..3 {
                    let expected = softmax_head(&q[b][h], &k[b][h], &v[b][h], |i, j| {
                        j >= lengths[b] || (causal && j > i)
                    });
                    let err = max_rel_err(&out[b][h], &expected, 1e-2);
                    assert!(
                        err < 1e-4,
                        "autodiff {} causal {causal} padded {padded} batch {b} head {h}: \
                         relative error {err}",
                        device.is_autodiff()
                    );
                }
            }
        }
    }
}

/// Gradients of `Σ G ∘ softmax(Q Kᵀ/√d) V` for one head in float64, with masked keys dropped
/// from each row: `(dQ, dK, dV)`. The textbook chain: `P` the weights, `dV = Pᵀ G`,
/// `dP = G Vᵀ`, `dS = P ∘ (dP - rowsum(P ∘ dP))`, `dQ = dS K/√d`, `dK = dSᵀ Q/√d`.
fn softmax_head_grads(
    q: &[Vec<f64>],
    k: &[Vec<f64>],
    v: &[Vec<f64>],
    g: &[Vec<f64>],
    masked: impl Fn(usize, usize) -> bool,
) -> [Vec<Vec<f64>>; 3] {
    let (n_q, n_k, d) = (q.len(), k.len(), q[0].len());
    let s = 1.0 / (d as f64).sqrt();
    let zeros = |rows: usize, cols: usize| vec![vec![0.0f64; cols]; rows];
    let (mut dq, mut dk, mut dv) = (zeros(n_q, d), zeros(n_k, d), zeros(n_k, v[0].len()));
    for i in 0..n_q {
        let keep: Vec<usize> = (0..n_k).filter(|&j| !masked(i, j)).collect();
        let scores: Vec<f64> = keep
            .iter()
            .map(|&j| q[i].iter().zip(&k[j]).map(|(a, b)| a * b).sum::<f64>() * s)
            .collect();
        let p = &softmax_rows(&[scores])[0];
        let dp: Vec<f64> = keep
            .iter()
            .map(|&j| g[i].iter().zip(&v[j]).map(|(a, b)| a * b).sum())
            .collect();
        let row: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
        for (t, &j) in keep.iter().enumerate() {
            let ds = p[t] * (dp[t] - row) * s;
            for c in 0..d {
                dq[i][c] += ds * k[j][c];
                dk[j][c] += ds * q[i][c];
            }
            for (c, gc) in g[i].iter().enumerate() {
                dv[j][c] += p[t] * gc;
            }
        }
    }
    [dq, dk, dv]
}

/// Check 4 for softmax training: outputs and the gradients of `q`, `k`, `v` on an autodiff
/// device against the float64 formula ([`softmax_head_grads`]), at a length that spans several
/// query and key tiles of the fused kernel (300, neither a multiple of its 128-row nor its
/// 256-key tiles), with and without padding and causal masks. The loss weights the output with
/// a random `G`, so every gradient entry is exercised. The inputs are per-head views of
/// `[batch, n, heads, d]` storage, as the modules make them. Gradients are sums over 300 keys of
/// unit-scale terms; their error is taken relative to max(|expected|, 0.01) as above, 1e-4.
///
/// Runs on `flex` (the fused kernel of this crate) and, when compiled in, on `tch` (libtorch's
/// own flash-attention kernels behind the same extension) and `ndarray` (the composed steps).
#[test]
#[allow(deprecated)] // burn-tch and burn-ndarray, still backends of this project
fn check_4_softmax_gradients_match_float64_reference() {
    #[allow(unused_mut)] // only pushed to when another CPU backend is compiled in
    let mut devices = vec![device()];
    #[cfg(feature = "tch")]
    devices.push(Device::libtorch());
    #[cfg(feature = "ndarray")]
    devices.push(Device::ndarray());
    for device in devices {
        softmax_gradients_case(device.autodiff());
    }
}

fn softmax_gradients_case(device: Device) {
    let (b, h, n, d) = (2, 2, 300, 8);
    for (causal, padded) in [(false, false), (true, false), (false, true), (true, true)] {
        // Per-head views of `[b, n, h, d]` storage, as the modules' head split makes them.
        let [q, k, v] = [0, 1, 2].map(|_| {
            Tensor::<4>::random([b, n, h, d], Distribution::Normal(0.0, 1.0), &device)
                .swap_dims(1, 2)
                .require_grad()
        });
        let g = Tensor::<4>::random([b, h, n, d], Distribution::Normal(0.0, 1.0), &device);
        let lengths = if padded { [n, 170] } else { [n, n] };
        let mask = padded.then(|| padding_mask_from_lengths(&lengths, n, &device));
        let out = softmax_attention(q.clone(), k.clone(), v.clone(), mask, causal);
        let grads = (out.clone() * g.clone()).sum().backward();
        let got = [&q, &k, &v].map(|t| to_heads(&t.grad(&grads).unwrap()));
        let (qh, kh, vh, gh, out) = (
            to_heads(&q.inner()),
            to_heads(&k.inner()),
            to_heads(&v.inner()),
            to_heads(&g.inner()),
            to_heads(&out.inner()),
        );
        for bi in 0..b {
            for hi in 0..h {
                let masked = |i: usize, j: usize| j >= lengths[bi] || (causal && j > i);
                let (q, k, v, g) = (&qh[bi][hi], &kh[bi][hi], &vh[bi][hi], &gh[bi][hi]);
                let expected = softmax_head(q, k, v, masked);
                let err = max_rel_err(&out[bi][hi], &expected, 1e-2);
                assert!(
                    err < 1e-4,
                    "{device:?} output, causal {causal} padded {padded}: {err}"
                );
                let want = softmax_head_grads(q, k, v, g, masked);
                for (name, (got, want)) in ["q", "k", "v"].iter().zip(got.iter().zip(&want)) {
                    let err = max_rel_err(&got[bi][hi], want, 1e-2);
                    assert!(
                        err < 1e-4,
                        "{device:?} d{name}, causal {causal} padded {padded} batch {bi} head {hi}: \
                         {err}"
                    );
                }
            }
        }
    }
}

/// Random inputs for the Linformer references: 2 sequences of 9 (the second padded after 5),
/// 2 heads of width 8, per-head projections `E`, `F` with k = 4 and `n_max` = 12 > n.
type LinformerFn =
    fn(Tensor<4>, Tensor<4>, Tensor<4>, Tensor<3>, Tensor<3>, Option<Tensor<2, Bool>>) -> Tensor<4>;

/// Runs `attention` on the Linformer inputs and calls `reference(q, k', v', e, f, real)` per
/// batch element and head in float64, where `real` is the unpadded length, returning the
/// largest relative error against the reference (floor 1e-2, as above).
fn linformer_case(
    attention: LinformerFn,
    reference: impl Fn(
        &[Vec<f64>],
        &[Vec<f64>],
        &[Vec<f64>],
        &[Vec<f64>],
        &[Vec<f64>],
        usize,
    ) -> Vec<Vec<f64>>,
) -> f64 {
    let device = device();
    let (b, h, n, d, kp, n_max) = (2, 2, 9, 8, 4, 12);
    let mut worst = 0.0f64;
    // Projections per head, and one shared by the heads (the default `headwise` sharing, which
    // takes a single product over all heads).
    for count in [h, 1] {
        let [q, k, v] = qkv(b, h, n, d, &device);
        let e = Tensor::<3>::random([count, kp, n_max], Distribution::Normal(0.0, 0.5), &device);
        let f = Tensor::<3>::random([count, kp, n_max], Distribution::Normal(0.0, 0.5), &device);
        let lengths = [9, 5];
        let mask = padding_mask_from_lengths(&lengths, n, &device);
        let out = attention(
            q.clone(),
            k.clone(),
            v.clone(),
            e.clone(),
            f.clone(),
            Some(mask),
        );
        let (q, k, v, out) = (to_heads(&q), to_heads(&k), to_heads(&v), to_heads(&out));
        let (e, f) = (
            to_heads(&e.unsqueeze())[0].clone(),
            to_heads(&f.unsqueeze())[0].clone(),
        );
        for bi in 0..b {
            for hi in 0..h {
                let expected = reference(
                    &q[bi][hi],
                    &k[bi][hi],
                    &v[bi][hi],
                    &e[hi % count],
                    &f[hi % count],
                    lengths[bi],
                );
                worst = worst.max(max_rel_err(&out[bi][hi], &expected, 1e-2));
            }
        }
    }
    worst
}

/// Check 4 for Linformer: the functional form against `softmax(Q (E K)ᵀ/√d) (F V)` in float64
/// with padded rows zeroed, per-head projections shorter than `n_max`; tolerance as above.
#[test]
fn check_4_linformer_matches_float64_reference() {
    let err = linformer_case(linformer_attention, |q, k, v, e, f, real| {
        let kp = project(e, k, |j| j >= real);
        let vp = project(f, v, |j| j >= real);
        softmax_head(q, &kp, &vp, |_, _| false)
    });
    assert!(err < 1e-4, "relative error {err}");
}

/// Check 4, Linformer's limiting case: with `k = n` and `E = F = I` it is exact softmax
/// attention (the projection is the identity), to f32 round-off.
#[test]
fn check_4_linformer_identity_projection_is_softmax() {
    let device = device();
    let n = 10;
    let [q, k, v] = qkv(2, 2, n, 8, &device);
    let eye = Tensor::<2>::eye(n, &device).unsqueeze::<3>();
    let lin = linformer_attention(q.clone(), k.clone(), v.clone(), eye.clone(), eye, None);
    let exact = softmax_attention(q, k, v, None, false);
    lin.into_data()
        .assert_approx_eq::<f32>(&exact.into_data(), tol());
}

/// Check 5: the causal form equals the masked quadratic form (float64, keys `j > i` removed),
/// and variants without causal support refuse it with an error.
#[test]
fn check_5_causal() {
    let device = device();
    let [q, k, v] = qkv(1, 2, 8, 4, &device);
    let out = to_heads(&softmax_attention(
        q.clone(),
        k.clone(),
        v.clone(),
        None,
        true,
    ));
    let (q, k, v) = (to_heads(&q), to_heads(&k), to_heads(&v));
    for h in 0..2 {
        let expected = softmax_head(&q[0][h], &k[0][h], &v[0][h], |i, j| j > i);
        assert!(max_rel_err(&out[0][h], &expected, 1e-2) < 1e-4);
    }
    for config in all_configs() {
        let attention = config.init(&device);
        let input = AttentionInput::new(random([1, 5, D_MODEL], &device)).causal(true);
        let supported = config.info().capabilities.causal;
        match attention.try_forward(input) {
            Ok(_) => assert!(supported, "{} accepted causal", label(&config)),
            Err(err) => {
                assert!(!supported, "{}: {err}", label(&config));
                assert!(err.to_string().contains("causal"), "{err}");
                assert!(config.check_input(5, true).is_err());
            }
        }
    }
}

/// Collects the gradient of every float parameter.
struct GradCheck<'a> {
    grads: &'a burn::tensor::Gradients,
    missing: Vec<String>,
    path: Vec<String>,
}

impl ModuleVisitor for GradCheck<'_> {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if !param.is_require_grad() {
            return;
        }
        let where_ = self.path.join(".");
        match param.val().grad(self.grads) {
            None => self.missing.push(format!("{where_}: no gradient")),
            Some(g) => {
                let values: Vec<f32> = g.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
                if values.iter().any(|x| !x.is_finite()) {
                    self.missing.push(format!("{where_}: non-finite gradient"));
                } else if values.iter().all(|&x| x == 0.0) {
                    self.missing.push(format!("{where_}: all-zero gradient"));
                }
            }
        }
    }
}

/// Check 6: gradients reach every trainable parameter and are finite (inside an encoder, so
/// that Linformer's layerwise projection, owned by the encoder, is covered).
#[test]
fn check_6_gradients_reach_every_parameter() {
    let device = device().autodiff();
    let mut configs = all_configs();
    configs.push(AttentionConfig::Linformer(
        LinformerConfig::new(D_MODEL, N_HEADS, N_MAX)
            .with_k(5)
            .with_sharing(LinformerSharing::Layerwise),
    ));
    for config in configs {
        let encoder =
            EncoderConfig::new(EncoderBlockConfig::new(config.clone(), 32), 2).init(&device);
        let x = random([2, 7, D_MODEL], &device);
        let mask = padding_mask_from_lengths(&[7, 4], 7, &device);
        let y = encoder.forward(AttentionInput::new(x).mask_pad(mask));
        let grads = y.powi_scalar(2).sum().backward();
        let mut check = GradCheck {
            grads: &grads,
            missing: vec![],
            path: vec![],
        };
        encoder.visit(&mut check);
        assert!(
            check.missing.is_empty(),
            "{}: {:?}",
            label(&config),
            check.missing
        );
    }
}

/// Check 8: a saved record loads back into a freshly initialised module to identical outputs.
#[test]
fn check_8_record_round_trip() {
    let device = device();
    let dir = std::env::temp_dir().join(format!("burn-attention-records-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, config) in all_configs().into_iter().enumerate() {
        let attention = config.init(&device);
        let x = random([2, 8, D_MODEL], &device);
        let expected = attention.forward(AttentionInput::new(x.clone()));
        let path = dir.join(format!("attention-{i}.bpk"));
        attention.save_file(&path).unwrap();
        let fresh: Attention = config.init(&device);
        let loaded = fresh.load_file(&path);
        let got = loaded.forward(AttentionInput::new(x));
        got.into_data().assert_eq(&expected.into_data(), true);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Check 9: bad configurations are errors that name the field.
#[test]
fn check_9_bad_configurations_name_the_field() {
    let device = device();
    let field = |err: AttentionError, name: &str| {
        let text = err.to_string();
        assert!(
            text.contains(&format!("`{name}`")),
            "expected `{name}` in: {text}"
        );
    };
    for v in VARIANTS {
        field(
            AttentionConfig::from_name(v.name, 10, 3, 8)
                .unwrap()
                .validate()
                .unwrap_err(),
            "d_model",
        );
        field(
            AttentionConfig::from_name(v.name, 12, 0, 8)
                .unwrap()
                .validate()
                .unwrap_err(),
            "n_heads",
        );
    }
    field(
        LinformerConfig::new(16, 2, 8)
            .with_k(0)
            .validate()
            .unwrap_err(),
        "k",
    );
    let linformer = AttentionConfig::Linformer(LinformerConfig::new(16, 2, 8).with_k(4));
    field(linformer.check_input(9, false).unwrap_err(), "n_max");
    let err = linformer
        .init(&device)
        .try_forward(AttentionInput::new(random([1, 9, 16], &device)))
        .unwrap_err();
    field(err, "n_max");
    let params = serde_json::json!({"k": "many"});
    let err = linformer
        .clone()
        .with_params(params.as_object().unwrap())
        .unwrap_err();
    field(err, "k");
    // Each variant's own fields, given as config-file parameters.
    for (name, params, key) in [
        ("ff-glu", serde_json::json!({"depth": 0}), "depth"),
        ("ff-linear", serde_json::json!({"depth": 2}), "depth"),
        ("ff-aoglu", serde_json::json!({"gate_rank": 0}), "gate_rank"),
        (
            "ff-oglu",
            serde_json::json!({"ortho_penalty": -1.0}),
            "ortho_penalty",
        ),
        (
            "nystrom",
            serde_json::json!({"n_landmarks": 0}),
            "n_landmarks",
        ),
        (
            "nystrom",
            serde_json::json!({"conv_kernel": 4}),
            "conv_kernel",
        ),
        (
            "nystrom",
            serde_json::json!({"pinv_iterations": 0}),
            "pinv_iterations",
        ),
        (
            "performer",
            serde_json::json!({"n_features": 0}),
            "n_features",
        ),
    ] {
        let err = AttentionConfig::from_name(name, 16, 2, 8)
            .unwrap()
            .with_params(params.as_object().unwrap())
            .unwrap_err();
        field(err, key);
    }
    let params = serde_json::json!({"kk": 3});
    assert!(
        linformer
            .with_params(params.as_object().unwrap())
            .unwrap_err()
            .to_string()
            .contains("`kk`")
    );
    assert!(
        AttentionConfig::from_name("nope", 16, 2, 8)
            .unwrap_err()
            .to_string()
            .contains("nope")
    );
}

/// The Linformer sharing modes own the projections the paper describes.
#[test]
fn linformer_sharing_parameter_counts() {
    let device = device();
    let (k, n) = (5, N_MAX);
    let qkvo = 4 * D_MODEL * D_MODEL;
    let count = |sharing| {
        LinformerConfig::new(D_MODEL, N_HEADS, n)
            .with_k(k)
            .with_sharing(sharing)
            .init(&device)
            .num_params()
    };
    assert_eq!(count(LinformerSharing::None), qkvo + 2 * N_HEADS * k * n);
    assert_eq!(count(LinformerSharing::Headwise), qkvo + 2 * k * n);
    assert_eq!(count(LinformerSharing::KeyValue), qkvo + k * n);
    assert_eq!(count(LinformerSharing::Layerwise), qkvo);
    let block = EncoderBlockConfig::new(
        AttentionConfig::Linformer(
            LinformerConfig::new(D_MODEL, N_HEADS, n)
                .with_k(k)
                .with_sharing(LinformerSharing::Layerwise),
        ),
        32,
    );
    let one = EncoderConfig::new(block.clone(), 1)
        .init(&device)
        .num_params();
    let three = EncoderConfig::new(block, 3).init(&device).num_params();
    // One shared projection however many layers.
    assert_eq!(three - one, 2 * (one - k * n - 2 * D_MODEL));
}

/// Check 4 for Efficient Attention: `ρ_q(Q) (ρ_k(K)ᵀ V)` in float64, padded keys left out of
/// `ρ_k`'s normalisation and of the sum; tolerance 1e-4 relative as above.
#[test]
fn check_4_efficient_matches_float64_reference() {
    let device = device();
    let [q, k, v] = qkv(2, 2, 9, 6, &device);
    let lengths = [9, 4];
    let mask = padding_mask_from_lengths(&lengths, 9, &device);
    let out = to_heads(&efficient_attention(
        q.clone(),
        k.clone(),
        v.clone(),
        Some(mask),
    ));
    let (q, k, v) = (to_heads(&q), to_heads(&k), to_heads(&v));
    for b in 0..2 {
        for h in 0..2 {
            let real = lengths[b];
            let rho_q = softmax_rows(&q[b][h]);
            let rho_k_t = softmax_rows(&transpose(&k[b][h][..real])); // [d][real]
            let expected = matmul(&rho_q, &matmul(&rho_k_t, &v[b][h][..real]));
            let err = max_rel_err(&out[b][h], &expected, 1e-2);
            assert!(err < 1e-4, "batch {b} head {h}: relative error {err}");
        }
    }
}

/// Check 4 for Linformer with linear-complexity attention: the reference evaluates `(H L) X` in
/// float64 (the module computes `H (L X)`, so this also checks the reassociation), with random
/// per-head projections shorter than `n_max` and padding; tolerance 1e-4 relative.
#[test]
fn check_4_linformer_linear_matches_float64_reference() {
    let err = linformer_case(linformer_linear_attention, |q, k, v, e, f, real| {
        let s = 1.0 / (q[0].len() as f64).sqrt();
        let hq = softmax_rows(&scale(q, s));
        let ek = project(e, k, |j| j >= real); // [k][d]
        let l = softmax_rows(&scale(&transpose(&ek), s)); // [d][k]
        let x = project(f, v, |j| j >= real);
        matmul(&matmul(&hq, &l), &x)
    });
    assert!(err < 1e-4, "relative error {err}");
}

/// Check 4, its limiting case (ATTENTION.md section 4): with `k = n` and `E = F = I` it equals
/// Efficient Attention applied to `Q/√d` and `K/√d`, to f32 round-off.
#[test]
fn check_4_linformer_linear_identity_projection_is_efficient() {
    let device = device();
    let (n, d) = (10, 8);
    let [q, k, v] = qkv(2, 2, n, d, &device);
    let eye = Tensor::<2>::eye(n, &device).unsqueeze::<3>();
    let lin = linformer_linear_attention(q.clone(), k.clone(), v.clone(), eye.clone(), eye, None);
    let s = 1.0 / (d as f32).sqrt();
    let eff = efficient_attention(q.mul_scalar(s), k.mul_scalar(s), v, None);
    lin.into_data()
        .assert_approx_eq::<f32>(&eff.into_data(), tol());
}

/// Check 4 and 5 for linear attention: equals the quadratic form
/// `normalize_rows(φ(Q) φ(K)ᵀ ⊙ mask) V` with `φ = elu + 1` in float64, with padding, causal and
/// not (the normaliser carries the same ε = 1e-6); tolerance 1e-4 relative.
#[test]
fn check_4_linear_matches_quadratic_form() {
    let device = device();
    let [q, k, v] = qkv(2, 2, 8, 4, &device);
    let lengths = [8, 5];
    let mask = padding_mask_from_lengths(&lengths, 8, &device);
    let phi = |x: f64| if x > 0.0 { x + 1.0 } else { x.exp() };
    for causal in [false, true] {
        let out = to_heads(&linear_attention(
            q.clone(),
            k.clone(),
            v.clone(),
            Some(mask.clone()),
            causal,
        ));
        let (qh, kh, vh) = (to_heads(&q), to_heads(&k), to_heads(&v));
        for b in 0..2 {
            for h in 0..2 {
                let map = |x: &[Vec<f64>]| -> Vec<Vec<f64>> {
                    x.iter()
                        .map(|r| r.iter().map(|&a| phi(a)).collect())
                        .collect()
                };
                let expected =
                    kernelized_head(&map(&qh[b][h]), &map(&kh[b][h]), &vh[b][h], |i, j| {
                        j >= lengths[b] || (causal && j > i)
                    });
                let err = max_rel_err(&out[b][h], &expected, 1e-2);
                assert!(
                    err < 1e-4,
                    "causal {causal} batch {b} head {h}: relative error {err}"
                );
            }
        }
    }
}

/// ATTENTION.md section 6: the mean relative error of FAVOR+ to exact softmax attention falls as
/// the number of random features grows (m = 16 against m = 512, same inputs, same seed; averaged
/// over 4 heads and 3 draws so one lucky draw cannot decide it). Inputs are scaled by 0.5, the
/// regime where the positive-feature estimator's variance is moderate.
#[test]
fn favor_error_falls_with_more_features() {
    let device = device();
    let d = 16;
    let [q, k, v] = qkv(1, 4, 32, d, &device);
    let (q, k) = (q.mul_scalar(0.5), k.mul_scalar(0.5));
    let exact = to_heads(&softmax_attention(
        q.clone(),
        k.clone(),
        v.clone(),
        None,
        false,
    ));
    let mean_err = |m: usize| {
        let mut total = 0.0;
        for draw in 0..3 {
            device.seed(100 + draw);
            let w = orthogonal_features(m, d, &device);
            let approx = to_heads(&favor_attention(
                q.clone(),
                k.clone(),
                v.clone(),
                w,
                None,
                false,
            ));
            for h in 0..4 {
                let num: f64 = approx[0][h]
                    .iter()
                    .flatten()
                    .zip(exact[0][h].iter().flatten())
                    .map(|(a, b)| (a - b).abs())
                    .sum();
                let den: f64 = exact[0][h].iter().flatten().map(|b| b.abs()).sum();
                total += num / den;
            }
        }
        total / 12.0
    };
    let (few, many) = (mean_err(16), mean_err(512));
    eprintln!("FAVOR+ mean relative error to softmax: m = 16: {few:.4}, m = 512: {many:.4}");
    assert!(many < 0.5 * few, "m = 16: {few:.4}, m = 512: {many:.4}");
}

/// The random features are stacked orthogonal blocks: rows of one block are mutually
/// orthogonal (up to f32 round-off), and their norms are not all equal (χ(d) rescaling).
#[test]
fn favor_features_are_orthogonal_blocks() {
    let device = device();
    let (m, d) = (20, 8);
    let w = orthogonal_features(m, d, &device);
    let rows: Vec<f32> = w.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
    let row = |i: usize| &rows[i * d..(i + 1) * d];
    let norm = |i: usize| row(i).iter().map(|a| a * a).sum::<f32>().sqrt();
    for block in 0..m.div_ceil(d) {
        for i in block * d..((block + 1) * d).min(m) {
            for j in block * d..i {
                let dot: f32 = row(i).iter().zip(row(j)).map(|(a, b)| a * b).sum();
                assert!(dot.abs() < 1e-4 * norm(i) * norm(j), "rows {i}, {j}: {dot}");
            }
        }
    }
    assert!((0..m).any(|i| (norm(i) - norm(0)).abs() > 1e-3));
}

/// Redrawing is explicit: `forward` never changes the features, `redraw` does, and the features
/// take no gradient.
#[test]
fn performer_redraw_is_explicit() {
    let device = device();
    let attention = PerformerConfig::new(D_MODEL, N_HEADS)
        .with_n_features(16)
        .init(&device);
    let x = random([1, 6, D_MODEL], &device);
    let w0 = attention.features.as_ref().unwrap().val().into_data();
    let _ = attention.forward(AttentionInput::new(x));
    let w1 = attention.features.as_ref().unwrap().val().into_data();
    w1.assert_eq(&w0, true);
    let redrawn = attention.redraw();
    let features = redrawn.features.as_ref().unwrap();
    assert!(!features.is_require_grad());
    let w2 = features.val().into_data();
    assert_eq!(w2.shape(), w0.shape());
    assert_ne!(
        w2.try_to_vec::<f32>().unwrap(),
        w0.try_to_vec::<f32>().unwrap()
    );
}
