//! `cargo xtask recall`: MQAR's picture in Zoology's shape (Arora et al. 2023, Figure 2), from
//! the finished runs under one task folder (`<out>/mqar`, every sweep and grid point in it): test
//! accuracy against model width, one panel per sequence length and number of pairs; and, for the
//! causal models, test accuracy against the size of the state their decoding keeps
//! (`decoding_state_elements` in `result.json`). Where runs differ in anything else (a learning
//! rate grid), each attention, length and width is shown at the point with the best mean
//! validation accuracy, as the grid summary chooses. Everything is read back from the records:
//! `result.json` (checked against its checksum and its place) and `config.json` (the width, the
//! length and the pairs the run trained with).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use serde::Serialize;

use lra_runs::summary::stats;
use lra_runs::{AttentionName, RunRecord, RunResult, RunState, Task};

use crate::bench::report::svg::{color, drawing};
use crate::sweep::attention_folders;

/// The chart's, its table's and its figures' file names, in the task folder.
pub const CHART: &str = "recall.svg";
/// The table of the chart's figures.
pub const TABLE: &str = "recall.md";
/// The chart's figures as JSON.
pub const FIGURES: &str = "recall.json";

/// `cargo xtask recall`.
#[derive(clap::Args, Debug)]
pub struct RecallArgs {
    /// The task folder of a sweep's `--out` (`<out>/mqar`), holding one folder per preset or
    /// grid point.
    folder: PathBuf,
    /// Write over an existing chart and tables (without it, an existing one is an error).
    #[arg(long)]
    replace: bool,
}

/// The shape of one MQAR problem and model, as a run's `config.json` records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
struct Shape {
    /// Sequence length (`data.max_len`).
    length: u64,
    /// Key-value pairs (`data.mqar.n_pairs`).
    pairs: u64,
    /// Model width (`model.d_model`).
    width: u64,
}

/// One attention at one shape: the seeds of the point (preset or grid point) where their mean
/// validation accuracy is best.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct Cell {
    attention: AttentionName,
    #[serde(flatten)]
    shape: Shape,
    /// The folder of the point chosen (the preset's name and its settings).
    point: String,
    seeds: Vec<u64>,
    /// Mean over seeds of the best validation accuracy, by which the point was chosen.
    val_mean: f64,
    test_mean: f64,
    test_std: f64,
    test_best: f64,
    /// Whether the encoder was causal (`None`: not recorded).
    causal: Option<bool>,
    /// The decoding state after one sequence, in numbers (causal models).
    decoding_state_elements: Option<u64>,
    /// Commits that trained the runs.
    commits: Vec<String>,
}

/// Entry point of `cargo xtask recall`.
pub fn recall(args: RecallArgs) -> Result<()> {
    let runs = finished_runs(&args.folder)?;
    if runs.is_empty() {
        bail!(
            "{}: no finished MQAR run (expected <point>/<attention>/seed-<k>/result.json)",
            args.folder.display()
        );
    }
    let cells = cells(runs);
    let paths = [CHART, TABLE, FIGURES].map(|f| args.folder.join(f));
    if !args.replace {
        crate::bench::protocol::refuse_replacing(&paths, "")?;
    }
    let [chart, table, figures] = paths;
    lra_runs::write_atomic(&chart, svg(&cells)?.as_bytes())?;
    lra_runs::write_atomic(&table, markdown(&cells).as_bytes())?;
    lra_runs::write_atomic(&figures, serde_json::to_string_pretty(&cells)?.as_bytes())?;
    println!(
        "wrote {}, {} and {}",
        chart.display(),
        table.display(),
        figures.display()
    );
    Ok(())
}

/// One finished run: its point, shape and result.
struct Run {
    point: String,
    shape: Shape,
    result: RunResult,
}

