//! `cargo xtask bench ...`: the efficiency benchmarks, ours beside PyTorch's implementations
//! measured in the same run on the same machine.
//!
//! - [`attention`]: one attention layer's forward and forward + backward time and peak memory
//!   at doubling lengths (the Linformer paper's table);
//! - [`lra`]: a task model's training steps per second and peak memory (LRA's Table 2);
//! - [`decode`]: the time of one decoded token and its state's size at each position;
//! - [`protocol`]: what they share: a case per (attention, length), one process per side,
//!   the harness and PyTorch script, the report's files; [`rounds`]: passes over the cases and
//!   their medians;
//! - [`variants`]: every variant's benchmark facts in one table (its PyTorch counterpart, the
//!   parameters both sides use, whether it stores n × n scores);
//! - [`report`]: a report's markdown and SVG, rendered from its JSON.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use lra_runs::BackendKind;

pub(crate) mod attention;
pub(crate) mod decode;
pub(crate) mod lra;
pub(crate) mod protocol;
pub(crate) mod report;
pub(crate) mod rounds;
pub(crate) mod variants;

/// `cargo xtask bench ...`.
#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// pip-installs the PyTorch side: torch 2.9.0, einops and the attention packages compared
    /// (docs/benchmarks.md lists them).
    Setup,
    /// Forward and forward + backward time and peak memory of each attention at doubling lengths,
    /// ours and PyTorch's: one process per (attention, n), medians of --reps timed runs after
    /// --warmup; --rounds passes over all the cases, each figure the median over them (a slow
    /// spell of a shared machine then lands in one round of a case). Softmax-style cases whose
    /// score matrices would need more than --max-quadratic-gib are skipped and marked so
    /// (composed softmax: not on flex or tch, where the fused kernels need memory linear in n).
    /// With --causal: causal masking (the variants that support it; PyTorch's side where
    /// bench/torch_attention.py has the causal form), written as
    /// attention-causal-BACKEND.{json,md,svg}.
    Attention(BenchFlags),
    /// LRA's efficiency protocol: training steps per second and peak memory of a task's model
    /// (the Text task's by default; the preset's, at each length) with each attention; one
    /// process per case, --rounds passes as for `attention`. Writes lra-BACKEND.{json,md,svg}
    /// for the Text task's `lra` preset, lra-PRESET-BACKEND for another of its presets and
    /// lra-TASK-PRESET-BACKEND for another task.
    Lra(BenchFlags),
    /// What generating one more token costs at each position (--lengths: 100,1000,4000): the
    /// time of one decoding step after a prompt of n tokens and the size of the state it
    /// decodes from, for the attentions with a causal form (one process per case, --reps
    /// tokens each, --rounds passes as for `attention`); ours only. Writes
    /// decode-BACKEND.{json,md,svg}.
    Decode(BenchFlags),
    /// Re-renders the markdown and SVG of a results JSON (after a change of layout).
    Report {
        /// bench/results/NAME.json
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
    /// Sequence lengths [attention: 512,1024,...,16384; lra: 1024,2048,3072,4096; decode: the
    /// positions decoded at, 100,1000,4000].
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
    /// Timed runs per case [attention, lra: 3; decode: 20 tokens].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    reps: Option<u64>,
    /// Untimed runs before them.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Passes over all the cases; each figure is the median over them.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    rounds: u64,
    /// Causal masking (`attention`; PyTorch's side where its script has the causal form).
    #[arg(long)]
    causal: bool,
    /// Ours only, without the PyTorch side.
    #[arg(long)]
    no_torch: bool,
    /// The PyTorch side's device (`cpu`, or `cuda` beside `--backend wgpu` or `cuda` on an
    /// NVIDIA GPU); its times then wait for the GPU and its memory is torch's peak allocation.
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    torch_device: String,
    /// Skip score-matrix cases needing more than this many GiB.
    #[arg(long, default_value_t = 6.0)]
    max_quadratic_gib: f64,
    /// Time limit of one case, in seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// The task whose model is trained (`lra`).
    #[arg(long, default_value = "text")]
    task: String,
    /// The task's preset (`lra`).
    #[arg(long, default_value = "lra")]
    preset: String,
    /// Where results are written.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Write over an existing report of the same benchmark and backend in `--out` (without it,
    /// an existing report is an error, raised before anything is measured).
    #[arg(long)]
    replace: bool,
    /// A burn-lra binary built beforehand (with the backend's feature), instead of building one:
    /// on a machine without Rust, such as a GPU machine given the binaries built elsewhere.
    #[arg(long)]
    harness: Option<PathBuf>,
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
        // Every size and count through the harness's one bound (2^32 - 1), so that no sum or
        // product of them the cases form can wrap.
        let largest = |values: &[usize]| values.iter().copied().max().unwrap_or(0);
        for (flag, value) in [
            ("--lengths", largest(self.lengths.as_deref().unwrap_or(&[]))),
            ("--batch", self.batch.unwrap_or(1)),
            ("--heads", self.heads),
            ("--d-model", self.d_model),
            (
                "--reps",
                usize::try_from(self.reps.unwrap_or(1)).unwrap_or(usize::MAX),
            ),
            ("--warmup", self.warmup),
            (
                "--rounds",
                usize::try_from(self.rounds).unwrap_or(usize::MAX),
            ),
        ] {
            lra_runs::limits::check_size(flag, value, false)?;
        }
        Ok(Args {
            backend: self.backend,
            attentions: self.attention,
            lengths: self.lengths.unwrap_or(defaults.lengths),
            batch: self.batch.unwrap_or(defaults.batch),
            heads: self.heads,
            d_model: self.d_model,
            reps: self.reps.map_or(defaults.reps, |reps| reps as usize),
            warmup: self.warmup,
            rounds: self.rounds as usize,
            torch: !self.no_torch,
            torch_device: self.torch_device,
            max_quadratic_gib: self.max_quadratic_gib,
            timeout: self.timeout,
            out: self.out,
            replace: self.replace,
            task: self.task,
            preset: self.preset,
            causal: self.causal,
            harness: self.harness,
        })
    }
}

