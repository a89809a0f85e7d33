//! Linear attention with a decaying state: the form the retention-style variants share
//! (`retnet`'s fixed decays, `mamba2`'s data-dependent scalar ones, `gla`'s gates per key
//! channel).
//!
//! With queries `q_i`, keys `k_j`, values `v_j` and a log-decay `g_t ≤ 0` per position,
//! `o_i = Σ_{j ≤ i} exp(G_i − G_j) (q_i·k_j) v_j`, `G_i = Σ_{t ≤ i} g_t`: the output of the
//! recurrence `S_t = exp(g_t) S_{t−1} + k_t v_tᵀ`, `o_t = S_tᵀ q_t`. A padded position neither
//! decays nor writes the state: its `g` is 0 and its key zero ([`without_padding`]). With a
//! gate per key channel (`g_t ∈ R^{d_k}`, GLA's), `S_t = Diag(exp(g_t)) S_{t−1} + k_t v_tᵀ` and
//! `o_i = Σ_{j ≤ i} Σ_a q_ia k_ja exp(G_ia − G_ja) v_j`: everything below holds channel by
//! channel.
//!
//! **Chunked causal form.** The sequence is cut into chunks of `c` positions. Within a chunk the
//! `c × c` weights `(q_i·k_j) exp(G_i − G_j)` (for `j ≤ i`) are formed directly; each chunk's
//! contribution to the state, `U = Σ_j exp(G_last − G_j) k_j v_jᵀ`, is a `[d_k, d_v]` matrix,
//! and the state before chunk `c` is `Σ_{c' < c} exp(C_{c−1} − C_{c'}) U_{c'}`, with `C` the
//! cumulative log-decay at the chunks' ends: one product with a `chunks × chunks` matrix of
//! decays, no sequential loop (with gates per key channel that matrix would hold `(n / c)² d_k`
//! decays, and the chunks' maps are composed by a parallel scan instead, `engines/scan.rs`).
//! Every decay is taken as `exp` of a sum of log-decays that is at most 0, each sum accumulated
//! from the terms of its own span: never as a product of factors (hundreds of factors below one
//! underflow in `f32`), nor as `exp(G_i) / exp(G_j)`
//! (whose parts overflow), nor as `exp(G_i − G_j)` (the difference of two long cumulative
//! sums loses the short span between them: after a thousand steps of decay `e^{-10}`, `G` is
//! held to about `1e-3`, the error of a span of a few weak decays). Memory:
//! O(n (d_k + d_v) + n c) for the chunks (`n c d_k` with gates per channel), O((n / c) d_k d_v)
//! for their states and O((n / c)²) for the decays between them (with gates per channel, the
//! scan's O((n / c) d_k d_v) instead); no per-position `d_k × d_v` state is kept.
//!
//! **Recurrent form.** [`decayed_step`] carries `S` token by token in O(d_k d_v) a step,
//! whatever the position.
//!
//! **On `flex`** (`f32`) the causal and non-causal forms run the recurrence itself, token by
//! token, in a fused kernel with its own backward (`kernels/recurrence.rs`): with the head
//! sizes the presets train, `2 d_k d_v` multiply-adds a token forward beat the chunked form's
//! `c × c` weights and its dozens of tensor operations, each a pass over memory under autodiff.
//! The two forms agree to round-off (checked on padded batches, gradients included); every other
//! backend runs the chunked form below.
//!
//! **Non-causal form.** [`decayed_bidirectional`] sums both directions: the causal form
//! forwards, the same recurrence over the reversed sequence, less the diagonal both count.

use burn::prelude::*;

use crate::contract::DecodingState;
use crate::contract::error::AttentionError;
use crate::contract::input::causal_mask;
use crate::engines::scan::{ChunkMaps, states_before};
use crate::kernels::{self, RecurrenceForm};

/// Chunk length of the causal form: large enough that the intra-chunk products are efficient
/// matrix products, small enough that the `c × c` weights stay below the values in memory.
pub const DECAY_CHUNK: usize = 64;

