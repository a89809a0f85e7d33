//! The registry: every variant by name, its configuration and its module.
//!
//! A closed pair of enums (Burn's `ActivationConfig` -> `Activation` pattern): an unknown name
//! or a bad parameter fails when the configuration is built, never deep in training.

use burn::prelude::*;
use serde_json::{Map, Value};

use crate::efficient::{EfficientAttention, EfficientAttentionConfig};
use crate::error::AttentionError;
use crate::feedforward::{FeedForwardKernel, FeedForwardKernelAttention, FeedForwardKernelConfig};
use crate::input::AttentionInput;
use crate::linear::{LinearAttention, LinearAttentionConfig};
use crate::linformer::{LinformerAttention, LinformerConfig};
use crate::nystrom::{NystromAttention, NystromConfig};
use crate::performer::{PerformerAttention, PerformerConfig, PerformerKernel};
use crate::softmax::{SoftmaxAttention, SoftmaxAttentionConfig};

/// What a variant supports; asking for anything else is an error before training starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Honours a key padding mask.
    pub padding_mask: bool,
    /// Supports causal masking.
    pub causal: bool,
    /// Needs a fixed maximum sequence length (`n_max`) at construction.
    pub fixed_max_len: bool,
    /// The implied weights of each query over the values sum to one, so a constant `v` comes
    /// back unchanged and a sequence of one position returns its own `v`, whatever the queries
    /// and keys. False for Linformer, whose learned projection `F` mixes the values with
    /// weights of any sign and sum, and for Nyströmformer, whose weights
    /// `softmax(Q K̃ᵀ) pinv(softmax(Q̃ K̃ᵀ)) softmax(Q̃ Kᵀ)` sum to one only where the iterative
    /// pseudo-inverse inverts a well-conditioned landmark kernel (see [`crate::nystrom`]).
    pub weights_sum_to_one: bool,
}

/// A registered variant: its name (as used by the CLI, config files and xtask) and facts.
#[derive(Debug, Clone, Copy)]
pub struct VariantInfo {
    /// Registry name.
    pub name: &'static str,
    /// Source paper.
    pub paper: &'static str,
    /// Time complexity per head (`n` length, `d` head width, `k` projected length).
    pub time: &'static str,
    /// Memory complexity per head.
    pub memory: &'static str,
    /// What it supports.
    pub capabilities: Capabilities,
}

