//! Linear attention written with the delta rule: the state is corrected toward each value rather
//! than summed into (`deltanet`, and `gated-deltanet` with a decay per position).
//!
//! With queries `q_t`, keys `k_t` (unit length in the variants), values `v_t`, writing strengths
//! `β_t ∈ (0, 1)` and log-decays `g_t ≤ 0` (0 without gating), the state `S_t` (`[d_k, d_v]`)
//! follows `S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ`, `α_t = exp(g_t)`, and
//! `o_t = S_tᵀ q_t`: the value stored under `k_t` moves a fraction `β_t` toward `v_t`. Equivalently
//! `S_t = α_t S_{t−1} + k_t u_tᵀ` with the pseudo-value `u_t = β_t (v_t − α_t S_{t−1}ᵀ k_t)`. A
//! padded position neither decays nor writes: its key, `β` and `g` are 0.
//!
//! **Chunked causal form** (Yang et al. 2024, arXiv 2406.06484, §3, with the decays of Yang,
//! Kautz & Hatamizadeh 2025, arXiv 2412.06464, §3.3). Within a chunk of `c` positions starting
//! from the state `S₀`, with `G` the cumulative log-decay from the chunk's start,
//! `S_t = e^{G_t} S₀ + Σ_{j ≤ t} e^{G_t − G_j} k_j u_jᵀ`, so the pseudo-values solve the unit
//! lower-triangular system `(I + A) u = diag(β) (V − diag(e^G) K S₀)`, `A_tj = β_t e^{G_t − G_j}
//! (k_t·k_j)` for `j < t`: `u = U − W S₀` with `[U, W] = (I + A)⁻¹ diag(β) [V, diag(e^G) K]` (the
//! WY form), with `(I + A)⁻¹` inverted by blocks for all chunks at once (`log₂ c` rounds of
//! matrix products; exact algebra, where the power series of `(I + A)⁻¹` has terms that grow
//! combinatorially when keys repeat).
//! Then `O = diag(e^G) Q S₀ + (Q Kᵀ ⊙ Γ ⊙ M) u` with `Γ_tj = e^{G_t − G_j}` and `M` the causal
//! mask, and the state after the chunk `e^{G_c} S₀ + Σ_j e^{G_c − G_j} k_j u_jᵀ`. The
//! transition between chunks, `S ↦ (e^{G_c} I − Kᵀ diag(e^{G_c − G}) W) S + …`, is a `d_k × d_k`
//! matrix that depends on the chunk; where the paper's kernels loop over the chunks, the maps
//! are composed here by a parallel scan (`engines/scan.rs`: a loop's slices would make the
//! backward quadratic in `n` under autodiff), and everything within a chunk is batched over all
//! chunks at once. Every decay is a
//! span summed over its own terms, as in [`crate::engines::decay`].
//!
//! **Recurrent form.** [`delta_step`], O(d_k d_v) a token.
//!
//! **On `flex`** (`f32`, from a zero state) the causal and non-causal forms run the recurrence
//! token by token in a fused kernel with its own backward (`kernels/recurrence.rs`), as the
//! decaying core does; every other backend runs the chunked WY form.
//!
//! **Non-causal form.** [`delta_bidirectional`]: the forward recurrence's output plus that of
//! the recurrence run from the end, read before the position's own write (the state after
//! `i + 1` decayed by `α_i`), so that every position is written into the output once, by the
//! forward scan.

use burn::prelude::*;

use crate::contract::input::causal_mask;
use crate::engines::decay::{into_chunks, segment_sums};
use crate::engines::scan::{ChunkMaps, states_before};
use crate::kernels::{self, RecurrenceForm};

/// Chunk length of the causal form: the inversion within chunks takes `log₂ c` rounds (all
/// chunks at once), the scan over chunks `2 log₂(n / c)` levels.
pub const DELTA_CHUNK: usize = 32;

