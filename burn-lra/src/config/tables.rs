//! The tables of a run configuration: data, model, optimiser, schedule and training, each
//! rejecting unknown keys; [`RunConfig`](super::RunConfig) holds one of each and checks them.

use serde::{Deserialize, Serialize};

use crate::data::listops::GeneratorConfig;
use crate::data::mqar::MqarConfig;
use crate::data::pathfinder::PathfinderConfig;

use lra_runs::Selection;

/// Data settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// Examples are cut to this many tokens (each document, for matching).
    pub max_len: usize,
    /// Generate the dataset instead of reading files (ListOps), with these parameters.
    #[serde(default)]
    pub generate: Option<GeneratorConfig>,
    /// Pathfinder / Path-X: the images' size and difficulty, and what to generate when no
    /// `--data-dir` is given.
    #[serde(default)]
    pub pathfinder: Option<PathfinderConfig>,
    /// Associative recall (MQAR): the generator's settings (the sequence length is `max_len`).
    #[serde(default)]
    pub mqar: Option<MqarConfig>,
    /// Where validation examples come from.
    #[serde(default)]
    pub validation: Validation,
    /// Matching: each document is first cut to this many bytes (LRA: 10,000), then to `max_len`.
    #[serde(default = "default_doc_bytes")]
    pub doc_max_bytes: usize,
    /// How text becomes tokens (text and matching): `"bytes"` (LRA's) or `"bpe"`.
    #[serde(default)]
    pub tokenizer: TokenizerKind,
    /// BPE vocabulary size (`tokenizer = "bpe"` only), padding not counted.
    #[serde(default)]
    pub bpe_vocab_size: Option<usize>,
    /// How many bytes a compressed or archived data file (an IMDB `.tar.gz`, a gzipped IDX file)
    /// may expand to before reading it is refused (default 4 GiB: the IMDB reviews expand to
    /// about 0.5 GB).
    #[serde(default = "default_max_archive_bytes")]
    pub max_archive_bytes: u64,
    /// Report test accuracy on a fixed sample of this many test examples (drawn once, seed 0)
    /// instead of the whole split: quick presets only; the result records the test size.
    #[serde(default)]
    pub test_subset: Option<usize>,
}

/// `data.doc_max_bytes` unless a configuration sets it (LRA's 10,000).
pub fn default_doc_bytes() -> usize {
    10_000
}

/// `data.max_archive_bytes` unless a configuration sets it.
pub fn default_max_archive_bytes() -> u64 {
    crate::data::DEFAULT_MAX_ARCHIVE_BYTES
}

/// How the text and matching tasks turn text into tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TokenizerKind {
    /// One token per UTF-8 byte (LRA's byte-level tasks).
    #[default]
    Bytes,
    /// Byte-level BPE trained on the training split (`data.bpe_vocab_size` tokens).
    Bpe,
}

/// Where a run's validation examples come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Validation {
    /// The task's own validation split (ListOps `basic_val.tsv`, AAN `new_aan_pairs.eval.tsv`,
    /// a corpus's `val.tsv`).
    #[default]
    Split,
    /// The test split, as the LRA repository does for IMDB (no separate validation set there):
    /// model selection then sees the test set, which the result records.
    Test,
    /// The last `n` examples of the (shuffled-once, seed 0) training split, removed from training.
    Holdout(usize),
}

/// How the two pooled documents of a matching example are combined before the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PairFeatures {
    /// `[X1, X2, X1 * X2, X1 - X2]` (the LRA paper).
    #[default]
    Interact,
    /// `[X1, X2]` (the LRA JAX code's default).
    Concat,
}

/// How the encoder output becomes one vector per example.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pooling {
    /// A learned, zero-initialised vector prepended to the sequence (the LRA reference).
    Cls,
    /// The mean over real (non-padding) positions.
    Mean,
}

