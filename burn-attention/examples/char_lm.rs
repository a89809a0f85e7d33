//! A causal character-level language model: trains for a few minutes on a CPU, then generates
//! with the recurrent decoding state and times it against re-running the whole prefix for every
//! token.
//!
//! ```sh
//! cargo run --release --example char_lm -- --data-dir path/to/imdb   # aclImdb folder or .tar.gz
//! cargo run --release --example char_lm                             # generated text
//! cargo run --release --example char_lm -- --attention performer --seconds 60
//! cargo run --release --example char_lm -- --attention gla+local          # a hybrid stack
//! ```
//!
//! Model: byte embeddings plus sinusoidal positions, a pre-LN `Encoder` with causal attention
//! (`linear` by default, any causal variant by `--attention`, or a hybrid stack's pattern such
//! as `gla+local`: one layer of each), a linear head over the 256 bytes.
//! Decoding carries one `DecodingState` per layer: for the kernelized variants the sums
//! `S = Σ φ(k) vᵀ` and `z = Σ φ(k)`, so a token costs the same at position 100 and 4,000.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams};
use burn::prelude::*;
use burn_attention_zoo::{
    AttentionConfig, AttentionInput, DecodingState, Encoder, EncoderBlockConfig, EncoderConfig,
    hybrid_pattern, repeat_pattern,
};

#[path = "shared/imdb.rs"]
mod imdb;
#[path = "shared/rng.rs"]
mod rng;

use rng::Rng;

const VOCAB: usize = 256;
const D_MODEL: usize = 128;
const HEADS: usize = 4;
const LAYERS: usize = 2;
const CONTEXT: usize = 128;
const BATCH: usize = 16;
/// What generation starts from.
const PROMPT: &[u8] = b"This movie ";
/// Text read from a corpus, at most.
const MAX_TEXT: usize = 4 << 20;

struct Args {
    data_dir: Option<PathBuf>,
    attention: String,
    seconds: f64,
    decode_to: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        data_dir: None,
        attention: "linear".into(),
        seconds: 150.0,
        decode_to: 4_100,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("`{flag}` needs a value"));
        match flag.as_str() {
            "--data-dir" => args.data_dir = Some(PathBuf::from(value()?)),
            "--attention" => args.attention = value()?,
            "--seconds" => {
                let v = value()?;
                args.seconds = v
                    .parse()
                    .map_err(|_| format!("--seconds: not a number: {v}"))?;
            }
            "--decode-to" => {
                let v = value()?;
                args.decode_to = v
                    .parse()
                    .map_err(|_| format!("--decode-to: not a count: {v}"))?;
            }
            other => {
                return Err(format!(
                    "unknown argument `{other}` (expected --data-dir, --attention, --seconds, --decode-to)"
                ));
            }
        }
    }
    if args.decode_to < 200 {
        return Err("--decode-to: at least 200 positions".into());
    }
    Ok(args)
}

