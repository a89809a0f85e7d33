//! Performer: softmax attention approximated with positive orthogonal random features
//! (FAVOR+), and the generalized ReLU kernel.
//!
//! Choromanski et al. 2021, "Rethinking Attention with Performers", arXiv 2009.14794.
//!
//! **FAVOR+.** The paper's features of a query or key `x` of width `d` are
//! `φ(x) = m^{-1/2} exp(W x̂ − ‖x̂‖²/2)`, `x̂ = x · d^{-1/4}`, with `W: [m, d]` stacked `d × d`
//! orthogonal blocks (Gram-Schmidt of Gaussian blocks) whose rows are rescaled to χ(d)-distributed
//! norms; then `E[φ(q)·φ(k)] = exp(q·k/√d)`, the softmax kernel, and the attention is the
//! kernelized form ([`kernelized_attention`]) with these features.
//!
//! The exponent spans tens of units at ordinary scales (`‖x̂‖²/2` alone is `4.5 √d` for
//! `‖x‖ = 3√d`), so the features are computed with stabilisers: quantities taken out of the
//! exponent that cancel in the normalisation `Σ_j φ(q)·φ(k_j) v_j / Σ_j φ(q)·φ(k_j)`.
//! - Keys: for each feature `f`, `K_f`, the largest `w_f·k̂ − ‖k̂‖²/2` over the real keys of the
//!   sequence and head, is subtracted, so each feature's largest key value is exactly 1.
//!   `‖k̂‖²/2` differs between keys and stays: it is part of the kernel, not a stabiliser.
//! - Queries: `K_f − max_f K_f` is added to the exponent of feature `f`, which restores every
//!   product `φ(q)_f φ(k)_f` (the common `max_f K_f` is one factor on all of them). Then
//!   everything constant along a query's row is dropped, `‖q̂‖²/2`, `ln √m` and the row's
//!   largest exponent, so the row's largest feature is exactly 1.
//!
//! A factor common to a whole query row, or to every key of a sequence and head, multiplies the
//! numerator and the denominator alike and cancels exactly, because no ε is added to the
//! normaliser ([`crate::engines::kernelized`] explains why). So the outputs are the paper's estimator to
//! f32 round-off (checked against a float64 implementation of the paper's formula at query and
//! key norms up to 3√d, causal and not, with padding). Without causal masking each row's
//! denominator is at least 1, the product of the row's largest feature and that feature's
//! largest key, so nothing underflows; a causal row sums over earlier keys only, which may sit
//! below their features' maxima (over all keys), and f32 holds such products down to about
//! e⁻⁸⁷ in the forward pass; the backward pass holds down to denominators of 1e-30 (about e⁻⁶⁹,
//! [`GRADIENT_DENOMINATOR_FLOOR`](crate::GRADIENT_DENOMINATOR_FLOOR)), where inputs at four
//! times unit scale once gave NaN gradients. The stabilisers are held constant in the backward
//! pass (they cancel, so their gradient is zero). Padded keys take no part in them: their
//! exponents are set to −10³⁰ first.
//!
//! The accuracy of the estimator itself is tabulated in [`favor_attention`].
//!
//! **Generalized ReLU kernel** (LRA's default "performer"): `φ(x) = ReLU(x) + 10⁻³`, no random
//! features.
//!
//! **Rotary positions**, both kernels: RoFormer's form for linear attention, the features
//! rotated at their positions in the numerator only ([`kernelized_heads`]); FAVOR+ turns its
//! `m` features in pairs (`m` even). A per-feature stabiliser would not survive the turn (it
//! mixes the two features of a pair, whose factors then no longer cancel), so with rotary
//! positions the keys' stabiliser is the larger of each pair's two maxima, one factor per
//! pair, which the turn leaves alone; decoding keeps the same running pair maxima.
//!
//! Cost: O(n m d) time, O(n m + m d) memory per head. Masks: padding; causal through the chunked
//! prefix sums of [`kernelized_attention`].
//!
//! `W` is saved with the module but not trained. Redrawing it is an explicit call
//! ([`AttentionModule::redraw`]) that a training loop makes every N steps, never a side effect
//! of `forward`.

use crate::variants::prelude::*;
use burn::module::Param;
use burn::tensor::activation::relu;
use serde::{Deserialize, Serialize};

use crate::contract::RecurrentState;
use crate::contract::variant::check_rotary;
use crate::engines::features::orthogonal_features;

