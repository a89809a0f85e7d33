//! `cargo xtask bench attention`: forward and forward + backward time and peak memory of every
//! attention at doubling lengths, on one backend, beside PyTorch's implementations measured in the
//! same run on the same machine; tables in the Linformer paper's layout (speed-up and memory
//! saving over softmax), the ratio ours / PyTorch, the growth per doubling of n, JSON and an SVG.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use lra_runs::BackendKind;

use crate::harness::{Harness, build_harness, resolve_attentions, workspace_root};

/// `cargo xtask bench ...`.
#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// pip-installs the PyTorch side: torch 2.9.0, einops, linformer, performer-pytorch,
    /// nystrom-attention.
    Setup,
    /// Forward and forward + backward time and peak memory of each attention at doubling lengths,
    /// ours and PyTorch's: one process per (attention, n), medians of --reps timed runs after
    /// --warmup; --rounds passes over all the cases, each figure the median over them (a slow
    /// spell of a shared machine then lands in one round of a case). Softmax-style cases whose
    /// score matrices would need more than --max-quadratic-gib are skipped and marked so
    /// (composed softmax: not on flex or tch, where the fused kernels need memory linear in n).
    /// With --causal: causal masking (ours only, the variants that support it), written as
    /// attention-causal-<backend>.{json,md,svg}.
    Attention(BenchFlags),
    /// LRA's efficiency protocol: training steps per second and peak memory of the Text task's
    /// model (the preset's, at each length) with each attention; one process per case, --rounds
    /// passes as for `attention`. Writes lra-<backend>.{json,md,svg} for the `lra` preset,
    /// lra-<preset>-<backend>.{json,md,svg} for another.
    Lra(BenchFlags),
    /// Re-renders the markdown and SVG of a results JSON (after a change of layout).
    Report {
        /// bench/results/<name>.json
        path: PathBuf,
    },
}

/// The flags of `bench attention` and `bench lra`.
#[derive(clap::Args, Debug)]
pub struct BenchFlags {
    /// Burn backend, compiled in through the burn-lra feature of that name.
    #[arg(long, value_enum, default_value_t = BackendKind::Flex)]
    backend: BackendKind,
    /// Registry names, comma-separated, or all (the default).
    #[arg(long, value_delimiter = ',')]
    attention: Vec<String>,
    /// Sequence lengths [attention: 512,1024,...,16384; lra: 1024,2048,3072,4096].
    #[arg(long, value_delimiter = ',')]
    lengths: Option<Vec<usize>>,
    /// Sequences per batch [attention: 1; lra: 32].
    #[arg(long)]
    batch: Option<usize>,
    /// Heads (`attention`).
    #[arg(long, default_value_t = 8)]
    heads: usize,
    /// Model width (`attention`).
    #[arg(long, default_value_t = 512)]
    d_model: usize,
    /// Timed runs per case.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
    /// Untimed runs before them.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Passes over all the cases; each figure is the median over them.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    rounds: u64,
    /// Causal masking (`attention`; ours only).
    #[arg(long)]
    causal: bool,
    /// Ours only, without the PyTorch side.
    #[arg(long)]
    no_torch: bool,
    /// Skip score-matrix cases needing more than this many GiB.
    #[arg(long, default_value_t = 6.0)]
    max_quadratic_gib: f64,
    /// Time limit of one case, in seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Text-task preset (`lra`).
    #[arg(long, default_value = "lra")]
    preset: String,
    /// Where results are written.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Write over an existing report of the same benchmark and backend in `--out` (without it,
    /// an existing report is an error, raised before anything is measured).
    #[arg(long)]
    replace: bool,
}

impl BenchFlags {
    /// The settings, with `defaults`' lengths and batch where the flags leave them out; a size
    /// of 0 is an error naming its flag.
    fn resolve(self, defaults: Args) -> Result<Args> {
        let sizes = [
            (
                "--lengths",
                self.lengths.iter().flatten().copied().min().unwrap_or(1),
            ),
            ("--batch", self.batch.unwrap_or(1)),
            ("--heads", self.heads),
            ("--d-model", self.d_model),
        ];
        if let Some((flag, _)) = sizes.iter().find(|(_, n)| *n == 0) {
            anyhow::bail!("`{flag}` must be at least 1");
        }
        Ok(Args {
            backend: self.backend,
            attentions: self.attention,
            lengths: self.lengths.unwrap_or(defaults.lengths),
            batch: self.batch.unwrap_or(defaults.batch),
            heads: self.heads,
            d_model: self.d_model,
            reps: self.reps as usize,
            warmup: self.warmup,
            rounds: self.rounds as usize,
            torch: !self.no_torch,
            max_quadratic_gib: self.max_quadratic_gib,
            timeout: self.timeout,
            out: self.out,
            replace: self.replace,
            preset: self.preset,
            causal: self.causal,
        })
    }
}

/// The PyTorch packages of the comparison.
const PIP_PACKAGES: &[&str] = &[
    "torch==2.9.0",
    "numpy",
    "einops",
    "linformer",
    "performer-pytorch",
    "nystrom-attention",
    "local-attention",
    "reformer-pytorch",
    "sinkhorn-transformer",
    "transformers",
];

