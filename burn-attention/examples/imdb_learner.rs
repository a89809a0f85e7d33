//! A sentiment classifier trained with burn-train's `Learner`: the library's `Encoder` in a Burn
//! model, Burn's own training loop, and Performer's random features redrawn through the one
//! hook the Learner gives a model, `TrainStep::optimize`.
//!
//! ```sh
//! cargo run --release --example imdb_learner -- --data-dir path/to/imdb   # aclImdb folder or .tar.gz
//! cargo run --release --example imdb_learner                             # generated reviews
//! cargo run --release --example imdb_learner -- --attention linformer --epochs 2 --out runs/lf
//! ```
//!
//! Model: word embeddings (the training reviews' 20,000 most frequent words, lower-cased; the
//! rest share one id) plus learned positions, a pre-LN `Encoder` (any variant by `--attention`,
//! `performer` by default), the mean over the review's words (padding left out),
//! a linear head over the two classes. The Learner writes its logs and checkpoints into `--out`
//! (a folder it creates; an existing one is refused).
//!
//! The redraw: `Learner` calls `TrainStep::optimize(self, optimizer, lr, grads)` once per
//! optimiser step, and a model may override it to act on itself after the update. `Classifier`
//! counts its steps there and calls `Encoder::redraw` every `redraw_every` of them (the count is
//! a plain field: Burn records keep parameters only, so a resumed run counts from 0 again).
//!
//! `cargo test -p burn-attention-zoo --example imdb_learner` trains it for a few dozen steps on
//! generated reviews and checks that it learns and that the features were redrawn.

use std::collections::HashMap;
use std::path::PathBuf;

use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::lr_scheduler::module_lr_scheduler::ModuleLearningRate;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams, ModuleOptimizer, MultiGradientsParams};
use burn::prelude::*;
use burn::train::logger::{EvaluationProgressLogger, TrainingProgressLogger};
use burn::train::metric::{AccuracyMetric, LossMetric, MetricDefinition};
use burn::train::renderer::{
    EvaluationName, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining,
};
use burn::train::{
    ClassificationOutput, InferenceStep, Learner, SupervisedTraining, TrainOutput, TrainStep,
};
use burn_attention_zoo::{
    AttentionConfig, AttentionInput, Encoder, EncoderBlockConfig, EncoderConfig,
    padding_mask_from_lengths,
};

#[path = "shared/imdb.rs"]
mod imdb;
#[path = "shared/rng.rs"]
mod rng;

use imdb::Review;
use rng::Rng;

/// What a run trains, on what, and where it writes.
#[derive(Clone, Debug)]
struct Settings {
    data_dir: Option<PathBuf>,
    attention: String,
    /// Words of a review kept (the rest is cut off).
    max_len: usize,
    /// Words with their own embedding (the most frequent of the training reviews; the others
    /// share one).
    vocabulary: usize,
    /// Reviews per class read for training and for validation.
    train_per_class: usize,
    valid_per_class: usize,
    d_model: usize,
    n_heads: usize,
    d_ff: usize,
    n_layers: usize,
    batch: usize,
    epochs: usize,
    learning_rate: f64,
    /// Optimiser steps between two redraws of Performer's features; 0 never redraws.
    redraw_every: usize,
    out: PathBuf,
}

impl Settings {
    /// A few minutes on two CPU cores.
    fn default_run() -> Self {
        Self {
            data_dir: None,
            attention: "performer".into(),
            max_len: 256,
            vocabulary: 20_000,
            train_per_class: 5_000,
            valid_per_class: 1_000,
            d_model: 64,
            n_heads: 4,
            d_ff: 128,
            n_layers: 2,
            batch: 16,
            epochs: 2,
            learning_rate: 1e-3,
            redraw_every: 100,
            out: PathBuf::from("runs/imdb-learner"),
        }
    }
}