/// Every registered variant, in the order listings show them.
pub const VARIANTS: &[VariantInfo] = &[
    VariantInfo {
        name: "softmax",
        paper: "Vaswani et al. 2017, arXiv 1706.03762",
        time: "O(n² d)",
        memory: "O(n²)",
        capabilities: Capabilities {
            padding_mask: true,
            causal: true,
            fixed_max_len: false,
            weights_sum_to_one: true,
        },
    },
    VariantInfo {
        name: "linformer",
        paper: "Wang et al. 2020, arXiv 2006.04768",
        time: "O(n k d)",
        memory: "O(n k)",
        capabilities: Capabilities {
            padding_mask: true,
            causal: false,
            fixed_max_len: true,
            weights_sum_to_one: false,
        },
    },
    VariantInfo {
        name: "linformer-linear",
        paper: "Verma, \"Revisiting Linformer with a modified self-attention with linear complexity\"",
        time: "O(n d² + d² k)",
        memory: "O(n d + d k)",
        capabilities: Capabilities {
            padding_mask: true,
            causal: false,
            fixed_max_len: true,
            weights_sum_to_one: false,
        },
    },
    VariantInfo {
        name: "efficient",
        paper: "Shen et al. 2018, arXiv 1812.01243",
        time: "O(n d²)",
        memory: "O(n d + d²)",
        capabilities: Capabilities {
            padding_mask: true,
            causal: false,
            fixed_max_len: false,
            weights_sum_to_one: true,
        },
    },
    VariantInfo {
        name: "linear",
        paper: "Katharopoulos et al. 2020, arXiv 2006.16236",
        time: "O(n d²)",
        memory: "O(n d + d²); causal O(n (c + d²/c)), c = 64",
        capabilities: Capabilities {
            padding_mask: true,
            causal: true,
            fixed_max_len: false,
            weights_sum_to_one: true,
        },
    },
    VariantInfo {
        name: "performer",
        paper: "Choromanski et al. 2021, arXiv 2009.14794 (FAVOR+)",
        time: "O(n m d)",
        memory: "O(n m + m d); causal O(n (m + c + m d/c)), c = 64",
        capabilities: Capabilities {
            padding_mask: true,
            causal: true,
            fixed_max_len: false,
            weights_sum_to_one: true,
        },
    },
    VariantInfo {
        name: "performer-relu",
        paper: "Choromanski et al. 2021, arXiv 2009.14794 (generalized ReLU kernel)",
        time: "O(n d²)",
        memory: "O(n d + d²); causal O(n (c + d²/c)), c = 64",
        capabilities: Capabilities {
            padding_mask: true,
            causal: true,
            fixed_max_len: false,
            weights_sum_to_one: true,
        },
    },
    VariantInfo {
        name: "ff-linear",
        paper: "Yorsh & Kovalenko 2022, arXiv 2211.04076 (Softplus(X W))",
        time: "O(n d²)",
        memory: "O(n d + d²); causal O(n (c + d²/c)), c = 64",
        capabilities: Capabilities {
            padding_mask: true,
            causal: true,
            fixed_max_len: false,
            weights_sum_to_one: true,
        },
    },
    VariantInfo {
        name: "ff-orth-linear",
        paper: "Yorsh & Kovalenko 2022, arXiv 2211.04076 (orthogonal W + penalty)",
        time: "O(n d²)",
        memory: "O(n d + d²); causal O(n (c + d²/c)), c = 64",
        capabilities: Capabilities {
            padding_mask: true,
            causal: true,
            fixed_max_len: false,
            weights_sum_to_one: true,
        },
    },
    VariantInfo {
        name: "ff-glu",
        paper: "Yorsh & Kovalenko 2022, arXiv 2211.04076 (gated units, depth 1-3)",
        time: "O(n d²)",
        memory: "O(n d + d²); causal O(n (c + d²/c)), c = 64",
        capabilities: Capabilities {
            padding_mask: true,
            causal: true,
            fixed_max_len: false,
            weights_sum_to_one: true,
        },
    },
    VariantInfo {
        name: "ff-oglu",
        paper: "Yorsh & Kovalenko 2022, arXiv 2211.04076 (gated units, orthogonal W_f)",
        time: "O(n d²)",
        memory: "O(n d + d²); causal O(n (c + d²/c)), c = 64",
        capabilities: Capabilities {
            padding_mask: true,
            causal: true,
            fixed_max_len: false,
            weights_sum_to_one: true,
        },
    },
    VariantInfo {
        name: "ff-aoglu",
        paper: "Yorsh & Kovalenko 2022, arXiv 2211.04076 (gated units, orthogonal W_f, rank d/4 gate)",
        time: "O(n d²)",
        memory: "O(n d + d²); causal O(n (c + d²/c)), c = 64",
        capabilities: Capabilities {
            padding_mask: true,
            causal: true,
            fixed_max_len: false,
            weights_sum_to_one: true,
        },
    },
    VariantInfo {
        name: "nystrom",
        paper: "Xiong et al. 2021, arXiv 2102.03902",
        time: "O(n m d + m³)",
        memory: "O(n m + m²)",
        capabilities: Capabilities {
            padding_mask: true,
            causal: false,
            fixed_max_len: false,
            weights_sum_to_one: false,
        },
    },
];

/// Looks a variant up by name.
pub fn variant(name: &str) -> Result<&'static VariantInfo, AttentionError> {
    VARIANTS
        .iter()
        .find(|v| v.name == name)
        .ok_or_else(|| AttentionError::UnknownVariant {
            name: name.to_string(),
        })
}

