//! The variants, side by side: each file holds one method's module, configuration, functional
//! form and facts (its registry entries). They build on [`crate::contract`] and [`crate::engines`] and never import one
//! another.

pub mod axial;
pub mod bigbird;
pub mod compressive;
pub mod deltanet;
pub mod efficient_attention;
pub mod extended_transformer;
pub mod gla;
pub mod hedgehog;
pub mod linear;
pub mod linformer;
pub mod local;
pub mod longformer;
pub mod mamba2;
pub mod memory_compressed;
pub mod nystrom;
pub mod performer;
pub(crate) mod prelude;
pub mod reformer;
pub mod retnet;
pub mod routing;
pub mod set_transformer;
pub mod sinkhorn;
pub mod softmax;
pub mod sparse;
pub mod synthesizer;
pub mod trainable_kernels;
pub mod transformer_xl;
