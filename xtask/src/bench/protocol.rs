//! What both benchmarks share: a [`Benchmark`] says what its cases are and how a measurement
//! reads; [`run`] builds the harness, runs every case in rounds, one process per side, and
//! writes the report (JSON, then its markdown and SVG).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::Args;
use super::rounds::{Case, run_rounds};
use crate::harness::{Harness, harness, resolve_attentions, workspace_root};

/// One benchmark: its cases and how they read; [`run`] does the rest.
pub(crate) trait Benchmark {
    /// The report's name (`attention`, `attention-causal`, `lra`).
    fn name(&self) -> &'static str;
    /// The PyTorch side's script in `bench/`, if it has one.
    fn script(&self) -> Option<&'static str>;
    /// Whether only the attentions with a causal form are measured (an empty `--attention`
    /// list or `all` then means those).
    fn causal_only(&self) -> bool {
        false
    }
    /// The case of `attention` at length `n`.
    fn case(&self, session: &Session, attention: &str, n: usize) -> Result<Case>;
    /// One measurement, as the progress line shows it.
    fn show(&self, measured: &Value) -> String;
    /// The report's `setup`: the settings its figures were measured with.
    fn setup(&self) -> Value;
}

/// Runs `benchmark` as `args` ask: refuses an existing report before anything is measured,
/// builds the harness, measures every (attention, length) case over the rounds and writes the
/// report.
pub(crate) fn run(benchmark: &impl Benchmark, args: &Args) -> Result<()> {
    report_stem(args, benchmark.name())?;
    let session = Session::start(args, benchmark)?;
    let mut cases = Vec::new();
    for name in &session.names {
        for &n in &args.lengths {
            cases.push(benchmark.case(&session, name, n)?);
        }
    }
    let cases = run_rounds(cases, args.rounds, session.timeout, |v| benchmark.show(v));
    finish(args, benchmark.name(), benchmark.setup(), cases)
}

/// The memory of the n × n score matrices a case keeps, in GiB, for `tensors` of them per head
/// of `heads` heads (and layers) and `batch` sequences; in floating point, since the product of
/// sizes may pass 2^64.
pub(crate) fn scores_gib(tensors: f64, heads: f64, batch: usize, n: usize) -> f64 {
    tensors * heads * batch as f64 * (n as f64).powi(2) * 4.0 / (1u64 << 30) as f64
}

/// Why `attention` is skipped when its stored score matrices would need `scores_gib` (for n × n;
/// scaled by the share of it the variant keeps), if it is.
pub(crate) fn quadratic_skip(attention: &str, args: &Args, scores_gib: f64) -> Option<String> {
    let share = super::variants::scores_fraction(attention, args.backend.name(), args.causal);
    let scores_gib = scores_gib * share;
    (scores_gib > args.max_quadratic_gib).then(|| {
        format!(
            "skipped: its score matrices need about {scores_gib:.1} GiB (--max-quadratic-gib {})",
            args.max_quadratic_gib
        )
    })
}

/// What both benchmark commands set up before their cases: the release harness, the attentions,
/// the thread count given to PyTorch, the per-case time limit and the PyTorch script.
pub(crate) struct Session {
    /// The harness binary.
    pub harness: Harness,
    /// The attentions, resolved from the command line.
    pub names: Vec<lra_runs::AttentionName>,
    /// The threads PyTorch is given (the machine's).
    pub threads: usize,
    /// The time limit of one process.
    pub timeout: Duration,
    /// The PyTorch side's script, if the benchmark has one.
    pub script: Option<PathBuf>,
}

impl Session {
    /// Builds the harness (or copies the one given) and resolves the attentions `benchmark` measures.
    fn start(args: &Args, benchmark: &impl Benchmark) -> Result<Self> {
        let harness = harness(args.harness.as_deref(), args.backend)?;
        let names = resolve_attentions(&args.attentions, &harness, benchmark.causal_only())?;
        Ok(Session {
            harness,
            names,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            timeout: Duration::from_secs(args.timeout),
            script: benchmark
                .script()
                .map(|script| workspace_root().join("bench").join(script)),
        })
    }
}

