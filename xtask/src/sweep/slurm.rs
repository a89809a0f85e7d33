//! The Slurm executor: the sweep's unfinished runs as one job array (`sbatch --array`), a task
//! per run, each `burn-lra train --continue` on its run directory, so that a requeued or
//! pre-empted task resumes from its checkpoint. The folder `<sweep>/slurm/` holds what the
//! cluster's nodes run and write:
//!
//! ```text
//! <sweep>/slurm/
//!   submit-<time>-<pid>/array.sh    the job script (one `case` line per task)
//!   submit-<time>-<pid>/burn-lra    the harness binary the tasks run
//!   submit-<time>-<pid>/<config>    a copy of `--config`, which the tasks read
//!   logs/<job>_<task>.log           each task's output
//!   submissions.jsonl               one line per array: its job id, script and runs by task
//! ```
//!
//! A sweep run again submits only what is unfinished and neither queued nor running in an
//! array it submitted before; it waits for those arrays too before summarising.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use lra_runs::{RunDirLock, RunState, write_atomic};
use serde::{Deserialize, Serialize};

use super::plan::{Failure, LraArgs, Run, last_error_line, train_args};
use crate::harness::Harness;

/// How often the queue is asked about the arrays.
const POLL: Duration = Duration::from_secs(3);

/// One submitted array, as `submissions.jsonl` records it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Submission {
    /// Slurm's job id of the array.
    job: String,
    /// The job script.
    script: PathBuf,
    /// The runs, by array task index.
    runs: Vec<(lra_runs::AttentionName, u64)>,
}

impl Submission {
    /// The log of task `index`.
    fn log(&self, sweep_dir: &Path, index: usize) -> PathBuf {
        logs_dir(sweep_dir).join(format!("{}_{index}.log", self.job))
    }
}

fn slurm_dir(sweep_dir: &Path) -> PathBuf {
    sweep_dir.join(lra_runs::layout::SWEEP_SLURM)
}

fn logs_dir(sweep_dir: &Path) -> PathBuf {
    slurm_dir(sweep_dir).join(lra_runs::layout::SWEEP_LOGS)
}

/// Submits the runs not queued, running or training elsewhere as one array and, unless
/// `--no-wait`, waits for it (and for the sweep's arrays still in the queue); the runs that did
/// not finish. `None` after a `--no-wait` submission.
pub(super) fn run(
    args: &LraArgs,
    harness: &Harness,
    sweep_dir: &Path,
    runs: Vec<Run>,
) -> Result<Option<Vec<Failure>>> {
    let earlier = read_submissions(sweep_dir)?;
    let mut queued = Vec::new(); // (submission, its tasks still in the queue)
    for submission in earlier {
        let tasks = queued_tasks(&submission.job)?;
        if !tasks.is_empty() {
            queued.push((submission, tasks));
        }
    }
    let in_queue = |run: &Run| {
        queued.iter().find_map(|(s, tasks)| {
            tasks
                .iter()
                .any(|&i| s.runs.get(i) == Some(&(run.attention.clone(), run.seed)))
                .then_some(s.job.clone())
        })
    };
    let mut submit = Vec::new();
    for run in runs {
        if let Some(job) = in_queue(&run) {
            eprintln!("{run}: queued or running in job {job}, not submitted again");
        } else if RunDirLock::is_held(&run.dir)? {
            eprintln!("{run}: being trained by another process, not submitted");
        } else {
            submit.push(run);
        }
    }
    let mut waiting: Vec<Submission> = queued.into_iter().map(|(s, _)| s).collect();
    if !submit.is_empty() {
        let submission = submit_array(args, harness, sweep_dir, &submit)?;
        eprintln!(
            "submitted job {}: {} task(s), logs in {}",
            submission.job,
            submit.len(),
            logs_dir(sweep_dir).display()
        );
        waiting.push(submission);
    }
    if args.no_wait {
        eprintln!(
            "not waiting (--no-wait): when the job is done, run the same command with \
             --summarize instead of --no-wait to collect the summary"
        );
        return Ok(None);
    }
    wait_for(&waiting, sweep_dir)?;
    let mut failures = Vec::new();
    for submission in &waiting {
        for (index, (attention, seed)) in submission.runs.iter().enumerate() {
            let run = Run {
                attention: attention.clone(),
                seed: *seed,
                dir: lra_runs::run_dir(sweep_dir, attention, *seed),
            };
            if matches!(lra_runs::run_state(&run.dir)?, RunState::Finished(_)) {
                continue;
            }
            let log = submission.log(sweep_dir, index);
            let mut reason = format!(
                "task {}_{index} ended unfinished (log: {})",
                submission.job,
                log.display()
            );
            if let Some(line) = last_error_line(&log) {
                reason.push_str(&format!(": {line}"));
            }
            failures.push(Failure { run, reason });
        }
    }
    Ok(Some(failures))
}

