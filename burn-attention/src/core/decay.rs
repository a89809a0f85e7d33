//! Linear attention with a decaying state: the form the retention-style variants share
//! (`retnet` today; the data-dependent scalar decays of the same family take the same path).
//!
//! With queries `q_i`, keys `k_j`, values `v_j` and a log-decay `g_t ≤ 0` per position,
//! `o_i = Σ_{j ≤ i} exp(G_i − G_j) (q_i·k_j) v_j`, `G_i = Σ_{t ≤ i} g_t`: the output of the
//! recurrence `S_t = exp(g_t) S_{t−1} + k_t v_tᵀ`, `o_t = S_tᵀ q_t`. A padded position neither
//! decays nor writes the state: its `g` is 0 and its key zero ([`without_padding`]).
//!
//! **Chunked causal form.** The sequence is cut into chunks of `c` positions. Within a chunk the
//! `c × c` weights `(q_i·k_j) exp(G_i − G_j)` (for `j ≤ i`) are formed directly; each chunk's
//! contribution to the state, `U = Σ_j exp(G_last − G_j) k_j v_jᵀ`, is a `[d_k, d_v]` matrix,
//! and the state before chunk `c` is `Σ_{c' < c} exp(C_{c−1} − C_{c'}) U_{c'}`, with `C` the
//! cumulative log-decay at the chunks' ends: one product with a `chunks × chunks` matrix of
//! decays, no sequential loop. Every decay is taken as `exp` of a sum of log-decays that is
//! at most 0, each sum accumulated from the terms of its own span: never as a product of
//! factors (hundreds of factors below one underflow in `f32`), nor as `exp(G_i) / exp(G_j)`
//! (whose parts overflow), nor as `exp(G_i − G_j)` (the difference of two long cumulative
//! sums loses the short span between them: after a thousand steps of decay `e^{-10}`, `G` is
//! held to about `1e-3`, the error of a span of a few weak decays). Memory:
//! O(n (d_k + d_v) + n c) for the chunks, O((n / c) d_k d_v) for their states and O((n / c)²) for
//! the decays between them; no per-position `d_k × d_v` state is kept.
//!
//! **Recurrent form.** [`decayed_step`] carries `S` token by token in O(d_k d_v) a step,
//! whatever the position.
//!
//! **Non-causal form.** [`decayed_bidirectional`] sums both directions, `exp(−|G_i − G_j|)` on
//! every pair: the causal form forwards, the same over the reversed sequence, less the diagonal
//! both count.

use burn::prelude::*;

use super::contract::DecodingState;
use super::error::AttentionError;
use super::input::causal_mask;

