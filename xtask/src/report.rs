//! `cargo xtask report`: the picture LRA's readers know, for one sweep: test accuracy (y)
//! against training speed (x), each attention a circle whose area is its peak memory. The
//! accuracies are the sweep's `summary.json`; speed and memory come from a `bench lra` report of
//! the same task and preset (ours, at one of its lengths), so the chart says which benchmark
//! and which length its x and circles are.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use plotters::prelude::*;
use serde_json::Value;

use lra_runs::layout::SUMMARY_JSON;
use lra_runs::{AttentionName, Summary};

use crate::bench::report::metric;
use crate::bench::report::svg::{color, drawing};

/// The chart's and its table's file names, beside the sweep's summary.
pub const CHART: &str = "accuracy-speed.svg";
/// The table of the chart's figures.
pub const TABLE: &str = "accuracy-speed.md";

/// `cargo xtask report`.
#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// The sweep's folder (`<out>/<task>/<preset>`), holding its summary.json.
    sweep: PathBuf,
    /// A `bench lra` report (JSON) of the same task and preset, e.g.
    /// bench/results/lra-listops-tiny-flex.json.
    #[arg(long)]
    bench: PathBuf,
    /// Which of the report's lengths gives speed and memory [default: its longest].
    #[arg(long)]
    n: Option<usize>,
    /// Write over an existing chart and table (without it, an existing one is an error).
    #[arg(long)]
    replace: bool,
}

/// One attention's point: mean test accuracy (and spread), training speed, peak memory.
#[derive(Debug, Clone, PartialEq)]
struct Point {
    name: AttentionName,
    accuracy: f64,
    std: f64,
    seeds: usize,
    steps_per_s: f64,
    peak_mib: f64,
}

/// Entry point of `cargo xtask report`.
pub fn report(args: ReportArgs) -> Result<()> {
    let summary_path = args.sweep.join(SUMMARY_JSON);
    let summary: Summary = lra_runs::read_json(&summary_path, "a sweep's summary")?;
    summary
        .verify()
        .map_err(|why| anyhow::anyhow!("{}: {why}", summary_path.display()))?;
    let bench: Value = lra_runs::read_json(&args.bench, "a benchmark report")?;
    let n = check_match(&summary, &bench, &args.bench, args.n)?;
    crate::bench::report::check_figures(&bench, &args.bench)?;
    let points = points(&summary, &bench, n);
    for name in summary.attentions.keys() {
        if !points.iter().any(|p| p.name == *name) {
            eprintln!(
                "{name}: no `bench lra` case of ours at n={n} in {}; left out of the chart and \
                 its table",
                args.bench.display()
            );
        }
    }
    if points.is_empty() {
        bail!(
            "{}: no attention of {} was measured at n={n}",
            args.bench.display(),
            summary_path.display()
        );
    }
    let (chart, table) = (args.sweep.join(CHART), args.sweep.join(TABLE));
    if !args.replace {
        crate::bench::protocol::refuse_replacing(&[chart.clone(), table.clone()], "")?;
    }
    let caption = format!(
        "{} {}: test accuracy vs training speed (n={n}; circle area: peak memory)",
        summary.task, summary.preset
    );
    lra_runs::write_atomic(&chart, svg(&points, &caption)?.as_bytes())?;
    lra_runs::write_atomic(
        &table,
        markdown(&summary, &bench, &args.bench, n, &points).as_bytes(),
    )?;
    println!("wrote {} and {}", chart.display(), table.display());
    Ok(())
}

