//! Local attention: exact softmax attention restricted to a neighbourhood of each query, computed
//! over the neighbourhood only.
//!
//! - **Blocks** (`local`, the "Local Attention" row of LRA's Table 1, Tay et al. 2021, arXiv
//!   2011.04006, after Parmar et al. 2018, arXiv 1802.05751): the sequence is cut into
//!   non-overlapping blocks of `block_size` positions and each query attends to the keys of its
//!   own block: `O_i = softmax_{j ∈ B(i)}(q_i·k_j/√d) v_j`, `B(i) = {j : ⌊j/b⌋ = ⌊i/b⌋}`. LRA's
//!   configs use b = 50.
//! - **Sliding window** (`local-window`, the window of Longformer, Beltagy et al. 2020, and of
//!   the `local-attention` package with an exact window): each query attends to the `window`
//!   positions on each side of it and itself, `|i − j| <= w`.
//!
//! With causal masking a query also drops the keys after it (`j <= i`). Padded keys are dropped.
//!
//! Cost per head: blocks O(n b d) time and O(n b) memory; the window O(n w d) and O(n w): the
//! queries go in blocks of ⌈w/2⌉ that score the ⌈w/2⌉ + 2w positions around them (w + ⌈w/2⌉
//! causal), about 1.25 times the pairs attended. Masks: padding, causal, an arbitrary
//! attention mask (hiding pairs of the pattern, at the same cost); decoding token by token with
//! a cache of the neighbourhood only. No cross-attention (the pattern relates query
//! and key positions).
//!
//! Rotary positions (RoFormer) rotate the queries and keys at their positions before the
//! neighbourhood is scored. The decoding cache keeps its keys unrotated and a step rotates them
//! at their places in the cache, the token at the last: a score depends on positions only
//! through their difference, so the trimmed cache needs no count of the tokens before it.

use crate::variants::prelude::*;
use burn::nn::{Dropout, DropoutConfig};
use serde::{Deserialize, Serialize};

use crate::engines::dropout::dropout;

use crate::kernels::key_slots::KeySlots;

use crate::engines::rotary::{real_positions, rotate_queries_keys, rotate_roformer};
use crate::engines::softmax::exact_softmax_attention;

use crate::engines::gathered_softmax::{
    gathered_attention, padding_flags, pattern_weights, suffix_lengths, trimmed_cache,
};

const CAPABILITIES: Capabilities = Capabilities {
    attention_mask: true,
    returns_weights: true,
    causal: true,
    weights_sum_to_one: true,
    per_head_form: true,
    prefill_end_padding_only: true,
    rotary: true,
    ..Capabilities::PADDING_ONLY
};

/// The registry entry of block-local attention.
pub const INFO: VariantInfo = VariantInfo {
    name: "local",
    paper: "Tay et al. 2021 (LRA), arXiv 2011.04006; Parmar et al. 2018, arXiv 1802.05751",
    time: "O(n b d)",
    memory: "O(n b)",
    capabilities: CAPABILITIES,
};

/// The registry entry of sliding-window attention.
pub const INFO_WINDOW: VariantInfo = VariantInfo {
    name: "local-window",
    paper: "Beltagy et al. 2020, arXiv 2004.05150 (sliding window)",
    time: "O(n w d)",
    memory: "O(n w)",
    capabilities: CAPABILITIES,
};

/// Which neighbourhood a query sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LocalForm {
    /// The keys of its own block of `block_size` positions.
    Blocks,
    /// The `window` positions on each side of it, and itself.
    SlidingWindow,
}

impl LocalForm {
    /// The registry entry of the variant with this form.
    pub fn info(self) -> &'static VariantInfo {
        match self {
            Self::Blocks => &INFO,
            Self::SlidingWindow => &INFO_WINDOW,
        }
    }
}