/// Every finished MQAR run under `folder` (`<point>/<attention>/seed-<k>`) whose result checks
/// out where it sits; those that do not are named on stderr and left out. A `config.json` without
/// the shape's fields is an error naming the file and the field.
fn finished_runs(folder: &Path) -> Result<Vec<Run>> {
    let task = Task::new("mqar").map_err(anyhow::Error::msg)?;
    let mut runs = Vec::new();
    for point in attention_folders(folder) {
        let point_dir = folder.join(&point);
        for attention in attention_folders(&point_dir) {
            for seed_dir in attention_folders(&point_dir.join(&attention)) {
                let Some(seed) = seed_dir.strip_prefix("seed-").and_then(|s| s.parse().ok()) else {
                    continue;
                };
                let dir = point_dir.join(&attention).join(&seed_dir);
                let RunState::Finished(result) = lra_runs::run_state(&dir)? else {
                    continue;
                };
                if let Err(why) = result.verify_place(&task, &point, &attention, seed) {
                    eprintln!(
                        "{}: {why}; left out of the chart",
                        dir.join(lra_runs::layout::RESULT).display()
                    );
                    continue;
                }
                let config = dir.join(lra_runs::layout::CONFIG);
                let shape = shape_of(&RunRecord::read(&config)?.run)
                    .with_context(|| format!("{}", config.display()))?;
                runs.push(Run {
                    point: point.clone(),
                    shape,
                    result: *result,
                });
            }
        }
    }
    Ok(runs)
}

/// The shape a run's resolved configuration records.
fn shape_of(run: &serde_json::Value) -> Result<Shape> {
    let field = |path: &[&str]| {
        path.iter()
            .try_fold(run, |v, key| v.get(key))
            .and_then(serde_json::Value::as_u64)
            .with_context(|| format!("no `{}` in the run's configuration", path.join(".")))
    };
    Ok(Shape {
        length: field(&["data", "max_len"])?,
        pairs: field(&["data", "mqar", "n_pairs"])?,
        width: field(&["model", "d_model"])?,
    })
}

/// Each (attention, shape) at its point with the best mean validation accuracy (ties: the
/// point whose folder name sorts first).
fn cells(runs: Vec<Run>) -> Vec<Cell> {
    type Points = BTreeMap<String, Vec<RunResult>>;
    let mut groups: BTreeMap<(AttentionName, Shape), Points> = BTreeMap::new();
    for run in runs {
        groups
            .entry((run.result.attention.clone(), run.shape))
            .or_default()
            .entry(run.point)
            .or_default()
            .push(run.result);
    }
    let mut cells = Vec::new();
    for ((attention, shape), points) in groups {
        let mut best: Option<Cell> = None;
        for (point, results) in points {
            let val: Vec<f64> = results.iter().map(|r| r.best_val_accuracy).collect();
            let test: Vec<f64> = results.iter().map(|r| r.test_accuracy).collect();
            let (val_mean, _, _) = stats(&val);
            if best.as_ref().is_some_and(|b| b.val_mean >= val_mean) {
                continue;
            }
            let (test_mean, test_std, test_best) = stats(&test);
            let mut commits: Vec<String> = (results.iter())
                .flat_map(|r| r.commits.iter().cloned())
                .collect();
            commits.sort();
            commits.dedup();
            best = Some(Cell {
                attention: attention.clone(),
                shape,
                point,
                seeds: results.iter().map(|r| r.seed).collect(),
                val_mean,
                test_mean,
                test_std,
                test_best,
                causal: results[0].causal,
                decoding_state_elements: results.iter().find_map(|r| r.decoding_state_elements),
                commits,
            });
        }
        cells.extend(best);
    }
    cells
}

/// The problems (length, pairs) the cells cover, in order.
fn problems(cells: &[Cell]) -> Vec<(u64, u64)> {
    let mut problems: Vec<(u64, u64)> = cells
        .iter()
        .map(|c| (c.shape.length, c.shape.pairs))
        .collect();
    problems.sort();
    problems.dedup();
    problems
}

/// The cells of one problem (length, pairs).
fn cells_of(cells: &[Cell], (length, pairs): (u64, u64)) -> Vec<&Cell> {
    (cells.iter())
        .filter(|c| (c.shape.length, c.shape.pairs) == (length, pairs))
        .collect()
}

/// The attentions the cells cover, in order.
fn attentions<'a>(cells: impl IntoIterator<Item = &'a Cell>) -> Vec<AttentionName> {
    let mut names: Vec<AttentionName> = cells.into_iter().map(|c| c.attention.clone()).collect();
    names.sort();
    names.dedup();
    names
}

/// The axis of a panel: values on a log scale of `base`, as their logarithms, with a label at
/// each whole power (`2⁵` as 32, `10⁴` as 1e4).
#[derive(Clone, Copy)]
struct LogAxis {
    base: f64,
}

impl LogAxis {
    /// Where `value` sits on the axis.
    fn at(self, value: f64) -> f64 {
        value.log(self.base)
    }

