//! Exact softmax attention, the baseline every other variant is measured against.
//!
//! `O = softmax(Q Kᵀ / √d + M) V` (Vaswani et al. 2017, arXiv 1706.03762), `M` a large negative
//! fill on padded or future keys. Cost: O(n² d) time and O(n²) memory per head.
//! Masks: padding and causal.

use burn::nn::{Dropout, DropoutConfig};
use burn::prelude::*;
use burn::tensor::activation::softmax;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;

use crate::error::{AttentionError, check_heads};
use crate::flash;
use crate::heads::QkvoProjection;
use crate::input::{AttentionInput, causal_mask};

/// The value written over masked scores before the softmax (Burn's own `min_float`).
pub const MASK_FILL: f32 = -1.0e4;

/// Configuration of [`SoftmaxAttention`].
#[derive(Config, Debug)]
pub struct SoftmaxAttentionConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Dropout on the attention weights.
    #[config(default = 0.1)]
    pub dropout: f64,
    /// Biases on the Q, K, V and output projections (the LRA reference has none).
    #[config(default = false)]
    pub bias: bool,
}

impl SoftmaxAttentionConfig {
    /// Checks the configuration; the error names the offending field.
    pub fn validate(&self) -> Result<(), AttentionError> {
        check_heads("softmax", self.d_model, self.n_heads, self.dropout)
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

/// Multi-head exact softmax attention. Create with [`SoftmaxAttentionConfig`].
#[derive(Module, Debug)]
pub struct SoftmaxAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
}

impl SoftmaxAttention {
    /// Applies attention.
    ///
    /// # Shapes
    /// - input `x`: `[batch, n, d_model]`
    /// - output: `[batch, n, d_model]`
    pub fn forward(&self, input: AttentionInput) -> Tensor<3> {
        let (q, k, v) = self.proj.qkv(input.x);
        self.proj
            .out(self.attend(q, k, v, input.mask_pad, input.causal))
    }

    /// The attention on per-head tensors, without the input and output projections.
    ///
    /// # Shapes
    /// - `q`, `k`, `v`: `[batch, heads, n, d_head]`
    /// - `mask_pad`: `[batch, n]`, `true` = padding
    /// - output: `[batch, heads, n, d_head]`
    pub fn attend(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        mask_pad: Option<Tensor<2, Bool>>,
        causal: bool,
    ) -> Tensor<4> {
        attend(q, k, v, mask_pad, causal, Some(&self.dropout))
    }
}

/// Exact softmax attention on per-head tensors, the functional form of [`SoftmaxAttention`].
///
/// # Shapes
/// - `q`, `k`, `v`: `[batch, heads, n, d]`
/// - `mask_pad`: `[batch, n]`, `true` = padding
/// - output: `[batch, heads, n, d]`
pub fn softmax_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask_pad: Option<Tensor<2, Bool>>,
    causal: bool,
) -> Tensor<4> {
    attend(q, k, v, mask_pad, causal, None)
}

/// Softmax attention with optional dropout on the weights; shared by the variants that end in
/// an exact softmax over (possibly projected) keys or over landmarks.
///
/// On `flex`, and `tch` on a CPU (f32, no active weight dropout), it runs the fused operation of
/// [`crate::flash`], whose backward recomputes the weights tile by tile; elsewhere, without
/// autodiff and without a padding mask, Burn's fused attention operation; otherwise the composed
/// steps, whose backward Burn derives.
pub(crate) fn attend(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask_pad: Option<Tensor<2, Bool>>,
    causal: bool,
    dropout: Option<&Dropout>,
) -> Tensor<4> {
    let scale = 1.0 / (q.dims()[3] as f32).sqrt();
    let [batch, _, n_q, _] = q.dims();
    let n_k = k.dims()[2];
    // Dropout on the weights is only active while training with a non-zero rate; the fused
    // kernel has none (as PyTorch's CPU flash attention has none).
    let weight_dropout = q.is_autodiff() && dropout.is_some_and(|dropout| dropout.prob > 0.0);
    if !weight_dropout
        && let Some(out) = flash::try_attention(&q, &k, &v, mask_pad.as_ref(), causal, scale)
    {
        return out;
    }
    if !q.is_autodiff() && mask_pad.is_none() {
        // Dropout is the identity without autodiff, so the fused operation computes the same.
        // Padding masks take the composed path: Burn's masks mean `true` = masked, and
        // burn-tch 0.22.1 hands them unchanged to libtorch's scaled_dot_product_attention,
        // where `true` means attend (caught by the backend-agreement test).
        let options = AttentionModuleOptions {
            is_causal: causal,
            scale: Some(scale as f64),
            ..Default::default()
        };
        return attention(q, k, v, None, None, options);
    }
    let mut scores = q.matmul(k.swap_dims(2, 3)).mul_scalar(scale);
    if let Some(mask) = mask_pad {
        scores = scores.mask_fill(mask.reshape([batch, 1, 1, n_k]), MASK_FILL);
    }
    if causal {
        let mask = causal_mask(n_q.max(n_k), &scores.device())
            .slice([0..n_q, 0..n_k])
            .reshape([1, 1, n_q, n_k]);
        scores = scores.mask_fill(mask, MASK_FILL);
    }
    let mut weights = softmax(scores, 3);
    if let Some(dropout) = dropout {
        weights = dropout.forward(weights);
    }
    weights.matmul(v)
}
