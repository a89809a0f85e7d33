//! Hedgehog: linear attention with a learned feature map trained to mimic softmax.
//!
//! Zhang, Bhatia, Kumbong & Ré 2024, "The Hedgehog & the Porcupine: Expressive Linear Attentions
//! with Softmax Mimicry", arXiv 2402.04347. Per head, a trainable map for the queries and one
//! for the keys, `φ(x) = [softmax(x W), softmax(−x W)]` (softmax over the `d` features, `W`
//! `d × d` initialised to the identity, the paper's choice), so that `φ(q)·φ(k)` is positive
//! and, being a sum of products of exponentials, spiky and monotone in `q·k` as softmax is;
//! then kernelized attention, `O_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j)`, through
//! [`kernelized_heads`] (padding left out, causal in chunks, decoding with the `2d × d`
//! state). The successor of Yorsh & Kovalenko's trainable kernels (`ff-*`), which learn the
//! map from the task loss alone. Rotary positions ([`AttentionModule::with_rotary`]): RoFormer's
//! form for linear attention, the learned features rotated in the numerator.
//!
//! The paper's attention distillation, a soft cross-entropy from softmax attention's weights to
//! Hedgehog's, `−Σ_j softmax(q_i·k_j / √d)_j log a_ij` averaged over the real queries, is the
//! auxiliary loss [`try_forward_with_loss`](AttentionModule::try_forward_with_loss) returns,
//! scaled by `distill_weight` (0 by default: the map learns from the task loss, as when the paper
//! trains from scratch). The softmax weights are computed from the same queries and keys with
//! the gradient stopped (they teach the map, not the projections), which costs the `n × n`
//! weights of softmax attention while training; evaluation and decoding never form them.

use crate::variants::prelude::*;
use burn::module::Param;

use crate::contract::input::{causal_mask, zero_padded};
use crate::engines::kernelized::{
    kernelized_decode, kernelized_heads, kernelized_prompt_state, recurrent_state,
};
use crate::kernels;

use crate::engines::params::lazy_param;

use crate::engines::softmax::softmax_weights;

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "hedgehog",
    paper: "Zhang et al. 2024, arXiv 2402.04347",
    time: "O(n d²)",
    memory: "O(n d + d²); causal O(n (c + d²/c)), c = 64",
    capabilities: Capabilities {
        causal: true,
        cross_attention: true,
        weights_sum_to_one: true,
        per_head_form: true,
        rotary: true,
        ..Capabilities::PADDING_ONLY
    },
};

/// Configuration of [`HedgehogAttention`].
#[derive(Config, Debug)]
pub struct HedgehogConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Weight of the attention-distillation loss the module asks the training loss to add (0:
    /// none, and the softmax weights are never formed).
    #[config(default = 0.0)]
    pub distill_weight: f64,
    /// Biases on the Q, K, V and output projections.
    #[config(default = false)]
    pub bias: bool,
}

impl VariantConfig for HedgehogConfig {
    variant_glue!(HedgehogAttention, &[INFO], new(d_model, n_heads));

    fn check_fields(&self) -> Result<(), AttentionError> {
        if !(self.distill_weight.is_finite() && self.distill_weight >= 0.0) {
            return Err(INFO.field_error(
                "distill_weight",
                format!("must be finite and at least 0, got {}", self.distill_weight),
            ));
        }
        Ok(())
    }

    fn build(&self, device: &Device) -> HedgehogAttention {
        let (h, d) = (self.n_heads, self.d_model / self.n_heads);
        let identity = move |device: &Device| {
            Tensor::<2>::eye(d, device)
                .unsqueeze_dim::<3>(0)
                .repeat_dim(0, h)
        };
        HedgehogAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            query_map: lazy_param([h, d, d], device, true, identity),
            key_map: lazy_param([h, d, d], device, true, identity),
            distill_weight: self.distill_weight,
        }
    }
}

inherent_config_methods!(HedgehogConfig);

/// Hedgehog attention. Create with [`HedgehogConfig`].
#[derive(Module, Debug)]
pub struct HedgehogAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
    /// The queries' feature map `W` per head, `[heads, d, d]`.
    pub query_map: Param<Tensor<3>>,
    /// The keys' feature map `W` per head, `[heads, d, d]`.
    pub key_map: Param<Tensor<3>>,
    /// Weight of the attention-distillation loss (0: none).
    pub distill_weight: f64,
}

projection_shape!(HedgehogAttention);

/// `[softmax(x W), softmax(−x W)]` per head: `x: [batch, heads, n, d]`, `w: [heads, d, d]`;
/// `[batch, heads, n, 2d]`, positive, each half summing to one.
pub fn hedgehog_features(x: Tensor<4>, w: Tensor<3>) -> Tensor<4> {
    let [heads, d, _] = w.dims();
    let z = x.matmul(w.reshape([1, heads, d, d]));
    Tensor::cat(
        vec![kernels::softmax(z.clone()), kernels::softmax(z.neg())],
        3,
    )
}

