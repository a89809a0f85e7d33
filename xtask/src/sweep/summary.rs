//! The sweep's summary: mean, sample standard deviation and best test accuracy per attention
//! over the seeds asked for, printed as a table and written as `summary.json` and `summary.md`.
//! It depends only on the finished runs' `result.json`, so every executor writes the same one.

use std::path::Path;

use anyhow::{Result, bail};
use lra_runs::layout::{SUMMARY_JSON, SUMMARY_MD};
use lra_runs::{RunResult, RunState, write_atomic};
use serde_json::json;

use super::plan::LraArgs;

/// Mean, sample standard deviation (n - 1; 0 for one value) and maximum.
fn stats(values: &[f64]) -> (f64, f64, f64) {
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

/// The finished runs of `attention` among seeds `0..seeds`.
fn results(sweep_dir: &Path, attention: &str, seeds: u64) -> Result<Vec<RunResult>> {
    let mut results = Vec::new();
    for seed in 0..seeds {
        if let RunState::Finished(result) =
            lra_runs::run_state(&lra_runs::run_dir(sweep_dir, attention, seed))?
        {
            results.push(*result);
        }
    }
    Ok(results)
}

/// Collects every attention under the sweep directory with results for seeds `0..seeds`, prints
/// the table, and writes `summary.json` and `summary.md`.
pub(super) fn write(args: &LraArgs, sweep_dir: &Path) -> Result<()> {
    let preset = args.preset_name();
    let mut names: Vec<String> = match std::fs::read_dir(sweep_dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !lra_runs::layout::SWEEP_FOLDERS.contains(&n.as_str()))
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    let mut table = String::new();
    table.push_str(&format!(
        "LRA {} — preset `{preset}`, backend {}, seeds 0..{}\n\n",
        args.task, args.backend, args.seeds
    ));
    table.push_str("| attention | seeds | test acc % (mean ± std) | best % | last-ckpt mean % | best-val-ckpt mean % | params | vs softmax | majority % |\n");
    table.push_str("|---|---|---|---|---|---|---|---|---|\n");
    let mut attentions = serde_json::Map::new();
    for name in &names {
        let results = results(sweep_dir, name, args.seeds)?;
        let missing: Vec<String> = (0..args.seeds)
            .filter(|seed| !results.iter().any(|r| r.seed == *seed))
            .map(|seed| seed.to_string())
            .collect();
        if !missing.is_empty() {
            eprintln!(
                "{name}: seed(s) {} not finished, left out of the summary",
                missing.join(", ")
            );
        }
        let Some(first) = results.first() else {
            continue;
        };
        let field = |f: fn(&RunResult) -> f64| -> Vec<f64> { results.iter().map(f).collect() };
        let acc = field(|r| r.test_accuracy);
        let last = field(|r| r.test_accuracy_last);
        let best_val = field(|r| r.test_accuracy_best_val);
        let (mean, std, best) = stats(&acc);
        let seeds: Vec<u64> = results.iter().map(|r| r.seed).collect();
        table.push_str(&format!(
            "| {name} | {} | {:.2} ± {:.2} | {:.2} | {:.2} | {:.2} | {} | {:+.2}% | {:.2} |\n",
            seeds.len(),
            100.0 * mean,
            100.0 * std,
            100.0 * best,
            100.0 * stats(&last).0,
            100.0 * stats(&best_val).0,
            first.n_params,
            100.0 * first.param_increase,
            100.0 * first.test_majority_rate
        ));
        attentions.insert(
            name.clone(),
            json!({
                "seeds": seeds,
                "selection": first.selection,
                "accuracies": acc,
                "mean": mean,
                "std": std,
                "best": best,
                "accuracies_last": last,
                "accuracies_best_val": best_val,
                "n_params": first.n_params,
                "param_increase": first.param_increase,
                "steps": first.steps,
                "backend": first.backend,
                "test_majority_rate": first.test_majority_rate,
            }),
        );
    }
    if attentions.is_empty() {
        bail!("no finished runs under {}", sweep_dir.display());
    }
    table.push_str("\nstd is the sample standard deviation over seeds; \"test acc\" uses each run's configured model selection.\n");
    println!("\n{table}");
    let summary = json!({
        "task": args.task,
        "preset": preset,
        "seeds_requested": args.seeds,
        "attentions": attentions,
    });
    write_atomic(
        &sweep_dir.join(SUMMARY_JSON),
        serde_json::to_string_pretty(&summary)?.as_bytes(),
    )?;
    write_atomic(&sweep_dir.join(SUMMARY_MD), table.as_bytes())?;
    eprintln!(
        "wrote {} and {SUMMARY_MD}",
        sweep_dir.join(SUMMARY_JSON).display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::stats;

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
