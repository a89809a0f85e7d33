//! Softmax attention over gathered keys: the shared step of the sparse patterns (local windows,
//! the Sparse Transformer's fixed and strided patterns, Longformer, BigBird, Reformer's chunks).
//!
//! The queries are cut into blocks of `block` consecutive rows; every query of a block scores the
//! same `slots` keys, gathered by position ([`KeySlots`]), with a mask per query and slot for
//! whatever the block's queries do not share (a window's edges, causality, padding, slots left
//! empty). Scores, weights and gathered keys and values all hold `n_blocks · block · slots`
//! entries per head: time and memory grow with the pairs a pattern attends (plus the slots its
//! blocks share without attending), never with `n²` unless the pattern itself is dense.
//!
//! The step returns each query's log-sum-exp beside its output, so that attentions over several
//! key sets (Reformer's hash rounds, a strided pattern's two halves) combine into the softmax
//! over their union ([`merge_by_log_sum_exp`]).

use burn::nn::Dropout;
use burn::prelude::*;

use super::input::MASK_FILL;

/// Which keys each block of queries scores, built on the host by a pattern.
///
/// `index` and `mask` are laid out per *group*: one group shared by every batch element and head
/// (a fixed pattern without padding), one per batch element (padding), or one per batch element
/// and head (patterns drawn per head, or computed from the data).
#[derive(Debug, Clone)]
pub struct KeySlots {
    /// Queries per block.
    pub block: usize,
    /// Number of query blocks (`n_blocks · block >= n_q`; rows past `n_q` are dropped).
    pub n_blocks: usize,
    /// Keys scored by each block.
    pub slots: usize,
    /// `[batch_groups, head_groups]`, each 1 or the full size.
    pub groups: [usize; 2],
    /// Key position of each slot, `[groups, n_blocks, slots]` flattened; a masked slot may hold
    /// any valid position.
    pub index: Vec<i64>,
    /// `true` = query `r` of block `β` does not see slot `s`: `[groups, n_blocks, block, slots]`
    /// flattened.
    pub mask: Vec<bool>,
    /// Added to the scores before the softmax, `[groups, n_blocks, block, slots]` (Reformer's
    /// correction for keys met in several hash rounds); none for most patterns.
    pub bias: Option<Vec<f32>>,
}

impl KeySlots {
    /// Empty slots for `n_blocks` blocks of `block` queries scoring `slots` keys each: every
    /// slot masked and pointing at position 0, for the pattern to fill in.
    pub fn masked(groups: [usize; 2], n_blocks: usize, block: usize, slots: usize) -> Self {
        let g = groups[0] * groups[1];
        Self {
            block,
            n_blocks,
            slots,
            groups,
            index: vec![0; g * n_blocks * slots],
            mask: vec![true; g * n_blocks * block * slots],
            bias: None,
        }
    }

    /// Offset of group `(batch, head)` (each taken modulo its group count) in `index`, in
    /// slots.
    pub fn group(&self, batch: usize, head: usize) -> usize {
        (batch % self.groups[0]) * self.groups[1] + head % self.groups[1]
    }

    /// Sets slot `s` of block `beta` in group `g` to key position `pos`, seen by the queries
    /// `r` of the block for which `sees(r)`.
    pub fn set(
        &mut self,
        g: usize,
        beta: usize,
        s: usize,
        pos: usize,
        sees: impl Fn(usize) -> bool,
    ) {
        self.index[(g * self.n_blocks + beta) * self.slots + s] = pos as i64;
        let base = (g * self.n_blocks + beta) * self.block * self.slots;
        for r in 0..self.block {
            self.mask[base + r * self.slots + s] = !sees(r);
        }
    }

    /// Number of (query, key) pairs left unmasked, over all groups.
    pub fn attended_pairs(&self) -> usize {
        self.mask.iter().filter(|&&m| !m).count()
    }
}

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
/// masked row of [`exact_softmax_attention`](super::softmax::exact_softmax_attention)).
///
/// # Shapes
/// - `q`: `[batch, heads, n_q, d]`; `k`: `[batch, heads, n_k, d]`; `v`: `[batch, heads, n_k, d_v]`
/// - output: `[batch, heads, n_q, d_v]`, log-sum-exp `[batch, heads, n_q, 1]`
pub fn gathered_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    slots: &KeySlots,
    scale: f32,
    dropout: Option<&Dropout>,
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
    } = *slots;
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
    let q = q.reshape([batch, heads, n_blocks, block, d]);
    let mut scores = q.matmul(keys.swap_dims(3, 4)).mul_scalar(scale);
    let shape = [gb, gh, n_blocks, block, s];
    if let Some(bias) = &slots.bias {
        scores = scores + Tensor::<5>::from_data(TensorData::new(bias.clone(), shape), &device);
    }
    let mask = Tensor::<5, Bool>::from_data(TensorData::new(slots.mask.clone(), shape), &device);
    let scores = scores.mask_fill(mask, MASK_FILL);

    let max = scores.clone().max_dim(4).detach();
    let exp = (scores - max.clone()).exp();
    let sum = exp.clone().sum_dim(4);
    let mut weights = exp / sum.clone();
    if let Some(dropout) = dropout {
        weights = dropout.forward(weights);
    }
    let lse = (max + sum.log()).reshape([batch, heads, rows, 1]);
    let out = weights.matmul(values).reshape([batch, heads, rows, d_v]);
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
    let lse = max.clone() + (stacked - max).exp().sum_dim(3).log();
    let out = parts
        .into_iter()
        .map(|p| p.out * (p.lse - lse.clone()).exp())
        .reduce(|a, b| a + b)
        .expect("at least one part");
    GatheredOutput { out, lse }
}

/// Per batch element, one past the last real (unpadded) position: the sequence's length when
/// padding is a suffix. `n` for every element without a mask.
pub fn real_lengths(key_pad: &Option<Tensor<2, Bool>>, batch: usize, n: usize) -> Vec<usize> {
    match key_pad {
        None => vec![n; batch],
        Some(mask) => {
            let flags: Vec<bool> = mask.clone().into_data().iter::<bool>().collect();
            flags
                .chunks(n)
                .map(|row| row.iter().rposition(|&pad| !pad).map_or(0, |last| last + 1))
                .collect()
        }
    }
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
