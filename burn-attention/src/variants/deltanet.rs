//! DeltaNet: linear attention that writes with the delta rule, and its gated form.
//!
//! `deltanet`: Schlag, Irie & Schmidhuber 2021, "Linear Transformers Are Secretly Fast Weight
//! Programmers", arXiv 2102.11174, as Yang, Wang, Zhang, Shen & Kim 2024 train it in chunks
//! ("Parallelizing Linear Transformers with the Delta Rule over Sequence Length", arXiv
//! 2406.06484). Per head, `S_t = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ`, `o_t = S_tᵀ q_t`:
//! the value stored under `k_t` moves a fraction `β_t = σ(x_t W_β)` toward `v_t`, where a sum
//! of outer products would only add. Queries and keys `L2(silu(x W))` (the 2024 paper's
//! choice), queries scaled by `d_k^{-1/2}`; each head's output RMS-normalised with a learned
//! scale, then projected.
//!
//! `gated-deltanet`: Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks: Improving Mamba2
//! with Delta Rule", arXiv 2412.06464. The state also decays by a gate per head and token,
//! `S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ`, `α_t = exp(−exp(A_log) Δ_t)`,
//! `Δ_t = softplus(x_t W_α + b_Δ)` (Mamba-2's parametrisation and initialisation: `A` uniform in
//! [1, 16], `Δ` log-uniform in [0.001, 0.1]); values `silu(x W_V)`, and the normalised heads
//! gated, `RMSNorm(o) ⊙ silu(x W_G)`, before the projection.
//!
//! Left out of both, as of `mamba2`: the short causal convolutions before the projections and
//! Gated DeltaNet's widened values (`expand_v = 2`); the encoder block supplies the rest. Computed
//! by the delta-rule core ([`crate::engines::delta`]): chunks of 32 in the WY form, decoding with a
//! `[d_k, d_v]` state per head, O(d²) a token. Padded positions neither decay nor write.
//!
//! Non-causal form (the encoder tasks): the forward recurrence plus the one run from the end,
//! read before each position's own write, so that a position's own value is written into its
//! output once (the two scans of the bidirectional state-space models, Hwang et al. 2024,
//! arXiv 2407.09941). No cross-attention, attention mask or weights.

use crate::engines::rotary::{real_positions, rotate_queries_keys};
use crate::variants::prelude::*;
use burn::module::Param;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Distribution;
use burn::tensor::activation::softplus;

use crate::contract::DecayedState;
use crate::engines::decay::{decayed_state, real_tokens};

use crate::engines::delta::{
    DELTA_CHUNK, delta_bidirectional, delta_causal, delta_step, unit_length,
};

use crate::kernels::{sigmoid, silu};

use crate::engines::heads::{merge_heads, split_heads};
use crate::engines::params::lazy_param;

const CAPABILITIES: Capabilities = Capabilities {
    causal: true,
    rotary: true,
    ..Capabilities::PADDING_ONLY
};

/// The registry entry of the delta rule.
pub const DELTANET: VariantInfo = VariantInfo {
    name: "deltanet",
    paper: "Schlag et al. 2021, arXiv 2102.11174; chunked: Yang et al. 2024, arXiv 2406.06484",
    time: "O(n c d + n d²)",
    memory: "O(n (c + d) + (n / c) d²), c = 32",
    capabilities: CAPABILITIES,
};

/// The registry entry of the gated delta rule.
pub const GATED_DELTANET: VariantInfo = VariantInfo {
    name: "gated-deltanet",
    paper: "Yang, Kautz & Hatamizadeh 2025, arXiv 2412.06464",
    time: "O(n c d + n d²)",
    memory: "O(n (c + d) + (n / c) d²), c = 32",
    capabilities: CAPABILITIES,
};

/// Configuration of [`DeltaNetAttention`] (both variants).
#[derive(Config, Debug)]
pub struct DeltaNetConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// The gated delta rule (`gated-deltanet`): a decay per head and token, values through
    /// silu and an output gate.
    #[config(default = false)]
    pub gated: bool,
    /// Biases on the query, key, value, output and gate projections.
    #[config(default = false)]
    pub bias: bool,
    /// Epsilon of the per-head normalisation.
    #[config(default = 1e-5)]
    pub norm_eps: f64,
}