/// Checks that `bench` is a `bench lra` report of the summary's task and preset, measured at
/// `n` (or at any length, then its longest); returns the length.
fn check_match(summary: &Summary, bench: &Value, path: &Path, n: Option<usize>) -> Result<usize> {
    if bench["benchmark"] != "lra" {
        bail!("{}: not a `bench lra` report", path.display());
    }
    let setup = &bench["setup"];
    for (field, want) in [("task", summary.task.name()), ("preset", &summary.preset)] {
        let got = setup[field].as_str().unwrap_or("");
        if got != want {
            bail!(
                "{}: measured the {field} `{got}`, the sweep's is `{want}` (run `cargo xtask \
                 bench lra --task {} --preset {}`)",
                path.display(),
                summary.task,
                summary.preset
            );
        }
    }
    let lengths: Vec<usize> = (setup["lengths"].as_array().into_iter().flatten())
        .filter_map(|n| n.as_u64().map(|n| n as usize))
        .collect();
    match n {
        Some(n) if lengths.contains(&n) => Ok(n),
        Some(n) => bail!("{}: no case at n={n} (lengths {lengths:?})", path.display()),
        None => (lengths.iter().copied().max())
            .with_context(|| format!("{}: no lengths", path.display())),
    }
}

/// The attentions both files have, in the summary's order.
fn points(summary: &Summary, bench: &Value, n: usize) -> Vec<Point> {
    (summary.attentions.iter())
        .filter_map(|(name, s)| {
            Some(Point {
                name: name.clone(),
                accuracy: s.mean,
                std: s.std,
                seeds: s.seeds.len(),
                steps_per_s: metric(bench, "ours", name, n, "steps_per_s")?,
                peak_mib: metric(bench, "ours", name, n, "peak_mib")?,
            })
        })
        .collect()
}

/// The chart: accuracy in percent against steps per second, circle areas proportional to peak
/// memory, each circle named.
fn svg(points: &[Point], caption: &str) -> Result<String> {
    const SIZE: (u32, u32) = (820, 560);
    /// The largest circle's radius in pixels.
    const MAX_RADIUS: f64 = 26.0;
    let err = drawing("the accuracy-speed chart");
    let range = |values: Vec<f64>, pad: f64| {
        let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let margin = ((hi - lo) * pad).max(hi.abs() * 0.02).max(1e-6);
        (lo - margin)..(hi + margin)
    };
    let x = range(points.iter().map(|p| p.steps_per_s).collect(), 0.12);
    let y = range(
        (points.iter())
            .flat_map(|p| [100.0 * (p.accuracy - p.std), 100.0 * (p.accuracy + p.std)])
            .collect(),
        0.05,
    );
    let max_mib = points
        .iter()
        .map(|p| p.peak_mib)
        .fold(0.0, f64::max)
        .max(1e-9);
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(&err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 15))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(55)
            .build_cartesian_2d(x, y)
            .map_err(&err)?;
        chart
            .configure_mesh()
            .x_desc("training steps per second (ours)")
            .y_desc("test accuracy, % (mean ± std over seeds)")
            .light_line_style(WHITE)
            .draw()
            .map_err(&err)?;
        // The spread over seeds first, beneath the circles: ± one sample standard deviation.
        chart
            .draw_series(points.iter().map(|p| {
                let (x, y, std) = (p.steps_per_s, 100.0 * p.accuracy, 100.0 * p.std);
                ErrorBar::new_vertical(x, y - std, y, y + std, BLACK.mix(0.3).stroke_width(1), 6)
            }))
            .map_err(&err)?;
        for (i, point) in points.iter().enumerate() {
            let radius = (MAX_RADIUS * (point.peak_mib / max_mib).sqrt()).max(3.0);
            let at = (point.steps_per_s, 100.0 * point.accuracy);
            // The name beside the circle, not across it.
            let label = (radius.round() as i32 + 3, -6);
            chart
                .draw_series([EmptyElement::at(at)
                    + Circle::new((0, 0), radius, color(i).mix(0.35).filled())
                    + Circle::new((0, 0), radius, color(i).stroke_width(1))
                    + Text::new(point.name.to_string(), label, ("sans-serif", 11))])
                .map_err(&err)?;
        }
        root.present().map_err(&err)?;
    }
    Ok(out)
}