/// Attentions with a PyTorch counterpart in `bench/torch_attention.py`.
const TORCH_VARIANTS: &[&str] = &[
    "softmax",
    "linear",
    "efficient",
    "linformer",
    "performer",
    "performer-relu",
    "nystrom",
    "local",
    "reformer",
    "sinkhorn",
    "longformer",
    "bigbird",
];

/// Variants whose memory grows with n² (they keep an n × n score matrix per head) where they
/// are composed from tensor operations.
const QUADRATIC: &[&str] = &["softmax"];

/// Variants that keep n × n weights on every backend (no fused form).
const QUADRATIC_EVERYWHERE: &[&str] = &["synthesizer-dense"];

/// Whether `attention` keeps n × n score matrices on `backend`: softmax does not on `flex` nor on
/// `tch` (CPU), where it runs fused (its memory grows with n), forward and backward; the dense
/// Synthesizer does everywhere.
fn stores_scores(attention: &str, backend: &str) -> bool {
    QUADRATIC_EVERYWHERE.contains(&attention)
        || (QUADRATIC.contains(&attention) && !["flex", "tch"].contains(&backend))
}

/// Why `attention` is skipped when its stored score matrices would need `scores_gib`, if it is.
fn quadratic_skip(attention: &str, args: &Args, scores_gib: f64) -> Option<String> {
    (stores_scores(attention, args.backend.name()) && scores_gib > args.max_quadratic_gib).then(|| {
        format!(
            "skipped: its score matrices need about {scores_gib:.1} GiB (--max-quadratic-gib {})",
            args.max_quadratic_gib
        )
    })
}

/// Parameters used for both sides, so that the two implementations do the same work.
fn params(attention: &str) -> Value {
    match attention {
        "linformer" | "linformer-linear" => json!({"k": 256}),
        "performer" => json!({"n_features": 256}),
        "nystrom" => json!({"n_landmarks": 64}),
        // sinkhorn-transformer needs lengths divisible by its blocks: 64 divides the powers of
        // two the benchmark runs (LRA's 50 does not).
        "sinkhorn" => json!({"block_size": 64}),
        "reformer" => json!({"chunk_len": 64, "n_hashes": 2}),
        "local" => json!({"block_size": 50}),
        "longformer" => json!({"window": 512}),
        "bigbird" => json!({"block_size": 64, "random_blocks": 3}),
        _ => json!({}),
    }
}

struct Args {
    /// Write over an existing report.
    replace: bool,
    backend: BackendKind,
    /// Registry names; empty: all.
    attentions: Vec<String>,
    lengths: Vec<usize>,
    batch: usize,
    heads: usize,
    d_model: usize,
    reps: usize,
    warmup: usize,
    /// Passes over all the cases; each figure is the median over them.
    rounds: usize,
    torch: bool,
    max_quadratic_gib: f64,
    timeout: u64,
    out: PathBuf,
    /// Text-task preset of `bench lra`.
    preset: String,
    /// `bench attention` with causal masking (ours only: the variants that support it).
    causal: bool,
}

impl Args {
    /// The defaults of `bench attention`: the Linformer paper's lengths, one sequence.
    fn attention() -> Self {
        Args {
            backend: BackendKind::Flex,
            attentions: Vec::new(),
            lengths: (0..6).map(|i| 512 << i).collect(),
            batch: 1,
            heads: 8,
            d_model: 512,
            reps: 3,
            warmup: 1,
            rounds: 3,
            torch: true,
            max_quadratic_gib: 6.0,
            timeout: 600,
            out: PathBuf::from("bench/results"),
            replace: false,
            preset: "lra".into(),
            causal: false,
        }
    }

    /// The defaults of `bench lra`: LRA's Table 2 (lengths 1K to 4K, batch 32).
    fn lra() -> Self {
        Args {
            lengths: vec![1024, 2048, 3072, 4096],
            batch: 32,
            ..Self::attention()
        }
    }
}

/// Entry point of `cargo xtask bench ...`.
pub fn bench(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Setup => setup(),
        BenchCommand::Attention(flags) => attention(&flags.resolve(Args::attention())?),
        BenchCommand::Lra(flags) => lra(&flags.resolve(Args::lra())?),
        BenchCommand::Report { path } => {
            render_files(&path)?;
            println!("re-rendered {} as .md and .svg", path.display());
            Ok(())
        }
    }
}

fn setup() -> Result<()> {
    let status = Command::new("python3")
        .args(["-m", "pip", "install"])
        .args(PIP_PACKAGES)
        .status()
        .context("cannot run python3 -m pip")?;
    if !status.success() {
        bail!("pip install {} failed", PIP_PACKAGES.join(" "));
    }
    Ok(())
}