/// The report files `<out>/<benchmark>-<backend>.{json,md,svg}`, the preset named after `lra`
/// where it is not the `lra` preset (`lra-small-flex`) and the task too where it is not the Text
/// task (`lra-listops-tiny-flex`), so reports of two presets or tasks sit side by side; an existing one is an error naming it unless `--replace` (checked before anything is
/// measured).
pub(crate) fn report_stem(args: &Args, benchmark: &str) -> Result<PathBuf> {
    let name = match benchmark {
        "lra" if args.task != "text" => {
            format!("lra-{}-{}-{}", args.task, args.preset, args.backend)
        }
        "lra" if args.preset != "lra" => format!("lra-{}-{}", args.preset, args.backend),
        _ => format!("{benchmark}-{}", args.backend),
    };
    let stem = args.out.join(name);
    if !args.replace {
        let paths = ["json", "md", "svg"].map(|extension| stem.with_extension(extension));
        refuse_replacing(&paths, ", or choose another --out")?;
    }
    Ok(stem)
}

/// Refuses output files that already exist (without `--replace`), before anything is measured
/// or drawn: the error names the first and says `--replace`, then `alternative`.
pub(crate) fn refuse_replacing(paths: &[PathBuf], alternative: &str) -> Result<()> {
    match paths.iter().find(|p| std::fs::symlink_metadata(p).is_ok()) {
        Some(path) => anyhow::bail!(
            "{} already exists; pass --replace to write over it{alternative}",
            path.display()
        ),
        None => Ok(()),
    }
}

/// Writes the report's JSON ([`report_stem`]) with the machine and setup, renders its markdown
/// and SVG beside it, and prints the markdown.
fn finish(args: &Args, benchmark: &str, setup: Value, cases: Vec<Value>) -> Result<()> {
    // A report of failures would replace a real one with nothing: refused.
    let measured = |c: &Value| {
        ["ours", "torch"]
            .iter()
            .any(|side| c[side]["error"].is_null() && c[side].is_object())
    };
    if !cases.iter().any(measured) {
        anyhow::bail!(
            "no case was measured (each failed or was skipped, above); no report written"
        );
    }
    let torch_version = cases
        .iter()
        .find_map(|c| c["torch"]["torch"].as_str().map(String::from));
    let report = json!({
        "benchmark": benchmark,
        "backend": args.backend,
        "machine": machine(),
        "threads": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "torch": torch_version,
        "setup": setup,
        "cases": cases,
    });
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let stem = report_stem(args, benchmark)?;
    lra_runs::write_atomic(
        &stem.with_extension("json"),
        serde_json::to_string_pretty(&report)?.as_bytes(),
    )?;
    let markdown = super::report::render_files(&stem.with_extension("json"))?;
    println!("{markdown}");
    println!("wrote {}.{{json,md,svg}}", stem.display());
    Ok(())
}

/// The machine a report was measured on, and the commit.
fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let mut commit = git(&["rev-parse", "--short", "HEAD"]);
    if !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty() {
        commit.push_str("-dirty");
    }
    let gpu = Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|name| !name.is_empty());
    json!({"cpu": cpu, "cores": cores, "memory_gib": (mem_gib * 10.0).round() / 10.0, "gpu": gpu, "commit": commit})
}

/// The arguments both sides of every case take: the attention, the length, the batch and the
/// warm-up; each benchmark adds its own after them.
pub(crate) fn case_args(name: &str, n: usize, args: &Args) -> Vec<String> {
    strings(&[
        "--attention",
        name,
        "--n",
        &n.to_string(),
        "--batch",
        &args.batch.to_string(),
        "--warmup",
        &args.warmup.to_string(),
    ])
}

/// A number of a measurement, NaN where it is missing (as the progress lines show it).
pub(crate) fn figure(measured: &Value, key: &str) -> f64 {
    measured[key].as_f64().unwrap_or(f64::NAN)
}

/// Owned copies of command-line arguments.
pub(crate) fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Args;

    /// Reports of two presets do not share a name; the `lra` preset's keeps the historic one.
    #[test]
    fn reports_are_named_by_benchmark_preset_and_backend() {
        let dir = std::env::temp_dir().join(format!("xtask-report-names-{}", std::process::id()));
        let mut args = Args {
            out: dir.clone(),
            ..Args::lra()
        };
        assert_eq!(report_stem(&args, "lra").unwrap(), dir.join("lra-flex"));
        assert_eq!(
            report_stem(&args, "attention").unwrap(),
            dir.join("attention-flex")
        );
        args.preset = "small".into();
        assert_eq!(
            report_stem(&args, "lra").unwrap(),
            dir.join("lra-small-flex")
        );
        args.task = "listops".into();
        assert_eq!(
            report_stem(&args, "lra").unwrap(),
            dir.join("lra-listops-small-flex")
        );
    }
}
