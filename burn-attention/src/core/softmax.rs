//! Exact softmax attention `softmax(Q Kᵀ / √d + M) V` on per-head tensors, with its backend
//! dispatch: the step every variant that ends in an exact softmax shares (`softmax` itself,
//! the softmax over Linformer's projected keys, Nyströmformer's two softmax products).

use burn::nn::Dropout;
use burn::prelude::*;
use burn::tensor::activation::softmax;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;

use super::flash;
use super::input::{MASK_FILL, causal_mask};

/// Softmax attention with optional dropout on the weights. The softmax runs over the keys (the
/// last axis of the scores); padded keys and, with `causal`, keys `j > i` get [`MASK_FILL`].
///
/// On `flex`, and `tch` on a CPU (f32, no active weight dropout), it runs the fused operation of
/// the `flash` module, whose backward recomputes the weights tile by tile; elsewhere, without
/// autodiff and without a padding mask, Burn's fused attention operation; otherwise the composed
/// steps, whose backward Burn derives.
///
/// # Shapes
/// - `q`: `[batch, heads, n_q, d]`; `k`, `v`: `[batch, heads, n_k, d]`
/// - `key_pad`: `[batch, n_k]`, `true` = padding
/// - output: `[batch, heads, n_q, d]`
pub fn exact_softmax_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    key_pad: Option<Tensor<2, Bool>>,
    causal: bool,
    dropout: Option<&Dropout>,
) -> Tensor<4> {
    let scale = 1.0 / (q.dims()[3] as f32).sqrt();
    let [batch, _, n_q, _] = q.dims();
    let n_k = k.dims()[2];
    if !flash::has_weight_dropout(&q, dropout)
        && let Some(out) = flash::try_attention(&q, &k, &v, key_pad.as_ref(), causal, scale)
    {
        return out;
    }
    if !q.is_autodiff() && key_pad.is_none() {
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
    if let Some(mask) = key_pad {
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
