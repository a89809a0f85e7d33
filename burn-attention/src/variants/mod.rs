//! The variants, side by side: each file holds one method's module, configuration, functional
//! form and facts (its registry entries). They build on [`crate::core`] and never import one
//! another.

pub mod axial;
pub mod bigbird;
pub mod compressive;
pub mod deltanet;
pub mod efficient;
pub mod etc;
pub mod feedforward;
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
pub mod reformer;
pub mod retnet;
pub mod routing;
pub mod set_transformer;
pub mod sinkhorn;
pub mod softmax;
pub mod sparse;
pub mod synthesizer;
pub mod transformer_xl;
