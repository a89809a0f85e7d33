#![warn(missing_docs)]
#![doc = include_str!("../README.md")]
//!
//! ## Layout
//!
//! - [`core`]: the ground floor every variant builds on; it imports no variant.
//! - [`variants`]: one file per method, side by side, never importing one another. Each states
//!   its own facts (its [`VariantInfo`] entries) and implements [`VariantConfig`] and
//!   [`AttentionModule`].
//! - the registry ([`AttentionConfig`], [`Attention`], [`VARIANTS`]): one line per variant
//!   configuration, from which the listing, name lookup, config parsing and dispatch follow.
//! - the encoder ([`Encoder`], [`EncoderBlock`]), generic over any [`AttentionModule`].

pub mod core;
mod encoder;
mod registry;
pub mod variants;

pub use crate::core::contract::{
    AttentionModule, CachedKeys, Capabilities, CompressiveMemory, DecayedState, DecodingState,
    RecurrentState, SegmentMemory,
};
pub use crate::core::error::AttentionError;
pub use crate::core::features::{orthogonal_features, random_orthogonal};
pub use crate::core::heads::{QkvoProjection, merge_heads, split_heads};
pub use crate::core::input::{
    AttentionInput, HeadMasks, MASK_FILL, causal_mask, padding_mask_from_lengths,
};
pub use crate::core::kernelized::{
    CAUSAL_CHUNK, GRADIENT_DENOMINATOR_FLOOR, causal_kernelized_attention, kernelized_attention,
    kernelized_step,
};
pub use crate::core::params::{num_params_checked, num_trainable_params};
pub use crate::core::variant::{ModelShape, VariantConfig, VariantInfo};
pub use encoder::{
    BlockSettings, Encoder, EncoderBlock, EncoderBlockConfig, EncoderConfig, HYBRID_SEPARATOR,
    hybrid_pattern, repeat_pattern,
};
pub use registry::{Attention, AttentionConfig, VARIANTS, variant};
pub use variants::axial::{AxialAttention, AxialConfig};
pub use variants::bigbird::{BigBirdAttention, BigBirdConfig};
pub use variants::compressive::{CompressiveAttention, CompressiveConfig};
pub use variants::deltanet::{DeltaDecay, DeltaNetAttention, DeltaNetConfig};
pub use variants::efficient::{EfficientAttention, EfficientAttentionConfig, efficient_attention};
pub use variants::etc::{EtcAttention, EtcConfig, EtcGlobal};
pub use variants::feedforward::{
    FeedForwardKernel, FeedForwardKernelAttention, FeedForwardKernelConfig, KernelUnit,
};
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
pub use variants::transformer_xl::{TransformerXlAttention, TransformerXlConfig};
