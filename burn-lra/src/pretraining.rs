//! Self-pretraining (Amos, Berant and Gupta 2024, "Never Train from Scratch", arXiv 2310.02980):
//! the encoder first learns the task's own training inputs, without their labels, then the
//! classifier is fine-tuned from it.
//!
//! A pretraining run is an ordinary run whose `training.objective` is not `task`
//! ([`Objective`]): [`pretraining_splits`] turns the task's splits into token-level ones built
//! from the training split's inputs alone, and the classifier predicts tokens (a vocabulary
//! that gains the mask token for masked-token denoising). Its run directory is written,
//! checkpointed, resumed and checksummed as any run's. `train --init-from <run dir>` then
//! starts a classifier from that run's best-validation weights ([`load_pretrained`],
//! [`transplant`]): the token embedding (the task's rows), the positions and the encoder; the
//! head is drawn fresh.

use std::path::Path;

use anyhow::{Context, Result, bail};
use burn::module::Module;
use burn::prelude::*;

use lra_runs::layout::{CONFIG, MODEL_BEST};
use lra_runs::{AttentionName, InitFrom};

use crate::config::{Objective, RunConfig};
use crate::data::{Dataset, Example, Splits};
use crate::model::{ClassifierSpec, LraClassifier};
use crate::run_dir::checkpoint::Record;

/// The share of an input's tokens masked by masked-token denoising when `training.mask_rate`
/// is not set (BERT's 15%, which the self-pretraining paper keeps).
pub const DEFAULT_MASK_RATE: f64 = 0.15;

/// The share of the training inputs held out to validate pretraining (at least one input).
pub const HELD_OUT_SHARE: f64 = 0.05;

/// The splits a pretraining run with `config`'s objective trains and validates on, from the
/// task's `splits`: the training split's inputs only (each document of a matching pair on its
/// own), no label; [`HELD_OUT_SHARE`] of them held out (by a fixed shuffle) as the validation
/// split, which also stands as the test split, so that neither the task's validation nor its test
/// inputs are ever read. `vocab` is the task's vocabulary (padding included): the mask token is
/// `vocab`. The masks are drawn once, from `seed`.
pub fn pretraining_splits(
    splits: Splits,
    config: &RunConfig,
    vocab: usize,
    seed: u64,
) -> Result<Splits> {
    let objective = config.training.objective;
    if !objective.is_pretraining() {
        bail!("pretraining splits asked for a run whose objective is the task's");
    }
    let Splits {
        train, tokenizer, ..
    } = splits;
    let mask_token = u16::try_from(vocab).with_context(|| {
        format!("a vocabulary of {vocab} tokens leaves no token id for the mask")
    })?;
    let rate = config.training.mask_rate.unwrap_or(DEFAULT_MASK_RATE);
    if !(rate > 0.0 && rate < 1.0) {
        bail!("training.mask_rate = {rate}: must lie strictly between 0 and 1");
    }
    let mut rng = crate::rng::Rng::new(seed);
    let mut inputs = Vec::new();
    for example in train.examples {
        let documents = std::iter::once(example.tokens).chain(example.pair);
        for tokens in documents.filter(|tokens| tokens.len() >= 2) {
            inputs.push(match objective {
                Objective::MaskedTokens => masked(tokens, mask_token, rate, &mut rng),
                Objective::NextToken => next_token(tokens),
                Objective::Task => unreachable!("checked above"),
            });
        }
    }
    let source = format!("{} (inputs only, {})", train.source, objective.name());
    let n_classes = vocab + objective.extra_tokens();
    let mut pretrain = Dataset::new(source, inputs, n_classes)?;
    let held = ((pretrain.len() as f64 * HELD_OUT_SHARE).ceil() as usize).max(1);
    let val = pretrain.split_off_holdout(held, "pretraining hold-out")?;
    let test = Dataset {
        source: format!("{} (also the test split)", val.source),
        ..val.clone()
    };
    Ok(Splits {
        train: pretrain,
        val: Some(val),
        test,
        tokenizer,
    })
}

/// Masked-token denoising of one input: each token masked with probability `rate` (at least one
/// masked), the input showing `mask_token` there and the target the token it hides; no target
/// elsewhere.
fn masked(tokens: Vec<u16>, mask_token: u16, rate: f64, rng: &mut crate::rng::Rng) -> Example {
    let mut chosen: Vec<bool> = (0..tokens.len()).map(|_| rng.uniform() < rate).collect();
    if !chosen.contains(&true) {
        let at = rng.below(tokens.len());
        chosen[at] = true;
    }
    let targets = (tokens.iter().zip(&chosen))
        .map(|(&token, &masked)| if masked { token } else { 0 })
        .collect();
    let shown = (tokens.iter().zip(&chosen))
        .map(|(&token, &masked)| if masked { mask_token } else { token })
        .collect();
    Example::with_targets(shown, targets)
}

