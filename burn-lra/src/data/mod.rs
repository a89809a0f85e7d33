//! Datasets: tokenized examples, splits and batching.

pub mod bpe;
pub mod bytes;
pub mod image;
pub mod listops;
pub mod loader;
pub mod matching;
pub mod pathfinder;

use std::path::Path;

use anyhow::{Context, Result, bail};
use burn::prelude::*;

/// One tokenized example. Token id 0 is padding and never appears inside `tokens`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// Token ids, already cut to the task's maximum length.
    pub tokens: Vec<u16>,
    /// The second document of a matching pair.
    pub pair: Option<Vec<u16>>,
    /// Class index.
    pub label: usize,
}

impl Example {
    /// A single-sequence example.
    pub fn new(tokens: Vec<u16>, label: usize) -> Self {
        Self {
            tokens,
            pair: None,
            label,
        }
    }
}

/// A split of a task: its examples and class count.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Where it came from, for messages (a file path).
    pub source: String,
    /// The examples, in file order.
    pub examples: Vec<Example>,
    /// Number of classes of the task.
    pub n_classes: usize,
}

impl Dataset {
    /// Builds a dataset, refusing an empty split.
    pub fn new(source: String, examples: Vec<Example>, n_classes: usize) -> Result<Self> {
        if examples.is_empty() {
            bail!("{source}: the split is empty");
        }
        Ok(Self {
            source,
            examples,
            n_classes,
        })
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.examples.len()
    }

    /// Whether the split has no examples (never true for a constructed dataset).
    pub fn is_empty(&self) -> bool {
        self.examples.is_empty()
    }

    /// Examples per class.
    pub fn label_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.n_classes];
        for e in &self.examples {
            counts[e.label] += 1;
        }
        counts
    }

    /// Share of the most frequent class: the accuracy of always guessing it.
    pub fn majority_rate(&self) -> f64 {
        let max = self.label_counts().into_iter().max().unwrap_or(0);
        max as f64 / self.len() as f64
    }

    /// Moves `n` examples, drawn by a fixed shuffle (seed 0), out of this split into a new one
    /// called `name` (a validation hold-out); the rest keep their order.
    pub fn split_off_holdout(&mut self, n: usize, name: &str) -> Result<Dataset> {
        if n >= self.len() {
            bail!(
                "{}: cannot hold out {n} of {} examples for validation",
                self.source,
                self.len()
            );
        }
        let mut order: Vec<usize> = (0..self.len()).collect();
        crate::rng::Rng::new(0).shuffle(&mut order);
        let mut held = vec![false; self.len()];
        order[self.len() - n..].iter().for_each(|&i| held[i] = true);
        let (mut kept, mut out) = (Vec::new(), Vec::new());
        for (example, held) in std::mem::take(&mut self.examples).into_iter().zip(held) {
            if held {
                out.push(example)
            } else {
                kept.push(example)
            }
        }
        self.examples = kept;
        Dataset::new(format!("{} ({name})", self.source), out, self.n_classes)
    }

    /// Longest example, in tokens.
    pub fn max_tokens(&self) -> usize {
        self.examples
            .iter()
            .map(|e| e.tokens.len())
            .max()
            .unwrap_or(0)
    }
}

/// Padded token ids and their padding mask, `[batch, n]` each.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// Token ids, 0 = padding.
    pub ids: Tensor<2, Int>,
    /// Padding mask, `true` = padding.
    pub mask_pad: Tensor<2, Bool>,
}

/// A batch on a device: tokens padded to the batch's longest example.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The (first) documents.
    pub tokens: Tokens,
    /// The second documents of matching pairs.
    pub pair: Option<Tokens>,
    /// Labels `[batch]`.
    pub labels: Tensor<1, Int>,
}

/// A batch on the host, built where the examples are (the loader thread): padded ids and labels.
#[derive(Debug, Clone)]
pub struct HostBatch {
    tokens: TensorData,
    pair: Option<TensorData>,
    labels: TensorData,
}

fn pad(rows: &[&[u16]]) -> TensorData {
    let n = rows.iter().map(|r| r.len()).max().unwrap_or(0).max(1);
    let mut ids = vec![0i64; rows.len() * n];
    for (row, tokens) in rows.iter().enumerate() {
        for (j, &t) in tokens.iter().enumerate() {
            ids[row * n + j] = t as i64;
        }
    }
    TensorData::new(ids, [rows.len(), n])
}

impl HostBatch {
    /// Pads `examples` (each document to the longest of its kind in the batch).
    pub fn new(examples: &[&Example]) -> Self {
        let firsts: Vec<&[u16]> = examples.iter().map(|e| e.tokens.as_slice()).collect();
        let pair = examples
            .iter()
            .map(|e| e.pair.as_deref())
            .collect::<Option<Vec<&[u16]>>>()
            .map(|seconds| pad(&seconds));
        let labels: Vec<i64> = examples.iter().map(|e| e.label as i64).collect();
        Self {
            tokens: pad(&firsts),
            pair,
            labels: TensorData::new(labels, [examples.len()]),
        }
    }

    /// Moves the batch to `device`.
    pub fn to_device(self, device: &Device) -> Batch {
        let tokens = |data: TensorData| {
            let ids = Tensor::<2, Int>::from_data(data, device);
            Tokens {
                mask_pad: ids.clone().equal_elem(0),
                ids,
            }
        };
        Batch {
            tokens: tokens(self.tokens),
            pair: self.pair.map(tokens),
            labels: Tensor::<1, Int>::from_data(self.labels, device),
        }
    }
}

impl Batch {
    /// Pads `examples` and moves them to `device`.
    pub fn new(examples: &[&Example], device: &Device) -> Self {
        HostBatch::new(examples).to_device(device)
    }
}

/// Calls `row(line_number, line)` for every non-empty line of `path`, the line without its
/// `\n` or `\r\n` (lines are bytes: text fields are tokenized as bytes, not decoded).
/// A fresh, empty folder for a test, `<temp dir>/burn-lra-<name>-<process id>`.
#[cfg(test)]
pub(crate) fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("burn-lra-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub(crate) fn for_each_row(
    path: &Path,
    mut row: impl FnMut(usize, &[u8]) -> Result<()>,
) -> Result<()> {
    use std::io::BufRead;
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut reader = std::io::BufReader::new(file);
    let mut line = Vec::new();
    let mut number = 0;
    loop {
        line.clear();
        let read = reader
            .read_until(b'\n', &mut line)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if read == 0 {
            return Ok(());
        }
        number += 1;
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if !text.is_empty() {
            row(number, text)?;
        }
    }
}

/// Checks that `dir` is a folder; the error says what was found (nothing, or a file) and what
/// was expected (`expected`, e.g. "a folder holding basic_train.tsv, ...").
pub fn expect_folder(dir: &Path, expected: &str) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if dir.exists() {
        anyhow::bail!("{} is a file; expected {expected}", dir.display());
    }
    anyhow::bail!("{} does not exist; expected {expected}", dir.display())
}

pub use lra_runs::write_atomic;
