//! A run directory's files: what may be in it, the weights, and what removes the harness's own
//! files; [`checkpoint`] writes and verifies checkpoints, [`open`] opens a directory for
//! training (the lock, a resume's checks, the configuration changes a resume may make) and
//! [`compare`] compares two run directories.
//!
//! The layout and the file names are [`lra_runs::layout`]'s, shared with the sweep tool. Every
//! file a resume or a result reads is checked against a SHA-256 recorded when it was written:
//! a checkpoint's files against its `checksums.json`, the metrics against the checkpoint's
//! state, the finished weights against `result.json`.

use std::path::Path;

use anyhow::{Context, Result, bail};
use burn::module::Module;

pub use lra_runs::layout::{CHECKPOINT, find_checkpoint};
use lra_runs::layout::{
    CHECKPOINT_FILES, CHECKPOINT_NEW, CHECKPOINT_OLD, METRICS, MODEL_BEST, MODEL_LAST, RUN_FILES,
    RUN_FOLDERS, is_owned_name,
};

pub mod checkpoint;
pub mod compare;
pub mod open;

pub use checkpoint::{
    CheckpointContents, Record, VerifiedCheckpoint, metrics_fingerprint, verify_checkpoint,
    verify_metrics, write_checkpoint,
};
pub use compare::compare_run_dirs;
pub(crate) use compare::{finished_result, recorded_weights_sha256};
pub use lra_runs::{ConfigChange, RunDirLock};
pub use open::{RESUMABLE_FIELDS, config_changes};

pub use crate::checksum::{sha256_file, sha256_hex};
use crate::model::LraClassifier;

/// What a resume or a restart says to do about a checkpoint it cannot use.
pub const RESTART_ADVICE: &str = "--restart starts the run over";

/// Saves `model`'s weights to `path` atomically.
pub fn save_weights(model: &LraClassifier, path: &Path) -> Result<()> {
    let tmp = path.with_extension("bpk.tmp");
    model
        .clone()
        .save_file(&tmp)
        .map_err(|e| anyhow::anyhow!("cannot save weights to {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// Loads weights saved by [`save_weights`] into `model`, after checking that the file's SHA-256
/// is `sha256` (recorded when it was written); a mismatch is an error naming the file.
pub fn load_weights(model: LraClassifier, path: &Path, sha256: &str) -> Result<LraClassifier> {
    verify_file(path, sha256, "recorded when it was written")?;
    model
        .try_load_file(path)
        .map_err(|e| anyhow::anyhow!("cannot load weights from {}: {e}", path.display()))
}

/// Checks that `path` exists and its SHA-256 is `expected`; the error names the file and where
/// the expected sum was `recorded`.
fn verify_file(path: &Path, expected: &str, recorded: &str) -> Result<()> {
    if !path.is_file() {
        bail!("{} is missing (its SHA-256 was {recorded})", path.display());
    }
    if sha256_file(path)? != expected {
        bail!(
            "{}: corrupted (its SHA-256 differs from the one {recorded})",
            path.display()
        );
    }
    Ok(())
}

/// Refuses a run directory holding anything the harness does not write there (a file or folder
/// of the user's, which training would write beside or over), or one of its own names as the
/// wrong kind (a file where the checkpoint folder belongs, say): the error names the path. A
/// missing directory is fine: it is created for the run.
pub fn check_run_dir(run_dir: &Path) -> Result<()> {
    let entries = match std::fs::read_dir(run_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(_) if run_dir.exists() && !run_dir.is_dir() => bail!(
            "{} is a file, not a run directory; it is left as it is (choose another --run-dir)",
            run_dir.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", run_dir.display())),
    };
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot read {}", run_dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let kind = entry
            .file_type()
            .with_context(|| format!("cannot read {}", path.display()))?;
        if RUN_FOLDERS.contains(&name.as_str()) {
            if !kind.is_dir() {
                bail!(
                    "{} is not a folder, but a checkpoint folder belongs at that path; it is left \
                     as it is (remove it, then --resume or --restart)",
                    path.display()
                );
            }
        } else if is_owned_name(&name, &RUN_FILES) {
            if !kind.is_file() {
                bail!(
                    "{} is not a file, but the run writes a file at that path; it is left as it \
                     is (remove it, or choose another --run-dir)",
                    path.display()
                );
            }
        } else {
            bail!(
                "{} holds {name}, which no run writes: a run directory holds only the harness's \
                 files, so that training never writes beside or over the user's (choose another \
                 --run-dir, or move {name} away)",
                run_dir.display()
            );
        }
    }
    Ok(())
}

/// Removes a checkpoint folder of the harness's (`checkpoint`, `checkpoint.new`,
/// `checkpoint.old`): its own files only; anything else inside is an error naming it.
pub fn remove_checkpoint_dir(dir: &Path) -> Result<()> {
    lra_runs::remove_owned_dir(dir, |name| is_owned_name(name, &CHECKPOINT_FILES))
}

/// Removes what an unfinished run left (its checkpoints, weights, metrics, configuration and
/// tokenizer copy), for `--restart`: only the harness's own files ([`check_run_dir`] has
/// refused any other).
pub fn clear_unfinished_run(run_dir: &Path) -> Result<()> {
    for folder in [CHECKPOINT, CHECKPOINT_NEW, CHECKPOINT_OLD] {
        remove_checkpoint_dir(&run_dir.join(folder))?;
    }
    for file in [MODEL_BEST, MODEL_LAST, METRICS, lra_runs::layout::TOKENIZER] {
        let path = run_dir.join(file);
        if path.is_file() {
            std::fs::remove_file(&path)
                .with_context(|| format!("cannot remove {}", path.display()))?;
        }
    }
    Ok(())
}
