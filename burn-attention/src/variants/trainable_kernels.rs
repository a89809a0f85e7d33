//! Trainable feed-forward kernels: kernelized attention whose feature map is a small learned
//! network, applied to queries and keys alike.
//!
//! Yorsh & Kovalenko 2022, "Linear Self-Attention Approximation via Trainable Feedforward
//! Kernel", arXiv 2211.04076. `O_i = φ(Q_i)ᵀ S / φ(Q_i)ᵀ z` as in
//! [`kernelized_attention`](crate::kernelized_attention) (every `φ` here is positive, so the
//! normaliser needs no ε), with `φ` one of:
//! - `ff-linear`: `φ(X) = Softplus(X W)`;
//! - `ff-orth-linear`: the same with `W` orthogonally initialised and the orthogonality penalty
//!   `λ ‖W Wᵀ − I‖²_F` ([`AttentionModule::penalty`]), which the training loss adds;
//! - `ff-glu`: a stack of `depth` gated units, inner units `X W_f ⊙ σ(X W_g)`, the last one
//!   `Softplus(X W_f) ⊙ σ(X W_g)` so that `φ > 0`;
//! - `ff-oglu`: `ff-glu` with every `W_f` orthogonal (initialisation and penalty);
//! - `ff-aoglu`: `ff-oglu` with every gate `W_g` a low-rank product `U V`, rank `d/4`.
//!
//! Every `W` is `d × d` (`d` the head width) and shared by the heads of a layer, which keeps the
//! extra parameters small: `d²` per matrix and layer (`2 · depth · d²` for `ff-glu`), under 10% of
//! the LRA models (the paper's budget).
//! Cost: O(n d²) time; O(n d + d²) memory per head (O(n d²) in the causal form). Masks:
//! padding; causal through prefix sums.

use crate::variants::prelude::*;
use burn::module::Param;
use burn::nn::Initializer;
use burn::tensor::module::linear;
use serde::{Deserialize, Serialize};

use crate::engines::features::random_orthogonal;

use crate::kernels::{sigmoid, softplus};

use crate::engines::kernelized::{
    kernelized_decode, kernelized_heads, kernelized_prompt_state, recurrent_state,
};

use crate::engines::params::lazy_param;

const CAPABILITIES: Capabilities = Capabilities {
    causal: true,
    cross_attention: true,
    rotary: true,
    weights_sum_to_one: true,
    per_head_form: true,
    ..Capabilities::PADDING_ONLY
};

const TIME: &str = "O(n d²)";
const MEMORY: &str = "O(n d + d²); causal O(n (c + d²/c)), c = 64";

/// The registry entries, one per kernel, in the order of [`FeedForwardKernel::ALL`].
pub const VARIANTS: [VariantInfo; 5] = [
    VariantInfo {
        name: "ff-linear",
        paper: "Yorsh & Kovalenko 2022, arXiv 2211.04076 (Softplus(X W))",
        time: TIME,
        memory: MEMORY,
        capabilities: CAPABILITIES,
    },
    VariantInfo {
        name: "ff-orth-linear",
        paper: "Yorsh & Kovalenko 2022, arXiv 2211.04076 (orthogonal W + penalty)",
        time: TIME,
        memory: MEMORY,
        capabilities: CAPABILITIES,
    },
    VariantInfo {
        name: "ff-glu",
        paper: "Yorsh & Kovalenko 2022, arXiv 2211.04076 (gated units, depth 1-3)",
        time: TIME,
        memory: MEMORY,
        capabilities: CAPABILITIES,
    },
    VariantInfo {
        name: "ff-oglu",
        paper: "Yorsh & Kovalenko 2022, arXiv 2211.04076 (gated units, orthogonal W_f)",
        time: TIME,
        memory: MEMORY,
        capabilities: CAPABILITIES,
    },
    VariantInfo {
        name: "ff-aoglu",
        paper: "Yorsh & Kovalenko 2022, arXiv 2211.04076 (gated units, orthogonal W_f, rank d/4 gate)",
        time: TIME,
        memory: MEMORY,
        capabilities: CAPABILITIES,
    },
];

/// Which feature map a [`FeedForwardKernelAttention`] learns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FeedForwardKernel {
    /// `Softplus(X W)`.
    Linear,
    /// `Softplus(X W)`, `W` orthogonal (initialisation and penalty).
    OrthLinear,
    /// Gated linear units.
    Glu,
    /// Gated linear units with orthogonal `W_f`.
    Oglu,
    /// Gated linear units with orthogonal `W_f` and a low-rank gate.
    Aoglu,
}

impl FeedForwardKernel {
    /// Every kernel, in the order of [`VARIANTS`].
    pub const ALL: [Self; 5] = [
        Self::Linear,
        Self::OrthLinear,
        Self::Glu,
        Self::Oglu,
        Self::Aoglu,
    ];

