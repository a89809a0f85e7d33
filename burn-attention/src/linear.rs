//! Linear Transformer attention with the `elu(x) + 1` feature map.
//!
//! Katharopoulos et al. 2020, "Transformers are RNNs", arXiv 2006.16236.
//! `O_i = φ(Q_i)ᵀ S / φ(Q_i)ᵀ z`, `S = Σ_j φ(K_j) V_jᵀ`, `z = Σ_j φ(K_j)`, through
//! [`kernelized_attention`]: padded keys left out, causal sums over `j ≤ i` in chunks. The paper
//! adds `ε = 1e-6` to the normaliser; `φ > 0`, so none is needed, and this crate adds none (see
//! [`crate::kernelized`]).
//! `φ(x) = elu(x) + 1` is evaluated as `x + 1` for `x > 0` and `exp(x)` otherwise, the same
//! function without the cancellation of `(exp(x) − 1) + 1`, which loses every digit below
//! x ≈ −17 in f32.
//! Cost: O(n d²) time, O(n d + d²) memory per head (causal: O(n d) more for the chunks).

use burn::prelude::*;

use crate::error::{AttentionError, check_heads};
use crate::heads::QkvoProjection;
use crate::input::AttentionInput;
use crate::kernelized::kernelized_attention;

/// Configuration of [`LinearAttention`].
#[derive(Config, Debug)]
pub struct LinearAttentionConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Biases on the Q, K, V and output projections.
    #[config(default = false)]
    pub bias: bool,
}

impl LinearAttentionConfig {
    /// Checks the configuration; the error names the offending field.
    pub fn validate(&self) -> Result<(), AttentionError> {
        check_heads("linear", self.d_model, self.n_heads, 0.0)
    }

    /// Creates the module.
    ///
    /// # Panics
    /// If [`validate`](Self::validate) fails; its message is the panic message.
    pub fn init(&self, device: &Device) -> LinearAttention {
        if let Err(err) = self.validate() {
            panic!("{err}");
        }
        LinearAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
        }
    }
}

/// Multi-head linear attention with `φ(x) = elu(x) + 1`. Create with [`LinearAttentionConfig`].
#[derive(Module, Debug)]
pub struct LinearAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
}

impl LinearAttention {
    /// Applies attention.
    ///
    /// # Shapes
    /// - input `x`: `[batch, n, d_model]`; output: the same.
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
        linear_attention(q, k, v, mask_pad, causal)
    }
}

/// The feature map `elu(x) + 1`, evaluated as `max(x, 0) + exp(min(x, 0))`: the same values
/// and gradients, exact to round-off however negative `x` is.
pub fn elu_feature_map<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    x.clone().clamp_min(0.0) + x.clamp_max(0.0).exp()
}

/// Linear attention on per-head tensors, the functional form of [`LinearAttention`].
///
/// # Shapes
/// - `q`, `k`, `v`: `[batch, heads, n, d]`
/// - `mask_pad`: `[batch, n]`, `true` = padding
/// - output: `[batch, heads, n, d]`
pub fn linear_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask_pad: Option<Tensor<2, Bool>>,
    causal: bool,
) -> Tensor<4> {
    kernelized_attention(elu_feature_map(q), elu_feature_map(k), v, mask_pad, causal)
}
