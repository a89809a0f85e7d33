//! Linformer: softmax attention over keys and values projected along the sequence axis.
//!
//! Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity", arXiv 2006.04768.
//! `E, F: [k, n_max]`; `K' = E K`, `V' = F V` (`[k, d]`); `O = softmax(Q K'ᵀ / √d) V'`.
//! Cost: O(n k d) time and O(n k) memory per head.
//!
//! - Sharing (paper §4): see [`LinformerSharing`].
//! - Inputs shorter than `n_max` use `E[:, :n]`, `F[:, :n]`; longer inputs are an error.
//! - Padding: padded rows of K and V are zeroed before the projection, so padding never leaks
//!   into the projected keys (the LRA JAX code ignores masks).
//! - Causal: undefined (`E` mixes future positions into every projected key), so asking for it is
//!   an error rather than silent leakage.
//! - Cross-attention: the projections act on the key side (`n_k <= n_max`); any number of queries.
//! - Init: `E`, `F` trainable, i.i.d. `N(0, 1/k)` (the JL construction of the paper's Theorem 2).
//!
//! The same module, with `scoring` = [`LinformerScoring::Linear`], is Linformer with
//! linear-complexity attention (Verma, "Revisiting Linformer with a modified self-attention with
//! linear complexity"): `H = ρ_q(Q/√d)` (softmax over features), `L = ρ_k((E K)ᵀ/√d)` (softmax over
//! the `k` projected positions), `X = F V`, evaluated as `O = H (L X)`: O(n d² + d² k) time, so
//! the cost in `n` does not grow with `k`. It is Efficient Attention applied to Linformer's
//! projected keys and values. The attention dropout does not apply to it (it has no weight
//! matrix).

use crate::variants::prelude::*;
use burn::module::Param;
use burn::nn::{Dropout, DropoutConfig};
use burn::tensor::Distribution;
use serde::{Deserialize, Serialize};

use crate::contract::input::zero_padded;
use crate::engines::params::lazy_param;
use crate::kernels;

use crate::engines::softmax::{exact_softmax_attention, softmax_attention_with_weights};

const CAPABILITIES: Capabilities = Capabilities {
    cross_attention: true,
    fixed_max_len: true,
    per_head_form: true,
    // F mixes the values with weights of any sign and sum: weights_sum_to_one stays false.
    ..Capabilities::PADDING_ONLY
};

/// The registry entry of Linformer.
pub const INFO: VariantInfo = VariantInfo {
    name: "linformer",
    paper: "Wang et al. 2020, arXiv 2006.04768",
    time: "O(n k d)",
    memory: "O(n k)",
    // Its weights are the softmax over the k projected keys.
    capabilities: Capabilities {
        returns_weights: true,
        ..CAPABILITIES
    },
};

/// The registry entry of Linformer with linear-complexity attention.
pub const INFO_LINEAR: VariantInfo = VariantInfo {
    name: "linformer-linear",
    paper: "Verma, \"Revisiting Linformer with a modified self-attention with linear complexity\"",
    time: "O(n d² + d² k)",
    memory: "O(n d + d k)",
    capabilities: CAPABILITIES,
};

/// How the queries meet the projected keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinformerScoring {
    /// `softmax(Q K'ᵀ / √d) V'` (Linformer).
    Softmax,
    /// `ρ_q(Q/√d) (ρ_k(K'ᵀ/√d) V')` (Linformer with linear-complexity attention).
    Linear,
}

impl LinformerScoring {
    /// The registry entry of the variant this scoring makes.
    pub fn info(self) -> &'static VariantInfo {
        match self {
            Self::Softmax => &INFO,
            Self::Linear => &INFO_LINEAR,
        }
    }
}

/// Which projections Linformer shares (paper §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinformerSharing {
    /// `E` and `F` per head.
    None,
    /// One `E` and one `F` per layer, shared by its heads.
    Headwise,
    /// One projection per layer, used for keys and values alike (`E = F`).
    KeyValue,
    /// One projection for every layer, head, key and value; owned by the
    /// [`Encoder`](crate::Encoder) and passed in through
    /// [`AttentionInput::shared_projection`].
    Layerwise,
}

impl LinformerSharing {
    /// The config-file spelling of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Headwise => "headwise",
            Self::KeyValue => "key-value",
            Self::Layerwise => "layerwise",
        }
    }
}