/// Runs `cmd` with a time limit; its last stdout line parsed as JSON, or why there is none.
fn run_case(mut cmd: Command, timeout: Duration) -> std::result::Result<Value, String> {
    let out_path = std::env::temp_dir().join(format!("xtask-bench-{}.out", std::process::id()));
    let err_path = out_path.with_extension("err");
    let stdout = std::fs::File::create(&out_path).map_err(|e| e.to_string())?;
    let stderr = std::fs::File::create(&err_path).map_err(|e| e.to_string())?;
    let mut child = cmd
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("cannot start: {e}"))?;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("timed out after {} s", timeout.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = std::fs::read_to_string(&out_path).unwrap_or_default();
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    if !status.success() {
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(format!("failed ({status}): {last}"));
    }
    out.lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| "printed no result".to_string())
}

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

/// What both benchmark commands set up before their cases: the release harness, the attentions,
/// the thread count given to PyTorch, the per-case time limit and the PyTorch script.
struct Session {
    harness: Harness,
    names: Vec<String>,
    threads: usize,
    timeout: Duration,
    script: PathBuf,
}

impl Session {
    fn start(args: &Args, script: &str) -> Result<Self> {
        let harness = build_harness(args.backend)?;
        let names = resolve_attentions(&args.attentions, &harness)?;
        Ok(Session {
            harness,
            names,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            timeout: Duration::from_secs(args.timeout),
            script: workspace_root().join("bench").join(script),
        })
    }
}

fn attention(args: &Args) -> Result<()> {
    report_stem(args, "attention")?;
    let Session {
        harness,
        names,
        threads,
        timeout,
        script,
    } = Session::start(args, "torch_attention.py")?;
    let mut cases = Vec::new();
    for name in &names {
        for &n in &args.lengths {
            let common = strings(&[
                "--attention",
                name,
                "--n",
                &n.to_string(),
                "--batch",
                &args.batch.to_string(),
                "--heads",
                &args.heads.to_string(),
                "--d-model",
                &args.d_model.to_string(),
                "--reps",
                &args.reps.to_string(),
                "--warmup",
                &args.warmup.to_string(),
                "--params",
                &params(name).to_string(),
            ]);
            // Forward + backward keeps about three n × n tensors per head.
            // In floating point: the product of sizes may pass 2^64.
            let scores_gib = 3.0 * args.batch as f64 * args.heads as f64 * (n as f64).powi(2) * 4.0
                / (1u64 << 30) as f64;
            let ours = match quadratic_skip(name, args, scores_gib) {
                Some(reason) => Err(reason),
                None => Ok(Invocation::new(
                    harness.as_ref(),
                    &bench_attention_args(args.backend.name(), args.causal),
                    &common,
                )),
            };
            // The PyTorch side is measured without masks only.
            let torch_side = args.torch && !args.causal;
            let torch = (torch_side && TORCH_VARIANTS.contains(&name.as_str())).then(|| {
                let script = script.to_string_lossy();
                Invocation::new(
                    "python3".as_ref(),
                    &[&script, "--threads", &threads.to_string()],
                    &common,
                )
            });
            cases.push(Case {
                name: name.clone(),
                n,
                params: params(name),
                ours,
                torch,
            });
        }
    }
    let cases = run_rounds(cases, args.rounds, timeout, |v| {
        format!(
            "fwd {:.1} ms, fwd+bwd {:.1} ms, peak {:.0} MiB",
            v["forward_ms"].as_f64().unwrap_or(f64::NAN),
            v["forward_backward_ms"].as_f64().unwrap_or(f64::NAN),
            v["peak_mib"].as_f64().unwrap_or(f64::NAN)
        )
    });
    let setup = json!({
        "batch": args.batch, "heads": args.heads, "d_model": args.d_model,
        "reps": args.reps, "warmup": args.warmup, "rounds": args.rounds, "lengths": args.lengths,
        "causal": args.causal,
    });
    let benchmark = if args.causal {
        "attention-causal"
    } else {
        "attention"
    };
    finish(args, benchmark, setup, cases)
}

/// The harness's `bench-attention` subcommand and its flags.
fn bench_attention_args(backend: &str, causal: bool) -> Vec<&str> {
    let mut args = vec!["bench-attention", "--backend", backend];
    if causal {
        args.push("--causal");
    }
    args
}

/// LRA's Table 2 (Tay et al. 2021; TPU v3, batch 32, Text task): steps per second and peak
/// memory in GB at 1K, 2K, 3K, 4K, as quoted in docs/lra.md (the LRA paper's Table 2).
const LRA_TABLE2: &[(&str, [f64; 4], [f64; 4])] = &[
    (
        "Transformer",
        [8.1, 4.9, 2.3, 1.4],
        [0.85, 2.65, 5.51, 9.48],
    ),
    ("Linformer", [9.3, 9.1, 8.5, 7.7], [0.37, 0.55, 0.99, 0.99]),
    ("Performer", [9.5, 9.4, 8.7, 8.0], [0.37, 0.59, 0.82, 1.06]),
    (
        "Linear Trans.",
        [9.1, 9.3, 8.6, 7.8],
        [0.37, 0.57, 0.80, 1.03],
    ),
];

