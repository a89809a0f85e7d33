//! A run directory's files: the weights, the checkpoint with its checksums, the metrics log, the
//! configuration changes a resume may make, the lock that keeps one process per directory, and
//! the comparison of two run directories.
//!
//! The layout and the file names are [`lra_runs::layout`]'s, shared with the sweep tool. Every
//! file a resume or a result reads is checked against a SHA-256 recorded when it was written:
//! a checkpoint's files against its `checksums.json`, the metrics against the checkpoint's
//! state, the finished weights against `result.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use serde::Serialize;
use serde_json::Value;

pub use lra_runs::layout::{CHECKPOINT, find_checkpoint};
use lra_runs::layout::{
    CHECKPOINT_BEST, CHECKPOINT_CHECKSUMS, CHECKPOINT_CONFIG, CHECKPOINT_FILES, CHECKPOINT_MODEL,
    CHECKPOINT_NEW, CHECKPOINT_OLD, CHECKPOINT_OPTIMIZER, CHECKPOINT_STATE, CONFIG, METRICS,
    MODEL_BEST, MODEL_LAST, RESULT, RUN_FILES, RUN_FOLDERS, is_owned_name,
};
pub mod open;

pub use lra_runs::{ConfigChange, RunDirLock};

pub use crate::checksum::{sha256_file, sha256_hex};
use crate::config::RunConfig;
use crate::data::write_atomic;
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

/// What a checkpoint holds besides its weights and optimiser state, as its files store it.
pub struct CheckpointContents<'a> {
    /// The model after the checkpoint's step.
    pub model: &'a LraClassifier,
    /// The optimiser state.
    pub optim: &'a burn::optim::ModuleOptimizer,
    /// The best-validation weights so far (none before the first validation).
    pub best: Option<&'a LraClassifier>,
    /// The run's `config.json` record.
    pub record: &'a Value,
}

/// Writes the checkpoint atomically: a complete `checkpoint.new/` (the model, the optimiser,
/// the best weights, the record, `state` and, last, the SHA-256 of each in `checksums.json`),
/// then renames; a reader sees the old checkpoint or the new one, never a mix.
pub fn write_checkpoint(
    run_dir: &Path,
    contents: &CheckpointContents,
    state: &impl Serialize,
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
        serde_json::to_string_pretty(contents.record)?.as_bytes(),
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
    /// Its `state.json`, parsed as JSON.
    pub state: Value,
    /// Its copy of the run's `config.json` record.
    pub record: Value,
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
    Ok(VerifiedCheckpoint {
        dir: dir.to_path_buf(),
        state: read_json(&dir.join(CHECKPOINT_STATE))?,
        record: read_json(&dir.join(CHECKPOINT_CONFIG))?,
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

/// The configuration fields a resume may change (a field matches when it is one of these or
/// lies inside one): the learning-rate schedule, clipping, accumulation, the validation and
/// checkpoint cadence, the number of steps and which weights are reported. The rest (model
/// shape, data, optimiser, seed) define what the checkpoint holds and must stay.
pub const RESUMABLE_FIELDS: [&str; 7] = [
    "training.schedule",
    "training.grad_clip",
    "training.grad_accumulation",
    "training.eval_every",
    "training.checkpoint_every",
    "training.steps",
    "training.selection",
];

/// The fields in which `now` differs from `saved`, as `field -> [was, now]`; an error names the
/// fields a resume may not change ([`RESUMABLE_FIELDS`]).
pub fn config_changes(saved: &RunConfig, now: &RunConfig) -> Result<BTreeMap<String, [Value; 2]>> {
    let mut changes = BTreeMap::new();
    diff_values(
        "",
        &serde_json::to_value(saved)?,
        &serde_json::to_value(now)?,
        &mut changes,
    );
    let refused: Vec<&str> = changes
        .keys()
        .map(String::as_str)
        .filter(|field| {
            !RESUMABLE_FIELDS
                .iter()
                .any(|safe| *field == *safe || field.starts_with(&format!("{safe}.")))
        })
        .collect();
    if !refused.is_empty() {
        bail!(
            "{} {} from the checkpoint's run (a resume may change only {})",
            refused
                .iter()
                .map(|f| format!("`{f}`"))
                .collect::<Vec<_>>()
                .join(", "),
            if refused.len() == 1 {
                "differs"
            } else {
                "differ"
            },
            RESUMABLE_FIELDS.join(", ")
        );
    }
    Ok(changes)
}

/// Collects the leaves where `a` and `b` differ (numbers compared as f64: a JSON round trip may
/// print a float differently).
fn diff_values(path: &str, a: &Value, b: &Value, out: &mut BTreeMap<String, [Value; 2]>) {
    let join = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for key in keys {
                let missing = Value::Null;
                diff_values(
                    &join(key),
                    x.get(key).unwrap_or(&missing),
                    y.get(key).unwrap_or(&missing),
                    out,
                );
            }
        }
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => {}
        _ if a == b => {}
        _ => {
            out.insert(path.to_string(), [a.clone(), b.clone()]);
        }
    }
}

/// Fields that name where a run's files were, not what the run was: two identical runs whose
/// data or `--out` were spelt differently differ only there, and [`compare_run_dirs`] leaves
/// them out (the data themselves are compared by their fingerprint, `data_sha256`, and the
/// tokenizer by `tokenizer_sha256`).
const LOCATION_FIELDS: [&str; 3] = ["tokenizer", "validation_source", "data_dir"];

/// What differs between two run directories: their configuration, metrics (times aside),
/// results (times and file locations aside) and, where both are finished, the values of their
/// weights (`model-best.bpk`, `model-last.bpk`, each checked against its run's `result.json` and loaded
/// into the model its run's own configuration builds; the files themselves differ, since they
/// embed random parameter ids). Empty when the runs are the same; two paths naming one
/// directory are the same run.
pub fn compare_run_dirs(a: &Path, b: &Path) -> Result<Vec<String>> {
    for dir in [a, b] {
        if !dir.join(CONFIG).is_file() {
            bail!("{}: not a run directory (no {CONFIG} there)", dir.display());
        }
    }
    let canonical = |dir: &Path| {
        std::fs::canonicalize(dir).with_context(|| format!("cannot read {}", dir.display()))
    };
    if canonical(a)? == canonical(b)? {
        return Ok(Vec::new());
    }
    let without_locations = |mut value: Value| {
        if let Some(object) = value.as_object_mut() {
            for field in LOCATION_FIELDS {
                object.remove(field);
            }
        }
        value
    };
    let mut differences = Vec::new();
    let (config_a, config_b) = (read_json(&a.join(CONFIG))?, read_json(&b.join(CONFIG))?);
    if without_locations(config_a.clone()) != without_locations(config_b.clone()) {
        differences.push(CONFIG.to_string());
    }
    let metrics = |dir: &Path| -> Result<Vec<Value>> {
        let path = dir.join(METRICS);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        text.lines()
            .enumerate()
            .map(|(i, line)| {
                let mut value: Value = serde_json::from_str(line)
                    .with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))?;
                value.as_object_mut().map(|o| o.remove("elapsed_s"));
                Ok(value)
            })
            .collect()
    };
    if metrics(a)? != metrics(b)? {
        differences.push(METRICS.to_string());
    }
    let result = |dir: &Path| -> Result<Option<lra_runs::RunResult>> {
        match lra_runs::run_state(dir)? {
            lra_runs::RunState::Finished(result) => Ok(Some(*result)),
            _ => Ok(None),
        }
    };
    let (result_a, result_b) = (result(a)?, result(b)?);
    let comparable = |result: &Option<lra_runs::RunResult>| -> Result<Option<Value>> {
        let Some(result) = result else {
            return Ok(None);
        };
        let mut value = without_locations(serde_json::to_value(result)?);
        if let Some(object) = value.as_object_mut() {
            object.remove("train_seconds");
            // The same run built from another commit is the same run.
            object.remove("commits");
            // The files embed random parameter ids: their values are compared below.
            object.remove("weights_sha256");
        }
        Ok(Some(value))
    };
    if comparable(&result_a)? != comparable(&result_b)? {
        differences.push(RESULT.to_string());
    }
    // Weights are compared where both runs are finished: only a result vouches for its weights
    // (an unfinished run's are work in progress, and its result already differs).
    let (Some(result_a), Some(result_b)) = (&result_a, &result_b) else {
        return Ok(differences);
    };
    // Every weight file checked before any is loaded.
    let mut sums = BTreeMap::new();
    for (dir, result) in [(a, result_a), (b, result_b)] {
        for file in [MODEL_BEST, MODEL_LAST] {
            sums.insert((dir, file), verify_weights(dir, result, file)?);
        }
    }
    for file in [MODEL_BEST, MODEL_LAST] {
        let values = |dir: &Path, config: &Value| match sums[&(dir, file)] {
            Some(sum) => weight_values(dir, config, file, sum).map(Some),
            None => Ok(None),
        };
        match (values(a, &config_a)?, values(b, &config_b)?) {
            (None, None) => {}
            (Some(x), Some(y)) if x == y => {}
            (Some(_), Some(_)) => differences.push(file.to_string()),
            _ => differences.push(format!("{file} (in one directory only)")),
        }
    }
    Ok(differences)
}

