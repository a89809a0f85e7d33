//! The LRA encoder classifier: embeddings, positions, any attention's encoder, pooling, head.
//!
//! Token embedding (N(0, `model.embedding_std`²): 1 as the LRA reference, 0.02 in `small`) ->
//! CLS vector prepended (zero-initialised, CLS pooling only) ->
//! positions -> dropout -> pre-LN encoder with a final LayerNorm -> pooling ->
//! `Dense(d_mlp) ReLU Dense(classes)` (the LRA JAX reference, docs/lra.md).

use anyhow::{Result, bail};
use burn::module::{Module, Param};
use burn::nn::{
    Dropout, DropoutConfig, Embedding, EmbeddingConfig, Initializer, Linear, LinearConfig,
};
use burn::prelude::*;
use burn_attention_zoo::core::dropout::dropout;
use burn_attention_zoo::{AttentionInput, Encoder, num_trainable_params};
use serde::Serialize;

use crate::config::{PairFeatures, Pooling, Positions, RunConfig, Task};
use crate::data::Tokens;

/// The classifier. Build with [`LraClassifier::new`].
#[derive(Module, Debug)]
pub struct LraClassifier {
    /// Token embedding.
    pub embedding: Embedding,
    /// Learned CLS vector `[1, 1, d_model]` (CLS pooling only).
    pub cls: Option<Param<Tensor<3>>>,
    /// Learned positions (learned positions only).
    pub positions: Option<Embedding>,
    /// Embedding dropout.
    pub dropout: Dropout,
    /// The encoder.
    pub encoder: Encoder,
    /// Head hidden layer.
    pub head_hidden: Linear,
    /// Matching head's second hidden layer (`d_mlp -> d_mlp / 2`).
    pub head_mid: Option<Linear>,
    /// Head output layer.
    pub head_out: Linear,
    /// Matching: how the two documents meet (`None` for single-sequence tasks).
    #[module(skip)]
    pub pair_features: Option<PairFeatures>,
    /// Pooling.
    #[module(skip)]
    pub pooling: Pooling,
    /// Model width.
    pub d_model: usize,
}

impl LraClassifier {
    /// Builds the classifier for `config` with the attention called `attention`.
    pub fn new(
        config: &RunConfig,
        attention: &str,
        vocab_size: usize,
        n_classes: usize,
        device: &Device,
    ) -> Result<Self> {
        let m = &config.model;
        let encoder = config.encoder_config(attention)?;
        // Matching (docs/lra.md): `MLP([X1, X2, X1*X2, X1-X2])` or `MLP([X1, X2])`, with
        // Dense(mlp) ReLU Dense(mlp/2) ReLU Dense(classes).
        let pair_features = (config.task == Task::Matching).then_some(m.pair_features);
        let head_in = match pair_features {
            None => m.d_model,
            Some(PairFeatures::Interact) => 4 * m.d_model,
            Some(PairFeatures::Concat) => 2 * m.d_model,
        };
        let dense = |i, o| {
            LinearConfig::new(i, o)
                .with_initializer(Initializer::XavierUniform { gain: 1.0 })
                .init(device)
        };
        Ok(Self {
            embedding: EmbeddingConfig::new(vocab_size, m.d_model)
                .with_initializer(Initializer::Normal {
                    mean: 0.0,
                    std: m.embedding_std,
                })
                .init(device),
            // Built lazily, as every other parameter: a model can be counted before it exists.
            cls: (m.pooling == Pooling::Cls)
                .then(|| Initializer::Zeros.init([1, 1, m.d_model], device)),
            positions: (m.positions == Positions::Learned).then(|| {
                EmbeddingConfig::new(config.encoder_len(), m.d_model)
                    .with_initializer(Initializer::Normal {
                        mean: 0.0,
                        std: 0.02,
                    })
                    .init(device)
            }),
            dropout: DropoutConfig::new(m.dropout).init(),
            encoder: encoder.init(device),
            head_hidden: dense(head_in, m.d_mlp),
            head_mid: pair_features.map(|_| dense(m.d_mlp, m.d_mlp / 2)),
            head_out: dense(
                if pair_features.is_some() {
                    m.d_mlp / 2
                } else {
                    m.d_mlp
                },
                n_classes,
            ),
            pair_features,
            pooling: m.pooling,
            d_model: m.d_model,
        })
    }

    /// The regularisation terms the attentions ask the loss to add (the trainable kernels'
    /// orthogonality penalty), summed over layers; `None` when there are none.
    pub fn penalty(&self) -> Option<Tensor<1>> {
        self.encoder.penalty()
    }