impl HedgehogAttention {
    fn features(&self, q: Tensor<4>, k: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        (
            hedgehog_features(q, self.query_map.val()),
            hedgehog_features(k, self.key_map.val()),
        )
    }

    /// The attention distillation loss for one input (see the module docs): the soft cross-entropy
    /// from softmax's weights (gradient stopped) to Hedgehog's, averaged over real queries.
    fn distillation(&self, q: Tensor<4>, k: Tensor<4>, masks: &HeadMasks) -> Tensor<1> {
        let [batch, heads, n_q, d] = q.dims();
        let teacher = softmax_weights(q.clone(), k.clone(), masks, (d as f32).powf(-0.5)).detach();
        let (phi_q, phi_k) = self.features(q, k);
        let phi_k = zero_padded(phi_k, &masks.key_pad);
        let scores = phi_q.matmul(phi_k.swap_dims(2, 3)); // [b, h, n_q, n_k], >= 0
        let scores = if masks.causal {
            let n_k = scores.dims()[3];
            let future = causal_mask(n_q.max(n_k), &scores.device())
                .slice([0..n_q, 0..n_k])
                .reshape([1, 1, n_q, n_k]);
            scores.mask_fill(future, 0.0)
        } else {
            scores
        };
        let rows = scores.clone().sum_dim(3).clamp_min(f32::MIN_POSITIVE);
        let log_student = (scores.clamp_min(f32::MIN_POSITIVE) / rows).log();
        let per_query = (teacher * log_student).sum_dim(3).neg(); // [b, h, n_q, 1]
        let real = match &masks.query_pad {
            Some(pad) => pad.clone().bool_not().float().reshape([batch, 1, n_q, 1]),
            None => Tensor::ones([batch, 1, n_q, 1], &per_query.device()),
        };
        let count = real.clone().sum().mul_scalar(heads as f32).clamp_min(1.0);
        (per_query * real)
            .sum()
            .div(count)
            .mul_scalar(self.distill_weight)
    }

    /// The causal forward pass over prompts (padded by `mask_pad`) and the recurrent state
    /// summed from their real keys and values.
    fn prefill_with(&self, x: Tensor<3>, mask_pad: Option<Tensor<2, Bool>>) -> DecodeResult {
        let masks = self
            .proj
            .with_positions(HeadMasks::new(mask_pad.clone(), true), &x);
        let positions = masks.positions.clone();
        let (q, k, v) = self.proj.qkv(x);
        let (phi_q, phi_k) = self.features(q, k);
        let o = kernelized_heads(phi_q, phi_k.clone(), v.clone(), masks);
        let state = kernelized_prompt_state(phi_k, v, positions, &mask_pad);
        Ok((self.proj.out(o), DecodingState::Recurrent(state)))
    }
}

impl AttentionModule for HedgehogAttention {
    variant_facts!(INFO);

    forward_through_projections!();

    rotary_on_projections!();

    /// With rotary positions in `masks`, RoFormer's form for linear attention: the learned
    /// features rotated in the numerator only ([`kernelized_heads`]).
    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        check_head_input(&INFO, &q, &k, &masks)?;
        let (phi_q, phi_k) = self.features(q, k);
        Ok(kernelized_heads(phi_q, phi_k, v, masks))
    }

    /// The output and, where `distill_weight` is above 0, the attention-distillation loss.
    fn try_forward_with_loss(
        &self,
        input: AttentionInput,
    ) -> Result<(Tensor<3>, Option<Tensor<1>>), AttentionError> {
        if self.distill_weight == 0.0 {
            return self.try_forward(input).map(|y| (y, None));
        }
        input.check_shapes(self.name(), self.d_model())?;
        if self.proj.rotary && input.is_cross() {
            return Err(rotary_cross_attention(self.name()));
        }
        // The teacher is softmax over the unrotated queries and keys, whose kernel the learned
        // features approximate; rotary positions act on the features, in the numerator.
        let masks = self.proj.with_positions(input.head_masks(), input.query());
        let (q, k, v) = self.proj.project(input);
        let loss = self.distillation(q.clone(), k.clone(), &masks);
        let o = self.attend(q, k, v, masks)?;
        Ok((self.proj.out(o), Some(loss)))
    }

    prefill_through!(prefill_with);

    fn decode(&self, x: Tensor<3>, state: DecodingState) -> DecodeResult {
        check_token(self.name(), self.d_model(), &x)?;
        let state = recurrent_state(state, INFO.name)?;
        let (q, k, v) = self.proj.qkv(x);
        let (phi_q, phi_k) = self.features(q, k);
        let (o, state) = kernelized_decode(phi_q, phi_k, v, state, self.proj.rotary);
        Ok((self.proj.out(o), DecodingState::Recurrent(state)))
    }
}
