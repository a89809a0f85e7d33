//! Gated linear attention (GLA).
//!
//! Yang, Wang, Shen, Panda & Kim 2024, "Gated Linear Attention Transformers with
//! Hardware-Efficient Training", arXiv 2312.06635. Per head, a gate for every key channel that
//! depends on the token: `α_t = σ(x_t W_α1 W_α2 + b_α)^{1/τ}` (a rank-16 projection, `τ = 16`),
//! and the recurrence `S_t = Diag(α_t) S_{t−1} + k_tᵀ v_t`, `o_t = q_t S_t`: in parallel form
//! `o_i = Σ_{j ≤ i} Σ_a q_ia k_ja (Π_{l=j+1..i} α_la) v_j`. Each head's output is normalised over
//! its channels and gated, `Y = (swish(X W_r + b_r) ⊙ Norm(O)) W_O`. As the paper: keys and
//! queries half the model's width (`expand_k = 0.5`), values and the output gate the full width,
//! so that the layer holds `4 d²` weights as softmax attention does, plus the gate's
//! `16 (d + d/2)`.
//!
//! As the authors' code (fla-org/flash-linear-attention) where the paper leaves it open: queries
//! scaled by `d_k^{-1/2}`, the per-head normalisation an RMSNorm with a learned scale (the paper
//! writes LayerNorm). Computed by the decaying-state core ([`crate::engines::decay`]) with its gates
//! per key channel: causal in chunks of [`GATE_CHUNK`], the log-gates
//! `ln α = logsigmoid(·) / τ` summed over each span; decoding with a `[d_k, d_v]` state per head,
//! O(d_k d_v) a token. Padded positions neither decay nor write the state.
//!
//! Non-causal form (the encoder tasks): the forward recurrence plus the same recurrence over the
//! reversed sequence, the diagonal counted once (as the bidirectional state-space models combine
//! two scans, Hwang et al. 2024, arXiv 2407.09941): position `i` reads `j > i` through the gates
//! of `i..j−1`. No cross-attention, attention mask or weights.
//!
//! Rotary positions ([`AttentionModule::with_rotary`]; not in the paper, offered as the harness
//! offers them to every attention that takes them): queries and keys rotated at their positions
//! among the real tokens (RoFormer's angles) before the recurrence, each decoded token at its own.

use crate::engines::rotary::{real_positions, rotate_queries_keys};
use crate::variants::prelude::*;
use burn::module::Param;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::log_sigmoid;

use crate::contract::DecayedState;
use crate::engines::decay::{
    GATE_CHUNK, decayed_bidirectional, decayed_causal, decayed_state, decayed_step, real_tokens,
    without_padding,
};

use crate::kernels::silu;

use crate::engines::heads::{merge_heads, split_heads};
use crate::engines::params::lazy_param;

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "gla",
    paper: "Yang et al. 2024, arXiv 2312.06635",
    time: "O(n c d + n d²)",
    memory: "O(n c d + (n / c) d²), c = 16",
    capabilities: Capabilities {
        causal: true,
        rotary: true,
        ..Capabilities::PADDING_ONLY
    },
};

/// Configuration of [`GlaAttention`].
#[derive(Config, Debug)]
pub struct GlaConfig {
    /// Model width; the values split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Width of the queries and keys as a fraction of `d_model` (the paper's 0.5); the result
    /// must split evenly across heads.
    #[config(default = 0.5)]
    pub expand_k: f64,
    /// Rank of the gate's projection `W_α1 W_α2` (the paper's 16).
    #[config(default = 16)]
    pub gate_rank: usize,
    /// The gate's temperature `τ`: `α = σ(·)^{1/τ}` (the paper's 16; larger keeps the gates
    /// nearer 1).
    #[config(default = 16.0)]
    pub gate_temperature: f64,
    /// Biases on the query, key, value and output projections (the output gate and the
    /// gate's second projection always have theirs, as the paper).
    #[config(default = false)]
    pub bias: bool,
    /// Epsilon of the per-head normalisation.
    #[config(default = 1e-5)]
    pub norm_eps: f64,
}

impl GlaConfig {
    /// Width of the queries and keys over all heads, if `expand_k` gives a whole number.
    fn key_width(&self) -> Option<usize> {
        let width = self.d_model as f64 * self.expand_k;
        (width.fract() == 0.0 && width >= 1.0 && width <= usize::MAX as f64)
            .then_some(width as usize)
    }
}

impl VariantConfig for GlaConfig {
    variant_glue!(GlaAttention, &[INFO], new(d_model, n_heads));

    fn check_fields(&self) -> Result<(), AttentionError> {
        let field = |name, message: String| Err(INFO.field_error(name, message));
        match self.key_width() {
            Some(width) if width % self.n_heads == 0 => {}
            _ => {
                return field(
                    "expand_k",
                    format!(
                        "d_model × expand_k = {} × {} must be a whole multiple of n_heads ({})",
                        self.d_model, self.expand_k, self.n_heads
                    ),
                );
            }
        }
        check_at_least_one(INFO.name, "gate_rank", self.gate_rank)?;
        if !(self.gate_temperature.is_finite() && self.gate_temperature > 0.0) {
            return field("gate_temperature", "must be above 0".into());
        }
        if self.norm_eps.is_nan() || self.norm_eps <= 0.0 {
            return field("norm_eps", "must be above 0".into());
        }
        Ok(())
    }

