//! The bound every size and count the harness and the sweep tool are given must keep: one
//! checked path for configurations, file headers and flags alike.

use anyhow::{Result, bail};

/// The largest size or count a configuration, a generator or a benchmark flag may give
/// (2^32 - 1): far above any trainable model's, and small enough that every sum and single
/// product of sizes the harness forms fits in 64 bits (parameter counts, which multiply several,
/// are computed with checked arithmetic).
pub const MAX_SIZE: usize = u32::MAX as usize;

/// Refuses a `value` of 0 (where `at_least_one`) or above [`MAX_SIZE`], naming `key` (a field,
/// `` `model.d_model` ``, or a flag, `` `--n` ``).
pub fn check_size(key: &str, value: usize, at_least_one: bool) -> Result<()> {
    if at_least_one && value == 0 {
        bail!("`{key}` must be at least 1");
    }
    if value > MAX_SIZE {
        bail!("`{key}` must be at most {MAX_SIZE} (2^32 - 1), got {value}");
    }
    Ok(())
}
