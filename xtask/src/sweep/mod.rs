//! `cargo xtask lra`: a seed sweep. It plans which (attention, seed) runs are unfinished
//! ([`plan`]), has an executor train them ([`local`]: on this host, one or several at once;
//! [`slurm`]: as one job array), then summarises every finished run of the sweep ([`summary`]).
//!
//! Whatever the executor, a run is `burn-lra train --continue` on its run directory: it starts,
//! resumes from its checkpoint, or does nothing when finished, and it holds the directory's lock
//! while it trains, so concurrent sweeps over one `--out` never train a run twice.

use std::process::Command;

use anyhow::{Result, bail};

use crate::harness::{check_task, harness, resolve_attentions};

mod local;
mod plan;
mod slurm;
mod summary;

pub use plan::LraArgs;
use plan::{Executor, unfinished_runs};

/// Entry point of `cargo xtask lra`.
pub fn lra(args: LraArgs) -> Result<()> {
    args.check_executor_flags()?;
    let sweep_dir = args.sweep_dir();
    if args.summarize {
        return summary::write(&args, &sweep_dir);
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
    let unfinished = unfinished_runs(&attentions, args.seeds, &sweep_dir)?;
    let failures = match args.executor {
        Executor::Local => local::run(&args, &harness, unfinished)?,
        Executor::Slurm => match slurm::run(&args, &harness, &sweep_dir, unfinished)? {
            Some(failures) => failures,
            None => return Ok(()), // --no-wait
        },
    };
    summary::write(&args, &sweep_dir)?;
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
