//! The sweep's summary: mean, sample standard deviation and best test accuracy per attention
//! over the seeds asked for, printed as a table and written as `summary.json` and `summary.md`.
//! It depends only on the finished runs' `result.json`, so every executor writes the same one.

use std::path::Path;

use anyhow::{Result, bail};
use lra_runs::layout::{SUMMARY_JSON, SUMMARY_MD};
use lra_runs::summary::stats;
use lra_runs::{AttentionSummary, RunResult, RunState, Summary, write_atomic};

use super::plan::LraArgs;

/// The finished runs of `attention` among seeds `0..seeds` in the sweep of `task` and `preset`
/// that check out: each result must record the attention, seed, task and preset of the folder
/// it sits in, its checksum must match and its figures lie in their ranges
/// ([`RunResult::verify_place`]). Those that do not are left out, each named on stderr with
/// the reason.
pub(super) fn results(
    sweep_dir: &Path,
    (task, preset): (&lra_runs::Task, &str),
    attention: &str,
    seeds: u64,
) -> Result<Vec<RunResult>> {
    let mut results = Vec::new();
    for seed in 0..seeds {
        let dir = lra_runs::run_dir(sweep_dir, attention, seed);
        if let RunState::Finished(result) = lra_runs::run_state(&dir)? {
            match result.verify_place(task, preset, attention, seed) {
                Ok(()) => results.push(*result),
                Err(why) => eprintln!(
                    "{}: {why}; left out of the summary",
                    dir.join(lra_runs::layout::RESULT).display()
                ),
            }
        }
    }
    Ok(results)
}

/// The folders of a sweep that hold an attention's runs, sorted (also a task folder's points,
/// and an attention folder's seeds: every folder but the sweep's own).
pub(crate) fn attention_folders(sweep_dir: &Path) -> Vec<String> {
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
    names
}

/// Collects every attention under the sweep directory with results for seeds `0..seeds`, prints
/// the table, and writes `summary.json` and `summary.md`.
pub(super) fn write(args: &LraArgs, sweep_dir: &Path) -> Result<()> {
    let preset = args.preset_name();
    let names = attention_folders(sweep_dir);
    let mut table = String::new();
    table.push_str(&format!(
        "LRA {} — preset `{preset}`, backend {}, seeds 0..{}\n\n",
        args.task, args.backend, args.seeds
    ));
    table.push_str("| attention | seeds | test acc % (mean ± std) | best % | last-ckpt mean % | best-val-ckpt mean % | params | vs softmax | majority % |\n");
    table.push_str("|---|---|---|---|---|---|---|---|---|\n");
    let mut attentions = std::collections::BTreeMap::new();
    let mut pretrained = std::collections::BTreeSet::new();
    for name in &names {
        let results = results(sweep_dir, (&args.task, &preset), name, args.seeds)?;
        pretrained.extend(
            (results.iter())
                .filter_map(|r| r.init_from.as_ref())
                .map(|init| init.objective.clone()),
        );
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
        let Some(summary) = AttentionSummary::of(&results) else {
            continue;
        };
        // The name the runs record (a long pattern's folder is a shortened name).
        let name = &results[0].attention;
        table.push_str(&format!(
            "| {name} | {} | {:.2} ± {:.2} | {:.2} | {:.2} | {:.2} | {} | {:+.2}% | {:.2} |\n",
            summary.seeds.len(),
            100.0 * summary.mean,
            100.0 * summary.std,
            100.0 * summary.best,
            100.0 * stats(&summary.accuracies_last).0,
            100.0 * stats(&summary.accuracies_best_val).0,
            summary.n_params,
            100.0 * summary.param_increase,
            100.0 * summary.test_majority_rate
        ));
        attentions.insert(name.clone(), summary);
    }
    if attentions.is_empty() {
        bail!("no finished runs under {}", sweep_dir.display());
    }
    table.push_str("\nstd is the sample standard deviation over seeds; \"test acc\" uses each run's configured model selection.\n");
    if !pretrained.is_empty() {
        let objectives: Vec<String> = pretrained.into_iter().collect();
        table.push_str(&format!(
            "Fine-tuned from self-pretraining runs ({}): each result.json's `init_from` names its \
             pretraining run.\n",
            objectives.join(", ")
        ));
    }
    println!("\n{table}");
    let summary = Summary {
        attentions,
        preset,
        seeds_requested: args.seeds,
        task: args.task.clone(),
    };
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
    use super::*;

    /// Every committed sweep the README or docs/results.md shows (a `<!-- results:
    /// DIR/summary.md -->` marker): its `summary.json` is what its committed run records give,
    /// and the page's table is its `summary.md`'s, row for row: every seed a row counts has its
    /// record, and no finished record is left out. The 5-seed ListOps sweep (23 attentions) is
    /// among them.
    #[test]
    fn the_committed_sweeps_and_the_docs_agree() {
        let root = crate::harness::workspace_root();
        let read = |path: &Path| std::fs::read_to_string(path).unwrap();
        let pages = ["README.md", "docs/results.md"].map(|page| read(&root.join(page)));
        let marker = "<!-- results: ";
        let mut checked = Vec::new();
        let all = pages.join("\n");
        let mut rest = all.as_str();
        while let Some(at) = rest.find(marker) {
            let after = &rest[at + marker.len()..];
            let path = &after[..after.find(" -->\n").expect("a marker ends with ` -->`")];
            let from = &after[path.len() + " -->\n".len()..];
            let table_in_readme = &from[..from.find("<!-- end results -->").unwrap()];
            let sweep = root.join(path).parent().unwrap().to_path_buf();
            let summary: Summary = serde_json::from_str(&read(&sweep.join(SUMMARY_JSON))).unwrap();
            for (name, attention) in &summary.attentions {
                let place = (&summary.task, summary.preset.as_str());
                let results = results(&sweep, place, name, summary.seeds_requested).unwrap();
                // A sweep may hold fewer seeds of some attentions than it asked for (ListOps
                // `small`: seed 0 of most, seeds 0-2 of a few); each row names its seeds.
                assert!(!results.is_empty(), "{path}: {name} has no records");
                assert_eq!(
                    AttentionSummary::of(&results).as_ref(),
                    Some(attention),
                    "{path}: {name}"
                );
            }
            let table: String = (read(&sweep.join(SUMMARY_MD)).lines())
                .filter(|line| line.starts_with('|'))
                .map(|line| format!("{line}\n"))
                .collect();
            assert_eq!(
                table_in_readme, table,
                "the table shown for {path} differs from it"
            );
            checked.push((path.to_string(), summary.attentions.len()));
            rest = from;
        }
        assert!(
            checked.contains(&("results/listops/tiny/summary.md".to_string(), 23)),
            "{checked:?}"
        );
    }
}