    /// The range around positions `xs`: whole powers, half a power beyond either end, and how
    /// many labels put one at each half power.
    fn range(xs: impl Iterator<Item = f64>) -> (std::ops::Range<f64>, usize) {
        let (lo, hi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
        let (lo, hi) = if lo.is_finite() {
            (lo.floor(), hi.ceil())
        } else {
            (0.0, 1.0)
        };
        ((lo - 0.5)..(hi + 0.5), 2 * (hi - lo) as usize + 3)
    }

    /// The label at position `x`: the power it is, or nothing between powers.
    fn label(self, x: f64) -> String {
        if (x - x.round()).abs() > 1e-6 {
            return String::new();
        }
        let value = self.base.powf(x.round());
        if self.base == 2.0 {
            format!("{value:.0}")
        } else {
            format!("1e{}", x.round())
        }
    }
}

/// Size of one panel, in pixels.
const PANEL: (u32, u32) = (460, 320);
/// Width of the legend column.
const LEGEND: u32 = 190;

/// The chart: for each problem (a row), accuracy against width (left) and, for the causal
/// models, against the decoding state's size (right); one colour and marker per attention.
fn svg(cells: &[Cell]) -> Result<String> {
    let problems = problems(cells);
    let names = attentions(cells);
    let rows = problems.len().max(1) as u32;
    let legend_height = 40 + 14 * names.len() as u32;
    let size = (2 * PANEL.0 + LEGEND, (rows * PANEL.1).max(legend_height));
    let err = drawing("the recall chart");
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE).map_err(&err)?;
        let (panels, legend) = root.split_horizontally(2 * PANEL.0);
        let rows_areas = panels.split_evenly((problems.len().max(1), 1));
        for (area, &(length, pairs)) in rows_areas.iter().zip(&problems) {
            let (left, right) = area.split_horizontally(PANEL.0);
            let row = cells_of(cells, (length, pairs));
            panel(
                &left,
                (&names, &row),
                &format!("MQAR n={length}, {pairs} pairs"),
                ("model width", LogAxis { base: 2.0 }),
                |c| Some(c.shape.width as f64),
            )?;
            panel(
                &right,
                (&names, &row),
                &format!("n={length}, {pairs} pairs: causal models"),
                (
                    "decoding state (numbers, one sequence)",
                    LogAxis { base: 10.0 },
                ),
                |c| c.decoding_state_elements.map(|e| e as f64),
            )?;
        }
        for (i, name) in names.iter().enumerate() {
            let y = 30 + 14 * i as i32;
            let style = color(i).stroke_width(2);
            match shape_of_marker(i) {
                0 => legend.draw(&Circle::new((8, y), 4, style)),
                1 => legend.draw(&TriangleMarker::new((8, y), 5, style)),
                _ => legend.draw(&Cross::new((8, y), 4, style)),
            }
            .map_err(&err)?;
            legend
                .draw(&Text::new(
                    name.to_string(),
                    (20, y - 6),
                    ("sans-serif", 11),
                ))
                .map_err(&err)?;
        }
        root.present().map_err(&err)?;
    }
    Ok(out)
}

/// The `i`-th attention's marker shape: a circle, triangle or cross by which cycle of the
/// colours it is in.
fn shape_of_marker(i: usize) -> usize {
    (i / crate::bench::report::svg::COLORS.len()) % 3
}

/// Draws the `i`-th attention's marker at each of `points` on `chart`.
fn markers<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    i: usize,
    points: &[(f64, f64)],
) -> Result<()> {
    let err = drawing("the recall chart");
    let style = color(i).stroke_width(2);
    let at = points.iter().copied();
    match shape_of_marker(i) {
        0 => chart
            .draw_series(at.map(|p| Circle::new(p, 4, style)))
            .map(drop),
        1 => chart
            .draw_series(at.map(|p| TriangleMarker::new(p, 5, style)))
            .map(drop),
        _ => chart
            .draw_series(at.map(|p| Cross::new(p, 4, style)))
            .map(drop),
    }
    .map_err(err)
}

/// One panel: accuracy (%) against `x` of each cell that has one, on `axis`, the cells of one
/// attention joined by a line.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    (names, cells): (&[AttentionName], &[&Cell]),
    caption: &str,
    (x_desc, axis): (&str, LogAxis),
    x: impl Fn(&Cell) -> Option<f64>,
) -> Result<()> {
    let err = drawing("the recall chart");
    let (range, labels) = LogAxis::range(cells.iter().filter_map(|c| x(c)).map(|v| axis.at(v)));
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 14))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(range, 0.0..100.0)
        .map_err(&err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("test accuracy, %")
        .x_labels(labels)
        .x_label_formatter(&|x| axis.label(*x))
        .light_line_style(WHITE)
        .draw()
        .map_err(&err)?;
    for (i, name) in names.iter().enumerate() {
        let mut line: Vec<(f64, f64)> = (cells.iter())
            .filter(|c| c.attention == *name)
            .filter_map(|c| Some((axis.at(x(c)?), 100.0 * c.test_mean)))
            .collect();
        line.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(line.clone(), color(i).stroke_width(1)))
            .map_err(&err)?;
        markers(&mut chart, i, &line)?;
    }
    Ok(())
}