/// Next-token prediction over one input: the target at each position is the token after it (none
/// at the last).
fn next_token(tokens: Vec<u16>) -> Example {
    let mut targets: Vec<u16> = tokens[1..].to_vec();
    targets.push(0);
    Example::with_targets(tokens, targets)
}

/// The finished pretraining run in `dir`, checked to fit a fine-tuning run of `config` with
/// `attention` (the same task, attention and model), and its best-validation weights, checked
/// against the SHA-256 its `result.json` recorded and loaded on `device`.
pub fn load_pretrained(
    dir: &Path,
    config: &RunConfig,
    attention: &AttentionName,
    device: &Device,
) -> Result<(LraClassifier, InitFrom)> {
    let shown = dir.display();
    let record = Record::read(&dir.join(CONFIG))
        .with_context(|| format!("--init-from {shown}: not a run directory"))?;
    let pretrained = &record.run;
    let objective = pretrained.training.objective;
    if !objective.is_pretraining() {
        bail!("--init-from {shown}: not a pretraining run (its training.objective is the task's)");
    }
    let mismatch = if pretrained.task != config.task {
        Some(format!(
            "task {} (this run: {})",
            pretrained.task, config.task
        ))
    } else if record.attention_name != *attention {
        Some(format!(
            "attention {} (this run: {attention})",
            record.attention_name
        ))
    } else if pretrained.model != config.model {
        Some("a different [model] table".to_string())
    } else if pretrained.attention.get(attention.name()) != config.attention.get(attention.name()) {
        Some(format!("a different [attention.{attention}] table"))
    } else if pretrained.encoder_len() != config.encoder_len() {
        Some(format!(
            "sequences of {} positions (this run: {})",
            pretrained.encoder_len(),
            config.encoder_len()
        ))
    } else {
        None
    };
    if let Some(mismatch) = mismatch {
        bail!("--init-from {shown}: the pretraining run has {mismatch}");
    }
    let Some(result) = crate::run_dir::finished_result(dir)? else {
        bail!("--init-from {shown}: the pretraining run has not finished");
    };
    let sha256 = crate::run_dir::recorded_weights_sha256(dir, &result, MODEL_BEST)?;
    let task = crate::tasks::find(pretrained.task.name())?;
    let model = LraClassifier::new(
        &ClassifierSpec::resolve(pretrained, task, attention)?,
        device,
    );
    let model = crate::run_dir::load_weights(model, &dir.join(MODEL_BEST), sha256)?;
    let init = InitFrom {
        run_dir: std::fs::canonicalize(dir).with_context(|| format!("cannot read {shown}"))?,
        objective: objective.name().to_string(),
        weights: MODEL_BEST.to_string(),
        weights_sha256: sha256.clone(),
        commits: result.commits.clone(),
    };
    Ok((model, init))
}

