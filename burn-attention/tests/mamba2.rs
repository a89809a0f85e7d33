//! Mamba-2's SSD mixer against a float64 implementation of the paper's recurrence (Dao & Gu
//! 2024, arXiv 2405.21060, §3): per head, `Δ_t = softplus(x_t W_Δ + b_Δ)`, `A = −exp(A_log)`,
//! `S_t = exp(Δ_t A) S_{t−1} + Δ_t B_t x_tᵀ`, `y_t = S_tᵀ C_t + D x_t`, token by token; then
//! `RMSNorm(y ⊙ silu(x W_z))` and the output projection. The non-causal form adds the same
//! recurrence run from the end of the sequence (position `i` reading `j > i` through the decays
//! of `i..j−1`), the diagonal counted once.
//!
//! With the module's own weights, its step sizes scaled up so that decays over a few hundred
//! positions span many orders of magnitude; lengths of one chunk, three and eleven; padding at
//! the end and inside a sequence with large junk (a padded position must change nothing);
//! inputs at scale 1 and 4.

mod reference;

use burn::prelude::*;
use burn_attention_zoo::{AttentionInput, AttentionModule, Mamba2Attention, Mamba2Config};
use reference::{
    draw_alone, linear_f64, max_conditioned_err, normal_tensor, normalise_groups_f64, padded_pair,
    rotate_heads_f64, softplus, to_rows, vector,
};

type Rows = Vec<Vec<f64>>;

const D_MODEL: usize = 16;
const HEADS: usize = 2;
const D_HEAD: usize = D_MODEL / HEADS;
/// Largest relative error of the f32 module against float64 (floor 0.05: the outputs are
/// RMS-normalised, of order 1), each row's divided by its conditioning under that normalisation;
/// 4.8e-4 the largest raw error seen over 52 runs, each with its own random weights (7e-3 before
/// the decays were summed over their own spans).
const TOLERANCE: f64 = 2e-3;

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// One direction of the recurrence over `order` (the positions in scan order) for head `h`:
/// each position's `S_tᵀ C_t`.
fn scan(
    order: &[usize],
    h: usize,
    (c, b, v): (&Rows, &Rows, &Rows),
    (dt, a): (&Rows, f64),
) -> Vec<Vec<f64>> {
    let cols = h * D_HEAD..(h + 1) * D_HEAD;
    let mut s = vec![vec![0.0; D_HEAD]; D_HEAD];
    let mut out = vec![vec![0.0; D_HEAD]; c.len()];
    for &t in order {
        let decay = (dt[t][h] * a).exp();
        for (i, row) in s.iter_mut().enumerate() {
            for (j, x) in row.iter_mut().enumerate() {
                *x = decay * *x + dt[t][h] * b[t][cols.start + i] * v[t][cols.start + j];
            }
        }
        out[t] = (0..D_HEAD)
            .map(|j| (0..D_HEAD).map(|i| s[i][j] * c[t][cols.start + i]).sum())
            .collect();
    }
    out
}

/// The module's output for the real rows `x` of one sequence (with rotary positions: `C` and
/// `B` rotated at their positions among the real rows), and each row's conditioning under the
/// gated normalisation.
fn mamba2_f64(m: &Mamba2Attention, x: &[Vec<f64>], causal: bool) -> (Rows, Vec<f64>) {
    let n = x.len();
    let rotated = |rows: Rows| -> Rows {
        if !m.proj.rotary {
            return rows;
        }
        rows.iter()
            .enumerate()
            .map(|(p, row)| rotate_heads_f64(row, p as f64, HEADS, D_HEAD))
            .collect()
    };
    let c = rotated(linear_f64(&m.proj.query, x));
    let b = rotated(linear_f64(&m.proj.key, x));
    let v = linear_f64(&m.proj.value, x);
    let bias = vector(&m.dt_bias);
    let dt: Rows = linear_f64(&m.dt_proj, x)
        .iter()
        .map(|row| {
            row.iter()
                .zip(&bias)
                .map(|(a, c)| softplus(a + c))
                .collect()
        })
        .collect();
    let (a_log, d_skip) = (vector(&m.a_log), vector(&m.d_skip));
    let mut y = vec![vec![0.0; D_MODEL]; n];
    for h in 0..HEADS {
        let a = -a_log[h].exp();
        let forward: Vec<usize> = (0..n).collect();
        let ahead = scan(&forward, h, (&c, &b, &v), (&dt, a));
        let behind = if causal {
            vec![vec![0.0; D_HEAD]; n]
        } else {
            // From the end: position i reads j > i through the decays of i..j−1, i.e. the
            // reversed scan, whose own term (j = i) the forward scan has already counted.
            let backward: Vec<usize> = (0..n).rev().collect();
            let mut behind = scan(&backward, h, (&c, &b, &v), (&dt, a));
            for (i, row) in behind.iter_mut().enumerate() {
                let own: f64 = (0..D_HEAD)
                    .map(|k| c[i][h * D_HEAD + k] * b[i][h * D_HEAD + k])
                    .sum::<f64>()
                    * dt[i][h];
                for (j, value) in row.iter_mut().enumerate() {
                    *value -= own * v[i][h * D_HEAD + j];
                }
            }
            behind
        };
        for i in 0..n {
            for j in 0..D_HEAD {
                y[i][h * D_HEAD + j] =
                    ahead[i][j] + behind[i][j] + d_skip[h] * v[i][h * D_HEAD + j];
            }
        }
    }
    let z = linear_f64(&m.gate, x);
    let gated: Rows = y
        .iter()
        .zip(&z)
        .map(|(row, z)| row.iter().zip(z).map(|(a, g)| a * silu(*g)).collect())
        .collect();
    let (normalised, conditioning) = normalise_groups_f64(&gated, D_MODEL, m.norm_eps, false);
    let scale = vector(&m.norm_weight);
    let normed: Rows = normalised
        .iter()
        .map(|row| row.iter().zip(&scale).map(|(a, w)| a * w).collect())
        .collect();
    (linear_f64(&m.proj.output, &normed), conditioning)
}

