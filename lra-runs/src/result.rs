//! `result.json`: the outcome of a finished run, written last by `burn-lra train` and read by
//! the sweep's summary.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::files::read_json;
use crate::layout::{RESULT, find_checkpoint};
use crate::names::{AttentionName, BackendKind, Task};

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

/// Where a fine-tuned run's starting weights came from: a finished self-pretraining run (fields
/// in alphabetical order, as the file's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InitFrom {
    /// The harness builds that trained the pretraining run.
    pub commits: Vec<String>,
    /// Its objective (`masked-tokens`, `next-token`).
    pub objective: String,
    /// The pretraining run's directory (absolute).
    pub run_dir: std::path::PathBuf,
    /// The weight file read (`model-best.bpk`).
    pub weights: String,
    /// That file's SHA-256, as the pretraining run's `result.json` recorded it and as it was
    /// checked when read.
    pub weights_sha256: String,
}

/// The outcome of a run, as written to `result.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// The task.
    pub task: Task,
    /// The attention's name (a hybrid stack's pattern).
    pub attention: AttentionName,
    /// Preset name or config file stem.
    pub preset: String,
    /// Training seed.
    pub seed: u64,
    /// Backend.
    pub backend: BackendKind,
    /// Device, as Burn names it.
    pub device: String,
    /// Token-level tasks: whether the encoder masked the future (every layer's attention has a
    /// causal form) or read the whole sequence; absent for per-example tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub causal: Option<bool>,
    /// Causal token-level runs: the numbers the model's decoding keeps after one sequence of the
    /// task's length (`DecodingState::num_elements` over every layer; the key/value cache for
    /// softmax, the fixed-size state of a recurrent attention). Absent otherwise, and in records
    /// written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoding_state_elements: Option<u64>,
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
    /// The self-pretraining run the model started from (`train --init-from`); absent for a run
    /// from scratch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<InitFrom>,
    /// The SHA-256 (hex) of this result's own JSON written compactly without this field
    /// ([`sealed`](Self::sealed)): summaries and `compare` check it before they believe a figure.
    /// Absent in results written before it was recorded, whose figures are checked for range
    /// only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

impl RunResult {
    /// The SHA-256 of the result's JSON without its own checksum.
    fn digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let unsealed = Self {
            sha256: None,
            ..self.clone()
        };
        let json = serde_json::to_string(&unsealed).expect("a result serialises");
        Sha256::digest(json.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The result with its checksum recorded, as `burn-lra train` writes it.
    pub fn sealed(self) -> Self {
        let sha256 = Some(self.digest());
        Self { sha256, ..self }
    }

    /// Checks what a result says of itself: its checksum where it has one, and every figure in
    /// its range (accuracies and rates in [0, 1], parameter counts, steps and the training time
    /// positive, the best-validation step within the steps). The error names the field.
    pub fn verify(&self) -> Result<(), String> {
        if let Some(recorded) = &self.sha256
            && *recorded != self.digest()
        {
            return Err("its checksum does not match its contents (edited or damaged)".into());
        }
        for (field, value) in [
            ("test_accuracy", self.test_accuracy),
            ("test_accuracy_last", self.test_accuracy_last),
            ("test_accuracy_best_val", self.test_accuracy_best_val),
            ("best_val_accuracy", self.best_val_accuracy),
            ("test_majority_rate", self.test_majority_rate),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(format!("`{field}` is {value}, outside [0, 1]"));
            }
        }
        let expected = match self.selection {
            Selection::BestVal => self.test_accuracy_best_val,
            Selection::Last => self.test_accuracy_last,
        };
        if self.test_accuracy != expected {
            return Err(format!(
                "`test_accuracy` ({}) is not the `{}` weights' ({expected})",
                self.test_accuracy,
                self.selection.as_str()
            ));
        }
        if !(self.train_seconds.is_finite() && self.train_seconds > 0.0) {
            return Err(format!(
                "`train_seconds` is {}, not a positive time",
                self.train_seconds
            ));
        }
        if !(self.param_increase.is_finite() && self.param_increase > -1.0) {
            return Err(format!(
                "`param_increase` is {}, not a relative increase",
                self.param_increase
            ));
        }
        for (field, value) in [
            ("steps", self.steps),
            ("n_params", self.n_params),
            ("n_params_softmax", self.n_params_softmax),
        ] {
            if value == 0 {
                return Err(format!("`{field}` is 0"));
            }
        }
        if self.best_val_step > self.steps {
            return Err(format!(
                "`best_val_step` ({}) is past `steps` ({})",
                self.best_val_step, self.steps
            ));
        }
        Ok(())
    }