/// The chart's figures as a table, with where each came from.
fn markdown(summary: &Summary, bench: &Value, path: &Path, n: usize, points: &[Point]) -> String {
    let machine = &bench["machine"];
    let mut md = format!(
        "# {} {}: accuracy against training speed\n\n![accuracy against training speed]({CHART})\n\n\
         Accuracy: the sweep's `summary.json` (mean and sample standard deviation over the \
         seeds). Speed and memory: `{}` at n={n}, batch {}, backend `{}`, measured on {} ({} \
         cores), commit {} (ours; the median over its rounds).\n\n\
         | attention | seeds | test acc % | steps/s | peak MiB |\n|---|---|---|---|---|\n",
        summary.task,
        summary.preset,
        path.display(),
        bench["setup"]["batch"],
        bench["backend"].as_str().unwrap_or(""),
        machine["cpu"].as_str().unwrap_or("unknown"),
        machine["cores"],
        machine["commit"].as_str().unwrap_or("unknown"),
    );
    for p in points {
        md.push_str(&format!(
            "| {} | {} | {:.2} ± {:.2} | {:.1} | {:.0} |\n",
            p.name,
            p.seeds,
            100.0 * p.accuracy,
            100.0 * p.std,
            p.steps_per_s,
            p.peak_mib
        ));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> Summary {
        serde_json::from_value(serde_json::json!({
            "attentions": {
                "linear": {"accuracies": [0.4, 0.5], "accuracies_best_val": [0.4, 0.5],
                    "accuracies_last": [0.4, 0.5], "backend": "flex", "best": 0.5, "mean": 0.45,
                    "n_params": 10, "param_increase": 0.0, "seeds": [0, 1],
                    "selection": "best-val", "std": 0.070_710_678_118_654_77, "steps": 10,
                    "test_majority_rate": 0.1},
                "softmax": {"accuracies": [0.5], "accuracies_best_val": [0.5],
                    "accuracies_last": [0.5], "backend": "flex", "best": 0.5, "mean": 0.5,
                    "n_params": 10, "param_increase": 0.0, "seeds": [0],
                    "selection": "best-val", "std": 0.0, "steps": 10, "test_majority_rate": 0.1}
            },
            "preset": "tiny", "seeds_requested": 2, "task": "listops"
        }))
        .unwrap()
    }

    fn bench(task: &str) -> Value {
        serde_json::json!({
            "benchmark": "lra", "backend": "flex",
            "machine": {"cpu": "test", "cores": 2, "commit": "abc"},
            "setup": {"task": task, "preset": "tiny", "batch": 32, "lengths": [32, 64]},
            "cases": [
                {"attention": "softmax", "n": 64, "ours": {"steps_per_s": 20.0, "peak_mib": 80.0}},
                {"attention": "softmax", "n": 32, "ours": {"steps_per_s": 40.0, "peak_mib": 40.0}},
                {"attention": "linear", "n": 64, "ours": {"error": "failed"}}
            ]
        })
    }

    /// The bench report must be of the sweep's task and preset; the longest length is the
    /// default; an attention measured at no such length is left out.
    #[test]
    fn points_join_the_summary_and_the_benchmark() {
        let path = Path::new("b.json");
        let err = check_match(&summary(), &bench("text"), path, None).unwrap_err();
        assert!(
            err.to_string().contains("measured the task `text`"),
            "{err}"
        );
        assert_eq!(
            check_match(&summary(), &bench("listops"), path, None).unwrap(),
            64
        );
        assert!(check_match(&summary(), &bench("listops"), path, Some(128)).is_err());
        let points = points(&summary(), &bench("listops"), 64);
        assert_eq!(points.len(), 1);
        assert_eq!(
            points[0],
            Point {
                name: AttentionName::new("softmax").unwrap(),
                accuracy: 0.5,
                std: 0.0,
                seeds: 1,
                steps_per_s: 20.0,
                peak_mib: 80.0
            }
        );
        let svg = svg(&points, "caption").unwrap();
        assert!(svg.contains("softmax") && svg.contains("<circle"), "{svg}");
        let md = markdown(&summary(), &bench("listops"), path, 64, &points);
        assert!(
            md.contains("| softmax | 1 | 50.00 ± 0.00 | 20.0 | 80 |"),
            "{md}"
        );
    }
}