/// Configuration of [`LinformerAttention`].
#[derive(Config, Debug)]
pub struct LinformerConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Longest sequence the projections cover (`seq_len` in lucidrains' package).
    pub n_max: usize,
    /// Projected length `k` (the paper's and LRA's 256).
    #[config(default = 256)]
    pub k: usize,
    /// What the projections share.
    #[config(default = "LinformerSharing::Headwise")]
    pub sharing: LinformerSharing,
    /// Softmax scoring (`linformer`) or linear-complexity scoring (`linformer-linear`).
    #[config(default = "LinformerScoring::Softmax")]
    pub scoring: LinformerScoring,
    /// Dropout on the attention weights (default 0: none). In training on `flex` the fused
    /// kernel drops weights itself; on `tch`, whose CPU flash kernel has no dropout, a non-zero
    /// value runs the composed steps instead, which keep the n × n weights for the backward pass
    /// (several times slower and memory quadratic in n).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases on the Q, K, V and output projections.
    #[config(default = false)]
    pub bias: bool,
}

impl LinformerConfig {
    /// The projection `[1, k, n_max]` shared by every layer under `layerwise` sharing.
    pub fn init_shared_projection(&self, device: &Device) -> Param<Tensor<3>> {
        self.projection(1, device)
    }

    fn projection(&self, count: usize, device: &Device) -> Param<Tensor<3>> {
        let std = 1.0 / (self.k as f64).sqrt();
        let shape = [count, self.k, self.n_max];
        lazy_param(shape, device, true, move |device| {
            Tensor::random(shape, Distribution::Normal(0.0, std), device)
        })
    }
}

impl VariantConfig for LinformerConfig {
    variant_glue!(LinformerAttention, &[INFO, INFO_LINEAR], dropout);

    /// Linformer k = 5 projected positions.
    fn small(self) -> Self {
        self.with_k(5)
    }

    fn for_variant(name: &str, model: ModelShape) -> Self {
        let scoring = if name == INFO_LINEAR.name {
            LinformerScoring::Linear
        } else {
            LinformerScoring::Softmax
        };
        Self::new(model.d_model, model.n_heads, model.n_max).with_scoring(scoring)
    }

    fn info(&self) -> &'static VariantInfo {
        self.scoring.info()
    }

    fn warnings(&self) -> Vec<String> {
        if self.k < self.n_max {
            return Vec::new();
        }
        vec![format!(
            "{}: `k` ({}) is not below `n_max` ({}): projecting the keys to k positions \
             compresses nothing",
            self.scoring.info().name,
            self.k,
            self.n_max
        )]
    }

    fn check_input(&self, n_q: usize, n_k: usize, causal: bool) -> Result<(), AttentionError> {
        check_input(self.scoring.info(), self.n_max, n_q, n_k, causal)
    }

    fn check_fields(&self) -> Result<(), AttentionError> {
        let name = self.scoring.info().name;
        check_at_least_one(name, "k", self.k)?;
        check_at_least_one(name, "n_max", self.n_max)?;
        Ok(())
    }

    /// Creates the module. With `layerwise` sharing the module holds no projection of its own:
    /// create the shared one with [`init_shared_projection`](Self::init_shared_projection).
    fn build(&self, device: &Device) -> LinformerAttention {
        let per_head = match self.sharing {
            LinformerSharing::None => self.n_heads,
            _ => 1,
        };
        let (e, f) = match self.sharing {
            LinformerSharing::None | LinformerSharing::Headwise => (
                Some(self.projection(per_head, device)),
                Some(self.projection(per_head, device)),
            ),
            LinformerSharing::KeyValue => (Some(self.projection(1, device)), None),
            LinformerSharing::Layerwise => (None, None),
        };
        LinformerAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            e,
            f,
            dropout: DropoutConfig::new(self.dropout).init(),
            k: self.k,
            n_max: self.n_max,
            sharing: self.sharing,
            scoring: self.scoring,
        }
    }

    fn shares_projection(&self) -> bool {
        self.sharing == LinformerSharing::Layerwise
    }

    fn layer_shared_projection(&self, device: &Device) -> Option<Param<Tensor<3>>> {
        self.shares_projection()
            .then(|| self.init_shared_projection(device))
    }
}

inherent_config_methods!(LinformerConfig);

