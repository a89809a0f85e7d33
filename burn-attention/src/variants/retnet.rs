//! RetNet's multi-scale retention.
//!
//! Sun et al. 2023, "Retentive Network: A Successor to Transformer for Large Language Models",
//! arXiv 2307.08621. Per head `h`, with queries and keys rotated by their positions (the
//! paper's `Θ`, [`rotate`](crate::engines::rotary::rotate)) and queries scaled by `d^{-1/2}`:
//! `Retention(X) = (Q Kᵀ ⊙ D) V`, `D_ij = γ_h^{i−j}` for `j ≤ i` (0 otherwise), with the
//! paper's fixed decays `γ_h = 1 − 2^{−5−h}`, one per head. The paper's normalisations follow:
//! `D` divided row by row by `√(Σ_j D_ij)`, the scores `R = Q Kᵀ ⊙ D` divided by
//! `max(|Σ_j R_ij|, 1)`; then each head's output normalised over its channels (GroupNorm with
//! one group per head, without the affine factors, as the authors' code), and the heads gated:
//! `MSR(X) = (swish(X W_G) ⊙ Y) W_O`. Padded positions neither decay nor write the state
//! (a real position's decay counts the real positions between, and its rotation its index
//! among them).
//!
//! Computed as linear attention with a decaying state ([`crate::engines::decay`]): the causal form
//! in chunks of 64 positions, decoding with the `[d, d + 1]` state per head (the last column
//! carries `Σ_j D_ij k_j`, which gives `Σ_j R_ij`), O(d²) a token whatever the position.
//!
//! Non-causal form (the encoder tasks): the symmetric decay `γ_h^{|i−j|}` over every pair, the
//! one-dimensional case of RMT's Manhattan-distance decay (Fan et al. 2024, arXiv 2309.11523),
//! with `√(Σ_j D_ij)` over both sides.
//!
//! Left as the paper's authors' code has it or out: the values and gate are `d_model` wide (the
//! paper widens them to `2 d_model` and narrows the feed-forward layer to keep the parameter
//! count). No cross-attention (retention is defined on one sequence), attention mask or weights.

use crate::variants::prelude::*;
use burn::nn::{Linear, LinearConfig};

use crate::contract::DecayedState;
use crate::engines::decay::{
    DECAY_CHUNK, decayed_bidirectional, decayed_causal, decayed_state, decayed_step, real_tokens,
    without_padding,
};

use crate::kernels::silu;

use crate::engines::heads::merge_heads;
use crate::engines::rotary::{real_positions, rotate_retnet_queries_keys};

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "retnet",
    paper: "Sun et al. 2023, arXiv 2307.08621",
    time: "O(n c d + n d²)",
    memory: "O(n (c + d) + (n / c) (d² + n / c)), c = 64",
    capabilities: Capabilities {
        causal: true,
        ..Capabilities::PADDING_ONLY
    },
};

/// Configuration of [`RetNetAttention`].
#[derive(Config, Debug)]
pub struct RetNetConfig {
    /// Model width; split evenly across heads (an even width per head: the rotation turns
    /// pairs of channels).
    pub d_model: usize,
    /// Number of heads; head `h` decays by `γ_h = 1 − 2^{−5−h}`.
    pub n_heads: usize,
    /// Biases on the Q, K, V, gate and output projections.
    #[config(default = false)]
    pub bias: bool,
    /// The output gate `swish(X W_G)` (the paper's; without it the heads' normalised outputs
    /// go straight to `W_O`, saving `d_model²` parameters).
    #[config(default = true)]
    pub gate: bool,
    /// Epsilon of the per-head normalisation.
    #[config(default = 1e-5)]
    pub norm_eps: f64,
}

impl VariantConfig for RetNetConfig {
    variant_glue!(RetNetAttention, &[INFO], new(d_model, n_heads));