fn main() {
    if let Err(err) = run() {
        eprintln!("error: {err}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let text = match &args.data_dir {
        Some(dir) => read_corpus(dir)?,
        None => generated_text(1 << 20),
    };
    println!(
        "text: {} bytes from {}",
        text.len(),
        args.data_dir
            .as_ref()
            .map_or("the generator".to_string(), |d| d.display().to_string())
    );
    let mut pattern = Vec::new();
    for name in hybrid_pattern(&args.attention).map_err(|e| e.to_string())? {
        let attention =
            AttentionConfig::from_name(name, D_MODEL, HEADS, CONTEXT).map_err(|e| e.to_string())?;
        if !attention.info().capabilities.causal {
            return Err(format!(
                "`{name}` has no causal form; try linear, performer or gla"
            ));
        }
        pattern.push(attention);
    }
    let layers = repeat_pattern(&pattern, LAYERS).map_err(|e| e.to_string())?;
    let device = Device::flex();
    device.seed(0);
    let model = train(
        CharLmConfig {
            name: args.attention.clone(),
            layers,
        },
        &text,
        args.seconds,
        &device.clone().autodiff(),
    );
    let model = model.valid();
    let (generated, times) = generate(&model, PROMPT, args.decode_to);
    println!(
        "\n--- generated (recurrent state, temperature 0.8) ---\n{}{}\n---",
        String::from_utf8_lossy(PROMPT),
        String::from_utf8_lossy(&generated[..300.min(generated.len())])
    );
    report_speed(&model, &args.attention, &generated, &times, &device);
    Ok(())
}

/// The model's configuration: its attention (or hybrid pattern) and each layer's.
struct CharLmConfig {
    name: String,
    layers: Vec<AttentionConfig>,
}

/// Bytes in, next-byte logits out.
#[derive(Module, Debug)]
struct CharLm {
    embedding: Embedding,
    encoder: Encoder,
    head: Linear,
}

impl CharLmConfig {
    fn init(&self, device: &Device) -> CharLm {
        let block =
            EncoderBlockConfig::new(self.layers[0].clone(), 2 * D_MODEL).with_residual_dropout(0.0);
        let encoder = EncoderConfig::new(block, LAYERS).with_layers(self.layers.clone());
        CharLm {
            embedding: EmbeddingConfig::new(VOCAB, D_MODEL).init(device),
            encoder: encoder.init(device),
            head: LinearConfig::new(D_MODEL, VOCAB).init(device),
        }
    }
}

impl CharLm {
    /// Logits `[batch, n, 256]` for the bytes `ids: [batch, n]` at positions `0..n`, causal.
    fn forward(&self, ids: Tensor<2, Int>) -> Tensor<3> {
        let n = ids.dims()[1];
        let x =
            self.embedding.forward(ids) + positions(0, n, &self.head.weight.device()).unsqueeze();
        let h = self.encoder.forward(AttentionInput::new(x).causal(true));
        self.head.forward(h)
    }

    /// Logits `[1, 1, 256]` of the byte after `prompt`, and the decoding states after it, in
    /// one pass over the prompt.
    fn prefill(&self, prompt: &[u8]) -> (Tensor<3>, Vec<DecodingState>) {
        let device = self.head.weight.device();
        let n = prompt.len();
        let ids: Vec<i64> = prompt.iter().map(|&b| b as i64).collect();
        let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, n]), &device);
        let x = self.embedding.forward(ids) + positions(0, n, &device).unsqueeze();
        let (h, states) = self
            .encoder
            .prefill(x)
            .expect("a causal attention prefills");
        (self.head.forward(h.slice(s![.., n - 1..n])), states)
    }

    /// Logits `[1, 1, 256]` of the byte after `byte` at `position`, and the new states.
    fn step(
        &self,
        byte: u8,
        position: usize,
        states: Vec<DecodingState>,
    ) -> (Tensor<3>, Vec<DecodingState>) {
        let device = self.head.weight.device();
        let id = Tensor::<2, Int>::from_data(TensorData::new(vec![byte as i64], [1, 1]), &device);
        let x = self.embedding.forward(id) + positions(position, 1, &device).unsqueeze();
        let (h, states) = self
            .encoder
            .decode(x, states)
            .expect("a causal attention decodes");
        (self.head.forward(h), states)
    }
}

/// Sinusoidal position encodings of positions `start..start + n`, `[n, d_model]`: defined at
/// any position, so decoding can run past the training context.
fn positions(start: usize, n: usize, device: &Device) -> Tensor<2> {
    let mut data = Vec::with_capacity(n * D_MODEL);
    for p in start..start + n {
        for i in 0..D_MODEL / 2 {
            let angle = p as f64 / 10_000f64.powf(2.0 * i as f64 / D_MODEL as f64);
            data.push(angle.sin() as f32);
            data.push(angle.cos() as f32);
        }
    }
    Tensor::from_data(TensorData::new(data, [n, D_MODEL]), device)
}

