//! `summary.json`: a sweep's accuracy per attention over its seeds, written by `cargo xtask lra`
//! from the finished runs' `result.json` and read by its report.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::names::{BackendKind, Task};
use crate::result::{RunResult, Selection};

/// A sweep's summary. (Fields in alphabetical order: the order the file has always had.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Each attention with at least one finished seed, by registry name.
    pub attentions: BTreeMap<String, AttentionSummary>,
    /// The preset's name or the config file's stem.
    pub preset: String,
    /// Seeds `0..seeds_requested` were asked for; an attention lists those that finished.
    pub seeds_requested: u64,
    /// The task.
    pub task: Task,
}

/// One attention's finished seeds and their test accuracies (fractions, not percents).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttentionSummary {
    /// Test accuracy of each seed, with its run's configured model selection.
    pub accuracies: Vec<f64>,
    /// Test accuracy of each seed's best-validation weights.
    pub accuracies_best_val: Vec<f64>,
    /// Test accuracy of each seed's last weights.
    pub accuracies_last: Vec<f64>,
    /// The backend the runs trained on.
    pub backend: BackendKind,
    /// Best of `accuracies`.
    pub best: f64,
    /// Mean of `accuracies`.
    pub mean: f64,
    /// Trainable parameters.
    pub n_params: usize,
    /// Relative parameter increase over softmax.
    pub param_increase: f64,
    /// The seeds that finished, in order.
    pub seeds: Vec<u64>,
    /// Which weights `accuracies` come from.
    pub selection: Selection,
    /// Sample standard deviation of `accuracies` (n - 1; 0 for one seed).
    pub std: f64,
    /// Training steps of a run.
    pub steps: usize,
    /// Share of the test set's most frequent class.
    pub test_majority_rate: f64,
}

impl AttentionSummary {
    /// The summary of one attention's finished runs; `None` when there are none.
    pub fn of(results: &[RunResult]) -> Option<Self> {
        let first = results.first()?;
        let field = |f: fn(&RunResult) -> f64| -> Vec<f64> { results.iter().map(f).collect() };
        let accuracies = field(|r| r.test_accuracy);
        let (mean, std, best) = stats(&accuracies);
        Some(Self {
            accuracies_best_val: field(|r| r.test_accuracy_best_val),
            accuracies_last: field(|r| r.test_accuracy_last),
            accuracies,
            backend: first.backend,
            best,
            mean,
            n_params: first.n_params,
            param_increase: first.param_increase,
            seeds: results.iter().map(|r| r.seed).collect(),
            selection: first.selection,
            std,
            steps: first.steps,
            test_majority_rate: first.test_majority_rate,
        })
    }
}

/// Mean, sample standard deviation (n - 1; 0 for one value) and maximum of `values` (not empty).
pub fn stats(values: &[f64]) -> (f64, f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = if values.len() > 1 {
        values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    let best = values.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    (mean, var.sqrt(), best)
}

/// The median of `values` (not empty; the mean of the middle two for an even count): what the
/// benchmarks report of repeated timings and of their rounds.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let m = values.len() / 2;
    if values.len() % 2 == 1 {
        values[m]
    } else {
        (values[m - 1] + values[m]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::{median, stats};

    #[test]
    fn median_takes_the_middle_or_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn stats_are_sample_mean_std_and_max() {
        // Hand-computed: mean 0.3; deviations -0.1, 0, 0.1 -> variance 0.02 / 2 = 0.01.
        let (mean, std, best) = stats(&[0.2, 0.3, 0.4]);
        assert!((mean - 0.3).abs() < 1e-12);
        assert!((std - 0.1).abs() < 1e-12);
        assert_eq!(best, 0.4);
        assert_eq!(stats(&[0.5]).1, 0.0);
    }
}
