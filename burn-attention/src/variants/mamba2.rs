//! Mamba-2's state-space duality (SSD) mixer, the attention-like core of its layer.
//!
//! Dao & Gu 2024, "Transformers are SSMs: Generalized Models and Efficient Algorithms Through
//! Structured State Space Duality", arXiv 2405.21060. Per head `h`, a scalar decay that depends
//! on the token: `Δ_t = softplus(x_t W_Δ + b_Δ)`, `a_t = exp(Δ_t A_h)` with `A_h = −exp(A_log,h)`,
//! and the recurrence `S_t = a_t S_{t−1} + Δ_t B_t x_tᵀ`, `y_t = S_tᵀ C_t + D_h x_t`: in its dual,
//! attention-like form `y_i = Σ_{j ≤ i} exp(Σ_{l=j+1..i} Δ_l A_h) (C_i·B_j) Δ_j x_j + D_h x_i`.
//! The heads' outputs are gated and normalised as the paper's block does,
//! `RMSNorm(y ⊙ silu(x W_z))`, then projected.
//!
//! Here `C`, `B` and `x` are the query, key and value projections, one per head (the paper's
//! multi-head pattern; its default shares one `B` and `C` across heads); `Δ` a projection to one
//! value per head. Initialisation as the paper's code: `A` uniform in [1, 16], `Δ` log-uniform in
//! [0.001, 0.1] through the bias, `D` 1. Left out: the block's expansion of the width (2× in the
//! paper) and its short causal convolution before the mixer; a `[model]` of an encoder supplies
//! the rest of the block. Computed by the decaying-state core ([`crate::engines::decay`]): causal
//! in chunks of 64 with decays in log space, decoding with a `[d, d]` state per head, O(d²) a
//! token. Padded positions neither decay nor write the state.
//!
//! Non-causal form (the encoder tasks): the forward scan plus a backward scan over the reversed
//! sequence, as the bidirectional state-space models combine them (Hydra, Hwang et al. 2024,
//! arXiv 2407.09941, in its simplest form: two scans sharing their projections, the diagonal
//! counted once): position `i` reads `j > i` decayed by `exp(Σ_{l=i..j−1} Δ_l A_h)`. No
//! cross-attention, attention mask or weights.

use crate::engines::rotary::{real_positions, rotate_queries_keys};
use crate::variants::prelude::*;
use burn::module::Param;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Distribution;
use burn::tensor::activation::softplus;

use crate::contract::DecayedState;
use crate::engines::decay::{
    DECAY_CHUNK, decayed_bidirectional, decayed_causal, decayed_state, decayed_step, real_tokens,
    without_padding,
};

use crate::kernels::silu;

use crate::engines::heads::merge_heads;
use crate::engines::params::lazy_param;

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "mamba2",
    paper: "Dao & Gu 2024, arXiv 2405.21060 (SSD)",
    time: "O(n c d + n d²)",
    memory: "O(n (c + d) + (n / c) (d² + n / c)), c = 64",
    capabilities: Capabilities {
        causal: true,
        rotary: true,
        ..Capabilities::PADDING_ONLY
    },
};

/// Configuration of [`Mamba2Attention`].
#[derive(Config, Debug)]
pub struct Mamba2Config {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads, each with its own decay.
    pub n_heads: usize,
    /// Biases on the C, B, x, gate and output projections.
    #[config(default = false)]
    pub bias: bool,
    /// Epsilon of the gated RMSNorm.
    #[config(default = 1e-5)]
    pub norm_eps: f64,
}

impl VariantConfig for Mamba2Config {
    variant_glue!(Mamba2Attention, &[INFO], new(d_model, n_heads));

    fn check_fields(&self) -> Result<(), AttentionError> {
        if self.norm_eps.is_nan() || self.norm_eps <= 0.0 {
            return Err(INFO.field_error("norm_eps", "must be above 0"));
        }
        Ok(())
    }

    fn build(&self, device: &Device) -> Mamba2Attention {
        let (d, h) = (self.d_model, self.n_heads);
        let linear =
            |out: usize, bias: bool| LinearConfig::new(d, out).with_bias(bias).init(device);
        Mamba2Attention {
            proj: QkvoProjection::new(d, h, self.bias, device),
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
            d_skip: lazy_param([h], device, true, move |device| Tensor::ones([h], device)),
            gate: linear(d, self.bias),
            norm_weight: lazy_param([d], device, true, move |device| Tensor::ones([d], device)),
            norm_eps: self.norm_eps,
        }
    }
}

inherent_config_methods!(Mamba2Config);

