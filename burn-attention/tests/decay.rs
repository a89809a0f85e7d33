//! The decaying-state core (`engines::decay`) against the recurrence it computes, in float64 token
//! by token: `S_t = exp(g_t) S_{t−1} + k_t v_tᵀ` (with a gate per key channel, row `a` of the
//! state decays by `exp(g_{t,a})`), `o_t = S_tᵀ q_t`, each decay applied as the step it is. The
//! chunked causal form (whatever the chunk) and the token-by-token step must give its outputs
//! and its final state; the non-causal form, both directions' recurrences less the diagonal.

mod reference;

use burn::prelude::*;
use burn_attention_zoo::engines::decay::{decayed_bidirectional, decayed_causal, decayed_step};
use reference::{max_rel_err, normal_tensor, to_rows};

type Rows = Vec<Vec<f64>>;

/// The recurrence over rows `[b·h·n][d]` (`g`: `[b·h·n][1]`, or `[b·h·n][d]` per key
/// channel): the outputs and the final states `[b·h·d][d]`.
fn recurrence_f64(q: &Rows, k: &Rows, v: &Rows, g: &Rows, n: usize) -> (Rows, Rows) {
    let d = q[0].len();
    let (mut outputs, mut states) = (Vec::new(), Vec::new());
    for seq in 0..q.len() / n {
        let mut s = vec![vec![0.0; d]; d];
        for t in seq * n..(seq + 1) * n {
            for (a, row) in s.iter_mut().enumerate() {
                let decay = g[t][a.min(g[t].len() - 1)].exp();
                for (c, x) in row.iter_mut().enumerate() {
                    *x = decay * *x + k[t][a] * v[t][c];
                }
            }
            outputs.push(
                (0..d)
                    .map(|c| (0..d).map(|a| s[a][c] * q[t][a]).sum())
                    .collect(),
            );
        }
        states.extend(s);
    }
    (outputs, states)
}

/// Checks the chunked form at chunks 1, 7, 64 and 512 and the token-by-token step against
/// the recurrence over `q`, `k`, `v: [b, h, n, d]` and `log_decay: [b, h, n, 1]`: outputs and
/// final state within `tolerance` (relative, floor 0.1).
fn check_against_recurrence(
    (q, k, v): (Tensor<4>, Tensor<4>, Tensor<4>),
    log_decay: Tensor<4>,
    tolerance: f64,
) {
    let [b, h, n, d] = q.dims();
    let w = log_decay.dims()[3];
    let flat = |x: &Tensor<4>, w: usize| to_rows(&x.clone().reshape([b * h * n, w]));
    let (expected, expected_state) = recurrence_f64(
        &flat(&q, d),
        &flat(&k, d),
        &flat(&v, d),
        &flat(&log_decay, w),
        n,
    );
    let check = |what: String, out: Tensor<4>, state: Tensor<4>| {
        let err = max_rel_err(&flat(&out, d), &expected, 1e-1);
        assert!(err < tolerance, "{what}: outputs off by {err}");
        let state = to_rows(&state.reshape([b * h * d, d]));
        let err = max_rel_err(&state, &expected_state, 1e-1);
        assert!(err < tolerance, "{what}: state off by {err}");
    };
    for chunk in [1, 7, 64, 512] {
        let (out, s) = decayed_causal(q.clone(), k.clone(), v.clone(), log_decay.clone(), chunk);
        check(format!("chunk {chunk}"), out, s);
    }
    let mut state = None;
    let mut steps = Vec::new();
    for t in 0..n {
        let at = |x: &Tensor<4>| x.clone().slice(s![.., .., t..t + 1]);
        let (o, s) = decayed_step(at(&q), at(&k), at(&v), at(&log_decay), state);
        steps.push(o);
        state = Some(s);
    }
    check("steps".into(), Tensor::cat(steps, 2), state.unwrap());
}

fn qkv(shape: [usize; 4], device: &Device) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
    (
        normal_tensor(shape, 1, device),
        normal_tensor(shape, 2, device).mul_scalar(0.5),
        normal_tensor(shape, 3, device),
    )
}

/// Decays from 0.5 to 1 drawn per position and head: over 300 positions their products reach
/// 1e-40 and below, which a product of factors in f32 would flush to 0 and a ratio of
/// cumulative products would turn into 0/0.
#[test]
fn long_products_of_decays_equal_the_recurrence() {
    let device = Device::flex();
    let (b, h, n, d) = (2, 2, 300, 4);
    let log_decay = normal_tensor([b, h, n, 1], 4, &device)
        .abs()
        .mul_scalar(-0.35)
        .clamp_min(-std::f32::consts::LN_2);
    // 6e-6 seen (9e-5 with the spans taken as differences of cumulative sums).
    check_against_recurrence(qkv([b, h, n, d], &device), log_decay, 3e-5);
}

