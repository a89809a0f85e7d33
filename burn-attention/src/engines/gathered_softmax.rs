//! Softmax attention over gathered keys: the shared step of the sparse patterns (local windows,
//! the Sparse Transformer's fixed and strided patterns, Longformer, BigBird, Reformer's chunks)
//! and of the segment attentions (Transformer-XL, the Compressive Transformer), whose learned
//! relative-position scores it takes as a bias with a gradient ([`biased_gathered_attention`]).
//!
//! The queries are cut into blocks of `block` consecutive rows; every query of a block scores the
//! same `slots` keys, gathered by position ([`KeySlots`]), with a mask per query and slot for
//! whatever the block's queries do not share (a window's edges, causality, padding, slots left
//! empty). Time grows with the `n_blocks · block · slots` pairs scored per head: the pairs a
//! pattern attends plus the slots its blocks share without attending, never `n²` unless the
//! pattern itself is dense. Memory: on `flex`, a fused kernel keeps `O(n d)` per head (one
//! block's buffers at a time, weights recomputed in the backward pass); the composed form the
//! other backends run stores the `n_blocks · block · slots` scores, weights and gathered keys.
//!
//! The step returns each query's log-sum-exp beside its output, so that attentions over several
//! key sets (Reformer's hash rounds, a strided pattern's two halves) combine into the softmax
//! over their union ([`merge_by_log_sum_exp`]).

use std::sync::Arc;

use burn::nn::Dropout;
use burn::prelude::*;

use crate::contract::DecodingState;
use crate::contract::error::AttentionError;
use crate::contract::input::{HeadMasks, MASK_FILL};
use crate::engines::dropout::WeightDropout;
use crate::kernels;
use crate::kernels::key_slots::KeySlots;

/// The output and log-sum-exp of softmax attention over gathered keys.
#[derive(Debug, Clone)]
pub struct GatheredOutput {
    /// `[batch, heads, n_q, d_v]`.
    pub out: Tensor<4>,
    /// Log-sum-exp of each query's scaled scores over its unmasked slots, `[batch, heads, n_q, 1]`
    /// (about [`MASK_FILL`] for a query that sees nothing).
    pub lse: Tensor<4>,
}

/// `softmax(scale · q kᵀ + bias + masks) v`, each query block scoring only its slots' keys.
///
/// A query whose slots are all masked gets the mean of its slots' values, finite (as a fully
/// masked row of [`exact_softmax_attention`](crate::engines::softmax::exact_softmax_attention)).
///
/// On `flex` (f32) it runs a fused kernel whose backward recomputes the weights block by block
/// from the log-sum-exp, weight dropout included (a counter-based mask regenerated in the
/// backward pass), so training keeps `O(n d)` per head beyond the inputs; elsewhere the composed
/// steps below, whose backward Burn derives and which store the gathered keys, values and
/// weights (`n · slots` per head).
///
/// # Shapes
/// - `q`: `[batch, heads, n_q, d]`; `k`: `[batch, heads, n_k, d]`; `v`: `[batch, heads, n_k, d_v]`
/// - output: `[batch, heads, n_q, d_v]`, log-sum-exp `[batch, heads, n_q, 1]`
pub fn gathered_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    slots: KeySlots,
    scale: f32,
    dropout: Option<&Dropout>,
) -> GatheredOutput {
    attention_over_slots(q, k, v, None, slots, scale, dropout)
}

/// [`gathered_attention`] with a learned `bias` added to the scaled scores, which receives its
/// gradient: `softmax(scale · q k_slotsᵀ + bias + masks) v_slots`. `bias` is `[batch, heads,
/// n_blocks · block, slots]`, row `β · block + r` for query `r` of block `β` (block order, as
/// [`KeySlots::query_order`] lays the queries out). Transformer-XL's relative-position scores
/// are such a bias; on `flex` it runs the same fused kernel, which reads the bias and writes
/// its gradient block by block.
///
/// # Shapes
/// As [`gathered_attention`], and `bias`: `[batch, heads, n_blocks · block, slots]`.
pub fn biased_gathered_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    bias: Tensor<4>,
    slots: KeySlots,
    scale: f32,
    dropout: Option<&Dropout>,
) -> GatheredOutput {
    attention_over_slots(q, k, v, Some(bias), slots, scale, dropout)
}