    /// Pooled representation `[batch, d_model]` of `tokens: [batch, n]` with padding mask
    /// `[batch, n]` (`true` = padding). The matching task's two towers share this.
    pub fn encode(&self, tokens: Tensor<2, Int>, mask_pad: Tensor<2, Bool>) -> Tensor<2> {
        let [batch, _] = tokens.dims();
        let device = tokens.device();
        let mut x = self.embedding.forward(tokens);
        let mut mask = mask_pad;
        if let Some(cls) = &self.cls {
            x = Tensor::cat(vec![cls.val().expand([batch, 1, self.d_model]), x], 1);
            mask = Tensor::cat(
                vec![
                    Tensor::<2, Bool>::from_data(
                        TensorData::new(vec![false; batch], [batch, 1]),
                        &device,
                    ),
                    mask,
                ],
                1,
            );
        }
        let n = x.dims()[1];
        x = match &self.positions {
            Some(positions) => {
                let ids = Tensor::<1, Int>::arange(0..n as i64, &device).reshape([1, n]);
                x + positions.forward(ids)
            }
            None => x + sinusoidal(n, self.d_model, &device).unsqueeze::<3>(),
        };
        let x = dropout(&self.dropout, x);
        let h = self
            .encoder
            .forward(AttentionInput::new(x).mask_pad(mask.clone()));
        match self.pooling {
            Pooling::Cls => h.slice([0..batch, 0..1]).reshape([batch, self.d_model]),
            Pooling::Mean => {
                let keep = mask.bool_not().float().unsqueeze_dim::<3>(2);
                let count = keep.clone().sum_dim(1).clamp_min(1.0);
                (h * keep)
                    .sum_dim(1)
                    .div(count)
                    .reshape([batch, self.d_model])
            }
        }
    }

    /// Class logits `[batch, classes]` of the documents `tokens` (and, for matching, their
    /// partners `pair`, encoded by the same encoder).
    ///
    /// # Panics
    /// If a matching model gets no `pair`, or a single-sequence model gets one.
    pub fn forward(&self, tokens: Tokens, pair: Option<Tokens>) -> Tensor<2> {
        use burn::tensor::activation::relu;
        let x1 = self.encode(tokens.ids, tokens.mask_pad);
        let features = match (self.pair_features, pair) {
            (None, None) => x1,
            (Some(kind), Some(pair)) => {
                let x2 = self.encode(pair.ids, pair.mask_pad);
                match kind {
                    PairFeatures::Interact => Tensor::cat(
                        vec![x1.clone(), x2.clone(), x1.clone() * x2.clone(), x1 - x2],
                        1,
                    ),
                    PairFeatures::Concat => Tensor::cat(vec![x1, x2], 1),
                }
            }
            (None, Some(_)) => panic!("a single-sequence model got document pairs"),
            (Some(_), None) => panic!("a matching model got single documents"),
        };
        let mut hidden = relu(self.head_hidden.forward(features));
        if let Some(mid) = &self.head_mid {
            hidden = relu(mid.forward(hidden));
        }
        self.head_out.forward(hidden)
    }
}

/// A model's trainable parameters beside those of the softmax baseline built from the same
/// configuration (LRA's "apples to apples" rule: at most 10% more). Frozen tensors (Performer's
/// random features) are not counted.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ParamBudget {
    /// Trainable parameters of the model.
    pub n_params: usize,
    /// Trainable parameters of the softmax model of the same configuration.
    pub softmax_params: usize,
}

/// Trainable parameters of the classifier for `config` with the attention called `attention`.
pub fn count_trainable(
    config: &RunConfig,
    attention: &str,
    vocab_size: usize,
    n_classes: usize,
    device: &Device,
) -> Result<usize> {
    Ok(num_trainable_params(&LraClassifier::new(
        config, attention, vocab_size, n_classes, device,
    )?))
}

impl ParamBudget {
    /// Counts `attention`'s model and the softmax baseline for `config`.
    pub fn count(
        config: &RunConfig,
        attention: &str,
        vocab_size: usize,
        n_classes: usize,
        device: &Device,
    ) -> Result<Self> {
        let count = |name| count_trainable(config, name, vocab_size, n_classes, device);
        Ok(Self {
            n_params: count(attention)?,
            softmax_params: count("softmax")?,
        })
    }

