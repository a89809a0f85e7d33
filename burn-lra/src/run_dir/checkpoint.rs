//! A run's checkpoint: written whole and renamed into place, and read back only after every
//! file matched the SHA-256 its `checksums.json` records; the metrics log checked against the
//! length and SHA-256 the checkpoint's state recorded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use lra_runs::layout::{
    CHECKPOINT, CHECKPOINT_BEST, CHECKPOINT_CHECKSUMS, CHECKPOINT_CONFIG, CHECKPOINT_FILES,
    CHECKPOINT_MODEL, CHECKPOINT_NEW, CHECKPOINT_OLD, CHECKPOINT_OPTIMIZER, CHECKPOINT_STATE,
};
use lra_runs::{CheckpointState, RunRecord};

use super::{RESTART_ADVICE, load_weights, remove_checkpoint_dir, save_weights, sha256_hex};
use crate::config::RunConfig;
use crate::data::write_atomic;
use crate::model::LraClassifier;

/// The run's `config.json` record as the harness reads and writes it.
pub type Record = RunRecord<RunConfig>;

/// What a checkpoint holds besides its weights and optimiser state, as its files store it.
pub struct CheckpointContents<'a> {
    /// The model after the checkpoint's step.
    pub model: &'a LraClassifier,
    /// The optimiser state.
    pub optim: &'a burn::optim::ModuleOptimizer,
    /// The best-validation weights so far (none before the first validation).
    pub best: Option<&'a LraClassifier>,
    /// The run's `config.json` record.
    pub record: &'a Record,
}

/// Writes the checkpoint atomically: a complete `checkpoint.new/` (the model, the optimiser,
/// the best weights, the record, `state` and, last, the SHA-256 of each in `checksums.json`),
/// then renames; a reader sees the old checkpoint or the new one, never a mix.
pub fn write_checkpoint(
    run_dir: &Path,
    contents: &CheckpointContents,
    state: &CheckpointState,
) -> Result<()> {
    let new = run_dir.join(CHECKPOINT_NEW);
    let old = run_dir.join(CHECKPOINT_OLD);
    let current = run_dir.join(CHECKPOINT);
    // A `checkpoint.new` is one this process's predecessor was writing when it was killed.
    remove_checkpoint_dir(&new)?;
    std::fs::create_dir_all(&new).with_context(|| format!("cannot create {}", new.display()))?;
    save_weights(contents.model, &new.join(CHECKPOINT_MODEL))?;
    contents
        .optim
        .save(new.join(CHECKPOINT_OPTIMIZER))
        .map_err(|e| {
            anyhow::anyhow!("cannot save the optimiser state in {}: {e}", new.display())
        })?;
    if let Some(best) = contents.best {
        save_weights(best, &new.join(CHECKPOINT_BEST))?;
    }
    write_atomic(
        &new.join(CHECKPOINT_CONFIG),
        contents.record.to_json()?.as_bytes(),
    )?;
    write_atomic(
        &new.join(CHECKPOINT_STATE),
        serde_json::to_string_pretty(state)?.as_bytes(),
    )?;
    crate::checksum::write_list(&new, CHECKPOINT_CHECKSUMS)?;
    if current.exists() {
        remove_checkpoint_dir(&old)?;
        std::fs::rename(&current, &old)
            .with_context(|| format!("cannot move {}", current.display()))?;
    }
    std::fs::rename(&new, &current).with_context(|| format!("cannot move {}", new.display()))?;
    remove_checkpoint_dir(&old)
}

/// A checkpoint whose every file matched its recorded SHA-256.
#[derive(Debug, Clone)]
pub struct VerifiedCheckpoint {
    /// Its folder.
    pub dir: PathBuf,
    /// Its `state.json`.
    pub state: CheckpointState,
    /// Its copy of the run's `config.json` record.
    pub record: Record,
    /// Whether it holds best-validation weights.
    pub has_best: bool,
    /// The SHA-256 of each of its files, by name, as its `checksums.json` records them.
    pub sums: BTreeMap<String, String>,
}