/// Position information added to the token embeddings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Positions {
    /// Fixed sines and cosines (the LRA reference).
    Sinusoidal,
    /// A learned embedding per position (the PyTorch re-runs).
    Learned,
    /// Rotary positions (Su et al. 2021, RoFormer): nothing added to the embeddings; every
    /// layer's attention rotates its queries and keys by their positions (for the attentions
    /// that take them; the others are refused when the configuration is read).
    Rotary,
}

/// Model settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Encoder blocks.
    pub n_layers: usize,
    /// Model width.
    pub d_model: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Feed-forward hidden width inside each block.
    pub d_ff: usize,
    /// Hidden width of the classifier head.
    pub d_mlp: usize,
    /// Dropout on embeddings, residuals and feed-forward.
    pub dropout: f64,
    /// Dropout on attention weights.
    pub attention_dropout: f64,
    /// Pooling.
    pub pooling: Pooling,
    /// Positions.
    pub positions: Positions,
    /// Standard deviation of the normal distribution the token embeddings start from: 1 (the
    /// default) as Flax's `nn.Embed` in the LRA reference, 0.02 as the PyTorch re-runs'
    /// `small` recipe.
    #[serde(default = "default_embedding_std")]
    pub embedding_std: f64,
    /// Matching: how the two documents' vectors meet in the head.
    #[serde(default)]
    pub pair_features: PairFeatures,
}

/// The token embeddings' initial standard deviation unless a configuration sets one.
fn default_embedding_std() -> f64 {
    1.0
}

/// Optimiser: Adam with decoupled weight decay scaled by the learning rate (AdamW).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerConfig {
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon.
    pub epsilon: f32,
    /// Decoupled weight decay, multiplied by the learning rate each step.
    pub weight_decay: f32,
}

/// Learning-rate schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Schedule {
    /// LRA's `base · min(1, step/warmup) / sqrt(max(step, warmup))`.
    Rsqrt {
        /// The constant factor (LRA: 0.05).
        base: f64,
        /// Warm-up steps.
        warmup: usize,
    },
    /// Linear warm-up to `peak`, then linear decay to 0 at the last step.
    OneCycle {
        /// Peak learning rate.
        peak: f64,
        /// Warm-up steps.
        warmup: usize,
    },
    /// Linear warm-up to `peak`, then `peak` to the end (the self-pretraining paper's
    /// `constant_warmup`).
    Constant {
        /// The rate after warm-up.
        peak: f64,
        /// Warm-up steps.
        warmup: usize,
    },
    /// Linear warm-up to `peak`, then a half cosine down to 0 at the last step (the
    /// self-pretraining paper's `cosine_warmup` for text).
    Cosine {
        /// Peak learning rate.
        peak: f64,
        /// Warm-up steps.
        warmup: usize,
    },
}

impl Schedule {
    /// The learning rate at `step` (1-based) of `total`.
    pub fn lr(&self, step: usize, total: usize) -> f64 {
        let step = step.max(1) as f64;
        match *self {
            Schedule::Rsqrt { base, warmup } => {
                let warmup = warmup.max(1) as f64;
                base * (step / warmup).min(1.0) / step.max(warmup).sqrt()
            }
            Schedule::OneCycle { peak, warmup } => {
                warm_then(peak, step, warmup, total, |done| 1.0 - done)
            }
            Schedule::Constant { peak, warmup } => warm_then(peak, step, warmup, total, |_| 1.0),
            Schedule::Cosine { peak, warmup } => warm_then(peak, step, warmup, total, |done| {
                0.5 * (1.0 + (std::f64::consts::PI * done).cos())
            }),
        }
    }

    /// The steps of linear warm-up.
    pub fn warmup(&self) -> usize {
        match *self {
            Schedule::Rsqrt { warmup, .. }
            | Schedule::OneCycle { warmup, .. }
            | Schedule::Constant { warmup, .. }
            | Schedule::Cosine { warmup, .. } => warmup,
        }
    }
}

