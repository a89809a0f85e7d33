//! `summary.json`: a sweep's accuracy per attention over its seeds, written by `cargo xtask lra`
//! from the finished runs' `result.json` and read by its report.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::names::{AttentionName, BackendKind, Task};
use crate::result::{RunResult, Selection};

/// A sweep's summary. (Fields in alphabetical order: the order the file has always had.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Each attention with at least one finished seed, by registry name.
    pub attentions: BTreeMap<AttentionName, AttentionSummary>,
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

impl Summary {
    /// Checks what a summary says of itself before a report believes it: for each attention,
    /// one accuracy of each kind per seed, seeds distinct and among those asked for, every
    /// accuracy and rate in [0, 1], the mean, standard deviation and best those of its
    /// accuracies (to 1e-9), steps and parameters positive. The error names the attention and
    /// the field.
    pub fn verify(&self) -> Result<(), String> {
        for (name, a) in &self.attentions {
            let fail = |why: String| Err(format!("attention `{name}`: {why}"));
            let n = a.seeds.len();
            if n == 0 {
                return fail("no seeds".into());
            }
            for (field, values) in [
                ("accuracies", &a.accuracies),
                ("accuracies_best_val", &a.accuracies_best_val),
                ("accuracies_last", &a.accuracies_last),
            ] {
                if values.len() != n {
                    return fail(format!("{} `{field}` for {n} seeds", values.len()));
                }
                if let Some(bad) = values.iter().find(|v| !(0.0..=1.0).contains(*v)) {
                    return fail(format!("`{field}` holds {bad}, outside [0, 1]"));
                }
            }
            let mut seeds = a.seeds.clone();
            seeds.sort_unstable();
            seeds.dedup();
            if seeds.len() != n {
                return fail(format!("seeds {:?} repeat", a.seeds));
            }
            if let Some(seed) = seeds.iter().find(|s| **s >= self.seeds_requested) {
                return fail(format!(
                    "seed {seed} is not among the {} asked for",
                    self.seeds_requested
                ));
            }
            let (mean, std, best) = stats(&a.accuracies);
            for (field, recorded, computed) in [
                ("mean", a.mean, mean),
                ("std", a.std, std),
                ("best", a.best, best),
            ] {
                let within = (recorded - computed).abs() <= 1e-9;
                if !within {
                    return fail(format!(
                        "`{field}` is {recorded}, its accuracies' is {computed}"
                    ));
                }
            }
            if !(0.0..=1.0).contains(&a.test_majority_rate) {
                return fail(format!(
                    "`test_majority_rate` is {}, outside [0, 1]",
                    a.test_majority_rate
                ));
            }
            if a.steps == 0 || a.n_params == 0 {
                return fail("`steps` or `n_params` is 0".into());
            }
            if !(a.param_increase.is_finite() && a.param_increase > -1.0) {
                return fail(format!(
                    "`param_increase` is {}, not a relative increase",
                    a.param_increase
                ));
            }
        }
        Ok(())
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

/// The median of `values` (NaN for none; the mean of the middle two for an even count): what the
/// benchmarks report of repeated timings and of their rounds.
pub fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
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
    use super::{AttentionName, AttentionSummary, Summary, median, stats};

    fn summary(accuracies: &[f64], mean: f64) -> Summary {
        let (_, std, best) = stats(accuracies);
        let attention = AttentionSummary {
            accuracies: accuracies.to_vec(),
            accuracies_best_val: accuracies.to_vec(),
            accuracies_last: accuracies.to_vec(),
            backend: crate::BackendKind::Flex,
            best,
            mean,
            n_params: 10,
            param_increase: 0.0,
            seeds: (0..accuracies.len() as u64).collect(),
            selection: crate::Selection::BestVal,
            std,
            steps: 10,
            test_majority_rate: 0.1,
        };
        Summary {
            attentions: [(AttentionName::new("softmax").unwrap(), attention)].into(),
            preset: "tiny".into(),
            seeds_requested: 2,
            task: crate::Task::new("listops").unwrap(),
        }
    }

    /// A summary whose mean is not its accuracies', or whose figures leave their range, or
    /// whose seeds were not asked for, is refused naming the attention and the field.
    #[test]
    fn summaries_are_checked_against_themselves() {
        summary(&[0.4, 0.5], 0.45).verify().unwrap();
        for (bad, says) in [
            (summary(&[0.4, 0.5], 0.47), "`mean` is 0.47"),
            (summary(&[0.4, 1.5], 0.95), "outside [0, 1]"),
            (
                summary(&[0.4, 0.5, 0.6], 0.5),
                "seed 2 is not among the 2 asked for",
            ),
        ] {
            let err = bad.verify().unwrap_err();
            assert!(
                err.contains("attention `softmax`") && err.contains(says),
                "{err}"
            );
        }
        let mut negative = summary(&[0.4], 0.4);
        negative
            .attentions
            .get_mut("softmax")
            .unwrap()
            .param_increase = -2.0;
        assert!(negative.verify().unwrap_err().contains("param_increase"));
    }

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