fn lra(args: &Args) -> Result<()> {
    report_stem(args, "lra")?;
    let Session {
        harness,
        names,
        threads,
        timeout,
        script,
    } = Session::start(args, "torch_lra.py")?;
    let mut cases = Vec::new();
    for name in &names {
        for &n in &args.lengths {
            let common = strings(&[
                "--attention",
                name,
                "--n",
                &n.to_string(),
                "--batch",
                &args.batch.to_string(),
                "--warmup",
                &args.warmup.to_string(),
                "--steps",
                &args.reps.to_string(),
            ]);
            let mut describe = Command::new(&harness);
            describe
                .args(["bench-train", "--describe", "--preset", &args.preset])
                .args(["--backend", args.backend.name()])
                .args(&common);
            let described =
                run_case(describe, timeout).map_err(|e| anyhow::anyhow!("{name} at n={n}: {e}"))?;
            let model = &described["model"];
            let (layers, heads) = (
                model["n_layers"].as_u64().unwrap_or(1) as f64,
                model["n_heads"].as_u64().unwrap_or(1) as f64,
            );
            // Training keeps about three n × n tensors per head and layer for the backward.
            let scores_gib = 3.0 * layers * heads * args.batch as f64 * (n as f64).powi(2) * 4.0
                / (1u64 << 30) as f64;
            let ours = match quadratic_skip(name, args, scores_gib) {
                Some(reason) => Err(reason),
                None => Ok(Invocation::new(
                    harness.as_ref(),
                    &[
                        "bench-train",
                        "--preset",
                        &args.preset,
                        "--backend",
                        args.backend.name(),
                    ],
                    &common,
                )),
            };
            let torch = (args.torch && TORCH_VARIANTS.contains(&name.as_str())).then(|| {
                let script = script.to_string_lossy();
                Invocation::new(
                    "python3".as_ref(),
                    &[
                        &script,
                        "--threads",
                        &threads.to_string(),
                        "--model",
                        &described["model"].to_string(),
                        "--optimizer",
                        &described["optimizer"].to_string(),
                        "--params",
                        &described["params"].to_string(),
                    ],
                    &common,
                )
            });
            cases.push(Case {
                name: name.clone(),
                n,
                params: described["params"].clone(),
                ours,
                torch,
            });
        }
    }
    let cases = run_rounds(cases, args.rounds, timeout, |v| {
        format!(
            "{:.2} steps/s ({:.0} ms/step), peak {:.0} MiB",
            v["steps_per_s"].as_f64().unwrap_or(f64::NAN),
            v["step_ms"].as_f64().unwrap_or(f64::NAN),
            v["peak_mib"].as_f64().unwrap_or(f64::NAN)
        )
    });
    let setup = json!({
        "task": "text", "preset": args.preset, "batch": args.batch,
        "reps": args.reps, "warmup": args.warmup, "rounds": args.rounds, "lengths": args.lengths,
    });
    finish(args, "lra", setup, cases)
}

/// The report files `<out>/<benchmark>-<backend>.{json,md,svg}`, the preset named after `lra`
/// where it is not the `lra` preset (`lra-small-flex`), so reports of two presets sit side by
/// side; an existing one is an error naming it unless `--replace` (checked before anything is
/// measured).
fn report_stem(args: &Args, benchmark: &str) -> Result<PathBuf> {
    let name = match benchmark {
        "lra" if args.preset != "lra" => format!("lra-{}-{}", args.preset, args.backend),
        _ => format!("{benchmark}-{}", args.backend),
    };
    let stem = args.out.join(name);
    if !args.replace {
        for extension in ["json", "md", "svg"] {
            let path = stem.with_extension(extension);
            if std::fs::symlink_metadata(&path).is_ok() {
                anyhow::bail!(
                    "{} already exists; pass --replace to write over it, or choose another --out",
                    path.display()
                );
            }
        }
    }
    Ok(stem)
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
    write(
        &stem.with_extension("json"),
        &serde_json::to_string_pretty(&report)?,
    )?;
    let markdown = render_files(&stem.with_extension("json"))?;
    println!("{markdown}");
    println!("wrote {}.{{json,md,svg}}", stem.display());
    Ok(())
}

/// Owned copies of command-line arguments.
fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// One side of a case as a command line, kept as data: each round starts a fresh process.
struct Invocation {
    program: PathBuf,
    args: Vec<String>,
}

impl Invocation {
    /// `program` with `args`, then the arguments `common` to both sides of the case.
    fn new(program: &std::ffi::OsStr, args: &[&str], common: &[String]) -> Self {
        let mut all = strings(args);
        all.extend_from_slice(common);
        Invocation {
            program: program.into(),
            args: all,
        }
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        cmd
    }
}

/// One benchmark case: an attention at one length, our side (or why it is skipped) and
/// PyTorch's.
struct Case {
    name: String,
    n: usize,
    params: Value,
    ours: std::result::Result<Invocation, String>,
    torch: Option<Invocation>,
}