/// The chart's figures as a table, one row per attention, shape and chosen point.
fn markdown(cells: &[Cell]) -> String {
    let mut md = format!(
        "# MQAR: recall against width and decoding state\n\n![recall]({CHART})\n\n\
         Each attention at each shape (length, pairs, width) at the point of its runs with the \
         best mean validation accuracy; test accuracy mean ± sample standard deviation and best \
         over the seeds there. State: the numbers a causal model's decoding keeps after one \
         sequence (`decoding_state_elements`). Figures from each run's `result.json` and \
         `config.json`; `{FIGURES}` holds them with the commits.\n\n\
         | n | pairs | width | attention | causal | state | seeds | test acc % (mean ± std) | best % | point |\n\
         |---|---|---|---|---|---|---|---|---|---|\n"
    );
    let mut sorted: Vec<&Cell> = cells.iter().collect();
    sorted.sort_by(|a, b| {
        (a.shape.length, a.shape.pairs, &a.attention, a.shape.width).cmp(&(
            b.shape.length,
            b.shape.pairs,
            &b.attention,
            b.shape.width,
        ))
    });
    for c in sorted {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.2} ± {:.2} | {:.2} | {} |\n",
            c.shape.length,
            c.shape.pairs,
            c.shape.width,
            c.attention,
            match c.causal {
                Some(true) => "yes",
                Some(false) => "no",
                None => "–",
            },
            c.decoding_state_elements
                .map_or("–".to_string(), |e| e.to_string()),
            c.seeds.len(),
            100.0 * c.test_mean,
            100.0 * c.test_std,
            100.0 * c.test_best,
            c.point,
        ));
    }
    md.push_str(&against_width(cells));
    md
}

