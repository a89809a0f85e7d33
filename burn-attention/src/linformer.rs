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
//! - Init: `E`, `F` trainable, i.i.d. `N(0, 1/k)` (the JL construction of the paper's Theorem 2).
//!
//! The same module, initialised with [`LinformerConfig::init_linear`], is Linformer with
//! linear-complexity attention (Verma, "Revisiting Linformer with a modified self-attention with
//! linear complexity"): `H = ρ_q(Q/√d)` (softmax over features), `L = ρ_k((E K)ᵀ/√d)` (softmax over
//! the `k` projected positions), `X = F V`, evaluated as `O = H (L X)`: O(n d² + d² k) time, so
//! the cost in `n` does not grow with `k`. It is Efficient Attention applied to Linformer's
//! projected keys and values. The attention dropout does not apply to it (it has no weight
//! matrix).

use burn::module::Param;
use burn::nn::{Dropout, DropoutConfig};
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::softmax;
use serde::{Deserialize, Serialize};

use crate::error::{AttentionError, check_heads};
use crate::heads::QkvoProjection;
use crate::input::{AttentionInput, zero_padded};

const NAME: &str = "linformer";
const NAME_LINEAR: &str = "linformer-linear";

/// How the queries meet the projected keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinformerScoring {
    /// `softmax(Q K'ᵀ / √d) V'` (Linformer).
    Softmax,
    /// `ρ_q(Q/√d) (ρ_k(K'ᵀ/√d) V')` (Linformer with linear-complexity attention).
    Linear,
}

impl LinformerScoring {
    /// The registry name of the variant this scoring makes.
    pub fn variant_name(self) -> &'static str {
        match self {
            Self::Softmax => NAME,
            Self::Linear => NAME_LINEAR,
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
    /// Dropout on the attention weights.
    #[config(default = 0.1)]
    pub dropout: f64,
    /// Biases on the Q, K, V and output projections.
    #[config(default = false)]
    pub bias: bool,
}

impl LinformerConfig {
    /// Checks the configuration; the error names the offending field.
    pub fn validate(&self) -> Result<(), AttentionError> {
        check_heads(NAME, self.d_model, self.n_heads, self.dropout)?;
        if self.k == 0 {
            return Err(AttentionError::field(NAME, "k", "must be at least 1"));
        }
        if self.n_max == 0 {
            return Err(AttentionError::field(NAME, "n_max", "must be at least 1"));
        }
        Ok(())
    }

    /// Creates the module. With `layerwise` sharing the module holds no projection of its own:
    /// create the shared one with [`init_shared_projection`](Self::init_shared_projection).
    ///
    /// # Panics
    /// If [`validate`](Self::validate) fails; its message is the panic message.
    pub fn init(&self, device: &Device) -> LinformerAttention {
        self.init_with(LinformerScoring::Softmax, device)
    }

    /// Creates Linformer with linear-complexity attention (see the module docs).
    ///
    /// # Panics
    /// If [`validate`](Self::validate) fails; its message is the panic message.
    pub fn init_linear(&self, device: &Device) -> LinformerAttention {
        self.init_with(LinformerScoring::Linear, device)
    }

    fn init_with(&self, scoring: LinformerScoring, device: &Device) -> LinformerAttention {
        if let Err(err) = self.validate() {
            panic!("{err}");
        }
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
            scoring,
        }
    }

    /// The projection `[1, k, n_max]` shared by every layer under `layerwise` sharing.
    pub fn init_shared_projection(&self, device: &Device) -> Param<Tensor<3>> {
        self.projection(1, device)
    }

    fn projection(&self, count: usize, device: &Device) -> Param<Tensor<3>> {
        let std = 1.0 / (self.k as f64).sqrt();
        Param::from_tensor(Tensor::random(
            [count, self.k, self.n_max],
            Distribution::Normal(0.0, std),
            device,
        ))
    }
}

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

impl LinformerAttention {
    /// Applies attention.
    ///
    /// # Shapes
    /// - input `x`: `[batch, n, d_model]` with `n <= n_max`
    /// - output: `[batch, n, d_model]`
    ///
    /// # Panics
    /// Where [`try_forward`](Self::try_forward) returns an error; the message is the error's.
    pub fn forward(&self, input: AttentionInput) -> Tensor<3> {
        self.try_forward(input)
            .unwrap_or_else(|err| panic!("{err}"))
    }

