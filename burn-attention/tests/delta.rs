//! The delta-rule core (`engines::delta`) against its recurrence in float64, token by token, as
//! the papers write it (Schlag et al. 2021, arXiv 2102.11174; Yang et al. 2025, arXiv
//! 2412.06464, eq. 10): `S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ`, `o_t = S_tᵀ q_t`,
//! the matrix `I − β_t k_t k_tᵀ` applied as it is (no pseudo-values, no WY form). The chunked
//! causal form at chunks of 1 to 512, continuing from a given state, and the token-by-token step
//! must give its outputs and final state; the non-causal form, the forward recurrence plus the
//! reversed one read before each position's own write.

mod reference;

use burn::prelude::*;
use burn_attention_zoo::engines::delta::{delta_bidirectional, delta_causal, delta_step};
use reference::{max_rel_err, normal_tensor, to_rows};

type Rows = Vec<Vec<f64>>;

/// The recurrence over one sequence's rows in `order`, from a zero state: each position's
/// output (`exclusive`: the state before its own step, decayed by its own `α`, as the reversed
/// scan of the non-causal form reads it) and the final state.
fn recurrence_f64(
    (q, k, v): (&Rows, &Rows, &Rows),
    (beta, g): (&[f64], &[f64]),
    order: &[usize],
    exclusive: bool,
) -> (Rows, Rows) {
    let (d_k, d_v) = (k[0].len(), v[0].len());
    let mut s = vec![vec![0.0; d_v]; d_k];
    let mut out = vec![vec![0.0; d_v]; q.len()];
    let read = |s: &Rows, t: usize, scale: f64| -> Vec<f64> {
        (0..d_v)
            .map(|c| scale * (0..d_k).map(|a| s[a][c] * q[t][a]).sum::<f64>())
            .collect()
    };
    for &t in order {
        if exclusive {
            out[t] = read(&s, t, g[t].exp());
        }
        // (I − β k kᵀ) S: subtract β k (kᵀ S).
        let kts: Vec<f64> = (0..d_v)
            .map(|c| (0..d_k).map(|a| k[t][a] * s[a][c]).sum())
            .collect();
        let alpha = g[t].exp();
        for a in 0..d_k {
            for c in 0..d_v {
                s[a][c] =
                    alpha * (s[a][c] - beta[t] * k[t][a] * kts[c]) + beta[t] * k[t][a] * v[t][c];
            }
        }
        if !exclusive {
            out[t] = read(&s, t, 1.0);
        }
    }
    (out, s)
}

struct Inputs {
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    beta: Tensor<4>,
    log_decay: Option<Tensor<4>>,
}

/// Unit-length keys drawn from `directions` directions per head (few: the same key written
/// again and again, where the delta rule differs most from a sum), `β` in (0, 1), log-decays
/// from 0 to −1.5 a step where `gated`.
fn inputs(shape: [usize; 4], directions: usize, gated: bool, device: &Device) -> Inputs {
    let [b, h, n, d] = shape;
    let basis = normal_tensor([b, h, directions, d], 2, device);
    let picks: Vec<i64> = (0..n)
        .map(|t| ((t * 7 + t / 5) % directions) as i64)
        .collect();
    let picks = Tensor::<1, Int>::from_data(TensorData::new(picks, [n]), device);
    let k = basis.select(2, picks) + normal_tensor(shape, 3, device).mul_scalar(0.05);
    let k = k.clone() / k.powi_scalar(2).sum_dim(3).sqrt();
    let beta =
        burn::tensor::activation::sigmoid(normal_tensor([b, h, n, 1], 4, device).mul_scalar(2.0));
    let log_decay = gated.then(|| {
        normal_tensor([b, h, n, 1], 5, device)
            .abs()
            .mul_scalar(-0.7)
            .clamp_min(-1.5)
    });
    Inputs {
        q: normal_tensor(shape, 1, device),
        k,
        v: normal_tensor(shape, 6, device),
        beta,
        log_decay,
    }
}

/// Per sequence (batch and head), its rows of `x: [b, h, n, w]`.
fn sequences(x: &Tensor<4>) -> Vec<Rows> {
    let [b, h, n, w] = x.dims();
    let rows = to_rows(&x.clone().reshape([b * h * n, w]));
    rows.chunks(n).map(|c| c.to_vec()).collect()
}

fn column(x: &Tensor<4>) -> Vec<Vec<f64>> {
    sequences(x)
        .into_iter()
        .map(|rows| rows.into_iter().map(|r| r[0]).collect())
        .collect()
}