use crate::engines::kernelized::{
    kernelized_attention, kernelized_decode, kernelized_heads, kernelized_prompt_state,
    recurrent_state,
};
use crate::kernels;

use crate::engines::params::lazy_param;

const CAPABILITIES: Capabilities = Capabilities {
    causal: true,
    cross_attention: true,
    weights_sum_to_one: true,
    per_head_form: true,
    rotary: true,
    ..Capabilities::PADDING_ONLY
};

/// The registry entry of FAVOR+.
pub const INFO: VariantInfo = VariantInfo {
    name: "performer",
    paper: "Choromanski et al. 2021, arXiv 2009.14794 (FAVOR+)",
    time: "O(n m d)",
    memory: "O(n m + m d); causal O(n (m + c + m d/c)), c = 64",
    capabilities: CAPABILITIES,
};

/// The registry entry of the generalized ReLU kernel (LRA's default "performer").
pub const INFO_RELU: VariantInfo = VariantInfo {
    name: "performer-relu",
    paper: "Choromanski et al. 2021, arXiv 2009.14794 (generalized ReLU kernel)",
    time: "O(n d²)",
    memory: "O(n d + d²); causal O(n (c + d²/c)), c = 64",
    capabilities: CAPABILITIES,
};

/// The kernel a Performer approximates or uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PerformerKernel {
    /// FAVOR+: positive orthogonal random features for the softmax kernel.
    Softmax,
    /// `ReLU(x) + 1e-3` on queries and keys, no random features.
    Relu,
}

/// Configuration of [`PerformerAttention`].
#[derive(Config, Debug)]
pub struct PerformerConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Random features `m` (LRA: 256).
    #[config(default = 256)]
    pub n_features: usize,
    /// Kernel.
    #[config(default = "PerformerKernel::Softmax")]
    pub kernel: PerformerKernel,
    /// Biases on the Q, K, V and output projections.
    #[config(default = false)]
    pub bias: bool,
}

impl PerformerKernel {
    /// The registry entry of the variant with this kernel.
    pub fn info(self) -> &'static VariantInfo {
        match self {
            Self::Softmax => &INFO,
            Self::Relu => &INFO_RELU,
        }
    }
}

impl PerformerConfig {
    fn name(&self) -> &'static str {
        self.kernel.info().name
    }
}

impl VariantConfig for PerformerConfig {
    variant_glue!(PerformerAttention, &[INFO, INFO_RELU]);

    /// 24 features.
    fn small(self) -> Self {
        self.with_n_features(24)
    }

    fn for_variant(name: &str, model: ModelShape) -> Self {
        let kernel = if name == INFO_RELU.name {
            PerformerKernel::Relu
        } else {
            PerformerKernel::Softmax
        };
        Self::new(model.d_model, model.n_heads).with_kernel(kernel)
    }