/// Runs every case `rounds` times, one round through all the cases after another, so that a
/// slow spell of the machine lands in one round of a case rather than in all of its
/// repetitions; prints each measurement (`show` formats one) and returns the report's cases:
/// per side, the median over rounds of every number, and each round's measurement.
fn run_rounds(
    cases: Vec<Case>,
    rounds: usize,
    timeout: Duration,
    show: impl Fn(&Value) -> String,
) -> Vec<Value> {
    type Measured = std::result::Result<Value, String>;
    let text = |r: &Measured| match r {
        Ok(v) => show(v),
        Err(e) => e.clone(),
    };
    let mut measured: Vec<(Vec<Measured>, Vec<Measured>)> =
        cases.iter().map(|_| Default::default()).collect();
    for round in 1..=rounds {
        eprintln!("-- round {round} of {rounds}");
        for (case, (ours, torch)) in cases.iter().zip(&mut measured) {
            let mine = match &case.ours {
                Ok(ours) => run_case(ours.command(), timeout),
                Err(reason) if round == 1 => Err(reason.clone()),
                Err(_) => continue,
            };
            eprintln!("{:<16} n={:<6} ours: {}", case.name, case.n, text(&mine));
            ours.push(mine);
            if let Some(invocation) = &case.torch {
                let theirs = run_case(invocation.command(), timeout);
                eprintln!("{:<16} {:<8} torch: {}", "", "", text(&theirs));
                torch.push(theirs);
            }
        }
    }
    cases
        .iter()
        .zip(measured)
        .map(|(case, (ours, torch))| {
            json!({
                "attention": case.name,
                "n": case.n,
                "params": case.params,
                "ours": combine(ours),
                "torch": case.torch.as_ref().map(|_| combine(torch)),
            })
        })
        .collect()
}

/// One side of a case over its rounds: the first round's fields with every number replaced by
/// its median over the rounds, and the rounds themselves under `rounds`; an error if any round
/// failed (a case that fails now and then is not reported as measured).
fn combine(rounds: Vec<std::result::Result<Value, String>>) -> Value {
    let values = match rounds
        .into_iter()
        .collect::<std::result::Result<Vec<_>, _>>()
    {
        Ok(values) if !values.is_empty() => values,
        Ok(_) => return json!({"error": "not run"}),
        Err(e) => return json!({"error": e}),
    };
    let mut combined = values[0].clone();
    if let Some(fields) = combined.as_object_mut() {
        for (key, value) in fields.iter_mut() {
            if value.is_number() && values.iter().any(|v| v[key] != *value) {
                let numbers: Vec<f64> = values.iter().filter_map(|v| v[key].as_f64()).collect();
                if numbers.len() == values.len() {
                    *value = json!(median(numbers));
                }
            }
        }
        fields.insert("rounds".into(), Value::Array(values));
    }
    combined
}

/// The median (the mean of the middle two for an even count).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let m = xs.len() / 2;
    if xs.len() % 2 == 1 {
        xs[m]
    } else {
        (xs[m - 1] + xs[m]) / 2.0
    }
}

/// A markdown table header: `first`, then one column per length.
fn table_header(md: &mut String, first: &str, lengths: &[usize]) {
    md.push_str(&format!("| {first} |"));
    for n in lengths {
        md.push_str(&format!(" {n} |"));
    }
    md.push_str("\n|---|");
    for _ in lengths {
        md.push_str("---|");
    }
    md.push('\n');
}

/// One table row per name: `value(name, n)` in each length's column.
fn table_rows(
    md: &mut String,
    names: &[&String],
    lengths: &[usize],
    value: impl Fn(&str, usize) -> String,
) {
    for name in names {
        md.push_str(&format!("| {name} |"));
        for &n in lengths {
            md.push_str(&format!(" {} |", value(name, n)));
        }
        md.push('\n');
    }
    md.push('\n');
}