    /// Checks that the result belongs where it was found: the run directory of `attention`
    /// and `seed` in the sweep of `task` and `preset` (a run folder copied under another
    /// attention's or seed's folder is refused), then [`verify`](Self::verify). The error
    /// names what differs.
    pub fn verify_place(
        &self,
        task: &Task,
        preset: &str,
        attention: &str,
        seed: u64,
    ) -> Result<(), String> {
        let recorded_dir = crate::names::attention_dir_name(&self.attention);
        if recorded_dir != crate::names::attention_dir_name(attention) {
            return Err(format!(
                "it records the attention `{}`, but sits in the folder of `{attention}`",
                self.attention
            ));
        }
        if self.seed != seed {
            return Err(format!(
                "it records seed {}, but sits in the folder of seed {seed}",
                self.seed
            ));
        }
        if self.task != *task {
            return Err(format!(
                "it records the task `{}`, but sits in the sweep of `{task}`",
                self.task
            ));
        }
        if self.preset != preset {
            return Err(format!(
                "it records the preset `{}`, but sits in the sweep of `{preset}`",
                self.preset
            ));
        }
        self.verify()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn result() -> RunResult {
        RunResult {
            task: Task::new("listops").unwrap(),
            attention: AttentionName::new("softmax").unwrap(),
            preset: "tiny".into(),
            seed: 1,
            backend: BackendKind::Flex,
            device: "Cpu".into(),
            causal: None,
            decoding_state_elements: None,
            steps: 100,
            n_params: 10,
            n_params_softmax: 10,
            param_increase: 0.0,
            selection: Selection::BestVal,
            test_accuracy: 0.4,
            test_accuracy_last: 0.3,
            test_accuracy_best_val: 0.4,
            best_val_accuracy: 0.5,
            best_val_step: 50,
            test_majority_rate: 0.1,
            split_sizes: [10, 2, 2],
            validation_source: "v".into(),
            validated_on_test: false,
            train_seconds: 1.0,
            warnings: vec![],
            config_changes: vec![],
            weights_sha256: BTreeMap::new(),
            init_from: None,
            commits: vec![],
            sha256: None,
        }
        .sealed()
    }

    /// A sealed result checks out where it was written; an edited figure breaks its checksum;
    /// without a checksum a figure out of range is still refused; a result in another
    /// attention's, seed's, task's or preset's folder is refused, naming what differs.
    #[test]
    fn results_are_checked_against_their_checksum_ranges_and_place() {
        let listops = Task::new("listops").unwrap();
        let good = result();
        good.verify_place(&listops, "tiny", "softmax", 1).unwrap();
        let json = serde_json::to_string_pretty(&good).unwrap();
        let read: RunResult = serde_json::from_str(&json).unwrap();
        read.verify().unwrap();
        let edited = RunResult {
            test_accuracy_best_val: 0.45,
            test_accuracy: 0.45,
            ..good.clone()
        };
        assert!(edited.verify().unwrap_err().contains("checksum"));
        let unsealed = RunResult {
            test_accuracy: 1.5,
            test_accuracy_best_val: 1.5,
            sha256: None,
            ..good.clone()
        };
        assert!(
            unsealed
                .verify()
                .unwrap_err()
                .contains("`test_accuracy` is 1.5")
        );
        for (task, preset, attention, seed, says) in [
            (
                "listops",
                "tiny",
                "linear",
                1,
                "records the attention `softmax`",
            ),
            ("listops", "tiny", "softmax", 0, "records seed 1"),
            ("text", "tiny", "softmax", 1, "records the task `listops`"),
            (
                "listops",
                "small",
                "softmax",
                1,
                "records the preset `tiny`",
            ),
        ] {
            let err = good
                .verify_place(&Task::new(task).unwrap(), preset, attention, seed)
                .unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }
}
