//! One efficiency measurement of one attention at one length, in this process: the median time
//! of the forward pass and of forward + backward, and the process's peak resident memory during
//! them. `cargo xtask bench attention` runs one process per (attention, length) so that each
//! peak belongs to one case, and compares the variants with softmax and with PyTorch.
//!
//! As on the PyTorch side: dropout off (the PyPI packages default to none), the forward pass
//! alone runs without autodiff (PyTorch's `no_grad`), forward + backward with it.
//!
//! Also here: one decoding case ([`run_decode`], `cargo xtask bench decode`), the time of a
//! token decoded at a given position and the size of the state it decodes from, and one case of
//! LRA's efficiency protocol ([`run_train`], `cargo xtask bench lra`).

use std::time::Instant;

use anyhow::{Context, Result};
use burn::prelude::*;
use burn::tensor::Distribution;
use burn_attention_zoo::{AttentionConfig, AttentionInput, AttentionModule, DecodingState};
use serde::Serialize;
use serde_json::{Map, Value};

use lra_runs::summary::median;

use crate::backend::{BackendDevice, BackendKind};

/// The attention layer a case measures, and its shape (`bench-attention`, `bench-decode`).
#[derive(Debug, Clone, clap::Args)]
pub struct LayerArgs {
    /// Attention, by registry name.
    #[arg(long)]
    pub attention: String,
    /// Batch size.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Heads.
    #[arg(long, default_value_t = 8)]
    pub heads: usize,
    /// Model width.
    #[arg(long, default_value_t = 512)]
    pub d_model: usize,
    /// Attention parameters as JSON, e.g. `{"k": 256}`.
    #[arg(long, default_value = "{}")]
    pub params: String,
    /// Backend.
    #[arg(long, value_enum, default_value_t = BackendKind::Flex)]
    pub backend: BackendKind,
}

impl LayerArgs {
    /// Refuses a size of 0 or past the limit: the layer's, the length `n`, the timed `reps` and
    /// the untimed `warmup` (which may be 0), and a `warmup + reps` that overflows.
    fn check_sizes(&self, n: usize, reps: usize, warmup: usize) -> Result<()> {
        check_sizes(&[
            ("--n", n),
            ("--batch", self.batch),
            ("--heads", self.heads),
            ("--d-model", self.d_model),
            ("--reps", reps),
        ])?;
        check_repetitions(reps, warmup, "--reps")
    }

    /// Refuses, before anything is allocated, a case whose `copies` tensors of
    /// `[batch, n, d_model]` f32 (`what` they are: inputs, outputs, gradients, a decoding cache)
    /// alone exceed the memory available, naming the flags.
    fn check_input_memory(&self, n: usize, copies: u64, what: &str) -> Result<()> {
        let bytes = [self.batch, n, self.d_model]
            .iter()
            .try_fold(4 * copies, |total, &d| total.checked_mul(d as u64));
        if bytes.is_none_or(|b| b > crate::memory::available_memory().unwrap_or(u64::MAX)) {
            anyhow::bail!(
                "`--batch` x `--n` x `--d-model` ({} x {n} x {}) is too large: {what} alone \
                 exceed the memory available",
                self.batch,
                self.d_model
            );
        }
        Ok(())
    }

    /// `--params`, read as a JSON object.
    fn params(&self) -> Result<Map<String, Value>> {
        serde_json::from_str(&self.params)
            .with_context(|| format!("--params is not a JSON object: {}", self.params))
    }

    /// The attention's configuration for sequences of up to `n_max` positions: `--params` over
    /// the registry's defaults, weight dropout off (as on the PyTorch side).
    fn config(&self, n_max: usize) -> Result<AttentionConfig> {
        let params = self.params()?;
        Ok(
            AttentionConfig::from_name(&self.attention, self.d_model, self.heads, n_max)?
                .with_params(&params)?
                .with_weight_dropout(0.0),
        )
    }