/// `model` with the pretrained classifier's token embedding (the rows of `model`'s vocabulary:
/// the mask token's row is left behind), CLS vector, positions and encoder; `model`'s head kept.
/// The values are loaded as records, so that on an autodiff device they are leaves of their own.
pub fn transplant(pretrained: LraClassifier, model: LraClassifier) -> Result<LraClassifier> {
    let [vocab, d_model] = model.embedding.weight.dims();
    let [pretrained_vocab, pretrained_d] = pretrained.embedding.weight.dims();
    if pretrained_d != d_model || pretrained_vocab < vocab {
        bail!(
            "the pretrained embedding is [{pretrained_vocab}, {pretrained_d}], this model's \
             [{vocab}, {d_model}]"
        );
    }
    let mut embedding = pretrained.embedding;
    embedding.weight = embedding
        .weight
        .map(|weight| weight.slice([0..vocab, 0..d_model]));
    let mut model = LraClassifier {
        embedding: model.embedding.load_record(embedding.into_record()),
        encoder: model.encoder.load_record(pretrained.encoder.into_record()),
        ..model
    };
    if let (Some(cls), Some(pretrained)) = (model.cls.take(), pretrained.cls) {
        model.cls = Some(cls.load_record(pretrained.into_record()));
    }
    if let (Some(positions), Some(pretrained)) = (model.positions.take(), pretrained.positions) {
        model.positions = Some(positions.load_record(pretrained.into_record()));
    }
    Ok(model)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// `n` examples of 20 tokens each, drawn from `tokens` (so that splits drawn from disjoint
    /// ranges can be told apart), labels alternating.
    fn dataset(name: &str, tokens: std::ops::Range<u16>, n: usize) -> Dataset {
        let mut rng = crate::rng::Rng::new(n as u64);
        let width = usize::from(tokens.end - tokens.start);
        let examples = (0..n)
            .map(|i| {
                let doc = (0..20)
                    .map(|_| tokens.start + rng.below(width) as u16)
                    .collect();
                Example::new(doc, i % 2)
            })
            .collect();
        Dataset::new(name.into(), examples, 2).unwrap()
    }

    fn config(objective: Objective) -> RunConfig {
        let mut config = RunConfig::preset("listops", "tiny").unwrap();
        config.training.objective = objective;
        config
    }

    /// The input a pretraining example was made from: its mask tokens replaced by their
    /// targets.
    fn unmasked(example: &Example, mask_token: u16) -> Vec<u16> {
        let targets = example.targets.as_ref().unwrap();
        (example.tokens.iter().zip(targets))
            .map(|(&token, &target)| if token == mask_token { target } else { token })
            .collect()
    }

    #[test]
    fn pretraining_reads_the_training_inputs_alone_without_labels() {
        let vocab = 40;
        let splits = Splits::new(
            dataset("train", 1..10, 200),
            Some(dataset("val", 10..20, 30)),
            dataset("test", 20..30, 30),
        );
        let train_inputs: HashSet<Vec<u16>> = (splits.train.examples.iter())
            .map(|e| e.tokens.clone())
            .collect();
        for objective in [Objective::MaskedTokens, Objective::NextToken] {
            let out = pretraining_splits(splits.clone(), &config(objective), vocab, 7).unwrap();
            let [train, val, test] = out.sizes();
            assert_eq!(train + val, 200, "every training input, each once");
            assert_eq!(val, 10, "5% held out");
            assert_eq!(test, val, "the held-out inputs stand as the test split");
            for example in out
                .train
                .examples
                .iter()
                .chain(out.validation().examples.iter())
            {
                assert_eq!(example.label, 0, "no label");
                assert!(example.pair.is_none());
                // Neither the task's validation inputs (10..20) nor its test inputs (20..30).
                assert!(
                    train_inputs.contains(&unmasked(example, vocab as u16)),
                    "{objective:?}: an input that is not a training input"
                );
            }
        }
    }

    #[test]
    fn masked_tokens_hide_about_the_rate_and_target_what_they_hide() {
        let vocab = 40u16;
        let splits = Splits::new(
            dataset("train", 1..30, 400),
            None,
            dataset("test", 1..30, 2),
        );
        let out = pretraining_splits(splits, &config(Objective::MaskedTokens), 40, 1).unwrap();
        let (mut masked, mut total) = (0usize, 0usize);
        for example in &out.train.examples {
            let targets = example.targets.as_ref().unwrap();
            for (&token, &target) in example.tokens.iter().zip(targets) {
                total += 1;
                if token == vocab {
                    masked += 1;
                    assert!(
                        target != 0 && target < vocab,
                        "a masked token is its target"
                    );
                } else {
                    assert_eq!(target, 0, "no target where nothing is hidden");
                }
            }
            assert!(targets.iter().any(|&t| t != 0), "every input has a target");
        }
        let rate = masked as f64 / total as f64;
        assert!((0.13..0.17).contains(&rate), "masked share {rate}");
        assert_eq!(
            out.train.n_classes, 41,
            "the vocabulary with the mask token"
        );
    }

    #[test]
    fn next_token_targets_are_the_following_tokens() {
        let splits = Splits::new(dataset("train", 1..9, 40), None, dataset("t", 1..9, 2));
        let out = pretraining_splits(splits, &config(Objective::NextToken), 10, 1).unwrap();
        for example in &out.train.examples {
            let targets = example.targets.as_ref().unwrap();
            assert_eq!(&targets[..targets.len() - 1], &example.tokens[1..]);
            assert_eq!(targets.last(), Some(&0), "nothing follows the last token");
        }
        assert_eq!(out.train.n_classes, 10, "no mask token");
    }

    #[test]
    fn the_two_documents_of_a_pair_are_two_inputs() {
        let mut train = dataset("train", 1..9, 40);
        for example in &mut train.examples {
            example.pair = Some(vec![9; 12]);
        }
        let splits = Splits::new(train, None, dataset("t", 1..9, 2));
        let out = pretraining_splits(splits, &config(Objective::NextToken), 10, 1).unwrap();
        let [train, val, _] = out.sizes();
        assert_eq!(train + val, 80);
    }

    /// `Objective::name` spells what configurations (serde) spell.
    #[test]
    fn objective_names_are_the_configuration_spellings() {
        for objective in [
            Objective::Task,
            Objective::MaskedTokens,
            Objective::NextToken,
        ] {
            assert_eq!(
                serde_json::to_value(objective).unwrap(),
                serde_json::Value::from(objective.name())
            );
        }
    }

    #[test]
    fn next_token_needs_a_causal_attention() {
        let task = crate::tasks::find("listops").unwrap();
        let config = config(Objective::NextToken);
        let spec = ClassifierSpec::resolve(&config, task, "softmax").unwrap();
        assert!(spec.causal && spec.per_position);
        let err = ClassifierSpec::resolve(&config, task, "nystrom")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no causal form"), "{err}");
        let masked =
            ClassifierSpec::resolve(&self::config(Objective::MaskedTokens), task, "nystrom")
                .unwrap();
        assert!(!masked.causal && masked.per_position);
        assert_eq!(masked.n_classes, masked.vocab_size);
    }
}
