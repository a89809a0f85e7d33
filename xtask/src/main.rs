//! Project tasks. `cargo xtask lra ...` runs multi-seed LRA sweeps and reports mean, spread and
//! best per attention, in the shape of the source papers' tables, on this host (one run or
//! several at once) or as a Slurm job array; `cargo xtask bench ...` runs the efficiency
//! benchmarks beside PyTorch; `cargo xtask report` charts a sweep's accuracy against the
//! benchmarks' training speed and memory; `cargo xtask recall` draws MQAR's recall against width
//! and decoding state.
//!
//! The sweep reads and schedules run directories through `lra-runs` (their layout, `result.json`,
//! the lock) and trains through the `burn-lra` binary, so xtask itself never compiles Burn.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod harness;
mod recall;
mod report;
mod sweep;

#[derive(Parser)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "LRA seed sweeps (here or on Slurm) and efficiency benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train every (attention, seed) of a sweep that is not finished yet, then print mean ± std
    /// (sample, n-1) and best test accuracy per attention and write summary.json and summary.md
    /// beside the runs.
    Lra(sweep::LraArgs),
    /// Efficiency benchmarks: ours beside PyTorch's implementations, in the same run.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// A sweep's accuracy against training speed, memory as the circle's area: an SVG chart and
    /// its table beside the sweep's summary.json, from it and a `bench lra` report of the same
    /// task and preset.
    Report(report::ReportArgs),
    /// MQAR's recall in Zoology's picture: test accuracy against model width per length and
    /// pairs, and against the decoding state's size for the causal models, from every finished
    /// run under a task folder (recall.svg, recall.md and recall.json in it).
    Recall(recall::RecallArgs),
}

fn main() -> ExitCode {
    let result = match lra_runs::cli::parse_or_exit::<Cli>().command {
        Command::Lra(args) => sweep::lra(args),
        Command::Bench(command) => bench::bench(command),
        Command::Report(args) => report::report(args),
        Command::Recall(args) => recall::recall(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