    /// What the case measures: the attention layer, or for a hybrid pattern (`gla+local`) an
    /// encoder of one block per layer of the pattern (feed-forward width `4 d_model`), each
    /// with its paper defaults (`--params` applies to a single attention only). Checked for
    /// sequences of `n_max` positions, causal where `causal`.
    fn build(&self, n_max: usize, causal: bool, device: &Device) -> Result<Layer> {
        let parts = burn_attention_zoo::hybrid_pattern(&self.attention)?;
        if parts.len() == 1 {
            let config = self.config(n_max)?;
            config.check_input(n_max, n_max, causal)?;
            return Ok(Layer::Attention(config.init(device)));
        }
        if !self.params()?.is_empty() {
            anyhow::bail!(
                "`--params` applies to a single attention, not to the pattern `{}`",
                self.attention
            );
        }
        let d_ff = self
            .d_model
            .checked_mul(4)
            .context("`--d-model` is too large")?;
        let config = burn_attention_zoo::EncoderConfig::named(
            &self.attention,
            self.d_model,
            self.heads,
            d_ff,
            parts.len(),
        )?
        .with_weight_dropout(0.0)
        .with_residual_dropout(0.0);
        for layer in config.layer_attentions() {
            layer.check_input(n_max, n_max, causal)?;
        }
        Ok(Layer::Stack(config.init(device)))
    }
}

/// Refuses a `warmup` past the limit and a `warmup + reps` that overflows, naming `reps_flag`.
fn check_repetitions(reps: usize, warmup: usize, reps_flag: &str) -> Result<()> {
    crate::limits::check_size("--warmup", warmup, false)?;
    if warmup.checked_add(reps).is_none() {
        anyhow::bail!("`--warmup` + `{reps_flag}` ({warmup} + {reps}) is too large");
    }
    Ok(())
}

/// The module a benchmark case measures: one attention layer, or a hybrid pattern's encoder.
// One value a process (a Module cannot be boxed), so the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
enum Layer {
    /// One attention.
    Attention(burn_attention_zoo::Attention),
    /// An encoder of one block per layer of a hybrid pattern.
    Stack(burn_attention_zoo::Encoder<burn_attention_zoo::Attention>),
}

impl Layer {
    fn forward(&self, input: AttentionInput) -> Result<Tensor<3>> {
        Ok(match self {
            Self::Attention(a) => a.try_forward(input)?,
            Self::Stack(e) => e.try_forward(input)?,
        })
    }

    /// The prompt's output and the decoding state after it (a stack's: one per block).
    fn prefill(&self, x: Tensor<3>) -> Result<(Tensor<3>, Vec<DecodingState>)> {
        Ok(match self {
            Self::Attention(a) => {
                let (y, state) = a.prefill(x)?;
                (y, vec![state])
            }
            Self::Stack(e) => e.prefill(x)?,
        })
    }

    fn decode(&self, x: Tensor<3>, states: Vec<DecodingState>) -> Result<Tensor<3>> {
        Ok(match self {
            Self::Attention(a) => {
                let state = states.into_iter().next().unwrap_or_default();
                a.decode(x, state)?.0
            }
            Self::Stack(e) => e.decode(x, states)?.0,
        })
    }
}

/// What to measure.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The attention layer.
    #[command(flatten)]
    pub layer: LayerArgs,
    /// Sequence length.
    #[arg(long)]
    pub n: usize,
    /// Timed repetitions (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Untimed warm-up repetitions.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Causal masking (for the variants that support it).
    #[arg(long)]
    pub causal: bool,
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

/// Runs the measurement.
pub fn run(args: &BenchArgs) -> Result<BenchResult> {
    args.layer.check_sizes(args.n, args.reps, args.warmup)?;
    // The input, its gradient and the output: refused before anything is allocated where they
    // alone cannot fit.
    args.layer
        .check_input_memory(args.n, 3, "the input, its gradient and the output")?;
    let device = args.layer.backend.device()?.autodiff();
    device.seed(0);
    let attention = args.layer.build(args.n, args.causal, &device)?;
    let inference = attention.valid();
    let shape = [args.layer.batch, args.n, args.layer.d_model];
    let rss_before = proc_status_kib("VmRSS:").unwrap_or(0.0);
    let sync = |t: Tensor<3>| t.sum().into_scalar::<f64>();

    let mut forward = Vec::new();
    let mut forward_backward = Vec::new();
    for rep in 0..args.warmup + args.reps {
        let x = Tensor::<3>::random(shape, Distribution::Normal(0.0, 1.0), &device);
        let started = Instant::now();
        let y = inference.forward(AttentionInput::new(x.clone().inner()).causal(args.causal))?;
        sync(y);
        let t_forward = started.elapsed().as_secs_f64() * 1e3;

        let x = x.require_grad();
        let started = Instant::now();
        let y = attention.forward(AttentionInput::new(x.clone()).causal(args.causal))?;
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
        attention: args.layer.attention.clone(),
        n: args.n,
        forward_ms: median(forward),
        forward_backward_ms: median(forward_backward),
        peak_mib: (peak - rss_before).max(0.0) / 1024.0,
    })
}

