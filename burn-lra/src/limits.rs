//! The bound every size and count the harness is given must keep: the one checked path, shared
//! with the sweep tool (`lra_runs::limits`).

pub use lra_runs::limits::{MAX_SIZE, check_size};