    fn info(&self) -> &'static VariantInfo {
        self.kernel.info()
    }

    fn frozen_params(&self) -> Option<usize> {
        match self.kernel {
            PerformerKernel::Softmax => self.n_features.checked_mul(self.d_model / self.n_heads),
            PerformerKernel::Relu => Some(0),
        }
    }

    fn check_fields(&self) -> Result<(), AttentionError> {
        if self.kernel == PerformerKernel::Softmax && self.n_features == 0 {
            return Err(AttentionError::field(
                self.name(),
                "n_features",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// Creates the module, drawing the random features from `device`'s generator.
    fn build(&self, device: &Device) -> PerformerAttention {
        let d_head = self.d_model / self.n_heads;
        let features = match self.kernel {
            PerformerKernel::Softmax => Some({
                let m = self.n_features;
                lazy_param([m, d_head], device, false, move |device| {
                    orthogonal_features(m, d_head, device)
                })
            }),
            PerformerKernel::Relu => None,
        };
        PerformerAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            features,
            kernel: self.kernel,
        }
    }
}

inherent_config_methods!(PerformerConfig);

fn frozen(t: Tensor<2>) -> Param<Tensor<2>> {
    Param::from_tensor(t).set_require_grad(false)
}

/// Multi-head Performer attention. Create with [`PerformerConfig`].
#[derive(Module, Debug)]
pub struct PerformerAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
    /// Random features `W: [m, d_head]`, saved but not trained (FAVOR+ only).
    pub features: Option<Param<Tensor<2>>>,
    /// Kernel.
    #[module(skip)]
    pub kernel: PerformerKernel,
}

projection_shape!(PerformerAttention);

impl PerformerAttention {
    /// The causal forward pass over prompts (padded by `mask_pad`) and the recurrent state
    /// summed from their real keys and values, FAVOR+'s features stabilised by their largest
    /// log-feature over each prompt's real keys, as decoding keeps them.
    fn prefill_with(&self, x: Tensor<3>, mask_pad: Option<Tensor<2, Bool>>) -> DecodeResult {
        let masks = self
            .proj
            .with_positions(HeadMasks::new(mask_pad.clone(), true), &x);
        let positions = masks.positions.clone();
        let (q, k, v) = self.proj.qkv(x);
        let o = self.attend(q, k.clone(), v.clone(), masks)?;
        let state = match &self.features {
            Some(w) => {
                let wt = scaled_features(&w.val(), &k);
                let (log_k, key_max) = padded_log_keys(k, wt, mask_pad.as_ref(), self.proj.rotary);
                let phi_k = (log_k - key_max.clone()).exp();
                RecurrentState {
                    key_max: Some(key_max),
                    ..kernelized_prompt_state(phi_k, v, positions, &mask_pad)
                }
            }
            None => kernelized_prompt_state(relu_features(k), v, positions, &mask_pad),
        };
        Ok((self.proj.out(o), DecodingState::Recurrent(state)))
    }
}

impl AttentionModule for PerformerAttention {
    variant_facts!(self.kernel);

    forward_through_projections!();

    /// Rotary positions: RoFormer's linear form turns the features, `d_head` of them with the
    /// ReLU kernel and `m` with FAVOR+, which must be even.
    fn with_rotary(mut self) -> Result<Self, AttentionError> {
        let width = match &self.features {
            Some(w) => w.val().dims()[0],
            None => self.proj.d_model() / self.proj.n_heads(),
        };
        check_rotary(self.name(), self.capabilities(), width)?;
        self.proj.rotary = true;
        Ok(self)
    }

    /// With rotary positions in `masks`, RoFormer's form for linear attention: the features
    /// rotated in the numerator only ([`kernelized_heads`]).
    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        check_head_input(self.kernel.info(), &q, &k, &masks)?;
        let (phi_q, phi_k) = match &self.features {
            Some(w) => {
                let paired = masks.positions.is_some();
                favor_features(q, k, w.val(), masks.key_pad.as_ref(), paired)
            }
            None => (relu_features(q), relu_features(k)),
        };
        Ok(kernelized_heads(phi_q, phi_k, v, masks))
    }

    prefill_through!(prefill_with);

    fn decode(&self, x: Tensor<3>, state: DecodingState) -> DecodeResult {
        check_token(self.name(), self.d_model(), &x)?;
        let state = recurrent_state(state, self.kernel.info().name)?;
        let (q, k, v) = self.proj.qkv(x);
        let (o, state) = match &self.features {
            Some(w) => favor_step(q, k, v, w.val(), state, self.proj.rotary),
            None => kernelized_decode(
                relu_features(q),
                relu_features(k),
                v,
                state,
                self.proj.rotary,
            ),
        };
        Ok((self.proj.out(o), DecodingState::Recurrent(state)))
    }

    /// Draws new random features from the device's generator (a no-op for the ReLU kernel).
    fn redraw(mut self) -> Self {
        if let Some(w) = self.features.take() {
            let [m, d] = w.val().dims();
            let device = w.val().device();
            self.features = Some(frozen(orthogonal_features(m, d, &device)));
        }
        self
    }
}

/// The generalized ReLU kernel's features, `ReLU(x) + 10⁻³`.
fn relu_features(x: Tensor<4>) -> Tensor<4> {
    relu(x).add_scalar(1e-3)
}