    /// Relative increase over the softmax baseline (0.05 = 5% more).
    pub fn increase(&self) -> f64 {
        self.n_params as f64 / self.softmax_params as f64 - 1.0
    }
}

/// Bytes training holds per parameter, activations aside: the f32 weights, their gradients,
/// AdamW's two moments and the best-validation copy.
const TRAINING_BYTES_PER_PARAM: u64 = 5 * 4;

/// Scalars in the parameters of the classifier for `config` with the attention called
/// `attention` (frozen ones included), counted from shapes with checked arithmetic and without
/// building the model: the encoder is counted from one lazily built block
/// ([`burn_attention_zoo::EncoderConfig::num_params`]), the rest from a lazily built one-layer
/// classifier. `None` when the count does not fit in a `usize`.
pub fn num_params_checked(
    config: &RunConfig,
    attention: &str,
    vocab_size: usize,
    n_classes: usize,
) -> Result<Option<usize>> {
    let device = crate::backend::any_device()?;
    let encoder = config.encoder_config(attention)?.num_params(&device)?;
    let mut one_layer = config.clone();
    one_layer.model.n_layers = 1;
    let model = LraClassifier::new(&one_layer, attention, vocab_size, n_classes, &device)?;
    let whole = burn_attention_zoo::num_params_checked(&model);
    let its_encoder = burn_attention_zoo::num_params_checked(&model.encoder);
    Ok(whole
        .zip(its_encoder)
        .zip(encoder)
        .and_then(|((whole, its), encoder)| (whole - its).checked_add(encoder)))
}

/// Refuses a configuration whose parameters cannot be trained in the memory this machine has
/// available (or cannot even be counted), naming the field that makes them too large, before
/// anything is allocated: parameters are counted from shapes ([`num_params_checked`]).
///
/// Activations are not counted: batches are padded to their longest example, so they grow with
/// the data, not with `data.max_len`. Where the available memory is unknown (not Linux), only
/// the count itself is checked.
pub fn check_memory(
    config: &RunConfig,
    attention: &str,
    vocab_size: usize,
    n_classes: usize,
) -> Result<()> {
    let available = available_memory().unwrap_or(u64::MAX);
    let needs = |config: &RunConfig| -> Result<Option<u64>> {
        Ok(
            num_params_checked(config, attention, vocab_size, n_classes)?
                .and_then(|n| (n as u64).checked_mul(TRAINING_BYTES_PER_PARAM)),
        )
    };
    let fits = |bytes: Option<u64>| bytes.is_some_and(|b| b <= available);
    let bytes = needs(config)?;
    if fits(bytes) {
        return Ok(());
    }
    // The field to name: the first whose smaller value brings the model within reach.
    let mut shorter = config.clone();
    shorter.data.max_len = config.data.max_len.min(512);
    let mut defaults = config.clone();
    defaults.attention.remove(attention);
    let mut one_layer = config.clone();
    one_layer.model.n_layers = 1;
    let field = if fits(needs(&shorter)?) {
        format!("`data.max_len` = {}", config.data.max_len)
    } else if config.attention.contains_key(attention) && fits(needs(&defaults)?) {
        format!("`attention.{attention}`")
    } else if config.model.n_layers > 1 && fits(needs(&one_layer)?) {
        format!("`model.n_layers` = {}", config.model.n_layers)
    } else {
        "the `model` sizes (`d_model`, `d_ff`, `d_mlp`, `n_layers`)".to_string()
    };
    let gb = |b: u64| b as f64 / 1e9;
    match bytes {
        None => bail!(
            "{field} is too large: the model's parameters are more than can be counted (over \
             2^64 bytes to train)"
        ),
        Some(bytes) => bail!(
            "{field} is too large: training the model's {} parameters needs {:.1} GB (weights, \
             gradients, AdamW's two moments and the best-validation copy), more than the {:.1} GB \
             of memory available",
            bytes / TRAINING_BYTES_PER_PARAM,
            gb(bytes),
            gb(available)
        ),
    }
}

