//! A grid's summary: for each attention, the point of the grid whose finished runs have the best
//! mean validation accuracy, and their test accuracy there (mean, sample standard deviation and
//! best over seeds, as a sweep's summary gives them). Written beside the preset's own sweep as
//! `grid-<keys>.{json,md}`; it depends only on the runs' `result.json`.

use std::collections::BTreeMap;

use anyhow::{Result, bail};
use lra_runs::summary::stats;
use lra_runs::{AttentionName, AttentionSummary, write_atomic};
use serde::Serialize;

use super::plan::LraArgs;
use super::summary::{attention_folders, results};

/// One attention at its best point.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct BestPoint {
    /// The point's `KEY=VALUE` settings.
    pub point: Vec<String>,
    /// Mean over seeds of the runs' best validation accuracy, by which the point was chosen.
    pub val_mean: f64,
    /// The runs' test accuracies there.
    pub summary: AttentionSummary,
}

/// The grid's summary, as `grid-<keys>.json` holds it.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct GridSummary {
    task: String,
    preset: String,
    seeds_requested: u64,
    /// The grid's points, in order.
    points: Vec<Vec<String>>,
    /// Each attention with a finished run at some point, by the name its runs record.
    attentions: BTreeMap<AttentionName, BestPoint>,
}

/// Each attention's best point among `points` (ties go to the earlier point).
pub(super) fn best_points(
    args: &LraArgs,
    points: &[Vec<String>],
) -> Result<BTreeMap<AttentionName, BestPoint>> {
    let mut best: BTreeMap<AttentionName, BestPoint> = BTreeMap::new();
    for point in points {
        let at = args.at(point.clone()).summarized();
        let sweep_dir = at.sweep_dir();
        let preset = at.preset_name();
        for folder in attention_folders(&sweep_dir) {
            let results = results(&sweep_dir, (&args.task, &preset), &folder, args.seeds)?;
            let Some(summary) = AttentionSummary::of(&results) else {
                continue;
            };
            let val: Vec<f64> = results.iter().map(|r| r.best_val_accuracy).collect();
            let val_mean = stats(&val).0;
            let name = results[0].attention.clone();
            if best.get(&name).is_none_or(|b| val_mean > b.val_mean) {
                let point = point.clone();
                best.insert(
                    name,
                    BestPoint {
                        point,
                        val_mean,
                        summary,
                    },
                );
            }
        }
    }
    Ok(best)
}

/// Prints the grid's table and writes `grid-<keys>.{json,md}` in the preset's sweep folder.
pub(super) fn write(args: &LraArgs, points: &[Vec<String>]) -> Result<()> {
    let best = best_points(args, points)?;
    if best.is_empty() {
        bail!("no finished runs at any point of the grid");
    }
    let base = args.at(Vec::new()).summarized();
    let keys: Vec<&str> = (args.set.iter())
        .filter_map(|flag| flag.split_once('=').map(|(key, _)| key))
        .collect();
    let mut table = format!(
        "{} — preset `{}`, backend {}, seeds 0..{}: each attention at the point of the grid \
         ({}) with its best mean validation accuracy\n\n",
        args.task,
        base.preset_name(),
        args.backend,
        args.seeds,
        args.set.join("; ")
    );
    table.push_str(
        "| attention | point | seeds | val acc % (mean) | test acc % (mean ± std) | best % |\n",
    );
    table.push_str("|---|---|---|---|---|---|\n");
    for (name, b) in &best {
        table.push_str(&format!(
            "| {name} | {} | {} | {:.2} | {:.2} ± {:.2} | {:.2} |\n",
            b.point.join(", "),
            b.summary.seeds.len(),
            100.0 * b.val_mean,
            100.0 * b.summary.mean,
            100.0 * b.summary.std,
            100.0 * b.summary.best,
        ));
    }
    println!("\n{table}");
    let summary = GridSummary {
        task: args.task.to_string(),
        preset: base.preset_name(),
        seeds_requested: args.seeds,
        points: points.to_vec(),
        attentions: best,
    };
    let dir = base.sweep_dir();
    std::fs::create_dir_all(&dir)?;
    let stem = format!("grid-{}", keys.join("+"));
    let json = dir.join(format!("{stem}.json"));
    write_atomic(&json, serde_json::to_string_pretty(&summary)?.as_bytes())?;
    write_atomic(&dir.join(format!("{stem}.md")), table.as_bytes())?;
    eprintln!("wrote {} and {stem}.md", json.display());
    Ok(())
}
