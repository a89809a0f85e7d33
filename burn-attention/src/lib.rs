#![warn(missing_docs)]
#![doc = include_str!("../README.md")]
//!
//! ## Layout
//!
//! - the ground floors every variant builds on, none importing a variant: [`contract`] (the
//!   API: the trait, inputs, errors, a variant's facts), `kernels` (backend kernels with their
//!   own backward passes) and [`engines`] (the numeric forms the variants share).
//! - [`variants`]: one file per method, side by side, never importing one another. Each states
//!   its own facts (its [`VariantInfo`] entries) and implements [`VariantConfig`] and
//!   [`AttentionModule`].
//! - the registry ([`AttentionConfig`], [`Attention`], [`VARIANTS`]): one line per variant
//!   configuration, from which the listing, name lookup, config parsing and dispatch follow.
//! - the encoder ([`Encoder`], [`EncoderBlock`]), generic over any [`AttentionModule`].

pub mod contract;
mod encoder;
pub mod engines;
pub(crate) mod kernels;
mod registry;
pub mod variants;

pub use crate::contract::error::AttentionError;
pub use crate::contract::input::{
    AttentionInput, HeadMasks, MASK_FILL, causal_mask, padding_mask_from_lengths,
};
pub use crate::contract::variant::{ModelShape, VariantConfig, VariantInfo};
pub use crate::contract::{
    AttentionModule, CachedKeys, Capabilities, CompressiveMemory, DecayedState, DecodingState,
    RecurrentState, SegmentMemory,
};
pub use crate::engines::features::{orthogonal_features, random_orthogonal};
pub use crate::engines::heads::{QkvoProjection, merge_heads, split_heads};
pub use crate::engines::kernelized::{
    CAUSAL_CHUNK, GRADIENT_DENOMINATOR_FLOOR, causal_kernelized_attention, kernelized_attention,
    kernelized_step,
};
pub use crate::engines::params::{num_params_checked, num_trainable_params};
pub use encoder::{
    BlockSettings, Encoder, EncoderBlock, EncoderBlockConfig, EncoderConfig, HYBRID_SEPARATOR,
    hybrid_pattern, repeat_pattern,
};
pub use registry::{Attention, AttentionConfig, VARIANTS, variant};
pub use variants::axial::{AxialAttention, AxialConfig};
pub use variants::bigbird::{BigBirdAttention, BigBirdConfig};
pub use variants::compressive::{CompressiveAttention, CompressiveConfig};
pub use variants::deltanet::{DeltaDecay, DeltaNetAttention, DeltaNetConfig};
pub use variants::efficient_attention::{
    EfficientAttention, EfficientAttentionConfig, efficient_attention,
};
pub use variants::extended_transformer::{EtcAttention, EtcConfig, EtcGlobal};
pub use variants::gla::{GlaAttention, GlaConfig};
pub use variants::hedgehog::{HedgehogAttention, HedgehogConfig, hedgehog_features};
pub use variants::linear::{
    LinearAttention, LinearAttentionConfig, elu_feature_map, linear_attention,
};
pub use variants::linformer::{
    LinformerAttention, LinformerConfig, LinformerScoring, LinformerSharing, linformer_attention,
    linformer_linear_attention,
};
pub use variants::local::{LocalAttention, LocalAttentionConfig, LocalForm};
pub use variants::longformer::{LongformerAttention, LongformerConfig};
pub use variants::mamba2::{Mamba2Attention, Mamba2Config};
pub use variants::memory_compressed::{MemoryCompressedAttention, MemoryCompressedConfig};
pub use variants::nystrom::{
    NystromAttention, NystromConfig, iterative_pinv, landmark_segments, nystrom_attention,
    nystrom_cross_attention,
};
pub use variants::performer::{
    PerformerAttention, PerformerConfig, PerformerKernel, favor_attention, favor_features,
};
pub use variants::reformer::{ReformerAttention, ReformerConfig};
pub use variants::retnet::{RetNetAttention, RetNetConfig, retnet_log_decays};
pub use variants::routing::{RoutingAttention, RoutingConfig};
pub use variants::set_transformer::{SetTransformerAttention, SetTransformerConfig};
pub use variants::sinkhorn::{SinkhornAttention, SinkhornConfig};
pub use variants::softmax::{SoftmaxAttention, SoftmaxAttentionConfig, softmax_attention};
pub use variants::sparse::{SparseAttention, SparseAttentionConfig, SparsePattern};
pub use variants::synthesizer::{SynthesizerAttention, SynthesizerConfig, SynthesizerMode};
pub use variants::trainable_kernels::{
    FeedForwardKernel, FeedForwardKernelAttention, FeedForwardKernelConfig, KernelUnit,
};
pub use variants::transformer_xl::{TransformerXlAttention, TransformerXlConfig};
