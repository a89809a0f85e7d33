//! The registry: every variant by name, its configuration and its module.
//!
//! A closed pair of enums (Burn's `ActivationConfig` -> `Activation` pattern) generated from one
//! line per variant configuration: the listing ([`VARIANTS`]), the name lookup, the parsing of a
//! config file's parameters and the dispatch all come from each variant's own
//! [`VariantConfig`]. An unknown name or a bad parameter fails when the configuration is built,
//! never deep in training. Your own attention does not need to be registered: anything that
//! implements [`AttentionModule`] runs in the encoder blocks.

use burn::module::Param;
use burn::prelude::*;
use serde_json::{Map, Value};

use crate::contract::error::AttentionError;
use crate::contract::input::{AttentionInput, HeadMasks};
use crate::contract::variant::{ModelShape, VariantConfig, VariantInfo};
use crate::contract::{AttentionModule, Capabilities, DecodingState, SegmentMemory};
use crate::variants::axial::{AxialAttention, AxialConfig};
use crate::variants::bigbird::{BigBirdAttention, BigBirdConfig};
use crate::variants::compressive::{CompressiveAttention, CompressiveConfig};
use crate::variants::deltanet::{DeltaNetAttention, DeltaNetConfig};
use crate::variants::efficient_attention::{EfficientAttention, EfficientAttentionConfig};
use crate::variants::extended_transformer::{EtcAttention, EtcConfig};
use crate::variants::gla::{GlaAttention, GlaConfig};
use crate::variants::hedgehog::{HedgehogAttention, HedgehogConfig};
use crate::variants::linear::{LinearAttention, LinearAttentionConfig};
use crate::variants::linformer::{LinformerAttention, LinformerConfig};
use crate::variants::local::{LocalAttention, LocalAttentionConfig};
use crate::variants::longformer::{LongformerAttention, LongformerConfig};
use crate::variants::mamba2::{Mamba2Attention, Mamba2Config};
use crate::variants::memory_compressed::{MemoryCompressedAttention, MemoryCompressedConfig};
use crate::variants::nystrom::{NystromAttention, NystromConfig};
use crate::variants::performer::{PerformerAttention, PerformerConfig};
use crate::variants::reformer::{ReformerAttention, ReformerConfig};
use crate::variants::retnet::{RetNetAttention, RetNetConfig};
use crate::variants::routing::{RoutingAttention, RoutingConfig};
use crate::variants::set_transformer::{SetTransformerAttention, SetTransformerConfig};
use crate::variants::sinkhorn::{SinkhornAttention, SinkhornConfig};
use crate::variants::softmax::{SoftmaxAttention, SoftmaxAttentionConfig};
use crate::variants::sparse::{SparseAttention, SparseAttentionConfig};
use crate::variants::synthesizer::{SynthesizerAttention, SynthesizerConfig};
use crate::variants::trainable_kernels::{FeedForwardKernelAttention, FeedForwardKernelConfig};
use crate::variants::transformer_xl::{TransformerXlAttention, TransformerXlConfig};

