#![warn(missing_docs)]
//! # burn-lra
//!
//! One Long Range Arena harness that trains and evaluates any attention of
//! [`burn_attention_zoo`] on any compiled-in Burn backend.
//!
//! - [`config`]: presets and user configuration files, strictly checked.
//! - [`data`]: the tasks' readers, generators and batching.
//! - [`tasks`]: the tasks side by side behind one trait, and their registry.
//! - [`model`]: the LRA encoder classifier; [`budget`]: its parameters and memory, from shapes.
//! - [`plan`]: a run planned and checked once, which the trainer takes.
//! - [`train`]: the training loop.
//! - [`run_dir`]: a run directory's files: checkpoints, resumes, the lock, comparisons.
//! - [`backend`]: backends as cargo features, picked at run time.
//! - [`limits`], [`checksum`]: the bound on sizes, and the SHA-256 files are checked by.

pub mod agreement;
pub mod backend;
pub mod bench;
pub mod budget;
pub mod checksum;
pub mod config;
pub mod data;
pub mod limits;
pub mod memory;
pub mod model;
pub mod plan;
pub mod pretraining;
#[cfg(test)]
mod properties;
pub mod rng;
pub mod run_dir;
pub mod tasks;
pub mod train;