/// Chunk length of the causal form with a decay per key channel (gates): its weights within a
/// chunk take `c × c × d_k` per chunk, which 16 keeps at `16 d_k` a position.
pub const GATE_CHUNK: usize = 16;

/// Keys zeroed and log-decays set to 0 at the padded positions of `mask_pad: [batch, n]`
/// (`true` = padding): a padded position neither writes nor decays the state.
///
/// # Shapes
/// - `k`: `[batch, heads, n, d_k]`; `log_decay`: `[batch, heads, n, 1]`
pub fn without_padding(
    k: Tensor<4>,
    log_decay: Tensor<4>,
    mask_pad: &Option<Tensor<2, Bool>>,
) -> (Tensor<4>, Tensor<4>) {
    match mask_pad {
        Some(mask) => {
            let [batch, n] = mask.dims();
            let mask = mask.clone().reshape([batch, 1, n, 1]);
            (
                k.mask_fill(mask.clone(), 0.0),
                log_decay.mask_fill(mask, 0.0),
            )
        }
        None => (k, log_decay),
    }
}

/// The causal form in chunks of `chunk` positions (see the module docs): the outputs and the
/// state after the last position. The result does not depend on `chunk` beyond round-off.
///
/// `log_decay` holds one log-decay per position (width 1: the state decays as a whole) or one
/// per key channel (width `d_k`: a gate per row of the state, `S_t = Diag(exp(g_t)) S_{t−1} +
/// k_t v_tᵀ`). Per channel, the weights within a chunk need a `c × c × d_k` tensor per chunk
/// (`n c d_k` in all): such callers take shorter chunks ([`GATE_CHUNK`]).
///
/// # Shapes
/// - `q`, `k`: `[batch, heads, n, d_k]`; `v`: `[batch, heads, n, d_v]`
/// - `log_decay`: `[batch, heads, n, 1]` or `[batch, heads, n, d_k]`, every entry at most 0
/// - outputs `[batch, heads, n, d_v]`; state `[batch, heads, d_k, d_v]`
///
/// On `flex` (`f32`) the recurrence runs token by token instead, in a fused kernel with its own
/// backward (`kernels/recurrence.rs`; `chunk` unused): the same values to round-off.
///
/// # Panics
/// If `chunk` is 0, or `log_decay`'s width is neither 1 nor `d_k`.
pub fn decayed_causal(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    log_decay: Tensor<4>,
    chunk: usize,
) -> (Tensor<4>, Tensor<4>) {
    check_chunk_and_width(chunk, &q, &log_decay);
    match kernels::try_decayed_recurrence(&q, &k, &v, &log_decay, RecurrenceForm::CAUSAL) {
        Some((out, Some(state))) => (out, state),
        _ => decayed_chunked(q, k, v, log_decay, chunk),
    }
}

