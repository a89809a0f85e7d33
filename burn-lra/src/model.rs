//! The LRA encoder classifier: embeddings, positions, any attention's encoder, pooling, head.
//!
//! Token embedding (N(0, `model.embedding_std`²): 1 as the LRA reference, 0.02 in `small`) ->
//! CLS vector prepended (zero-initialised, CLS pooling only) ->
//! positions -> dropout -> pre-LN encoder with a final LayerNorm -> pooling ->
//! `Dense(d_mlp) ReLU Dense(classes)` (the LRA JAX reference, docs/lra.md).

use anyhow::{Context, Result, bail};
use burn::module::{Module, Param};
use burn::nn::{
    Dropout, DropoutConfig, Embedding, EmbeddingConfig, Initializer, Linear, LinearConfig,
};
use burn::prelude::*;
use burn_attention_zoo::engines::dropout::dropout;
use burn_attention_zoo::{AttentionConfig, AttentionInput, Encoder, EncoderConfig};

use crate::config::{ModelConfig, Objective, PairFeatures, Pooling, Positions, RunConfig};
use crate::data::Tokens;
use crate::tasks::{LraTask, Prediction};

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
    /// Whether the head predicts at positions (token-level tasks) instead of from the pooled
    /// sequence.
    #[module(skip)]
    pub per_position: bool,
    /// Whether the encoder masks the future (see [`ClassifierSpec::causal`]).
    #[module(skip)]
    pub causal: bool,
    /// Whether positions are added to the embeddings (learned or sinusoidal); `false` with
    /// rotary positions, which the attentions apply.
    #[module(skip)]
    pub additive_positions: bool,
    /// Model width.
    pub d_model: usize,
}

/// What a classifier is, resolved once from a configuration, a task and an attention name
/// (the run's plan holds it): the model's settings, the encoder with its attention, and what the
/// data fix: vocabulary, classes and whether examples are pairs.
#[derive(Debug, Clone)]
pub struct ClassifierSpec {
    /// The model's settings.
    pub model: ModelConfig,
    /// The encoder, its attention resolved.
    pub encoder: EncoderConfig,
    /// Longest sequence the encoder sees (`data.max_len`, plus one with CLS pooling).
    pub encoder_len: usize,
    /// Token ids are below this.
    pub vocab_size: usize,
    /// Outputs of the head: the classes, or for a token-level task the vocabulary.
    pub n_classes: usize,
    /// How the two documents of a pair meet in the head; `None` for single-document tasks.
    pub pair_features: Option<PairFeatures>,
    /// Whether the head predicts at positions (a token-level task) instead of from the pooled
    /// sequence.
    pub per_position: bool,
    /// Whether the encoder masks the future: token-level tasks where every layer's attention
    /// has a causal form; never for per-example tasks.
    pub causal: bool,
}

impl ClassifierSpec {
    /// The classifier of `task` for `config` with the attention called `attention`; the error
    /// names the attention's field that does not fit.
    pub fn resolve(config: &RunConfig, task: &dyn LraTask, attention: &str) -> Result<Self> {
        let objective = config.training.objective;
        let pretraining = objective.is_pretraining();
        let per_position = pretraining || task.prediction() == Prediction::Token;
        // Self-pretraining predicts the inputs' own tokens (the mask token among the inputs of
        // masked-token denoising, never among the targets), one document at a time.
        let vocab_size = crate::tasks::vocab_size(task, config)? + objective.extra_tokens();
        let mut spec = Self {
            model: config.model.clone(),
            encoder: config
                .encoder_config(attention)
                .with_context(|| format!("attention `{attention}`"))?,
            encoder_len: config.encoder_len(),
            vocab_size,
            n_classes: match pretraining {
                true => vocab_size,
                false => crate::tasks::n_outputs(task, config)?,
            },
            pair_features: (task.pairs() && !pretraining).then_some(config.model.pair_features),
            per_position,
            causal: false,
        };
        let all_causal =
            (spec.attentions().iter()).all(|attention| attention.info().capabilities.causal);
        spec.causal = match objective {
            Objective::Task => per_position && all_causal,
            Objective::MaskedTokens => false,
            Objective::NextToken if all_causal => true,
            Objective::NextToken => bail!(
                "training.objective = \"next-token\": attention `{attention}` has no causal \
                 form (each token would see the one it predicts); use \"masked-tokens\""
            ),
        };
        Ok(spec)
    }