impl VerifiedCheckpoint {
    /// The path of one of its files.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Loads its weights file `name` into `model`, checked again as it is read.
    pub fn load_weights(&self, model: LraClassifier, name: &str) -> Result<LraClassifier> {
        let sum = self.sums.get(name).with_context(|| {
            format!(
                "{}: no checksum for {name}",
                self.file(CHECKPOINT_CHECKSUMS).display()
            )
        })?;
        load_weights(model, &self.file(name), sum)
    }
}

/// Checks every file of the checkpoint `dir` against its `checksums.json` (which must list the
/// weights, the optimiser state, the record and the state, and every other file the folder
/// holds) and reads its state and record. A missing, unlisted or mismatched file is an error
/// naming it; nothing is guessed.
pub fn verify_checkpoint(dir: &Path) -> Result<VerifiedCheckpoint> {
    if !dir.is_dir() {
        bail!(
            "{} is not a folder; the checkpoint cannot be read ({RESTART_ADVICE})",
            dir.display()
        );
    }
    let wording = crate::checksum::Wording {
        files: "the checkpoint's files",
        changed: "corrupted",
        advice: RESTART_ADVICE,
    };
    let sums = crate::checksum::verify_list(dir, CHECKPOINT_CHECKSUMS, &wording)?;
    // Beyond matching: the files every checkpoint has, and none a checkpoint never holds.
    let sums_path = dir.join(CHECKPOINT_CHECKSUMS);
    for required in [
        CHECKPOINT_MODEL,
        CHECKPOINT_OPTIMIZER,
        CHECKPOINT_CONFIG,
        CHECKPOINT_STATE,
    ] {
        if !sums.contains_key(required) {
            bail!(
                "{}: no checksum for {required} ({RESTART_ADVICE})",
                sums_path.display()
            );
        }
    }
    if let Some(name) = sums
        .keys()
        .find(|n| !CHECKPOINT_FILES.contains(&n.as_str()))
    {
        bail!(
            "{}: lists {name}, which no checkpoint holds ({RESTART_ADVICE})",
            sums_path.display()
        );
    }
    let state_path = dir.join(CHECKPOINT_STATE);
    let state = std::fs::read_to_string(&state_path)
        .with_context(|| format!("cannot read {}", state_path.display()))?;
    let state: CheckpointState = serde_json::from_str(&state).map_err(|e| {
        anyhow::anyhow!(
            "{}: not a checkpoint state ({e}); {RESTART_ADVICE}",
            state_path.display()
        )
    })?;
    let record = Record::read(&dir.join(CHECKPOINT_CONFIG))
        .map_err(|e| anyhow::anyhow!("{e:#}; {RESTART_ADVICE}"))?;
    Ok(VerifiedCheckpoint {
        dir: dir.to_path_buf(),
        state,
        record,
        has_best: sums.contains_key(CHECKPOINT_BEST),
        sums,
    })
}

/// The length and SHA-256 of `metrics.jsonl` as a checkpoint records them.
pub fn metrics_fingerprint(path: &Path) -> Result<(u64, String)> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok((bytes.len() as u64, sha256_hex(&bytes)))
}

/// Checks `metrics.jsonl` against what the checkpoint recorded (its first `len` bytes, whose
/// SHA-256 is `sha256`; a shorter or changed file is an error naming it) and returns what a
/// resume writes back: those bytes where the file holds more (the lines of steps after the
/// checkpoint, which the resumed run writes again), `None` where it holds exactly them.
pub fn verify_metrics(path: &Path, len: u64, sha256: &str) -> Result<Option<Vec<u8>>> {
    let mut bytes =
        std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let recorded = usize::try_from(len).ok().filter(|&len| {
        bytes
            .get(..len)
            .is_some_and(|kept| sha256_hex(kept) == sha256)
    });
    let Some(len) = recorded else {
        bail!(
            "{}: its first {len} bytes differ from those the checkpoint recorded (the metrics of \
             the steps it holds); {RESTART_ADVICE}",
            path.display()
        );
    };
    if len == bytes.len() {
        return Ok(None);
    }
    bytes.truncate(len);
    Ok(Some(bytes))
}
