//! Exact softmax attention, the baseline every other variant is measured against.
//!
//! `O = softmax(Q Kᵀ / √d + M) V` (Vaswani et al. 2017, arXiv 1706.03762), the softmax over the
//! keys, `M` a large negative fill on padded or future keys. Cost: O(n² d) time and O(n²) memory
//! per head (O(n) on the fused kernels of `flex` and `tch`). Masks: padding, causal, and an
//! arbitrary `[batch, n_q, n_k]` attention mask (on the composed steps, which keep the `n × n`
//! weights); cross-attention; its weights on request; decoding with a key/value cache.

use burn::nn::{Dropout, DropoutConfig};
use burn::prelude::*;

use crate::core::contract::{AttentionModule, Capabilities, DecodingState};
use crate::core::error::{AttentionError, check_heads};
use crate::core::heads::{QkvoProjection, projection_shape};
use crate::core::input::{AttentionInput, HeadMasks};
use crate::core::softmax::{exact_softmax_attention, softmax_attention_with_weights};
use crate::core::variant::{
    ModelShape, VariantConfig, VariantInfo, check_attention_mask, check_capabilities, variant_glue,
};

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "softmax",
    paper: "Vaswani et al. 2017, arXiv 1706.03762",
    time: "O(n² d)",
    memory: "O(n²); O(n) fused",
    capabilities: Capabilities {
        padding_mask: true,
        attention_mask: true,
        returns_weights: true,
        causal: true,
        cross_attention: true,
        fixed_max_len: false,
        weights_sum_to_one: true,
        per_head_form: true,
        prefill_end_padding_only: false,
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

impl SoftmaxAttentionConfig {
    /// Checks the configuration; the error names the offending field.
    pub fn validate(&self) -> Result<(), AttentionError> {
        check_heads(INFO.name, self.d_model, self.n_heads, self.dropout)
    }

    /// Creates the module.
    ///
    /// # Panics
    /// If [`validate`](Self::validate) fails; its message is the panic message.
    pub fn init(&self, device: &Device) -> SoftmaxAttention {
        if let Err(err) = self.validate() {
            panic!("{err}");
        }
        SoftmaxAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            dropout: DropoutConfig::new(self.dropout).init(),
        }
    }
}

impl VariantConfig for SoftmaxAttentionConfig {
    variant_glue!(SoftmaxAttention);
    const VARIANTS: &'static [VariantInfo] = &[INFO];

    fn for_variant(_name: &str, model: ModelShape) -> Self {
        Self::new(model.d_model, model.n_heads)
    }
    fn with_weight_dropout(self, dropout: f64) -> Self {
        self.with_dropout(dropout)
    }
}

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
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn capabilities(&self) -> Capabilities {
        INFO.capabilities
    }

    fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        self.proj
            .apply(input, |q, k, v, masks| self.attend(q, k, v, masks))
    }

    fn attend(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        masks: HeadMasks,
    ) -> Result<Tensor<4>, AttentionError> {
        let [n_q, n_k] = [q.dims()[2], k.dims()[2]];
        check_capabilities(&INFO, n_q, n_k, masks.causal)?;
        check_attention_mask(&INFO, &masks, &q, k.dims()[2])?;
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
    fn try_forward_with_weights(
        &self,
        input: AttentionInput,
    ) -> Result<(Tensor<3>, Tensor<4>), AttentionError> {
        let masks = input.head_masks();
        let (q, k, v) = self.proj.project(input);
        check_capabilities(&INFO, q.dims()[2], k.dims()[2], masks.causal)?;
        check_attention_mask(&INFO, &masks, &q, k.dims()[2])?;
        let (o, weights) = softmax_attention_with_weights(q, k, v, &masks, Some(&self.dropout));
        Ok((self.proj.out(o), weights))
    }

    /// The causal forward pass over the prompt; its keys and values are the cache.
    fn prefill(&self, x: Tensor<3>) -> Result<(Tensor<3>, DecodingState), AttentionError> {
        self.proj
            .prefill_full_cache(x, None, |q, k, v, masks| self.attend(q, k, v, masks))
    }

    /// The causal forward pass over the padded prompts; their keys and values are the cache,
    /// its padding masked in every later step.
    fn prefill_padded(
        &self,
        x: Tensor<3>,
        mask_pad: Tensor<2, Bool>,
    ) -> Result<(Tensor<3>, DecodingState), AttentionError> {
        self.proj
            .prefill_full_cache(x, Some(mask_pad), |q, k, v, masks| {
                self.attend(q, k, v, masks)
            })
    }

    /// Appends the token's key and value to the cache and attends over all of them: O(t d) at
    /// position t.
    fn decode(
        &self,
        x: Tensor<3>,
        state: DecodingState,
    ) -> Result<(Tensor<3>, DecodingState), AttentionError> {
        let (q, k, v) = self.proj.qkv(x);
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