fn render_lra_markdown(report: &Value, names: &[String], lengths: &[usize]) -> String {
    let m = &report["machine"];
    let s = &report["setup"];
    let gpu = m["gpu"]
        .as_str()
        .map_or(String::new(), |g| format!(", GPU {g}"));
    let mut md = format!(
        "# LRA efficiency (Text task), backend `{}`\n\n{} ({} cores, {} GiB{gpu}), commit {}, {} \
         threads; PyTorch {}. The `{}` preset's Text model at each length, batch {}, full-length \
         random bytes, the preset's dropout on both sides (attention dropout on the weights of \
         softmax and linformer, the attentions with weights on both sides); time of a training \
         step (forward, \
         backward, AdamW): {}; peak memory \
         is the process's resident high-water mark above its level once the model was built \
         (Linux VmHWM - VmRSS). Our model applies its padding mask at every layer; the PyTorch \
         packages take none.\n\n",
        report["backend"].as_str().unwrap_or(""),
        m["cpu"].as_str().unwrap_or(""),
        m["cores"],
        m["memory_gib"],
        m["commit"].as_str().unwrap_or(""),
        report["threads"],
        report["torch"].as_str().unwrap_or("not measured"),
        s["preset"].as_str().unwrap_or(""),
        s["batch"],
        protocol(s, "steps"),
    );
    let all: Vec<&String> = names.iter().collect();
    let with_torch: Vec<&String> = names
        .iter()
        .filter(|n| TORCH_VARIANTS.contains(&n.as_str()))
        .collect();
    let others: Vec<&String> = names.iter().filter(|n| *n != "softmax").collect();
    md.push_str("## Training steps per second (ours)\n\n");
    table_header(&mut md, "attention \\ n", lengths);
    table_rows(&mut md, &all, lengths, |name, n| {
        cell(metric(report, "ours", name, n, "steps_per_s"), 2)
    });
    md.push_str("## Peak memory, MiB (ours)\n\n");
    table_header(&mut md, "attention \\ n", lengths);
    table_rows(&mut md, &all, lengths, |name, n| {
        cell(metric(report, "ours", name, n, "peak_mib"), 0)
    });
    md.push_str(
        "## Relative to softmax (ours), as in LRA's Table 2\n\nEach cell: steps/s(variant) / \
         steps/s(softmax), then memory(variant) / memory(softmax).\n\n",
    );
    table_header(&mut md, "attention \\ n", lengths);
    table_rows(&mut md, &others, lengths, |name, n| {
        let speed = metric(report, "ours", name, n, "steps_per_s")
            .zip(metric(report, "ours", "softmax", n, "steps_per_s"))
            .map(|(a, b)| a / b);
        let memory = metric(report, "ours", name, n, "peak_mib")
            .zip(metric(report, "ours", "softmax", n, "peak_mib"))
            .map(|(a, b)| a / b);
        match (speed, memory) {
            (Some(t), Some(m)) => format!("{t:.2}× / {m:.2}×"),
            _ => "–".into(),
        }
    });
    md.push_str("## PyTorch: training steps per second\n\n");
    table_header(&mut md, "attention \\ n", lengths);
    table_rows(&mut md, &with_torch, lengths, |name, n| {
        cell(metric(report, "torch", name, n, "steps_per_s"), 2)
    });
    md.push_str("## Ours / PyTorch, time per training step (≤ 1 means ours is faster)\n\n");
    table_header(&mut md, "attention \\ n", lengths);
    table_rows(&mut md, &with_torch, lengths, |name, n| {
        let ratio = metric(report, "ours", name, n, "step_ms")
            .zip(metric(report, "torch", name, n, "step_ms"))
            .map(|(a, b)| a / b);
        cell(ratio, 2)
    });
    md.push_str(
        "## For reference: LRA's Table 2 (Tay et al. 2021, TPU v3, batch 32)\n\nSteps per \
         second, then peak memory in GB, at 1K / 2K / 3K / 4K; other hardware, so compare the \
         shapes (how each row falls with n), not the figures.\n\n| model | steps/s | peak GB |\n\
         |---|---|---|\n",
    );
    for (model, steps, gb) in LRA_TABLE2 {
        let join = |xs: &[f64; 4], digits: usize| {
            xs.iter()
                .map(|x| format!("{x:.digits$}"))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        md.push_str(&format!(
            "| {model} | {} | {} |\n",
            join(steps, 1),
            join(gb, 2)
        ));
    }
    md.push_str(&not_measured(report));
    md
}

/// How a report's figures were taken, from its setup: repetitions, warm-up, rounds and
/// processes.
fn protocol(setup: &Value, what: &str) -> String {
    let per_round = format!(
        "median of {} {what} after {} warm-up {what}",
        setup["reps"], setup["warmup"]
    );
    match setup["rounds"].as_u64() {
        Some(rounds) if rounds > 1 => format!(
            "the median over {rounds} rounds (passes over all the cases) of the {per_round}, one \
             process per case and round"
        ),
        _ => format!("{per_round}, one process per case"),
    }
}

/// Renders `<stem>.md` and `<stem>.svg` beside a results JSON; returns the markdown.
fn render_files(path: &Path) -> Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let report: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a benchmark report", path.display()))?;
    let mut names: Vec<String> = Vec::new();
    for case in report["cases"].as_array().into_iter().flatten() {
        if let Some(name) = case["attention"].as_str()
            && !names.iter().any(|n| n == name)
        {
            names.push(name.to_string());
        }
    }
    let lengths: Vec<usize> = report["setup"]["lengths"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_u64().map(|n| n as usize))
        .collect();
    let (markdown, panels) = match report["benchmark"].as_str() {
        Some("attention" | "attention-causal") => (
            render_markdown(&report, &names, &lengths),
            [
                ("forward_backward_ms", "forward + backward time (ms)"),
                ("peak_mib", "peak memory (MiB)"),
            ],
        ),
        Some("lra") => (
            render_lra_markdown(&report, &names, &lengths),
            [
                ("step_ms", "time per training step (ms)"),
                ("peak_mib", "peak memory (MiB)"),
            ],
        ),
        _ => bail!(
            "{}: `benchmark` is neither attention, attention-causal nor lra",
            path.display()
        ),
    };
    write(&path.with_extension("md"), &markdown)?;
    write(
        &path.with_extension("svg"),
        &render_svg(&report, &names, &lengths, panels),
    )?;
    Ok(markdown)
}