/// [`decayed_causal`] composed from Burn's operations, in chunks, on every backend.
pub(crate) fn decayed_chunked(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    log_decay: Tensor<4>,
    chunk: usize,
) -> (Tensor<4>, Tensor<4>) {
    check_chunk_and_width(chunk, &q, &log_decay);
    let [batch, heads, n, d_k] = q.dims();
    let d_v = v.dims()[3];
    let width = log_decay.dims()[3];
    let device = q.device();
    let c = chunk.min(n);
    let chunks = n.div_ceil(c);
    // Positions added at the end make the length a multiple of the chunk: a zero key writes
    // nothing and a zero log-decay decays nothing; their outputs are cut off below.
    let (q, k, v) = (
        into_chunks(q, c, chunks),
        into_chunks(k, c, chunks),
        into_chunks(v, c, chunks),
    );
    let g = into_chunks(log_decay, c, chunks); // [b, h, chunks, c, w]
    let within = g.clone().cumsum(3); // G from each chunk's start, [b, h, chunks, c, w]
    // exp(G_i − G_j) within each chunk, [b, h, chunks, c (i), c (j), w]; 1 above the diagonal,
    // where the weights are zeroed.
    let decays = segment_sums(g.reshape([batch, heads, chunks, c, 1, width])).exp();

    // Within each chunk: Σ_a q_ia k_ja exp(G_ia − G_ja) for j <= i; with one decay per
    // position, (q_i·k_j) exp(G_i − G_j), a matrix product.
    let future = causal_mask(c, &device).reshape([1, 1, 1, c, c]);
    let scores = if width == 1 {
        q.clone().matmul(k.clone().swap_dims(3, 4))
            * decays.clone().reshape([batch, heads, chunks, c, c])
    } else {
        let pairs = q.clone().reshape([batch, heads, chunks, c, 1, d_k])
            * k.clone().reshape([batch, heads, chunks, 1, c, d_k])
            * decays.clone();
        pairs.sum_dim(5).reshape([batch, heads, chunks, c, c])
    };
    let intra = scores.mask_fill(future, 0.0).matmul(v.clone()); // [b, h, chunks, c, d_v]

    // Each chunk's write to the state, decayed to the chunk's end: U = Σ_j exp(G_last − G_j) k_j
    // v_jᵀ, the decays' last row.
    let to_end = decays
        .slice(s![.., .., .., c - 1..c])
        .reshape([batch, heads, chunks, c, width]);
    let writes = (k * to_end).swap_dims(3, 4).matmul(v); // [b, h, chunks, d_k, d_v]
    let totals = within
        .clone()
        .slice(s![.., .., .., c - 1..c])
        .reshape([batch, heads, chunks, width]);
    let (before, state) = states_between_chunks(totals, writes);
    let inter = (q * within.exp()).matmul(before);
    let out = (intra + inter).reshape([batch, heads, chunks * c, d_v]);
    let out = if chunks * c == n {
        out
    } else {
        out.slice(s![.., .., 0..n])
    };
    (out, state)
}

/// Panics unless `chunk` is at least 1 and `log_decay` has one entry a position or one a key
/// channel of `q`.
fn check_chunk_and_width(chunk: usize, q: &Tensor<4>, log_decay: &Tensor<4>) {
    assert!(chunk > 0, "the chunk length must be at least 1");
    let (d_k, width) = (q.dims()[3], log_decay.dims()[3]);
    assert!(
        width == 1 || width == d_k,
        "one log-decay per position or per key channel ({d_k}), got {width}"
    );
}

/// `x: [batch, heads, n, w]` as `[batch, heads, chunks, c, w]`, zeros appended to fill the last
/// chunk (a zero key, log-decay or writing strength neither writes nor decays).
pub(crate) fn into_chunks(x: Tensor<4>, c: usize, chunks: usize) -> Tensor<5> {
    let [batch, heads, n, width] = x.dims();
    let fill = chunks * c - n;
    let x = if fill == 0 {
        x
    } else {
        let zeros = Tensor::zeros([batch, heads, fill, width], &x.device());
        Tensor::cat(vec![x, zeros], 2)
    };
    x.reshape([batch, heads, chunks, c, width])
}

