//! Opening a run directory for training: the lock, the checks of a resume (every checkpoint
//! file, the run's identity, the fields a resume may change) and the record of its changes.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::config::RunConfig;
use crate::data::write_atomic;
use crate::run_dir::checkpoint::{Record, VerifiedCheckpoint, verify_checkpoint, verify_metrics};
use crate::run_dir::{
    ConfigChange, RESTART_ADVICE, RunDirLock, check_run_dir, clear_unfinished_run, find_checkpoint,
};
use lra_runs::CheckpointState;
use lra_runs::RunResult;
use lra_runs::layout::{CHECKPOINT_BEST, CONFIG, METRICS, RESULT};
use lra_runs::result::{RunState, run_state};

/// Whether a run starts afresh or continues what its directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResumeMode {
    /// Start a fresh run; a directory holding a run, finished or not, is an error.
    #[default]
    Start,
    /// Continue the unfinished run from its checkpoint; an error when there is no run to continue.
    Resume,
    /// Whatever the directory holds: start a fresh run, continue an unfinished one, or return a
    /// finished one's result untouched (what sweeps ask for, so that a task run again does no
    /// harm).
    Continue,
    /// Start over: an unfinished run's files (its checkpoints, however damaged) are removed first;
    /// a finished run is refused.
    Restart,
}

/// A checkpoint to continue from: its verified files, its state, the run's record it holds and
/// the changes this resume makes to it.
pub(crate) struct Resume {
    /// The checkpoint's files, verified.
    pub checkpoint: VerifiedCheckpoint,
    /// Its state.
    pub state: CheckpointState,
    /// The metrics the checkpoint recorded, where `metrics.jsonl` holds lines after them.
    pub metrics_cut: Option<Vec<u8>>,
    /// The run's record the checkpoint holds.
    pub record: Record,
    /// What this resume changes in the configuration: `field -> [was, now]`.
    pub changes: BTreeMap<String, [Value; 2]>,
}

/// Opens `run_dir` for training as `mode` asks: refuses a folder holding anything
/// but the harness's files, a finished run (returns it with [`ResumeMode::Continue`]), an
/// unfinished one with [`ResumeMode::Start`], a resume with nothing to resume, from a
/// checkpoint that fails its checks or with a field a resume may not change (the backend only
/// with `change_backend`); takes the directory's lock. A fresh run (or one killed before its first checkpoint, or restarted) gets
/// its `config.json` and an empty `metrics.jsonl`; a resumed one is returned, its files
/// untouched until its checkpoint has loaded.
pub(crate) fn open_run_dir(
    run_dir: &Path,
    mode: ResumeMode,
    change_backend: bool,
    config: &RunConfig,
    record: &Record,
) -> Result<Opened> {
    check_run_dir(run_dir)?;
    let config_path = run_dir.join(CONFIG);
    // Only a run's record is ever replaced or resumed from.
    if config_path.is_file() && !is_run_record(&config_path) {
        bail!(
            "{} is not a run's configuration record; it is left as it is (choose another \
             --run-dir)",
            config_path.display()
        );
    }
    let finished = || {
        anyhow::anyhow!(
            "{} already holds a finished run (result.json); remove it to train again",
            run_dir.display()
        )
    };
    if mode == ResumeMode::Resume && !config_path.is_file() && find_checkpoint(run_dir).is_none() {
        bail!(
            "{}: no run to resume (no config.json or checkpoint there); start it without --resume",
            run_dir.display()
        );
    }
    let finished_result = || -> Result<Opened> {
        match (mode, run_state(run_dir)?) {
            (ResumeMode::Continue, RunState::Finished(result)) => Ok(Opened::Finished(result)),
            _ => Err(finished()),
        }
    };
    if run_dir.join(RESULT).exists() {
        return finished_result();
    }
    std::fs::create_dir_all(run_dir)
        .with_context(|| format!("cannot create run directory {}", run_dir.display()))?;
    let lock = RunDirLock::acquire(run_dir)?;
    if run_dir.join(RESULT).exists() {
        // Finished by another process between the first look and the lock.
        return finished_result();
    }
    let resume = match (mode, find_checkpoint(run_dir)) {
        (ResumeMode::Resume | ResumeMode::Continue, Some(dir)) => {
            let resume = check_resume(config, record, run_dir, &dir, change_backend)?;
            Some(Box::new(resume))
        }
        (ResumeMode::Start, Some(_)) => bail!(
            "{} holds an unfinished run; pass --resume to continue it, --restart to start it \
             over, or choose another --run-dir",
            run_dir.display()
        ),
        (mode, _) => {
            // Restarted, or killed before its first checkpoint (nothing of value is lost), or
            // never started (nothing to clear).
            if mode == ResumeMode::Restart {
                eprintln!("{}: starting the run over (--restart)", run_dir.display());
            } else if mode != ResumeMode::Start && config_path.is_file() {
                eprintln!(
                    "{}: killed before its first checkpoint; starting it over from step 0",
                    run_dir.display()
                );
            }
            clear_unfinished_run(run_dir)?;
            write_atomic(&config_path, record.to_json()?.as_bytes())?;
            write_atomic(&run_dir.join(METRICS), b"")?;
            eprintln!("training {} from step 0", run_dir.display());
            None
        }
    };
    Ok(Opened::Ready(lock, resume))
}

