//! `burn-lra compare`: what differs between two run directories, their weights compared by
//! value.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;

use lra_runs::layout::{CONFIG, METRICS, MODEL_BEST, MODEL_LAST, RESULT};
use lra_runs::{RunResult, RunState};

use super::checkpoint::Record;
use super::{load_weights, verify_file};
use crate::model::LraClassifier;

/// What differs between two run directories: their configuration (the tokenizer's location
/// aside), metrics (times aside), results (times, commits and the validation data's location
/// aside) and, where both are finished, the values of their
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
    let mut differences = Vec::new();
    let (record_a, record_b) = (
        Record::read(&a.join(CONFIG))?,
        Record::read(&b.join(CONFIG))?,
    );
    // Where the tokenizer was read from is a location, not what the run was (the tokenizer
    // itself is compared by `tokenizer_sha256`).
    let without_location = |record: &Record| Record {
        tokenizer: None,
        ..record.clone()
    };
    if without_location(&record_a) != without_location(&record_b) {
        differences.push(CONFIG.to_string());
    }
    let metrics = |dir: &Path| -> Result<Vec<serde_json::Value>> {
        let path = dir.join(METRICS);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        text.lines()
            .enumerate()
            .map(|(i, line)| {
                let mut value: serde_json::Value = serde_json::from_str(line)
                    .with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))?;
                value.as_object_mut().map(|o| o.remove("elapsed_s"));
                Ok(value)
            })
            .collect()
    };
    if metrics(a)? != metrics(b)? {
        differences.push(METRICS.to_string());
    }
    let (result_a, result_b) = (finished_result(a)?, finished_result(b)?);
    // Times, locations and builds are not what a run was; the weight files embed random
    // parameter ids, so their values are compared below instead of their sums.
    let comparable = |result: &RunResult| RunResult {
        train_seconds: 0.0,
        validation_source: String::new(),
        commits: Vec::new(),
        weights_sha256: BTreeMap::new(),
        sha256: None,
        ..result.clone()
    };
    if result_a.as_ref().map(comparable) != result_b.as_ref().map(comparable) {
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
        let values = |dir: &Path, record: &Record| match sums[&(dir, file)] {
            Some(sum) => weight_values(dir, record, file, sum).map(Some),
            None => Ok(None),
        };
        match (values(a, &record_a)?, values(b, &record_b)?) {
            (None, None) => {}
            (Some(x), Some(y)) if x == y => {}
            (Some(_), Some(_)) => differences.push(file.to_string()),
            _ => differences.push(format!("{file} (in one directory only)")),
        }
    }
    Ok(differences)
}

/// Checks the weight file `file` of the finished run in `dir` against the SHA-256 its `result`
/// recorded and returns that sum; `None` where the run left no such file.
fn verify_weights<'r>(dir: &Path, result: &'r RunResult, file: &str) -> Result<Option<&'r String>> {
    let path = dir.join(file);
    if !path.exists() {
        return Ok(None);
    }
    let sha256 = recorded_weights_sha256(dir, result, file)?;
    verify_file(&path, sha256, "recorded in result.json")?;
    Ok(Some(sha256))
}

/// The result of the run in `dir` once it is finished and its result checks out (its checksum,
/// its figures' ranges; the error names the file); `None` for an unfinished run.
pub(crate) fn finished_result(dir: &Path) -> Result<Option<RunResult>> {
    let RunState::Finished(result) = lra_runs::run_state(dir)? else {
        return Ok(None);
    };
    result
        .verify()
        .map_err(|why| anyhow::anyhow!("{}: {why}", dir.join(RESULT).display()))?;
    Ok(Some(*result))
}

/// The SHA-256 the finished run in `dir` recorded for its weight file `file`; an error naming
/// its result.json where it recorded none (written before weights were checksummed).
pub(crate) fn recorded_weights_sha256<'r>(
    dir: &Path,
    result: &'r RunResult,
    file: &str,
) -> Result<&'r String> {
    result.weights_sha256.get(file).with_context(|| {
        format!(
            "{}: no SHA-256 recorded for {file} (written before weights were checksummed); \
             its weights cannot be verified",
            dir.join(RESULT).display()
        )
    })
}

/// Every float parameter of the weight file `file` of the finished run in `dir`, in module order,
/// as bits (so that NaN equals NaN), loaded into the model its own configuration `record`
/// builds, the file checked against `sha256` as it is loaded.
fn weight_values(dir: &Path, record: &Record, file: &str, sha256: &str) -> Result<Vec<Vec<u32>>> {
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
    let (run, attention) = (&record.run, &record.attention_name);
    let device = crate::backend::any_device()?;
    // The run's own vocabulary (a BPE run's is the tokenizer's, not the task's) and classes.
    let task = crate::tasks::find(run.task.name())?;
    let model = LraClassifier::new(
        &crate::model::ClassifierSpec::resolve(run, task, attention)?,
        &device,
    );
    let model = load_weights(model, &path, sha256)?;
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    Ok(collect.0)
}