    fn build(&self, device: &Device) -> GlaAttention {
        let d = self.d_model;
        let d_k = self.key_width().expect("validated");
        let linear =
            |i: usize, o: usize, bias: bool| LinearConfig::new(i, o).with_bias(bias).init(device);
        GlaAttention {
            query: linear(d, d_k, self.bias),
            key: linear(d, d_k, self.bias),
            value: linear(d, d, self.bias),
            output: linear(d, d, self.bias),
            gate_down: linear(d, self.gate_rank, false),
            gate_up: linear(self.gate_rank, d_k, true),
            out_gate: linear(d, d, true),
            norm_weight: lazy_param([d], device, true, move |device| Tensor::ones([d], device)),
            n_heads: self.n_heads,
            gate_temperature: self.gate_temperature,
            norm_eps: self.norm_eps,
            rotary: false,
        }
    }
}

inherent_config_methods!(GlaConfig);

/// Gated linear attention. Create with [`GlaConfig`].
#[derive(Module, Debug)]
pub struct GlaAttention {
    /// `W_Q`, `[d_model, d_k]` over all heads.
    pub query: Linear,
    /// `W_K`, `[d_model, d_k]`.
    pub key: Linear,
    /// `W_V`, `[d_model, d_model]`.
    pub value: Linear,
    /// `W_O`, `[d_model, d_model]`.
    pub output: Linear,
    /// `W_α1`, the gate's first projection, `[d_model, rank]`.
    pub gate_down: Linear,
    /// `W_α2` and `b_α`, the gate's second projection, `[rank, d_k]`.
    pub gate_up: Linear,
    /// `W_r` and `b_r`, the output gate.
    pub out_gate: Linear,
    /// The per-head RMSNorm's scale, `[d_model]`.
    pub norm_weight: Param<Tensor<1>>,
    /// Number of heads.
    pub n_heads: usize,
    /// The gate's temperature `τ`.
    pub gate_temperature: f64,
    /// Epsilon of the per-head normalisation.
    pub norm_eps: f64,
    /// Rotary positions on ([`AttentionModule::with_rotary`]): queries and keys rotated at
    /// their positions before the recurrence (RoFormer's angles), each decoded token at its own.
    pub rotary: bool,
}

impl GlaAttention {
    /// Model width.
    pub fn d_model(&self) -> usize {
        self.value.weight.lazy_shape()[0]
    }

    /// Number of heads.
    pub fn n_heads(&self) -> usize {
        self.n_heads
    }

    /// Scaled queries, keys, values and log-gates `ln α = logsigmoid(x W_α1 W_α2 + b_α) / τ`
    /// per head: `[batch, heads, n, d_k / heads]` (values `d_model / heads`).
    fn project(&self, x: Tensor<3>) -> [Tensor<4>; 4] {
        let h = self.n_heads;
        let q = split_heads(self.query.forward(x.clone()), h);
        let d_head = q.dims()[3];
        let q = q.mul_scalar((d_head as f64).powf(-0.5));
        let k = split_heads(self.key.forward(x.clone()), h);
        let v = split_heads(self.value.forward(x.clone()), h);
        let logits = self.gate_up.forward(self.gate_down.forward(x));
        let log_gate = split_heads(log_sigmoid(logits), h).div_scalar(self.gate_temperature);
        [q, k, v, log_gate]
    }

    /// The heads' outputs `[batch, heads, n, d_v]`: normalised per head, gated by `x` and
    /// projected.
    fn finish(&self, o: Tensor<4>, x: Tensor<3>) -> Tensor<3> {
        let rms = (o.clone().powi_scalar(2).mean_dim(3) + self.norm_eps).sqrt();
        let d = x.dims()[2];
        let normed = merge_heads(o / rms) * self.norm_weight.val().reshape([1, 1, d]);
        self.output.forward(silu(self.out_gate.forward(x)) * normed)
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
        let [q, k, v, log_gate] = self.project(x.clone());
        let positions = self
            .rotary
            .then(|| real_positions(&mask_pad, batch, n, &x.device()));
        let (q, k) = rotate_queries_keys(q, k, &positions);
        let (k, log_gate) = without_padding(k, log_gate, &mask_pad);
        if causal {
            let (o, s) = decayed_causal(q, k, v, log_gate, GATE_CHUNK);
            let seen = real_tokens(&mask_pad, batch, n, &x.device());
            let state = DecodingState::Decayed(DecayedState { s, seen });
            (self.finish(o, x), Some(state))
        } else {
            let o = decayed_bidirectional(q, k, v, log_gate, GATE_CHUNK);
            (self.finish(o, x), None)
        }
    }
}

impl GlaAttention {
    /// The registry entry.
    fn info(&self) -> &'static VariantInfo {
        &INFO
    }

    /// The width of a head's queries and keys, which rotary positions turn in pairs.
    fn rotary_head_width(&self) -> usize {
        self.query.weight.lazy_shape()[1] / self.n_heads
    }

    /// One token from the decoding state.
    fn step(&self, x: Tensor<3>, state: DecodingState) -> DecodeResult {
        let batch = x.dims()[0];
        let (s, seen) = decayed_state(state, INFO.name, batch, &x.device())?;
        let [q, k, v, log_gate] = self.project(x.clone());
        let (q, k) = rotate_queries_keys(q, k, &self.rotary.then(|| seen.clone()));
        let (o, s) = decayed_step(q, k, v, log_gate, s);
        let state = DecayedState {
            s,
            seen: seen + 1.0,
        };
        Ok((self.finish(o, x), DecodingState::Decayed(state)))
    }
}

recurrent_module!(GlaAttention, rotary: rotary);