/// Chunk length of the causal form: large enough that the intra-chunk products are efficient
/// matrix products, small enough that the `c × c` weights stay below the values in memory.
pub const DECAY_CHUNK: usize = 64;

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
/// # Shapes
/// - `q`, `k`: `[batch, heads, n, d_k]`; `v`: `[batch, heads, n, d_v]`
/// - `log_decay`: `[batch, heads, n, 1]`, every entry at most 0
/// - outputs `[batch, heads, n, d_v]`; state `[batch, heads, d_k, d_v]`
///
/// # Panics
/// If `chunk` is 0.
pub fn decayed_causal(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    log_decay: Tensor<4>,
    chunk: usize,
) -> (Tensor<4>, Tensor<4>) {
    assert!(chunk > 0, "the chunk length must be at least 1");
    let [batch, heads, n, d_k] = q.dims();
    let d_v = v.dims()[3];
    let device = q.device();
    let c = chunk.min(n);
    let chunks = n.div_ceil(c);
    // Positions added at the end make the length a multiple of the chunk: a zero key writes
    // nothing and a zero log-decay decays nothing; their outputs are cut off below.
    let fill = chunks * c - n;
    let extend = |x: Tensor<4>| -> Tensor<5> {
        let width = x.dims()[3];
        let x = if fill == 0 {
            x
        } else {
            Tensor::cat(
                vec![x, Tensor::zeros([batch, heads, fill, width], &device)],
                2,
            )
        };
        x.reshape([batch, heads, chunks, c, width])
    };
    let (q, k, v) = (extend(q), extend(k), extend(v));
    let g = extend(log_decay); // [b, h, chunks, c, 1]
    let within = g.clone().cumsum(3); // G from each chunk's start, [b, h, chunks, c, 1]
    let spans = segment_sums(g); // G_i − G_j within each chunk, [b, h, chunks, c, c]

    // Within each chunk: (q_i·k_j) exp(G_i − G_j) for j <= i (the spans above the diagonal are
    // 0; their weights are zeroed after).
    let future = causal_mask(c, &device).reshape([1, 1, 1, c, c]);
    let weights =
        (q.clone().matmul(k.clone().swap_dims(3, 4)) * spans.clone().exp()).mask_fill(future, 0.0);
    let intra = weights.matmul(v.clone()); // [b, h, chunks, c, d_v]

    // Each chunk's write to the state, decayed to the chunk's end: U = Σ_j exp(G_last − G_j) k_j
    // v_jᵀ, the spans' last row.
    let to_end = spans.slice(s![.., .., .., c - 1..c]).exp().swap_dims(3, 4); // [b, h, chunks, c, 1]
    let writes = (k * to_end).swap_dims(3, 4).matmul(v); // [b, h, chunks, d_k, d_v]
    let writes = writes.reshape([batch, heads, chunks, d_k * d_v]);

    // The state after each chunk: Σ_{c' <= c} exp(C_c − C_{c'}) U_{c'}, C the cumulative
    // log-decay at the chunks' ends, the spans taken between chunks as within them.
    let totals = within
        .clone()
        .slice(s![.., .., .., c - 1..c])
        .reshape([batch, heads, chunks, 1]);
    let later = causal_mask(chunks, &device).reshape([1, 1, chunks, chunks]);
    let after = segment_sums(totals)
        .exp()
        .mask_fill(later, 0.0)
        .matmul(writes); // [b, h, chunks, d_k · d_v]
    let state = after
        .clone()
        .slice(s![.., .., chunks - 1..chunks])
        .reshape([batch, heads, d_k, d_v]);
    // The state before each chunk: the one after the chunk before it, none before the first.
    let first = Tensor::zeros([batch, heads, 1, d_k * d_v], &device);
    let before = if chunks == 1 {
        first
    } else {
        Tensor::cat(vec![first, after.slice(s![.., .., 0..chunks - 1])], 2)
    }
    .reshape([batch, heads, chunks, d_k, d_v]);
    let inter = (q * within.exp()).matmul(before);
    let out = (intra + inter).reshape([batch, heads, chunks * c, d_v]);
    let out = if fill == 0 {
        out
    } else {
        out.slice(s![.., .., 0..n])
    };
    (out, state)
}

/// The log-decays between positions: `Σ_{j < t ≤ i} g_t` at `[i, j]` for `j < i`, 0 for
/// `j ≥ i`, over the positions on the second-to-last axis of `g: [..., m, 1]`; `[..., m, m]`.
/// Each span is summed from its own terms (a cumulative sum, down the rows, of the terms after
/// `j`), not taken as `G_i − G_j`: that difference of cumulative sums carries the rounding of
/// everything summed before `j`, an error of about `ε |G_i|` in the exponent, which a long
/// stretch of steep decays (|G| in the thousands) makes larger than the decay it measures.
fn segment_sums<const D: usize>(g: Tensor<D>) -> Tensor<D> {
    let mut dims = g.dims();
    let m = dims[D - 2];
    dims[D - 1] = m;
    let mut grid = [1; D];
    grid[D - 2] = m;
    grid[D - 1] = m;
    // Row t, column j: g_t where t > j, else 0.
    let not_after = causal_mask(m, &g.device())
        .transpose()
        .bool_not()
        .reshape(grid);
    g.expand(dims).mask_fill(not_after, 0.0).cumsum(D - 2)
}

/// The non-causal form: `o_i = Σ_j exp(−|G_i − G_j|) (q_i·k_j) v_j`, the causal form over the
/// sequence and over its reverse, less the diagonal counted by both.
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
    let diagonal = (q.clone() * k.clone()).sum_dim(3) * v.clone();
    let (forward, _) = decayed_causal(q.clone(), k.clone(), v.clone(), log_decay.clone(), chunk);
    // Reversed, the decay between j and i >= j is that of the positions j+1..=i of the
    // reversed order, i.e. i..j in the original: the same real positions for real i and j.
    let flip = |x: Tensor<4>| x.flip([2]);
    let (backward, _) = decayed_causal(flip(q), flip(k), flip(v), flip(log_decay), chunk);
    forward + flip(backward) - diagonal
}

/// One step of the recurrence: `S ← exp(g) S + k vᵀ`, output `Sᵀ q` (`state` `None`: no token
/// yet). Returns the output and the new state.
///
/// # Shapes
/// - `q`, `k`: `[batch, heads, 1, d_k]`; `v`: `[batch, heads, 1, d_v]`; `log_decay`:
///   `[batch, heads, 1, 1]`; state `[batch, heads, d_k, d_v]`
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
        Some(state) => state * log_decay.exp() + write,
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