    /// The registry entry of the variant using this kernel.
    pub fn info(self) -> &'static VariantInfo {
        &VARIANTS[self as usize]
    }

    /// The registry name of the variant using this kernel.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    fn gated(self) -> bool {
        matches!(self, Self::Glu | Self::Oglu | Self::Aoglu)
    }

    fn orthogonal(self) -> bool {
        matches!(self, Self::OrthLinear | Self::Oglu | Self::Aoglu)
    }
}

/// The most units a gated kernel stacks: far beyond the paper's 1 to 3, and few enough that the
/// units (built one by one, before any parameter is counted) stay small.
pub const MAX_DEPTH: usize = 64;

/// Configuration of [`FeedForwardKernelAttention`].
#[derive(Config, Debug)]
pub struct FeedForwardKernelConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// The feature map.
    pub kernel: FeedForwardKernel,
    /// Stacked units (gated kernels; the paper uses 1 to 3; at most [`MAX_DEPTH`]). The linear
    /// kernels take 1.
    #[config(default = 1)]
    pub depth: usize,
    /// `λ` of the orthogonality penalty `λ ‖W Wᵀ − I‖²_F` (orthogonal kernels only; the paper
    /// does not state it, 0.01 is this project's default).
    #[config(default = 0.01)]
    pub ortho_penalty: f64,
    /// Rank of the low-rank gate of `ff-aoglu`; `None` means `d_head / 4` (at least 1).
    #[config(default = "None")]
    pub gate_rank: Option<usize>,
    /// Biases on the Q, K, V and output projections.
    #[config(default = false)]
    pub bias: bool,
}

impl FeedForwardKernelConfig {
    /// The rank of the low-rank gate (`ff-aoglu`).
    pub fn rank(&self) -> usize {
        self.gate_rank
            .unwrap_or((self.d_model / self.n_heads / 4).max(1))
    }
}

impl VariantConfig for FeedForwardKernelConfig {
    variant_glue!(FeedForwardKernelAttention, &VARIANTS);

    fn for_variant(name: &str, model: ModelShape) -> Self {
        let kernel = FeedForwardKernel::ALL
            .into_iter()
            .find(|kernel| kernel.name() == name)
            .unwrap_or(FeedForwardKernel::Linear);
        let config = Self::new(model.d_model, model.n_heads, kernel);
        match kernel {
            // The paper's only AOGLU row stacks three units.
            FeedForwardKernel::Aoglu => config.with_depth(3),
            _ => config,
        }
    }

    fn info(&self) -> &'static VariantInfo {
        self.kernel.info()
    }

    fn check_fields(&self) -> Result<(), AttentionError> {
        let name = self.kernel.name();
        check_at_least_one(name, "depth", self.depth)?;
        if self.depth > MAX_DEPTH {
            return Err(AttentionError::field(
                name,
                "depth",
                format!(
                    "must be at most {MAX_DEPTH} (the paper stacks 1 to 3 units), got {}",
                    self.depth
                ),
            ));
        }
        if !self.kernel.gated() && self.depth != 1 {
            return Err(AttentionError::field(
                name,
                "depth",
                format!("must be 1 for a linear kernel, got {}", self.depth),
            ));
        }
        if !(self.ortho_penalty.is_finite() && self.ortho_penalty >= 0.0) {
            return Err(AttentionError::field(
                name,
                "ortho_penalty",
                format!("must be finite and >= 0, got {}", self.ortho_penalty),
            ));
        }
        let d_head = self.d_model / self.n_heads;
        if let Some(rank) = self.gate_rank
            && !(1..=d_head).contains(&rank)
        {
            return Err(AttentionError::field(
                name,
                "gate_rank",
                format!("must be in 1..={d_head} (the head width), got {rank}"),
            ));
        }
        Ok(())
    }

    fn build(&self, device: &Device) -> FeedForwardKernelAttention {
        let d = self.d_model / self.n_heads;
        let xavier = |rows: usize, cols: usize| -> Param<Tensor<2>> {
            Initializer::XavierUniform { gain: 1.0 }.init_with(
                [rows, cols],
                Some(rows),
                Some(cols),
                device,
            )
        };
        let units = (0..self.depth)
            .map(|_| {
                let w_f = if self.kernel.orthogonal() {
                    lazy_param([d, d], device, true, move |device| {
                        random_orthogonal(d, device)
                    })
                } else {
                    xavier(d, d)
                };
                let (w_g, gate_u, gate_v) = match self.kernel {
                    FeedForwardKernel::Linear | FeedForwardKernel::OrthLinear => (None, None, None),
                    FeedForwardKernel::Glu | FeedForwardKernel::Oglu => {
                        (Some(xavier(d, d)), None, None)
                    }
                    FeedForwardKernel::Aoglu => {
                        let r = self.rank();
                        (None, Some(xavier(d, r)), Some(xavier(r, d)))
                    }
                };
                KernelUnit {
                    w_f,
                    w_g,
                    gate_u,
                    gate_v,
                }
            })
            .collect();
        FeedForwardKernelAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            units,
            kernel: self.kernel,
            ortho_penalty: self.ortho_penalty,
        }
    }
}

inherent_config_methods!(FeedForwardKernelConfig);