impl DeltaNetConfig {
    /// The registered variant: `gated-deltanet` where gated, else `deltanet`.
    fn variant(&self) -> &'static VariantInfo {
        if self.gated {
            &GATED_DELTANET
        } else {
            &DELTANET
        }
    }
}

impl VariantConfig for DeltaNetConfig {
    variant_glue!(DeltaNetAttention, &[DELTANET, GATED_DELTANET]);

    fn for_variant(name: &str, model: ModelShape) -> Self {
        Self::new(model.d_model, model.n_heads).with_gated(name == GATED_DELTANET.name)
    }

    fn info(&self) -> &'static VariantInfo {
        self.variant()
    }

    fn check_fields(&self) -> Result<(), AttentionError> {
        if self.norm_eps.is_nan() || self.norm_eps <= 0.0 {
            return Err(AttentionError::field(
                self.variant().name,
                "norm_eps",
                "must be above 0",
            ));
        }
        Ok(())
    }

    fn build(&self, device: &Device) -> DeltaNetAttention {
        let (d, h) = (self.d_model, self.n_heads);
        let linear =
            |out: usize, bias: bool| LinearConfig::new(d, out).with_bias(bias).init(device);
        let decay = self.gated.then(|| DeltaDecay {
            dt_proj: linear(h, false),
            dt_bias: lazy_param([h], device, true, move |device| {
                // Δ log-uniform in [0.001, 0.1]; the bias is softplus⁻¹(Δ) = Δ + ln(1 − e^{−Δ}).
                let (low, high) = (0.001f64.ln(), 0.1f64.ln());
                let dt = Tensor::<1>::random([h], Distribution::Uniform(low, high), device).exp();
                dt.clone() + (-(dt.neg().exp()) + 1.0).log()
            }),
            a_log: lazy_param([h], device, true, move |device| {
                Tensor::<1>::random([h], Distribution::Uniform(1.0, 16.0), device).log()
            }),
        });
        DeltaNetAttention {
            proj: QkvoProjection::new(d, h, self.bias, device),
            beta_proj: linear(h, false),
            decay,
            gate: self.gated.then(|| linear(d, self.bias)),
            norm_weight: lazy_param([d], device, true, move |device| Tensor::ones([d], device)),
            norm_eps: self.norm_eps,
        }
    }
}

inherent_config_methods!(DeltaNetConfig);

/// The gated delta rule's decay: `α = exp(−exp(A_log) softplus(x W_α + b_Δ))` per head.
#[derive(Module, Debug)]
pub struct DeltaDecay {
    /// `W_α`, one step size per head, `[d_model, heads]`.
    pub dt_proj: Linear,
    /// `b_Δ`, `[heads]`.
    pub dt_bias: Param<Tensor<1>>,
    /// `A_log`, `[heads]`.
    pub a_log: Param<Tensor<1>>,
}

/// DeltaNet, gated or not. Create with [`DeltaNetConfig`].
#[derive(Module, Debug)]
pub struct DeltaNetAttention {
    /// Query, key, value and output projections.
    pub proj: QkvoProjection,
    /// `W_β`: one writing strength per head, `[d_model, heads]`.
    pub beta_proj: Linear,
    /// The gated form's decay (`None`: `deltanet`).
    pub decay: Option<DeltaDecay>,
    /// The gated form's output gate `W_G` (`None`: `deltanet`).
    pub gate: Option<Linear>,
    /// The per-head RMSNorm's scale, `[d_model]`.
    pub norm_weight: Param<Tensor<1>>,
    /// Epsilon of the per-head normalisation.
    pub norm_eps: f64,
}

projection_shape!(DeltaNetAttention);

impl DeltaNetAttention {
    /// The width of a head's queries and keys, which rotary positions turn in pairs.
    fn rotary_head_width(&self) -> usize {
        self.proj.d_model() / self.proj.n_heads()
    }

