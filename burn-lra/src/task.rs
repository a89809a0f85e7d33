//! Loading a task's splits from the configuration and the command line.

use std::path::Path;

use anyhow::{Result, bail};

use crate::config::{RunConfig, Task, TaskShape, TokenizerKind, Validation};
use crate::data::{bpe, bytes, image, listops, matching, pathfinder};
use crate::train::Splits;

/// Loads the three splits of `config.task` and applies `data.validation` and
/// `data.test_subset`.
///
/// - ListOps reads `basic_{train,val,test}.tsv` from `data_dir` when one is given; otherwise,
///   when the configuration has a `[data.generate]` table, it generates the dataset once into
///   `cache_dir` and reads it from there, each time checked against its manifest.
/// - Text reads IMDB (aclImdb folders or their `.tar.gz`) or a `train.tsv`/`test.tsv`
///   (`label<TAB>text`) corpus from `data_dir`.
/// - Matching reads LRA's `new_aan_pairs.{train,eval,test}.tsv` from `data_dir`.
/// - Image reads CIFAR-10's binary batches or IDX files (MNIST, Fashion-MNIST) from `data_dir`.
/// - Pathfinder and Path-X read LRA's released layout from `data_dir` when one is given;
///   otherwise they generate `data.pathfinder.n_images` images once into `cache_dir` (checked
///   against their manifest at every use).
pub fn load_splits(
    config: &RunConfig,
    data_dir: Option<&Path>,
    cache_dir: &Path,
) -> Result<Splits> {
    // With BPE the documents are read whole (as bytes) and cut after re-tokenization.
    let bpe = config.data.tokenizer == TokenizerKind::Bpe;
    let max_len = if bpe { usize::MAX } else { config.data.max_len };
    let (mut train, val, mut test) = match config.task {
        Task::Listops => {
            let dir = match (data_dir, &config.data.generate) {
                (Some(dir), _) => dir.to_path_buf(),
                (None, Some(generate)) => {
                    let dir = cache_dir.join(generate.cache_name());
                    if !dir.exists() {
                        eprintln!("generating ListOps into {}", dir.display());
                        generate_cache(&dir, || listops::write_dataset(&dir, generate))?;
                    }
                    crate::data::verify_manifest(&dir)?;
                    dir
                }
                (None, None) => bail!(
                    "no ListOps data: pass --data-dir with LRA's basic_{{train,val,test}}.tsv, \
                     or use a config with a [data.generate] table"
                ),
            };
            let [train, val, test] = listops::read_splits(&dir, max_len)?;
            (train, Some(val), test)
        }
        Task::Text => {
            let Some(dir) = data_dir else {
                bail!(
                    "no text data: pass --data-dir with the IMDB reviews (the aclImdb folders or \
                     their .tar.gz) or a folder holding train.tsv and test.tsv (label<TAB>text)"
                );
            };
            let splits = bytes::read_corpus(dir, max_len, Task::Text.n_classes())?;
            (splits.train, splits.val, splits.test)
        }
        Task::Matching => {
            let Some(dir) = data_dir else {
                bail!(
                    "no matching data: pass --data-dir with LRA's new_aan_pairs.{{train,eval,test}}.tsv \
                     (lra_release, tsv_data/), or generate small files in that format with \
                     `burn-lra generate-matching --out DIR`"
                );
            };
            let [train, val, test] =
                matching::read_splits(dir, max_len, config.data.doc_max_bytes)?;
            (train, Some(val), test)
        }
        Task::Image => {
            let Some(dir) = data_dir else {
                bail!(
                    "no image data: pass --data-dir with CIFAR-10's binary release \
                     (cifar-10-batches-bin/) or IDX files such as Fashion-MNIST's \
                     (Debian: dataset-fashion-mnist, /usr/share/datasets/fashion-mnist)"
                );
            };
            let [train, test] = image::read_splits(dir, max_len)?;
            (train, None, test)
        }
        Task::Pathfinder | Task::Pathx => {
            let settings = (config.data.pathfinder.as_ref())
                .expect("validated: pathfinder tasks have [data.pathfinder]");
            let dir = match data_dir {
                Some(dir) => dir.to_path_buf(),
                None => {
                    let dir = cache_dir.join(settings.cache_name());
                    let images = dir.join(settings.difficulty.folder());
                    if !images.exists() {
                        eprintln!(
                            "generating {} Pathfinder images into {}",
                            settings.n_images,
                            dir.display()
                        );
                        generate_cache(&images, || {
                            pathfinder::write_dataset(&dir, settings).map(|_| ())
                        })?;
                    }
                    crate::data::verify_manifest(&images)?;
                    dir
                }
            };
            let [train, val, test] = pathfinder::read_splits(&dir, settings, max_len)?;
            (train, Some(val), test)
        }
    };
    let mut val = match (config.data.validation, val) {
        (Validation::Split, Some(val)) => Some(val),
        (Validation::Split, None) => bail!(
            "{}: the corpus has no validation split; set `data.validation` to \"test\" (LRA's \
             choice for IMDB) or to {{ holdout = N }}",
            train.source
        ),
        // One copy of the tokens: the test split serves both roles.
        (Validation::Test, _) => None,
        (Validation::Holdout(n), _) => Some(train.split_off_holdout(n, "validation hold-out")?),
    };
    let tokenizer = match config.data.bpe_vocab_size.filter(|_| bpe) {
        None => None,
        Some(vocab) => {
            // Trained on what the model trains on: the training split, hold-out removed.
            let tokenizer = bpe::load_or_train(cache_dir, config.task.name(), &train, vocab)?;
            let cut = config.data.max_len;
            for split in [Some(&mut train), val.as_mut(), Some(&mut test)]
                .into_iter()
                .flatten()
            {
                tokenizer.retokenize(split, cut)?;
            }
            Some((tokenizer.path, tokenizer.json))
        }
    };
    let classes: Vec<usize> = (train.label_counts().iter())
        .enumerate()
        .filter(|(_, count)| **count > 0)
        .map(|(class, _)| class)
        .collect();
    if let [only] = classes.as_slice() {
        bail!(
            "{}: every training example has label {only}; a classifier needs at least two \
             classes to learn from",
            train.source
        );
    }
    if let Some(n) = config.data.test_subset
        && n < test.len()
    {
        let warnings = std::mem::take(&mut test.warnings);
        test = test.split_off_holdout(n, &format!("sample of {n}"))?;
        test.warnings = warnings;
    }
    Ok(Splits {
        train,
        val,
        test,
        vocab_size: config.vocab_size(),
        tokenizer,
    })
}

/// Generates the cache `dir` with `generate`; where that fails because another process (a
/// sweep's other job) published the same cache meanwhile, its copy serves (the caller verifies
/// it against its manifest).
fn generate_cache(dir: &Path, generate: impl FnOnce() -> Result<()>) -> Result<()> {
    match generate() {
        Err(_) if dir.exists() => Ok(()),
        other => other,
    }
}