/// The state before each chunk (`[batch, heads, chunks, d_k, d_v]`) and after the last
/// (`[batch, heads, d_k, d_v]`), from each chunk's write decayed to its end (`writes`) and each
/// chunk's whole log-decay (`totals: [batch, heads, chunks, w]`, `w` 1 or `d_k`): the state
/// after chunk `c` is `Σ_{c' <= c} exp(C_c − C_{c'}) U_{c'}`, with `C` the cumulative log-decay
/// at the chunks' ends. One decay per position: one product with the `chunks × chunks` matrix of
/// decays, the spans summed between chunks as within them. Per key channel, that matrix would
/// take `(n / c)² d_k` (a gigabyte at 16K positions and 8 heads of 32 key channels in chunks of
/// 16), so the chunks' maps are composed by a scan instead ([`states_before`]), `(n / c) d_k d_v`
/// in all.
fn states_between_chunks(totals: Tensor<4>, writes: Tensor<5>) -> (Tensor<5>, Tensor<4>) {
    let [batch, heads, chunks, width] = totals.dims();
    let [_, _, _, d_k, d_v] = writes.dims();
    let device = totals.device();
    if width > 1 {
        let m = batch * heads;
        let (before, last) = states_before(
            ChunkMaps::LogDecays(totals.reshape([m, chunks, d_k, 1])),
            writes.reshape([m, chunks, d_k, d_v]),
            Tensor::zeros([m, d_k, d_v], &device),
        );
        return (
            before.reshape([batch, heads, chunks, d_k, d_v]),
            last.reshape([batch, heads, d_k, d_v]),
        );
    }
    let later = causal_mask(chunks, &device).reshape([1, 1, chunks, chunks]);
    let decays = segment_sums(totals.reshape([batch, heads, chunks, 1, 1]))
        .reshape([batch, heads, chunks, chunks])
        .exp()
        .mask_fill(later, 0.0);
    let after = decays
        .matmul(writes.reshape([batch, heads, chunks, d_k * d_v]))
        .reshape([batch, heads, chunks, d_k, d_v]);
    let last = after
        .clone()
        .slice(s![.., .., chunks - 1..chunks])
        .reshape([batch, heads, d_k, d_v]);
    // Before each chunk: the state after the chunk before it, none before the first.
    let first = Tensor::zeros([batch, heads, 1, d_k, d_v], &device);
    let before = if chunks == 1 {
        first
    } else {
        Tensor::cat(vec![first, after.slice(s![.., .., 0..chunks - 1])], 2)
    };
    (before, last)
}

/// The log-decays between positions: `Σ_{j < t ≤ i} g_t` at `[i, j]` for `j < i`, 0 for
/// `j ≥ i`, over the positions on the third-to-last axis of `g: [..., m, 1, w]` (each of the
/// `w` channels on its own); `[..., m, m, w]`. Each span is summed from its own terms (a
/// cumulative sum, down the rows, of the terms after `j`), not taken as `G_i − G_j`: that
/// difference of cumulative sums carries the rounding of everything summed before `j`, an
/// error of about `ε |G_i|` in the exponent, which a long stretch of steep decays (|G| in the
/// thousands) makes larger than the decay it measures.
pub(crate) fn segment_sums<const D: usize>(g: Tensor<D>) -> Tensor<D> {
    let mut dims = g.dims();
    let m = dims[D - 3];
    dims[D - 2] = m;
    let mut grid = [1; D];
    grid[D - 3] = m;
    grid[D - 2] = m;
    // Row t, column j: g_t where t > j, else 0.
    let not_after = causal_mask(m, &g.device())
        .transpose()
        .bool_not()
        .reshape(grid);
    g.expand(dims).mask_fill(not_after, 0.0).cumsum(D - 3)
}

/// The non-causal form: the causal form over the sequence and over its reverse, less the
/// diagonal counted by both. Position `i` reads `j < i` through the decays of `j+1..=i`, as the
/// causal form, and `j > i` through those of `i..j−1`: the recurrence run from the end, each
/// position's decay applied to what comes from after it (per key channel where the decays
/// are). With a fixed decay per head, `γ^{|i−j|}` on every pair.
///
/// # Shapes
/// As [`decayed_causal`]'s inputs; output `[batch, heads, n, d_v]`.
pub fn decayed_bidirectional(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    log_decay: Tensor<4>,
    chunk: usize,
) -> Tensor<4> {
    // On `flex`, the recurrence run from each end in place, no reversed copies.
    if let (Some((forward, _)), Some((backward, _))) = (
        kernels::try_decayed_recurrence(&q, &k, &v, &log_decay, RecurrenceForm::FORWARD),
        kernels::try_decayed_recurrence(&q, &k, &v, &log_decay, RecurrenceForm::BACKWARD),
    ) {
        let diagonal = (q * k).sum_dim(3) * v;
        return forward + backward - diagonal;
    }
    bidirectional_chunked(q, k, v, log_decay, chunk)
}