/// A linear warm-up to `peak` over `warmup` steps, then `peak · decay(done)`, `done` the share
/// (0 to 1) of the steps after warm-up that have passed by `step` (1-based) of `total`.
fn warm_then(peak: f64, step: f64, warmup: usize, total: usize, decay: impl Fn(f64) -> f64) -> f64 {
    let (warmup, total) = (warmup as f64, total as f64);
    if step <= warmup {
        return peak * step / warmup;
    }
    peak * decay(((step - warmup) / (total - warmup).max(1.0)).min(1.0))
}

/// What a preset changes for its self-pretraining runs (a `training.objective` other than
/// `task`): the values given here replace those of `[training]` in such a run (`burn-lra
/// pretrain`, the first stage of `cargo xtask lra --pretrain`), so that one preset holds both
/// phases of a protocol whose phases train for different lengths (the self-pretraining paper's
/// configurations). Runs of the task itself ignore it. `--set pretraining.steps=...` changes it
/// like any key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PretrainingConfig {
    /// Optimisation steps of a pretraining run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<usize>,
    /// Validate every this many steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_every: Option<usize>,
    /// The share of each input's tokens masked (masked-token denoising).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_rate: Option<f64>,
    /// Learning-rate schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
}

/// What a run trains the model to predict: the task's labels, or, to self-pretrain it (Amos,
/// Berant and Gupta 2024, "Never Train from Scratch"), the inputs of the task's training split
/// alone (docs/lra.md, "Self-pretraining").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Objective {
    /// The task's own targets (training from scratch, or fine-tuning with `--init-from`).
    #[default]
    Task,
    /// Masked-token denoising, for bidirectional models: a share of each input's tokens
    /// (`training.mask_rate`) replaced by a mask token the vocabulary gains, each predicted from
    /// the rest of the input.
    MaskedTokens,
    /// Next-token prediction, for causal models: every token predicted from those before it
    /// (attentions with a causal form only).
    NextToken,
}

impl Objective {
    /// Whether the run self-pretrains (on the training inputs, without labels).
    pub fn is_pretraining(self) -> bool {
        self != Objective::Task
    }

    /// The name configurations spell (the serde name).
    pub fn name(self) -> &'static str {
        match self {
            Objective::Task => "task",
            Objective::MaskedTokens => "masked-tokens",
            Objective::NextToken => "next-token",
        }
    }

    /// The tokens the objective adds to the task's vocabulary: the mask token.
    pub fn extra_tokens(self) -> usize {
        usize::from(self == Objective::MaskedTokens)
    }
}

/// Training settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingConfig {
    /// What the model learns to predict (default: the task's targets); written only where it is
    /// not the default, so that runs recorded before it was a setting read the same.
    #[serde(default, skip_serializing_if = "is_task")]
    pub objective: Objective,
    /// Masked-token denoising: the share of each input's tokens masked (default 0.15, BERT's
    /// and the self-pretraining paper's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_rate: Option<f64>,
    /// Examples per step.
    pub batch_size: usize,
    /// Optimisation steps.
    pub steps: usize,
    /// Validate every this many steps (and after the last).
    pub eval_every: usize,
    /// Optimiser.
    pub optimizer: OptimizerConfig,
    /// Learning-rate schedule.
    pub schedule: Schedule,
    /// Which weights the headline test accuracy uses.
    pub selection: Selection,
    /// Redraw random attention features (Performer) every this many steps, before the step
    /// that first trains on them (steps `every + 1`, `2 * every + 1`, ...); never when absent.
    #[serde(default)]
    pub redraw_every: Option<usize>,
    /// Micro-batches whose gradients are summed into one step (`batch_size` each; the effective
    /// batch is their product). Yorsh & Kovalenko simulate batch 32 this way.
    #[serde(default = "one")]
    pub grad_accumulation: usize,
    /// Clip the global gradient norm to this value before each step; no clipping when absent.
    #[serde(default)]
    pub grad_clip: Option<f32>,
    /// Write a resumable checkpoint every this many steps (and after the last); default: at each
    /// validation.
    #[serde(default)]
    pub checkpoint_every: Option<usize>,
}

fn one() -> usize {
    1
}

fn is_task(objective: &Objective) -> bool {
    *objective == Objective::Task
}