    /// The attention's configuration: every layer's, or, in a hybrid stack, each layer's in
    /// order.
    pub fn attentions(&self) -> Vec<&AttentionConfig> {
        if self.encoder.is_hybrid() {
            self.encoder.layer_attentions()
        } else {
            vec![&self.encoder.block.attention]
        }
    }
}

impl LraClassifier {
    /// Builds the classifier `spec` describes (its parameters drawn on first use).
    pub fn new(spec: &ClassifierSpec, device: &Device) -> Self {
        let m = &spec.model;
        // Matching (docs/lra.md): `MLP([X1, X2, X1*X2, X1-X2])` or `MLP([X1, X2])`, with
        // Dense(mlp) ReLU Dense(mlp/2) ReLU Dense(classes).
        let pair_features = spec.pair_features;
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
        Self {
            embedding: EmbeddingConfig::new(spec.vocab_size, m.d_model)
                .with_initializer(Initializer::Normal {
                    mean: 0.0,
                    std: m.embedding_std,
                })
                .init(device),
            // Built lazily, as every other parameter: a model can be counted before it exists.
            cls: (m.pooling == Pooling::Cls)
                .then(|| Initializer::Zeros.init([1, 1, m.d_model], device)),
            positions: (m.positions == Positions::Learned).then(|| {
                EmbeddingConfig::new(spec.encoder_len, m.d_model)
                    .with_initializer(Initializer::Normal {
                        mean: 0.0,
                        std: 0.02,
                    })
                    .init(device)
            }),
            dropout: DropoutConfig::new(m.dropout).init(),
            encoder: match m.positions {
                Positions::Rotary => spec.encoder.init(device).with_rotary().expect(
                    "the configuration's check refuses rotary positions an attention does not take",
                ),
                Positions::Sinusoidal | Positions::Learned => spec.encoder.init(device),
            },
            additive_positions: m.positions != Positions::Rotary,
            head_hidden: dense(head_in, m.d_mlp),
            head_mid: pair_features.map(|_| dense(m.d_mlp, m.d_mlp / 2)),
            head_out: dense(
                if pair_features.is_some() {
                    m.d_mlp / 2
                } else {
                    m.d_mlp
                },
                spec.n_classes,
            ),
            pair_features,
            pooling: m.pooling,
            per_position: spec.per_position,
            causal: spec.causal,
            d_model: m.d_model,
        }
    }

    /// The regularisation terms the attentions ask the loss to add (the trainable kernels'
    /// orthogonality penalty), summed over layers; `None` when there are none.
    pub fn penalty(&self) -> Option<Tensor<1>> {
        self.encoder.penalty()
    }

    /// Pooled representation `[batch, d_model]` of `tokens: [batch, n]` with padding mask
    /// `[batch, n]` (`true` = padding). The matching task's two towers share this.
    pub fn encode(&self, tokens: Tensor<2, Int>, mask_pad: Tensor<2, Bool>) -> Tensor<2> {
        self.encode_as(tokens, mask_pad, false).0
    }

    /// [`encode`](Self::encode), and with `with_loss` the attentions' auxiliary losses for
    /// this input (see [`Encoder::try_forward_with_loss`]).
    fn encode_as(
        &self,
        tokens: Tensor<2, Int>,
        mask_pad: Tensor<2, Bool>,
        with_loss: bool,
    ) -> (Tensor<2>, Option<Tensor<1>>) {
        let [batch, _] = tokens.dims();
        let (h, mask, loss) = self.encode_positions(tokens, mask_pad, with_loss);
        let pooled = match self.pooling {
            Pooling::Cls => h.slice([0..batch, 0..1]).reshape([batch, self.d_model]),
            Pooling::Mean => {
                let keep = mask.bool_not().float().unsqueeze_dim::<3>(2);
                let count = keep.clone().sum_dim(1).clamp_min(1.0);
                (h * keep)
                    .sum_dim(1)
                    .div(count)
                    .reshape([batch, self.d_model])
            }
        };
        (pooled, loss)
    }

