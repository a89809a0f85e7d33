//! Hedgehog against float64 implementations of the paper's formulas (Zhang et al. 2024, arXiv
//! 2402.04347, §4.1-4.2): per head, `φ(x) = [softmax(x W), softmax(−x W)]` for queries and keys
//! with their own `W`, `O_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j)` summed pair by pair over
//! the real keys (`j ≤ i` when causal); and the attention-distillation loss, the soft
//! cross-entropy `−Σ_j s_ij log a_ij` from softmax's weights `s = softmax(q k / √d)` to
//! Hedgehog's normalised weights `a`, averaged over real queries and heads, times the weight.
//! With maps moved away from their identity initialisation by noise, padding with junk at the
//! end of a sequence, inputs at scale 1 and 3.

mod reference;

use burn::prelude::*;
use burn::tensor::Distribution;
use burn_attention_zoo::{
    AttentionInput, AttentionModule, HedgehogAttention, HedgehogConfig, padding_mask_from_lengths,
};
use reference::{
    hedgehog_f64, kernelized_head, linear_f64, max_rel_err, normal_tensor, softmax_rows, to_rows,
};

type Rows = Vec<Vec<f64>>;

const D_MODEL: usize = 16;
const HEADS: usize = 2;
const D: usize = D_MODEL / HEADS;

fn module(distill_weight: f64, device: &Device) -> HedgehogAttention {
    let mut m = HedgehogConfig::new(D_MODEL, HEADS)
        .with_distill_weight(distill_weight)
        .with_bias(true)
        .init(device);
    let noise = |seed: u64| normal_tensor([HEADS, D, D], seed, device).mul_scalar(0.5);
    m.query_map = m.query_map.map(|w| w + noise(91));
    m.key_map = m.key_map.map(|w| w + noise(92));
    m
}

fn head_cols(rows: &Rows, h: usize) -> Rows {
    rows.iter()
        .map(|r| r[h * D..(h + 1) * D].to_vec())
        .collect()
}

fn map_of(w: &burn::module::Param<Tensor<3>>, h: usize) -> Rows {
    to_rows(&w.val().slice(s![h..h + 1]).squeeze_dim::<2>(0))
}

/// The module's output for the real rows `x` of one sequence, and the distillation loss summed
/// over its queries and heads (not yet averaged).
fn hedgehog_f64_module(m: &HedgehogAttention, x: &[Vec<f64>], causal: bool) -> (Rows, f64) {
    let (q, k, v) = (
        linear_f64(&m.proj.query, x),
        linear_f64(&m.proj.key, x),
        linear_f64(&m.proj.value, x),
    );
    let n = x.len();
    let mut o = vec![vec![0.0; D_MODEL]; n];
    let mut loss = 0.0;
    let future = |i: usize, j: usize| causal && j > i;
    for h in 0..HEADS {
        let (qh, kh, vh) = (head_cols(&q, h), head_cols(&k, h), head_cols(&v, h));
        let phi_q = hedgehog_f64(&map_of(&m.query_map, h), &qh);
        let phi_k = hedgehog_f64(&map_of(&m.key_map, h), &kh);
        let out = kernelized_head(&phi_q, &phi_k, &vh, future);
        for i in 0..n {
            o[i][h * D..(h + 1) * D].copy_from_slice(&out[i]);
            // Softmax's weights and Hedgehog's over the keys a query sees.
            let seen: Vec<usize> = (0..n).filter(|&j| !future(i, j)).collect();
            let scores: Vec<f64> = seen
                .iter()
                .map(|&j| (0..D).map(|a| qh[i][a] * kh[j][a]).sum::<f64>() / (D as f64).sqrt())
                .collect();
            let teacher = &softmax_rows(&[scores])[0];
            let kernel: Vec<f64> = seen
                .iter()
                .map(|&j| (0..2 * D).map(|a| phi_q[i][a] * phi_k[j][a]).sum())
                .collect();
            let total: f64 = kernel.iter().sum();
            loss -= teacher
                .iter()
                .zip(&kernel)
                .map(|(t, a)| t * (a / total).ln())
                .sum::<f64>();
        }
    }
    (linear_f64(&m.proj.output, &o), loss)
}

fn rows(x: &Tensor<3>, b: usize, len: usize) -> Rows {
    to_rows(&x.clone().slice(s![b..b + 1, 0..len]).squeeze_dim::<2>(0))
}

#[test]
fn hedgehog_and_its_distillation_match_float64() {
    let device = Device::flex();
    let weight = 0.5;
    let m = module(weight, &device);
    let n = 40;
    let lens = [40, 27];
    for scale in [1.0, 3.0] {
        let x = normal_tensor([2, n, D_MODEL], 5 + scale as u64, &device).mul_scalar(scale);
        let junk = Tensor::random([2, n, D_MODEL], Distribution::Normal(0.0, 50.0), &device);
        let mask = padding_mask_from_lengths(&lens, n, &device);
        let x = x.mask_where(mask.clone().reshape([2, n, 1]), junk);
        for causal in [false, true] {
            let input = AttentionInput::new(x.clone())
                .mask_pad(mask.clone())
                .causal(causal);
            let (out, loss) = m.try_forward_with_loss(input.clone()).unwrap();
            let plain = m.forward(input);
            let mut expected_loss = 0.0;
            for (b, &len) in lens.iter().enumerate() {
                let (expected, loss) = hedgehog_f64_module(&m, &rows(&x, b, len), causal);
                expected_loss += loss;
                for (what, got) in [("with loss", &out), ("forward", &plain)] {
                    let err = max_rel_err(&rows(got, b, len), &expected, 5e-2);
                    assert!(
                        err < 1e-4,
                        "{what}, scale {scale} causal {causal} batch {b}: off by {err}"
                    );
                }
            }
            let queries = (lens.iter().sum::<usize>() * HEADS) as f64;
            let expected_loss = weight * expected_loss / queries;
            let loss = loss.expect("a distillation weight above 0 gives a loss");
            let got = loss.into_scalar::<f32>() as f64;
            assert!(
                (got - expected_loss).abs() < 1e-4 * expected_loss.abs().max(1.0),
                "scale {scale} causal {causal}: loss {got}, expected {expected_loss}"
            );
        }
    }
}

/// Decoding after a prompt gives the causal forward pass's outputs; without a distillation
/// weight no loss is formed.
#[test]
fn decoding_equals_the_causal_forward_and_no_weight_no_loss() {
    let device = Device::flex();
    let m = module(0.0, &device);
    let x = normal_tensor([2, 50, D_MODEL], 8, &device);
    let full = m.forward(AttentionInput::new(x.clone()).causal(true));
    let (_, mut state) = m.prefill(x.clone().slice(s![.., 0..30])).unwrap();
    for t in 30..50 {
        let (y, next) = m.decode(x.clone().slice(s![.., t..t + 1]), state).unwrap();
        state = next;
        let flat = |y: Tensor<3>| to_rows(&y.reshape([2, D_MODEL]));
        let err = max_rel_err(&flat(y), &flat(full.clone().slice(s![.., t..t + 1])), 5e-2);
        assert!(err < 1e-4, "token {t}: off by {err}");
    }
    let (_, loss) = m.try_forward_with_loss(AttentionInput::new(x)).unwrap();
    assert!(loss.is_none());
    let err = HedgehogConfig::new(D_MODEL, HEADS)
        .with_distill_weight(-1.0)
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("distill_weight"), "{err}");
}
