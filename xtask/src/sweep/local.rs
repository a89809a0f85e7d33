//! The local executor: the sweep's runs on this host, `--jobs` at once. Each run at once has a
//! slot: its own device (`--devices`, GPU backends) or, on a CPU backend, its own share of the
//! cores (pinned, with the thread pools sized to it). With one job the run's output is the
//! sweep's; with several, each run writes `<sweep>/logs/<attention>-seed-<n>.log`.
//!
//! Without `--jobs`, a CPU backend runs one job per usable core (at most one per run): the
//! harness's models keep one core busy far better than they split a step over several. Measured
//! on a 2-core AMD EPYC, release build, the `tiny` and `small` models at 500 tokens, batch 32:
//! one run on both cores trains 2.7 steps/s, two runs pinned to a core each 3.9 steps/s
//! together (1.4x).
//!
//! After each run the sweep says where it stands ([`Progress`]): runs done of the total,
//! failures, time elapsed and an estimate of the time left.
//!
//! A run whose directory another process holds (a concurrent sweep over the same `--out`) is
//! left to it; when everything else is done the sweep waits for that process, then trains what
//! it left unfinished.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use lra_runs::{RunDirLock, RunState};

use super::plan::{Failure, LraArgs, Run, last_error_line, train_args};
use super::progress::Progress;
use crate::harness::{Harness, stop_with_parent};

/// Where one of the runs at once trains.
#[derive(Debug, Clone, PartialEq)]
struct Slot {
    /// `burn-lra train --device`.
    device: Option<usize>,
    /// The cores it is pinned to (CPU backends, several jobs).
    cores: Vec<usize>,
}

/// How one attempt at a run ended.
enum Outcome {
    Finished,
    /// Another process holds its directory.
    InUse,
    Failed(String),
}

/// Trains `runs` on this host; the runs that did not finish.
pub(super) fn run(args: &LraArgs, harness: &Harness, runs: Vec<Run>) -> Result<Vec<Failure>> {
    let slots = slots(args, runs.len())?;
    let progress = Progress::new(runs.len(), slots.len() > 1);
    let mut queue: VecDeque<Run> = runs.into();
    let mut failures = Vec::new();
    while !queue.is_empty() {
        let held = run_queue(args, harness, &slots, queue, (&progress, &mut failures))?;
        // Held by another sweep: wait for it, then train what it left unfinished.
        queue = VecDeque::new();
        for run in held {
            progress.say(&format!(
                "{run}: being trained by another process; waiting for it"
            ));
            RunDirLock::wait_until_free(&run.dir)?;
            match lra_runs::run_state(&run.dir)? {
                RunState::Finished(result) => {
                    progress.say(&format!(
                        "{run}: finished by the other process ({:.2}%)",
                        100.0 * result.test_accuracy
                    ));
                    progress.ended(false);
                }
                _ => queue.push_back(run),
            }
        }
    }
    progress.finish();
    Ok(failures)
}

/// The slots of `--jobs` / `--devices` for `n_runs` runs; without either, one per usable core
/// on a CPU backend (at most `n_runs`), else one.
fn slots(args: &LraArgs, n_runs: usize) -> Result<Vec<Slot>> {
    let jobs = match args.jobs {
        Some(jobs) => jobs as usize,
        None if args.devices.is_empty() && args.backend.runs_on_cpu() => {
            usable_cores().len().min(n_runs).max(1)
        }
        None => args.devices.len().max(1),
    };
    if !args.devices.is_empty() {
        if args.backend.runs_on_cpu() {
            bail!(
                "--devices: backend `{}` runs on the CPU (its runs share the cores: use --jobs)",
                args.backend
            );
        }
        if args.devices.len() < jobs {
            bail!(
                "--jobs {jobs} needs as many --devices (got {}): each run at once has its own",
                args.devices.len()
            );
        }
    }
    let cores = if jobs > 1 && args.backend.runs_on_cpu() {
        usable_cores()
    } else {
        Vec::new()
    };
    let per_job = (cores.len() / jobs).max(1);
    Ok((0..jobs)
        .map(|k| Slot {
            device: args.devices.get(k).copied(),
            cores: (0..per_job.min(cores.len()))
                .map(|i| cores[(k * per_job + i) % cores.len()])
                .collect(),
        })
        .collect())
}

/// The cores this process may run on (its affinity mask on Linux, else 0..available).
fn usable_cores() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if unsafe { libc::sched_getaffinity(0, size, &mut set) } == 0 {
            return (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
                .collect();
        }
    }
    (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
}