    fn check_fields(&self) -> Result<(), AttentionError> {
        if !(self.d_model / self.n_heads).is_multiple_of(2) {
            return Err(INFO.field_error(
                "d_model",
                format!(
                    "must give an even width per head (the rotation turns pairs of channels), \
                     not {} / {} heads",
                    self.d_model, self.n_heads
                ),
            ));
        }
        if self.norm_eps.is_nan() || self.norm_eps <= 0.0 {
            return Err(INFO.field_error("norm_eps", "must be above 0"));
        }
        Ok(())
    }

    fn build(&self, device: &Device) -> RetNetAttention {
        RetNetAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            gate: self.gate.then(|| {
                LinearConfig::new(self.d_model, self.d_model)
                    .with_bias(self.bias)
                    .init(device)
            }),
            norm_eps: self.norm_eps,
        }
    }
}

inherent_config_methods!(RetNetConfig);

/// Multi-scale retention. Create with [`RetNetConfig`].
#[derive(Module, Debug)]
pub struct RetNetAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
    /// The output gate's projection `W_G` (`None`: no gate).
    pub gate: Option<Linear>,
    /// Epsilon of the per-head normalisation.
    pub norm_eps: f64,
}

projection_shape!(RetNetAttention);

/// The decays `ln γ_h = ln(1 − 2^{−5−h})` of `heads` heads, `[1, heads, 1, 1]`.
pub fn retnet_log_decays(heads: usize, device: &Device) -> Tensor<4> {
    let logs: Vec<f32> = (0..heads)
        .map(|h| (1.0 - 2f64.powi(-5 - h as i32)).ln() as f32)
        .collect();
    Tensor::<1>::from_data(TensorData::new(logs, [heads]), device).reshape([1, heads, 1, 1])
}

/// `Σ_j D_ij` over the real positions `j <= i` for a query with `seen` real positions up to
/// and including itself: `(1 − γ^seen) / (1 − γ)`, from `ln γ` (`[1, heads, 1, 1]`) and `seen`
/// (`[batch, 1, n, 1]`).
fn decay_mass(log_decay: Tensor<4>, seen: Tensor<4>) -> Tensor<4> {
    let one_minus = -(log_decay.clone().exp() - 1.0); // 1 − γ
    (-((seen * log_decay).exp() - 1.0)) / one_minus
}

impl RetNetAttention {
    /// The heads' values with a column of ones appended, so that the same pass gives
    /// `Σ_j R_ij` beside `Σ_j R_ij v_j`.
    fn with_ones(v: Tensor<4>) -> Tensor<4> {
        let [batch, heads, n, _] = v.dims();
        let ones = Tensor::ones([batch, heads, n, 1], &v.device());
        Tensor::cat(vec![v, ones], 3)
    }

    /// The scaled, rotated queries and rotated keys at `positions` (`[batch, n]`).
    fn rotated(&self, q: Tensor<4>, k: Tensor<4>, positions: Tensor<2>) -> (Tensor<4>, Tensor<4>) {
        let d = q.dims()[3];
        let (q, k) = rotate_retnet_queries_keys(q, k, positions);
        (q.mul_scalar((d as f64).powf(-0.5)), k)
    }

    /// From the retention's sums `[Σ_j R_ij v_j, Σ_j R_ij]` (`[batch, heads, n, d + 1]`) and
    /// `√(Σ_j D_ij)` (`[batch, heads, n, 1]`): the normalised scores' output,
    /// `Σ_j R_ij v_j / max(|Σ_j R_ij|, √(Σ_j D_ij))` (the paper's two normalisations in one),
    /// normalised per head, gated by `x` and projected.
    fn finish(&self, sums: Tensor<4>, mass_sqrt: Tensor<4>, x: Tensor<3>) -> Tensor<3> {
        let d = sums.dims()[3] - 1;
        let num = sums.clone().slice(s![.., .., .., 0..d]);
        let den = sums
            .slice(s![.., .., .., d..d + 1])
            .abs()
            .max_pair(mass_sqrt);
        let o = num / den;
        let mean = o.clone().mean_dim(3);
        let centred = o - mean;
        let var = centred.clone().powi_scalar(2).mean_dim(3);
        let y = merge_heads(centred / (var + self.norm_eps).sqrt());
        let y = match &self.gate {
            Some(gate) => silu(gate.forward(x)) * y,
            None => y,
        };
        self.proj.output.forward(y)
    }

