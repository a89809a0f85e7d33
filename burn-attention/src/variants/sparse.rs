//! Sparse Transformer attention: exact softmax attention over a fixed factorised pattern,
//! computed over the pattern's keys only.
//!
//! Child et al. 2019, "Generating Long Sequences with Sparse Transformers", arXiv 1904.10509.
//! Each query `i` attends to the union of two sets of keys (the paper's "merged" heads), with
//! `l` the block (stride) length:
//!
//! - **Fixed** (`sparse`, LRA's `Fixed1Pattern` ∪ `Fixed2Pattern`): its own block,
//!   `⌊j/l⌋ = ⌊i/l⌋`, and the *summary* positions of every block, `j mod l ∈ {0} ∪ [l − c, l)`.
//!   Child et al. define the summary as the last `c` positions; LRA's code also keeps each
//!   block's first position, and so does this module. LRA: `l = 50`, `c = 10`.
//! - **Strided** (`sparse-strided`): the `l − 1` positions on each side, `|i − j| < l`, and
//!   every `l`-th position from it, `(i − j) mod l = 0`.
//!
//! With causal masking (`j <= i`, as the paper's and LRA's patterns always are) the sets keep
//! their earlier half; without it they are symmetric. `O_i = softmax_{j ∈ A(i)}(q_i·k_j/√d) v_j`.
//!
//! Cost per head: fixed O(n (l + n (c + 1)/l) d) time and O(n (l + n (c + 1)/l)) memory (the
//! summaries are a fixed fraction `(c + 1)/l` of the keys, so the pattern stays quadratic, 4.5
//! times sparser than softmax at LRA's setting); strided O(n (l + n/l) d), O(n (l + n/l)),
//! which is O(n √n) at `l ≈ √n`. Masks: padding, causal, an arbitrary attention mask (hiding
//! pairs of the pattern, at the same cost). No cross-attention.
//!
//! The strided pattern is computed as two attentions merged by their log-sum-exp: the band over
//! blocks of consecutive queries, and the stride over queries grouped by their residue mod `l`.

use crate::engines::rotary::rotate_queries_keys;
use crate::variants::prelude::*;
use burn::nn::{Dropout, DropoutConfig};
use serde::{Deserialize, Serialize};

use crate::engines::dropout::dropout;

use crate::kernels::key_slots::KeySlots;

use crate::engines::softmax::exact_softmax_attention;

use crate::engines::gathered_softmax::{
    cache_positions, flags_tensor, gathered_attention, merge_by_log_sum_exp, padding_flags,
    pattern_weights, suffix_lengths,
};

const CAPABILITIES: Capabilities = Capabilities {
    rotary: true,
    attention_mask: true,
    returns_weights: true,
    causal: true,
    weights_sum_to_one: true,
    per_head_form: true,
    prefill_end_padding_only: true,
    ..Capabilities::PADDING_ONLY
};

/// The registry entry of the fixed pattern.
pub const INFO: VariantInfo = VariantInfo {
    name: "sparse",
    paper: "Child et al. 2019, arXiv 1904.10509 (fixed pattern, as LRA)",
    time: "O(n (l + n (c + 1)/l) d)",
    memory: "O(n (l + n (c + 1)/l))",
    capabilities: CAPABILITIES,
};

/// The registry entry of the strided pattern.
pub const INFO_STRIDED: VariantInfo = VariantInfo {
    name: "sparse-strided",
    paper: "Child et al. 2019, arXiv 1904.10509 (strided pattern)",
    time: "O(n (l + n/l) d)",
    memory: "O(n (l + n/l))",
    capabilities: CAPABILITIES,
};

/// The factorised pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SparsePattern {
    /// Own block and every block's summary positions.
    Fixed,
    /// A band of `l − 1` on each side and every `l`-th position.
    Strided,
}

impl SparsePattern {
    /// The registry entry of the variant with this pattern.
    pub fn info(self) -> &'static VariantInfo {
        match self {
            Self::Fixed => &INFO,
            Self::Strided => &INFO_STRIDED,
        }
    }
}