/// [`decayed_bidirectional`] composed from Burn's operations: the chunked form over the
/// sequence and over its reverse.
pub(crate) fn bidirectional_chunked(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    log_decay: Tensor<4>,
    chunk: usize,
) -> Tensor<4> {
    let diagonal = (q.clone() * k.clone()).sum_dim(3) * v.clone();
    let (forward, _) = decayed_chunked(q.clone(), k.clone(), v.clone(), log_decay.clone(), chunk);
    // Reversed, the decay between j and i >= j is that of the positions j+1..=i of the
    // reversed order, i.e. i..j in the original: the same real positions for real i and j.
    let flip = |x: Tensor<4>| x.flip([2]);
    let (backward, _) = decayed_chunked(flip(q), flip(k), flip(v), flip(log_decay), chunk);
    forward + flip(backward) - diagonal
}

/// One step of the recurrence: `S ← exp(g) S + k vᵀ` (per key channel, `Diag(exp(g)) S`, where
/// `g` has one per channel), output `Sᵀ q` (`state` `None`: no token yet). Returns the output
/// and the new state.
///
/// # Shapes
/// - `q`, `k`: `[batch, heads, 1, d_k]`; `v`: `[batch, heads, 1, d_v]`; `log_decay`:
///   `[batch, heads, 1, 1]` or `[batch, heads, 1, d_k]`; state `[batch, heads, d_k, d_v]`
/// - output `[batch, heads, 1, d_v]`
pub fn decayed_step(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    log_decay: Tensor<4>,
    state: Option<Tensor<4>>,
) -> (Tensor<4>, Tensor<4>) {
    let write = k.swap_dims(2, 3).matmul(v);
    let state = match state {
        // [b, h, d_k or 1, 1]: one factor per row of the state, or one for all of it.
        Some(state) => state * log_decay.swap_dims(2, 3).exp() + write,
        None => write,
    };
    (q.matmul(state.clone()), state)
}

/// Real tokens per sequence, `[batch, 1]`, from `mask_pad: [batch, n]` (`true` = padding);
/// without a mask, `n` each.
pub fn real_tokens(
    mask_pad: &Option<Tensor<2, Bool>>,
    batch: usize,
    n: usize,
    device: &Device,
) -> Tensor<2> {
    match mask_pad {
        Some(mask) => mask.clone().bool_not().float().sum_dim(1),
        None => Tensor::full([batch, 1], n as f32, device),
    }
}