    fn info(&self) -> &'static VariantInfo {
        if self.decay.is_some() {
            &GATED_DELTANET
        } else {
            &DELTANET
        }
    }

    /// A per-head value `[batch, n, heads]` from `x` as `[batch, heads, n, 1]`.
    fn per_head(x: Tensor<3>) -> Tensor<4> {
        let [batch, n, heads] = x.dims();
        x.swap_dims(1, 2).reshape([batch, heads, n, 1])
    }

    /// Queries, keys, values, writing strengths and log-decays (`None` ungated) per head.
    fn project(
        &self,
        x: Tensor<3>,
    ) -> (
        Tensor<4>,
        Tensor<4>,
        Tensor<4>,
        Tensor<4>,
        Option<Tensor<4>>,
    ) {
        let heads = self.n_heads();
        let q = unit_length(split_heads(silu(self.proj.query.forward(x.clone())), heads));
        let d_k = q.dims()[3];
        let q = q.mul_scalar((d_k as f64).powf(-0.5));
        let k = unit_length(split_heads(silu(self.proj.key.forward(x.clone())), heads));
        let v = split_heads(self.proj.value.forward(x.clone()), heads);
        let v = if self.decay.is_some() { silu(v) } else { v };
        let beta = Self::per_head(sigmoid(self.beta_proj.forward(x.clone())));
        let log_decay = self.decay.as_ref().map(|decay| {
            let bias = decay.dt_bias.val().reshape([1, 1, heads]);
            let dt = Self::per_head(softplus(decay.dt_proj.forward(x) + bias, 1.0));
            dt * decay.a_log.val().exp().neg().reshape([1, heads, 1, 1])
        });
        (q, k, v, beta, log_decay)
    }

    /// The heads' outputs: normalised per head, gated (the gated form), projected.
    fn finish(&self, o: Tensor<4>, x: Tensor<3>) -> Tensor<3> {
        let rms = (o.clone().powi_scalar(2).mean_dim(3) + self.norm_eps).sqrt();
        let d = x.dims()[2];
        let y = merge_heads(o / rms) * self.norm_weight.val().reshape([1, 1, d]);
        let y = match &self.gate {
            Some(gate) => y * silu(gate.forward(x)),
            None => y,
        };
        self.proj.output.forward(y)
    }

    /// The attention over `x: [batch, n, d_model]`, causal or not, padding left out; with the
    /// causal form, also the decoding state after the last position.
    fn mix(
        &self,
        x: Tensor<3>,
        mask_pad: Option<Tensor<2, Bool>>,
        causal: bool,
    ) -> (Tensor<3>, Option<DecodingState>) {
        let [batch, n, _] = x.dims();
        let (q, k, v, beta, log_decay) = self.project(x.clone());
        let positions =
            (self.proj.rotary).then(|| real_positions(&mask_pad, batch, n, &x.device()));
        let (q, k) = rotate_queries_keys(q, k, &positions);
        let (k, beta, log_decay) = match &mask_pad {
            Some(mask) => {
                let mask = mask.clone().reshape([batch, 1, n, 1]);
                (
                    k.mask_fill(mask.clone(), 0.0),
                    beta.mask_fill(mask.clone(), 0.0),
                    log_decay.map(|g| g.mask_fill(mask, 0.0)),
                )
            }
            None => (k, beta, log_decay),
        };
        if causal {
            let (o, s) = delta_causal(q, k, v, (beta, log_decay), None, DELTA_CHUNK);
            let seen = real_tokens(&mask_pad, batch, n, &x.device());
            let state = DecodingState::Decayed(DecayedState { s, seen });
            (self.finish(o, x), Some(state))
        } else {
            let o = delta_bidirectional(q, k, v, (beta, log_decay), DELTA_CHUNK);
            (self.finish(o, x), None)
        }
    }
}

impl DeltaNetAttention {
    /// One token from the decoding state.
    fn step(&self, x: Tensor<3>, state: DecodingState) -> DecodeResult {
        let batch = x.dims()[0];
        let (s, seen) = decayed_state(state, self.info().name, batch, &x.device())?;
        let (q, k, v, beta, log_decay) = self.project(x.clone());
        let (q, k) = rotate_queries_keys(q, k, &self.proj.rotary.then(|| seen.clone()));
        let (o, s) = delta_step(q, k, v, (beta, log_decay), s);
        let state = DecayedState {
            s,
            seen: seen + 1.0,
        };
        Ok((self.finish(o, x), DecodingState::Decayed(state)))
    }
}

recurrent_module!(DeltaNetAttention, rotary: proj.rotary);