/// Configuration of any registered attention variant.
#[derive(Config, Debug)]
pub enum AttentionConfig {
    /// Exact softmax attention.
    Softmax(SoftmaxAttentionConfig),
    /// Linformer.
    Linformer(LinformerConfig),
    /// Linformer with linear-complexity attention (same configuration as Linformer).
    LinformerLinear(LinformerConfig),
    /// Efficient Attention.
    Efficient(EfficientAttentionConfig),
    /// Linear Transformer attention (`elu + 1`).
    Linear(LinearAttentionConfig),
    /// Performer (FAVOR+ or the generalized ReLU kernel, by its `kernel`).
    Performer(PerformerConfig),
    /// A trainable feed-forward kernel (`ff-*`, by its `kernel`).
    FeedForward(FeedForwardKernelConfig),
    /// Nyströmformer.
    Nystrom(NystromConfig),
}

/// Fields every variant takes from the model rather than from its own parameters.
const MODEL_FIELDS: &[&str] = &["d_model", "n_heads", "n_max"];

impl AttentionConfig {
    /// The variant called `name`, with its paper defaults, for a model of width `d_model` with
    /// `n_heads` heads on sequences of at most `n_max` positions.
    pub fn from_name(
        name: &str,
        d_model: usize,
        n_heads: usize,
        n_max: usize,
    ) -> Result<Self, AttentionError> {
        Ok(match variant(name)?.name {
            "softmax" => Self::Softmax(SoftmaxAttentionConfig::new(d_model, n_heads)),
            "linformer" => Self::Linformer(LinformerConfig::new(d_model, n_heads, n_max)),
            "linformer-linear" => {
                Self::LinformerLinear(LinformerConfig::new(d_model, n_heads, n_max))
            }
            "efficient" => Self::Efficient(EfficientAttentionConfig::new(d_model, n_heads)),
            "linear" => Self::Linear(LinearAttentionConfig::new(d_model, n_heads)),
            "performer" => Self::Performer(PerformerConfig::new(d_model, n_heads)),
            "performer-relu" => Self::Performer(
                PerformerConfig::new(d_model, n_heads).with_kernel(PerformerKernel::Relu),
            ),
            "ff-linear" => Self::feed_forward(d_model, n_heads, FeedForwardKernel::Linear),
            "ff-orth-linear" => Self::feed_forward(d_model, n_heads, FeedForwardKernel::OrthLinear),
            "ff-glu" => Self::feed_forward(d_model, n_heads, FeedForwardKernel::Glu),
            "ff-oglu" => Self::feed_forward(d_model, n_heads, FeedForwardKernel::Oglu),
            // The paper's only AOGLU row stacks three units.
            "ff-aoglu" => Self::FeedForward(
                FeedForwardKernelConfig::new(d_model, n_heads, FeedForwardKernel::Aoglu)
                    .with_depth(3),
            ),
            "nystrom" => Self::Nystrom(NystromConfig::new(d_model, n_heads)),
            other => unreachable!("variant `{other}` is listed but not constructible"),
        })
    }

    fn feed_forward(d_model: usize, n_heads: usize, kernel: FeedForwardKernel) -> Self {
        Self::FeedForward(FeedForwardKernelConfig::new(d_model, n_heads, kernel))
    }

