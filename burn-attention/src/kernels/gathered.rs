//! Softmax attention over gathered keys on the CPU, fused: the forward pass keeps each query's
//! log-sum-exp and the backward pass recomputes the weights block by block from it, as the
//! tiled kernel of [`kernel`](super::kernel) does for dense attention.
//!
//! The composed form (`gather`, batched products, softmax) stores the gathered keys and values
//! and the scores and weights of every (query, slot) pair for its backward: `n · slots` floats
//! per head, several times over. Here a task per batch · head walks the query blocks in turn,
//! gathers one block's queries, keys and values into buffers, and keeps nothing beyond the
//! inputs (read in place, [`Rows`]), the output and two floats per query: memory `O(n d)` per
//! head, whatever the pattern.
//!
//! Outputs and gradients are contiguous row-major `f32`: `[bh, n, width]`, where `bh` runs over
//! batch × heads. Masked (query, slot) pairs get
//! [`MASK_FILL`] in place of their score, as in the composed form, and no gradient.

use rayon::prelude::*;

use super::DropMask;
use super::kernel::{Dims, matmul};
use super::simd;
use crate::contract::input::MASK_FILL;
use crate::kernels::key_slots::KeySlots;

/// The rows of a `[batch, heads, n, width]` tensor read where they lie: row `i` of head `h` of
/// batch element `b` is the `width` values from `start + b·s₀ + h·s₁ + i·s₂`. Per-head views of
/// `[batch, n, heads · width]` projections are read without a copy.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a> {
    data: &'a [f32],
    start: usize,
    strides: [usize; 3],
    width: usize,
}

impl<'a> Rows<'a> {
    /// A view of `data` with the given shape, start and strides (of the first three axes; the
    /// last is contiguous). Panics if a row lies outside `data`.
    pub fn new(data: &'a [f32], shape: [usize; 4], start: usize, strides: [usize; 3]) -> Self {
        if shape.iter().all(|&x| x > 0) {
            let last = start + (0..3).map(|a| (shape[a] - 1) * strides[a]).sum::<usize>();
            assert!(
                last + shape[3] <= data.len(),
                "a row lies outside the tensor"
            );
        }
        Self {
            data,
            start,
            strides,
            width: shape[3],
        }
    }

    fn row(&self, b: usize, h: usize, i: usize) -> &'a [f32] {
        let at = self.start + b * self.strides[0] + h * self.strides[1] + i * self.strides[2];
        &self.data[at..at + self.width]
    }
}

/// Queries, keys and values of one call, and the scores' learned bias if any.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// `[batch, heads, n_q, d]`.
    pub q: Rows<'a>,
    /// `[batch, heads, n_k, d]`.
    pub k: Rows<'a>,
    /// `[batch, heads, n_k, d_v]`.
    pub v: Rows<'a>,
    /// Added to the scaled scores, `[batch, heads, n_blocks · block, slots]`: row `β · block +
    /// r` is query `r` of block `β` (in block order, as [`KeySlots::query_order`] lays the
    /// queries out), and it receives its gradient (Transformer-XL's relative-position scores).
    pub bias: Option<Rows<'a>>,
}

/// Per-task buffers: one block's queries, gathered keys and values, and scores.
struct Buffers {
    /// Query position of each row of the block (`None`: a padding row past `n_q`).
    rows: Vec<Option<usize>>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    s: Vec<f32>,
}

impl Buffers {
    fn new(slots: &KeySlots, dims: Dims) -> Self {
        let (block, width) = (slots.block, slots.slots);
        Self {
            rows: vec![None; block],
            q: vec![0.0; block * dims.d],
            k: vec![0.0; width * dims.d],
            v: vec![0.0; width * dims.d_v],
            s: vec![0.0; block * width],
        }
    }