/// Runs of 37 steep decays (e^{-5} to e^{-80} a step, as Mamba-2's step sizes near 1 give)
/// between runs of 37 that barely decay (e^{-0.02} or weaker), across chunk boundaries, over
/// 1,000 positions. The cumulative log-decay reaches about −20,000, where an f32 holds it to
/// about 1e-3: a decay over a weak run, taken as a difference of two such sums, would be off
/// by as much (errors of 3% to 7% were seen that way, 1.3e-5 summed from its own span).
#[test]
fn weak_decays_after_steep_ones_keep_their_precision() {
    let device = Device::flex();
    let (b, h, n, d) = (1, 2, 1000, 4);
    let steep: Vec<bool> = (0..b * h * n).map(|i| (i % n) / 37 % 2 == 1).collect();
    let steep = Tensor::<1, Bool>::from_data(TensorData::new(steep, [b * h * n]), &device)
        .reshape([b, h, n, 1]);
    let z = normal_tensor([b, h, n, 1], 4, &device).abs();
    let weak = z.clone().mul_scalar(-0.01).clamp_min(-0.02);
    let log_decay = weak.mask_where(steep, z.mul_scalar(-25.0).clamp_min(-75.0).sub_scalar(5.0));
    check_against_recurrence(qkv([b, h, n, d], &device), log_decay, 5e-5);
}

/// A gate per key channel (GLA's): each row of the state decays at its own rate, from
/// e^{-0.001} to e^{-3} a step, drawn per position and channel; runs where one channel is steep
/// and the next barely decays. Chunks of 1 to 512, the token-by-token step.
#[test]
fn gates_per_key_channel_equal_the_recurrence() {
    let device = Device::flex();
    let (b, h, n, d) = (2, 2, 300, 4);
    let z = normal_tensor([b, h, n, d], 5, &device).abs();
    let steep: Vec<bool> = (0..b * h * n * d)
        .map(|i| (i / d / 23 + i % d) % 2 == 1)
        .collect();
    let steep = Tensor::<1, Bool>::from_data(TensorData::new(steep, [b * h * n * d]), &device)
        .reshape([b, h, n, d]);
    let log_decay = z
        .clone()
        .mul_scalar(-0.001)
        .mask_where(steep, z.mul_scalar(-1.5).clamp(-3.0, -0.1));
    check_against_recurrence(qkv([b, h, n, d], &device), log_decay, 3e-5);
}

/// The non-causal form: every pair once, as the recurrence run forwards plus the same
/// recurrence run over the reversed sequence, less the diagonal both count (per channel where
/// the gates are).
#[test]
fn the_non_causal_form_is_both_directions() {
    let device = Device::flex();
    let (b, h, n, d) = (1, 2, 150, 4);
    for w in [1, d] {
        let log_decay = normal_tensor([b, h, n, w], 6, &device)
            .abs()
            .mul_scalar(-0.2);
        let (q, k, v) = qkv([b, h, n, d], &device);
        let flat = |x: &Tensor<4>, w: usize| to_rows(&x.clone().reshape([b * h * n, w]));
        let flip = |x: &Tensor<4>| x.clone().flip([2]);
        let (forward, _) = recurrence_f64(
            &flat(&q, d),
            &flat(&k, d),
            &flat(&v, d),
            &flat(&log_decay, w),
            n,
        );
        // The same recurrence over the reversed sequence: position j > i reaches i through the
        // decays of i..j−1, each position's own gate decaying what comes from after it.
        let (backward, _) = recurrence_f64(
            &flat(&flip(&q), d),
            &flat(&flip(&k), d),
            &flat(&flip(&v), d),
            &flat(&flip(&log_decay), w),
            n,
        );
        let (qr, kr, vr) = (flat(&q, d), flat(&k, d), flat(&v, d));
        let expected: Vec<Vec<f64>> = (0..b * h * n)
            .map(|row| {
                let (seq, i) = (row / n, row % n);
                let back = &backward[seq * n + (n - 1 - i)];
                let own: f64 = (0..d).map(|a| qr[row][a] * kr[row][a]).sum();
                (0..d)
                    .map(|c| forward[row][c] + back[c] - own * vr[row][c])
                    .collect()
            })
            .collect();
        for chunk in [7, 64] {
            let out =
                decayed_bidirectional(q.clone(), k.clone(), v.clone(), log_decay.clone(), chunk);
            let err = max_rel_err(&flat(&out, d), &expected, 1e-1);
            assert!(err < 3e-5, "width {w}, chunk {chunk}: off by {err}");
        }
    }
}