/// The causal form in chunks of `chunk` positions (see the module docs): the outputs and the
/// state after the last position. The result does not depend on `chunk` beyond round-off.
///
/// # Shapes
/// - `q`, `k`: `[batch, heads, n, d_k]`; `v`: `[batch, heads, n, d_v]`
/// - `beta`, `log_decay`: `[batch, heads, n, 1]` (`log_decay` `None`: no decay)
/// - `state`: `[batch, heads, d_k, d_v]`, the state before the first position (`None`: zeros)
/// - outputs `[batch, heads, n, d_v]`; state `[batch, heads, d_k, d_v]`
///
/// On `flex` (`f32`), from a zero state, the recurrence runs token by token instead, in a fused
/// kernel with its own backward (`kernels/recurrence.rs`; `chunk` unused): the same values
/// to round-off.
///
/// # Panics
/// If `chunk` is 0.
pub fn delta_causal(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    (beta, log_decay): (Tensor<4>, Option<Tensor<4>>),
    state: Option<Tensor<4>>,
    chunk: usize,
) -> (Tensor<4>, Tensor<4>) {
    assert!(chunk > 0, "the chunk length must be at least 1");
    if state.is_none() {
        let [batch, heads, n, _] = q.dims();
        let g = match &log_decay {
            Some(g) => g.clone(),
            None => Tensor::zeros([batch, heads, n, 1], &q.device()),
        };
        if let Some((out, Some(state))) =
            kernels::try_delta_recurrence(&q, &k, &v, &beta, &g, RecurrenceForm::CAUSAL)
        {
            return (out, state);
        }
    }
    delta_chunked(q, k, v, (beta, log_decay), state, chunk)
}

/// [`delta_causal`] composed from Burn's operations, in chunks, on every backend.
pub(crate) fn delta_chunked(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    (beta, log_decay): (Tensor<4>, Option<Tensor<4>>),
    state: Option<Tensor<4>>,
    chunk: usize,
) -> (Tensor<4>, Tensor<4>) {
    assert!(chunk > 0, "the chunk length must be at least 1");
    let [batch, heads, n, d_k] = q.dims();
    let d_v = v.dims()[3];
    let device = q.device();
    let c = chunk.min(n);
    let chunks = n.div_ceil(c);
    let log_decay = log_decay.unwrap_or_else(|| Tensor::zeros([batch, heads, n, 1], &device));
    let split = |x: Tensor<4>| into_chunks(x, c, chunks);
    let (q, k, v, beta, g) = (split(q), split(k), split(v), split(beta), split(log_decay));
    let within = g.clone().cumsum(3); // G, [b, h, chunks, c, 1]
    // Γ_tj = e^{G_t − G_j} for j <= t (1 above the diagonal, zeroed where used).
    let gamma = segment_sums(g.reshape([batch, heads, chunks, c, 1, 1]))
        .exp()
        .reshape([batch, heads, chunks, c, c]);
    let strictly_lower = causal_mask(c, &device).transpose().reshape([1, 1, 1, c, c]);
    let future = causal_mask(c, &device).reshape([1, 1, 1, c, c]);
    let a = (k.clone().matmul(k.clone().swap_dims(3, 4)) * gamma.clone() * beta.clone())
        .mask_fill(strictly_lower.bool_not(), 0.0);
    let rhs = Tensor::cat(vec![v, k.clone() * within.clone().exp()], 4) * beta;
    let width = rhs.dims()[4];
    let inverse = unit_lower_inverse(a.reshape([batch * heads * chunks, c, c]));
    let solved = inverse
        .matmul(rhs.reshape([batch * heads * chunks, c, width]))
        .reshape([batch, heads, chunks, c, width]);
    let u_all = solved.clone().slice(s![.., .., .., .., 0..d_v]);
    let w_all = solved.slice(s![.., .., .., .., d_v..d_v + d_k]);
    let scores =
        (q.clone().matmul(k.clone().swap_dims(3, 4)) * gamma.clone()).mask_fill(future, 0.0);
    let q_decayed = q * within.clone().exp();
    // Per chunk: decays from each position to the chunk's end, and the chunk's whole decay.
    let to_end = gamma
        .slice(s![.., .., .., c - 1..c])
        .reshape([batch, heads, chunks, c, 1]);
    let k_to_end = k * to_end;
    let total = within.slice(s![.., .., .., c - 1..c]).exp(); // [b, h, chunks, 1, 1]

    // Between chunks: `S ↦ (e^{G_c} I − Kᵀ diag(e^{G_c − G}) W) S + Kᵀ diag(e^{G_c − G}) U`,
    // each chunk's map, composed by a scan for the state before every chunk.
    let m = batch * heads;
    let transitions = Tensor::<2>::eye(d_k, &device).reshape([1, 1, 1, d_k, d_k]) * total
        - k_to_end.clone().swap_dims(3, 4).matmul(w_all.clone());
    let writes = k_to_end.swap_dims(3, 4).matmul(u_all.clone());
    let initial = state.unwrap_or_else(|| Tensor::zeros([batch, heads, d_k, d_v], &device));
    let (before, s) = states_before(
        ChunkMaps::Matrices(transitions.reshape([m, chunks, d_k, d_k])),
        writes.reshape([m, chunks, d_k, d_v]),
        initial.reshape([m, d_k, d_v]),
    );
    let (before, s) = (
        before.reshape([batch, heads, chunks, d_k, d_v]),
        s.reshape([batch, heads, d_k, d_v]),
    );
    // Every chunk at once: its pseudo-values from the state before it, then its outputs.
    let u = u_all - w_all.matmul(before.clone());
    let out =
        (q_decayed.matmul(before) + scores.matmul(u)).reshape([batch, heads, chunks * c, d_v]);
    let out = if chunks * c == n {
        out
    } else {
        out.slice(s![.., .., 0..n])
    };
    (out, s)
}