/// Mamba-2's SSD mixer. Create with [`Mamba2Config`].
#[derive(Module, Debug)]
pub struct Mamba2Attention {
    /// `C` (query), `B` (key), `x` (value) and output projections.
    pub proj: QkvoProjection,
    /// `W_Δ`: one step size per head, `[d_model, heads]`.
    pub dt_proj: Linear,
    /// `b_Δ`, `[heads]`.
    pub dt_bias: Param<Tensor<1>>,
    /// `A_log`: `A_h = −exp(A_log,h)`, `[heads]`.
    pub a_log: Param<Tensor<1>>,
    /// `D`, the skip connection per head, `[heads]`.
    pub d_skip: Param<Tensor<1>>,
    /// `W_z`, the gate.
    pub gate: Linear,
    /// The gated RMSNorm's scale, `[d_model]`.
    pub norm_weight: Param<Tensor<1>>,
    /// Epsilon of the gated RMSNorm.
    pub norm_eps: f64,
}

projection_shape!(Mamba2Attention);

impl Mamba2Attention {
    /// `Δ` per head and position, `[batch, heads, n, 1]`, and the log-decays `Δ A`.
    fn steps(&self, x: Tensor<3>) -> (Tensor<4>, Tensor<4>) {
        let [batch, n, _] = x.dims();
        let heads = self.a_log.val().dims()[0];
        let bias = self.dt_bias.val().reshape([1, 1, heads]);
        let dt = softplus(self.dt_proj.forward(x) + bias, 1.0)
            .swap_dims(1, 2)
            .reshape([batch, heads, n, 1]);
        let a = self.a_log.val().exp().neg().reshape([1, heads, 1, 1]);
        (dt.clone(), dt * a)
    }

    /// `y + D x` per head, merged, gated, normalised and projected.
    fn finish(&self, y: Tensor<4>, v: Tensor<4>, x: Tensor<3>) -> Tensor<3> {
        let heads = v.dims()[1];
        let y = y + v * self.d_skip.val().reshape([1, heads, 1, 1]);
        let y = merge_heads(y) * silu(self.gate.forward(x));
        let d = y.dims()[2];
        let rms = (y.clone().powi_scalar(2).mean_dim(2) + self.norm_eps).sqrt();
        let y = y / rms * self.norm_weight.val().reshape([1, 1, d]);
        self.proj.output.forward(y)
    }

    /// The mixer over `x: [batch, n, d_model]`, causal or not, padding left out; with the
    /// causal form, also the decoding state after the last position.
    fn mix(
        &self,
        x: Tensor<3>,
        mask_pad: Option<Tensor<2, Bool>>,
        causal: bool,
    ) -> (Tensor<3>, Option<DecodingState>) {
        let [batch, n, _] = x.dims();
        let (c, b, v) = self.proj.qkv(x.clone());
        let positions = self
            .proj
            .rotary
            .then(|| real_positions(&mask_pad, batch, n, &x.device()));
        let (c, b) = rotate_queries_keys(c, b, &positions);
        let (dt, log_decay) = self.steps(x.clone());
        let (b, log_decay) = without_padding(b * dt, log_decay, &mask_pad);
        if causal {
            let (y, s) = decayed_causal(c, b, v.clone(), log_decay, DECAY_CHUNK);
            let seen = real_tokens(&mask_pad, batch, n, &x.device());
            let state = DecodingState::Decayed(DecayedState { s, seen });
            (self.finish(y, v, x), Some(state))
        } else {
            let y = decayed_bidirectional(c, b, v.clone(), log_decay, DECAY_CHUNK);
            (self.finish(y, v, x), None)
        }
    }
}

impl Mamba2Attention {
    /// The registry entry.
    fn info(&self) -> &'static VariantInfo {
        &INFO
    }

    /// The width of a head's `C` and `B`, which rotary positions turn in pairs.
    fn rotary_head_width(&self) -> usize {
        self.proj.d_model() / self.proj.n_heads()
    }

    /// One token from the decoding state.
    fn step(&self, x: Tensor<3>, state: DecodingState) -> DecodeResult {
        let batch = x.dims()[0];
        let (s, seen) = decayed_state(state, INFO.name, batch, &x.device())?;
        let (c, b, v) = self.proj.qkv(x.clone());
        let (c, b) = rotate_queries_keys(c, b, &self.proj.rotary.then(|| seen.clone()));
        let (dt, log_decay) = self.steps(x.clone());
        let (y, s) = decayed_step(c, b * dt, v.clone(), log_decay, s);
        let state = DecayedState {
            s,
            seen: seen + 1.0,
        };
        Ok((self.finish(y, v, x), DecodingState::Decayed(state)))
    }
}

recurrent_module!(Mamba2Attention, rotary: proj.rotary);