/// The "Not measured" section: every case that failed, timed out or was skipped, and why.
fn not_measured(report: &Value) -> String {
    let skipped: Vec<String> = report["cases"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| {
            ["ours", "torch"].into_iter().filter_map(move |side| {
                c[side]["error"].as_str().map(|e| {
                    format!(
                        "- {} n={} ({side}): {e}",
                        c["attention"].as_str().unwrap_or(""),
                        c["n"]
                    )
                })
            })
        })
        .collect();
    if skipped.is_empty() {
        String::new()
    } else {
        format!("\n## Not measured\n\n{}\n", skipped.join("\n"))
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    lra_runs::write_atomic(path, text.as_bytes())
}

fn case<'a>(report: &'a Value, name: &str, n: usize) -> Option<&'a Value> {
    report["cases"]
        .as_array()?
        .iter()
        .find(|c| c["attention"] == name && c["n"] == n)
}

fn metric(report: &Value, side: &str, name: &str, n: usize, key: &str) -> Option<f64> {
    case(report, name, n)?[side][key].as_f64()
}

fn cell(x: Option<f64>, digits: usize) -> String {
    x.map_or("–".to_string(), |x| format!("{x:.digits$}"))
}

fn render_markdown(report: &Value, names: &[String], lengths: &[usize]) -> String {
    let m = &report["machine"];
    let s = &report["setup"];
    let mut md = format!(
        "# Attention efficiency{}, backend `{}`\n\n{} ({} cores, {} GiB), commit {}, {} threads; \
         PyTorch {}. Batch {}, {} heads, d_model {}; {}; peak memory is the process's resident high-water mark above its level before the first \
         input (Linux VmHWM - VmRSS).\n\n",
        if s["causal"].as_bool() == Some(true) {
            " with causal masking"
        } else {
            ""
        },
        report["backend"].as_str().unwrap_or(""),
        m["cpu"].as_str().unwrap_or(""),
        m["cores"],
        m["memory_gib"],
        m["commit"].as_str().unwrap_or(""),
        report["threads"],
        report["torch"].as_str().unwrap_or("not measured"),
        s["batch"],
        s["heads"],
        s["d_model"],
        protocol(s, "runs"),
    );
    let header = |md: &mut String, first: &str| {
        md.push_str(&format!("| {first} |"));
        for n in lengths {
            md.push_str(&format!(" {n} |"));
        }
        md.push_str("\n|---|");
        for _ in lengths {
            md.push_str("---|");
        }
        md.push('\n');
    };
    for (title, key) in [
        ("Forward + backward time, ms (ours)", "forward_backward_ms"),
        ("Forward time, ms (ours)", "forward_ms"),
        ("Peak memory, MiB (ours, forward + backward)", "peak_mib"),
    ] {
        md.push_str(&format!("## {title}\n\n"));
        header(&mut md, "attention \\ n");
        for name in names {
            md.push_str(&format!("| {name} |"));
            for &n in lengths {
                md.push_str(&format!(
                    " {} |",
                    cell(metric(report, "ours", name, n, key), 1)
                ));
            }
            md.push('\n');
        }
        md.push('\n');
    }
    md.push_str(
        "## Speed-up and memory saving over softmax (ours), as in the Linformer paper's table\n\n\
         Each cell: time(softmax) / time(variant) for forward + backward, then \
         memory(softmax) / memory(variant).\n\n",
    );
    header(&mut md, "attention \\ n");
    for name in names.iter().filter(|n| *n != "softmax") {
        md.push_str(&format!("| {name} |"));
        for &n in lengths {
            let ratio = |key| {
                Some(
                    metric(report, "ours", "softmax", n, key)?
                        / metric(report, "ours", name, n, key)?,
                )
            };
            md.push_str(&match (ratio("forward_backward_ms"), ratio("peak_mib")) {
                (Some(t), Some(m)) => format!(" {t:.2}× / {m:.2}× |"),
                _ => " – |".to_string(),
            });
        }
        md.push('\n');
    }
    md.push_str("\n## Ours / PyTorch, forward + backward time (≤ 1 means ours is faster)\n\n");
    header(&mut md, "attention \\ n");
    for name in names
        .iter()
        .filter(|n| TORCH_VARIANTS.contains(&n.as_str()))
    {
        md.push_str(&format!("| {name} |"));
        for &n in lengths {
            let ratio = metric(report, "ours", name, n, "forward_backward_ms")
                .zip(metric(report, "torch", name, n, "forward_backward_ms"))
                .map(|(a, b)| a / b);
            md.push_str(&format!(" {} |", cell(ratio, 2)));
        }
        md.push('\n');
    }
    // The long-sequence span over which linear cost is judged: from 2,048 to the longest n.
    let span = lengths
        .iter()
        .copied()
        .filter(|&n| n >= 2048)
        .fold(None, |acc: Option<(usize, usize)>, n| match acc {
            None => Some((n, n)),
            Some((lo, hi)) => Some((lo.min(n), hi.max(n))),
        })
        .filter(|(lo, hi)| hi > lo);
    md.push_str(
        "\n## Growth per doubling of n (ours, forward + backward): time, then memory\n\n\
         Linear cost shows as about 2×; quadratic as about 4×. The last column is the \
         per-doubling factor over the whole long-sequence span (the geometric mean of the \
         doublings in it), which one noisy timing cannot swing.\n\n",
    );
    md.push_str("| attention |");
    for w in lengths.windows(2) {
        md.push_str(&format!(" {}→{} |", w[0], w[1]));
    }
    if let Some((lo, hi)) = span {
        md.push_str(&format!(" {lo}→{hi}, per doubling |"));
    }
    md.push_str("\n|---|");
    for _ in lengths.windows(2) {
        md.push_str("---|");
    }
    if span.is_some() {
        md.push_str("---|");
    }
    md.push('\n');
    for name in names {
        md.push_str(&format!("| {name} |"));
        let growth = |from: usize, to: usize, key| {
            let ratio =
                metric(report, "ours", name, to, key)? / metric(report, "ours", name, from, key)?;
            Some(ratio.powf(1.0 / (to as f64 / from as f64).log2()))
        };
        for w in lengths.windows(2) {
            md.push_str(&format!(
                " {} / {} |",
                cell(growth(w[0], w[1], "forward_backward_ms"), 2),
                cell(growth(w[0], w[1], "peak_mib"), 2)
            ));
        }
        if let Some((lo, hi)) = span {
            md.push_str(&format!(
                " {} / {} |",
                cell(growth(lo, hi, "forward_backward_ms"), 2),
                cell(growth(lo, hi, "peak_mib"), 2)
            ));
        }
        md.push('\n');
    }
    md.push_str(&not_measured(report));
    md
}