fn parse_args() -> Result<Settings, String> {
    let mut settings = Settings::default_run();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("`{flag}` needs a value"))?;
        let count = || {
            value
                .parse::<usize>()
                .map_err(|_| format!("{flag}: not a count: {value}"))
        };
        match flag.as_str() {
            "--data-dir" => settings.data_dir = Some(PathBuf::from(&value)),
            "--attention" => settings.attention = value.clone(),
            "--out" => settings.out = PathBuf::from(&value),
            "--max-len" => settings.max_len = count()?,
            "--vocabulary" => settings.vocabulary = count()?,
            "--train-per-class" => settings.train_per_class = count()?,
            "--epochs" => settings.epochs = count()?,
            "--redraw-every" => settings.redraw_every = count()?,
            other => {
                return Err(format!(
                    "unknown argument `{other}` (expected --data-dir, --attention, --out, \
                     --max-len, --vocabulary, --train-per-class, --epochs, --redraw-every)"
                ));
            }
        }
    }
    if settings.max_len == 0 || settings.train_per_class == 0 || settings.epochs == 0 {
        return Err("--max-len, --train-per-class and --epochs: at least 1".into());
    }
    if settings.vocabulary < 2 {
        return Err("--vocabulary: at least 2 (id 0 stands for the words left out)".into());
    }
    Ok(settings)
}

fn main() {
    if let Err(err) = parse_args().and_then(|settings| run(&settings)) {
        eprintln!("error: {err}");
        std::process::exit(2);
    }
}

fn run(settings: &Settings) -> Result<(), String> {
    let (train, valid, vocabulary) = encoded_reviews(settings)?;
    println!(
        "{} training and {} validation reviews from {}",
        train.len(),
        valid.len(),
        settings
            .data_dir
            .as_ref()
            .map_or("the generator".to_string(), |d| d.display().to_string())
    );
    let device = Device::flex();
    device.seed(0);
    let model =
        ClassifierConfig::from_settings(settings, vocabulary)?.init(&device.clone().autodiff());
    let model = train_with_learner(settings, model, train, valid.clone())?;
    println!(
        "validation accuracy of the trained model: {:.1}% (redrawn {} times)",
        100.0 * accuracy(&model, &valid, settings),
        model.redraws()
    );
    Ok(())
}

/// The training and validation reviews: from `--data-dir` (its `train` and `test` splits), or
/// generated.
fn reviews(settings: &Settings) -> Result<(Vec<Review>, Vec<Review>), String> {
    Ok(match &settings.data_dir {
        Some(dir) => (
            imdb::read_reviews(dir, "train", settings.train_per_class)?,
            imdb::read_reviews(dir, "test", settings.valid_per_class)?,
        ),
        None => (
            generated_reviews(2 * settings.train_per_class, 1),
            generated_reviews(2 * settings.valid_per_class, 2),
        ),
    })
}

/// The training and validation reviews as word ids, and the number of ids (the vocabulary is
/// the training reviews').
fn encoded_reviews(settings: &Settings) -> Result<(Vec<Encoded>, Vec<Encoded>, usize), String> {
    let (train, valid) = reviews(settings)?;
    let vocabulary = Vocabulary::of(&train, settings.vocabulary);
    let encode = |reviews: Vec<Review>| vocabulary.encode_all(reviews, settings.max_len);
    Ok((encode(train), encode(valid), vocabulary.len()))
}

/// A review as word ids.
#[derive(Clone, Debug)]
struct Encoded {
    ids: Vec<u32>,
    positive: bool,
}

/// Word ids: 0 for every word without its own, then the most frequent words of the reviews it
/// was built from, most frequent first.
struct Vocabulary(HashMap<String, u32>);

impl Vocabulary {
    /// The `size - 1` most frequent words of `reviews` (ties in alphabetical order) and id 0.
    fn of(reviews: &[Review], size: usize) -> Self {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for review in reviews {
            for word in words(&review.text) {
                *counts.entry(word).or_default() += 1;
            }
        }
        let mut ranked: Vec<(String, usize)> = counts.into_iter().collect();
        ranked.sort_by(|(a, m), (b, n)| n.cmp(m).then_with(|| a.cmp(b)));
        let ids = ranked
            .into_iter()
            .take(size.saturating_sub(1))
            .zip(1u32..)
            .map(|((word, _), id)| (word, id))
            .collect();
        Self(ids)
    }

    /// Ids in use, 0 included.
    fn len(&self) -> usize {
        self.0.len() + 1
    }

    /// Each review's first `max_len` words as ids (one id 0 for a review without words).
    fn encode_all(&self, reviews: Vec<Review>, max_len: usize) -> Vec<Encoded> {
        reviews
            .into_iter()
            .map(|review| {
                let mut ids: Vec<u32> = words(&review.text)
                    .into_iter()
                    .take(max_len)
                    .map(|word| self.0.get(&word).copied().unwrap_or(0))
                    .collect();
                if ids.is_empty() {
                    ids.push(0);
                }
                Encoded {
                    ids,
                    positive: review.positive,
                }
            })
            .collect()
    }
}