/// What to measure in one decoding case: the cost of one token at one position.
#[derive(Debug, Clone, clap::Args)]
pub struct DecodeBenchArgs {
    /// The attention layer (one with a causal form).
    #[command(flatten)]
    pub layer: LayerArgs,
    /// The position the timed tokens are decoded at: a prompt of this many tokens is prefilled
    /// first, and each timed token is decoded from that prompt's state.
    #[arg(long)]
    pub n: usize,
    /// Timed tokens (the median is reported).
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// Untimed tokens before them.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
}

/// One decoding measurement, printed as a JSON line.
#[derive(Debug, Clone, Serialize)]
pub struct DecodeBenchResult {
    /// Attention name.
    pub attention: String,
    /// The position decoded at (the prompt's length).
    pub n: usize,
    /// Median time of one decoding step at position `n`, milliseconds.
    pub token_ms: f64,
    /// Time of prefilling the prompt of `n` tokens in one pass, milliseconds.
    pub prefill_ms: f64,
    /// The decoding state after the prompt, MiB (its numbers at 4 bytes each:
    /// `DecodingState::num_elements`).
    pub state_mib: f64,
    /// Peak resident memory of the process minus the resident memory before the prompt, MiB
    /// (Linux `VmHWM` - `VmRSS`).
    pub peak_mib: f64,
}