/// `(I + A)⁻¹` for `A: [m, c, c]` strictly lower triangular (one per chunk, batch and head),
/// by blocks: the inverses of the diagonal blocks of size `s` give those of size `2s`,
/// `[[P, 0], [C, Q]]⁻¹ = [[P⁻¹, 0], [−Q⁻¹ C P⁻¹, Q⁻¹]]`, from `1 × 1` blocks (whose inverse is 1)
/// to the whole (`c` padded to a power of two with the identity): `log₂ c` rounds of batched
/// matrix products, where substitution row by row takes `c` dependent steps. Exact algebra, no
/// power series (whose terms grow combinatorially when keys repeat).
fn unit_lower_inverse(a: Tensor<3>) -> Tensor<3> {
    let [m, c, _] = a.dims();
    let device = a.device();
    let p = c.next_power_of_two();
    let a = if p == c {
        a
    } else {
        let a = Tensor::cat(vec![a, Tensor::zeros([m, p - c, c], &device)], 1);
        Tensor::cat(vec![a, Tensor::zeros([m, p, p - c], &device)], 2)
    };
    let mut inverse = Tensor::<4>::ones([m, p, 1, 1], &device); // blocks of 1
    let mut size = 1;
    while size < p {
        let blocks = p / (2 * size);
        // The lower-left block of each diagonal block of 2·size: its second half's rows, the
        // columns of its first half (the block's own columns picked by an identity mask).
        let rows = a
            .clone()
            .reshape([m, blocks, 2, size, p])
            .slice(s![.., .., 1..2])
            .reshape([m, blocks, size, blocks, 2 * size]);
        let own = Tensor::<2>::eye(blocks, &device).reshape([1, blocks, 1, blocks, 1]);
        let lower = (rows * own)
            .sum_dim(3)
            .reshape([m, blocks, size, 2 * size])
            .slice(s![.., .., .., 0..size]);
        let pairs = inverse.reshape([m, blocks, 2, size, size]);
        let first = pairs
            .clone()
            .slice(s![.., .., 0..1])
            .reshape([m, blocks, size, size]);
        let second = pairs
            .slice(s![.., .., 1..2])
            .reshape([m, blocks, size, size]);
        let corner = second.clone().matmul(lower).matmul(first.clone()).neg();
        let zeros = Tensor::zeros([m, blocks, size, size], &device);
        inverse = Tensor::cat(
            vec![
                Tensor::cat(vec![first, zeros], 3),
                Tensor::cat(vec![corner, second], 3),
            ],
            2,
        );
        size *= 2;
    }
    inverse.reshape([m, p, p]).slice(s![.., 0..c, 0..c])
}