/// Two log-log panels, time and memory against n, one line per attention (ours solid, PyTorch
/// dashed).
fn render_svg(
    report: &Value,
    names: &[String],
    lengths: &[usize],
    panels: [(&str, &str); 2],
) -> String {
    const W: f64 = 460.0;
    const H: f64 = 340.0;
    const PAD: f64 = 55.0;
    let colors = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
        "#bcbd22", "#17becf", "#393b79", "#637939", "#843c39", "#7b4173",
    ];
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n",
        2.0 * W + 170.0,
        H
    );
    let (n_min, n_max) = (
        *lengths.iter().min().unwrap_or(&1) as f64,
        *lengths.iter().max().unwrap_or(&2) as f64,
    );
    for (panel, (key, title)) in panels.into_iter().enumerate() {
        let x0 = panel as f64 * W;
        let values: Vec<f64> = names
            .iter()
            .flat_map(|name| lengths.iter().map(move |&n| (name, n)))
            .flat_map(|(name, n)| {
                ["ours", "torch"]
                    .into_iter()
                    .filter_map(move |side| metric(report, side, name, n, key))
            })
            .filter(|v| *v > 0.0)
            .collect();
        let lo = values
            .iter()
            .cloned()
            .fold(f64::INFINITY, f64::min)
            .max(1e-3);
        let hi = values.iter().cloned().fold(0.0, f64::max).max(lo * 10.0);
        let px =
            |n: f64| x0 + PAD + (n / n_min).ln() / (n_max / n_min).ln().max(1e-9) * (W - 2.0 * PAD);
        let py = |v: f64| H - PAD - (v / lo).ln() / (hi / lo).ln() * (H - 2.0 * PAD);
        svg.push_str(&format!(
            "<rect x=\"{:.1}\" y=\"{PAD}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"none\" stroke=\"#999\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{title} vs n (log-log)</text>\n",
            x0 + PAD,
            W - 2.0 * PAD,
            H - 2.0 * PAD,
            x0 + W / 2.0,
            PAD - 12.0
        ));
        for &n in lengths {
            svg.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{n}</text>\n",
                px(n as f64),
                H - PAD + 15.0
            ));
        }
        let mut tick = 10f64.powf(lo.log10().floor());
        while tick <= hi {
            if tick >= lo {
                svg.push_str(&format!(
                    "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
                    x0 + PAD - 4.0,
                    py(tick) + 4.0,
                    tick
                ));
            }
            tick *= 10.0;
        }
        for (i, name) in names.iter().enumerate() {
            let color = colors[i % colors.len()];
            for (side, dash) in [("ours", ""), ("torch", " stroke-dasharray=\"4 3\"")] {
                let points: Vec<String> = lengths
                    .iter()
                    .filter_map(|&n| {
                        metric(report, side, name, n, key)
                            .filter(|v| *v > 0.0)
                            .map(|v| format!("{:.1},{:.1}", px(n as f64), py(v)))
                    })
                    .collect();
                if points.len() > 1 {
                    svg.push_str(&format!(
                        "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\"{dash} points=\"{}\"/>\n",
                        points.join(" ")
                    ));
                }
            }
        }
    }
    for (i, name) in names.iter().enumerate() {
        let y = PAD + 14.0 * i as f64;
        svg.push_str(&format!(
            "<line x1=\"{:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{}\" stroke-width=\"2\"/><text x=\"{:.1}\" y=\"{:.1}\">{name}</text>\n",
            2.0 * W + 5.0,
            2.0 * W + 25.0,
            colors[i % colors.len()],
            2.0 * W + 30.0,
            y + 4.0
        ));
    }
    svg.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\">solid: ours, dashed: PyTorch</text>\n</svg>\n",
        2.0 * W + 5.0,
        PAD + 14.0 * names.len() as f64 + 10.0
    ));
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