/// FAVOR+ attention on per-head tensors with random features `w: [m, d]`: the features of
/// [`favor_features`] through [`kernelized_attention`].
///
/// Its error is the estimator's own. Mean relative error of the output to exact softmax
/// attention, `Σ|o − o_softmax| / Σ|o_softmax|`, for q, k, v ~ N(0, 1) (norms about √d), n = 128,
/// 2 heads, mean over 8 draws of `W` ([`orthogonal_features`]); "f64" is a float64
/// implementation of the paper's formula with the same `W`, "ours" this function in f32 (the
/// `favor_accuracy_table` test of `tests/checks.rs` measures and prints it):
///
/// | d | m = 16 (f64 / ours) | m = 64 | m = 256 | m = 1,024 |
/// |---|---|---|---|---|
/// | 16 | 1.4296 / 1.4296 | 1.1108 / 1.1108 | 0.9656 / 0.9656 | 0.8141 / 0.8141 |
/// | 64 | 2.6102 / 2.6102 | 2.2825 / 2.2825 | 1.9826 / 1.9826 | 1.8082 / 1.8082 |
///
/// The two columns agree to the digits shown (output by output to 1e-4 relative, the test's
/// check). The error is large and falls slowly with `m` because the positive-feature
/// estimator's relative variance for a pair is `(exp(‖q̂ + k̂‖²) − 1) / m` (the paper's Lemma 2),
/// with `‖q̂ + k̂‖² ≈ 2√d` here: about 3,000 / m at d = 16 and 9·10⁶ / m at d = 64, while the
/// exact outputs, near-uniform averages of 128 unit values, are small. Smaller queries and keys
/// (trained models learn them) or more features make it accurate.
///
/// # Shapes
/// - `q`, `k`, `v`: `[batch, heads, n, d]`
/// - `mask_pad`: `[batch, n]`, `true` = padding
/// - output: `[batch, heads, n, d]`
pub fn favor_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    w: Tensor<2>,
    mask_pad: Option<Tensor<2, Bool>>,
    causal: bool,
) -> Tensor<4> {
    let (phi_q, phi_k) = favor_features(q, k, w, mask_pad.as_ref(), false);
    kernelized_attention(phi_q, phi_k, v, mask_pad, causal)
}

/// The stabilised FAVOR+ features `(φ(Q), φ(K))` of per-head queries and keys (see the module
/// docs): every product `φ(q)_f φ(k)_f` is the paper's times one positive factor per query row
/// and per batch element and head, which cancels in [`kernelized_attention`]. The largest entry
/// of each query row, and of each feature over the real keys, is 1; with `paired`, the keys'
/// stabiliser is one per pair of features (for rotary positions, which turn the pairs), and the
/// largest entry of each pair over the keys is 1.
///
/// # Shapes
/// - `q`, `k`: `[batch, heads, n, d]`; `w`: `[m, d]`
/// - `mask_pad`: `[batch, n]`, `true` = padding
/// - output: two `[batch, heads, n, m]`
pub fn favor_features(
    q: Tensor<4>,
    k: Tensor<4>,
    w: Tensor<2>,
    mask_pad: Option<&Tensor<2, Bool>>,
    paired: bool,
) -> (Tensor<4>, Tensor<4>) {
    let wt = scaled_features(&w, &k);

    // Keys: the log-features w_f·k̂ − ‖k̂‖²/2, less their largest value over the real keys, one
    // maximum per feature f.
    let (log_k, k_stab) = padded_log_keys(k, wt.clone(), mask_pad, paired);
    let k_stab = k_stab.detach(); // [b, h, 1, m]
    let phi_k = kernels::exp(log_k - k_stab.clone());

    // Queries: the per-feature key maxima move onto the queries (φ(q)·φ(k) is unchanged), less
    // their largest (a constant), then everything constant along a row (‖q̂‖²/2, ln √m, the
    // row's maximum) cancels. Keeping the added terms at or below 0 keeps the exponents small,
    // and with them their round-off.
    (query_features(q, wt, k_stab), phi_k)
}

/// The keys' log-features ([`key_log_features`]) with padded keys at [`PADDED_LOG_FEATURE`], and
/// their stabiliser over the real keys ([`key_stabiliser`], one per pair of features with
/// `paired`), `[batch, heads, 1, m]`.
fn padded_log_keys(
    k: Tensor<4>,
    wt: Tensor<4>,
    mask_pad: Option<&Tensor<2, Bool>>,
    paired: bool,
) -> (Tensor<4>, Tensor<4>) {
    let [batch, _, n, _] = k.dims();
    let mut log_k = key_log_features(k, wt);
    if let Some(mask) = mask_pad {
        log_k = log_k.mask_fill(mask.clone().reshape([batch, 1, n, 1]), PADDED_LOG_FEATURE);
    }
    let key_max = key_stabiliser(log_k.clone().max_dim(2), paired);
    (log_k, key_max)
}