/// The memory the kernel can give this process without swapping (`MemAvailable`), in bytes.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Fixed sinusoidal positions `[n, d]`: sines in the first half of the features, cosines in the
/// second (Flax's `sinusoidal_init`, used by the LRA reference), wavelengths up to 10000·2π.
pub fn sinusoidal(n: usize, d: usize, device: &Device) -> Tensor<2> {
    let half = d / 2;
    let pos = Tensor::<1, Int>::arange(0..n as i64, device)
        .float()
        .reshape([n, 1]);
    let i = Tensor::<1, Int>::arange(0..half as i64, device).float();
    let inv_freq = i
        .mul_scalar(-2.0 * (10_000f64).ln() / d as f64)
        .exp()
        .reshape([1, half]);
    let angles = pos.mul(inv_freq);
    let mut parts = vec![angles.clone().sin(), angles.cos()];
    if !d.is_multiple_of(2) {
        parts.push(Tensor::zeros([n, 1], device));
    }
    Tensor::cat(parts, 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Task, TaskShape};
    use crate::data::{Batch, Example};
    use burn::tensor::Tolerance;

    /// The Yorsh & Kovalenko budget: every trainable kernel adds less than 10% parameters over
    /// the softmax model on each task's `lra` preset. The expected increase is also counted by
    /// hand: `n_layers · units · d_head²` per full matrix (shared by a layer's heads).
    #[test]
    fn trainable_kernels_stay_within_ten_percent_on_lra_presets() {
        let device = Device::flex();
        for task in Task::ALL {
            let config = RunConfig::preset(task, "lra").unwrap();
            let m = &config.model;
            let d = m.d_model / m.n_heads;
            for (name, matrices) in [
                ("ff-linear", d * d),
                ("ff-orth-linear", d * d),
                ("ff-glu", 2 * d * d),
                ("ff-oglu", 2 * d * d),
                ("ff-aoglu", 3 * (d * d + 2 * d * (d / 4))),
            ] {
                let budget =
                    ParamBudget::count(&config, name, task.vocab_size(), task.n_classes(), &device)
                        .unwrap();
                assert_eq!(
                    budget.n_params - budget.softmax_params,
                    m.n_layers * matrices,
                    "{} {name}",
                    task.name()
                );
                assert!(
                    budget.increase() < 0.10,
                    "{} {name}: {:.2}% over softmax",
                    task.name(),
                    100.0 * budget.increase()
                );
            }
        }
    }

    /// The count from shapes (one block built, lazily) equals Burn's count over the whole built
    /// model, for every attention and every task's `lra` preset at 2 and 3 layers; sizes whose
    /// product overflows give no count, and the memory check refuses them naming the field,
    /// without building anything.
    #[test]
    fn parameters_are_counted_from_shapes() {
        let device = Device::flex();
        for task in Task::ALL {
            let mut config = RunConfig::preset(task, "tiny").unwrap();
            for n_layers in [2, 3] {
                config.model.n_layers = n_layers;
                for variant in burn_attention_zoo::VARIANTS {
                    let built = LraClassifier::new(
                        &config,
                        variant.name,
                        task.vocab_size(),
                        task.n_classes(),
                        &device,
                    )
                    .unwrap();
                    let counted = num_params_checked(
                        &config,
                        variant.name,
                        task.vocab_size(),
                        task.n_classes(),
                    )
                    .unwrap();
                    assert_eq!(
                        counted,
                        Some(built.num_params()),
                        "{} {}",
                        task.name(),
                        variant.name
                    );
                }
            }
        }
        let mut config = RunConfig::preset(Task::Listops, "tiny").unwrap();
        config.model.d_model = 4_000_000_000;
        config.model.n_heads = 1;
        config.model.d_ff = 4_000_000_000;
        config.model.n_layers = 4_000_000_000;
        assert_eq!(
            num_params_checked(&config, "softmax", 16, 10).unwrap(),
            None
        );
        let err = format!(
            "{:#}",
            check_memory(&config, "softmax", 16, 10).unwrap_err()
        );
        assert!(err.contains("more than can be counted"), "{err}");
        let mut config = RunConfig::preset(Task::Listops, "tiny").unwrap();
        config.model.n_layers = 4_000_000_000;
        let err = format!(
            "{:#}",
            check_memory(&config, "softmax", 16, 10).unwrap_err()
        );
        assert!(
            err.starts_with("`model.n_layers` = 4000000000 is too large"),
            "{err}"
        );
    }

    /// Frozen tensors are not trainable: Performer's random features leave its count equal to
    /// softmax's, while Burn's `num_params` includes them.
    #[test]
    fn budget_counts_trainable_parameters_only() {
        let device = Device::flex();
        let config = RunConfig::preset(Task::Listops, "tiny").unwrap();
        let budget = ParamBudget::count(&config, "performer", 16, 10, &device).unwrap();
        assert_eq!(budget.n_params, budget.softmax_params);
        let model = LraClassifier::new(&config, "performer", 16, 10, &device).unwrap();
        assert!(model.num_params() > budget.n_params);
        assert_eq!(
            ParamBudget::count(&config, "softmax", 16, 10, &device)
                .unwrap()
                .n_params,
            LraClassifier::new(&config, "softmax", 16, 10, &device)
                .unwrap()
                .num_params()
        );
    }

    /// The matching model: both documents' padding is ignored, the two towers share one encoder,
    /// and swapping the order of documents changes the interaction features (not symmetric).
    #[test]
    fn matching_pairs_ignore_padding() {
        let device = Device::flex();
        let config = RunConfig::preset(Task::Matching, "tiny").unwrap();
        let model = LraClassifier::new(&config, "softmax", 257, 2, &device).unwrap();
        let pair = |a: Vec<u16>, b: Vec<u16>| Example {
            tokens: a,
            pair: Some(b),
            label: 0,
        };
        let x = pair(vec![5, 6, 7], vec![8, 9, 10, 11]);
        let y = pair(vec![50; 4], vec![60; 2]);
        let long = pair(vec![70; 30], vec![80; 25]);
        let logits = |examples: &[&Example]| {
            let batch = Batch::new(examples, &device);
            model
                .forward(batch.tokens, batch.pair)
                .slice(s![0..2])
                .into_data()
        };
        logits(&[&x, &y, &long]).assert_approx_eq::<f32>(
            &logits(&[&x, &y]),
            Tolerance::absolute(1e-5).set_relative(1e-4),
        );
    }

    /// The `lra` presets build the LRA reference models: parameter counts derived in docs/lra.md
    /// (ListOps 8.95M, Text 3.49M, Matching 1.09M with the concat head).
    #[test]
    fn lra_presets_have_the_reference_sizes() {
        let device = Device::flex();
        for (task, expected, concat) in [
            (Task::Listops, 8.95e6, false),
            (Task::Text, 3.49e6, false),
            (Task::Matching, 1.09e6, true),
        ] {
            let mut config = RunConfig::preset(task, "lra").unwrap();
            if concat {
                config.model.pair_features = PairFeatures::Concat;
            }
            let n = ParamBudget::count(
                &config,
                "softmax",
                task.vocab_size(),
                2.max(task.n_classes()),
                &device,
            )
            .unwrap()
            .n_params as f64;
            assert!(
                (n - expected).abs() < 0.005e6,
                "{}: {n} parameters, docs/lra.md: {expected}",
                task.name()
            );
        }
    }

    #[test]
    fn sinusoidal_matches_formula() {
        // Flax's sinusoidal_init in float64: pe[p, i] = sin(p / 10000^(2i/d)) for i < d/2, and
        // cos of the same angle at i + d/2.
        let (n, d) = (9, 6);
        let got: Vec<f32> = sinusoidal(n, d, &Device::flex())
            .into_data()
            .convert::<f32>()
            .try_to_vec()
            .unwrap();
        for p in 0..n {
            for i in 0..d / 2 {
                let angle = p as f64 / 10_000f64.powf(2.0 * i as f64 / d as f64);
                assert!((got[p * d + i] as f64 - angle.sin()).abs() < 1e-5);
                assert!((got[p * d + i + d / 2] as f64 - angle.cos()).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn logits_ignore_extra_padding() {
        // The same examples batched with a much longer one (more padding) give the same logits,
        // for both poolings and both position kinds.
        let device = Device::flex();
        let short = Example::new(vec![12, 3, 4, 15], 1);
        let other = Example::new(vec![11, 3, 4, 5, 6, 15], 2);
        let long = Example::new(vec![14; 40], 3);
        for (pooling, positions) in [
            (Pooling::Mean, Positions::Learned),
            (Pooling::Cls, Positions::Sinusoidal),
        ] {
            for attention in ["softmax", "linformer"] {
                let mut config = RunConfig::preset(Task::Listops, "tiny").unwrap();
                config.model.pooling = pooling;
                config.model.positions = positions;
                let model = LraClassifier::new(&config, attention, 16, 10, &device).unwrap();
                let logits = |examples: &[&Example]| {
                    let batch = Batch::new(examples, &device);
                    model
                        .forward(batch.tokens, batch.pair)
                        .slice(s![0..2])
                        .into_data()
                };
                logits(&[&short, &other, &long]).assert_approx_eq::<f32>(
                    &logits(&[&short, &other]),
                    Tolerance::absolute(1e-5).set_relative(1e-4),
                );
            }
        }
    }
}
