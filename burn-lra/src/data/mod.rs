//! Datasets: tokenized examples, splits and batching.

pub mod listops;

use std::path::Path;

use anyhow::{Context, Result, bail};
use burn::prelude::*;

/// One tokenized example. Token id 0 is padding and never appears inside `tokens`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// Token ids, already cut to the task's maximum length.
    pub tokens: Vec<u16>,
    /// Class index.
    pub label: usize,
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

    /// Longest example, in tokens.
    pub fn max_tokens(&self) -> usize {
        self.examples
            .iter()
            .map(|e| e.tokens.len())
            .max()
            .unwrap_or(0)
    }
}

/// A batch on a device: tokens padded to the batch's longest example.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Token ids `[batch, n]`, 0 = padding.
    pub tokens: Tensor<2, Int>,
    /// Padding mask `[batch, n]`, `true` = padding.
    pub mask_pad: Tensor<2, Bool>,
    /// Labels `[batch]`.
    pub labels: Tensor<1, Int>,
}

impl Batch {
    /// Pads `examples` to the longest of them and moves them to `device`.
    pub fn new(examples: &[&Example], device: &Device) -> Self {
        let batch = examples.len();
        let n = examples
            .iter()
            .map(|e| e.tokens.len())
            .max()
            .unwrap_or(0)
            .max(1);
        let mut tokens = vec![0i64; batch * n];
        for (row, e) in examples.iter().enumerate() {
            for (j, &t) in e.tokens.iter().enumerate() {
                tokens[row * n + j] = t as i64;
            }
        }
        let labels: Vec<i64> = examples.iter().map(|e| e.label as i64).collect();
        let tokens = Tensor::<2, Int>::from_data(TensorData::new(tokens, [batch, n]), device);
        let mask_pad = tokens.clone().equal_elem(0);
        Self {
            tokens,
            mask_pad,
            labels: Tensor::<1, Int>::from_data(TensorData::new(labels, [batch]), device),
        }
    }
}

/// Writes `contents` to `path` atomically: a temporary file beside it, then a rename, so a
/// reader never sees half a file and a killed writer leaves the old one intact.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create directory {}", parent.display()))?;
    }
    let tmp = path.with_extension(format!(
        "{}.tmp{}",
        path.extension().and_then(|e| e.to_str()).unwrap_or(""),
        std::process::id()
    ));
    std::fs::write(&tmp, contents).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot move {} to {}", tmp.display(), path.display()))?;
    Ok(())
}
