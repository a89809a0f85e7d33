//! Linear Transformer attention with the `elu(x) + 1` feature map.
//!
//! Katharopoulos et al. 2020, "Transformers are RNNs", arXiv 2006.16236.
//! `O_i = φ(Q_i)ᵀ S / φ(Q_i)ᵀ z`, `S = Σ_j φ(K_j) V_jᵀ`, `z = Σ_j φ(K_j)`, through
//! [`kernelized_attention`]: padded keys left out, causal sums over `j ≤ i` in chunks. The paper
//! adds `ε = 1e-6` to the normaliser; `φ > 0`, so none is needed, and this crate adds none (see
//! [`crate::engines::kernelized`]).
//! `φ(x) = elu(x) + 1` is evaluated as `x + 1` for `x > 0` and `exp(x)` otherwise, the same
//! function without the cancellation of `(exp(x) − 1) + 1`, which loses every digit below
//! x ≈ −17 in f32.
//! Cost: O(n d²) time, O(n d + d²) memory per head (causal: O(n d) more for the chunks).
//! Masks: padding and causal; cross-attention; decoding with the recurrent state (O(d²) a token).
//! Rotary positions ([`AttentionModule::with_rotary`]): RoFormer's form for linear attention
//! (Su et al. 2021, §3.4.3), the features rotated in the numerator only, so that the
//! denominator stays positive; decoding carries the count of tokens seen.

use crate::variants::prelude::*;

use crate::engines::kernelized::{
    kernelized_attention, kernelized_decode, kernelized_heads, kernelized_prompt_state,
    recurrent_state,
};
use crate::kernels;

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "linear",
    paper: "Katharopoulos et al. 2020, arXiv 2006.16236",
    time: "O(n d²)",
    memory: "O(n d + d²); causal O(n (c + d²/c)), c = 64",
    capabilities: Capabilities {
        causal: true,
        cross_attention: true,
        rotary: true,
        weights_sum_to_one: true,
        per_head_form: true,
        ..Capabilities::PADDING_ONLY
    },
};

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

impl VariantConfig for LinearAttentionConfig {
    variant_glue!(LinearAttention, &[INFO], new(d_model, n_heads));

    fn build(&self, device: &Device) -> LinearAttention {
        LinearAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
        }
    }
}

inherent_config_methods!(LinearAttentionConfig);

/// Multi-head linear attention with `φ(x) = elu(x) + 1`. Create with [`LinearAttentionConfig`].
#[derive(Module, Debug)]
pub struct LinearAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
}

projection_shape!(LinearAttention);

impl LinearAttention {
    /// The causal forward pass over prompts (padded by `mask_pad`) and the recurrent state
    /// summed from their real keys and values.
    /// With rotary positions, the state's sums over the rotated key features.
    fn prefill_with(&self, x: Tensor<3>, mask_pad: Option<Tensor<2, Bool>>) -> DecodeResult {
        let masks = self
            .proj
            .with_positions(HeadMasks::new(mask_pad.clone(), true), &x);
        let positions = masks.positions.clone();
        let (q, k, v) = self.proj.qkv(x);
        let o = self.attend(q, k.clone(), v.clone(), masks)?;
        let state = kernelized_prompt_state(elu_feature_map(k), v, positions, &mask_pad);
        Ok((self.proj.out(o), DecodingState::Recurrent(state)))
    }
}

impl AttentionModule for LinearAttention {
    variant_facts!(INFO);

    forward_through_projections!();

    rotary_on_projections!();

    /// With rotary positions in `masks`, RoFormer's form for linear attention: the features
    /// rotated in the numerator only ([`kernelized_heads`]).
    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        check_head_input(&INFO, &q, &k, &masks)?;
        Ok(kernelized_heads(
            elu_feature_map(q),
            elu_feature_map(k),
            v,
            masks,
        ))
    }

    prefill_through!(prefill_with);

    fn decode(&self, x: Tensor<3>, state: DecodingState) -> DecodeResult {
        check_token(self.name(), self.d_model(), &x)?;
        let state = recurrent_state(state, INFO.name)?;
        let (q, k, v) = self.proj.qkv(x);
        let (phi_q, phi_k) = (elu_feature_map(q), elu_feature_map(k));
        let (o, state) = kernelized_decode(phi_q, phi_k, v, state, self.proj.rotary);
        Ok((self.proj.out(o), DecodingState::Recurrent(state)))
    }
}

/// The feature map `elu(x) + 1`: `x + 1` for `x > 0`, `exp(x)` otherwise, exact to round-off
/// however negative `x` is (never `(exp(x) − 1) + 1`). On `flex` one vectorised pass whose
/// backward keeps only the output; elsewhere `max(x, 0) + exp(min(x, 0))`.
pub fn elu_feature_map<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    kernels::elu_plus_one(x)
}

/// Linear attention on per-head tensors, the functional form of [`LinearAttention`].
///
/// # Shapes
/// - `q`: `[batch, heads, n_q, d]`; `k`, `v`: `[batch, heads, n_k, d]`
/// - `mask_pad`: `[batch, n_k]`, `true` = padding
/// - output: `[batch, heads, n_q, d]`
pub fn linear_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask_pad: Option<Tensor<2, Bool>>,
    causal: bool,
) -> Tensor<4> {
    kernelized_attention(elu_feature_map(q), elu_feature_map(k), v, mask_pad, causal)
}