/// The non-causal form (see the module docs): the forward recurrence's outputs plus those of
/// the recurrence over the reversed sequence read before each position's own write, decayed by
/// the position's own decay: `S^←_{i+1}` seen from `i` as `α_i S^←_{i+1}ᵀ q_i`.
///
/// # Shapes
/// As [`delta_causal`]'s inputs; output `[batch, heads, n, d_v]`.
pub fn delta_bidirectional(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    (beta, log_decay): (Tensor<4>, Option<Tensor<4>>),
    chunk: usize,
) -> Tensor<4> {
    let [batch, heads, n, _] = q.dims();
    let device = q.device();
    let g = match &log_decay {
        Some(g) => g.clone(),
        None => Tensor::zeros([batch, heads, n, 1], &device),
    };
    let Some((forward, _)) =
        kernels::try_delta_recurrence(&q, &k, &v, &beta, &g, RecurrenceForm::FORWARD)
    else {
        return delta_bidirectional_chunked(q, k, v, (beta, log_decay), chunk);
    };
    if n == 1 {
        return forward;
    }
    // On `flex`, the recurrence run from the end in place: position `i` reads the state after
    // `i + 1`, the output at `i + 1` of the query of `i` (queries one step later, outputs one
    // step earlier; the first query unused, the last position reading nothing).
    let q_late = shifted(q * g.clone().exp(), Shift::Later);
    let (backward, _) =
        kernels::try_delta_recurrence(&q_late, &k, &v, &beta, &g, RecurrenceForm::BACKWARD)
            .expect("the kernel that ran forwards runs backwards");
    forward + shifted(backward, Shift::Earlier)
}

/// [`delta_bidirectional`] composed from Burn's operations: the chunked form over the sequence
/// and over its reverse.
pub(crate) fn delta_bidirectional_chunked(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    (beta, log_decay): (Tensor<4>, Option<Tensor<4>>),
    chunk: usize,
) -> Tensor<4> {
    let n = q.dims()[2];
    let (forward, _) = delta_chunked(
        q.clone(),
        k.clone(),
        v.clone(),
        (beta.clone(), log_decay.clone()),
        None,
        chunk,
    );
    if n == 1 {
        return forward;
    }
    let q_own = match &log_decay {
        Some(g) => q * g.clone().exp(),
        None => q,
    };
    // Reversed, position r reads the state after r − 1, i.e. the output at r − 1 of the query
    // of r: queries moved one step earlier (the last one unused), outputs one step later.
    let flip = |x: Tensor<4>| x.flip([2]);
    let q_early = shifted(flip(q_own), Shift::Earlier);
    let (backward, _) = delta_chunked(
        q_early,
        flip(k),
        flip(v),
        (flip(beta), log_decay.map(flip)),
        None,
        chunk,
    );
    // Reversed position r's output sits at r − 1; the first reversed position (the sequence's
    // last) reads nothing from after it.
    forward + flip(shifted(backward, Shift::Later))
}

/// Which way [`shifted`] moves the positions.
#[derive(Debug, Clone, Copy)]
enum Shift {
    /// Position `t` to `t + 1`.
    Later,
    /// Position `t` to `t − 1`.
    Earlier,
}

/// `x: [batch, heads, n, w]` (`n ≥ 2`) moved one position along the positions, a zero row
/// where the move leaves one empty, the row it pushes out dropped.
fn shifted(x: Tensor<4>, shift: Shift) -> Tensor<4> {
    let [batch, heads, n, w] = x.dims();
    let zeros = Tensor::zeros([batch, heads, 1, w], &x.device());
    match shift {
        Shift::Later => Tensor::cat(vec![zeros, x.slice(s![.., .., 0..n - 1])], 2),
        Shift::Earlier => Tensor::cat(vec![x.slice(s![.., .., 1..n]), zeros], 2),
    }
}

/// One step of the recurrence (`state` `None`: no token yet): `S' = α S`, `u = β (v − S'ᵀ k)`,
/// `S ← S' + k uᵀ`, output `Sᵀ q`. Returns the output and the new state.
///
/// # Shapes
/// - `q`, `k`: `[batch, heads, 1, d_k]`; `v`: `[batch, heads, 1, d_v]`; `beta`, `log_decay`:
///   `[batch, heads, 1, 1]`; state `[batch, heads, d_k, d_v]`
/// - output `[batch, heads, 1, d_v]`
pub fn delta_step(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    (beta, log_decay): (Tensor<4>, Option<Tensor<4>>),
    state: Option<Tensor<4>>,
) -> (Tensor<4>, Tensor<4>) {
    let [batch, heads, _, d_k] = k.dims();
    let d_v = v.dims()[3];
    let state = state.unwrap_or_else(|| Tensor::zeros([batch, heads, d_k, d_v], &k.device()));
    let state = match log_decay {
        Some(g) => state * g.exp(),
        None => state,
    };
    let u = (v - k.clone().matmul(state.clone())) * beta;
    let state = state + k.swap_dims(2, 3).matmul(u);
    (q.matmul(state.clone()), state)
}