/// Writes the job script and the harness copy and submits them; the submission, recorded.
fn submit_array(
    args: &LraArgs,
    harness: &Harness,
    sweep_dir: &Path,
    runs: &[Run],
) -> Result<Submission> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let dir = std::path::absolute(
        slurm_dir(sweep_dir).join(format!("submit-{stamp}-{}", std::process::id())),
    )?;
    let binary = dir.join("burn-lra");
    harness.copy_to(&binary)?;
    let logs = std::path::absolute(logs_dir(sweep_dir))?;
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    // The tasks read a copy of the configuration file: one edited meanwhile changes nothing.
    let mut frozen = args.clone();
    if let Some(config) = &args.config {
        let copy = dir.join(config.file_name().unwrap_or_default());
        std::fs::copy(config, &copy)
            .with_context(|| format!("cannot copy {} to {}", config.display(), copy.display()))?;
        frozen.config = Some(copy);
    }
    let script = dir.join("array.sh");
    write_atomic(
        &script,
        job_script(&frozen, runs, &binary, &logs)?.as_bytes(),
    )?;
    let extra = match &args.slurm {
        Some(options) => shlex::split(options)
            .with_context(|| format!("--slurm: cannot split `{options}` into options"))?,
        None => Vec::new(),
    };
    let output = Command::new("sbatch")
        .arg("--parsable")
        .args(&extra)
        .arg(&script)
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => anyhow::anyhow!(
                "sbatch not found: the slurm executor needs Slurm's client commands on this host \
                 (Debian: slurm-client) and a cluster to submit to"
            ),
            _ => anyhow::anyhow!("cannot run sbatch: {e}"),
        })?;
    if !output.status.success() {
        bail!(
            "sbatch refused {}: {}",
            script.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    // `--parsable` prints `<job id>[;<cluster>]`.
    let stdout = String::from_utf8_lossy(&output.stdout);
    let job = stdout
        .trim()
        .split(';')
        .next()
        .filter(|id| !id.is_empty())
        .with_context(|| format!("sbatch printed no job id: `{}`", stdout.trim()))?
        .to_string();
    let submission = Submission {
        job,
        script,
        runs: runs.iter().map(|r| (r.attention.clone(), r.seed)).collect(),
    };
    record_submission(sweep_dir, &submission)?;
    Ok(submission)
}

/// The job script: `#SBATCH` lines, the thread pools sized to the task's CPUs, and one `case`
/// line per task that runs `burn-lra train --continue` on its run.
fn job_script(args: &LraArgs, runs: &[Run], binary: &Path, logs: &Path) -> Result<String> {
    let quote = |s: &std::ffi::OsStr| -> Result<String> {
        let s = s
            .to_str()
            .with_context(|| format!("{}: not UTF-8", s.to_string_lossy()))?;
        Ok(format!("'{}'", s.replace('\'', r"'\''")))
    };
    let mut array = format!("0-{}", runs.len() - 1);
    if let Some(k) = args.throttle {
        array.push_str(&format!("%{k}"));
    }
    let mut script = format!(
        "#!/bin/bash\n\
         #SBATCH --job-name=lra-{task}-{preset}\n\
         #SBATCH --array={array}\n\
         #SBATCH --output={logs}/%A_%a.log\n\
         #SBATCH --open-mode=append\n\
         #SBATCH --requeue\n\
         # The unfinished runs of the sweep {task}/{preset}, one array task each, written by\n\
         # `cargo xtask lra --executor slurm`. `burn-lra train --continue` starts a run, resumes it\n\
         # from its checkpoint (a requeued or pre-empted task), or does nothing when it is finished.\n\
         set -u\n\
         if [ -n \"${{SLURM_CPUS_PER_TASK:-}}\" ]; then\n\
         \x20   export RAYON_NUM_THREADS=$SLURM_CPUS_PER_TASK OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK\n\
         fi\n\
         echo \"== task ${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}} on $(hostname), restart ${{SLURM_RESTART_COUNT:-0}}\"\n\
         case \"$SLURM_ARRAY_TASK_ID\" in\n",
        task = args.task,
        preset = args.preset_name(),
        logs = logs.display(),
    );
    for (index, run) in runs.iter().enumerate() {
        let mut line = format!("{index}) exec {}", quote(binary.as_os_str())?);
        for arg in train_args(args, run, true)? {
            line.push(' ');
            line.push_str(&quote(&arg)?);
        }
        script.push_str(&line);
        script.push_str(" ;;\n");
    }
    script.push_str(
        "*) echo \"error: no task $SLURM_ARRAY_TASK_ID in this array\" >&2; exit 2 ;;\nesac\n",
    );
    Ok(script)
}

fn submissions_path(sweep_dir: &Path) -> PathBuf {
    slurm_dir(sweep_dir).join("submissions.jsonl")
}

fn read_submissions(sweep_dir: &Path) -> Result<Vec<Submission>> {
    let path = submissions_path(sweep_dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line)
                .with_context(|| format!("{}:{}: not a submission record", path.display(), i + 1))
        })
        .collect()
}