/// Runs the queue in the slots (a thread per slot, each taking the next run), counting each run
/// that ends in `progress`; the runs another process held.
fn run_queue(
    args: &LraArgs,
    harness: &Harness,
    slots: &[Slot],
    queue: VecDeque<Run>,
    (progress, failures): (&Progress, &mut Vec<Failure>),
) -> Result<Vec<Run>> {
    let queue = Mutex::new(queue);
    let held = Mutex::new(Vec::new());
    let failed = Mutex::new(Vec::new());
    let errors = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for slot in slots {
            scope.spawn(|| {
                loop {
                    let Some(run) = queue.lock().unwrap().pop_front() else {
                        break;
                    };
                    match attempt(args, harness, slot, progress, &run) {
                        Ok(Outcome::Finished) => progress.ended(false),
                        Ok(Outcome::InUse) => held.lock().unwrap().push(run),
                        Ok(Outcome::Failed(reason)) => {
                            progress.say(&format!("{run}: failed: {reason}"));
                            progress.ended(true);
                            failed.lock().unwrap().push(Failure { run, reason })
                        }
                        Err(e) => errors.lock().unwrap().push(e),
                    }
                }
            });
        }
    });
    if let Some(e) = errors.into_inner().unwrap().into_iter().next() {
        return Err(e);
    }
    failures.extend(failed.into_inner().unwrap());
    Ok(held.into_inner().unwrap())
}

/// One attempt at `run` in `slot`, saying what happens through `progress`; with several slots,
/// its output goes to its log file.
fn attempt(
    args: &LraArgs,
    harness: &Harness,
    slot: &Slot,
    progress: &Progress,
    run: &Run,
) -> Result<Outcome> {
    let logged = progress.logged();
    if let RunState::Finished(result) = lra_runs::run_state(&run.dir)? {
        progress.say(&format!(
            "{run}: finished meanwhile by another process ({:.2}%)",
            100.0 * result.test_accuracy
        ));
        return Ok(Outcome::Finished);
    }
    let mut cmd = Command::new(harness);
    cmd.args(train_args(args, run, false)?);
    if let Some(device) = slot.device {
        cmd.args(["--device", &device.to_string()]);
    }
    if !slot.cores.is_empty() {
        pin(&mut cmd, &slot.cores);
    }
    let log = logged.then(|| log_path(args, run));
    match &log {
        Some(log) => {
            if let Some(dir) = log.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
            }
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .with_context(|| format!("cannot open {}", log.display()))?;
            cmd.stdout(file.try_clone()?)
                .stderr(file)
                .stdin(Stdio::null());
            let place = match (slot.device, slot.cores.as_slice()) {
                (Some(d), _) => format!("device {d}"),
                (None, []) => "the default device".to_string(),
                (None, cores) => format!("cores {cores:?}"),
            };
            progress.say(&format!(
                "{run}: started on {place} (log: {})",
                log.display()
            ));
        }
        None => progress.say(&format!(
            "== {} / {run} / {} on {}",
            args.task,
            args.preset_name(),
            args.backend
        )),
    }
    stop_with_parent(&mut cmd);
    let started = Instant::now();
    let status = cmd.status().context("cannot run burn-lra")?;
    if status.code() == Some(lra_runs::EXIT_IN_USE.into()) {
        return Ok(Outcome::InUse);
    }
    if status.success()
        && let RunState::Finished(result) = lra_runs::run_state(&run.dir)?
    {
        if logged {
            progress.say(&format!(
                "{run}: {:.2}% test accuracy ({:.0} s)",
                100.0 * result.test_accuracy,
                started.elapsed().as_secs_f64()
            ));
        }
        return Ok(Outcome::Finished);
    }
    let mut reason = format!("burn-lra exited with {status}");
    if let Some(log) = &log {
        if let Some(line) = last_error_line(log) {
            reason.push_str(&format!(": {line}"));
        }
        reason.push_str(&format!(" (log: {})", log.display()));
    }
    Ok(Outcome::Failed(reason))
}

/// `<sweep>/logs/<attention>-seed-<n>.log`.
fn log_path(args: &LraArgs, run: &Run) -> PathBuf {
    args.sweep_dir()
        .join(lra_runs::layout::SWEEP_LOGS)
        .join(format!(
            "{}-seed-{}.log",
            lra_runs::names::attention_dir_name(&run.attention),
            run.seed
        ))
}

/// Pins the child to `cores` and sizes its thread pools (rayon: flex, ndarray; OpenMP: tch) to
/// them.
fn pin(cmd: &mut Command, cores: &[usize]) {
    let threads = cores.len().to_string();
    cmd.env("RAYON_NUM_THREADS", &threads)
        .env("OMP_NUM_THREADS", &threads);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: a zeroed cpu_set_t is a valid empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &core in cores {
            unsafe { libc::CPU_SET(core, &mut set) };
        }
        // SAFETY: sched_setaffinity is async-signal-safe; `set` is copied into the closure.
        unsafe {
            cmd.pre_exec(move || {
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                Ok(())
            });
        }
    }
}
