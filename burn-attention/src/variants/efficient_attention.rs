//! Efficient Attention: normalise queries and keys separately, then multiply keys with values
//! first.
//!
//! Shen et al. 2018, "Efficient Attention: Attention with Linear Complexities",
//! arXiv 1812.01243. `O = ρ_q(Q) (ρ_k(K)ᵀ V)`, `ρ_q` a softmax over the features of each query,
//! `ρ_k` a softmax over the positions of each key feature; no `1/√d` (as the official code).
//! Cost: O(n d²) time and O(n d + d²) memory per head.
//! Masks: padding (padded keys get a large negative score before `ρ_k`); cross-attention.
//! Causal: not defined (`ρ_k` normalises over the whole sequence), so asking for it is an error.

use crate::variants::prelude::*;

use crate::contract::input::MASK_FILL;
use crate::kernels;

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "efficient",
    paper: "Shen et al. 2018, arXiv 1812.01243",
    time: "O(n d²)",
    memory: "O(n d + d²)",
    capabilities: Capabilities {
        cross_attention: true,
        weights_sum_to_one: true,
        per_head_form: true,
        ..Capabilities::PADDING_ONLY
    },
};

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

impl VariantConfig for EfficientAttentionConfig {
    variant_glue!(EfficientAttention, &[INFO], new(d_model, n_heads));

    fn check_input(&self, n_q: usize, n_k: usize, causal: bool) -> Result<(), AttentionError> {
        check_input(n_q, n_k, causal)
    }

    fn build(&self, device: &Device) -> EfficientAttention {
        EfficientAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
        }
    }
}

inherent_config_methods!(EfficientAttentionConfig);

/// Refuses causal masking: keys are normalised over the whole sequence.
fn check_input(n_q: usize, n_k: usize, causal: bool) -> Result<(), AttentionError> {
    if causal {
        return Err(AttentionError::unsupported(
            INFO.name,
            "causal masking: keys are normalised over the whole sequence",
        ));
    }
    check_capabilities(&INFO, n_q, n_k, causal)
}

/// Multi-head Efficient Attention. Create with [`EfficientAttentionConfig`].
#[derive(Module, Debug)]
pub struct EfficientAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
}

projection_shape!(EfficientAttention);

impl AttentionModule for EfficientAttention {
    variant_facts!(INFO);

    rotary_refused!(
        "its keys are normalised by a softmax over positions, feature by feature, not scored against each query"
    );

    forward_through_projections!();

    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        check_input(q.dims()[2], k.dims()[2], masks.causal)?;
        check_attention_mask(&INFO, &masks, &q, k.dims()[2])?;
        Ok(efficient_attention(q, k, v, masks.key_pad))
    }
}

/// Efficient Attention on per-head tensors, the functional form of [`EfficientAttention`].
///
/// # Shapes
/// - `q`: `[batch, heads, n_q, d]`; `k`, `v`: `[batch, heads, n_k, d]`
/// - `mask_pad`: `[batch, n_k]`, `true` = padding
/// - output: `[batch, heads, n_q, d]`
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
    // ρ_q over each query's features; ρ_k over the positions, as rows of the transposed keys
    // (the layout the product `ρ_k(K)ᵀ V` takes).
    let q = kernels::softmax(q);
    let k_t = kernels::softmax(k.swap_dims(2, 3));
    q.matmul(k_t.matmul(v))
}
