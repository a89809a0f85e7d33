//! The ground floor every variant builds on: inputs and masks, errors, head projections, the
//! exact softmax with its fused kernels, the kernelized core with its chunked causal and
//! recurrent forms, linear attention with a decaying state and with the delta rule (and the
//! scan that carries their state between chunks), rotary positions, random features, the module
//! contract and what a variant states about itself. Nothing here imports a variant, the registry or the encoder.

pub mod contract;
pub mod decay;
pub mod delta;
pub mod dropout;
pub mod error;
pub mod features;
pub(crate) mod flash;
pub mod heads;
pub mod input;
pub mod kernelized;
pub mod key_slots;
pub mod params;
pub(crate) mod prelude;
pub mod rotary;
pub(crate) mod scan;
pub mod segments;
pub mod softmax;
pub mod sparse;
pub mod variant;