/// `x` scaled to unit length along its last axis (the variants' keys and queries; `1e-6` keeps a
/// zero row at zero).
pub fn unit_length(x: Tensor<4>) -> Tensor<4> {
    let norm = x.clone().powi_scalar(2).sum_dim(3).sqrt().clamp_min(1e-6);
    x / norm
}

#[cfg(test)]
mod tests {
    use burn::prelude::*;
    use burn::tensor::Distribution;

    use crate::engines::decay::tests::{assert_close, padding};

    /// The fused delta rule (flex, and with `wgpu` the CubeCL scans) against the chunked WY form
    /// composed of Burn's operations:
    /// outputs, final state and the gradients of queries, keys, values, writing strengths and
    /// log-decays, relative 1e-4, on a padded batch masked as the variants mask it. Unit-length
    /// keys, strengths in (0, 1), without decay (DeltaNet) and with decays down to `e^{-4}` a step
    /// (Gated DeltaNet), 150 positions; causal and not (both directions).
    #[test]
    fn fused_delta_rule_equals_chunked_form() {
        #[allow(unused_mut)] // pushed to only with wgpu compiled in
        let mut devices = vec![Device::flex().autodiff()];
        #[cfg(feature = "wgpu")]
        devices.push(Device::wgpu(DeviceKind::DefaultDevice).autodiff());
        for device in devices {
            fused_delta_rule_case(&device);
        }
    }

    fn fused_delta_rule_case(device: &Device) {
        let device = device.clone();
        device.seed(12);
        let (n, d_k, d_v) = (150, 16, 16);
        let mask = padding(n, &device).reshape([2, 1, n, 1]);
        let cases = [(false, true), (true, true), (false, false), (true, false)];
        for (gated, causal) in cases {
            let normal = |w: usize, spread: f64| {
                Tensor::<4>::random([2, 2, n, w], Distribution::Normal(0.0, spread), &device)
            };
            let (q, k, v) = (normal(d_k, 1.0), normal(d_k, 1.0), normal(d_v, 3.0));
            let beta =
                Tensor::<4>::random([2, 2, n, 1], Distribution::Uniform(0.05, 0.95), &device);
            let g = Tensor::<4>::random([2, 2, n, 1], Distribution::Uniform(-4.0, 0.0), &device);
            let c_out = normal(d_v, 1.0);
            let c_state =
                Tensor::<4>::random([2, 2, d_k, d_v], Distribution::Normal(0.0, 1.0), &device);
            let run = |fused: bool| {
                let leaves = [q.clone(), k.clone(), v.clone(), beta.clone(), g.clone()]
                    .map(|t| t.require_grad());
                let [q, k, v, beta, g] = leaves.clone();
                let k = super::unit_length(k).mask_fill(mask.clone(), 0.0);
                let beta = beta.mask_fill(mask.clone(), 0.0);
                let g = gated.then(|| g.mask_fill(mask.clone(), 0.0));
                let chunk = super::DELTA_CHUNK;
                let gates = (beta, g);
                let (out, state) = match (causal, fused) {
                    (true, true) => super::delta_causal(q, k, v, gates, None, chunk),
                    (true, false) => super::delta_chunked(q, k, v, gates, None, chunk),
                    // Without a state: the loss reads a zero one.
                    (false, true) => (
                        super::delta_bidirectional(q, k, v, gates, chunk),
                        c_state.zeros_like(),
                    ),
                    (false, false) => (
                        super::delta_bidirectional_chunked(q, k, v, gates, chunk),
                        c_state.zeros_like(),
                    ),
                };
                let loss =
                    (out.clone() * c_out.clone()).sum() + (state.clone() * c_state.clone()).sum();
                let grads = loss.backward();
                let mut found = vec![out.inner(), state.inner()];
                let tracked = if gated { 5 } else { 4 };
                found.extend(leaves[..tracked].iter().map(|t| t.grad(&grads).unwrap()));
                found
            };
            let (fused, chunked) = (run(true), run(false));
            for (what, (a, b)) in ["output", "state", "dq", "dk", "dv", "dbeta", "dg"]
                .iter()
                .zip(fused.into_iter().zip(chunked))
            {
                assert_close(
                    a,
                    b,
                    1e-4,
                    &format!("{device:?} gated {gated}, causal {causal}, {what}"),
                );
            }
        }
    }
}
