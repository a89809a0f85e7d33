//! Attention over the segments of a sequence, each segment's queries over a gradient-stopped
//! memory of the positions before it and over itself, with Transformer-XL's relative score
//! (Dai et al. 2019): the shared step of Transformer-XL and of the Compressive Transformer, which
//! puts compressed memories before the memory ([`SegmentPrefix`]).
//!
//! `A_ij = (q_i + u)ᵀ k_j + (q_i + v)ᵀ W_R R_{i−j}`, over `√d`, `R` the sinusoids of the
//! distance (sines, then cosines) and `W_R`, `u`, `v` learned ([`RelativeScore`]). Over the
//! memory and the segment, `i − j` is the distance of the two positions; the prefix's slots
//! follow one another before the memory's `mem_len` positions, its newest at distance
//! `ρ + mem_len + 1` from the segment's query `ρ` (the keys in the order a segment sees them:
//! prefix, memory, segment).

use burn::module::Param;
use burn::nn::{Dropout, Initializer, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::Distribution;

use crate::contract::input::zeros_after;
use crate::engines::gathered_softmax::biased_gathered_attention;
use crate::engines::heads::split_heads;
use crate::engines::params::lazy_param;
use crate::kernels;
use crate::kernels::key_slots::KeySlots;

/// Transformer-XL's relative score's parameters.
#[derive(Debug, Clone, Copy)]
pub struct RelativeScore<'a> {
    /// `W_R`, the projection of the distances' sinusoids.
    pub r_net: &'a Linear,
    /// `u`, `[heads, d_head]`, added to the queries against keys.
    pub r_w_bias: &'a Param<Tensor<2>>,
    /// `v`, `[heads, d_head]`, added to the queries against distances.
    pub r_r_bias: &'a Param<Tensor<2>>,
}

/// Fresh parameters of the relative score for `n_heads` heads of `d_model`: `W_R`
/// (Xavier-uniform, no bias), and `u`, `v` drawn from N(0, 0.02²), built lazily.
pub fn relative_score_params(
    d_model: usize,
    n_heads: usize,
    device: &Device,
) -> (Linear, Param<Tensor<2>>, Param<Tensor<2>>) {
    let (h, d) = (n_heads, d_model / n_heads);
    let bias =
        move |device: &Device| Tensor::random([h, d], Distribution::Normal(0.0, 0.02), device);
    (
        LinearConfig::new(d_model, d_model)
            .with_bias(false)
            .with_initializer(Initializer::XavierUniform { gain: 1.0 })
            .init(device),
        lazy_param([h, d], device, true, bias),
        lazy_param([h, d], device, true, bias),
    )
}

/// A per-head bias `[heads, d]` as `[1, heads, 1, d]`.
fn per_head(bias: &Param<Tensor<2>>) -> Tensor<4> {
    let [h, d] = bias.val().dims();
    bias.val().reshape([1, h, 1, d])
}

impl RelativeScore<'_> {
    /// `(q + u) / √d`, the queries against keys: `q: [batch, heads, rows, d]`.
    pub fn content_queries(&self, q: Tensor<4>) -> Tensor<4> {
        let d = q.dims()[3];
        (q + per_head(self.r_w_bias)).mul_scalar(1.0 / (d as f32).sqrt())
    }

    /// `(q + v) · W_R R_δ / √d` for the distances `δ = first, first + 1, …`, `count` of them:
    /// `[batch, heads, rows, count]`.
    pub fn position_scores(&self, q: Tensor<4>, first: i64, count: usize) -> Tensor<4> {
        let [_, heads, _, d] = q.dims();
        let d_model = heads * d;
        let r = sinusoids(first, count, d_model, &q.device());
        // `[1, heads, count, d]`, broadcast over the batch by the product. Not expanded first:
        // on wgpu (Burn 0.22.1) the gradient of an expanded tensor read through `swap_dims` is
        // summed wrongly (W_R's gradient was off by more than its size).
        let positions = split_heads(self.r_net.forward(r.unsqueeze_dim::<3>(0)), heads);
        (q + per_head(self.r_r_bias))
            .matmul(positions.swap_dims(2, 3))
            .mul_scalar(1.0 / (d as f32).sqrt())
    }

    /// [`position_scores`](Self::position_scores) from the queries' side,
    /// `((q + v) W_R,hᵀ) · R_δ / √d` with `W_R,h` the head's columns of `W_R`: `rows · d_model ·
    /// (d_model + count)` a head, where projecting every distance's sinusoids takes `count ·
    /// d_model²` whatever the rows. What decoding one token needs; equal up to rounding.
    pub fn position_scores_by_query(&self, q: Tensor<4>, first: i64, count: usize) -> Tensor<4> {
        let [batch, heads, rows, d] = q.dims();
        let d_model = heads * d;
        let device = q.device();
        // Each head's `q + v` in its own column of a `[d_model, heads]` matrix (zeros elsewhere),
        // so that `W_R` (`[d_model (sinusoid), d_model (heads × d)]`) applies as it is stored:
        // `W_R X` holds every head's `W_R,h (q + v)`, `[batch, rows, d_model, heads]`.
        let own_head = Tensor::<2>::eye(heads, &device)
            .reshape([heads, 1, heads])
            .expand([heads, d, heads])
            .reshape([1, 1, d_model, heads]);
        let columns = (q + per_head(self.r_r_bias))
            .swap_dims(1, 2)
            .reshape([batch, rows, d_model, 1])
            * own_head;
        let projected = self
            .r_net
            .weight
            .val()
            .reshape([1, 1, d_model, d_model])
            .matmul(columns);
        let r = sinusoids(first, count, d_model, &device).reshape([1, 1, count, d_model]);
        r.matmul(projected) // [batch, rows, count, heads]
            .permute([0, 3, 1, 2])
            .mul_scalar(1.0 / (d as f32).sqrt())
    }
}

