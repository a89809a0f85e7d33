//! Where runs live and what their directories hold.
//!
//! ```text
//! <out>/<task>/<preset>/                  a sweep: one folder per attention, summary.{json,md}
//! <out>/<task>/<preset>/<attention>/seed-<n>/
//!   config.json        the resolved configuration (and the changes resumes made to it)
//!   metrics.jsonl      one line per validation
//!   checkpoint/        model.bpk, optimizer.bpk, checksums.json, state.json (until finished)
//!   model-best.bpk     best-validation weights
//!   model-last.bpk     last weights (finished runs)
//!   result.json        written last: a directory holding it is finished
//!   .lock              held by the process training in it
//! ```

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::names::Task;
use crate::result::RunResult;

/// The resolved configuration.
pub const CONFIG: &str = "config.json";
/// The BPE tokenizer a run's tokens come from (`data.tokenizer = "bpe"` only).
pub const TOKENIZER: &str = "tokenizer.json";
/// One JSON line per validation.
pub const METRICS: &str = "metrics.jsonl";
/// The outcome; written last, so a directory holding it is finished.
pub const RESULT: &str = "result.json";
/// The best-validation weights.
pub const MODEL_BEST: &str = "model-best.bpk";
/// The last weights (finished runs).
pub const MODEL_LAST: &str = "model-last.bpk";
/// The checkpoint folder.
pub const CHECKPOINT: &str = "checkpoint";
/// The checkpoint being written (renamed to [`CHECKPOINT`] when complete).
pub const CHECKPOINT_NEW: &str = "checkpoint.new";
/// The previous checkpoint while the new one is renamed into place (a kill between the two
/// renames leaves only this one).
pub const CHECKPOINT_OLD: &str = "checkpoint.old";
/// A checkpoint's weights.
pub const CHECKPOINT_MODEL: &str = "model.bpk";
/// A checkpoint's optimiser state.
pub const CHECKPOINT_OPTIMIZER: &str = "optimizer.bpk";
/// The SHA-256 of a checkpoint's weights and optimiser state, checked on resume.
pub const CHECKPOINT_CHECKSUMS: &str = "checksums.json";
/// A checkpoint's state (step, data position, best validation); written last in it.
pub const CHECKPOINT_STATE: &str = "state.json";
/// The lock file (see [`crate::RunDirLock`]).
pub const LOCK: &str = ".lock";
/// A sweep's summary, as JSON.
pub const SUMMARY_JSON: &str = "summary.json";
/// A sweep's summary, as the markdown table it prints.
pub const SUMMARY_MD: &str = "summary.md";

/// The name runs are filed under: a configuration file's stem, or else the preset's name.
pub fn preset_name(preset: &str, config: Option<&Path>) -> String {
    match config {
        Some(path) => path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
        None => preset.to_string(),
    }
}

/// A sweep's folder: `<out>/<task>/<preset>`.
pub fn sweep_dir(out: &Path, task: Task, preset: &str) -> PathBuf {
    out.join(task.name()).join(preset)
}

/// A run's folder within its sweep: `<sweep>/<attention>/seed-<seed>`.
pub fn run_dir(sweep_dir: &Path, attention: &str, seed: u64) -> PathBuf {
    sweep_dir.join(attention).join(format!("seed-{seed}"))
}

/// The newest complete checkpoint of `run_dir`, if any.
pub fn find_checkpoint(run_dir: &Path) -> Option<PathBuf> {
    [CHECKPOINT, CHECKPOINT_OLD]
        .iter()
        .map(|name| run_dir.join(name))
        .find(|dir| dir.join(CHECKPOINT_STATE).is_file())
}

/// Where a run stands.
#[derive(Debug, Clone, PartialEq)]
pub enum RunState {
    /// Finished: its `result.json`.
    Finished(Box<RunResult>),
    /// Stopped after a checkpoint; `burn-lra train --resume` continues it.
    Checkpointed,
    /// Never started, or stopped before its first checkpoint.
    Fresh,
}

/// Where the run in `run_dir` stands; an unreadable `result.json` is an error naming it.
pub fn run_state(run_dir: &Path) -> Result<RunState> {
    let path = run_dir.join(RESULT);
    if path.is_file() {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let result = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a run result", path.display()))?;
        return Ok(RunState::Finished(Box::new(result)));
    }
    Ok(match find_checkpoint(run_dir) {
        Some(_) => RunState::Checkpointed,
        None => RunState::Fresh,
    })
}
