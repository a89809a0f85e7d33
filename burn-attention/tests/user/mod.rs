//! An attention written the way a user of the crate would write one, outside it: single-head
//! softmax attention with its own projections, from Burn's tensor operations and the crate's
//! public contract only ([`AttentionModule`], [`AttentionInput`], [`HeadMasks`]).

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::softmax;
use burn_attention_zoo::{
    AttentionError, AttentionInput, AttentionModule, Capabilities, HeadMasks, causal_mask,
};

/// One head, `softmax(q kᵀ / √d) v`, queries, keys and values projected by its own layers.
#[derive(Module, Debug)]
pub struct UserAttention {
    query: Linear,
    key: Linear,
    value: Linear,
}

impl UserAttention {
    pub fn new(d_model: usize, device: &Device) -> Self {
        let linear = || LinearConfig::new(d_model, d_model).init(device);
        Self {
            query: linear(),
            key: linear(),
            value: linear(),
        }
    }
}

impl AttentionModule for UserAttention {
    fn name(&self) -> &'static str {
        "user"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            padding_mask: true,
            attention_mask: false,
            returns_weights: false,
            causal: true,
            cross_attention: true,
            fixed_max_len: false,
            weights_sum_to_one: true,
            per_head_form: true,
            rotary: false,
            prefill_end_padding_only: false,
        }
    }

    fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        let q = self
            .query
            .forward(input.query().clone())
            .unsqueeze_dim::<4>(1);
        let k = self.key.forward(input.key().clone()).unsqueeze_dim::<4>(1);
        let v = self
            .value
            .forward(input.value().clone())
            .unsqueeze_dim::<4>(1);
        let o = self.attend(q, k, v, input.head_masks())?;
        Ok(o.squeeze_dim::<3>(1))
    }

    fn attend(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        masks: HeadMasks,
    ) -> Result<Tensor<4>, AttentionError> {
        let [batch, _, n_q, d] = q.dims();
        let n_k = k.dims()[2];
        let mut scores = q.matmul(k.swap_dims(2, 3)).div_scalar((d as f32).sqrt());
        if let Some(pad) = masks.key_pad {
            scores = scores.mask_fill(pad.reshape([batch, 1, 1, n_k]), -1e9);
        }
        if masks.causal {
            if n_q != n_k {
                return Err(AttentionError::unsupported(
                    "user",
                    "causal masking between sequences of different lengths",
                ));
            }
            let future = causal_mask(n_q, &scores.device()).reshape([1, 1, n_q, n_k]);
            scores = scores.mask_fill(future, -1e9);
        }
        Ok(softmax(scores, 3).matmul(v))
    }
}