    /// Gathers block `beta` of head `h` (of all batch · heads): its query rows (zero for
    /// padding rows), its slots' keys and values, and its masked, biased, scaled scores.
    fn load(
        &mut self,
        slots: &KeySlots,
        (h, beta): (usize, usize),
        inputs: &Inputs<'_>,
        dims: Dims,
        scale: f32,
    ) {
        let Dims { n_q, d, d_v, .. } = dims;
        let (b, h) = (h / dims.heads, h % dims.heads);
        let g = slots.group(b, h);
        let (block, width) = (slots.block, slots.slots);
        let n_rows = slots.n_blocks * block;
        for r in 0..block {
            let row = beta * block + r;
            let pos = match &slots.query_order {
                Some(order) => order[g * n_rows + row] as usize,
                None => row,
            };
            let dst = &mut self.q[r * d..(r + 1) * d];
            if pos < n_q {
                dst.copy_from_slice(inputs.q.row(b, h, pos));
                self.rows[r] = Some(pos);
            } else {
                dst.fill(0.0);
                self.rows[r] = None;
            }
        }
        let index = &slots.index[(g * slots.n_blocks + beta) * width..][..width];
        for (t, &j) in index.iter().enumerate() {
            let j = j as usize;
            self.k[t * d..(t + 1) * d].copy_from_slice(inputs.k.row(b, h, j));
            self.v[t * d_v..(t + 1) * d_v].copy_from_slice(inputs.v.row(b, h, j));
        }
        matmul(
            block,
            width,
            d,
            &mut self.s,
            width,
            false,
            &self.q,
            (d, 1),
            &self.k,
            (1, d),
            scale,
        );
        let pairs = slots.block_pairs(g, beta);
        if let Some(bias) = &slots.bias {
            for (s, &b) in self.s.iter_mut().zip(&bias[pairs.clone()]) {
                *s += b;
            }
        }
        if let Some(bias) = &inputs.bias {
            for (r, row) in self.s.chunks_mut(width).enumerate() {
                for (s, &x) in row.iter_mut().zip(bias.row(b, h, beta * block + r)) {
                    *s += x;
                }
            }
        }
        for (s, &masked) in self.s.iter_mut().zip(&slots.mask[pairs]) {
            if masked {
                *s = MASK_FILL;
            }
        }
    }
}

/// The slots' key positions must lie below `n_k`, their query order below `n_blocks · block`,
/// and a learned bias's rows must be a slot each wide.
fn check(slots: &KeySlots, dims: Dims, inputs: &Inputs<'_>) {
    let groups = slots.groups[0] * slots.groups[1];
    assert!(slots.block > 0 && slots.slots > 0, "empty blocks or slots");
    if let Some(bias) = &inputs.bias {
        assert_eq!(bias.width, slots.slots, "a bias row a slot each");
    }
    assert!(slots.n_blocks * slots.block >= dims.n_q, "blocks too few");
    assert_eq!(slots.index.len(), groups * slots.n_blocks * slots.slots);
    assert_eq!(
        slots.mask.len(),
        groups * slots.n_blocks * slots.block * slots.slots
    );
    assert!(
        slots
            .index
            .iter()
            .all(|&j| j >= 0 && (j as usize) < dims.n_k),
        "a slot points past the keys"
    );
    if let Some(bias) = &slots.bias {
        assert_eq!(bias.len(), slots.mask.len());
    }
    if let Some(order) = &slots.query_order {
        let rows = slots.n_blocks * slots.block;
        assert_eq!(order.len(), groups * rows);
        assert!(order.iter().all(|&p| p >= 0 && (p as usize) < rows));
    }
}

/// What the forward pass computes: the output and, per query, the log-sum-exp of its scores
/// and the two terms it is made of (the backward pass rebuilds the weights from those, exactly
/// as the forward pass normalised them: a log-sum-exp rounded near a masked score of −10⁴
/// would be off by 10⁻³).
#[derive(Debug)]
pub struct Forward {
    /// `[bh, n_q, d_v]`.
    pub out: Vec<f32>,
    /// `max + ln(sum)`, `[bh, n_q]`.
    pub lse: Vec<f32>,
    /// Each query's largest score, `[bh, n_q]`.
    pub max: Vec<f32>,
    /// `Σ exp(score − max)`, `[bh, n_q]`.
    pub sum: Vec<f32>,
}