/// The fused kernel where the backend has it, the composed steps otherwise.
fn attention_over_slots(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    bias: Option<Tensor<4>>,
    slots: KeySlots,
    scale: f32,
    dropout: Option<&Dropout>,
) -> GatheredOutput {
    let slots = Arc::new(slots);
    let dropout = WeightDropout::new(&q, dropout);
    if !matches!(dropout, WeightDropout::Layer(_))
        && let Some((out, lse)) = kernels::try_gathered_attention(
            &q,
            &k,
            &v,
            bias.as_ref(),
            &slots,
            scale,
            dropout.mask(),
        )
    {
        return GatheredOutput { out, lse };
    }
    composed_gathered_attention(q, k, v, bias, Arc::unwrap_or_clone(slots), scale, dropout)
}

/// [`biased_gathered_attention`] from Burn's operations: gather, batched products, softmax.
fn composed_gathered_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    learned_bias: Option<Tensor<4>>,
    slots: KeySlots,
    scale: f32,
    dropout: WeightDropout<'_>,
) -> GatheredOutput {
    let [batch, heads, n_q, d] = q.dims();
    let [_, _, n_k, d_v] = v.dims();
    let device = q.device();
    let KeySlots {
        block,
        n_blocks,
        slots: s,
        groups: [gb, gh],
        ..
    } = slots;
    let rows = n_blocks * block;
    assert!(
        rows >= n_q,
        "{n_blocks} blocks of {block} cannot hold {n_q} queries"
    );

    // Every (batch, head) pair's slots as rows of the flattened keys and values.
    let mut index = Vec::with_capacity(batch * heads * n_blocks * s);
    for b in 0..batch {
        for h in 0..heads {
            let offset = ((b * heads + h) * n_k) as i64;
            let g = slots.group(b, h);
            let own = &slots.index[g * n_blocks * s..(g + 1) * n_blocks * s];
            index.extend(own.iter().map(|&pos| offset + pos));
        }
    }
    let count = index.len();
    let index = Tensor::<1, Int>::from_data(TensorData::new(index, [count]), &device);
    let gather = |x: Tensor<4>, width: usize| {
        x.reshape([batch * heads * n_k, width])
            .select(0, index.clone())
            .reshape([batch, heads, n_blocks, s, width])
    };
    let keys = gather(k, d);
    let values = gather(v, d_v);

    let q = if rows > n_q {
        Tensor::cat(
            vec![q, Tensor::zeros([batch, heads, rows - n_q, d], &device)],
            2,
        )
    } else {
        q
    };
    // Rows of the flattened queries in block order, and back.
    let order = slots.query_order.as_ref().map(|order| {
        let mut forward = Vec::with_capacity(batch * heads * rows);
        let mut inverse = vec![0i64; batch * heads * rows];
        for b in 0..batch {
            for h in 0..heads {
                let offset = (b * heads + h) * rows;
                let g = slots.group(b, h);
                for (r, &pos) in order[g * rows..(g + 1) * rows].iter().enumerate() {
                    forward.push((offset + pos as usize) as i64);
                    inverse[offset + pos as usize] = (offset + r) as i64;
                }
            }
        }
        let tensor = |rows: Vec<i64>| {
            let len = rows.len();
            Tensor::<1, Int>::from_data(TensorData::new(rows, [len]), &device)
        };
        (tensor(forward), tensor(inverse))
    });
    let reorder = |x: Tensor<4>, index: &Tensor<1, Int>| {
        let [b, h, r, w] = x.dims();
        x.reshape([b * h * r, w])
            .select(0, index.clone())
            .reshape([b, h, r, w])
    };
    let q = match &order {
        Some((forward, _)) => reorder(q, forward),
        None => q,
    };
    let q = q.reshape([batch, heads, n_blocks, block, d]);
    let mut scores = q.matmul(keys.swap_dims(3, 4)).mul_scalar(scale);
    let shape = [gb, gh, n_blocks, block, s];
    if let Some(bias) = slots.bias {
        scores = scores + Tensor::<5>::from_data(TensorData::new(bias, shape), &device);
    }
    if let Some(bias) = learned_bias {
        scores = scores + bias.reshape([batch, heads, n_blocks, block, s]);
    }
    let mask = Tensor::<5, Bool>::from_data(TensorData::new(slots.mask, shape), &device);
    let scores = scores.mask_fill(mask, MASK_FILL);

    let max = scores.clone().max_dim(4).detach();
    let exp = (scores - max.clone()).exp();
    let sum = exp.clone().sum_dim(4);
    let weights = dropout.apply(exp / sum.clone());
    let mut lse = (max + sum.log()).reshape([batch, heads, rows, 1]);
    let mut out = weights.matmul(values).reshape([batch, heads, rows, d_v]);
    if let Some((_, inverse)) = &order {
        out = reorder(out, inverse);
        lse = reorder(lse, inverse);
    }
    GatheredOutput {
        out: out.slice([0..batch, 0..heads, 0..n_q]),
        lse: lse.slice([0..batch, 0..heads, 0..n_q]),
    }
}