    /// The encoder's output at every position, `[batch, n, d_model]` (the CLS vector first
    /// where there is one), the padding mask it ran with, and with `with_loss` the attentions'
    /// auxiliary losses.
    fn encode_positions(
        &self,
        tokens: Tensor<2, Int>,
        mask_pad: Tensor<2, Bool>,
        with_loss: bool,
    ) -> (Tensor<3>, Tensor<2, Bool>, Option<Tensor<1>>) {
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
            None if self.additive_positions => {
                x + sinusoidal(n, self.d_model, &device).unsqueeze::<3>()
            }
            // Rotary positions: the attentions rotate their queries and keys.
            None => x,
        };
        let x = dropout(&self.dropout, x);
        let input = AttentionInput::new(x)
            .mask_pad(mask.clone())
            .causal(self.causal);
        let (h, loss) = if with_loss {
            self.encoder
                .try_forward_with_loss(input)
                .unwrap_or_else(|err| panic!("{err}"))
        } else {
            (self.encoder.forward(input), None)
        };
        (h, mask, loss)
    }

    /// The numbers a causal model's decoding keeps after a sequence of `n` tokens
    /// (`DecodingState::num_elements` over every layer, one sequence): the key/value cache for
    /// softmax, the fixed-size state of a recurrent attention. What MQAR's state-size picture
    /// puts on its horizontal axis. `None` for a model that reads the whole sequence, or whose
    /// attention does not decode.
    pub fn decoding_state_elements(&self, n: usize) -> Option<usize> {
        if !self.causal || n == 0 {
            return None;
        }
        let device = self.embedding.weight.device();
        // The state's size depends on the shapes only, not on the values.
        let x = Tensor::<3>::zeros([1, n, self.d_model], &device);
        let (_, states) = self.encoder.prefill(x).ok()?;
        states
            .iter()
            .try_fold(0usize, |total, s| total.checked_add(s.num_elements()))
    }

    /// Logits `[predictions, classes]` of the documents `tokens` (and, for matching, their
    /// partners `pair`, encoded by the same encoder): one row per example, or for a token-level
    /// model one per entry of `positions` (flat indices `row · n + position` into `tokens`,
    /// [`Batch::positions`](crate::data::Batch::positions)), over the vocabulary.
    ///
    /// # Panics
    /// If a matching model gets no `pair`, or a single-sequence model gets one; if a
    /// token-level model gets no `positions`, or a per-example model gets some.
    pub fn forward(
        &self,
        tokens: Tokens,
        pair: Option<Tokens>,
        positions: Option<Tensor<1, Int>>,
    ) -> Tensor<2> {
        self.forward_as(tokens, pair, positions, false).0
    }

    /// [`forward`](Self::forward) for training: the logits and the sum of the attentions'
    /// auxiliary losses over the encoded sequences (`None` when no attention has one), for
    /// the training objective to add.
    pub fn forward_with_loss(
        &self,
        tokens: Tokens,
        pair: Option<Tokens>,
        positions: Option<Tensor<1, Int>>,
    ) -> (Tensor<2>, Option<Tensor<1>>) {
        self.forward_as(tokens, pair, positions, true)
    }

    fn forward_as(
        &self,
        tokens: Tokens,
        pair: Option<Tokens>,
        positions: Option<Tensor<1, Int>>,
        with_loss: bool,
    ) -> (Tensor<2>, Option<Tensor<1>>) {
        use burn::tensor::activation::relu;
        let (features, loss) = match (self.per_position, positions) {
            (true, Some(positions)) => {
                let (h, _, loss) = self.encode_positions(tokens.ids, tokens.mask_pad, with_loss);
                let [batch, n, d] = h.dims();
                // `positions` index the tokens: the CLS vector, where there is one, is not one.
                let h = match self.cls {
                    Some(_) => h.slice([0..batch, 1..n]),
                    None => h,
                };
                let n = h.dims()[1];
                (h.reshape([batch * n, d]).select(0, positions), loss)
            }
            (false, None) => self.features(tokens, pair, with_loss),
            (true, None) => panic!("a token-level model got no positions to predict at"),
            (false, Some(_)) => panic!("a per-example model got positions to predict at"),
        };
        let mut hidden = relu(self.head_hidden.forward(features));
        if let Some(mid) = &self.head_mid {
            hidden = relu(mid.forward(hidden));
        }
        (self.head_out.forward(hidden), loss)
    }

    /// What the head of a per-example model reads, `[batch, features]`: the pooled document,
    /// or a pair's pooled documents combined; and the attentions' auxiliary losses.
    fn features(
        &self,
        tokens: Tokens,
        pair: Option<Tokens>,
        with_loss: bool,
    ) -> (Tensor<2>, Option<Tensor<1>>) {
        let (x1, loss) = self.encode_as(tokens.ids, tokens.mask_pad, with_loss);
        match (self.pair_features, pair) {
            (None, None) => (x1, loss),
            (Some(kind), Some(pair)) => {
                let (x2, pair_loss) = self.encode_as(pair.ids, pair.mask_pad, with_loss);
                let loss = match (loss, pair_loss) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                };
                let features = match kind {
                    PairFeatures::Interact => Tensor::cat(
                        vec![x1.clone(), x2.clone(), x1.clone() * x2.clone(), x1 - x2],
                        1,
                    ),
                    PairFeatures::Concat => Tensor::cat(vec![x1, x2], 1),
                };
                (features, loss)
            }
            (None, Some(_)) => panic!("a single-sequence model got document pairs"),
            (Some(_), None) => panic!("a matching model got single documents"),
        }
    }
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
    use crate::data::{Batch, Example};
    use burn::tensor::Tolerance;
    use burn_attention_zoo::Attention;

    /// The classifier of `config`'s task with `attention`.
    fn classifier(config: &RunConfig, attention: &str, device: &Device) -> LraClassifier {
        let task = crate::tasks::find(config.task.name()).unwrap();
        LraClassifier::new(
            &ClassifierSpec::resolve(config, task, attention).unwrap(),
            device,
        )
    }

    /// The matching model: both documents' padding is ignored, the two towers share one encoder,
    /// and swapping the order of documents changes the interaction features (not symmetric).
    #[test]
    fn matching_pairs_ignore_padding() {
        let device = Device::flex();
        let config = RunConfig::preset("matching", "tiny").unwrap();
        let model = classifier(&config, "softmax", &device);
        let pair = |a: Vec<u16>, b: Vec<u16>| Example {
            pair: Some(b),
            ..Example::new(a, 0)
        };
        let x = pair(vec![5, 6, 7], vec![8, 9, 10, 11]);
        let y = pair(vec![50; 4], vec![60; 2]);
        let long = pair(vec![70; 30], vec![80; 25]);
        let logits = |examples: &[&Example]| {
            let batch = Batch::new(examples, &device);
            model
                .forward(batch.tokens, batch.pair, batch.positions)
                .slice(s![0..2])
                .into_data()
        };
        logits(&[&x, &y, &long]).assert_approx_eq::<f32>(
            &logits(&[&x, &y]),
            Tolerance::absolute(1e-5).set_relative(1e-4),
        );
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
                let mut config = RunConfig::preset("listops", "tiny").unwrap();
                config.model.pooling = pooling;
                config.model.positions = positions;
                let model = classifier(&config, attention, &device);
                let logits = |examples: &[&Example]| {
                    let batch = Batch::new(examples, &device);
                    model
                        .forward(batch.tokens, batch.pair, batch.positions)
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

    /// With `model.positions = "rotary"` nothing is added to the embeddings, every layer's
    /// attention rotates its queries and keys, extra padding leaves the logits as they were, and
    /// the positions reach the output (reversing a sequence changes its logits, which a model
    /// without positions and mean pooling could not tell apart). An attention that takes no rotary
    /// positions is refused when the configuration is read, the error naming it and the key.
    #[test]
    fn rotary_positions_rotate_in_every_layer() {
        let device = Device::flex();
        let forward = Example::new(vec![12, 3, 4, 15, 7, 9], 1);
        let reversed = Example::new(vec![9, 7, 15, 4, 3, 12], 1);
        let long = Example::new(vec![14; 40], 3);
        let mut config = RunConfig::preset("listops", "tiny").unwrap();
        config.model.pooling = Pooling::Mean;
        config.model.positions = Positions::Rotary;
        // The preset's tables for attentions that take no rotary positions (Linformer, ETC)
        // do not make the configuration invalid: only the attention trained is asked.
        config.validate().unwrap();
        for attention in ["softmax", "linear"] {
            let model = classifier(&config, attention, &device);
            assert!(model.positions.is_none() && !model.additive_positions);
            assert!(
                model.encoder.blocks.iter().all(
                    |block| matches!(&block.attention, Attention::Softmax(a) if a.proj.rotary)
                        || matches!(&block.attention, Attention::Linear(a) if a.proj.rotary)
                ),
                "{attention}"
            );
            let logits = |examples: &[&Example]| {
                let batch = Batch::new(examples, &device);
                model.forward(batch.tokens, batch.pair, batch.positions)
            };
            let alone = logits(&[&forward, &reversed]);
            logits(&[&forward, &reversed, &long])
                .slice(s![0..2])
                .into_data()
                .assert_approx_eq::<f32>(
                    &alone.clone().into_data(),
                    Tolerance::absolute(1e-5).set_relative(1e-4),
                );
            let gap: f32 = (alone.clone().slice(s![0..1]) - alone.slice(s![1..2]))
                .abs()
                .max()
                .into_scalar();
            assert!(gap > 1e-4, "{attention}: reversing changed nothing ({gap})");
        }
        let err =
            ClassifierSpec::resolve(&config, crate::tasks::find("listops").unwrap(), "linformer")
                .unwrap_err();
        let message = format!("{err:#}");
        assert!(
            message.contains("linformer") && message.contains("rotary"),
            "{message}"
        );
    }

    /// A token-level model predicts at the positions a batch lists, one row each, from the
    /// positions before them when its attention is causal: a later token leaves the logits as
    /// they were and an earlier one changes them; a bidirectional attention reads both.
    #[test]
    fn token_level_model_reads_the_past_when_causal() {
        let device = Device::flex();
        let config = RunConfig::preset("mqar", "tiny").unwrap();
        let tokens: Vec<u16> = (1..=64).collect();
        let mut targets = vec![0u16; 64];
        (targets[40], targets[44]) = (300, 301);
        for (attention, causal) in [("softmax", true), ("linformer", false)] {
            let model = classifier(&config, attention, &device);
            assert_eq!(
                (model.per_position, model.causal),
                (true, causal),
                "{attention}"
            );
            let logits = |tokens: Vec<u16>| {
                let example = Example::with_targets(tokens, targets.clone());
                let batch = Batch::new(&[&example], &device);
                let logits = model.forward(batch.tokens, batch.pair, batch.positions);
                assert_eq!(logits.dims(), [2, 512]);
                logits
                    .into_data()
                    .convert::<f32>()
                    .try_to_vec::<f32>()
                    .unwrap()
            };
            let moved = |at: usize| {
                let mut changed = tokens.clone();
                changed[at] = 7;
                let (a, b) = (logits(tokens.clone()), logits(changed));
                a.iter()
                    .zip(&b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0f32, f32::max)
            };
            assert!(
                moved(10) > 1e-4,
                "{attention}: an earlier token changes nothing"
            );
            let later = moved(50);
            assert_eq!(
                later < 1e-6,
                causal,
                "{attention}: a later token moved logits by {later}"
            );
        }
    }

    /// The decoding state a causal model keeps: softmax's key/value cache, a key and a value of
    /// `d_model` numbers per token and layer; linear attention's fixed state, the same at any
    /// length; none for a bidirectional model.
    #[test]
    fn decoding_state_counts_the_cache_or_the_fixed_state() {
        let device = Device::flex();
        let config = RunConfig::preset("mqar", "tiny").unwrap();
        let (layers, d) = (config.model.n_layers, config.model.d_model);
        let softmax = classifier(&config, "softmax", &device);
        for n in [16, 64] {
            assert_eq!(softmax.decoding_state_elements(n), Some(layers * 2 * n * d));
        }
        let linear = classifier(&config, "linear", &device);
        let short = linear.decoding_state_elements(16).unwrap();
        assert!(short > 0);
        assert_eq!(linear.decoding_state_elements(64), Some(short));
        let bidirectional = classifier(&config, "linformer", &device);
        assert_eq!(bidirectional.decoding_state_elements(64), None);
    }
}
