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
    /// The query position at each row of the blocks, `[groups, n_blocks · block]`, a
    /// permutation of `0..n_blocks · block` (positions past `n_q` are padding rows), for patterns
    /// whose blocks are not runs of consecutive queries (a strided pattern's residue classes,
    /// Reformer's buckets); `None`: row `r` is query `r`.
    pub query_order: Option<Vec<i64>>,
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
            query_order: None,
        }
    }

    /// Each query `i` sees the keys `j` with `i - before <= j <= i + after`, and the keys at
    /// `globals` (sorted, distinct), in blocks of `block` queries; one group per batch element,
    /// its padded keys (`padding[b][j]`) masked. A block scores the `block + before + after`
    /// positions around it, then the global positions (masked in the band, so that none is
    /// counted twice).
    pub fn band(
        n: usize,
        block: usize,
        [before, after]: [usize; 2],
        globals: &[usize],
        padding: &[Vec<bool>],
    ) -> Self {
        let block = block.clamp(1, n.max(1));
        let n_blocks = n.div_ceil(block);
        let width = block + before + after;
        let mut slots = Self::masked([padding.len(), 1], n_blocks, block, width + globals.len());
        for (g, pad) in padding.iter().enumerate() {
            for beta in 0..n_blocks {
                let first = beta * block;
                for s in 0..width {
                    // Slot s holds position first - before + s.
                    let Some(j) = (first + s).checked_sub(before) else {
                        continue;
                    };
                    if j < n && !pad[j] && globals.binary_search(&j).is_err() {
                        slots.set(g, beta, s, j, |r| {
                            let i = first + r;
                            j + before >= i && j <= i + after
                        });
                    }
                }
                for (t, &j) in globals.iter().enumerate() {
                    if j < n && !pad[j] {
                        slots.set(g, beta, width + t, j, |_| true);
                    }
                }
            }
        }
        slots
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
        for r in 0..self.block {
            let at = self.pair(g, beta, r, s);
            self.mask[at] = !sees(r);
        }
    }

    /// Offset of (query `r` of block `beta`, slot `s`) of group `g` in `mask` and `bias`.
    pub fn pair(&self, g: usize, beta: usize, r: usize, s: usize) -> usize {
        ((g * self.n_blocks + beta) * self.block + r) * self.slots + s
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
    slots: KeySlots,
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
    let mask = Tensor::<5, Bool>::from_data(TensorData::new(slots.mask, shape), &device);
    let scores = scores.mask_fill(mask, MASK_FILL);

    let max = scores.clone().max_dim(4).detach();
    let exp = (scores - max.clone()).exp();
    let sum = exp.clone().sum_dim(4);
    let mut weights = exp / sum.clone();
    if let Some(dropout) = dropout {
        weights = dropout.forward(weights);
    }
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

/// `out` with the rows `rows[b]` of each batch element `b` replaced by exact softmax attention
/// of those queries over every key (padded keys masked): the rows of global tokens (Longformer)
/// and global blocks (BigBird). `q`, `k`, `v` may be other projections than those that made
/// `out`.
///
/// # Shapes
/// - `out`: `[batch, heads, n, d_v]`; `q`: `[batch, heads, n, d]`; `k`, `v`: over `n_k` keys
pub fn with_full_rows(
    out: Tensor<4>,
    [q, k, v]: [Tensor<4>; 3],
    rows: &[Vec<usize>],
    key_pad: Option<Tensor<2, Bool>>,
    dropout: Option<&Dropout>,
) -> Tensor<4> {
    let [batch, heads, n, d] = q.dims();
    let d_v = v.dims()[3];
    let count = rows.iter().map(Vec::len).max().unwrap_or(0);
    if count == 0 {
        return out;
    }
    let device = q.device();
    // The global rows of each (batch, head), padded with repeats of the first.
    let mut pick = Vec::with_capacity(batch * heads * count);
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
            let base = (b * heads + h) * n;
            for t in 0..count {
                let i = rows.get(t).or(rows.first()).copied().unwrap_or(0);
                pick.push((base + i) as i64);
            }
            let slot_base = (b * heads + h) * count;
            back.extend(slot.iter().map(|&t| (slot_base + t) as i64));
        }
    }
    let index = |values: Vec<i64>| {
        let len = values.len();
        Tensor::<1, Int>::from_data(TensorData::new(values, [len]), &device)
    };
    let q_rows = q
        .reshape([batch * heads * n, d])
        .select(0, index(pick))
        .reshape([batch, heads, count, d]);
    let full = super::softmax::exact_softmax_attention(q_rows, k, v, key_pad, false, dropout);
    let spread = full
        .reshape([batch * heads * count, d_v])
        .select(0, index(back))
        .reshape([batch, heads, n, d_v]);
    let mask = Tensor::<2, Bool>::from_data(TensorData::new(is_global, [batch, n]), &device)
        .reshape([batch, 1, n, 1])
        .expand([batch, heads, n, d_v]); // ndarray's mask_where broadcasts only the mask's way
    out.mask_where(mask, spread)
}

/// Per batch element, one past the last real (unpadded) position of its padding flags (see
/// [`padding_flags`]): the sequence's length when padding is a suffix.
pub fn real_lengths(padding: &[Vec<bool>]) -> Vec<usize> {
    padding
        .iter()
        .map(|row| row.iter().rposition(|&pad| !pad).map_or(0, |last| last + 1))
        .collect()
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