/// Multi-head Linformer attention. Create with [`LinformerConfig`].
#[derive(Module, Debug)]
pub struct LinformerAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
    /// Key projection `E: [heads or 1, k, n_max]` (absent under `layerwise` sharing).
    pub e: Option<Param<Tensor<3>>>,
    /// Value projection `F` (absent when it is `E`).
    pub f: Option<Param<Tensor<3>>>,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// Projected length.
    pub k: usize,
    /// Longest sequence accepted.
    pub n_max: usize,
    /// Sharing mode.
    #[module(skip)]
    pub sharing: LinformerSharing,
    /// Softmax or linear-complexity scoring.
    #[module(skip)]
    pub scoring: LinformerScoring,
}

projection_shape!(LinformerAttention);

impl LinformerAttention {
    /// The attention on per-head tensors with the projection shared by every layer
    /// (`layerwise` sharing, `[1, k, n_max]`), or why it cannot be applied: causal masking,
    /// more keys than `n_max`, or `layerwise` sharing without the shared projection.
    ///
    /// # Shapes
    /// - `q`: `[batch, heads, n_q, d_head]`; `k`, `v`: `[batch, heads, n_k, d_head]`
    /// - output: `[batch, heads, n_q, d_head]`
    pub fn attend_shared(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        masks: HeadMasks,
        shared_projection: Option<Tensor<3>>,
    ) -> Result<Tensor<4>, AttentionError> {
        let info = self.scoring.info();
        check_input(info, self.n_max, q.dims()[2], k.dims()[2], masks.causal)?;
        check_attention_mask(info, &masks, &q, k.dims()[2])?;
        let (e, f) = self.projections(info, shared_projection)?;
        let key_pad = masks.key_pad;
        Ok(match self.scoring {
            LinformerScoring::Softmax => attend(q, k, v, e, f, key_pad, Some(&self.dropout)),
            LinformerScoring::Linear => linformer_linear_attention(q, k, v, e, f, key_pad),
        })
    }
}

impl LinformerAttention {
    /// The sequence projections `E` and `F` (`F = E` where keys and values share one), or why
    /// there are none: `layerwise` sharing without the encoder's shared projection.
    fn projections(
        &self,
        info: &VariantInfo,
        shared_projection: Option<Tensor<3>>,
    ) -> Result<(Tensor<3>, Tensor<3>), AttentionError> {
        let e = match (&self.e, shared_projection) {
            (Some(e), _) => e.val(),
            (None, Some(shared)) => shared,
            (None, None) => {
                return Err(AttentionError::unsupported(
                    info.name,
                    "layerwise sharing without the shared projection \
                     (use Encoder, or AttentionInput::shared_projection)",
                ));
            }
        };
        let f = self
            .f
            .as_ref()
            .map(|f| f.val())
            .unwrap_or_else(|| e.clone());
        Ok((e, f))
    }
}

impl AttentionModule for LinformerAttention {
    variant_facts!(self.scoring);

    rotary_refused!(
        "its keys are projected along the sequence (E K), which mixes positions before any score"
    );

    /// The weights of the softmax over the `k` projected keys, `[batch, heads, n_q, k]` (the
    /// linear-complexity scoring forms none, and refuses).
    fn try_forward_with_weights(&self, input: AttentionInput) -> WeightsResult {
        input.check_shapes(self.name(), self.d_model())?;
        let info = self.scoring.info();
        if self.scoring != LinformerScoring::Softmax {
            return Err(AttentionError::unsupported(
                info.name,
                "returning its attention weights (its scoring forms none)",
            ));
        }
        let shared = input.shared().cloned();
        let masks = input.head_masks();
        let (q, k, v) = self.proj.project(input);
        check_input(info, self.n_max, q.dims()[2], k.dims()[2], masks.causal)?;
        check_attention_mask(info, &masks, &q, k.dims()[2])?;
        let (e, f) = self.projections(info, shared)?;
        let k = project_sequence(e, zero_padded(k, &masks.key_pad));
        let v = project_sequence(f, zero_padded(v, &masks.key_pad));
        let no_masks = HeadMasks::default();
        let (o, weights) = softmax_attention_with_weights(q, k, v, &no_masks, Some(&self.dropout));
        Ok((self.proj.out(o), weights))
    }

    fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        input.check_shapes(self.name(), self.d_model())?;
        let shared = input.shared().cloned();
        self.proj.apply(input, |q, k, v, masks| {
            self.attend_shared(q, k, v, masks, shared)
        })
    }

    /// `layerwise` sharing needs the encoder's shared projection: use
    /// [`attend_shared`](LinformerAttention::attend_shared).
    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        self.attend_shared(q, k, v, masks, None)
    }
}

/// Rejects what Linformer cannot do: causal masking, more keys than `n_max`.
fn check_input(
    info: &'static VariantInfo,
    n_max: usize,
    n_q: usize,
    n_k: usize,
    causal: bool,
) -> Result<(), AttentionError> {
    if causal {
        return Err(AttentionError::unsupported(
            info.name,
            "causal masking: its projections mix future positions into every key",
        ));
    }
    check_within_max_len(info, n_max, n_q, n_k, causal)
}

/// Linformer attention on per-head tensors, the functional form of [`LinformerAttention`].
///
/// `e` and `f` are `[p, k, n_max]` with `p` = 1 (shared by heads) or `heads`, and `n_max >= n_k`;
/// their first `n_k` columns are used.
///
/// # Shapes
/// - `q`: `[batch, heads, n_q, d]`; `k`, `v`: `[batch, heads, n_k, d]`, `n_k <= n_max`
/// - `mask_pad`: `[batch, n_k]`, `true` = padding
/// - output: `[batch, heads, n_q, d]`
pub fn linformer_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    e: Tensor<3>,
    f: Tensor<3>,
    mask_pad: Option<Tensor<2, Bool>>,
) -> Tensor<4> {
    attend(q, k, v, e, f, mask_pad, None)
}

/// Linformer with linear-complexity attention on per-head tensors: `H (L X)` with
/// `H = ρ_q(Q/√d)`, `L = ρ_k((E K)ᵀ/√d)`, `X = F V`; `e`, `f` as in [`linformer_attention`].
///
/// # Shapes
/// - `q`: `[batch, heads, n_q, d]`; `k`, `v`: `[batch, heads, n_k, d]`, `n_k <= n_max`
/// - `mask_pad`: `[batch, n_k]`, `true` = padding
/// - output: `[batch, heads, n_q, d]`
pub fn linformer_linear_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    e: Tensor<3>,
    f: Tensor<3>,
    mask_pad: Option<Tensor<2, Bool>>,
) -> Tensor<4> {
    let scale = 1.0 / (q.dims()[3] as f32).sqrt();
    let h = kernels::softmax(q.mul_scalar(scale)); // [b, h, n, d]
    let l = kernels::softmax(
        project_sequence(e, zero_padded(k, &mask_pad))
            .swap_dims(2, 3)
            .mul_scalar(scale),
    ); // [b, h, d, k]
    let x = project_sequence(f, zero_padded(v, &mask_pad)); // [b, h, k, d]
    h.matmul(l.matmul(x))
}

/// Projects the sequence axis: `P[:, :, :n] X` for `P: [p, k, n_max]`, `X: [b, h, n, d]`.
pub(crate) fn project_sequence(p: Tensor<3>, x: Tensor<4>) -> Tensor<4> {
    let [batch, heads, n, d] = x.dims();
    let [count, k, _] = p.dims();
    let p = p.slice([0..count, 0..k, 0..n]);
    if count == 1 {
        // One projection for every head: a single `[k, n] @ [n, heads·d]` product per sequence
        // instead of one thin product per head (the heads are a view of the `[batch, n,
        // heads·d]` projection output, so undoing the split costs nothing).
        let x = x.swap_dims(1, 2).reshape([batch, n, heads * d]);
        let y = p.expand([batch, k, n]).matmul(x);
        return y.reshape([batch, k, heads, d]).swap_dims(1, 2);
    }
    p.unsqueeze::<4>().expand([batch, heads, k, n]).matmul(x)
}

fn attend(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    e: Tensor<3>,
    f: Tensor<3>,
    mask_pad: Option<Tensor<2, Bool>>,
    dropout: Option<&Dropout>,
) -> Tensor<4> {
    // Exact softmax attention over the k projected keys and values: no mask is left to apply,
    // padding having been zeroed out of the projections.
    let k = project_sequence(e, zero_padded(k, &mask_pad));
    let v = project_sequence(f, zero_padded(v, &mask_pad));
    exact_softmax_attention(q, k, v, None, false, dropout)
}