/// Configuration of [`SparseAttention`].
#[derive(Config, Debug)]
pub struct SparseAttentionConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Fixed or strided.
    #[config(default = "SparsePattern::Fixed")]
    pub pattern: SparsePattern,
    /// Block (and stride) length `l` (LRA: 50).
    #[config(default = 50)]
    pub block_size: usize,
    /// Summary positions `c` at the end of each block (fixed pattern; LRA: 10).
    #[config(default = 10)]
    pub summary: usize,
    /// Dropout on the attention weights (default 0: none; on `flex` the fused kernel applies
    /// it itself).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases on the Q, K, V and output projections.
    #[config(default = false)]
    pub bias: bool,
}

impl SparseAttentionConfig {
    fn name(&self) -> &'static str {
        self.pattern.info().name
    }
}

impl VariantConfig for SparseAttentionConfig {
    variant_glue!(SparseAttention, &[INFO, INFO_STRIDED], dropout);

    /// Blocks of 4 with 1 summary position.
    fn small(self) -> Self {
        self.with_block_size(4).with_summary(1)
    }

    fn for_variant(name: &str, model: ModelShape) -> Self {
        let pattern = if name == INFO_STRIDED.name {
            SparsePattern::Strided
        } else {
            SparsePattern::Fixed
        };
        Self::new(model.d_model, model.n_heads).with_pattern(pattern)
    }

    fn info(&self) -> &'static VariantInfo {
        self.pattern.info()
    }

    fn check_fields(&self) -> Result<(), AttentionError> {
        check_at_least_one(self.name(), "block_size", self.block_size)?;
        if self.pattern == SparsePattern::Fixed && self.summary >= self.block_size {
            return Err(AttentionError::field(
                self.name(),
                "summary",
                format!(
                    "must be below block_size ({}), got {}",
                    self.block_size, self.summary
                ),
            ));
        }
        Ok(())
    }

    fn build(&self, device: &Device) -> SparseAttention {
        SparseAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            dropout: DropoutConfig::new(self.dropout).init(),
            pattern: self.pattern,
            block_size: self.block_size,
            summary: self.summary,
        }
    }
}

inherent_config_methods!(SparseAttentionConfig);

/// Multi-head Sparse Transformer attention. Create with [`SparseAttentionConfig`].
#[derive(Module, Debug)]
pub struct SparseAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// Fixed or strided.
    #[module(skip)]
    pub pattern: SparsePattern,
    /// Block (and stride) length.
    #[module(skip)]
    pub block_size: usize,
    /// Summary positions per block.
    #[module(skip)]
    pub summary: usize,
}

projection_shape!(SparseAttention);

impl SparseAttention {
    /// The key sets the queries score, less padding, future keys (causal) and what an attention
    /// mask hides: the fixed pattern's one, or the strided pattern's band and stride (whose
    /// attentions merge into the softmax over their union).
    fn slots(&self, batch: usize, n: usize, masks: &HeadMasks) -> Vec<KeySlots> {
        let padding = padding_flags(&masks.key_pad, batch, n);
        let (l, causal) = (self.block_size, masks.causal);
        let mut sets = match self.pattern {
            SparsePattern::Fixed => vec![fixed_slots(n, l, self.summary, causal, &padding)],
            SparsePattern::Strided => {
                // A band of l >= n keys holds every key: the same slots as one of n.
                let band_l = l.min(n.max(1));
                let after = if causal { 0 } else { band_l - 1 };
                vec![
                    KeySlots::band(n, band_l, [band_l - 1, after], &[], &padding),
                    stride_slots(n, l, causal, &padding),
                ]
            }
        };
        if let Some((flags, shape)) = masks.attention_flags() {
            for slots in &mut sets {
                slots.mask_attention(&flags, shape);
            }
        }
        sets
    }
}

impl AttentionModule for SparseAttention {
    variant_facts!(self.pattern);

    forward_through_projections!();

    rotary_on_projections!();