/// Trains on random windows of `text` for `seconds`, printing the loss.
fn train(config: CharLmConfig, text: &[u8], seconds: f64, device: &Device) -> CharLm {
    let mut model = config.init(device);
    let mut optim = AdamConfig::new().init();
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let started = Instant::now();
    let mut step = 0;
    let mut running = None::<f64>;
    println!(
        "training {} ({LAYERS} layers, d_model {D_MODEL}, {HEADS} heads) on windows of {CONTEXT} bytes, batch {BATCH}, for {seconds} s",
        config.name
    );
    while started.elapsed().as_secs_f64() < seconds {
        let mut window = Vec::with_capacity(BATCH * (CONTEXT + 1));
        for _ in 0..BATCH {
            let at = rng.below(text.len() - CONTEXT - 1);
            window.extend(text[at..at + CONTEXT + 1].iter().map(|&b| b as i64));
        }
        let ids =
            Tensor::<2, Int>::from_data(TensorData::new(window, [BATCH, CONTEXT + 1]), device);
        let inputs = ids.clone().slice(s![.., 0..CONTEXT]);
        let targets = ids.slice(s![.., 1..CONTEXT + 1]).reshape([BATCH * CONTEXT]);
        let logits = model.forward(inputs).reshape([BATCH * CONTEXT, VOCAB]);
        let loss = loss_fn.forward(logits, targets);
        let value = loss.clone().into_scalar::<f64>();
        running = Some(running.map_or(value, |r| 0.95 * r + 0.05 * value));
        let lr = if step < 100 {
            3e-3 * (step + 1) as f64 / 100.0
        } else {
            3e-3
        };
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(lr, model, grads);
        step += 1;
        if step % 100 == 0 {
            println!(
                "step {step:5}  loss {:.3} (bits per byte {:.2})  {:.0} s",
                running.unwrap(),
                running.unwrap() / std::f64::consts::LN_2,
                started.elapsed().as_secs_f64()
            );
        }
    }
    println!("{step} steps in {:.0} s", started.elapsed().as_secs_f64());
    model
}

/// Prefills the decoding states from `prompt` in one pass, then samples until position
/// `decode_to`, one token at a time through the recurrent state. Returns the generated bytes and
/// the time of each step by position (the prompt's positions: the prefill's time shared out).
fn generate(model: &CharLm, prompt: &[u8], decode_to: usize) -> (Vec<u8>, Vec<f64>) {
    let mut rng = Rng(42);
    let started = Instant::now();
    let (mut logits, mut states) = model.prefill(prompt);
    let mut times = vec![started.elapsed().as_secs_f64() / prompt.len() as f64; prompt.len()];
    let mut generated = Vec::new();
    for position in prompt.len()..=decode_to {
        let started = Instant::now();
        let probs: Vec<f32> =
            burn::tensor::activation::softmax(logits.reshape([VOCAB]).div_scalar(0.8), 0)
                .into_data()
                .try_to_vec::<f32>()
                .expect("f32 probabilities");
        let next = rng.sample(&probs);
        generated.push(next);
        if position == decode_to {
            break;
        }
        (logits, states) = model.step(next, position, states);
        times.push(started.elapsed().as_secs_f64());
    }
    (generated, times)
}

