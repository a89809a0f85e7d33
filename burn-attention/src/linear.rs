//! Linear Transformer attention with the `elu(x) + 1` feature map, and the kernelized form
//! every feature-map variant shares.
//!
//! Katharopoulos et al. 2020, "Transformers are RNNs", arXiv 2006.16236.
//! `O_i = φ(Q_i)ᵀ S / (φ(Q_i)ᵀ z + ε)`, `S = Σ_j φ(K_j) V_jᵀ`, `z = Σ_j φ(K_j)`, `ε = 1e-6`.
//! Causal: `S` and `z` become prefix sums over `j ≤ i`. Padding: `φ(K_j)` of padded `j` is zeroed.
//! Cost: O(n d²) time; O(d²) memory per head (O(n d²) in the causal form, which keeps the
//! prefix sums of every position).

use burn::prelude::*;
use burn::tensor::activation::elu;

use crate::error::{AttentionError, check_heads};
use crate::heads::QkvoProjection;
use crate::input::AttentionInput;
use crate::linformer::zero_padded;

/// The `ε` added to the normaliser.
pub const KERNEL_EPS: f32 = 1e-6;

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
            .out(linear_attention(q, k, v, input.mask_pad, input.causal))
    }
}

/// The feature map `elu(x) + 1`.
pub fn elu_feature_map<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    elu(x, 1.0).add_scalar(1.0)
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

/// Kernelized attention from already-mapped, positive features `φ(Q)`, `φ(K)`: the form shared
/// by every feature-map variant.
///
/// # Shapes
/// - `phi_q`, `phi_k`: `[batch, heads, n, m]` (m features)
/// - `v`: `[batch, heads, n, d]`
/// - output: `[batch, heads, n, d]`
pub fn kernelized_attention(
    phi_q: Tensor<4>,
    phi_k: Tensor<4>,
    v: Tensor<4>,
    mask_pad: Option<Tensor<2, Bool>>,
    causal: bool,
) -> Tensor<4> {
    let phi_k = zero_padded(phi_k, &mask_pad);
    if !causal {
        let s = phi_k.clone().swap_dims(2, 3).matmul(v); // [b, h, m, d]
        let z = phi_k.sum_dim(2); // [b, h, 1, m]
        let num = phi_q.clone().matmul(s);
        let den = phi_q.mul(z).sum_dim(3).add_scalar(KERNEL_EPS);
        return num.div(den);
    }
    let [batch, heads, n, _] = phi_k.dims();
    let d = v.dims()[3];
    // Prefix sums of the outer products φ(K_j) V_jᵀ: [b, h, n, m, d].
    let s = phi_k
        .clone()
        .unsqueeze_dim::<5>(4)
        .mul(v.unsqueeze_dim::<5>(3))
        .cumsum(2);
    let z = phi_k.cumsum(2); // [b, h, n, m]
    let num = phi_q
        .clone()
        .unsqueeze_dim::<5>(4)
        .mul(s)
        .sum_dim(3)
        .reshape([batch, heads, n, d]);
    let den = phi_q.mul(z).sum_dim(3).add_scalar(KERNEL_EPS);
    num.div(den)
}
