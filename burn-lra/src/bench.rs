//! One efficiency measurement of one attention at one length, in this process: the median time
//! of the forward pass and of forward + backward, and the process's peak resident memory during
//! them. `cargo xtask bench attention` runs one process per (attention, length) so that each
//! peak belongs to one case, and compares the variants with softmax and with PyTorch.

use std::time::Instant;

use anyhow::{Context, Result};
use burn::prelude::*;
use burn::tensor::Distribution;
use burn_attention::{AttentionConfig, AttentionInput};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::backend::BackendKind;

/// What to measure.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Attention, by registry name.
    #[arg(long)]
    pub attention: String,
    /// Sequence length.
    #[arg(long)]
    pub n: usize,
    /// Batch size.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Heads.
    #[arg(long, default_value_t = 8)]
    pub heads: usize,
    /// Model width.
    #[arg(long, default_value_t = 512)]
    pub d_model: usize,
    /// Timed repetitions (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Untimed warm-up repetitions.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Attention parameters as JSON, e.g. `{"k": 256}`.
    #[arg(long, default_value = "{}")]
    pub params: String,
    /// Backend.
    #[arg(long, value_enum, default_value_t = BackendKind::Flex)]
    pub backend: BackendKind,
}

/// One measurement, printed as a JSON line.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    /// Attention name.
    pub attention: String,
    /// Sequence length.
    pub n: usize,
    /// Median forward time, milliseconds.
    pub forward_ms: f64,
    /// Median forward + backward time, milliseconds.
    pub forward_backward_ms: f64,
    /// Peak resident memory of the process during the measurements minus the resident memory
    /// before the first input was made, MiB (Linux `VmHWM` - `VmRSS`).
    pub peak_mib: f64,
}

/// Reads a `kB` field of `/proc/self/status`.
fn proc_status_kib(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let m = xs.len() / 2;
    if xs.len() % 2 == 1 {
        xs[m]
    } else {
        (xs[m - 1] + xs[m]) / 2.0
    }
}

/// Runs the measurement.
pub fn run(args: &BenchArgs) -> Result<BenchResult> {
    let params: Map<String, Value> = serde_json::from_str(&args.params)
        .with_context(|| format!("--params is not a JSON object: {}", args.params))?;
    let config = AttentionConfig::from_name(&args.attention, args.d_model, args.heads, args.n)?
        .with_params(&params)?;
    config.check_input(args.n, false)?;
    let device = args.backend.device()?.autodiff();
    device.seed(0);
    let attention = config.init(&device);
    let shape = [args.batch, args.n, args.d_model];
    let rss_before = proc_status_kib("VmRSS:").unwrap_or(0.0);
    let sync = |t: Tensor<3>| t.sum().into_scalar::<f64>();

    let mut forward = Vec::new();
    let mut forward_backward = Vec::new();
    for rep in 0..args.warmup + args.reps {
        let x = Tensor::<3>::random(shape, Distribution::Normal(0.0, 1.0), &device);
        let started = Instant::now();
        let y = attention.forward(AttentionInput::new(x.clone().detach()));
        sync(y);
        let t_forward = started.elapsed().as_secs_f64() * 1e3;

        let x = x.require_grad();
        let started = Instant::now();
        let y = attention.forward(AttentionInput::new(x.clone()));
        let grads = y.sum().backward();
        let gx = x.grad(&grads).context("no gradient reached the input")?;
        gx.sum().into_scalar::<f64>();
        let t_both = started.elapsed().as_secs_f64() * 1e3;
        if rep >= args.warmup {
            forward.push(t_forward);
            forward_backward.push(t_both);
        }
    }
    let peak = proc_status_kib("VmHWM:").unwrap_or(0.0);
    Ok(BenchResult {
        attention: args.attention.clone(),
        n: args.n,
        forward_ms: median(forward),
        forward_backward_ms: median(forward_backward),
        peak_mib: (peak - rss_before).max(0.0) / 1024.0,
    })
}