    /// With rotary positions in `masks`, the queries and keys rotated at them first.
    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        let [batch, _, n, d] = q.dims();
        check_head_input(self.pattern.info(), &q, &k, &masks)?;
        let (q, k) = rotate_queries_keys(q, k, &masks.positions);
        let scale = 1.0 / (d as f32).sqrt();
        let dropout = Some(&self.dropout);
        let mut parts = self.slots(batch, n, &masks).into_iter().map(|slots| {
            gathered_attention(q.clone(), k.clone(), v.clone(), slots, scale, dropout)
        });
        Ok(match (parts.next(), parts.next()) {
            (Some(one), None) => one.out,
            (Some(band), Some(stride)) => merge_by_log_sum_exp(vec![band, stride]).out,
            _ => unreachable!("a pattern has one or two key sets"),
        })
    }

    /// The weights over the pattern's keys, `[batch, heads, n, n]` (0 outside it).
    fn try_forward_with_weights(&self, input: AttentionInput) -> WeightsResult {
        input.check_shapes(self.name(), self.d_model())?;
        if self.proj.rotary && input.is_cross() {
            return Err(rotary_cross_attention(self.name()));
        }
        let masks = self.proj.with_positions(input.head_masks(), input.query());
        let (q, k, v) = self.proj.project(input);
        let [batch, _, n, d] = q.dims();
        check_head_input(self.pattern.info(), &q, &k, &masks)?;
        let (q, k) = rotate_queries_keys(q, k, &masks.positions);
        let slots = self.slots(batch, n, &masks);
        let slots: Vec<&KeySlots> = slots.iter().collect();
        let weights = pattern_weights(q, k, &slots, &[], &masks, 1.0 / (d as f32).sqrt());
        let o = dropout(&self.dropout, weights.clone()).matmul(v);
        Ok((self.proj.out(o), weights))
    }

    /// The causal forward pass over the prompt; its keys and values are the cache.
    fn prefill(&self, x: Tensor<3>) -> DecodeResult {
        check_prompt_shapes(self.name(), self.d_model(), &x, None)?;
        self.proj
            .prefill_full_cache(x, None, |q, k, v, masks| self.attend(q, k, v, masks))
    }

    /// Prompts of different lengths, padded at their end: the causal forward pass; the cache is
    /// every key, the padding marked.
    fn prefill_padded(&self, x: Tensor<3>, mask_pad: Tensor<2, Bool>) -> DecodeResult {
        check_prompt_shapes(self.name(), self.d_model(), &x, Some(&mask_pad))?;
        suffix_lengths(self.name(), &mask_pad)?;
        self.proj
            .prefill_full_cache(x, Some(mask_pad), |q, k, v, masks| {
                self.attend(q, k, v, masks)
            })
    }

    /// Appends the token's key and value to a cache of every key so far and attends over the
    /// cached keys its pattern keeps: O(|A(t)| d) at position t.
    fn decode(&self, x: Tensor<3>, state: DecodingState) -> DecodeResult {
        check_token(self.name(), self.d_model(), &x)?;
        let (q, k, v) = self.proj.qkv_step(x, &state, self.name())?;
        if state.is_padded_cache() {
            let (keys, values, padding) = state.append_to_padded_cache(self.name(), k, v)?;
            return Ok(self.decode_padded(q, keys, values, padding));
        }
        let (keys, values) = state.append_to_cache(self.name(), k, v)?;
        let t = keys.dims()[2] - 1;
        let seen: Vec<i64> = (0..=t)
            .filter(|&j| self.sees(t, j))
            .map(|j| j as i64)
            .collect();
        let count = seen.len();
        let index = Tensor::<1, Int>::from_data(TensorData::new(seen, [count]), &q.device());
        let o = exact_softmax_attention(
            q,
            keys.clone().select(2, index.clone()),
            values.clone().select(2, index),
            None,
            false,
            None,
        );
        Ok((
            self.proj.out(o),
            DecodingState::KeyValueCache {
                keys,
                values,
                padding: None,
            },
        ))
    }
}