/// The softmax over the union of several disjoint key sets, from the attention over each:
/// `o = Σ_p exp(lse_p - lse) o_p` with `lse = log Σ_p exp(lse_p)`.
pub fn merge_by_log_sum_exp(parts: Vec<GatheredOutput>) -> GatheredOutput {
    let lses: Vec<Tensor<4>> = parts.iter().map(|p| p.lse.clone()).collect();
    let stacked = Tensor::cat(lses, 3);
    let max = stacked.clone().max_dim(3).detach();
    let sum = (stacked - max.clone()).exp().sum_dim(3);
    // Each part's share relative to the largest, divided by their sum: exact to f32 round-off
    // of the differences, where `exp(lse_p - lse)` would carry the round-off of `lse` itself
    // (4.9e-4 absolute near −5000, where a query that only sees itself sits in Reformer).
    let out = parts
        .into_iter()
        .map(|p| p.out * (p.lse - max.clone()).exp())
        .reduce(|a, b| a + b)
        .expect("at least one part")
        / sum.clone();
    GatheredOutput {
        out,
        lse: max + sum.log(),
    }
}

/// The rows `rows[b]` of each batch element `b` of a `[batch, heads, n, w]` tensor, as
/// `[batch, heads, count, w]` (`count` the longest list; shorter lists repeat their first row,
/// which [`with_full_rows`] never reads back). A `[batch, n, w]` tensor goes through as
/// `[batch, 1, n, w]`. At least one list must be non-empty (Burn has no empty tensors on every
/// backend): callers skip the global rows when there are none.
pub fn pick_rows(x: Tensor<4>, rows: &[Vec<usize>]) -> Tensor<4> {
    let [batch, heads, n, w] = x.dims();
    let count = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut pick = Vec::with_capacity(batch * heads * count);
    for (b, rows) in rows.iter().enumerate() {
        for h in 0..heads {
            let base = (b * heads + h) * n;
            for t in 0..count {
                let i = rows.get(t).or(rows.first()).copied().unwrap_or(0);
                pick.push((base + i) as i64);
            }
        }
    }
    let device = x.device();
    let len = pick.len();
    let index = Tensor::<1, Int>::from_data(TensorData::new(pick, [len]), &device);
    x.reshape([batch * heads * n, w])
        .select(0, index)
        .reshape([batch, heads, count, w])
}

/// `out` with the rows `rows[b]` of each batch element `b` replaced by exact softmax attention
/// of those queries over every key (padded keys masked, and the pairs an attention mask in
/// `masks` hides): the rows of global tokens (Longformer) and global blocks (BigBird). `q_rows` holds those rows' queries ([`pick_rows`]); they and
/// `k`, `v` may come from other projections than those that made `out`.
///
/// # Shapes
/// - `out`: `[batch, heads, n, d_v]`; `q_rows`: `[batch, heads, count, d]`; `k`, `v`: over
///   `n_k` keys
pub fn with_full_rows(
    out: Tensor<4>,
    [q_rows, k, v]: [Tensor<4>; 3],
    rows: &[Vec<usize>],
    masks: &HeadMasks,
    dropout: Option<&Dropout>,
) -> Tensor<4> {
    let [batch, heads, n, d_v] = out.dims();
    let count = q_rows.dims()[2];
    let device = out.device();
    // For each position: the global row that holds it (or 0), and whether it is one.
    let mut back = Vec::with_capacity(batch * heads * n);
    let mut is_global = vec![false; batch * n];
    for (b, rows) in rows.iter().enumerate() {
        // Each position's global row (0 for the others, which keep `out`).
        let mut slot = vec![0usize; n];
        for (t, &i) in rows.iter().enumerate() {
            is_global[b * n + i] = true;
            slot[i] = t;
        }
        for h in 0..heads {
            let slot_base = (b * heads + h) * count;
            back.extend(slot.iter().map(|&t| (slot_base + t) as i64));
        }
    }
    let len = back.len();
    let back = Tensor::<1, Int>::from_data(TensorData::new(back, [len]), &device);
    let full = match &masks.attn {
        None => crate::engines::softmax::exact_softmax_attention(
            q_rows,
            k,
            v,
            masks.key_pad.clone(),
            false,
            dropout,
        ),
        Some(attn) => {
            // The mask's rows of the global queries, `[batch, count, n_k]`.
            let n_k = attn.dims()[2];
            let picked = pick_rows(attn.clone().float().reshape([batch, 1, n, n_k]), rows)
                .greater_elem(0.5)
                .reshape([batch, count, n_k]);
            let row_masks = HeadMasks {
                key_pad: masks.key_pad.clone(),
                attn: Some(picked),
                ..HeadMasks::default()
            };
            crate::engines::softmax::softmax_attention_with_weights(
                q_rows, k, v, &row_masks, dropout,
            )
            .0
        }
    };
    let spread = full
        .reshape([batch * heads * count, d_v])
        .select(0, back)
        .reshape([batch, heads, n, d_v]);
    let mask = Tensor::<2, Bool>::from_data(TensorData::new(is_global, [batch, n]), &device)
        .reshape([batch, 1, n, 1])
        .expand([batch, heads, n, d_v]); // ndarray's mask_where broadcasts only the mask's way
    out.mask_where(mask, spread)
}

