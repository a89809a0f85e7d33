//! The engines floor: the numeric forms the variants share, each once. Head projections, exact
//! softmax attention and softmax over gathered keys (the sparse patterns), the kernelized core
//! with its chunked causal and recurrent forms, linear attention with a decaying state and with
//! the delta rule (and the scan that carries their state between chunks), Transformer-XL's
//! segments, rotary positions, random features, hashed dropout and parameter counts. They build
//! on [`crate::contract`] and dispatch to the backend kernels of `kernels`; nothing here imports a
//! variant, the registry or the encoder.

pub mod decay;
pub mod delta;
pub mod dropout;
pub(crate) mod features;
pub(crate) mod gathered_softmax;
pub(crate) mod heads;
pub mod kernelized;
pub(crate) mod params;
pub mod rotary;
pub(crate) mod scan;
pub mod segments;
pub(crate) mod softmax;
