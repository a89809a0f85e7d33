#![warn(missing_docs)]
//! # lra-runs
//!
//! What the LRA harness (`burn-lra`) and the sweep tool (`cargo xtask lra`) agree on, defined
//! once and without Burn, so that the sweep tool reads and schedules runs without compiling a
//! backend:
//!
//! - [`layout`]: where a run lives (`<out>/<task>/<preset>/<attention>/seed-<n>/`), the names of
//!   its files, and its state (finished, checkpointed, fresh).
//! - [`result`]: [`RunResult`], the contents of `result.json`.
//! - [`files`]: atomic writes and the lock that keeps one process per run directory.
//! - [`names`]: the tasks and the backends by name, and each backend's cargo feature.

pub mod files;
pub mod layout;
pub mod names;
pub mod result;

pub use files::{RunDirInUse, RunDirLock, write_atomic};
pub use layout::{RunState, preset_name, run_dir, run_state, sweep_dir};
pub use names::{BackendKind, Task};
pub use result::{ConfigChange, RunResult, Selection};

/// The exit status of `burn-lra train` when another process holds the run directory's lock
/// (`EX_TEMPFAIL`): nothing was done, and the run is that process's to finish.
pub const EXIT_IN_USE: u8 = 75;