/// The dropout mask's row of block row `r` of block `beta` of head `h` (of batch × heads): rows
/// count the `n_blocks · block` block rows of each head in block order, columns the slots, as
/// the composed form's `[batch, heads, n_blocks, block, slots]` weights do.
fn mask_row(slots: &KeySlots, h: usize, beta: usize, r: usize) -> u64 {
    ((h * slots.n_blocks + beta) * slots.block + r) as u64
}

/// Forward pass over every batch · head; `dropout` drops weights after normalisation.
pub fn forward(
    inputs: Inputs<'_>,
    dims: Dims,
    slots: &KeySlots,
    scale: f32,
    dropout: Option<DropMask>,
) -> Forward {
    let Dims { n_q, d_v, .. } = dims;
    let bh = dims.batch * dims.heads;
    check(slots, dims, &inputs);
    let mut out = vec![0.0f32; bh * n_q * d_v];
    let mut max = vec![0.0f32; bh * n_q];
    let mut sum = vec![0.0f32; bh * n_q];
    let (block, width) = (slots.block, slots.slots);
    if n_q > 0 {
        out.par_chunks_mut(n_q * d_v)
            .zip(max.par_chunks_mut(n_q))
            .zip(sum.par_chunks_mut(n_q))
            .enumerate()
            .for_each_init(
                || (Buffers::new(slots, dims), vec![0.0f32; block * d_v]),
                |(buf, o), (h, ((out, max), sum))| {
                    for beta in 0..slots.n_blocks {
                        buf.load(slots, (h, beta), &inputs, dims, scale);
                        for r in 0..block {
                            let row = &mut buf.s[r * width..(r + 1) * width];
                            let m = simd::max(row);
                            let l = simd::exp_shift_sum(row, m);
                            let inv = 1.0 / l;
                            row.iter_mut().for_each(|p| *p *= inv);
                            if let Some(mask) = &dropout {
                                mask.apply_row(mask_row(slots, h, beta, r), 0, row);
                            }
                            if let Some(pos) = buf.rows[r] {
                                (max[pos], sum[pos]) = (m, l);
                            }
                        }
                        matmul(
                            block,
                            d_v,
                            width,
                            o,
                            d_v,
                            false,
                            &buf.s,
                            (width, 1),
                            &buf.v,
                            (d_v, 1),
                            1.0,
                        );
                        for (r, pos) in buf.rows.iter().enumerate() {
                            if let Some(pos) = *pos {
                                out[pos * d_v..(pos + 1) * d_v]
                                    .copy_from_slice(&o[r * d_v..(r + 1) * d_v]);
                            }
                        }
                    }
                },
            );
    }
    let lse = max.iter().zip(&sum).map(|(m, l)| m + l.ln()).collect();
    Forward { out, lse, max, sum }
}

/// What the backward pass reads besides the inputs: the forward pass's results, and the
/// gradients reaching its output and log-sum-exp (`d_lse` none when the log-sum-exp feeds
/// nothing).
pub struct Upstream<'a> {
    /// The forward pass.
    pub forward: &'a Forward,
    /// Gradient of the output `[bh, n_q, d_v]`.
    pub d_out: &'a [f32],
    /// Gradient of the log-sum-exp `[bh, n_q]`.
    pub d_lse: Option<&'a [f32]>,
}

/// The gradients of the inputs of one call, contiguous.
#[derive(Debug)]
pub struct Gradients {
    /// `[bh, n_q, d]`.
    pub dq: Vec<f32>,
    /// `[bh, n_k, d]`.
    pub dk: Vec<f32>,
    /// `[bh, n_k, d_v]`.
    pub dv: Vec<f32>,
    /// `[bh, n_blocks · block, slots]`, when the call had a learned bias.
    pub d_bias: Option<Vec<f32>>,
}

