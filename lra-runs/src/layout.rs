//! Where runs live and what their directories hold.
//!
//! ```text
//! <out>/data/                             generated datasets and trained tokenizers, cached
//! <out>/<task>/<preset>/                  a sweep: one folder per attention, summary.{json,md},
//!                                          logs/ (runs' logs), slurm/ (scripts, Slurm's logs)
//! <out>/<task>/<preset>/<attention>/seed-<n>/
//!   config.json        the resolved configuration (and the changes resumes made to it)
//!   metrics.jsonl      one line per validation
//!   tokenizer.json     the BPE tokenizer its tokens come from (BPE runs only)
//!   checkpoint/        model.bpk, optimizer.bpk, best.bpk, config.json, state.json and
//!                      checksums.json, the SHA-256 of each, written last (until finished)
//!   model-best.bpk     best-validation weights
//!   model-last.bpk     last weights (finished runs)
//!   result.json        written last, with the SHA-256 of both weight files: a directory
//!                      holding it is finished
//!   .lock              held by the process training in it
//! ```
//!
//! A run directory holds these names only (and the temporary files of their atomic writes):
//! the harness refuses to train in a folder holding anything else, so that it never writes over
//! a file of the user's, and removes nothing but them.

use std::path::{Path, PathBuf};

use crate::names::Task;

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
/// A checkpoint's copy of the best-validation weights it records (absent before the first
/// validation).
pub const CHECKPOINT_BEST: &str = "best.bpk";
/// A checkpoint's copy of the run's `config.json` record: what a resume checks itself against.
pub const CHECKPOINT_CONFIG: &str = "config.json";
/// A checkpoint's state (step, data position, best validation, the metrics so far).
pub const CHECKPOINT_STATE: &str = "state.json";
/// The SHA-256 of every other file of a checkpoint, written last; a resume checks them all.
pub const CHECKPOINT_CHECKSUMS: &str = "checksums.json";
/// Every file a checkpoint folder may hold.
pub const CHECKPOINT_FILES: [&str; 6] = [
    CHECKPOINT_MODEL,
    CHECKPOINT_OPTIMIZER,
    CHECKPOINT_BEST,
    CHECKPOINT_CONFIG,
    CHECKPOINT_STATE,
    CHECKPOINT_CHECKSUMS,
];
/// The files a run directory may hold.
pub const RUN_FILES: [&str; 7] = [
    CONFIG, TOKENIZER, METRICS, RESULT, MODEL_BEST, MODEL_LAST, LOCK,
];
/// The folders a run directory may hold.
pub const RUN_FOLDERS: [&str; 3] = [CHECKPOINT, CHECKPOINT_NEW, CHECKPOINT_OLD];
/// The lock file (see [`crate::RunDirLock`]).
pub const LOCK: &str = ".lock";
/// The folder under `--out` that caches generated datasets and trained tokenizers
/// (`<out>/data/`).
pub const DATA_CACHE: &str = "data";
/// A sweep's folder of its runs' logs, when runs go to files (`<sweep>/logs/<attention>-seed-<n>.log`).
pub const SWEEP_LOGS: &str = "logs";
/// A sweep's folder of its Slurm scripts and their logs (`<sweep>/slurm/`).
pub const SWEEP_SLURM: &str = "slurm";
/// The folders of a sweep's folder that hold no attention's runs.
pub const SWEEP_FOLDERS: [&str; 3] = [DATA_CACHE, SWEEP_LOGS, SWEEP_SLURM];
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

/// The name runs trained with `--set` settings are filed under: `preset` (a preset's name or a
/// configuration file's stem), then each setting as given, joined by `,`
/// (`tiny,training.schedule.peak=3e-4`): each point of a grid is a sweep of its own. A name
/// longer than [`crate::names::MAX_DIR_NAME`] keeps its start and a hash of the whole.
pub fn point_name(preset: &str, settings: &[&str]) -> String {
    let name = std::iter::once(preset)
        .chain(settings.iter().copied())
        .collect::<Vec<_>>()
        .join(",");
    crate::names::shortened_dir_name(&name, ',')
}

/// A sweep's folder: `<out>/<task>/<preset>`.
pub fn sweep_dir(out: &Path, task: &Task, preset: &str) -> PathBuf {
    out.join(task.name()).join(preset)
}

/// A run's folder within its sweep: `<sweep>/<attention>/seed-<seed>`, a long hybrid pattern's
/// folder shortened with a hash of the whole ([`crate::AttentionName::dir_name`]).
pub fn run_dir(sweep_dir: &Path, attention: &str, seed: u64) -> PathBuf {
    sweep_dir
        .join(crate::names::attention_dir_name(attention))
        .join(format!("seed-{seed}"))
}

/// Whether `name` is one of `names` or the temporary file of an atomic write of one, left behind
/// by a process killed while writing it: the harness's `<name>.tmp...` and `<name>.new...`, and
/// Burn's own `<name>.<pid>-<n>.tmp` (its recorders write the optimiser state that way).
pub fn is_owned_name(name: &str, names: &[&str]) -> bool {
    names.iter().any(|known| {
        name == *known
            || name.strip_prefix(known).is_some_and(|rest| {
                rest.starts_with(".tmp") || rest.starts_with(".new") || is_burn_scratch(rest)
            })
    })
}

/// `.<pid>-<n>.tmp`, the suffix of Burn's scratch files.
fn is_burn_scratch(rest: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    rest.strip_prefix('.')
        .and_then(|rest| rest.strip_suffix(".tmp"))
        .and_then(|ids| ids.split_once('-'))
        .is_some_and(|(pid, n)| digits(pid) && digits(n))
}

/// The checkpoint of `run_dir` a resume continues from: `checkpoint/`, or `checkpoint.old/`
/// where a process was killed between the two renames that replace one checkpoint by the next.
/// Whatever is at that path is returned, a damaged checkpoint included: the resume verifies it
/// and refuses what it cannot verify, rather than starting over unasked.
pub fn find_checkpoint(run_dir: &Path) -> Option<PathBuf> {
    [CHECKPOINT, CHECKPOINT_OLD]
        .iter()
        .map(|name| run_dir.join(name))
        .find(|path| std::fs::symlink_metadata(path).is_ok())
}