impl SparseAttention {
    /// A step over the cache of prompts of different lengths ([`prefill_padded`]): each row's
    /// positions read from its padding, the keys outside the token's pattern masked. O(t d) at
    /// position t (the whole cache is scored, the pattern as a mask).
    ///
    /// [`prefill_padded`]: AttentionModule::prefill_padded
    fn decode_padded(
        &self,
        q: Tensor<4>,
        keys: Tensor<4>,
        values: Tensor<4>,
        padding: Option<Tensor<2, Bool>>,
    ) -> (Tensor<3>, DecodingState) {
        let [batch, _, columns, _] = keys.dims();
        let positions = cache_positions(&padding_flags(&padding, batch, columns));
        let hidden: Vec<Vec<bool>> = positions
            .iter()
            .map(|row| {
                // The token's own column is the last, never padding.
                let t = row.last().copied().flatten().unwrap_or(0);
                row.iter()
                    .map(|j| j.is_none_or(|j| !self.sees(t, j)))
                    .collect()
            })
            .collect();
        let o = exact_softmax_attention(
            q,
            keys.clone(),
            values.clone(),
            Some(flags_tensor(&hidden, &keys.device())),
            false,
            None,
        );
        let state = DecodingState::KeyValueCache {
            keys,
            values,
            padding,
        };
        (self.proj.out(o), state)
    }

    /// Whether query `i` sees key `j <= i` in the causal pattern.
    fn sees(&self, i: usize, j: usize) -> bool {
        let l = self.block_size;
        match self.pattern {
            SparsePattern::Fixed => {
                i / l == j / l || j.is_multiple_of(l) || j % l >= l - self.summary.min(l - 1)
            }
            SparsePattern::Strided => i - j < l || (i - j).is_multiple_of(l),
        }
    }
}

/// The summary positions of a sequence of `n`: `j mod l = 0` or `j mod l >= l - c`.
fn summaries(n: usize, l: usize, c: usize) -> Vec<usize> {
    (0..n).filter(|j| j % l == 0 || j % l >= l - c).collect()
}

/// Block `β` of `l` queries scores its own `l` keys, then every summary position outside it
/// (masked where it lies inside, or, causal, after it).
fn fixed_slots(n: usize, l: usize, c: usize, causal: bool, padding: &[Vec<bool>]) -> KeySlots {
    let l = l.min(n.max(1));
    let summary = summaries(n, l, c.min(l - 1));
    let n_blocks = n.div_ceil(l);
    let mut slots = KeySlots::masked([padding.len(), 1], n_blocks, l, l + summary.len());
    for (g, pad) in padding.iter().enumerate() {
        for beta in 0..n_blocks {
            for s in 0..l {
                let j = beta * l + s;
                if j < n && !pad[j] {
                    slots.set(g, beta, s, j, |r| !causal || s <= r);
                }
            }
            for (t, &j) in summary.iter().enumerate() {
                // Before the block (and, without causal masking, after it).
                let outside = j / l < beta || (!causal && j / l > beta);
                if outside && !pad[j] {
                    slots.set(g, beta, l + t, j, |_| true);
                }
            }
        }
    }
    slots
}

/// The queries grouped by residue mod `l` (block `r` holds positions `r, r + l, r + 2l, ...`),
/// each scoring the keys of its residue other than itself (causal: the earlier ones).
fn stride_slots(n: usize, l: usize, causal: bool, padding: &[Vec<bool>]) -> KeySlots {
    let l = l.min(n.max(1));
    let per_class = n.div_ceil(l);
    let mut slots = KeySlots::masked([padding.len(), 1], l, per_class, per_class);
    for (g, pad) in padding.iter().enumerate() {
        for r in 0..l {
            for t in 0..per_class {
                let j = r + t * l;
                if j < n && !pad[j] {
                    slots.set(g, r, t, j, |u| u != t && (!causal || t < u));
                }
            }
        }
    }
    // Row `r · per_class + u` holds position `r + u · l` (positions past `n` are padding rows).
    slots.query_order = Some(
        (0..padding.len())
            .flat_map(|_| (0..l).flat_map(move |r| (0..per_class).map(move |u| (r + u * l) as i64)))
            .collect(),
    );
    slots
}