/// Configuration of [`LocalAttention`].
#[derive(Config, Debug)]
pub struct LocalAttentionConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Blocks or a sliding window.
    #[config(default = "LocalForm::Blocks")]
    pub form: LocalForm,
    /// Positions per block (`Blocks`; LRA: 50).
    #[config(default = 50)]
    pub block_size: usize,
    /// Positions seen on each side (`SlidingWindow`).
    #[config(default = 128)]
    pub window: usize,
    /// Dropout on the attention weights (default 0: none; on `flex` the fused kernel applies
    /// it itself).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases on the Q, K, V and output projections.
    #[config(default = false)]
    pub bias: bool,
}

impl LocalAttentionConfig {
    fn name(&self) -> &'static str {
        self.form.info().name
    }
}

impl VariantConfig for LocalAttentionConfig {
    variant_glue!(LocalAttention, &[INFO, INFO_WINDOW], dropout);

    /// Blocks of 4, windows of 2 positions on each side.
    fn small(self) -> Self {
        self.with_block_size(4).with_window(2)
    }

    fn for_variant(name: &str, model: ModelShape) -> Self {
        let form = if name == INFO_WINDOW.name {
            LocalForm::SlidingWindow
        } else {
            LocalForm::Blocks
        };
        Self::new(model.d_model, model.n_heads).with_form(form)
    }

    fn info(&self) -> &'static VariantInfo {
        self.form.info()
    }

    fn check_fields(&self) -> Result<(), AttentionError> {
        match self.form {
            LocalForm::Blocks if self.block_size == 0 => Err(AttentionError::field(
                self.name(),
                "block_size",
                "must be at least 1",
            )),
            LocalForm::SlidingWindow if self.window == 0 => Err(AttentionError::field(
                self.name(),
                "window",
                "must be at least 1",
            )),
            _ => Ok(()),
        }
    }

    fn build(&self, device: &Device) -> LocalAttention {
        LocalAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            dropout: DropoutConfig::new(self.dropout).init(),
            form: self.form,
            block_size: self.block_size,
            window: self.window,
        }
    }
}

inherent_config_methods!(LocalAttentionConfig);

/// Multi-head local attention (blocks or a sliding window). Create with
/// [`LocalAttentionConfig`].
#[derive(Module, Debug)]
pub struct LocalAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// Blocks or a sliding window.
    #[module(skip)]
    pub form: LocalForm,
    /// Positions per block.
    #[module(skip)]
    pub block_size: usize,
    /// Positions seen on each side.
    #[module(skip)]
    pub window: usize,
}

projection_shape!(LocalAttention);

impl LocalAttention {
    /// The keys each block of queries scores: the block or window, less padding, future keys
    /// (causal) and what an attention mask hides.
    fn slots(&self, batch: usize, n: usize, masks: &HeadMasks) -> KeySlots {
        let padding = padding_flags(&masks.key_pad, batch, n);
        let mut slots = match self.form {
            LocalForm::Blocks => block_slots(n, self.block_size, masks.causal, &padding),
            LocalForm::SlidingWindow => window_slots(n, self.window, masks.causal, &padding),
        };
        if let Some((flags, shape)) = masks.attention_flags() {
            slots.mask_attention(&flags, shape);
        }
        slots
    }
}

impl AttentionModule for LocalAttention {
    variant_facts!(self.form);

    forward_through_projections!();

    rotary_on_projections!();