/// A review's words: lower-cased runs of letters, digits and apostrophes; the corpus's `<br />`
/// line breaks are not words.
fn words(text: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(text)
        .replace("<br />", " ")
        .to_lowercase();
    text.split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

/// Trains `model` (on an autodiff device) with `Learner` and returns it in validation mode. The
/// Learner's files go to `settings.out`, which must not exist.
fn train_with_learner(
    settings: &Settings,
    model: Classifier,
    train: Vec<Encoded>,
    valid: Vec<Encoded>,
) -> Result<Classifier, String> {
    if settings.out.exists() {
        return Err(format!(
            "{}: already exists; pass --out with a new folder",
            settings.out.display()
        ));
    }
    std::fs::create_dir_all(&settings.out)
        .map_err(|e| format!("{}: {e}", settings.out.display()))?;
    let batcher = ReviewBatcher;
    let train = DataLoaderBuilder::new(batcher.clone())
        .batch_size(settings.batch)
        .shuffle(0)
        .build(InMemDataset::new(train));
    let valid = DataLoaderBuilder::new(batcher)
        .batch_size(settings.batch)
        .build(InMemDataset::new(valid));
    let training = SupervisedTraining::new(&settings.out, train, valid)
        .metric_train_numeric(LossMetric::new())
        .metric_valid_numeric(LossMetric::new())
        .metric_train_numeric(AccuracyMetric::new())
        .metric_valid_numeric(AccuracyMetric::new())
        .with_default_checkpointers()
        .num_epochs(settings.epochs)
        .renderer(Box::new(TenthsRenderer::default()))
        .summary();
    let optimizer = AdamConfig::new().init();
    let result = training.launch(Learner::new(model, optimizer, settings.learning_rate));
    if let Some(error) = result.error {
        return Err(format!("training stopped: {error}"));
    }
    Ok(result.model)
}

/// The classifier's shape and its attention.
struct ClassifierConfig {
    encoder: EncoderConfig,
    vocabulary: usize,
    max_len: usize,
    redraw_every: usize,
}

impl ClassifierConfig {
    fn from_settings(settings: &Settings, vocabulary: usize) -> Result<Self, String> {
        // The sequence length is known here, so every variant (those whose parameters depend
        // on it too) is built the same way.
        let attention = AttentionConfig::from_name(
            &settings.attention,
            settings.d_model,
            settings.n_heads,
            settings.max_len,
        )
        .map_err(|e| e.to_string())?;
        let encoder = EncoderConfig::new(
            EncoderBlockConfig::new(attention, settings.d_ff),
            settings.n_layers,
        );
        encoder.validate().map_err(|e| e.to_string())?;
        Ok(Self {
            encoder,
            vocabulary,
            max_len: settings.max_len,
            redraw_every: settings.redraw_every,
        })
    }

    fn init(&self, device: &Device) -> Classifier {
        let d_model = self.encoder.d_model();
        Classifier {
            words: EmbeddingConfig::new(self.vocabulary, d_model).init(device),
            positions: EmbeddingConfig::new(self.max_len, d_model).init(device),
            encoder: self.encoder.init(device),
            head: LinearConfig::new(d_model, 2).init(device),
            redraw_every: self.redraw_every,
            optimizer_steps: 0,
        }
    }
}

/// Word ids in, two logits out.
#[derive(Module, Debug)]
struct Classifier {
    words: Embedding,
    positions: Embedding,
    encoder: Encoder,
    head: Linear,
    /// Optimiser steps between two redraws (0: never).
    redraw_every: usize,
    /// Optimiser steps taken by this process.
    optimizer_steps: usize,
}

impl Classifier {
    /// The logits, and when `training` the attentions' auxiliary loss for the batch (the
    /// Compressive Transformer's attention reconstruction; `None` for most variants).
    fn logits(
        &self,
        tokens: Tensor<2, Int>,
        mask_pad: Tensor<2, Bool>,
        training: bool,
    ) -> (Tensor<2>, Option<Tensor<1>>) {
        let [batch, n] = tokens.dims();
        let device = tokens.device();
        let positions = Tensor::<1, Int>::arange(0..n as i64, &device)
            .reshape([1, n])
            .repeat_dim(0, batch);
        let x = self.words.forward(tokens) + self.positions.forward(positions);
        let input = AttentionInput::new(x).mask_pad(mask_pad.clone());
        let (encoded, aux_loss) = if training {
            self.encoder
                .try_forward_with_loss(input)
                .unwrap_or_else(|err| panic!("{err}"))
        } else {
            (self.encoder.forward(input), None)
        };
        // The mean over the review's own words.
        let kept = mask_pad.bool_not().float().unsqueeze_dim::<3>(2);
        let pooled = (encoded * kept.clone()).sum_dim(1) / kept.sum_dim(1);
        (self.head.forward(pooled.squeeze_dim::<2>(1)), aux_loss)
    }

    /// The classification output (its loss the cross-entropy) and, when `training`, the
    /// auxiliary loss.
    fn classify(
        &self,
        batch: ReviewBatch,
        training: bool,
    ) -> (ClassificationOutput, Option<Tensor<1>>) {
        let (logits, aux_loss) = self.logits(batch.tokens, batch.mask_pad, training);
        let loss = CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits.clone(), batch.labels.clone());
        let output = ClassificationOutput {
            loss,
            output: logits,
            targets: batch.labels,
        };
        (output, aux_loss)
    }

    /// After each optimiser step: counts it, and redraws the attention's random features every
    /// `redraw_every` steps (`Encoder::redraw` leaves the variants without any unchanged).
    fn after_optimizer_step(mut self) -> Self {
        self.optimizer_steps += 1;
        if self.redraw_every > 0 && self.optimizer_steps.is_multiple_of(self.redraw_every) {
            self.encoder = self.encoder.redraw();
        }
        self
    }

    fn redraws(&self) -> usize {
        self.optimizer_steps
            .checked_div(self.redraw_every)
            .unwrap_or(0)
    }
}