/// Whether `path` holds a run's `config.json` record.
fn is_run_record(path: &Path) -> bool {
    lra_runs::RunRecord::<Value>::read(path).is_ok()
}

/// A run directory opened for training.
pub(crate) enum Opened {
    /// It already holds a finished run (only with [`ResumeMode::Continue`]): its result.
    Finished(Box<RunResult>),
    /// Its lock, and the checkpoint to continue from (`None`: a fresh run).
    Ready(RunDirLock, Option<Box<Resume>>),
}

/// Checks that the run in `run_dir` can continue from the checkpoint `dir` with `config`: every
/// checkpoint file as recorded, the same attention, seed, backend and data, a configuration that
/// differs only in the fields a resume may change. With `change_backend`, the backend may differ
/// too: the change is recorded as the field `backend`, and the record names the new backend.
fn check_resume(
    config: &RunConfig,
    record: &Record,
    run_dir: &Path,
    dir: &Path,
    change_backend: bool,
) -> Result<Resume> {
    let checkpoint = verify_checkpoint(dir)?;
    let mut saved = checkpoint.record.clone();
    let moved = change_backend && saved.backend != record.backend;
    let identity = Record {
        backend: if moved { saved.backend } else { record.backend },
        ..record.clone()
    };
    if let Some((key, was, now)) = saved.identity_change(&identity) {
        let advice = if key == "backend" {
            "--change-backend continues it there (recorded as a change); "
        } else {
            ""
        };
        bail!(
            "cannot resume {}: its `{key}` differs from this command's (was {was}, now {now}); \
             {advice}{RESTART_ADVICE}",
            run_dir.display(),
        );
    }
    let mut changes = config_changes(&saved.run, config)
        .with_context(|| format!("cannot resume {}", run_dir.display()))?;
    if moved {
        let names = [saved.backend, record.backend].map(|backend| Value::from(backend.name()));
        changes.insert(BACKEND_FIELD.into(), names);
        saved.backend = record.backend;
    }
    let state = checkpoint.state.clone();
    let state_path = checkpoint.file(lra_runs::layout::CHECKPOINT_STATE);
    // The metrics the checkpoint vouches for, checked before anything is loaded.
    let metrics_cut = verify_metrics(
        &run_dir.join(METRICS),
        state.metrics_bytes,
        &state.metrics_sha256,
    )?;
    if state.best.is_some() != checkpoint.has_best {
        let mismatch = match state.best {
            Some(_) => "records best-validation weights but the checkpoint lacks",
            None => "records no best-validation weights but the checkpoint holds",
        };
        bail!(
            "{}: {mismatch} {CHECKPOINT_BEST}; {RESTART_ADVICE}",
            state_path.display()
        );
    }
    if config.training.steps < state.step {
        bail!(
            "cannot resume {}: `training.steps` ({}) is below the checkpoint's step ({})",
            run_dir.display(),
            config.training.steps,
            state.step
        );
    }
    Ok(Resume {
        checkpoint,
        state,
        metrics_cut,
        record: saved,
        changes,
    })
}

/// Writes the checkpoint's record back as `config.json`, with this resume's configuration
/// changes (the new `run` and a `config_changes` entry), and returns every change the run has
/// had.
pub(crate) fn record_changes(
    run_dir: &Path,
    resume: &mut Resume,
    config: &RunConfig,
) -> Result<Vec<ConfigChange>> {
    if !resume.changes.is_empty() {
        let listed: Vec<String> = (resume.changes.iter())
            .map(|(field, [was, now])| format!("{field} {was} -> {now}"))
            .collect();
        eprintln!(
            "resuming from step {} with a changed configuration: {}",
            resume.state.step,
            listed.join(", ")
        );
        resume.record.config_changes.push(ConfigChange {
            from_step: resume.state.step,
            fields: std::mem::take(&mut resume.changes),
        });
        resume.record.run = config.clone();
    }
    write_atomic(&run_dir.join(CONFIG), resume.record.to_json()?.as_bytes())?;
    Ok(resume.record.config_changes.clone())
}

/// The name a backend change has among a resume's changes (`burn-lra train --change-backend`):
/// the record's own field, beside the configuration's dotted ones.
pub const BACKEND_FIELD: &str = "backend";

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
