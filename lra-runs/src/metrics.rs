//! `metrics.jsonl`: one line per validation, appended by `burn-lra train` (a resume cuts the
//! file back to the length its checkpoint recorded).

use serde::{Deserialize, Serialize};

/// One line of `metrics.jsonl`: the training averages since the previous validation and the
/// validation's own figures. The fields are declared in alphabetical order, the order the file
/// has always had; a non-finite figure (a diverged run's loss) is written as `null`, so readers
/// that compare lines compare them as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsLine {
    /// Training time so far, validation included (seconds).
    pub elapsed_s: f64,
    /// The learning rate of the step.
    pub lr: f64,
    /// The step after which the model was validated.
    pub step: usize,
    /// Training accuracy since the previous validation.
    pub train_accuracy: f64,
    /// Mean training loss since the previous validation.
    pub train_loss: f64,
    /// Validation accuracy.
    pub val_accuracy: f64,
    /// Mean validation loss.
    pub val_loss: f64,
}

impl MetricsLine {
    /// The line as the file holds it (without its newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("a struct of numbers serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys in alphabetical order, and NaN written as `null`, as the harness always wrote them.
    #[test]
    fn a_line_keeps_its_keys_in_order() {
        let line = MetricsLine {
            elapsed_s: 1.5,
            lr: 0.001,
            step: 100,
            train_accuracy: 0.25,
            train_loss: f64::NAN,
            val_accuracy: 0.5,
            val_loss: 1.25,
        };
        assert_eq!(
            line.to_line(),
            r#"{"elapsed_s":1.5,"lr":0.001,"step":100,"train_accuracy":0.25,"train_loss":null,"val_accuracy":0.5,"val_loss":1.25}"#
        );
    }
}
