#![warn(missing_docs)]
//! # burn-attention
//!
//! Efficient-attention variants written once as [Burn](https://burn.dev) modules, runnable on
//! every Burn backend and usable inside any Burn model.
//!
//! Every variant shares one contract:
//! - an [`AttentionInput`] (`[batch, n, d_model]`, a padding mask and a causal flag, `true` =
//!   masked) in, `[batch, n, d_model]` out;
//! - a functional form on per-head tensors `[batch, heads, n, d_head]` beside the module
//!   ([`softmax_attention`], [`linformer_attention`], [`efficient_attention`], ...);
//! - an entry in the registry: [`AttentionConfig`] (by name, with parameters) initialises an
//!   [`Attention`], and [`VARIANTS`] lists what each one supports;
//! - the pre-LN [`Encoder`] takes any [`AttentionConfig`].
//!
//! ```rust
//! use burn::prelude::*;
//! use burn_attention::{AttentionConfig, AttentionInput, EncoderBlockConfig, EncoderConfig};
//!
//! let device = Device::flex();
//! let attention = AttentionConfig::from_name("linformer", 64, 4, 128).unwrap();
//! let encoder = EncoderConfig::new(EncoderBlockConfig::new(attention, 128), 2).init(&device);
//! let x = Tensor::<3>::random([2, 100, 64], burn::tensor::Distribution::Default, &device);
//! let y = encoder.forward(AttentionInput::new(x));
//! assert_eq!(y.dims(), [2, 100, 64]);
//! ```

pub mod efficient;
mod encoder;
mod error;
pub mod feedforward;
mod flash;
mod heads;
mod input;
pub mod kernelized;
pub mod linear;
pub mod linformer;
pub mod nystrom;
mod params;
pub mod performer;
mod registry;
pub mod softmax;

pub use efficient::{EfficientAttention, EfficientAttentionConfig, efficient_attention};
pub use encoder::{Encoder, EncoderBlock, EncoderBlockConfig, EncoderConfig};
pub use error::AttentionError;
pub use feedforward::{
    FeedForwardKernel, FeedForwardKernelAttention, FeedForwardKernelConfig, KernelUnit,
};
pub use heads::{QkvoProjection, merge_heads, split_heads};
pub use input::{AttentionInput, causal_mask, padding_mask_from_lengths};
pub use kernelized::{CAUSAL_CHUNK, causal_kernelized_attention, kernelized_attention};
pub use linear::{LinearAttention, LinearAttentionConfig, elu_feature_map, linear_attention};
pub use linformer::{
    LinformerAttention, LinformerConfig, LinformerScoring, LinformerSharing, linformer_attention,
    linformer_linear_attention,
};
pub use nystrom::{
    NystromAttention, NystromConfig, iterative_pinv, landmark_segments, nystrom_attention,
};
pub use params::num_trainable_params;
pub use performer::{
    PerformerAttention, PerformerConfig, PerformerKernel, favor_attention, favor_features,
    orthogonal_features, random_orthogonal,
};
pub use registry::{Attention, AttentionConfig, Capabilities, VARIANTS, VariantInfo, variant};
pub use softmax::{SoftmaxAttention, SoftmaxAttentionConfig, softmax_attention};

/// The README's Rust examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