/// `R_δ` for the distances `δ = first, first + 1, …`, `count` of them: `[count, d_model]`,
/// `sin(δ / 10000^{2f/d_model})` for `f < d_model / 2`, then the cosines, computed in `f64`.
fn sinusoids(first: i64, count: usize, d_model: usize, device: &Device) -> Tensor<2> {
    let half = d_model / 2;
    let scales: Vec<f64> = (0..half)
        .map(|f| 10000f64.powf(2.0 * f as f64 / d_model as f64))
        .collect();
    let mut r = Vec::with_capacity(count * d_model);
    for c in 0..count {
        let delta = (first + c as i64) as f64;
        r.extend(scales.iter().map(|scale| (delta / scale).sin() as f32));
        r.extend(scales.iter().map(|scale| (delta / scale).cos() as f32));
    }
    Tensor::from_data(TensorData::new(r, [count, d_model]), device)
}

/// How a sequence of `n` positions is cut: segments of `s = min(segment_len, n)`, `blocks` of
/// them, and a memory of `memory_blocks` whole segments before each (none with one segment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentLayout {
    /// Positions per segment.
    pub s: usize,
    /// Segments.
    pub blocks: usize,
    /// Whole segments of memory before each segment.
    pub memory_blocks: usize,
    /// The memory's positions, `mem_len` (its oldest `memory_blocks · s − mem_len` masked).
    pub mem_len: usize,
}

impl SegmentLayout {
    /// The layout of `n` positions in segments of `segment_len` with `mem_len` of memory.
    pub fn new(n: usize, segment_len: usize, mem_len: usize) -> Self {
        let s = segment_len.min(n);
        let blocks = n.div_ceil(s);
        let memory_blocks = if blocks > 1 { mem_len.div_ceil(s) } else { 0 };
        Self {
            s,
            blocks,
            memory_blocks,
            mem_len,
        }
    }
}

/// Keys each segment sees before its memory (the Compressive Transformer's compressed memory),
/// oldest first.
#[derive(Debug, Clone)]
pub struct SegmentPrefix {
    /// `[batch, heads, blocks, p, d]`.
    pub keys: Tensor<5>,
    /// `[batch, heads, blocks, p, d]`.
    pub values: Tensor<5>,
    /// `[groups, blocks, p]` flattened, `true` = not seen: one group per sequence where the
    /// batch has padding, one shared group otherwise.
    pub missing: Vec<bool>,
}