    /// Applies attention, or says why it cannot: causal masking, a sequence longer than
    /// `n_max`, or `layerwise` sharing without the shared projection.
    pub fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        let (q, k, v) = self.proj.qkv(input.x);
        let o = self.attend_shared(
            q,
            k,
            v,
            input.mask_pad,
            input.causal,
            input.shared_projection,
        )?;
        Ok(self.proj.out(o))
    }

    /// The attention on per-head tensors, without the input and output projections, or why it
    /// cannot be applied (see [`try_forward`](Self::try_forward)); `layerwise` sharing needs
    /// [`attend_shared`](Self::attend_shared).
    ///
    /// # Shapes
    /// - `q`, `k`, `v`: `[batch, heads, n, d_head]`
    /// - `mask_pad`: `[batch, n]`, `true` = padding
    /// - output: `[batch, heads, n, d_head]`
    pub fn attend(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        mask_pad: Option<Tensor<2, Bool>>,
        causal: bool,
    ) -> Result<Tensor<4>, AttentionError> {
        self.attend_shared(q, k, v, mask_pad, causal, None)
    }

    /// [`attend`](Self::attend) with the projection shared by every layer (`layerwise`
    /// sharing, `[1, k, n_max]`).
    pub fn attend_shared(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        mask_pad: Option<Tensor<2, Bool>>,
        causal: bool,
        shared_projection: Option<Tensor<3>>,
    ) -> Result<Tensor<4>, AttentionError> {
        let variant = self.scoring.variant_name();
        check_input(variant, self.n_max, k.dims()[2], causal)?;
        let e = match (&self.e, shared_projection) {
            (Some(e), _) => e.val(),
            (None, Some(shared)) => shared,
            (None, None) => {
                return Err(AttentionError::Unsupported {
                    variant,
                    message: "layerwise sharing without the shared projection \
                              (use Encoder, or AttentionInput::shared_projection)"
                        .into(),
                });
            }
        };
        let f = self
            .f
            .as_ref()
            .map(|f| f.val())
            .unwrap_or_else(|| e.clone());
        Ok(match self.scoring {
            LinformerScoring::Softmax => attend(q, k, v, e, f, mask_pad, Some(&self.dropout)),
            LinformerScoring::Linear => linformer_linear_attention(q, k, v, e, f, mask_pad),
        })
    }
}

/// Rejects what Linformer cannot do: causal masking, sequences longer than `n_max`.
pub(crate) fn check_input(
    variant: &'static str,
    n_max: usize,
    n: usize,
    causal: bool,
) -> Result<(), AttentionError> {
    if causal {
        return Err(AttentionError::Unsupported {
            variant,
            message: "causal masking: its projections mix future positions into every key".into(),
        });
    }
    if n > n_max {
        return Err(AttentionError::field(
            variant,
            "n_max",
            format!("is {n_max}, shorter than the input sequence ({n})"),
        ));
    }
    Ok(())
}

/// Linformer attention on per-head tensors, the functional form of [`LinformerAttention`].
///
/// `e` and `f` are `[p, k, n_max]` with `p` = 1 (shared by heads) or `heads`, and `n_max >= n`;
/// their first `n` columns are used.
///
/// # Shapes
/// - `q`, `k`, `v`: `[batch, heads, n, d]`
/// - `mask_pad`: `[batch, n]`, `true` = padding
/// - output: `[batch, heads, n, d]`
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
/// - `q`, `k`, `v`: `[batch, heads, n, d]`
/// - `mask_pad`: `[batch, n]`, `true` = padding
/// - output: `[batch, heads, n, d]`
pub fn linformer_linear_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    e: Tensor<3>,
    f: Tensor<3>,
    mask_pad: Option<Tensor<2, Bool>>,
) -> Tensor<4> {
    let scale = 1.0 / (q.dims()[3] as f32).sqrt();
    let h = softmax(q.mul_scalar(scale), 3); // [b, h, n, d]
    let l = softmax(
        project_sequence(e, zero_padded(k, &mask_pad))
            .swap_dims(2, 3)
            .mul_scalar(scale),
        3,
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
    crate::softmax::attend(q, k, v, None, false, dropout)
}