/// The weights of a pattern's softmax attention as a dense `[batch, heads, n_q, n_k]` tensor:
/// `softmax(scale · q kᵀ)` over the pairs its `slots` score (several key sets: their union)
/// and, for the queries of `full_rows[b]`, over every real key the attention mask leaves
/// (`masks`); 0 elsewhere. The composed steps, `n × n` scores formed: for analysis and plots,
/// not for training at length.
pub fn pattern_weights(
    q: Tensor<4>,
    k: Tensor<4>,
    slots: &[&KeySlots],
    full_rows: &[Vec<usize>],
    masks: &HeadMasks,
    scale: f32,
) -> Tensor<4> {
    let [batch, heads, n_q, _] = q.dims();
    let n_k = k.dims()[2];
    let shape = [batch, heads, n_q, n_k];
    let mut kept = vec![false; batch * heads * n_q * n_k];
    for slots in slots {
        slots.mark_kept(&mut kept, shape);
    }
    let padding = padding_flags(&masks.key_pad, batch, n_k);
    let attention = masks.attention_flags();
    for (b, rows) in full_rows.iter().enumerate() {
        for h in 0..heads {
            for &i in rows {
                for j in (0..n_k).filter(|&j| !padding[b][j]) {
                    let hidden = attention
                        .as_ref()
                        .is_some_and(|(flags, _)| flags[(b * n_q + i) * n_k + j]);
                    kept[((b * heads + h) * n_q + i) * n_k + j] = !hidden;
                }
            }
        }
    }
    let dropped =
        Tensor::<4, Bool>::from_data(TensorData::new(kept, shape), &q.device()).bool_not();
    let scores = q.matmul(k.swap_dims(2, 3)).mul_scalar(scale);
    crate::kernels::softmax(scores.mask_fill(dropped, MASK_FILL))
}

/// Per batch element, one past the last real (unpadded) position of its padding flags (see
/// [`padding_flags`]): the sequence's length when padding is a suffix.
pub fn real_lengths(padding: &[Vec<bool>]) -> Vec<usize> {
    padding
        .iter()
        .map(|row| row.iter().rposition(|&pad| !pad).map_or(0, |last| last + 1))
        .collect()
}

/// The prompt lengths of a batch padded at the end (`mask_pad: [batch, n]`, `true` = padding);
/// an error naming `variant` when a row has padding before its last real position (a
/// position-dependent pattern reads each token's position from where it sits).
pub fn suffix_lengths(
    variant: &'static str,
    mask_pad: &Tensor<2, Bool>,
) -> Result<Vec<usize>, AttentionError> {
    let [batch, n] = mask_pad.dims();
    let flags = padding_flags(&Some(mask_pad.clone()), batch, n);
    let lengths = real_lengths(&flags);
    if flags
        .iter()
        .zip(&lengths)
        .any(|(row, &len)| row[..len].contains(&true))
    {
        return Err(AttentionError::unsupported(
            variant,
            "prompts padded anywhere but after their end (its pattern reads positions)",
        ));
    }
    Ok(lengths)
}