/// Each segment's queries over its prefix, its memory (the keys and values of the positions
/// before it, `k_mem` and `v_mem`, gradient stopped by the caller) and itself (up to each query
/// when `causal`), one softmax: `q`, `k`, `v` `[batch, heads, n, d]` in, `[batch, heads, n, d]`
/// out. `padding[b][j]` (`true` = padding; `None`: no padding) is read on the host, where the
/// mask over the scores is built.
///
/// Each segment is a block of queries of the gathered softmax (`biased_gathered_attention`):
/// its key slots are its window (prefix, memory, segment), and the relative-position scores are
/// the learned bias. On `flex` that is one fused kernel with its own backward, which keeps no
/// score; elsewhere the composed gather, products and softmax.
#[allow(clippy::too_many_arguments)]
pub fn segment_attention(
    score: RelativeScore<'_>,
    layout: SegmentLayout,
    (q, k, v): (Tensor<4>, Tensor<4>, Tensor<4>),
    (k_mem, v_mem): (Tensor<4>, Tensor<4>),
    prefix: Option<SegmentPrefix>,
    padding: Option<&[Vec<bool>]>,
    causal: bool,
    weight_dropout: &Dropout,
) -> Tensor<4> {
    let [batch, heads, n, _] = q.dims();
    let SegmentLayout {
        s,
        blocks: nb,
        memory_blocks: mb,
        mem_len,
    } = layout;
    let np = nb * s;
    let mp = mb * s;
    let p = prefix.as_ref().map_or(0, |prefix| prefix.keys.dims()[3]);
    let groups = padding.map_or(1, <[Vec<bool>]>::len);
    // The keys and values the slots point into: the prefix's `p` slots of each segment, segment
    // after segment, then the memory's `n` positions, then the sequence's own `n`.
    let (prefix_keys, prefix_values, prefix_missing) = match prefix {
        Some(SegmentPrefix {
            keys,
            values,
            missing,
        }) => (Some(keys), Some(values), missing),
        None => (None, None, Vec::new()),
    };
    debug_assert_eq!(
        prefix_missing.len(),
        groups * nb * p,
        "a prefix mask a group"
    );
    let stacked = |prefix: Option<Tensor<5>>, memory: Tensor<4>, own: Tensor<4>| {
        let width = own.dims()[3];
        let mut parts: Vec<Tensor<4>> = prefix
            .map(|x| x.reshape([batch, heads, nb * p, width]))
            .into_iter()
            .collect();
        parts.extend([memory, own]);
        Tensor::cat(parts, 2)
    };
    let keys = stacked(prefix_keys, k_mem, k);
    let values = stacked(prefix_values, v_mem, v);
    let width = p + mp + s;
    // Query ρ over slot σ of its segment's window: over the memory and the segment, distance
    // δ = ρ − (σ − p − mp), from −(s − 1) to mp + s − 1; over the prefix, its k-th newest slot
    // (k = p − σ) sits k places before the memory's mem_len positions, δ = ρ + mem_len + k.
    let first = -(s as i64 - 1);
    let farthest = if p > 0 { mp.max(mem_len + p) } else { mp };
    let count = farthest + 2 * s - 1;
    let mut index = Vec::with_capacity(s * width);
    let mut hidden = Vec::with_capacity(s * width);
    for rho in 0..s as i64 {
        for sigma in 0..width as i64 {
            if sigma < p as i64 {
                index.push(rho + (mem_len + p) as i64 - sigma - first);
                hidden.push(false);
                continue;
            }
            let delta = rho - (sigma - (p + mp) as i64);
            index.push(delta - first);
            let too_old = delta > mem_len as i64 + rho;
            hidden.push(too_old || (causal && delta < 0));
        }
    }
    let position = kernels::gather_shared(
        score
            .position_scores(zeros_after(q.clone(), 2, np - n), first, count)
            .reshape([batch, heads, nb, s, count]),
        &index,
        width,
    )
    .reshape([batch, heads, np, width]);
    let slots = window_slots(layout, (n, p), padding, &prefix_missing, &hidden);
    biased_gathered_attention(
        score.content_queries(q),
        keys,
        values,
        position,
        slots,
        1.0,
        Some(weight_dropout),
    )
    .out
}

/// Each segment's window as key slots of the stacked keys (the prefix's `nb · p` slots, the
/// memory's `n` positions, the sequence's `n`), one group per sequence where there is padding.
/// Slot `σ ≥ p` of segment `τ` is position `(τ − mb) s + σ − p`, read from the memory for
/// `σ < p + mp` and from the sequence after: before the sequence, after it, or padded, it is
/// masked, as are the prefix's missing slots and the pairs `hidden` (`[s, width]`: too old,
/// or ahead of a causal query) holds.
fn window_slots(
    layout: SegmentLayout,
    (n, p): (usize, usize),
    padding: Option<&[Vec<bool>]>,
    prefix_missing: &[bool],
    hidden: &[bool],
) -> KeySlots {
    let SegmentLayout {
        s,
        blocks: nb,
        memory_blocks: mb,
        ..
    } = layout;
    let mp = mb * s;
    let width = p + mp + s;
    let groups = padding.map_or(1, <[Vec<bool>]>::len);
    let mut slots = KeySlots::masked([groups, 1], nb, s, width);
    for g in 0..groups {
        let pad = padding.map(|padding| &padding[g]);
        for tau in 0..nb {
            for sigma in 0..width {
                let (at, missing) = match sigma.checked_sub(p) {
                    None => (tau * p + sigma, prefix_missing[(g * nb + tau) * p + sigma]),
                    Some(at) => match (tau * s + at).checked_sub(mp) {
                        Some(j) if j < n && pad.is_none_or(|pad| !pad[j]) => {
                            let own = if at < mp { 0 } else { n };
                            (nb * p + own + j, false)
                        }
                        _ => (0, true),
                    },
                };
                slots.set(g, tau, sigma, at, |rho| {
                    !missing && !hidden[rho * width + sigma]
                });
            }
        }
    }
    slots
}
