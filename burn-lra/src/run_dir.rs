//! A run directory's files: the weights, the checkpoint with its checksums, the metrics log, the
//! configuration changes a resume may make, the lock that keeps one process per directory, and
//! the comparison of two run directories.
//!
//! The layout and the file names are [`lra_runs::layout`]'s, shared with the sweep tool.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use serde::Serialize;
use serde_json::Value;

pub use lra_runs::layout::{CHECKPOINT, find_checkpoint};
use lra_runs::layout::{
    CHECKPOINT_CHECKSUMS, CHECKPOINT_MODEL, CHECKPOINT_NEW, CHECKPOINT_OLD, CHECKPOINT_OPTIMIZER,
    CHECKPOINT_STATE, CONFIG, METRICS, MODEL_BEST, MODEL_LAST, RESULT,
};
pub use lra_runs::{ConfigChange, RunDirLock};

use crate::config::{RunConfig, TaskShape};
use crate::data::write_atomic;
use crate::model::LraClassifier;

/// The files of a checkpoint whose SHA-256 it records (in `checksums.json`) and a resume checks.
const CHECKSUMMED: [&str; 2] = [CHECKPOINT_MODEL, CHECKPOINT_OPTIMIZER];

/// Saves `model`'s weights to `path` atomically.
pub fn save_weights(model: &LraClassifier, path: &Path) -> Result<()> {
    let tmp = path.with_extension("bpk.tmp");
    model
        .clone()
        .save_file(&tmp)
        .map_err(|e| anyhow::anyhow!("cannot save weights to {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// Loads weights saved by [`save_weights`] into `model`.
pub fn load_weights(model: LraClassifier, path: &Path) -> Result<LraClassifier> {
    model
        .try_load_file(path)
        .map_err(|e| anyhow::anyhow!("cannot load weights from {}: {e}", path.display()))
}

/// The SHA-256 of `path`'s bytes, in hex.
fn sha256_file(path: &Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Records the checksums of a checkpoint's files in `dir/checksums.json`.
fn write_checksums(dir: &Path) -> Result<()> {
    let mut sums = serde_json::Map::new();
    for name in CHECKSUMMED {
        sums.insert(name.into(), sha256_file(&dir.join(name))?.into());
    }
    write_atomic(
        &dir.join(CHECKPOINT_CHECKSUMS),
        serde_json::to_string_pretty(&sums)?.as_bytes(),
    )
}

/// Checks a checkpoint's files against its `checksums.json`; a mismatch is an error naming the
/// file. A checkpoint written before checksums were kept is accepted with a warning.
pub fn verify_checksums(dir: &Path) -> Result<()> {
    let path = dir.join(CHECKPOINT_CHECKSUMS);
    if !path.exists() {
        eprintln!(
            "warning: {} has no checksums.json (written before checksums were kept); its files \
             are not verified",
            dir.display()
        );
        return Ok(());
    }
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let sums: serde_json::Map<String, Value> = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a checksum list", path.display()))?;
    for name in CHECKSUMMED {
        let file = dir.join(name);
        let expected = sums
            .get(name)
            .and_then(|v| v.as_str())
            .with_context(|| format!("{}: no checksum for {name}", path.display()))?;
        if sha256_file(&file)? != expected {
            bail!(
                "{}: corrupted (its SHA-256 differs from the one recorded when the checkpoint was \
                 written); the checkpoint cannot be resumed",
                file.display()
            );
        }
    }
    Ok(())
}

/// Writes the checkpoint atomically: a complete `checkpoint.new/`, then renames; a reader sees
/// the old checkpoint or the new one, never a mix.
pub fn write_checkpoint(
    run_dir: &Path,
    model: &LraClassifier,
    optim: &burn::optim::ModuleOptimizer,
    state: &impl Serialize,
) -> Result<()> {
    let new = run_dir.join(CHECKPOINT_NEW);
    let old = run_dir.join(CHECKPOINT_OLD);
    let current = run_dir.join(CHECKPOINT);
    if new.exists() {
        std::fs::remove_dir_all(&new)
            .with_context(|| format!("cannot remove {}", new.display()))?;
    }
    std::fs::create_dir_all(&new).with_context(|| format!("cannot create {}", new.display()))?;
    save_weights(model, &new.join(CHECKPOINT_MODEL))?;
    optim.save(new.join(CHECKPOINT_OPTIMIZER)).map_err(|e| {
        anyhow::anyhow!("cannot save the optimiser state in {}: {e}", new.display())
    })?;
    write_checksums(&new)?;
    write_atomic(
        &new.join(CHECKPOINT_STATE),
        serde_json::to_string_pretty(state)?.as_bytes(),
    )?;
    if current.exists() {
        if old.exists() {
            std::fs::remove_dir_all(&old)
                .with_context(|| format!("cannot remove {}", old.display()))?;
        }
        std::fs::rename(&current, &old)
            .with_context(|| format!("cannot move {}", current.display()))?;
    }
    std::fs::rename(&new, &current).with_context(|| format!("cannot move {}", new.display()))?;
    if old.exists() {
        std::fs::remove_dir_all(&old)
            .with_context(|| format!("cannot remove {}", old.display()))?;
    }
    Ok(())
}

/// Reads a checkpoint's `state.json`.
pub fn read_state<T: serde::de::DeserializeOwned>(checkpoint: &Path) -> Result<T> {
    let path = checkpoint.join(CHECKPOINT_STATE);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{}: not a checkpoint state", path.display()))
}

/// Keeps the lines of `metrics.jsonl` up to `step` (a resumed run rewrites the later ones).
pub fn truncate_metrics(path: &Path, step: usize) -> Result<()> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let kept: String = text
        .lines()
        .filter(|line| {
            serde_json::from_str::<Value>(line)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| s as usize <= step)
        })
        .map(|line| format!("{line}\n"))
        .collect();
    write_atomic(path, kept.as_bytes())
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

/// What differs between two run directories: their configuration, metrics (times aside),
/// results (times aside) and the values of their weights (`model-best.bpk`, `model-last.bpk`;
/// the files themselves differ, since they embed random parameter ids). Empty when the runs
/// are the same.
pub fn compare_run_dirs(a: &Path, b: &Path) -> Result<Vec<String>> {
    let mut differences = Vec::new();
    let config_a = read_json(&a.join(CONFIG))?;
    if config_a != read_json(&b.join(CONFIG))? {
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
    let result = |dir: &Path| -> Result<Option<Value>> {
        let path = dir.join(RESULT);
        if !path.exists() {
            return Ok(None);
        }
        let mut value = read_json(&path)?;
        value.as_object_mut().map(|o| o.remove("train_seconds"));
        Ok(Some(value))
    };
    if result(a)? != result(b)? {
        differences.push(RESULT.to_string());
    }
    let run: RunConfig = serde_json::from_value(config_a["run"].clone())
        .with_context(|| format!("{}: no `run` configuration", a.join(CONFIG).display()))?;
    let attention = config_a["attention_name"]
        .as_str()
        .with_context(|| format!("{}: no `attention_name`", a.join(CONFIG).display()))?;
    for file in [MODEL_BEST, MODEL_LAST] {
        let (fa, fb) = (a.join(file), b.join(file));
        match (fa.exists(), fb.exists()) {
            (false, false) => {}
            (true, true) => {
                if weight_values(&run, attention, &fa)? != weight_values(&run, attention, &fb)? {
                    differences.push(file.to_string());
                }
            }
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

/// Every float parameter of a weight file, in module order, as bits (so that NaN equals NaN).
fn weight_values(config: &RunConfig, attention: &str, path: &Path) -> Result<Vec<Vec<u32>>> {
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
    let device = crate::backend::any_device()?;
    let task = config.task;
    let model = LraClassifier::new(
        config,
        attention,
        task.vocab_size(),
        task.n_classes(),
        &device,
    )?;
    let model = load_weights(model, path)?;
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    Ok(collect.0)
}
