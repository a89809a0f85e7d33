//! `state.json`: what a checkpoint holds besides the weights, the optimiser state and the run's
//! record; written by `burn-lra train` at each checkpoint, checked and read back by a resume.

use serde::{Deserialize, Serialize};

/// A checkpoint's state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointState {
    /// Steps done.
    pub step: usize,
    /// Best validation accuracy so far and its step (its weights are the checkpoint's
    /// `best.bpk`).
    pub best: Option<(f64, usize)>,
    /// Running sum since the last validation: loss · examples.
    pub loss_sum: f64,
    /// Running sum since the last validation: correct predictions.
    pub correct: i64,
    /// Running sum since the last validation: examples.
    pub seen: usize,
    /// Training time before the process that resumes.
    pub elapsed_s: f64,
    /// Micro-batches drawn so far (the data order's position).
    pub micro_batches: usize,
    /// Length of `metrics.jsonl` when the checkpoint was written (a resume cuts it back to this).
    pub metrics_bytes: u64,
    /// SHA-256 of those bytes, checked before a resume keeps them.
    pub metrics_sha256: String,
    /// The commits of the builds that trained the steps so far
    /// ([`RunResult::commits`](crate::RunResult::commits)).
    #[serde(default)]
    pub commits: Vec<String>,
}

impl CheckpointState {
    /// Records that the build of `commit` trains the steps from here on (once, where it takes
    /// over from another build). Steps trained before builds were recorded (a checkpoint of an
    /// older harness) are listed as `unrecorded`.
    pub fn trained_by(&mut self, commit: &str) {
        if self.commits.is_empty() && self.step > 0 {
            self.commits.push("unrecorded".to_string());
        }
        if self.commits.last().is_none_or(|last| last != commit) {
            self.commits.push(commit.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build appends its commit where it takes over from another build, once.
    #[test]
    fn each_build_that_trains_is_recorded_once() {
        let mut state = CheckpointState::default();
        state.trained_by("abc");
        state.trained_by("abc");
        assert_eq!(state.commits, ["abc"]);
        state.commits = vec!["0123abc".into()];
        state.trained_by("abc");
        state.trained_by("abc");
        assert_eq!(state.commits, ["0123abc", "abc"]);
        // A checkpoint written before builds were recorded.
        let mut old: CheckpointState = serde_json::from_str(
            r#"{"step": 600, "best": null, "loss_sum": 0.0, "correct": 0, "seen": 0,
                "elapsed_s": 1.0, "micro_batches": 600, "metrics_bytes": 0,
                "metrics_sha256": ""}"#,
        )
        .unwrap();
        old.trained_by("abc");
        assert_eq!(old.commits, ["unrecorded", "abc"]);
    }
}