/// The width panels as tables: for each problem (length, pairs), the attentions measured there
/// at two widths or more, one column a width, each cell the test accuracy at the chosen point
/// and, for causal models, the decoding state in brackets.
fn against_width(cells: &[Cell]) -> String {
    let mut md = String::from(
        "\n## Against width\n\nAt each length, the attentions measured at two widths or more: \
         test accuracy % (mean ± std over the seeds) at the point chosen above, and in brackets \
         the decoding state in numbers (causal models).\n",
    );
    for (length, pairs) in problems(cells) {
        let here = cells_of(cells, (length, pairs));
        let mut widths: Vec<u64> = here.iter().map(|c| c.shape.width).collect();
        widths.sort();
        widths.dedup();
        let cell_at = |attention: &AttentionName, width: u64| {
            (here.iter()).find(|c| &c.attention == attention && c.shape.width == width)
        };
        let mut rows = attentions(here.iter().copied());
        rows.retain(|a| widths.iter().filter(|w| cell_at(a, **w).is_some()).count() >= 2);
        if rows.is_empty() {
            continue;
        }
        md.push_str(&format!(
            "\n### n = {length}, {pairs} pairs\n\n| attention |"
        ));
        for width in &widths {
            md.push_str(&format!(" width {width} |"));
        }
        md.push_str(&format!("\n|---|{}\n", "---|".repeat(widths.len())));
        for attention in &rows {
            md.push_str(&format!("| {attention} |"));
            for width in &widths {
                let text = cell_at(attention, *width).map_or("–".to_string(), |c| {
                    let state =
                        (c.decoding_state_elements).map_or(String::new(), |e| format!(" [{e}]"));
                    format!(
                        "{:.2} ± {:.2}{state}",
                        100.0 * c.test_mean,
                        100.0 * c.test_std
                    )
                });
                md.push_str(&format!(" {text} |"));
            }
            md.push('\n');
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Writes a finished run of `attention` and `seed` at `point` with the shape's width, its
    /// best validation and test accuracies, sealed as `burn-lra train` seals them.
    fn write_run(folder: &Path, point: &str, run: (&str, u64, u64), accuracies: (f64, f64)) {
        let (attention, seed, width) = run;
        let (val, test) = accuracies;
        let dir = folder
            .join(point)
            .join(attention)
            .join(format!("seed-{seed}"));
        std::fs::create_dir_all(&dir).unwrap();
        let result: RunResult = serde_json::from_value(json!({
            "task": "mqar", "attention": attention, "preset": point, "seed": seed,
            "backend": "flex", "device": "Cpu", "causal": true,
            "decoding_state_elements": 2 * 2 * 64 * width, "steps": 10, "n_params": 5,
            "n_params_softmax": 5, "param_increase": 0.0, "selection": "best-val",
            "test_accuracy": test, "test_accuracy_last": test, "test_accuracy_best_val": test,
            "best_val_accuracy": val, "best_val_step": 10, "test_majority_rate": 0.01,
            "split_sizes": [10, 2, 2], "validation_source": "v", "validated_on_test": false,
            "train_seconds": 1.0, "warnings": [], "config_changes": [],
            "weights_sha256": {}, "commits": ["abc"]
        }))
        .unwrap();
        let result = serde_json::to_string(&result.sealed()).unwrap();
        std::fs::write(dir.join(lra_runs::layout::RESULT), result).unwrap();
        let record = json!({
            "attention_name": attention, "attention_resolved": {}, "backend": "flex",
            "data_sha256": "ab", "n_params": 5, "n_params_softmax": 5, "param_increase": 0.0,
            "preset": point, "seed": seed, "split_sizes": [10, 2, 2], "tokenizer": null,
            "tokenizer_sha256": null,
            "run": {"data": {"max_len": 64, "mqar": {"n_pairs": 8}}, "model": {"d_model": width}}
        });
        std::fs::write(dir.join(lra_runs::layout::CONFIG), record.to_string()).unwrap();
    }

    /// Each attention and width is shown at the point with the best mean validation accuracy
    /// (its test accuracy there, not the best test accuracy anywhere); an edited result is left
    /// out; the chart and the table carry every cell, and nothing is written over without
    /// `--replace`.
    #[test]
    fn cells_take_the_best_point_by_validation_from_the_records() {
        let folder = std::env::temp_dir().join(format!("xtask-recall-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&folder);
        let (lr_high, lr_low) = (
            "tiny,training.schedule.peak=1e-2",
            "tiny,training.schedule.peak=1e-3",
        );
        for seed in 0..2 {
            write_run(&folder, lr_high, ("softmax", seed, 64), (0.9, 0.95));
            write_run(&folder, lr_low, ("softmax", seed, 64), (0.5, 0.99));
            write_run(
                &folder,
                "tiny,model.d_model=32",
                ("softmax", seed, 32),
                (0.4, 0.3),
            );
        }
        // Seed 1 at width 32, edited after it was sealed: left out.
        let edited = folder.join("tiny,model.d_model=32/softmax/seed-1/result.json");
        let text = std::fs::read_to_string(&edited).unwrap();
        std::fs::write(
            &edited,
            text.replace("\"test_accuracy\":0.3", "\"test_accuracy\":0.9"),
        )
        .unwrap();
        let cells = cells(finished_runs(&folder).unwrap());
        assert_eq!(cells.len(), 2);
        let (narrow, wide) = (&cells[0], &cells[1]);
        assert_eq!((narrow.shape.width, narrow.seeds.clone()), (32, vec![0]));
        assert_eq!(wide.point, lr_high);
        assert_eq!((wide.test_mean, wide.seeds.len()), (0.95, 2));
        assert_eq!(wide.decoding_state_elements, Some(2 * 2 * 64 * 64));
        let args = || RecallArgs {
            folder: folder.clone(),
            replace: false,
        };
        recall(args()).unwrap();
        let md = std::fs::read_to_string(folder.join(TABLE)).unwrap();
        assert!(
            md.contains("| 64 | 8 | 64 | softmax | yes | 16384 | 2 | 95.00 ± 0.00 | 95.00 | tiny,training.schedule.peak=1e-2 |"),
            "{md}"
        );
        assert!(
            md.contains("| softmax | 30.00 ± 0.00 [8192] | 95.00 ± 0.00 [16384] |"),
            "{md}"
        );
        let svg = std::fs::read_to_string(folder.join(CHART)).unwrap();
        assert!(svg.contains("softmax") && svg.contains("<circle"), "{svg}");
        let again = recall(args()).unwrap_err().to_string();
        assert!(again.contains("--replace"), "{again}");
        std::fs::remove_dir_all(&folder).unwrap();
    }
}