/// Gradients with respect to `q`, `k`, `v` and the learned bias.
///
/// With `P` the weights, `Z` the dropout mask (ones without dropout) and `dP = (dO Vᵀ) ∘ Z`,
/// a score's gradient is `P (dP − δ)` with `δ_i = dO_i · O_i − d lse_i` (the log-sum-exp's
/// gradient with respect to a score is its weight): the bias's, and `scale` times it the
/// product `q kᵀ`'s; keys met by several slots collect every slot's share.
pub fn backward(
    inputs: Inputs<'_>,
    dims: Dims,
    slots: &KeySlots,
    scale: f32,
    dropout: Option<DropMask>,
    up: Upstream<'_>,
) -> Gradients {
    let Dims {
        n_q, n_k, d, d_v, ..
    } = dims;
    let bh = dims.batch * dims.heads;
    check(slots, dims, &inputs);
    assert_eq!(up.forward.out.len(), bh * n_q * d_v, "output length");
    assert_eq!(up.d_out.len(), bh * n_q * d_v, "output-gradient length");
    assert_eq!(up.forward.max.len(), bh * n_q, "row-maximum length");
    let mut dq = vec![0.0f32; bh * n_q * d];
    let mut dk = vec![0.0f32; bh * n_k * d];
    let mut dv = vec![0.0f32; bh * n_k * d_v];
    let (block, width) = (slots.block, slots.slots);
    // The bias's gradient, a head's rows at a time (one unused float a head without a bias).
    let bias_rows = slots.n_blocks * block * width;
    let per_head = if inputs.bias.is_some() { bias_rows } else { 1 };
    let mut d_bias = vec![0.0f32; bh * per_head];
    if n_q == 0 {
        let d_bias = inputs.bias.map(|_| d_bias);
        return Gradients { dq, dk, dv, d_bias };
    }
    dq.par_chunks_mut(n_q * d)
        .zip(dk.par_chunks_mut(n_k * d))
        .zip(dv.par_chunks_mut(n_k * d_v))
        .zip(d_bias.par_chunks_mut(per_head))
        .enumerate()
        .for_each_init(
            || {
                (
                    Buffers::new(slots, dims),
                    // The block's δ, dO rows, dP, dQ and gathered dK or dV.
                    vec![0.0f32; block],
                    vec![0.0f32; block * d_v],
                    vec![0.0f32; block * width],
                    vec![0.0f32; block * d],
                    vec![0.0f32; width * d.max(d_v)],
                    // The dropped weights, with dropout.
                    vec![0.0f32; if dropout.is_some() { block * width } else { 0 }],
                )
            },
            |(buf, delta, d_o, dp, dq_block, d_gathered, dropped),
             (h, (((dq, dk), dv), d_bias))| {
                let out = &up.forward.out[h * n_q * d_v..(h + 1) * n_q * d_v];
                let d_out = &up.d_out[h * n_q * d_v..(h + 1) * n_q * d_v];
                let max = &up.forward.max[h * n_q..(h + 1) * n_q];
                let sum = &up.forward.sum[h * n_q..(h + 1) * n_q];
                let d_lse = up.d_lse.map(|x| &x[h * n_q..(h + 1) * n_q]);
                let g = slots.group(h / dims.heads, h % dims.heads);
                let index =
                    |beta: usize| &slots.index[(g * slots.n_blocks + beta) * width..][..width];
                for beta in 0..slots.n_blocks {
                    buf.load(slots, (h, beta), &inputs, dims, scale);
                    // P = exp(S − max) / sum; padding rows carry no weight and no gradient.
                    for r in 0..block {
                        let p = &mut buf.s[r * width..(r + 1) * width];
                        let dst = &mut d_o[r * d_v..(r + 1) * d_v];
                        match buf.rows[r] {
                            Some(i) => {
                                simd::exp_shift(p, max[i]);
                                let inv = 1.0 / sum[i];
                                p.iter_mut().for_each(|x| *x *= inv);
                                let row = &d_out[i * d_v..(i + 1) * d_v];
                                dst.copy_from_slice(row);
                                delta[r] = simd::dot(row, &out[i * d_v..(i + 1) * d_v])
                                    - d_lse.map_or(0.0, |x| x[i]);
                            }
                            None => {
                                delta[r] = 0.0;
                                p.fill(0.0);
                                dst.fill(0.0);
                            }
                        }
                    }
                    // The weights the output was made of: P, or P ∘ Z with dropout.
                    let used: &[f32] = match &dropout {
                        Some(mask) => {
                            dropped.copy_from_slice(&buf.s);
                            for (r, row) in dropped.chunks_mut(width).enumerate() {
                                mask.apply_row(mask_row(slots, h, beta, r), 0, row);
                            }
                            dropped
                        }
                        None => &buf.s,
                    };
                    // dV_slots = (P ∘ Z)ᵀ dO, added to the slots' value rows.
                    let dv_slots = &mut d_gathered[..width * d_v];
                    matmul(
                        width,
                        d_v,
                        block,
                        dv_slots,
                        d_v,
                        false,
                        used,
                        (1, width),
                        d_o,
                        (d_v, 1),
                        1.0,
                    );
                    scatter_add(dv, dv_slots, index(beta), d_v);
                    // dP = (dO V_slotsᵀ) ∘ Z;  dS = P ∘ (dP − δ), zero where masked: the
                    // bias's gradient, and `scale` times it the product's.
                    matmul(
                        block,
                        width,
                        d_v,
                        dp,
                        width,
                        false,
                        d_o,
                        (d_v, 1),
                        &buf.v,
                        (1, d_v),
                        1.0,
                    );
                    for (r, &delta) in delta.iter().enumerate() {
                        let at = r * width..(r + 1) * width;
                        if let Some(mask) = &dropout {
                            mask.apply_row(mask_row(slots, h, beta, r), 0, &mut dp[at.clone()]);
                        }
                        simd::softmax_grad(&mut dp[at.clone()], &buf.s[at], delta, 1.0);
                    }
                    let pairs = slots.block_pairs(g, beta);
                    for (x, &masked) in dp.iter_mut().zip(&slots.mask[pairs]) {
                        if masked {
                            *x = 0.0;
                        }
                    }
                    if inputs.bias.is_some() {
                        let rows = beta * block * width..(beta + 1) * block * width;
                        d_bias[rows].copy_from_slice(dp);
                    }
                    // dQ_block = dS K_slots, to the block's query rows.
                    matmul(
                        block,
                        d,
                        width,
                        dq_block,
                        d,
                        false,
                        dp,
                        (width, 1),
                        &buf.k,
                        (d, 1),
                        scale,
                    );
                    for (r, pos) in buf.rows.iter().enumerate() {
                        if let Some(i) = *pos {
                            for (a, &b) in dq[i * d..(i + 1) * d]
                                .iter_mut()
                                .zip(&dq_block[r * d..(r + 1) * d])
                            {
                                *a += b;
                            }
                        }
                    }
                    // dK_slots = dSᵀ Q_block, added to the slots' key rows.
                    let dk_slots = &mut d_gathered[..width * d];
                    matmul(
                        width,
                        d,
                        block,
                        dk_slots,
                        d,
                        false,
                        dp,
                        (1, width),
                        &buf.q,
                        (d, 1),
                        scale,
                    );
                    scatter_add(dk, dk_slots, index(beta), d);
                }
            },
        );
    let d_bias = inputs.bias.map(|_| d_bias);
    Gradients { dq, dk, dv, d_bias }
}

/// Adds row `t` of `rows` (`width` wide) to row `index[t]` of `dst`.
fn scatter_add(dst: &mut [f32], rows: &[f32], index: &[i64], width: usize) {
    for (t, &j) in index.iter().enumerate() {
        let j = j as usize;
        for (a, &b) in dst[j * width..(j + 1) * width]
            .iter_mut()
            .zip(&rows[t * width..(t + 1) * width])
        {
            *a += b;
        }
    }
}
