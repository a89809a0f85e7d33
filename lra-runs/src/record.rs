//! `config.json`: the record of what a run is, written by `burn-lra train` when the run starts
//! (and again by each resume that changes its configuration); every checkpoint keeps a copy,
//! which a resume checks itself against.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::names::{AttentionName, BackendKind};
use crate::result::{ConfigChange, InitFrom};

/// The contents of a run's `config.json`.
///
/// `Run` is the harness's resolved configuration (`burn-lra`'s `RunConfig`); readers that do not
/// need it typed (the sweep tool) leave it as JSON. The fields are declared in alphabetical
/// order, the order the file has always had.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord<Run = Value> {
    /// The attention's name as the command line gave it.
    pub attention_name: AttentionName,
    /// The attention's full configuration after the presets and the configuration's
    /// `[attention.<name>]` table were applied, as burn-attention writes it; for a hybrid
    /// stack (`gla+local`), a list of each layer's, in order.
    pub attention_resolved: Value,
    /// The backend that trains the run.
    pub backend: BackendKind,
    /// Resumes that changed the configuration, in order.
    #[serde(default)]
    pub config_changes: Vec<ConfigChange>,
    /// The SHA-256 of every example of every split: the data the run trains and is measured on.
    pub data_sha256: String,
    /// The self-pretraining run whose embedding and encoder the run started from (`train
    /// --init-from`); absent for a run from scratch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<InitFrom>,
    /// Trainable parameters of the model.
    pub n_params: usize,
    /// Trainable parameters of the softmax model of the same configuration.
    pub n_params_softmax: usize,
    /// Relative parameter increase over that softmax model.
    pub param_increase: f64,
    /// The preset's name, or the configuration file's stem.
    pub preset: String,
    /// The resolved configuration the run trains with (after the latest resume's changes).
    pub run: Run,
    /// The training seed.
    pub seed: u64,
    /// Examples in the train, validation and test splits.
    pub split_sizes: [usize; 3],
    /// Where the run's BPE tokenizer was read from (`None`: the task's own tokens). A location,
    /// not part of what the run is: `compare` leaves it out.
    pub tokenizer: Option<std::path::PathBuf>,
    /// The SHA-256 of the tokenizer's JSON.
    pub tokenizer_sha256: Option<String>,
}

impl<Run> RunRecord<Run> {
    /// What a run is, by field name: its attention, seed and backend, and what it reads (its
    /// data and tokenizer, by fingerprint). A resume must find every one unchanged.
    pub fn identity(&self) -> [(&'static str, Value); 6] {
        [
            ("attention_name", Value::from(self.attention_name.name())),
            ("seed", Value::from(self.seed)),
            ("backend", Value::from(self.backend.name())),
            ("data_sha256", Value::from(self.data_sha256.as_str())),
            (
                "init_from",
                (self.init_from.as_ref())
                    .map_or(Value::Null, |i| Value::from(i.weights_sha256.as_str())),
            ),
            (
                "tokenizer_sha256",
                self.tokenizer_sha256
                    .as_deref()
                    .map_or(Value::Null, Value::from),
            ),
        ]
    }

    /// The first field of [`identity`](Self::identity) in which `other` differs from this
    /// record: its name, this record's value and `other`'s.
    pub fn identity_change(&self, other: &Self) -> Option<(&'static str, Value, Value)> {
        self.identity()
            .into_iter()
            .zip(other.identity())
            .find(|((_, a), (_, b))| a != b)
            .map(|((name, a), (_, b))| (name, a, b))
    }
}

impl<Run: Serialize> RunRecord<Run> {
    /// The record as `config.json` holds it: pretty JSON, keys (the configuration's too) in
    /// alphabetical order.
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(&serde_json::to_value(self)?)
    }
}

impl<Run: serde::de::DeserializeOwned> RunRecord<Run> {
    /// Reads a `config.json` record; errors name the file and what is wrong with it.
    pub fn read(path: &std::path::Path) -> anyhow::Result<Self> {
        crate::files::read_json(path, "a run's configuration record")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> RunRecord {
        RunRecord {
            attention_name: AttentionName::new("softmax").unwrap(),
            attention_resolved: serde_json::json!({"Softmax": {"d_model": 64}}),
            backend: BackendKind::Flex,
            config_changes: Vec::new(),
            data_sha256: "ab".into(),
            init_from: None,
            n_params: 10,
            n_params_softmax: 10,
            param_increase: 0.0,
            preset: "tiny".into(),
            run: serde_json::json!({"task": "listops", "model": {"d_model": 64}}),
            seed: 3,
            split_sizes: [4, 2, 2],
            tokenizer: None,
            tokenizer_sha256: None,
        }
    }

    /// The file's keys are in alphabetical order, nested ones too, as `json!` wrote them.
    #[test]
    fn the_file_keeps_its_alphabetical_key_order() {
        let json = record().to_json().unwrap();
        let keys: Vec<&str> = json
            .lines()
            .filter(|line| line.starts_with("  \""))
            .map(|line| line.trim().split('"').nth(1).unwrap())
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        assert_eq!(keys.len(), 14);
        assert!(json.find("\"model\"").unwrap() < json.find("\"task\"").unwrap());
        let back: RunRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back, record());
    }

    /// A change of seed, backend, attention or data is a change of identity; a change of the
    /// configuration is not.
    #[test]
    fn identity_changes_name_the_first_field() {
        let a = record();
        let mut b = record();
        b.run = serde_json::json!({"task": "listops", "model": {"d_model": 128}});
        assert_eq!(a.identity_change(&b), None);
        b.seed = 4;
        b.tokenizer_sha256 = Some("cd".into());
        let (field, was, now) = a.identity_change(&b).unwrap();
        assert_eq!((field, was, now), ("seed", Value::from(3), Value::from(4)));
        b.seed = 3;
        let (field, was, _) = a.identity_change(&b).unwrap();
        assert_eq!((field, was), ("tokenizer_sha256", Value::Null));
    }

    #[test]
    fn a_foreign_file_is_not_a_record() {
        let dir = std::env::temp_dir().join(format!("lra-runs-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
        std::fs::write(&path, b"{\"mine\": 1}").unwrap();
        let err = RunRecord::<Value>::read(&path).unwrap_err();
        assert!(
            format!("{err:#}").contains("config.json: not a run's configuration record"),
            "{err:#}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