/// Reads a JSON file; errors name it.
pub fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}

/// Checks the weight file `file` of the finished run in `dir` against the SHA-256 its `result`
/// recorded and returns that sum; `None` where the run left no such file.
fn verify_weights<'r>(
    dir: &Path,
    result: &'r lra_runs::RunResult,
    file: &str,
) -> Result<Option<&'r String>> {
    let path = dir.join(file);
    if !path.exists() {
        return Ok(None);
    }
    let sha256 = result.weights_sha256.get(file).with_context(|| {
        format!(
            "{}: no SHA-256 recorded for {file} (written before weights were checksummed); \
             its weights cannot be verified",
            dir.join(RESULT).display()
        )
    })?;
    verify_file(&path, sha256, "recorded in result.json")?;
    Ok(Some(sha256))
}

/// Every float parameter of the weight file `file` of the finished run in `dir`, in module order,
/// as bits (so that NaN equals NaN), loaded into the model its own configuration record
/// (`config`) builds, the file checked against `sha256` as it is loaded.
fn weight_values(dir: &Path, config: &Value, file: &str, sha256: &str) -> Result<Vec<Vec<u32>>> {
    struct Collect(Vec<Vec<u32>>);
    impl ModuleVisitor for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let values = param.val().into_data().convert::<f32>();
            self.0.push(
                values
                    .as_slice::<f32>()
                    .unwrap_or_default()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect(),
            );
        }
    }
    let path = dir.join(file);
    let config_path = dir.join(CONFIG);
    let run: RunConfig = serde_json::from_value(config["run"].clone())
        .with_context(|| format!("{}: `run` is not a configuration", config_path.display()))?;
    let attention = config["attention_name"]
        .as_str()
        .with_context(|| format!("{}: no `attention_name`", config_path.display()))?;
    let device = crate::backend::any_device()?;
    // The run's own vocabulary (a BPE run's is the tokenizer's, not the task's) and classes.
    let task = crate::tasks::find(run.task.name())?;
    let model = LraClassifier::new(
        &crate::model::ClassifierSpec::resolve(&run, task, attention)?,
        &device,
    );
    let model = load_weights(model, &path, sha256)?;
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    Ok(collect.0)
}