/// One unit of a feature map: `X W_f`, gated by `σ(X W_g)` (or `σ(X U V)`) where it has a gate.
#[derive(Module, Debug)]
pub struct KernelUnit {
    /// `W_f: [d, d]`.
    pub w_f: Param<Tensor<2>>,
    /// Full gate `W_g: [d, d]` (`ff-glu`, `ff-oglu`).
    pub w_g: Option<Param<Tensor<2>>>,
    /// Low-rank gate factor `U: [d, r]` (`ff-aoglu`).
    pub gate_u: Option<Param<Tensor<2>>>,
    /// Low-rank gate factor `V: [r, d]` (`ff-aoglu`).
    pub gate_v: Option<Param<Tensor<2>>>,
}

impl KernelUnit {
    /// Applies the unit to `x: [.., d]`; `last` makes the value path positive (Softplus).
    pub fn forward<const D: usize>(&self, x: Tensor<D>, last: bool) -> Tensor<D> {
        let value = linear(x.clone(), self.w_f.val(), None);
        let value = if last { softplus(value) } else { value };
        let gate = match (&self.w_g, &self.gate_u, &self.gate_v) {
            (Some(w_g), _, _) => Some(linear(x, w_g.val(), None)),
            (None, Some(u), Some(v)) => Some(linear(linear(x, u.val(), None), v.val(), None)),
            _ => None,
        };
        match gate {
            Some(gate) => value.mul(sigmoid(gate)),
            None => value,
        }
    }
}

/// Multi-head attention with a trainable feed-forward feature map. Create with
/// [`FeedForwardKernelConfig`].
#[derive(Module, Debug)]
pub struct FeedForwardKernelAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
    /// The feature map's units, applied in order.
    pub units: Vec<KernelUnit>,
    /// The kernel.
    #[module(skip)]
    pub kernel: FeedForwardKernel,
    /// `λ` of the orthogonality penalty.
    #[module(skip)]
    pub ortho_penalty: f64,
}

projection_shape!(FeedForwardKernelAttention);

impl FeedForwardKernelAttention {
    /// The causal forward pass over prompts (padded by `mask_pad`) and the recurrent state
    /// summed from their real keys and values.
    /// With rotary positions, the state's sums over the rotated key features.
    fn prefill_with(&self, x: Tensor<3>, mask_pad: Option<Tensor<2, Bool>>) -> DecodeResult {
        let masks = self
            .proj
            .with_positions(HeadMasks::new(mask_pad.clone(), true), &x);
        let positions = masks.positions.clone();
        let (q, k, v) = self.proj.qkv(x);
        let o = self.attend(q, k.clone(), v.clone(), masks)?;
        let state = kernelized_prompt_state(self.feature_map(k), v, positions, &mask_pad);
        Ok((self.proj.out(o), DecodingState::Recurrent(state)))
    }
}

impl AttentionModule for FeedForwardKernelAttention {
    variant_facts!(self.kernel);

    forward_through_projections!();

    rotary_on_projections!();

    /// With rotary positions in `masks`, RoFormer's form for linear attention: the learned
    /// features rotated in the numerator only ([`kernelized_heads`]).
    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        check_head_input(self.kernel.info(), &q, &k, &masks)?;
        Ok(kernelized_heads(
            self.feature_map(q),
            self.feature_map(k),
            v,
            masks,
        ))
    }

    prefill_through!(prefill_with);

    fn decode(&self, x: Tensor<3>, state: DecodingState) -> DecodeResult {
        check_token(self.name(), self.d_model(), &x)?;
        let state = recurrent_state(state, self.kernel.name())?;
        let (q, k, v) = self.proj.qkv(x);
        let (phi_q, phi_k) = (self.feature_map(q), self.feature_map(k));
        let (o, state) = kernelized_decode(phi_q, phi_k, v, state, self.proj.rotary);
        Ok((self.proj.out(o), DecodingState::Recurrent(state)))
    }

    /// The orthogonality penalty `λ Σ ‖W_f W_fᵀ − I‖²_F` over the orthogonal matrices, for the
    /// training loss to add; `None` for the kernels without orthogonality.
    fn penalty(&self) -> Option<Tensor<1>> {
        if !self.kernel.orthogonal() {
            return None;
        }
        self.units
            .iter()
            .map(|unit| {
                let w = unit.w_f.val();
                let [d, _] = w.dims();
                let device = w.device();
                let gram = w.clone().matmul(w.transpose());
                (gram - Tensor::eye(d, &device)).powi_scalar(2).sum()
            })
            .reduce(|a, b| a + b)
            .map(|sum| sum.mul_scalar(self.ortho_penalty))
    }
}

impl FeedForwardKernelAttention {
    /// The learned feature map `φ` on per-head tensors `[batch, heads, n, d]`.
    pub fn feature_map(&self, x: Tensor<4>) -> Tensor<4> {
        let last = self.units.len() - 1;
        self.units
            .iter()
            .enumerate()
            .fold(x, |x, (i, unit)| unit.forward(x, i == last))
    }
}
