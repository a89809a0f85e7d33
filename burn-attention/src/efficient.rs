//! Efficient Attention: normalise queries and keys separately, then multiply keys with values
//! first.
//!
//! Shen et al. 2018, "Efficient Attention: Attention with Linear Complexities",
//! arXiv 1812.01243. `O = ρ_q(Q) (ρ_k(K)ᵀ V)`, `ρ_q` a softmax over the features of each query,
//! `ρ_k` a softmax over the positions of each key feature; no `1/√d` (as the official code).
//! Cost: O(n d²) time and O(n d + d²) memory per head.
//! Masks: padding (padded keys get a large negative score before `ρ_k`). Causal: not defined
//! (`ρ_k` normalises over the whole sequence), so asking for it is an error.

use burn::prelude::*;
use burn::tensor::activation::softmax;

use crate::error::{AttentionError, check_heads};
use crate::heads::QkvoProjection;
use crate::input::AttentionInput;
use crate::softmax::MASK_FILL;

const NAME: &str = "efficient";

/// Configuration of [`EfficientAttention`].
#[derive(Config, Debug)]
pub struct EfficientAttentionConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Biases on the Q, K, V and output projections.
    #[config(default = false)]
    pub bias: bool,
}

impl EfficientAttentionConfig {
    /// Checks the configuration; the error names the offending field.
    pub fn validate(&self) -> Result<(), AttentionError> {
        check_heads(NAME, self.d_model, self.n_heads, 0.0)
    }

    /// Creates the module.
    ///
    /// # Panics
    /// If [`validate`](Self::validate) fails; its message is the panic message.
    pub fn init(&self, device: &Device) -> EfficientAttention {
        if let Err(err) = self.validate() {
            panic!("{err}");
        }
        EfficientAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
        }
    }
}

/// Multi-head Efficient Attention. Create with [`EfficientAttentionConfig`].
#[derive(Module, Debug)]
pub struct EfficientAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
}

impl EfficientAttention {
    /// Applies attention, or refuses causal masking.
    ///
    /// # Shapes
    /// - input `x`: `[batch, n, d_model]`; output: the same.
    pub fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        let (q, k, v) = self.proj.qkv(input.x);
        Ok(self
            .proj
            .out(self.attend(q, k, v, input.mask_pad, input.causal)?))
    }

    /// The attention on per-head tensors, without the input and output projections, or the
    /// refusal of causal masking.
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
    ) -> Result<Tensor<4>, AttentionError> {
        check_input(NAME, causal)?;
        Ok(efficient_attention(q, k, v, mask_pad))
    }
}

/// Refuses causal masking for the variants that normalise keys over the whole sequence.
pub(crate) fn check_input(variant: &'static str, causal: bool) -> Result<(), AttentionError> {
    if causal {
        return Err(AttentionError::Unsupported {
            variant,
            message: "causal masking: keys are normalised over the whole sequence".into(),
        });
    }
    Ok(())
}

/// Efficient Attention on per-head tensors, the functional form of [`EfficientAttention`].
///
/// # Shapes
/// - `q`, `k`, `v`: `[batch, heads, n, d]`
/// - `mask_pad`: `[batch, n]`, `true` = padding
/// - output: `[batch, heads, n, d]`
pub fn efficient_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask_pad: Option<Tensor<2, Bool>>,
) -> Tensor<4> {
    let k = match mask_pad {
        Some(mask) => {
            let [batch, n] = mask.dims();
            k.mask_fill(mask.reshape([batch, 1, n, 1]), MASK_FILL)
        }
        None => k,
    };
    let q = softmax(q, 3);
    let k = softmax(k, 2);
    q.matmul(k.swap_dims(2, 3).matmul(v))
}
