//! Exact softmax attention, the baseline every other variant is measured against.
//!
//! `O = softmax(Q Kᵀ / √d + M) V` (Vaswani et al. 2017, arXiv 1706.03762), the softmax over the
//! keys, `M` a large negative fill on padded or future keys. Cost: O(n² d) time and O(n²) memory
//! per head (O(n) on the fused kernels of `flex` and `tch`). Masks: padding, causal, and an
//! arbitrary `[batch, n_q, n_k]` attention mask (on the composed steps, which keep the `n × n`
//! weights); cross-attention; its weights on request; decoding with a key/value cache.

use crate::engines::rotary::rotate_queries_keys;
use crate::variants::prelude::*;
use burn::nn::{Dropout, DropoutConfig};

use crate::engines::softmax::{exact_softmax_attention, softmax_attention_with_weights};

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "softmax",
    paper: "Vaswani et al. 2017, arXiv 1706.03762",
    time: "O(n² d)",
    memory: "O(n²); O(n) fused",
    capabilities: Capabilities {
        attention_mask: true,
        returns_weights: true,
        causal: true,
        cross_attention: true,
        rotary: true,
        weights_sum_to_one: true,
        per_head_form: true,
        ..Capabilities::PADDING_ONLY
    },
};

/// Configuration of [`SoftmaxAttention`].
#[derive(Config, Debug)]
pub struct SoftmaxAttentionConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Dropout on the attention weights (default 0: none). In training on `flex` the fused
    /// kernel drops weights itself; on `tch`, whose CPU flash kernel has no dropout, a non-zero
    /// value runs the composed steps instead, which keep the n × n weights for the backward pass
    /// (several times slower and memory quadratic in n).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases on the Q, K, V and output projections (the LRA reference has none).
    #[config(default = false)]
    pub bias: bool,
}

impl VariantConfig for SoftmaxAttentionConfig {
    variant_glue!(SoftmaxAttention, &[INFO], new(d_model, n_heads), dropout);

    fn build(&self, device: &Device) -> SoftmaxAttention {
        SoftmaxAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            dropout: DropoutConfig::new(self.dropout).init(),
        }
    }
}

inherent_config_methods!(SoftmaxAttentionConfig);

/// Multi-head exact softmax attention. Create with [`SoftmaxAttentionConfig`].
#[derive(Module, Debug)]
pub struct SoftmaxAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
}

projection_shape!(SoftmaxAttention);

impl AttentionModule for SoftmaxAttention {
    variant_facts!(INFO);

    forward_through_projections!();

    rotary_on_projections!();

    /// With rotary positions in `masks`, the queries and keys rotated at them first.
    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        check_head_input(&INFO, &q, &k, &masks)?;
        let (q, k) = rotate_queries_keys(q, k, &masks.positions);
        if masks.attn.is_some() {
            return Ok(softmax_attention_with_weights(q, k, v, &masks, Some(&self.dropout)).0);
        }
        Ok(exact_softmax_attention(
            q,
            k,
            v,
            masks.key_pad,
            masks.causal,
            Some(&self.dropout),
        ))
    }

    /// The weights `[batch, heads, n_q, n_k]`, formed by the composed steps (which keep them;
    /// the output is the same as [`try_forward`](AttentionModule::try_forward)'s).
    fn try_forward_with_weights(&self, input: AttentionInput) -> WeightsResult {
        input.check_shapes(self.name(), self.d_model())?;
        if self.proj.rotary && input.is_cross() {
            return Err(rotary_cross_attention(INFO.name));
        }
        let masks = self.proj.with_positions(input.head_masks(), input.query());
        let (q, k, v) = self.proj.project(input);
        check_head_input(&INFO, &q, &k, &masks)?;
        let (q, k) = rotate_queries_keys(q, k, &masks.positions);
        let (o, weights) = softmax_attention_with_weights(q, k, v, &masks, Some(&self.dropout));
        Ok((self.proj.out(o), weights))
    }

    /// The causal forward pass over the prompt; its keys and values are the cache.
    fn prefill(&self, x: Tensor<3>) -> DecodeResult {
        check_prompt_shapes(self.name(), self.d_model(), &x, None)?;
        self.proj
            .prefill_full_cache(x, None, |q, k, v, masks| self.attend(q, k, v, masks))
    }

    /// The causal forward pass over the padded prompts; their keys and values are the cache,
    /// its padding masked in every later step.
    fn prefill_padded(&self, x: Tensor<3>, mask_pad: Tensor<2, Bool>) -> DecodeResult {
        check_prompt_shapes(self.name(), self.d_model(), &x, Some(&mask_pad))?;
        self.proj
            .prefill_full_cache(x, Some(mask_pad), |q, k, v, masks| {
                self.attend(q, k, v, masks)
            })
    }

    /// Appends the token's key and value to the cache and attends over all of them: O(t d) at
    /// position t.
    fn decode(&self, x: Tensor<3>, state: DecodingState) -> DecodeResult {
        check_token(self.name(), self.d_model(), &x)?;
        let (q, k, v) = self.proj.qkv_step(x, &state, INFO.name)?;
        let (keys, values, padding) = state.append_to_padded_cache(INFO.name, k, v)?;
        let o = exact_softmax_attention(
            q,
            keys.clone(),
            values.clone(),
            padding.clone(),
            false,
            None,
        );
        Ok((
            self.proj.out(o),
            DecodingState::KeyValueCache {
                keys,
                values,
                padding,
            },
        ))
    }
}

/// Exact softmax attention on per-head tensors, the functional form of [`SoftmaxAttention`].
///
/// # Shapes
/// - `q`: `[batch, heads, n_q, d]`; `k`, `v`: `[batch, heads, n_k, d]`
/// - `mask_pad`: `[batch, n_k]`, `true` = padding
/// - output: `[batch, heads, n_q, d]`
pub fn softmax_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask_pad: Option<Tensor<2, Bool>>,
    causal: bool,
) -> Tensor<4> {
    exact_softmax_attention(q, k, v, mask_pad, causal, None)
}