/// Generates [`AttentionConfig`], [`Attention`] and [`VARIANTS`] from one line per variant
/// configuration: `Arm(Config => Module)`, in the order listings show them.
macro_rules! registry {
    ($($(#[$doc:meta])* $arm:ident($config:ty => $module:ty)),* $(,)?) => {
        /// Configuration of any registered attention variant.
        #[derive(Config, Debug)]
        pub enum AttentionConfig {
            $($(#[$doc])* $arm($config),)*
        }

        /// Any registered attention module. Create with [`AttentionConfig::init`].
        #[derive(Module, Debug)]
        #[allow(clippy::large_enum_variant)]
        pub enum Attention {
            $($(#[$doc])* $arm($module),)*
        }

        $(
            impl From<$config> for AttentionConfig {
                fn from(config: $config) -> Self {
                    Self::$arm(config)
                }
            }

            impl From<$module> for Attention {
                fn from(module: $module) -> Self {
                    Self::$arm(module)
                }
            }
        )*

        const COUNT: usize = 0 $(+ <$config as VariantConfig>::VARIANTS.len())*;
        const ALL: [VariantInfo; COUNT] =
            concat::<COUNT>(&[$(<$config as VariantConfig>::VARIANTS),*]);

        impl AttentionConfig {
            fn with_defaults(info: &VariantInfo, model: ModelShape) -> Self {
                $(
                    if <$config as VariantConfig>::VARIANTS.iter().any(|v| v.name == info.name) {
                        return Self::$arm(<$config as VariantConfig>::for_variant(info.name, model));
                    }
                )*
                unreachable!("every listed variant belongs to a configuration")
            }

            /// The registry entry.
            pub fn info(&self) -> &'static VariantInfo {
                match self { $(Self::$arm(c) => c.info(),)* }
            }

            /// Model width.
            pub fn d_model(&self) -> usize {
                match self { $(Self::$arm(c) => c.d_model(),)* }
            }

            /// Number of heads.
            pub fn n_heads(&self) -> usize {
                match self { $(Self::$arm(c) => c.n_heads(),)* }
            }

            /// Checks the configuration; the error names the offending field.
            pub fn validate(&self) -> Result<(), AttentionError> {
                match self { $(Self::$arm(c) => c.check(),)* }
            }

            /// Settings that work but are likely a mistake, one sentence each naming the field
            /// (see [`VariantConfig::warnings`]).
            pub fn warnings(&self) -> Vec<String> {
                match self { $(Self::$arm(c) => c.warnings(),)* }
            }

            /// Checks that the variant can take `n_q` queries over `n_k` keys (self-attention:
            /// `n_q = n_k`), causal or not.
            pub fn check_input(
                &self,
                n_q: usize,
                n_k: usize,
                causal: bool,
            ) -> Result<(), AttentionError> {
                match self { $(Self::$arm(c) => c.check_input(n_q, n_k, causal),)* }
            }

            /// Sets the dropout on the attention weights (each variant's own `dropout`), for the
            /// variants that have a weight matrix (the others are returned unchanged).
            pub fn with_weight_dropout(self, dropout: f64) -> Self {
                match self { $(Self::$arm(c) => Self::$arm(c.with_weight_dropout(dropout)),)* }
            }

            /// Applies variant parameters given as key/value pairs (a config file's
            /// `[attention.<name>]` table). Unknown keys, keys the model sets (`d_model`,
            /// `n_heads`, `n_max`), values of the wrong type and values that would make another
            /// variant are errors that name the key.
            pub fn with_params(self, params: &Map<String, Value>) -> Result<Self, AttentionError> {
                let config = match self { $(Self::$arm(c) => Self::$arm(merge_params(c, params)?),)* };
                config.validate()?;
                Ok(config)
            }

            /// Whether the layers of an encoder share a projection of this attention's
            /// (Linformer's `layerwise` sharing; see [`VariantConfig::shares_projection`]).
            pub fn shares_projection(&self) -> bool {
                match self { $(Self::$arm(c) => c.shares_projection(),)* }
            }

            /// The projection shared by every layer of an encoder, where the attention has one
            /// (see [`VariantConfig::layer_shared_projection`]).
            pub fn init_shared_projection(&self, device: &Device) -> Option<Param<Tensor<3>>> {
                match self { $(Self::$arm(c) => c.layer_shared_projection(device),)* }
            }

            /// This configuration cut down to small inputs (see [`VariantConfig::small`]).
            pub fn small(self) -> Self {
                match self { $(Self::$arm(c) => Self::$arm(c.small()),)* }
            }

            /// Scalars in the frozen parameters of one module (see
            /// [`VariantConfig::frozen_params`]); `None` when the count overflows a `usize`.
            pub fn frozen_params(&self) -> Option<usize> {
                match self { $(Self::$arm(c) => c.frozen_params(),)* }
            }

            /// Creates the module.
            ///
            /// # Panics
            /// If [`validate`](Self::validate) fails; its message is the panic message.
            pub fn init(&self, device: &Device) -> Attention {
                match self { $(Self::$arm(c) => Attention::$arm(VariantConfig::init(c, device)),)* }
            }
        }

        impl Attention {
            /// Model width.
            pub fn d_model(&self) -> usize {
                match self { $(Self::$arm(m) => m.d_model(),)* }
            }

            /// Number of heads.
            pub fn n_heads(&self) -> usize {
                match self { $(Self::$arm(m) => m.n_heads(),)* }
            }
        }

        impl AttentionModule for Attention {
            fn name(&self) -> &'static str {
                match self { $(Self::$arm(m) => m.name(),)* }
            }

            fn capabilities(&self) -> Capabilities {
                match self { $(Self::$arm(m) => m.capabilities(),)* }
            }

            fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
                match self { $(Self::$arm(m) => m.try_forward(input),)* }
            }

            fn try_forward_with_loss(
                &self,
                input: AttentionInput,
            ) -> Result<(Tensor<3>, Option<Tensor<1>>), AttentionError> {
                match self { $(Self::$arm(m) => m.try_forward_with_loss(input),)* }
            }

            fn with_rotary(self) -> Result<Self, AttentionError> {
                match self { $(Self::$arm(m) => m.with_rotary().map(Self::$arm),)* }
            }

            fn attend(
                &self,
                q: Tensor<4>,
                k: Tensor<4>,
                v: Tensor<4>,
                masks: HeadMasks,
            ) -> Result<Tensor<4>, AttentionError> {
                match self { $(Self::$arm(m) => m.attend(q, k, v, masks),)* }
            }

            fn try_forward_with_weights(
                &self,
                input: AttentionInput,
            ) -> Result<(Tensor<3>, Tensor<4>), AttentionError> {
                match self { $(Self::$arm(m) => m.try_forward_with_weights(input),)* }
            }

            fn decode(
                &self,
                x: Tensor<3>,
                state: DecodingState,
            ) -> Result<(Tensor<3>, DecodingState), AttentionError> {
                match self { $(Self::$arm(m) => m.decode(x, state),)* }
            }

            fn prefill(
                &self,
                x: Tensor<3>,
            ) -> Result<(Tensor<3>, DecodingState), AttentionError> {
                match self { $(Self::$arm(m) => m.prefill(x),)* }
            }

            fn prefill_padded(
                &self,
                x: Tensor<3>,
                mask_pad: Tensor<2, Bool>,
            ) -> Result<(Tensor<3>, DecodingState), AttentionError> {
                match self { $(Self::$arm(m) => m.prefill_padded(x, mask_pad),)* }
            }

            fn forward_with_memory(
                &self,
                input: AttentionInput,
                memory: Option<SegmentMemory>,
            ) -> Result<(Tensor<3>, SegmentMemory), AttentionError> {
                match self { $(Self::$arm(m) => m.forward_with_memory(input, memory),)* }
            }

            fn redraw(self) -> Self {
                match self { $(Self::$arm(m) => Self::$arm(m.redraw()),)* }
            }

            fn penalty(&self) -> Option<Tensor<1>> {
                match self { $(Self::$arm(m) => m.penalty(),)* }
            }
        }
    };
}

registry! {
    /// Exact softmax attention.
    Softmax(SoftmaxAttentionConfig => SoftmaxAttention),
    /// Linformer, with softmax or linear-complexity scoring.
    Linformer(LinformerConfig => LinformerAttention),
    /// Efficient Attention.
    Efficient(EfficientAttentionConfig => EfficientAttention),
    /// Linear Transformer attention (`elu + 1`).
    Linear(LinearAttentionConfig => LinearAttention),
    /// Performer (FAVOR+ or the generalized ReLU kernel).
    Performer(PerformerConfig => PerformerAttention),
    /// A trainable feed-forward kernel (`ff-*`).
    FeedForward(FeedForwardKernelConfig => FeedForwardKernelAttention),
    /// Nyströmformer.
    Nystrom(NystromConfig => NystromAttention),
    /// Local attention: blocks or a sliding window.
    Local(LocalAttentionConfig => LocalAttention),
    /// Sparse Transformer: fixed or strided factorised patterns.
    Sparse(SparseAttentionConfig => SparseAttention),
    /// Longformer: a sliding window plus global tokens.
    Longformer(LongformerConfig => LongformerAttention),
    /// BigBird: window, global and random blocks.
    BigBird(BigBirdConfig => BigBirdAttention),
    /// Synthesizer: random or dense synthesized weights.
    Synthesizer(SynthesizerConfig => SynthesizerAttention),
    /// Sparse Sinkhorn attention: own block and a sorted block.
    Sinkhorn(SinkhornConfig => SinkhornAttention),
    /// Reformer: LSH attention over sorted chunks.
    Reformer(ReformerConfig => ReformerAttention),
    /// Set Transformer: induced set attention (ISAB).
    SetTransformer(SetTransformerConfig => SetTransformerAttention),
    /// Memory-compressed attention: keys and values shortened by a strided convolution.
    MemoryCompressed(MemoryCompressedConfig => MemoryCompressedAttention),
    /// Axial attention: along the rows and the columns of a 2-D layout.
    Axial(AxialConfig => AxialAttention),
    /// ETC: global-local attention with relative positions.
    Etc(EtcConfig => EtcAttention),
    /// Transformer-XL: segments with a gradient-stopped memory and relative positions.
    TransformerXl(TransformerXlConfig => TransformerXlAttention),
    /// Compressive Transformer: Transformer-XL with a compressed memory of older states.
    Compressive(CompressiveConfig => CompressiveAttention),
    /// Routing Transformer: online k-means routing beside local attention.
    Routing(RoutingConfig => RoutingAttention),
    /// RetNet: multi-scale retention, linear attention with a fixed decay per head.
    RetNet(RetNetConfig => RetNetAttention),
    /// Mamba-2: the SSD mixer, a scalar decay per head that depends on the token.
    Mamba2(Mamba2Config => Mamba2Attention),
    /// GLA: gated linear attention, a gate per key channel that depends on the token.
    Gla(GlaConfig => GlaAttention),
    /// DeltaNet: linear attention written with the delta rule; `gated-deltanet` adds a decay.
    DeltaNet(DeltaNetConfig => DeltaNetAttention),
    /// Hedgehog: linear attention with a learned feature map that mimics softmax.
    Hedgehog(HedgehogConfig => HedgehogAttention),
}

/// Every registered variant, in the order listings show them.
pub const VARIANTS: &[VariantInfo] = &ALL;

/// The variants' entries one after another (the registry's listing, built at compile time).
const fn concat<const N: usize>(lists: &[&[VariantInfo]]) -> [VariantInfo; N] {
    let mut all = [lists[0][0]; N];
    let (mut i, mut at) = (0, 0);
    while i < lists.len() {
        let mut j = 0;
        while j < lists[i].len() {
            all[at] = lists[i][j];
            at += 1;
            j += 1;
        }
        i += 1;
    }
    all
}

/// Looks a variant up by name.
pub fn variant(name: &str) -> Result<&'static VariantInfo, AttentionError> {
    VARIANTS
        .iter()
        .find(|v| v.name == name)
        .ok_or_else(|| AttentionError::UnknownVariant {
            name: name.to_string(),
            known: VARIANTS.iter().map(|v| v.name).collect(),
        })
}

impl AttentionConfig {
    /// The variant called `name`, with its paper defaults, for a model of width `d_model` with
    /// `n_heads` heads. The variants whose parameters depend on the longest sequence (those with
    /// [`Capabilities::fixed_max_len`]: `linformer`, `bigbird`, `sinkhorn`, `synthesizer`, ...)
    /// are an error naming `n_max`: give it with [`from_name`](Self::from_name).
    pub fn named(name: &str, d_model: usize, n_heads: usize) -> Result<Self, AttentionError> {
        let info = variant(name)?;
        if info.capabilities.fixed_max_len {
            return Err(AttentionError::field(
                info.name,
                "n_max",
                "is needed: its parameters depend on the longest sequence; use \
                 AttentionConfig::from_name(name, d_model, n_heads, n_max)",
            ));
        }
        // No other variant reads `n_max`.
        let model = ModelShape {
            d_model,
            n_heads,
            n_max: 0,
        };
        Ok(Self::with_defaults(info, model))
    }

    /// The variant called `name`, with its paper defaults, for a model of width `d_model` with
    /// `n_heads` heads on sequences of at most `n_max` positions.
    pub fn from_name(
        name: &str,
        d_model: usize,
        n_heads: usize,
        n_max: usize,
    ) -> Result<Self, AttentionError> {
        let model = ModelShape {
            d_model,
            n_heads,
            n_max,
        };
        Ok(Self::with_defaults(variant(name)?, model))
    }

    /// The registry name.
    pub fn name(&self) -> &'static str {
        self.info().name
    }
}

/// `config` with `params` applied (see [`AttentionConfig::with_params`]).
fn merge_params<C: VariantConfig>(
    config: C,
    params: &Map<String, Value>,
) -> Result<C, AttentionError> {
    let variant = config.info().name;
    let err = |message: String| AttentionError::InvalidParams { variant, message };
    let Value::Object(mut merged) =
        serde_json::to_value(&config).map_err(|e| err(e.to_string()))?
    else {
        return Err(err("configuration is not a table".into()));
    };
    let allowed: Vec<String> = merged
        .keys()
        .filter(|k| !ModelShape::FIELDS.contains(&k.as_str()))
        .cloned()
        .collect();
    for key in params.keys() {
        if ModelShape::FIELDS.contains(&key.as_str()) {
            return Err(err(format!(
                "`{key}` is set by the model, not per attention"
            )));
        }
        if !merged.contains_key(key) {
            return Err(err(format!(
                "unknown key `{key}` (expected one of: {})",
                allowed.join(", ")
            )));
        }
    }
    let mut parsed = config;
    for (key, value) in params {
        merged.insert(key.clone(), value.clone());
        // Parse after each key so that a bad value is blamed on the key that holds it.
        parsed = serde_json::from_value(Value::Object(merged.clone()))
            .map_err(|e| err(format!("`{key}`: {e}")))?;
        if parsed.info().name != variant {
            return Err(err(format!(
                "`{key}` would make it `{}`: ask for that variant by name",
                parsed.info().name
            )));
        }
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::variants::gla::GlaConfig;

    /// A variant's typed configuration converts into [`AttentionConfig`] and its module into
    /// [`Attention`], as the registry line generates for every variant.
    #[test]
    fn typed_configurations_and_modules_convert_into_the_registry_types() {
        let config: AttentionConfig = SoftmaxAttentionConfig::new(16, 2).into();
        assert_eq!(config.info().name, "softmax");
        let module: Attention = GlaConfig::new(16, 2).init(&Device::flex()).into();
        assert_eq!(module.name(), "gla");
    }
}