    /// The registry name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Softmax(_) => "softmax",
            Self::Linformer(_) => "linformer",
            Self::LinformerLinear(_) => "linformer-linear",
            Self::Efficient(_) => "efficient",
            Self::Linear(_) => "linear",
            Self::Performer(c) => match c.kernel {
                PerformerKernel::Softmax => "performer",
                PerformerKernel::Relu => "performer-relu",
            },
            Self::FeedForward(c) => c.kernel.name(),
            Self::Nystrom(_) => "nystrom",
        }
    }

    /// The registry entry.
    pub fn info(&self) -> &'static VariantInfo {
        variant(self.name()).expect("every config variant is registered")
    }

    /// Model width.
    pub fn d_model(&self) -> usize {
        match self {
            Self::Softmax(c) => c.d_model,
            Self::Linformer(c) | Self::LinformerLinear(c) => c.d_model,
            Self::Efficient(c) => c.d_model,
            Self::Linear(c) => c.d_model,
            Self::Performer(c) => c.d_model,
            Self::FeedForward(c) => c.d_model,
            Self::Nystrom(c) => c.d_model,
        }
    }

    /// Checks the configuration; the error names the offending field.
    pub fn validate(&self) -> Result<(), AttentionError> {
        match self {
            Self::Softmax(c) => c.validate(),
            Self::Linformer(c) | Self::LinformerLinear(c) => c.validate(),
            Self::Efficient(c) => c.validate(),
            Self::Linear(c) => c.validate(),
            Self::Performer(c) => c.validate(),
            Self::FeedForward(c) => c.validate(),
            Self::Nystrom(c) => c.validate(),
        }
    }

    /// Checks that the variant can take inputs of up to `n` positions, causal or not.
    pub fn check_input(&self, n: usize, causal: bool) -> Result<(), AttentionError> {
        match self {
            Self::Softmax(_) | Self::Linear(_) | Self::Performer(_) | Self::FeedForward(_) => {
                Ok(())
            }
            Self::Nystrom(_) => crate::nystrom::check_input(causal),
            Self::Linformer(c) | Self::LinformerLinear(c) => {
                crate::linformer::check_input(self.name(), c.n_max, n, causal)
            }
            Self::Efficient(_) => crate::efficient::check_input(self.name(), causal),
        }
    }

    /// Sets the dropout on the attention weights, for the variants that have a weight matrix
    /// (the others are returned unchanged).
    pub fn with_dropout(self, dropout: f64) -> Self {
        match self {
            Self::Softmax(c) => Self::Softmax(c.with_dropout(dropout)),
            Self::Linformer(c) => Self::Linformer(c.with_dropout(dropout)),
            other => other,
        }
    }

    /// Applies variant parameters given as key/value pairs (a config file's
    /// `[attention.<name>]` table). Unknown keys, keys the model sets (`d_model`, `n_heads`,
    /// `n_max`) and values of the wrong type are errors that name the key.
    pub fn with_params(self, params: &Map<String, Value>) -> Result<Self, AttentionError> {
        let variant = self.name();
        let err = |message: String| AttentionError::InvalidParams { variant, message };
        let template = match &self {
            Self::Softmax(c) => serde_json::to_value(c),
            Self::Linformer(c) | Self::LinformerLinear(c) => serde_json::to_value(c),
            Self::Efficient(c) => serde_json::to_value(c),
            Self::Linear(c) => serde_json::to_value(c),
            Self::Performer(c) => serde_json::to_value(c),
            Self::FeedForward(c) => serde_json::to_value(c),
            Self::Nystrom(c) => serde_json::to_value(c),
        }
        .map_err(|e| err(e.to_string()))?;
        let Value::Object(mut merged) = template else {
            return Err(err("configuration is not a table".into()));
        };
        let allowed: Vec<&String> = merged
            .keys()
            .filter(|k| !MODEL_FIELDS.contains(&k.as_str()))
            .collect();
        for key in params.keys() {
            if MODEL_FIELDS.contains(&key.as_str()) {
                return Err(err(format!(
                    "`{key}` is set by the model, not per attention"
                )));
            }
            if !merged.contains_key(key) {
                let allowed: Vec<String> = allowed.iter().map(|k| k.to_string()).collect();
                return Err(err(format!(
                    "unknown key `{key}` (expected one of: {})",
                    allowed.join(", ")
                )));
            }
        }
        for (key, value) in params {
            merged.insert(key.clone(), value.clone());
            // Parse after each key so that a bad value is blamed on the key that holds it.
            self.reparse(Value::Object(merged.clone()))
                .map_err(|e| err(format!("`{key}`: {e}")))?;
        }
        let config = self
            .reparse(Value::Object(merged))
            .map_err(|e| err(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    fn reparse(&self, value: Value) -> Result<Self, serde_json::Error> {
        Ok(match self {
            Self::Softmax(_) => Self::Softmax(serde_json::from_value(value)?),
            Self::Linformer(_) => Self::Linformer(serde_json::from_value(value)?),
            Self::LinformerLinear(_) => Self::LinformerLinear(serde_json::from_value(value)?),
            Self::Efficient(_) => Self::Efficient(serde_json::from_value(value)?),
            Self::Linear(_) => Self::Linear(serde_json::from_value(value)?),
            Self::Performer(_) => Self::Performer(serde_json::from_value(value)?),
            Self::FeedForward(_) => Self::FeedForward(serde_json::from_value(value)?),
            Self::Nystrom(_) => Self::Nystrom(serde_json::from_value(value)?),
        })
    }

    /// Creates the module.
    ///
    /// # Panics
    /// If [`validate`](Self::validate) fails; its message is the panic message.
    pub fn init(&self, device: &Device) -> Attention {
        match self {
            Self::Softmax(c) => Attention::Softmax(c.init(device)),
            Self::Linformer(c) => Attention::Linformer(c.init(device)),
            Self::LinformerLinear(c) => Attention::Linformer(c.init_linear(device)),
            Self::Efficient(c) => Attention::Efficient(c.init(device)),
            Self::Linear(c) => Attention::Linear(c.init(device)),
            Self::Performer(c) => Attention::Performer(c.init(device)),
            Self::FeedForward(c) => Attention::FeedForward(c.init(device)),
            Self::Nystrom(c) => Attention::Nystrom(c.init(device)),
        }
    }
}

/// Any registered attention module. Create with [`AttentionConfig::init`].
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Attention {
    /// Exact softmax attention.
    Softmax(SoftmaxAttention),
    /// Linformer, with softmax or linear-complexity scoring.
    Linformer(LinformerAttention),
    /// Efficient Attention.
    Efficient(EfficientAttention),
    /// Linear Transformer attention.
    Linear(LinearAttention),
    /// Performer.
    Performer(PerformerAttention),
    /// Trainable feed-forward kernel.
    FeedForward(FeedForwardKernelAttention),
    /// Nyströmformer.
    Nystrom(NystromAttention),
}

impl Attention {
    /// Applies attention; `[batch, n, d_model]` in and out.
    ///
    /// # Panics
    /// Where [`try_forward`](Self::try_forward) returns an error.
    pub fn forward(&self, input: AttentionInput) -> Tensor<3> {
        self.try_forward(input)
            .unwrap_or_else(|err| panic!("{err}"))
    }

    /// Draws new random features where the variant has them (Performer's FAVOR+); the others
    /// are returned unchanged. Training loops call this every N steps; `forward` never does.
    pub fn redraw(self) -> Self {
        match self {
            Self::Performer(m) => Self::Performer(m.redraw()),
            other => other,
        }
    }

    /// The regularisation term the variant asks the training loss to add (the orthogonality
    /// penalty of `ff-orth-linear`, `ff-oglu`, `ff-aoglu`); `None` for the others.
    pub fn penalty(&self) -> Option<Tensor<1>> {
        match self {
            Self::FeedForward(m) => m.penalty(),
            _ => None,
        }
    }

    /// The attention on per-head tensors with this module's own parameters (random features,
    /// learned kernels, projections, landmarks, convolution skip), without the input and
    /// output projections; or why the variant cannot take this input (Linformer's `layerwise`
    /// sharing needs the encoder's shared projection: use
    /// [`LinformerAttention::attend_shared`](crate::LinformerAttention::attend_shared)).
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
        match self {
            Self::Softmax(m) => Ok(m.attend(q, k, v, mask_pad, causal)),
            Self::Linformer(m) => m.attend(q, k, v, mask_pad, causal),
            Self::Efficient(m) => m.attend(q, k, v, mask_pad, causal),
            Self::Linear(m) => Ok(m.attend(q, k, v, mask_pad, causal)),
            Self::Performer(m) => Ok(m.attend(q, k, v, mask_pad, causal)),
            Self::FeedForward(m) => Ok(m.attend(q, k, v, mask_pad, causal)),
            Self::Nystrom(m) => m.attend(q, k, v, mask_pad, causal),
        }
    }

    /// Applies attention, or says why the variant cannot take this input.
    pub fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        match self {
            Self::Softmax(m) => Ok(m.forward(input)),
            Self::Linformer(m) => m.try_forward(input),
            Self::Efficient(m) => m.try_forward(input),
            Self::Linear(m) => Ok(m.forward(input)),
            Self::Performer(m) => Ok(m.forward(input)),
            Self::FeedForward(m) => Ok(m.forward(input)),
            Self::Nystrom(m) => m.try_forward(input),
        }
    }
}