impl TrainStep for Classifier {
    type Input = ReviewBatch;
    type Output = ClassificationOutput;

    /// Backpropagates the cross-entropy plus the attentions' auxiliary loss (which alone trains
    /// the Compressive Transformer's compression); the reported loss is the cross-entropy.
    fn step(&self, batch: ReviewBatch) -> TrainOutput<ClassificationOutput> {
        let (output, aux_loss) = self.classify(batch, true);
        let objective = match aux_loss {
            Some(aux) => output.loss.clone() + aux,
            None => output.loss.clone(),
        };
        TrainOutput::new(self, objective.backward(), output)
    }

    fn optimize(
        self,
        optimizer: &mut ModuleOptimizer,
        lr: ModuleLearningRate,
        grads: GradientsParams,
    ) -> Self {
        optimizer.step(lr, self, grads).after_optimizer_step()
    }

    fn optimize_multi(
        self,
        optimizer: &mut ModuleOptimizer,
        lr: ModuleLearningRate,
        grads: MultiGradientsParams,
    ) -> Self {
        optimizer.step_multi(lr, self, grads).after_optimizer_step()
    }
}

impl InferenceStep for Classifier {
    type Input = ReviewBatch;
    type Output = ClassificationOutput;

    fn step(&self, batch: ReviewBatch) -> ClassificationOutput {
        self.classify(batch, false).0
    }
}

/// Progress in a line at every tenth of a split (burn-train's renderer without its terminal
/// dashboard prints one per iteration); the metrics come in the Learner's summary at the end.
#[derive(Default)]
struct TenthsRenderer {
    epoch: usize,
    epochs: usize,
    split: String,
    total: usize,
    tenths_shown: usize,
}

impl TrainingProgressLogger for TenthsRenderer {
    fn start(&mut self, epochs: usize, first: usize, _items: Option<usize>, _label: Option<&str>) {
        (self.epochs, self.epoch) = (epochs, first.max(1));
    }
    fn update_epoch(&mut self, epoch: usize) {
        self.epoch = epoch + 1;
    }
    fn start_split(&mut self, split: &str, total_items: usize) {
        (self.split, self.total, self.tenths_shown) = (split.to_string(), total_items, 0);
    }
    fn update_split(&mut self, items: usize) {
        let tenths = (10 * items).checked_div(self.total).unwrap_or(10);
        if tenths > self.tenths_shown {
            self.tenths_shown = tenths;
            println!(
                "epoch {}/{} {}: {items}/{} reviews",
                self.epoch, self.epochs, self.split, self.total
            );
        }
    }
    fn end_split(&mut self) {}
    fn end(&mut self) {}
    fn log_event_training(&mut self, _event: String) {}
}