/// The keys' stabiliser from their per-feature maxima `key_max: [batch, heads, 1, m]`: those
/// maxima, or, `paired` (rotary positions, which turn features `2i` and `2i + 1` together), the
/// larger of each pair's two, so that the factor it takes out is the same for both features of
/// a pair and commutes with the turn.
fn key_stabiliser(key_max: Tensor<4>, paired: bool) -> Tensor<4> {
    if !paired {
        return key_max;
    }
    let [batch, heads, rows, m] = key_max.dims();
    key_max
        .reshape([batch, heads, rows, m / 2, 2])
        .max_dim(4)
        .expand([batch, heads, rows, m / 2, 2])
        .reshape([batch, heads, rows, m])
}

/// `d^{-1/4} Wᵀ` expanded to the batch and heads of `x: [batch, heads, n, d]`: `(x s) Wᵀ =
/// x (s Wᵀ)`, so the scale goes onto the small `[d, m]` matrix, not onto the per-head views.
fn scaled_features(w: &Tensor<2>, x: &Tensor<4>) -> Tensor<4> {
    let [batch, heads, _, d] = x.dims();
    let m = w.dims()[0];
    w.clone()
        .transpose()
        .mul_scalar((d as f32).powf(-0.25))
        .unsqueeze::<4>()
        .expand([batch, heads, d, m])
}

/// The keys' log-features `w_f·k̂ − ‖k̂‖²/2`, `[batch, heads, n, m]` (`wt` from
/// [`scaled_features`]; `‖k s‖²/2 = ‖k‖² s²/2`).
fn key_log_features(k: Tensor<4>, wt: Tensor<4>) -> Tensor<4> {
    let d = k.dims()[3];
    let half_sq = k
        .clone()
        .powi_scalar(2)
        .sum_dim(3)
        .mul_scalar(0.5 / (d as f32).sqrt()); // [b, h, n, 1]
    k.matmul(wt) - half_sq
}

/// The queries' features given the keys' per-feature maxima `key_max: [batch, heads, 1, m]`:
/// the maxima move onto the queries (φ(q)·φ(k) is unchanged), less their largest (a constant);
/// then everything constant along a row (‖q̂‖²/2, ln √m, the row's maximum) cancels. Keeping
/// the added terms at or below 0 keeps the exponents small, and with them their round-off.
fn query_features(q: Tensor<4>, wt: Tensor<4>, key_max: Tensor<4>) -> Tensor<4> {
    let k_shift = key_max.clone() - key_max.max_dim(3);
    let log_q = q.matmul(wt) + k_shift; // [b, h, n_q, m]
    let q_stab = log_q.clone().max_dim(3).detach();
    kernels::exp(log_q - q_stab)
}

/// One decoding step of causal FAVOR+: the running per-feature key maximum (per pair of
/// features with `rotary` positions) replaces the maximum over the whole sequence (the sums
/// carried so far are rescaled when it grows), so the output is the causal forward pass's to
/// round-off.
///
/// # Shapes
/// - `q`, `k`, `v`: `[batch, heads, 1, d]`; `w`: `[m, d]`; output: `[batch, heads, 1, d]`
fn favor_step(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    w: Tensor<2>,
    state: Option<RecurrentState>,
    rotary: bool,
) -> (Tensor<4>, RecurrentState) {
    let wt = scaled_features(&w, &k);
    let log_k = key_log_features(k, wt.clone()); // [b, h, 1, m]
    let token_max = key_stabiliser(log_k.clone(), rotary);
    let (key_max, state) = match state {
        Some(RecurrentState {
            s,
            z,
            key_max: Some(old_max),
            seen,
        }) => {
            let key_max = old_max.clone().max_pair(token_max);
            // S and z were summed with features divided by exp(old_max); bring them to the new
            // maximum: a factor exp(old − new) ≤ 1 per feature (a row of S and of z).
            let rescale = (old_max - key_max.clone()).exp().swap_dims(2, 3); // [b, h, m, 1]
            let state = RecurrentState {
                s: s * rescale.clone(),
                z: z * rescale,
                key_max: None,
                seen,
            };
            (key_max, Some(state))
        }
        _ => (token_max, None),
    };
    let phi_k = (log_k - key_max.clone()).exp();
    let phi_q = query_features(q, wt, key_max.clone());
    let (o, state) = kernelized_decode(phi_q, phi_k, v, state, rotary);
    (
        o,
        RecurrentState {
            key_max: Some(key_max),
            ..state
        },
    )
}

/// The log-feature given to padded keys: far below any real one, so that they take no part in
/// the key stabiliser and their features are 0 (`kernelized_attention` zeroes them as well).
const PADDED_LOG_FEATURE: f32 = -1.0e30;
