//! `cargo xtask lra`: a seed sweep. It plans which (attention, seed) runs are unfinished
//! ([`plan`]), has an executor train them ([`local`]: on this host, one or several at once;
//! [`slurm`]: as one job array), then summarises every finished run of the sweep ([`summary`]).
//! With `--set`, a grid: every point is such a sweep, and [`grid`] gives each attention at its
//! best point by validation. With `--pretrain`, each point is two sweeps: self-pretraining runs,
//! then the runs fine-tuned from them.
//!
//! Whatever the executor, a run is `burn-lra train --continue` on its run directory: it starts,
//! resumes from its checkpoint, or does nothing when finished, and it holds the directory's lock
//! while it trains, so concurrent sweeps over one `--out` never train a run twice.

use std::process::Command;

use anyhow::{Result, bail};

use crate::harness::{check_task, harness, resolve_attentions};

mod grid;
mod local;
mod plan;
mod progress;
mod slurm;
mod summary;

pub use plan::LraArgs;
use plan::{Executor, unfinished_runs};
pub(crate) use summary::attention_folders;

/// Entry point of `cargo xtask lra`.
pub fn lra(args: LraArgs) -> Result<()> {
    args.check_executor_flags()?;
    let points = args.points()?;
    let grid = !args.set.is_empty();
    if args.summarize {
        for point in &points {
            let at = args.at(point.clone()).summarized();
            summary::write(&at, &at.sweep_dir())?;
        }
        return if grid {
            grid::write(&args, &points)
        } else {
            Ok(())
        };
    }
    let harness = harness(args.harness.as_deref(), args.backend)?;
    if args.list {
        if !Command::new(&harness).arg("list").status()?.success() {
            bail!("burn-lra list failed");
        }
        return Ok(());
    }
    check_task(&args.task, &harness)?;
    let attentions = resolve_attentions(&args.attention, &harness, false)?;
    // Each point of a grid is a sweep of its own, trained after the one before.
    let mut failures = Vec::new();
    for point in &points {
        if grid {
            eprintln!("grid point {}", point.join(", "));
        }
        // With --pretrain, the pretraining sweep, then the fine-tuning one.
        for at in args.at(point.clone()).stages() {
            let sweep_dir = at.sweep_dir();
            let unfinished = unfinished_runs(&attentions, args.seeds, &sweep_dir)?;
            failures.extend(match args.executor {
                Executor::Local => local::run(&at, &harness, unfinished)?,
                Executor::Slurm => match slurm::run(&at, &harness, &sweep_dir, unfinished)? {
                    Some(failures) => failures,
                    None => continue, // --no-wait
                },
            });
            // A sweep none of whose runs finished has no summary; the failures say why.
            if let Err(err) = summary::write(&at, &sweep_dir) {
                eprintln!("{}: {err:#}", sweep_dir.display());
            }
        }
    }
    if args.no_wait {
        return Ok(());
    }
    if grid {
        grid::write(&args, &points)?;
    }
    if !failures.is_empty() {
        let lines: Vec<String> = failures
            .iter()
            .map(|f| format!("  {}: {}", f.run, f.reason))
            .collect();
        bail!(
            "{} run(s) did not finish:\n{}",
            failures.len(),
            lines.join("\n")
        );
    }
    Ok(())
}
