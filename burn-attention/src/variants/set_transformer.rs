//! Induced set attention (ISAB): a few learned inducing points attend to the sequence, and the
//! sequence attends to their result.
//!
//! Lee et al. 2019, "Set Transformer", arXiv 1810.00825. With `MAB(X, Y) = LN(H + rFF(H))`,
//! `H = LN(X + Multihead(X, Y, Y))`, the block is `ISAB_m(X) = MAB(X, H)` with
//! `H = MAB(I, X)` for `m` learned inducing points `I: [m, d_model]`. Here the module is the
//! attention of an encoder block: `O = Multihead(X, H, H)`, `H = MAB(I, X)` computed inside it
//! with its own projections, LayerNorms and row-wise feed-forward layer (`rFF(x) = ReLU(W x + b)`,
//! one layer, d_model wide); the block around it supplies the outer MAB's residual, LayerNorm
//! and feed-forward layer (pre-LN, where the paper's MAB is post-LN).
//!
//! Cost: O(n m d) time and O(n m) memory per head. Masks: padding on the sequence the inducing
//! points read (a padded position never reaches them); cross-attention (the inducing points'
//! queries read the memory's keys and take its values, `H = MAB(I, K, V)`; the queries read `H`).
//! Not causal (every query sees `H`, which has read the whole sequence); no per-head form (`H`
//! passes through LayerNorms and a feed-forward layer over all heads), no attention mask, no
//! weights.

use crate::variants::prelude::*;
use burn::module::Param;
use burn::nn::{LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::Distribution;
use burn::tensor::activation::relu;

use crate::engines::params::lazy_param;

use crate::engines::softmax::exact_softmax_attention;

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "set-transformer",
    paper: "Lee et al. 2019, arXiv 1810.00825 (ISAB)",
    time: "O(n m d)",
    memory: "O(n m)",
    capabilities: Capabilities {
        cross_attention: true,
        ..Capabilities::PADDING_ONLY
    },
};

/// Configuration of [`SetTransformerAttention`].
#[derive(Config, Debug)]
pub struct SetTransformerConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Inducing points `m`.
    #[config(default = 32)]
    pub n_inducing: usize,
    /// Biases on the Q, K, V and output projections.
    #[config(default = false)]
    pub bias: bool,
    /// LayerNorm epsilon of the inducing points' block.
    #[config(default = 1e-5)]
    pub norm_eps: f64,
}

impl VariantConfig for SetTransformerConfig {
    variant_glue!(SetTransformerAttention, &[INFO], new(d_model, n_heads));

    fn check_fields(&self) -> Result<(), AttentionError> {
        check_at_least_one(INFO.name, "n_inducing", self.n_inducing)?;
        Ok(())
    }

    fn build(&self, device: &Device) -> SetTransformerAttention {
        let (m, d) = (self.n_inducing, self.d_model);
        let norm = LayerNormConfig::new(d).with_epsilon(self.norm_eps);
        // Xavier-uniform over [m, d], as the projections.
        let bound = (6.0 / (m + d) as f64).sqrt();
        SetTransformerAttention {
            inducing: lazy_param([m, d], device, true, move |device| {
                Tensor::random([m, d], Distribution::Uniform(-bound, bound), device)
            }),
            read: QkvoProjection::new(d, self.n_heads, self.bias, device),
            norm_read: norm.init(device),
            feed_forward: LinearConfig::new(d, d).init(device),
            norm_feed_forward: norm.init(device),
            proj: QkvoProjection::new(d, self.n_heads, self.bias, device),
        }
    }
}

inherent_config_methods!(SetTransformerConfig);

/// Multi-head induced set attention. Create with [`SetTransformerConfig`].
#[derive(Module, Debug)]
pub struct SetTransformerAttention {
    /// The inducing points `I`, `[m, d_model]`.
    pub inducing: Param<Tensor<2>>,
    /// `Multihead(I, X, X)`: the inducing points' projections over the sequence.
    pub read: QkvoProjection,
    /// `LN(I + Multihead(I, X, X))`.
    pub norm_read: LayerNorm,
    /// The row-wise feed-forward layer of the inducing points' block.
    pub feed_forward: Linear,
    /// `LN(H' + rFF(H'))`.
    pub norm_feed_forward: LayerNorm,
    /// `Multihead(X, H, H)`: the queries' projections over `H`.
    pub proj: QkvoProjection,
}

projection_shape!(SetTransformerAttention);

impl SetTransformerAttention {
    /// `H = MAB(I, Y)` for each sequence of keys `y` and values `values` (both
    /// `[batch, n, d_model]`; the same tensor in self-attention), padded positions left out:
    /// `[batch, m, d_model]`. The inducing points' queries read the keys and take their values.
    pub fn induced(
        &self,
        y: Tensor<3>,
        values: Tensor<3>,
        key_pad: Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        let batch = y.dims()[0];
        let [m, d] = self.inducing.val().dims();
        let points = self
            .inducing
            .val()
            .unsqueeze_dim::<3>(0)
            .expand([batch, m, d]);
        let (q, k, v) = self
            .read
            .project(AttentionInput::cross(points.clone(), y, values));
        let read = self
            .read
            .out(exact_softmax_attention(q, k, v, key_pad, false, None));
        let h = self.norm_read.forward(points + read);
        self.norm_feed_forward
            .forward(h.clone() + relu(self.feed_forward.forward(h)))
    }
}

impl AttentionModule for SetTransformerAttention {
    variant_facts!(INFO);

    rotary_refused!("its keys reach the queries through inducing points, which have no position");

    fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        input.check_shapes(self.name(), self.d_model())?;
        let masks = input.head_masks();
        let n_k = input.key_len();
        check_capabilities(&INFO, input.query_len(), n_k, masks.causal)?;
        let h = self.induced(
            input.key().clone(),
            input.value().clone(),
            masks.key_pad.clone(),
        );
        let (q, k, v) =
            self.proj
                .project(AttentionInput::cross(input.query().clone(), h.clone(), h));
        check_attention_mask(&INFO, &masks, &q, n_k)?;
        Ok(self
            .proj
            .out(exact_softmax_attention(q, k, v, None, false, None)))
    }
}