fn rows(x: &Tensor<3>, b: usize, keep: &[usize]) -> Rows {
    let all = to_rows(&x.clone().slice(s![b..b + 1]).squeeze_dim::<2>(0));
    keep.iter().map(|&i| all[i].clone()).collect()
}

/// With fresh weights in every run, 1 run in 80 once failed the tolerance (2.1e-3, a rotary
/// case at scale 4), before the check allowed for the round-off the gated normalisation enlarges
/// where a row is nearly zero (`reference::normalise_groups_f64`): over 60 fresh draws the raw
/// errors reached 1.4e-3, the conditioned ones 1.9e-4. The test draws its weights from seed 5,
/// materialised while the generator is held (parameters are drawn on first use), so that a
/// failure replays.
#[test]
fn mamba2_matches_float64_reference() {
    let device = Device::flex();
    let mut m = draw_alone(&device, Some(5), || {
        let m = Mamba2Config::new(D_MODEL, HEADS)
            .with_bias(true)
            .init(&device);
        let _ = m.forward(AttentionInput::new(Tensor::zeros([1, 2, D_MODEL], &device)));
        m
    });
    // Step sizes near 1 (the initial ones are 0.001-0.1): over 700 positions the decays reach
    // far below f32's smallest normal number.
    m.dt_bias = m.dt_bias.map(|b| b.add_scalar(3.0));
    let rotary = m.clone().with_rotary().unwrap();
    for m in [m, rotary] {
        matches_float64_reference(&m, &device);
    }
}

/// The module against [`mamba2_f64`] at lengths of one chunk to eleven, padded, causal or not.
fn matches_float64_reference(m: &Mamba2Attention, device: &Device) {
    for (case, n) in [5usize, 64, 150, 700].into_iter().enumerate() {
        for scale in [1.0, 4.0] {
            let seed = 10 * case as u64 + scale as u64;
            let (x, mask, real) = padded_pair([n, D_MODEL], seed, scale, device);
            for causal in [true, false] {
                let out = m.forward(
                    AttentionInput::new(x.clone())
                        .mask_pad(mask.clone())
                        .causal(causal),
                );
                for (b, keep) in real.iter().enumerate() {
                    let (expected, conditioning) = mamba2_f64(m, &rows(&x, b, keep), causal);
                    let got = rows(&out, b, keep);
                    let err = max_conditioned_err(&got, &expected, 5e-2, &conditioning);
                    assert!(
                        err < TOLERANCE,
                        "rotary {} n {n} scale {scale} causal {causal} batch {b}: relative \
                         error {err}",
                        m.proj.rotary
                    );
                }
            }
        }
    }
}

/// Cross-attention is refused with the reason.
#[test]
fn cross_attention_is_refused() {
    let device = Device::flex();
    let m = draw_alone(&device, None, || {
        let m = Mamba2Config::new(D_MODEL, HEADS).init(&device);
        let _ = m.forward(AttentionInput::new(Tensor::zeros([1, 2, D_MODEL], &device)));
        m
    });
    let q = normal_tensor([1, 4, D_MODEL], 1, &device);
    let kv = normal_tensor([1, 6, D_MODEL], 2, &device);
    let err = m
        .try_forward(AttentionInput::cross(q, kv.clone(), kv))
        .unwrap_err()
        .to_string();
    assert!(err.contains("cross-attention"), "{err}");
}