/// The decayed state inside a decoding state, and the real tokens it has seen: `None` and 0
/// before the first token; an error naming `variant` if another kind of attention made it.
pub fn decayed_state(
    state: DecodingState,
    variant: &'static str,
    batch: usize,
    device: &Device,
) -> Result<(Option<Tensor<4>>, Tensor<2>), AttentionError> {
    match state {
        DecodingState::Empty => Ok((None, Tensor::zeros([batch, 1], device))),
        DecodingState::Decayed(state) => Ok((Some(state.s), state.seen)),
        _ => Err(AttentionError::unsupported(
            variant,
            "another variant's decoding state (it carries a decayed state)",
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use burn::prelude::*;
    use burn::tensor::Distribution;

    /// `max |a − b| <= tol · max |b|`, naming `what` otherwise.
    pub(crate) fn assert_close(a: Tensor<4>, b: Tensor<4>, tol: f32, what: &str) {
        let scale: f32 = b.clone().abs().max().into_scalar();
        let err: f32 = (a - b).abs().max().into_scalar();
        assert!(
            err <= tol * scale.max(1e-6),
            "{what}: {err} against {scale}"
        );
    }

    /// A padding mask `[2, n]`: the first row padded over its last 40 positions, the second over
    /// its first 7.
    pub(crate) fn padding(n: usize, device: &Device) -> Tensor<2, Bool> {
        let flags: Vec<bool> = (0..2 * n)
            .map(|i| {
                let (row, t) = (i / n, i % n);
                if row == 0 { t + 40 >= n } else { t < 7 }
            })
            .collect();
        Tensor::<1, Bool>::from_data(TensorData::new(flags, [2 * n]), device).reshape([2, n])
    }

    /// The fused recurrence (flex, and with `wgpu` the CubeCL scans on the default wgpu device)
    /// against the chunked form composed of Burn's operations: the
    /// outputs, the final state and the gradients of queries, keys, values and log-decays of a
    /// loss that reads both, relative 1e-4, on a padded batch; the non-causal form (both
    /// directions) likewise. One decay a position (RetNet's
    /// and Mamba-2's) and one per key channel (GLA's, in its chunk), scales a trained model
    /// reaches (queries and keys of spread 2, values of 3, decays from none to `e^{-6}` a step),
    /// 150 positions (across the kernel's checkpoints, not a multiple of the chunk).
    #[test]
    fn fused_recurrence_equals_chunked_form() {
        #[allow(unused_mut)] // pushed to only with wgpu compiled in
        let mut devices = vec![Device::flex().autodiff()];
        #[cfg(feature = "wgpu")]
        devices.push(Device::wgpu(DeviceKind::DefaultDevice).autodiff());
        for device in devices {
            fused_recurrence_case(&device);
        }
    }

    fn fused_recurrence_case(device: &Device) {
        let device = device.clone();
        device.seed(11);
        let (n, d_k, d_v) = (150, 16, 17);
        let mask = Some(padding(n, &device));
        let cases = [(1, super::DECAY_CHUNK), (d_k, super::GATE_CHUNK)];
        for ((width, chunk), causal) in cases.into_iter().flat_map(|c| [(c, true), (c, false)]) {
            let normal = |w: usize, spread: f64| {
                Tensor::<4>::random([2, 2, n, w], Distribution::Normal(0.0, spread), &device)
            };
            let (q, k, v) = (normal(d_k, 2.0), normal(d_k, 2.0), normal(d_v, 3.0));
            let g =
                Tensor::<4>::random([2, 2, n, width], Distribution::Uniform(-6.0, 0.0), &device);
            let c_out = normal(d_v, 1.0);
            let c_state =
                Tensor::<4>::random([2, 2, d_k, d_v], Distribution::Normal(0.0, 1.0), &device);
            let run = |fused: bool| {
                let leaves = [q.clone(), k.clone(), v.clone(), g.clone()].map(|t| t.require_grad());
                let [q, k, v, g] = leaves.clone();
                let (k, g) = super::without_padding(k, g, &mask);
                let (out, state) = match (causal, fused) {
                    (true, true) => super::decayed_causal(q, k, v, g, chunk),
                    (true, false) => super::decayed_chunked(q, k, v, g, chunk),
                    // Without a state: the loss reads a zero one.
                    (false, true) => (
                        super::decayed_bidirectional(q, k, v, g, chunk),
                        c_state.zeros_like(),
                    ),
                    (false, false) => (
                        super::bidirectional_chunked(q, k, v, g, chunk),
                        c_state.zeros_like(),
                    ),
                };
                let loss =
                    (out.clone() * c_out.clone()).sum() + (state.clone() * c_state.clone()).sum();
                let grads = loss.backward();
                let mut found = vec![out.inner(), state.inner()];
                found.extend(leaves.iter().map(|t| t.grad(&grads).unwrap()));
                found
            };
            let (fused, chunked) = (run(true), run(false));
            for (what, (a, b)) in ["output", "state", "dq", "dk", "dv", "dg"]
                .iter()
                .zip(fused.into_iter().zip(chunked))
            {
                assert_close(
                    a,
                    b,
                    1e-4,
                    &format!("{device:?} width {width}, causal {causal}, {what}"),
                );
            }
        }
    }
}