    /// With rotary positions in `masks`, the queries and keys rotated at them first.
    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        let [batch, _, n, d] = q.dims();
        check_head_input(self.form.info(), &q, &k, &masks)?;
        let (q, k) = rotate_queries_keys(q, k, &masks.positions);
        let slots = self.slots(batch, n, &masks);
        let scale = 1.0 / (d as f32).sqrt();
        Ok(gathered_attention(q, k, v, slots, scale, Some(&self.dropout)).out)
    }

    /// The weights over the keys of the block or window, `[batch, heads, n, n]` (0 outside it).
    fn try_forward_with_weights(&self, input: AttentionInput) -> WeightsResult {
        input.check_shapes(self.name(), self.d_model())?;
        if self.proj.rotary && input.is_cross() {
            return Err(rotary_cross_attention(self.name()));
        }
        let masks = self.proj.with_positions(input.head_masks(), input.query());
        let (q, k, v) = self.proj.project(input);
        let [batch, _, n, d] = q.dims();
        check_head_input(self.form.info(), &q, &k, &masks)?;
        let (q, k) = rotate_queries_keys(q, k, &masks.positions);
        let slots = self.slots(batch, n, &masks);
        let weights = pattern_weights(q, k, &[&slots], &[], &masks, 1.0 / (d as f32).sqrt());
        let o = dropout(&self.dropout, weights.clone()).matmul(v);
        Ok((self.proj.out(o), weights))
    }

    /// The causal forward pass over the prompt; the cache is its neighbourhood of the last
    /// position, as decoding leaves it: the last block's keys so far, or the last `window`
    /// (unrotated, with rotary positions).
    fn prefill(&self, x: Tensor<3>) -> DecodeResult {
        check_prompt_shapes(self.name(), self.d_model(), &x, None)?;
        let masks = self.proj.with_positions(HeadMasks::new(None, true), &x);
        let (q, k, v) = self.proj.qkv(x);
        let o = self.attend(q, k.clone(), v.clone(), masks)?;
        let n = k.dims()[2];
        let kept = match self.form {
            LocalForm::Blocks => (n - 1) % self.block_size + 1,
            LocalForm::SlidingWindow => n.min(self.window),
        };
        let recent = |x: Tensor<4>| x.slice(s![.., .., n - kept..]);
        Ok((
            self.proj.out(o),
            DecodingState::KeyValueCache {
                keys: recent(k),
                values: recent(v),
                padding: None,
            },
        ))
    }

    /// Prompts of different lengths, padded at their end: the causal forward pass, and a cache
    /// whose unmasked keys are, in each row, the ones the prompt's next token sees besides itself
    /// (the rest marked as padding, the columns no row needs cut off).
    fn prefill_padded(&self, x: Tensor<3>, mask_pad: Tensor<2, Bool>) -> DecodeResult {
        check_prompt_shapes(self.name(), self.d_model(), &x, Some(&mask_pad))?;
        let lengths = suffix_lengths(self.name(), &mask_pad)?;
        let n = mask_pad.dims()[1];
        let masks = self
            .proj
            .with_positions(HeadMasks::new(Some(mask_pad), true), &x);
        let (q, k, v) = self.proj.qkv(x);
        let o = self.attend(q, k.clone(), v.clone(), masks)?;
        let unseen = lengths
            .iter()
            .map(|&len| {
                let seen = match self.form {
                    LocalForm::Blocks => len % self.block_size,
                    LocalForm::SlidingWindow => len.min(self.window),
                };
                (0..n).map(|j| j >= len || j + seen < len).collect()
            })
            .collect();
        Ok((self.proj.out(o), trimmed_cache(k, v, unseen)))
    }

    /// Attends over a key/value cache that holds only the neighbourhood: the current block's
    /// keys so far (emptied when a block is full), or the last `window` keys. A step costs
    /// O(b d) or O(w d) and the state stays that size, however long the sequence.
    fn decode(&self, x: Tensor<3>, state: DecodingState) -> DecodeResult {
        check_token(self.name(), self.d_model(), &x)?;
        let (q, k, v) = self.proj.qkv(x);
        if state.is_padded_cache() {
            let (keys, values, padding) = state.append_to_padded_cache(self.name(), k, v)?;
            return Ok(self.decode_padded(q, keys, values, padding));
        }
        let state = match state {
            // A full block: the token starts the next one.
            DecodingState::KeyValueCache { keys, .. }
                if self.form == LocalForm::Blocks && keys.dims()[2] >= self.block_size =>
            {
                DecodingState::Empty
            }
            state => state,
        };
        let (keys, values) = state.append_to_cache(self.name(), k, v)?;
        let (q_at, keys_at) = self.rotated_in_cache(q, keys.clone(), &None);
        let o = exact_softmax_attention(q_at, keys_at, values.clone(), None, false, None);
        let (keys, values) = match self.form {
            LocalForm::Blocks => (keys, values),
            LocalForm::SlidingWindow => {
                let seen = keys.dims()[2];
                let from = seen.saturating_sub(self.window);
                (
                    keys.slice(s![.., .., from..]),
                    values.slice(s![.., .., from..]),
                )
            }
        };
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

impl LocalAttention {
    /// A decoded token's query `q` and the cached `keys` (`[batch, heads, t, d]`, the token's
    /// own last, `padding` marking the cached keys of a row it does not see), rotated at their
    /// places among a row's unmasked keys where rotary positions are on; unchanged otherwise.
    fn rotated_in_cache(
        &self,
        q: Tensor<4>,
        keys: Tensor<4>,
        padding: &Option<Tensor<2, Bool>>,
    ) -> (Tensor<4>, Tensor<4>) {
        if !self.proj.rotary {
            return (q, keys);
        }
        let [batch, _, t, _] = keys.dims();
        let positions = real_positions(padding, batch, t, &keys.device());
        let own = positions.clone().slice(s![.., t - 1..t]);
        (rotate_roformer(q, own), rotate_roformer(keys, positions))
    }

    /// A step over the cache of prompts of different lengths ([`prefill_padded`]): the token
    /// attends to the unmasked keys (and itself), then each row keeps unmasked the keys its next
    /// token sees: the last `window`, or the block so far (none once the block is full).
    ///
    /// [`prefill_padded`]: AttentionModule::prefill_padded
    fn decode_padded(
        &self,
        q: Tensor<4>,
        keys: Tensor<4>,
        values: Tensor<4>,
        padding: Option<Tensor<2, Bool>>,
    ) -> (Tensor<3>, DecodingState) {
        let (q_at, keys_at) = self.rotated_in_cache(q, keys.clone(), &padding);
        let o =
            exact_softmax_attention(q_at, keys_at, values.clone(), padding.clone(), false, None);
        let [batch, _, columns, _] = keys.dims();
        let mut unseen = padding_flags(&padding, batch, columns);
        for row in &mut unseen {
            let seen: Vec<usize> = (0..columns).filter(|&j| !row[j]).collect();
            let keep = match self.form {
                LocalForm::Blocks if seen.len() >= self.block_size => 0,
                LocalForm::Blocks => seen.len(),
                LocalForm::SlidingWindow => seen.len().min(self.window),
            };
            for &j in &seen[..seen.len() - keep] {
                row[j] = true;
            }
        }
        (self.proj.out(o), trimmed_cache(keys, values, unseen))
    }
}

/// Each query sees the keys of its own block of `b` (and, causal, not those after it).
fn block_slots(n: usize, b: usize, causal: bool, padding: &[Vec<bool>]) -> KeySlots {
    let b = b.min(n.max(1));
    let n_blocks = n.div_ceil(b);
    let mut slots = KeySlots::masked([padding.len(), 1], n_blocks, b, b);
    for (g, pad) in padding.iter().enumerate() {
        for beta in 0..n_blocks {
            for s in 0..b {
                let j = beta * b + s;
                if j < n && !pad[j] {
                    slots.set(g, beta, s, j, |r| !causal || s <= r);
                }
            }
        }
    }
    slots
}

/// Each query sees the keys within `w` of it (causal: the `w` before it), in blocks of ⌈w/2⌉
/// queries.
fn window_slots(n: usize, w: usize, causal: bool, padding: &[Vec<bool>]) -> KeySlots {
    // A window wider than the sequence holds every key: the same slots as one of width n.
    let w = w.min(n);
    let after = if causal { 0 } else { w };
    KeySlots::band(n, w.div_ceil(2), [w, after], &[], padding)
}