impl EvaluationProgressLogger for TenthsRenderer {
    fn start_global_progress(&mut self, _total_tests: usize) {}
    fn start_test(&mut self, _name: &str, _total_items: usize) {}
    fn update_test_progress(&mut self, _items: usize) {}
    fn end_test(&mut self) {}
    fn end_global_progress(&mut self) {}
    fn log_event_evaluation(&mut self, _event: String) {}
}

impl MetricsRendererTraining for TenthsRenderer {
    fn update_train(&mut self, _state: MetricState) {}
    fn update_valid(&mut self, _state: MetricState) {}
}

impl MetricsRendererEvaluation for TenthsRenderer {
    fn update_test(&mut self, _name: EvaluationName, _state: MetricState) {}
}

impl MetricsRenderer for TenthsRenderer {
    fn manual_close(&mut self) {}
    fn register_metric(&mut self, _definition: MetricDefinition) {}
}

/// Encoded reviews padded to the longest of the batch.
#[derive(Clone, Debug)]
struct ReviewBatcher;

#[derive(Clone, Debug)]
struct ReviewBatch {
    tokens: Tensor<2, Int>,
    /// `true` at padding.
    mask_pad: Tensor<2, Bool>,
    /// 1 positive, 0 negative.
    labels: Tensor<1, Int>,
}

impl Batcher<Encoded, ReviewBatch> for ReviewBatcher {
    fn batch(&self, reviews: Vec<Encoded>, device: &Device) -> ReviewBatch {
        let lengths: Vec<usize> = reviews.iter().map(|r| r.ids.len()).collect();
        let n = lengths.iter().copied().max().unwrap_or(1);
        let mut tokens = vec![0i64; reviews.len() * n];
        for (row, review) in tokens.chunks_mut(n).zip(&reviews) {
            for (slot, &id) in row.iter_mut().zip(&review.ids) {
                *slot = id as i64;
            }
        }
        let labels: Vec<i64> = reviews.iter().map(|r| r.positive as i64).collect();
        ReviewBatch {
            tokens: Tensor::from_data(TensorData::new(tokens, [reviews.len(), n]), device),
            mask_pad: padding_mask_from_lengths(&lengths, n, device),
            labels: Tensor::from_data(TensorData::new(labels, [reviews.len()]), device),
        }
    }
}

/// The share of `reviews` the model classifies right, computed outside the Learner.
fn accuracy(model: &Classifier, reviews: &[Encoded], settings: &Settings) -> f64 {
    let device = &model.head.weight.device();
    let batcher = ReviewBatcher;
    let mut correct = 0usize;
    for chunk in reviews.chunks(settings.batch) {
        let batch = batcher.batch(chunk.to_vec(), device);
        let predicted = model
            .logits(batch.tokens, batch.mask_pad, false)
            .0
            .argmax(1)
            .flatten::<1>(0, 1);
        let hits: i64 = predicted.equal(batch.labels).int().sum().into_scalar();
        correct += hits as usize;
    }
    correct as f64 / reviews.len() as f64
}