/// The settings of one benchmark command.
pub(crate) struct Args {
    /// Write over an existing report.
    pub(crate) replace: bool,
    pub(crate) backend: BackendKind,
    /// Registry names; empty: all.
    pub(crate) attentions: Vec<String>,
    pub(crate) lengths: Vec<usize>,
    pub(crate) batch: usize,
    pub(crate) heads: usize,
    pub(crate) d_model: usize,
    pub(crate) reps: usize,
    pub(crate) warmup: usize,
    /// Passes over all the cases; each figure is the median over them.
    pub(crate) rounds: usize,
    pub(crate) torch: bool,
    /// The PyTorch side's device (`cpu`, `cuda`).
    pub(crate) torch_device: String,
    pub(crate) max_quadratic_gib: f64,
    pub(crate) timeout: u64,
    pub(crate) out: PathBuf,
    /// The task of `bench lra`.
    pub(crate) task: String,
    /// The task's preset.
    pub(crate) preset: String,
    /// `bench attention` with causal masking (the variants that support it; PyTorch's side
    /// where bench/torch_attention.py has the causal form).
    pub(crate) causal: bool,
    /// A burn-lra binary built beforehand; `None`: build one.
    pub(crate) harness: Option<PathBuf>,
}

impl Args {
    /// A report's `setup`: the repetitions, warm-up, rounds and lengths every benchmark has, and
    /// `own`, the settings particular to it (a JSON object).
    pub(crate) fn setup(&self, own: serde_json::Value) -> serde_json::Value {
        let mut setup = serde_json::json!({
            "reps": self.reps, "warmup": self.warmup, "rounds": self.rounds,
            "lengths": self.lengths,
        });
        if let (Some(setup), serde_json::Value::Object(own)) = (setup.as_object_mut(), own) {
            setup.extend(own);
        }
        setup
    }

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
            torch_device: "cpu".into(),
            max_quadratic_gib: 6.0,
            timeout: 600,
            out: PathBuf::from("bench/results"),
            replace: false,
            task: "text".into(),
            preset: "lra".into(),
            causal: false,
            harness: None,
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

    /// The defaults of `bench decode`: one sequence at positions 100, 1,000 and 4,000, 20
    /// tokens a case.
    fn decode() -> Self {
        Args {
            lengths: vec![100, 1000, 4000],
            reps: 20,
            ..Self::attention()
        }
    }
}

/// Entry point of `cargo xtask bench ...`.
pub fn bench(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Setup => setup(),
        BenchCommand::Attention(flags) => {
            let args = flags.resolve(Args::attention())?;
            protocol::run(&attention::AttentionBenchmark { args: &args }, &args)
        }
        BenchCommand::Lra(flags) => {
            let args = flags.resolve(Args::lra())?;
            protocol::run(&lra::LraBenchmark { args: &args }, &args)
        }
        BenchCommand::Decode(flags) => {
            let args = flags.resolve(Args::decode())?;
            protocol::run(&decode::DecodeBenchmark { args: &args }, &args)
        }
        BenchCommand::Report { path } => {
            report::render_files(&path)?;
            println!("re-rendered {} as .md and .svg", path.display());
            Ok(())
        }
    }
}

/// `bench setup`: pip-installs the PyTorch side.
fn setup() -> Result<()> {
    let status = Command::new("python3")
        .args(["-m", "pip", "install"])
        .args(variants::PIP_PACKAGES)
        .status()
        .context("cannot run python3 -m pip")?;
    if !status.success() {
        bail!("pip install {} failed", variants::PIP_PACKAGES.join(" "));
    }
    Ok(())
}