/// Expected outputs and final states, per sequence, of the recurrence over `x`.
fn expected(x: &Inputs, reverse_exclusive: bool) -> (Vec<Rows>, Vec<Rows>) {
    let (q, k, v) = (sequences(&x.q), sequences(&x.k), sequences(&x.v));
    let beta = column(&x.beta);
    let n = x.q.dims()[2];
    let g = match &x.log_decay {
        Some(g) => column(g),
        None => vec![vec![0.0; n]; q.len()],
    };
    let (mut outs, mut states) = (Vec::new(), Vec::new());
    for i in 0..q.len() {
        let seq = (&q[i], &k[i], &v[i]);
        let forward: Vec<usize> = (0..n).collect();
        let (mut out, state) = recurrence_f64(seq, (&beta[i], &g[i]), &forward, false);
        if reverse_exclusive {
            let backward: Vec<usize> = (0..n).rev().collect();
            let (behind, _) = recurrence_f64(seq, (&beta[i], &g[i]), &backward, true);
            for (row, extra) in out.iter_mut().zip(behind) {
                for (a, b) in row.iter_mut().zip(extra) {
                    *a += b;
                }
            }
        }
        outs.push(out);
        states.push(state);
    }
    (outs, states)
}

/// Largest relative error (floor 0.1) against float64: 2.4e-5 seen at chunks of 32 and 5.7e-5
/// in one chunk of 150, at keys written again and again.
fn check(what: &str, out: &Tensor<4>, expected: &[Rows], tolerance: f64) {
    for (i, (got, want)) in sequences(out).iter().zip(expected).enumerate() {
        let err = max_rel_err(got, want, 1e-1);
        assert!(err < tolerance, "{what}, sequence {i}: off by {err}");
    }
}

/// The chunked form at chunks 1, 5, 32 and 512, from a zero state and continuing from the
/// state a first part leaves; the step token by token. With and without decays, keys from 3
/// directions (each written about every third position) and from 40.
#[test]
fn chunks_and_steps_equal_the_recurrence() {
    let device = Device::flex();
    let shape = [2, 2, 150, 8];
    for gated in [false, true] {
        for directions in [3, 40] {
            let x = inputs(shape, directions, gated, &device);
            let (want, want_state) = expected(&x, false);
            let what = format!("gated {gated}, {directions} directions");
            let gates = (x.beta.clone(), x.log_decay.clone());
            for chunk in [1, 5, 32, 512] {
                let (out, state) = delta_causal(
                    x.q.clone(),
                    x.k.clone(),
                    x.v.clone(),
                    gates.clone(),
                    None,
                    chunk,
                );
                check(&format!("{what}, chunk {chunk}"), &out, &want, 1e-4);
                check(
                    &format!("{what}, chunk {chunk}: state"),
                    &state,
                    &want_state,
                    1e-4,
                );
            }
            // The first 70 positions, then the rest from their state.
            let part = |x: &Tensor<4>, r: std::ops::Range<usize>| x.clone().slice(s![.., .., r]);
            let first = |x: &Tensor<4>| part(x, 0..70);
            let rest = |x: &Tensor<4>| part(x, 70..150);
            let (head, state) = delta_causal(
                first(&x.q),
                first(&x.k),
                first(&x.v),
                (first(&x.beta), x.log_decay.as_ref().map(first)),
                None,
                32,
            );
            let (tail, state) = delta_causal(
                rest(&x.q),
                rest(&x.k),
                rest(&x.v),
                (rest(&x.beta), x.log_decay.as_ref().map(rest)),
                Some(state),
                32,
            );
            check(
                &format!("{what}, in two calls"),
                &Tensor::cat(vec![head, tail], 2),
                &want,
                1e-4,
            );
            check(
                &format!("{what}, in two calls: state"),
                &state,
                &want_state,
                1e-4,
            );
            let mut s = None;
            let mut steps = Vec::new();
            for t in 0..shape[2] {
                let at = |x: &Tensor<4>| part(x, t..t + 1);
                let (o, next) = delta_step(
                    at(&x.q),
                    at(&x.k),
                    at(&x.v),
                    (at(&x.beta), x.log_decay.as_ref().map(at)),
                    s,
                );
                steps.push(o);
                s = Some(next);
            }
            check(
                &format!("{what}, steps"),
                &Tensor::cat(steps, 2),
                &want,
                1e-4,
            );
        }
    }
}

/// The non-causal form: the forward recurrence plus the reversed one read before each
/// position's own write (decayed by its own α).
#[test]
fn the_non_causal_form_is_both_directions() {
    let device = Device::flex();
    for gated in [false, true] {
        let x = inputs([1, 2, 90, 8], 40, gated, &device);
        let (want, _) = expected(&x, true);
        for chunk in [7, 32] {
            let out = delta_bidirectional(
                x.q.clone(),
                x.k.clone(),
                x.v.clone(),
                (x.beta.clone(), x.log_decay.clone()),
                chunk,
            );
            check(&format!("gated {gated}, chunk {chunk}"), &out, &want, 1e-4);
        }
    }
}