/// Measures decoding at one position: prefills a random prompt of `n` tokens (inference, no
/// autodiff), then decodes `warmup + reps` random tokens, each from the prompt's state (so each
/// timed token is the `n + 1`-th), and reports the median time of a token.
pub fn run_decode(args: &DecodeBenchArgs) -> Result<DecodeBenchResult> {
    args.layer.check_sizes(args.n, args.reps, args.warmup)?;
    let n_max = args
        .n
        .checked_add(1)
        .context("`--n` is too large: the decoded token's position overflows")?;
    // The prompt, its output and a key/value cache of two more: refused before anything is
    // allocated where they alone cannot fit.
    args.layer.check_input_memory(
        n_max,
        4,
        "the prompt, its output and a key/value cache of that length",
    )?;
    let device = args.layer.backend.device()?;
    device.seed(0);
    let attention = args.layer.build(n_max, true, &device)?;
    let sync = |t: Tensor<3>| t.sum().into_scalar::<f64>();
    let rss_before = proc_status_kib("VmRSS:").unwrap_or(0.0);

    let prompt = Tensor::<3>::random(
        [args.layer.batch, args.n, args.layer.d_model],
        Distribution::Normal(0.0, 1.0),
        &device,
    );
    let started = Instant::now();
    let (y, state) = attention.prefill(prompt)?;
    sync(y);
    let state_elements: usize = state.iter().map(DecodingState::num_elements).sum();
    let prefill_ms = started.elapsed().as_secs_f64() * 1e3;

    let mut times = Vec::new();
    for rep in 0..args.warmup + args.reps {
        let token = Tensor::<3>::random(
            [args.layer.batch, 1, args.layer.d_model],
            Distribution::Normal(0.0, 1.0),
            &device,
        );
        let started = Instant::now();
        let y = attention.decode(token, state.clone())?;
        sync(y);
        if rep >= args.warmup {
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
    }
    let peak = proc_status_kib("VmHWM:").unwrap_or(0.0);
    Ok(DecodeBenchResult {
        attention: args.layer.attention.clone(),
        n: args.n,
        token_ms: median(times),
        prefill_ms,
        state_mib: state_elements as f64 * 4.0 / (1u64 << 20) as f64,
        peak_mib: (peak - rss_before).max(0.0) / 1024.0,
    })
}

/// What to measure in one case of LRA's efficiency protocol.
#[derive(Debug, Clone, clap::Args)]
pub struct TrainBenchArgs {
    /// Attention, by registry name.
    #[arg(long)]
    pub attention: String,
    /// Sequence length (the task's maximum length).
    #[arg(long)]
    pub n: usize,
    /// The task whose model is trained.
    #[arg(long, default_value = "text")]
    pub task: String,
    /// The task's preset whose model is trained (its `[attention.*]` parameters too).
    #[arg(long, default_value = "lra")]
    pub preset: String,
    /// Batch size (LRA's protocol: 32).
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Timed training steps (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// Untimed warm-up steps.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Backend.
    #[arg(long, value_enum, default_value_t = BackendKind::Flex)]
    pub backend: BackendKind,
    /// Print the resolved model, optimiser and attention parameters as JSON instead of
    /// measuring (the PyTorch side builds the same model from them).
    #[arg(long)]
    pub describe: bool,
}

/// One LRA efficiency measurement, printed as a JSON line.
#[derive(Debug, Clone, Serialize)]
pub struct TrainBenchResult {
    /// Attention name.
    pub attention: String,
    /// Sequence length.
    pub n: usize,
    /// Batch size.
    pub batch: usize,
    /// Trainable parameters of the model.
    pub n_params: usize,
    /// Median time of one training step (forward, backward, optimiser), milliseconds.
    pub step_ms: f64,
    /// Training steps per second, `1000 / step_ms`.
    pub steps_per_s: f64,
    /// Peak resident memory during the steps minus the resident memory once the model was
    /// built, MiB (Linux `VmHWM` - `VmRSS`).
    pub peak_mib: f64,
}

/// Runs LRA's efficiency protocol for one attention at one length: the task's model of the
/// preset (the Text task's by default), trained on full-length random token sequences (the
/// time of a step does not depend on the tokens), with the preset's dropout, attention dropout
/// included, as on the PyTorch side.
pub fn run_train(args: &TrainBenchArgs) -> Result<TrainBenchResult> {
    check_sizes(&[("--steps", args.steps)])?;
    check_repetitions(args.steps, args.warmup, "--steps")?;
    let config = train_bench_config(args)?;
    let available = crate::memory::available_memory().unwrap_or(u64::MAX);
    crate::budget::check_activations(&config, available, ["--batch", "--n"])?;
    let task = crate::tasks::find(&args.task)?;
    let spec = crate::model::ClassifierSpec::resolve(&config, task, &args.attention)?;
    let count = crate::budget::ParamCount::of(&spec)?;
    crate::budget::check_memory(&count, &config, task, &args.attention)?;
    measure_training(args, &config, &spec)
}

/// Refuses a size of 0 or above [`crate::limits::MAX_SIZE`], naming its flag.
fn check_sizes(sizes: &[(&str, usize)]) -> Result<()> {
    sizes
        .iter()
        .try_for_each(|&(flag, n)| crate::limits::check_size(flag, n, true))
}

/// The run configuration a [`TrainBenchArgs`] case trains.
pub fn train_bench_config(args: &TrainBenchArgs) -> Result<crate::config::RunConfig> {
    use crate::config::RunConfig;
    crate::tasks::find(&args.task)?;
    let mut config = RunConfig::preset(&args.task, &args.preset)?;
    config.data.max_len = args.n;
    config.training.batch_size = args.batch;
    config.validate()?;
    Ok(config)
}

/// What `--describe` prints: the model and optimiser tables, the attention's parameters, the
/// vocabulary and the classes.
pub fn describe_train(args: &TrainBenchArgs) -> Result<Value> {
    let config = train_bench_config(args)?;
    let task = crate::tasks::find(&args.task)?;
    let spec = crate::model::ClassifierSpec::resolve(&config, task, &args.attention)?;
    Ok(serde_json::json!({
        "model": config.model,
        "optimizer": config.training.optimizer,
        "params": config.attention.get(&args.attention).cloned().unwrap_or_default(),
        "vocab_size": spec.vocab_size,
        "n_classes": spec.n_classes,
    }))
}

fn measure_training(
    args: &TrainBenchArgs,
    config: &crate::config::RunConfig,
    spec: &crate::model::ClassifierSpec,
) -> Result<TrainBenchResult> {
    use burn::nn::loss::CrossEntropyLossConfig;
    use burn::optim::GradientsParams;

    use crate::data::Tokens;
    use crate::model::LraClassifier;
    use crate::train::{adamw, objective};

    let device = args.backend.device()?.autodiff();
    device.seed(0);
    let (vocab, classes) = (spec.vocab_size, spec.n_classes);
    let mut model = LraClassifier::new(spec, &device);
    let n_params = burn_attention_zoo::num_trainable_params(&model);
    let mut optim = adamw(&config.training.optimizer).init();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let sync = |device: &Device| {
        device
            .sync()
            .map_err(|e| anyhow::anyhow!("the backend failed: {e:?}"))
    };
    sync(&device)?;
    let rss_before = proc_status_kib("VmRSS:").unwrap_or(0.0);
    let mut times = Vec::new();
    for step in 0..args.warmup + args.steps {
        let ids = Tensor::<2, Int>::random(
            [args.batch, args.n],
            Distribution::Uniform(1.0, vocab as f64),
            &device,
        );
        // A token-level model predicts at every position (the most a task can ask).
        let predictions = if spec.per_position {
            args.batch * args.n
        } else {
            args.batch
        };
        let positions =
            (spec.per_position).then(|| Tensor::<1, Int>::arange(0..predictions as i64, &device));
        let labels = Tensor::<1, Int>::random(
            [predictions],
            Distribution::Uniform(0.0, classes as f64),
            &device,
        );
        let mask_pad = ids.clone().equal_elem(0);
        sync(&device)?;
        let started = Instant::now();
        let outputs = model.forward_with_loss(Tokens { ids, mask_pad }, None, positions);
        let (loss, _) = objective(&model, outputs, labels, &loss_fn);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-4, model, grads);
        sync(&device)?;
        if step >= args.warmup {
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
    }
    let peak = proc_status_kib("VmHWM:").unwrap_or(0.0);
    let step_ms = median(times);
    Ok(TrainBenchResult {
        attention: args.attention.clone(),
        n: args.n,
        batch: args.batch,
        n_params,
        step_ms,
        steps_per_s: 1e3 / step_ms,
        peak_mib: (peak - rss_before).max(0.0) / 1024.0,
    })
}

/// What to measure in one matrix-product case.
#[derive(Debug, Clone, clap::Args)]
pub struct GemmBenchArgs {
    /// The matrices' side: `[n, n] × [n, n]`, `2 n³` floating-point operations.
    #[arg(long, default_value_t = 2048)]
    pub n: usize,
    /// Timed products (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Untimed products before them.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Backend.
    #[arg(long, value_enum, default_value_t = BackendKind::Flex)]
    pub backend: BackendKind,
}

/// One matrix-product measurement, printed as a JSON line.
#[derive(Debug, Clone, Serialize)]
pub struct GemmBenchResult {
    /// The matrices' side.
    pub n: usize,
    /// Median time of one product, milliseconds.
    pub ms: f64,
    /// `2 n³` over that time, in GFLOP/s.
    pub gflop_per_s: f64,
}

/// Times `[n, n] × [n, n]` in f32 on the backend (the product, then a sum that waits for it).
pub fn run_gemm(args: &GemmBenchArgs) -> Result<GemmBenchResult> {
    check_sizes(&[("--n", args.n), ("--reps", args.reps)])?;
    check_repetitions(args.reps, args.warmup, "--reps")?;
    let bytes = (args.n as u64)
        .checked_mul(args.n as u64)
        .and_then(|e| e.checked_mul(3 * 4));
    if bytes.is_none_or(|b| b > crate::memory::available_memory().unwrap_or(u64::MAX)) {
        anyhow::bail!(
            "`--n` ({}) is too large: three n x n matrices exceed the memory available",
            args.n
        );
    }
    let device = args.backend.device()?;
    device.seed(0);
    let a = Tensor::<2>::random([args.n, args.n], Distribution::Normal(0.0, 1.0), &device);
    let b = Tensor::<2>::random([args.n, args.n], Distribution::Normal(0.0, 1.0), &device);
    let mut times = Vec::new();
    for rep in 0..args.warmup + args.reps {
        let started = Instant::now();
        let c = a.clone().matmul(b.clone());
        c.sum().into_scalar::<f64>();
        if rep >= args.warmup {
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
    }
    let ms = median(times);
    Ok(GemmBenchResult {
        n: args.n,
        ms,
        gflop_per_s: 2.0 * (args.n as f64).powi(3) / (ms * 1e6),
    })
}