/// For a key/value cache that holds every key since position 0 with padding among them (a
/// padded prompt's, [`AttentionModule::prefill_padded`](crate::AttentionModule::prefill_padded)):
/// each column's position in its sequence, `None` at padding.
pub fn cache_positions(flags: &[Vec<bool>]) -> Vec<Vec<Option<usize>>> {
    flags
        .iter()
        .map(|row| {
            let mut next = 0;
            row.iter()
                .map(|&pad| {
                    (!pad).then(|| {
                        next += 1;
                        next - 1
                    })
                })
                .collect()
        })
        .collect()
}

/// Flags `[batch][n]` as a boolean tensor `[batch, n]` on `device`.
pub fn flags_tensor(flags: &[Vec<bool>], device: &Device) -> Tensor<2, Bool> {
    let n = flags.first().map_or(0, Vec::len);
    let data: Vec<bool> = flags.iter().flatten().copied().collect();
    Tensor::from_data(TensorData::new(data, [flags.len(), n]), device)
}

/// The padding flags `[batch][n]` on the host (`true` = padding), all `false` without a mask.
pub fn padding_flags(key_pad: &Option<Tensor<2, Bool>>, batch: usize, n: usize) -> Vec<Vec<bool>> {
    match key_pad {
        None => vec![vec![false; n]; batch],
        Some(mask) => {
            let flags: Vec<bool> = mask.clone().into_data().iter::<bool>().collect();
            flags.chunks(n).map(<[bool]>::to_vec).collect()
        }
    }
}