fn record_submission(sweep_dir: &Path, submission: &Submission) -> Result<()> {
    let path = submissions_path(sweep_dir);
    let mut text = std::fs::read_to_string(&path).unwrap_or_default();
    text.push_str(&serde_json::to_string(submission)?);
    text.push('\n');
    write_atomic(&path, text.as_bytes())
}

/// The task indices of array `job` still pending or running (empty once it has left the queue).
fn queued_tasks(job: &str) -> Result<BTreeSet<usize>> {
    let output = Command::new("squeue")
        .args(["--noheader", "--array", "--format=%i", "--jobs", job])
        .output()
        .context("cannot run squeue (Debian: slurm-client)")?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        if stderr.contains("Invalid job id") {
            return Ok(BTreeSet::new()); // finished and purged from the queue
        }
        bail!("squeue --jobs {job} failed: {}", stderr.trim());
    }
    Ok(task_ids(&String::from_utf8_lossy(&output.stdout)))
}

/// The array task indices in `squeue --array --format=%i` lines: `12_3`, and pending tasks
/// still listed as a range, `12_[4-6%2]` or `12_[7,9]`.
fn task_ids(squeue: &str) -> BTreeSet<usize> {
    let mut tasks = BTreeSet::new();
    for line in squeue.lines() {
        let Some((_, task)) = line.trim().split_once('_') else {
            continue;
        };
        let task = task.trim_start_matches('[').trim_end_matches(']');
        let task = task.split('%').next().unwrap_or_default();
        for part in task.split(',') {
            match part.split_once('-') {
                Some((a, b)) => {
                    if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                        tasks.extend(a..=b);
                    }
                }
                None => {
                    if let Ok(i) = part.parse() {
                        tasks.insert(i);
                    }
                }
            }
        }
    }
    tasks
}

/// Waits until none of `submissions`' tasks is queued or running, printing progress when it
/// changes. Transient errors of the queue are retried for a minute.
fn wait_for(submissions: &[Submission], sweep_dir: &Path) -> Result<()> {
    let total: usize = submissions.iter().map(|s| s.runs.len()).sum();
    let jobs: Vec<&str> = submissions.iter().map(|s| s.job.as_str()).collect();
    let mut last = None;
    let mut errors = 0;
    loop {
        let mut queued = 0;
        let mut failed = None;
        for submission in submissions {
            match queued_tasks(&submission.job) {
                Ok(tasks) => queued += tasks.len(),
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed {
            errors += 1;
            if errors * POLL.as_secs() > 60 {
                return Err(e.context("the Slurm queue stopped answering"));
            }
            std::thread::sleep(POLL);
            continue;
        }
        errors = 0;
        let finished = submissions
            .iter()
            .flat_map(|s| &s.runs)
            .filter(|(a, seed)| {
                matches!(
                    lra_runs::run_state(&lra_runs::run_dir(sweep_dir, a, *seed)),
                    Ok(RunState::Finished(_))
                )
            })
            .count();
        if last != Some((queued, finished)) {
            eprintln!(
                "slurm job {}: {finished}/{total} finished, {queued} queued or running",
                jobs.join(", ")
            );
            last = Some((queued, finished));
        }
        if queued == 0 {
            return Ok(());
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_lines_give_task_indices() {
        let ids = task_ids("12_3\n12_[5-7%2]\n 12_[9,11]\n");
        assert_eq!(ids.into_iter().collect::<Vec<_>>(), vec![3, 5, 6, 7, 9, 11]);
        assert!(task_ids("").is_empty());
    }

    #[test]
    fn script_quotes_every_argument_and_throttles() {
        let args = LraArgs {
            throttle: Some(4),
            ..crate::sweep::plan::tests::args(&[
                "--executor",
                "slurm",
                "--out",
                "/shared/it's runs",
            ])
        };
        let runs = vec![
            Run {
                attention: lra_runs::AttentionName::new("softmax").unwrap(),
                seed: 0,
                dir: "/shared/it's runs/listops/tiny/softmax/seed-0".into(),
            },
            Run {
                attention: lra_runs::AttentionName::new("linear").unwrap(),
                seed: 1,
                dir: "/shared/it's runs/listops/tiny/linear/seed-1".into(),
            },
        ];
        let script = job_script(&args, &runs, Path::new("/b/burn-lra"), Path::new("/l")).unwrap();
        assert!(script.contains("#SBATCH --array=0-1%4\n"), "{script}");
        assert!(
            script.contains("#SBATCH --output=/l/%A_%a.log\n"),
            "{script}"
        );
        assert!(
            script.contains(
                "1) exec '/b/burn-lra' 'train' '--continue' '--task' 'listops' '--attention' \
                 'linear' '--seed' '1' '--backend' 'flex' '--out' '/shared/it'\\''s runs' \
                 '--run-dir' '/shared/it'\\''s runs/listops/tiny/linear/seed-1' '--preset' \
                 'tiny' ;;\n"
            ),
            "{script}"
        );
    }
}