/// Reviews from a small grammar, half positive: sentences that praise (positive) or pan
/// (negative) among neutral ones, so that the label is in the words.
fn generated_reviews(count: usize, seed: u64) -> Vec<Review> {
    let subjects = [
        "the film",
        "this movie",
        "the story",
        "the acting",
        "the music",
    ];
    let praise = ["wonderful", "moving", "brilliant", "a delight", "superb"];
    let pans = ["boring", "awful", "a mess", "tedious", "dreadful"];
    let neutral = [
        "It runs two hours.",
        "I saw it on a Sunday.",
        "The cast is large.",
        "It was shot in Canada.",
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed);
    (0..count)
        .map(|i| {
            let positive = i % 2 == 0;
            let mut text = String::new();
            for _ in 0..3 + rng.below(4) {
                if rng.below(4) == 0 {
                    text.push_str(neutral[rng.below(neutral.len())]);
                } else {
                    let words = if positive { &praise } else { &pans };
                    text.push_str(&format!(
                        "{} was {}.",
                        subjects[rng.below(subjects.len())],
                        words[rng.below(words.len())]
                    ));
                }
                text.push(' ');
            }
            Review {
                text: text.into_bytes(),
                positive,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// A folder of this process's own under the system's temporary folder, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            Self(std::env::temp_dir().join(format!("{tag}-{}-{nanos}", std::process::id())))
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The Performer features of the first layer.
    fn first_features(model: &Classifier) -> Vec<f32> {
        match &model.encoder.blocks[0].attention {
            burn_attention_zoo::Attention::Performer(p) => p
                .features
                .as_ref()
                .expect("FAVOR+ has features")
                .val()
                .into_data()
                .try_to_vec::<f32>()
                .unwrap(),
            other => panic!("expected Performer, got {other:?}"),
        }
    }

    /// Seconds on two CPU cores, dev profile.
    fn short(out: &Path, redraw_every: usize) -> Settings {
        Settings {
            max_len: 24,
            train_per_class: 320,
            valid_per_class: 64,
            d_model: 32,
            n_heads: 2,
            d_ff: 64,
            n_layers: 1,
            batch: 16,
            epochs: 3,
            learning_rate: 3e-3,
            redraw_every,
            out: out.to_path_buf(),
            ..Settings::default_run()
        }
    }

    #[test]
    fn the_learner_trains_it_and_redraws_the_features() {
        let dir = TempDir::new("imdb-learner");
        let settings = short(dir.path(), 25);
        let (train, valid, vocabulary) = encoded_reviews(&settings).unwrap();
        let device = Device::flex();
        device.seed(0);
        let untrained = ClassifierConfig::from_settings(&settings, vocabulary)
            .unwrap()
            .init(&device.clone().autodiff());
        let before = accuracy(&untrained, &valid, &settings);
        let model = train_with_learner(&settings, untrained.clone(), train, valid.clone()).unwrap();
        let after = accuracy(&model, &valid, &settings);
        println!("validation accuracy {before:.3} -> {after:.3}");
        // 0.99 when written (0.41 before); a model that did not train stays near 0.5, which 128
        // reviews put within a few hundredths.
        assert!(after > 0.9, "accuracy after training {after}");

        // 3 epochs of 640 reviews in batches of 16: 120 optimiser steps, 4 redraws.
        assert_eq!((model.optimizer_steps, model.redraws()), (120, 4));
        assert_ne!(first_features(&model), first_features(&untrained));
        // The Learner's files are where they were asked for.
        assert!(settings.out.join("experiment.log").is_file());
    }

    #[test]
    fn without_redraws_the_features_stay() {
        let dir = TempDir::new("imdb-learner-no-redraw");
        let settings = Settings {
            epochs: 1,
            train_per_class: 16,
            ..short(dir.path(), 0)
        };
        let (train, valid, vocabulary) = encoded_reviews(&settings).unwrap();
        let device = Device::flex().autodiff();
        device.seed(3);
        let untrained = ClassifierConfig::from_settings(&settings, vocabulary)
            .unwrap()
            .init(&device);
        let model = train_with_learner(&settings, untrained.clone(), train, valid).unwrap();
        assert_eq!(model.optimizer_steps, 2);
        assert_eq!(first_features(&model), first_features(&untrained));
    }

    #[test]
    fn reviews_become_word_ids() {
        assert_eq!(
            words(b"It's <br /><br />GREAT, really!"),
            ["it's", "great", "really"]
        );
        let review = |text: &str| Review {
            text: text.as_bytes().to_vec(),
            positive: true,
        };
        let train = [review("good good fine"), review("bad good")];
        // "good" (3) first; "bad" and "fine" (1 each) alphabetically; a size of 3 keeps two.
        let vocabulary = Vocabulary::of(&train, 3);
        assert_eq!(vocabulary.len(), 3);
        let encoded = vocabulary.encode_all(vec![review("fine bad good unseen"), review("")], 3);
        assert_eq!(encoded[0].ids, [0, 2, 1]);
        assert_eq!(encoded[1].ids, [0]);
    }

    #[test]
    fn an_existing_output_folder_is_refused() {
        let dir = TempDir::new("imdb-learner-exists");
        std::fs::create_dir_all(dir.path()).unwrap();
        std::fs::write(dir.path().join("mine.txt"), b"keep").unwrap();
        let settings = short(dir.path(), 0);
        let model = ClassifierConfig::from_settings(&settings, 10)
            .unwrap()
            .init(&Device::flex().autodiff());
        let err = train_with_learner(&settings, model, vec![], vec![]).expect_err("refused");
        assert!(err.contains("already exists"), "{err}");
        assert_eq!(std::fs::read(dir.path().join("mine.txt")).unwrap(), b"keep");
    }
}