/// A padded key/value cache (`unseen`: `[batch][columns]`, `true` = masked) less its leading
/// columns masked in every row (at least one column stays).
pub(crate) fn trimmed_cache(
    keys: Tensor<4>,
    values: Tensor<4>,
    unseen: Vec<Vec<bool>>,
) -> DecodingState {
    let columns = keys.dims()[2];
    let drop = unseen
        .iter()
        .map(|row| row.iter().position(|&masked| !masked).unwrap_or(columns))
        .min()
        .unwrap_or(0)
        .min(columns - 1);
    let unseen: Vec<Vec<bool>> = unseen.into_iter().map(|row| row[drop..].to_vec()).collect();
    DecodingState::KeyValueCache {
        padding: Some(flags_tensor(&unseen, &keys.device())),
        keys: keys.slice(s![.., .., drop..]),
        values: values.slice(s![.., .., drop..]),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use burn::prelude::*;

    use super::{KeySlots, WeightDropout, composed_gathered_attention};
    use crate::kernels;
    use crate::kernels::DropMask;

    /// A small deterministic generator (SplitMix64) for patterns and inputs.
    struct Draws(u64);

    impl Draws {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        /// Uniform in [-1, 1).
        fn signed(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        }

        fn tensor(&mut self, shape: [usize; 4], scale: f32, device: &Device) -> Tensor<4> {
            let values: Vec<f32> = (0..shape.iter().product::<usize>())
                .map(|_| scale * self.signed())
                .collect();
            Tensor::from_data(TensorData::new(values, shape), device)
        }
    }

    /// A random pattern: repeated and masked slots, one query that sees nothing, optional
    /// score bias and query order, rows past `n_q`.
    fn random_slots(
        draws: &mut Draws,
        groups: [usize; 2],
        [n_q, n_k]: [usize; 2],
        [block, width]: [usize; 2],
        bias: bool,
        order: bool,
    ) -> KeySlots {
        let n_blocks = n_q.div_ceil(block);
        let mut slots = KeySlots::masked(groups, n_blocks, block, width);
        for j in slots.index.iter_mut() {
            *j = draws.below(n_k) as i64;
        }
        for m in slots.mask.iter_mut() {
            *m = draws.below(10) < 3;
        }
        // Query row 1 of block 0 in group 0 sees nothing.
        for s in 0..width {
            let at = slots.pair(0, 0, 1, s);
            slots.mask[at] = true;
        }
        if bias {
            slots.bias = Some(
                (0..slots.mask.len())
                    .map(|_| 2.0 * draws.signed())
                    .collect(),
            );
        }
        if order {
            let rows = n_blocks * block;
            let mut all = Vec::new();
            for _ in 0..groups[0] * groups[1] {
                let mut perm: Vec<i64> = (0..rows as i64).collect();
                for i in (1..rows).rev() {
                    perm.swap(i, draws.below(i + 1));
                }
                all.extend(perm);
            }
            slots.query_order = Some(all);
        }
        slots
    }

    fn max_rel_diff(a: Tensor<4>, b: Tensor<4>) -> f32 {
        let scale = b.clone().abs().max().into_scalar::<f32>().max(1e-6);
        (a - b).abs().max().into_scalar::<f32>() / scale
    }

    /// The fused kernel against the composed steps (Burn's own gather, softmax and derived
    /// backward): outputs, log-sum-exps, and the gradients of a loss that reads both; without
    /// dropout and with the same dropout mask on both sides.
    #[test]
    fn fused_matches_composed_with_gradients() {
        for dropout in [None, Some(DropMask::new(0.3, 11))] {
            fused_matches_composed_case(dropout);
        }
    }

    fn fused_matches_composed_case(dropout: Option<DropMask>) {
        let device = Device::flex().autodiff();
        let mut draws = Draws(7);
        let cases = [
            // (groups, [n_q, n_k], [block, slots], bias, order, d, d_v, input scale)
            ([1, 1], [13, 13], [4, 6], false, false, 8, 8, 1.0),
            ([2, 3], [13, 17], [4, 6], true, true, 8, 5, 3.0),
            ([2, 1], [20, 9], [5, 12], false, true, 4, 6, 3.0),
            ([1, 3], [1, 1], [1, 1], true, false, 8, 8, 1.0),
        ];
        for (groups, [n_q, n_k], shape, bias, order, d, d_v, scale) in cases {
            let (batch, heads) = (2, 3);
            let slots = random_slots(&mut draws, groups, [n_q, n_k], shape, bias, order);
            let q = draws.tensor([batch, heads, n_q, d], scale, &device);
            // Keys and values as per-head views of `[batch, n, heads, d]` (read in place by
            // the kernel), queries contiguous.
            let k = draws
                .tensor([batch, n_k, heads, d], scale, &device)
                .swap_dims(1, 2);
            let v = draws
                .tensor([batch, n_k, heads, d_v], 1.0, &device)
                .swap_dims(1, 2);
            let g_out = draws.tensor([batch, heads, n_q, d_v], 1.0, &device);
            let g_lse = draws.tensor([batch, heads, n_q, 1], 1.0, &device);
            // A learned bias (Transformer-XL's relative scores) of the scores' own size.
            let rows = slots.n_blocks * slots.block;
            let learned = draws.tensor([batch, heads, rows, slots.slots], 2.0, &device);
            for with_bias in [false, true] {
                let run = |fused: bool| {
                    let [q, k, v, learned] =
                        [&q, &k, &v, &learned].map(|t| t.clone().require_grad());
                    let bias = with_bias.then(|| learned.clone());
                    let (out, lse) = if fused {
                        let slots = Arc::new(slots.clone());
                        kernels::try_gathered_attention(
                            &q,
                            &k,
                            &v,
                            bias.as_ref(),
                            &slots,
                            0.5,
                            dropout,
                        )
                        .expect("flex has the fused kernel")
                    } else {
                        let o = composed_gathered_attention(
                            q.clone(),
                            k.clone(),
                            v.clone(),
                            bias,
                            slots.clone(),
                            0.5,
                            dropout.map_or(WeightDropout::Off, WeightDropout::Mask),
                        );
                        (o.out, o.lse)
                    };
                    let loss =
                        (out.clone() * g_out.clone()).sum() + (lse.clone() * g_lse.clone()).sum();
                    let grads = loss.backward();
                    let grad = |t: &Tensor<4>| t.grad(&grads).expect("a gradient");
                    let mut found = vec![out.inner(), lse.inner(), grad(&q), grad(&k), grad(&v)];
                    if with_bias {
                        found.push(grad(&learned));
                    }
                    found
                };
                let fused = run(true);
                let composed = run(false);
                for (name, (a, b)) in ["out", "lse", "dq", "dk", "dv", "d_bias"]
                    .iter()
                    .zip(fused.into_iter().zip(composed))
                {
                    let diff = max_rel_diff(a, b);
                    assert!(
                        diff < 2e-5,
                        "{name}: relative difference {diff} (groups {groups:?}, n_q {n_q}, \
                         dropout {dropout:?}, learned bias {with_bias})"
                    );
                }
            }
        }
    }
}