/// Tokens per second of recurrent decoding (from the timed steps) and of re-running the causal
/// forward pass over the whole prefix for each token, at positions 100 and `decode_to - 100`.
fn report_speed(model: &CharLm, name: &str, generated: &[u8], times: &[f64], device: &Device) {
    let late = times.len() - 100;
    let recurrent = |at: usize| 100.0 / times[at..at + 100].iter().sum::<f64>();
    let bytes: Vec<i64> = PROMPT.iter().chain(generated).map(|&b| b as i64).collect();
    let full_prefix = |at: usize, tokens: usize| {
        let started = Instant::now();
        for t in at..at + tokens {
            let ids = Tensor::<2, Int>::from_data(
                TensorData::new(bytes[..t + 1].to_vec(), [1, t + 1]),
                device,
            );
            let logits = model.forward(ids);
            let _ = logits.slice(s![.., t..t + 1]).into_data();
        }
        tokens as f64 / started.elapsed().as_secs_f64()
    };
    println!(
        "\ndecoding speed, {name}, batch 1, flex ({} threads):",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("| position | decoding state, tokens/s | full prefix re-run, tokens/s |");
    println!("|---|---|---|");
    println!(
        "| 100 | {:.0} | {:.1} |",
        recurrent(100),
        full_prefix(100, 10)
    );
    println!(
        "| {late} | {:.0} | {:.2} |",
        recurrent(late),
        full_prefix(late, 3)
    );
}

/// Reads up to 4 MiB of text: the reviews of an aclImdb folder or `.tar.gz` (every split but
/// `test`), any folder of `.txt` files, or one text file.
fn read_corpus(path: &Path) -> Result<Vec<u8>, String> {
    let mut text = Vec::new();
    if path.is_file() && !path.to_string_lossy().ends_with(".tar.gz") {
        text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    } else {
        imdb::for_each_text(path, &mut |name, bytes| {
            let name = Path::new(name);
            let held_out = name.components().any(|c| c.as_os_str() == "test");
            // aclImdb's `urls_*.txt` list the reviews' web addresses.
            let links = name
                .file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with("urls_"));
            if !held_out && !links {
                text.extend(bytes);
                text.push(b'\n');
            }
            text.len() < MAX_TEXT
        })?;
    }
    text.truncate(MAX_TEXT);
    if text.len() < 10 * CONTEXT {
        return Err(format!(
            "{}: only {} bytes of text (need {})",
            path.display(),
            text.len(),
            10 * CONTEXT
        ));
    }
    Ok(text)
}

/// Sentences from a small grammar, for when no corpus is given: enough structure (agreement,
/// punctuation, a few hundred words) for the loss to fall visibly in a few minutes.
fn generated_text(bytes: usize) -> Vec<u8> {
    let subjects = [
        "the film",
        "this movie",
        "the story",
        "the actor",
        "the ending",
        "the music",
        "every scene",
    ];
    let verbs = ["was", "felt", "seemed", "looked", "remained"];
    let adjectives = [
        "wonderful",
        "boring",
        "far too long",
        "beautifully shot",
        "predictable",
        "moving",
        "funny",
    ];
    let endings = [
        ".",
        "!",
        ", and I loved it.",
        ", but the plot was thin.",
        ".",
    ];
    let mut rng = Rng(7);
    let mut text = Vec::with_capacity(bytes);
    while text.len() < bytes {
        let mut sentence = format!(
            "{} {} {}{}",
            subjects[rng.below(subjects.len())],
            verbs[rng.below(verbs.len())],
            adjectives[rng.below(adjectives.len())],
            endings[rng.below(endings.len())]
        );
        sentence[..1].make_ascii_uppercase();
        text.extend(sentence.bytes());
        text.push(b' ');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hybrid model (GLA then a sliding-window softmax layer) decodes from its prefilled
    /// states as its causal forward pass computes: the next byte's logits after 20 bytes.
    #[test]
    fn a_hybrid_model_decodes_as_its_forward_pass() {
        let device = Device::flex();
        let layers = ["gla", "local"]
            .map(|name| AttentionConfig::from_name(name, D_MODEL, HEADS, CONTEXT).unwrap())
            .to_vec();
        let model = CharLmConfig {
            name: "gla+local".into(),
            layers,
        }
        .init(&device);
        let text = b"This movie was a treat";
        let ids: Vec<i64> = text.iter().map(|&b| b as i64).collect();
        let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, text.len()]), &device);
        let full = model.forward(ids);
        let (_, states) = model.prefill(&text[..20]);
        let (next, _) = model.step(text[20], 20, states);
        next.into_data().assert_approx_eq::<f32>(
            &full.slice(s![.., 20..21]).into_data(),
            burn::tensor::Tolerance::absolute(1e-4),
        );
    }
}
