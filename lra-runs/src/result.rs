//! `result.json`: the outcome of a finished run, written last by `burn-lra train` and read by
//! the sweep's summary.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::files::read_json;
use crate::layout::{RESULT, find_checkpoint};
use crate::names::{BackendKind, Task};

/// Which weights the reported test accuracy comes from (both are always measured).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Selection {
    /// The weights with the best validation accuracy (the PyTorch re-runs).
    BestVal,
    /// The weights after the last step (the LRA paper's released numbers).
    Last,
}

impl Selection {
    /// The spelling of config files and `result.json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BestVal => "best-val",
            Self::Last => "last",
        }
    }
}

/// A resume that changed the configuration: from which step, and each changed field's value
/// before and after.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigChange {
    /// The checkpoint step training continued from with the new values.
    pub from_step: usize,
    /// `field -> [was, now]` (JSON values; `null` = absent).
    pub fields: BTreeMap<String, [Value; 2]>,
}

/// The outcome of a run, as written to `result.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// The task.
    pub task: Task,
    /// Attention name.
    pub attention: String,
    /// Preset name or config file stem.
    pub preset: String,
    /// Training seed.
    pub seed: u64,
    /// Backend.
    pub backend: BackendKind,
    /// Device, as Burn names it.
    pub device: String,
    /// Steps trained.
    pub steps: usize,
    /// Trainable parameters of the model (frozen random features not counted).
    pub n_params: usize,
    /// Trainable parameters of the softmax model of the same configuration.
    pub n_params_softmax: usize,
    /// Relative parameter increase over that softmax model.
    pub param_increase: f64,
    /// Which weights `test_accuracy` comes from.
    pub selection: Selection,
    /// Test accuracy of the selected weights.
    pub test_accuracy: f64,
    /// Test accuracy after the last step.
    pub test_accuracy_last: f64,
    /// Test accuracy of the best-validation weights.
    pub test_accuracy_best_val: f64,
    /// Best validation accuracy.
    pub best_val_accuracy: f64,
    /// Step of the best validation accuracy.
    pub best_val_step: usize,
    /// Share of the test set's most frequent class.
    pub test_majority_rate: f64,
    /// Examples in the train, validation and test splits.
    pub split_sizes: [usize; 3],
    /// Where validation examples came from (a file, a hold-out, or the test split).
    pub validation_source: String,
    /// Whether model selection saw the test split (`data.validation = "test"`).
    pub validated_on_test: bool,
    /// Wall-clock training time, validation included.
    pub train_seconds: f64,
    /// Settings that worked but were likely a mistake.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Resumes that changed the configuration (from which step, which fields).
    #[serde(default)]
    pub config_changes: Vec<ConfigChange>,
    /// The SHA-256 of the weight files the run left (`model-best.bpk`, `model-last.bpk`), by
    /// file name: whatever reads them checks them first. Empty in results written before they
    /// were kept, whose weights are then refused.
    #[serde(default)]
    pub weights_sha256: BTreeMap<String, String>,
    /// The commits of the harness builds that trained the run, in order: one, unless a resume
    /// ran another build (`-dirty`: built with uncommitted changes to tracked files; `unknown`:
    /// built outside a git checkout; `unrecorded`: steps trained by a harness that did not record its build). Empty in results written before they were recorded.
    #[serde(default)]
    pub commits: Vec<String>,
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
pub fn run_state(run_dir: &Path) -> anyhow::Result<RunState> {
    let path = run_dir.join(RESULT);
    if path.is_file() {
        let result = read_json(&path, "a run result")?;
        return Ok(RunState::Finished(Box::new(result)));
    }
    Ok(match find_checkpoint(run_dir) {
        Some(_) => RunState::Checkpointed,
        None => RunState::Fresh,
    })
}