    /// Retention over `x: [batch, n, d_model]`, causal or not, padding left out; with the
    /// causal form, also the decoding state after the last position.
    fn mix(
        &self,
        x: Tensor<3>,
        mask_pad: Option<Tensor<2, Bool>>,
        causal: bool,
    ) -> (Tensor<3>, Option<DecodingState>) {
        let [batch, n, _] = x.dims();
        let device = x.device();
        let (q, k, v) = self.proj.qkv(x.clone());
        let heads = q.dims()[1];
        let positions = real_positions(&mask_pad, batch, n, &device);
        let (q, k) = self.rotated(q, k, positions.clone());
        let log_decay = retnet_log_decays(heads, &device);
        let per_position = log_decay.clone().expand([batch, heads, n, 1]);
        let (k, per_position) = without_padding(k, per_position, &mask_pad);
        let v = Self::with_ones(v);
        // The real positions up to each one, at least 1 (a padded query's row is discarded, but
        // must stay finite).
        let seen = (positions.clone() + 1.0)
            .clamp_min(1.0)
            .reshape([batch, 1, n, 1]);
        if causal {
            let (sums, state) = decayed_causal(q, k, v, per_position, DECAY_CHUNK);
            let mass = decay_mass(log_decay, seen);
            let total = real_tokens(&mask_pad, batch, n, &device);
            let state = DecodingState::Decayed(DecayedState {
                s: state,
                seen: total,
            });
            (self.finish(sums, mass.sqrt(), x), Some(state))
        } else {
            let sums = decayed_bidirectional(q, k, v, per_position, DECAY_CHUNK);
            let total = real_tokens(&mask_pad, batch, n, &device).reshape([batch, 1, 1, 1]);
            // Σ_j γ^{|i−j|} = both one-sided sums, less the diagonal they share.
            let after = (total - seen.clone() + 1.0).clamp_min(1.0);
            let mass = decay_mass(log_decay.clone(), seen) + decay_mass(log_decay, after) - 1.0;
            (self.finish(sums, mass.sqrt(), x), None)
        }
    }
}

impl RetNetAttention {
    /// The registry entry.
    fn info(&self) -> &'static VariantInfo {
        &INFO
    }

    /// One token from the decoding state.
    fn step(&self, x: Tensor<3>, state: DecodingState) -> DecodeResult {
        let batch = x.dims()[0];
        let device = x.device();
        let (s, seen) = decayed_state(state, INFO.name, batch, &x.device())?;
        let (q, k, v) = self.proj.qkv(x.clone());
        let heads = q.dims()[1];
        let (q, k) = self.rotated(q, k, seen.clone());
        let log_decay = retnet_log_decays(heads, &device);
        let (sums, s) = decayed_step(
            q,
            k,
            Self::with_ones(v),
            log_decay.clone().expand([batch, heads, 1, 1]),
            s,
        );
        let seen = seen + 1.0;
        let mass = decay_mass(log_decay, seen.clone().reshape([batch, 1, 1, 1]));
        let y = self.finish(sums, mass.sqrt(), x);
        Ok((y, DecodingState::Decayed(DecayedState { s, seen })))
    }
}

recurrent_module!(RetNetAttention, {
    /// Refused: it rotates its queries and keys already (RetNet's angles, the `Θ` of its
    /// retention).
    fn with_rotary(self) -> Result<Self, AttentionError> {
        Err(rotary_without_meaning(
            INFO.name,
            "it rotates its queries and keys already (RetNet's angles, the Θ of its retention)",
        ))
    }
});
