//! A benchmark report's markdown and SVG, rendered from its JSON (by `bench attention`,
//! `bench lra` and `bench decode` once measured, or again by `bench report`): [`markdown`] writes the tables,
//! [`svg`] the charts; what follows is what both read.

use std::path::Path;

use anyhow::{Result, bail};
use serde_json::Value;

pub(crate) mod markdown;
pub(crate) mod svg;

/// Renders `<stem>.md` and `<stem>.svg` beside a results JSON; returns the markdown.
pub(crate) fn render_files(path: &Path) -> Result<String> {
    let report: Value = lra_runs::read_json(path, "a benchmark report")?;
    let mut names: Vec<String> = Vec::new();
    for case in report["cases"].as_array().into_iter().flatten() {
        if let Some(name) = case["attention"].as_str()
            && !names.iter().any(|n| n == name)
        {
            names.push(name.to_string());
        }
    }
    let lengths: Vec<usize> = report["setup"]["lengths"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_u64().map(|n| n as usize))
        .collect();
    check_figures(&report, path)?;
    let (markdown, panels) = match report["benchmark"].as_str() {
        Some("attention" | "attention-causal") => (
            markdown::attention(&report, &names, &lengths),
            [
                ("forward_backward_ms", "forward + backward time (ms)"),
                ("peak_mib", "peak memory (MiB)"),
            ],
        ),
        Some("lra") => (
            markdown::lra(&report, &names, &lengths),
            [
                ("step_ms", "time per training step (ms)"),
                ("peak_mib", "peak memory (MiB)"),
            ],
        ),
        Some("decode") => (
            markdown::decode(&report, &names, &lengths),
            [
                ("token_ms", "time per decoded token (ms)"),
                ("state_mib", "decoding state (MiB)"),
            ],
        ),
        _ => bail!(
            "{}: `benchmark` is none of attention, attention-causal, lra and decode",
            path.display()
        ),
    };
    write(&path.with_extension("md"), &markdown)?;
    write(
        &path.with_extension("svg"),
        &svg::panels(&report, &names, &lengths, panels)?,
    )?;
    Ok(markdown)
}

/// Refuses a report with a figure out of its range, naming the case, the side and the figure:
/// every time (`*_ms`) and rate (`steps_per_s`) a positive number, every memory (`*_mib`) and
/// parameter count at least 0, in each side's figures and in each of its rounds.
pub(crate) fn check_figures(report: &Value, path: &Path) -> Result<()> {
    for case in report["cases"].as_array().into_iter().flatten() {
        for side in ["ours", "torch"] {
            let figures = &case[side];
            let rounds = figures["rounds"].as_array().into_iter().flatten();
            for values in std::iter::once(figures).chain(rounds) {
                let Some(values) = values.as_object() else {
                    continue;
                };
                for (key, value) in values {
                    let Some(x) = value.as_f64() else { continue };
                    let positive = key.ends_with("_ms") || key == "steps_per_s";
                    let counted = key.ends_with("_mib") || key.starts_with("n_params");
                    let fine = x.is_finite() && (!positive || x > 0.0) && (!counted || x >= 0.0);
                    if !fine {
                        bail!(
                            "{}: {} n={} ({side}): `{key}` is {x}, not a {}",
                            path.display(),
                            case["attention"].as_str().unwrap_or("?"),
                            case["n"],
                            if positive {
                                "positive number"
                            } else {
                                "number at least 0"
                            }
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

/// How a report's figures were taken, from its setup: repetitions, warm-up, rounds and
/// processes.
pub(crate) fn protocol(setup: &Value, what: &str) -> String {
    let per_round = format!(
        "median of {} {what} after {} warm-up {what}",
        setup["reps"], setup["warmup"]
    );
    match setup["rounds"].as_u64() {
        Some(rounds) if rounds > 1 => format!(
            "the median over {rounds} rounds (passes over all the cases) of the {per_round}, one \
             process per case and round"
        ),
        _ => format!("{per_round}, one process per case"),
    }
}

/// The "Not measured" section: every case that failed, timed out or was skipped, and why.
pub(crate) fn not_measured(report: &Value) -> String {
    let skipped: Vec<String> = report["cases"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| {
            ["ours", "torch"].into_iter().filter_map(move |side| {
                c[side]["error"].as_str().map(|e| {
                    format!(
                        "- {} n={} ({side}): {e}",
                        c["attention"].as_str().unwrap_or(""),
                        c["n"]
                    )
                })
            })
        })
        .collect();
    if skipped.is_empty() {
        String::new()
    } else {
        format!("\n## Not measured\n\n{}\n", skipped.join("\n"))
    }
}

/// Writes `text` to `path` atomically.
fn write(path: &Path, text: &str) -> Result<()> {
    lra_runs::write_atomic(path, text.as_bytes())
}

/// The case of `name` at length `n`.
pub(crate) fn case<'a>(report: &'a Value, name: &str, n: usize) -> Option<&'a Value> {
    report["cases"]
        .as_array()?
        .iter()
        .find(|c| c["attention"] == name && c["n"] == n)
}

/// A number of one side (`ours`, `torch`) of a case.
pub(crate) fn metric(report: &Value, side: &str, name: &str, n: usize, key: &str) -> Option<f64> {
    case(report, name, n)?[side][key].as_f64()
}

/// A table cell: `x` with `digits` decimals, or a dash.
pub(crate) fn cell(x: Option<f64>, digits: usize) -> String {
    x.map_or("–".to_string(), |x| format!("{x:.digits$}"))
}

/// A markdown table of attentions by length: the header (`attention \ n`, then one column per
/// length), then one row per name with `value(name, n)` in each length's column, and a blank
/// line.
pub(crate) fn table(
    md: &mut String,
    names: &[&String],
    lengths: &[usize],
    value: impl Fn(&str, usize) -> String,
) {
    md.push_str("| attention \\ n |");
    for n in lengths {
        md.push_str(&format!(" {n} |"));
    }
    md.push_str("\n|---|");
    for _ in lengths {
        md.push_str("---|");
    }
    md.push('\n');
    for name in names {
        md.push_str(&format!("| {name} |"));
        for &n in lengths {
            md.push_str(&format!(" {} |", value(name, n)));
        }
        md.push('\n');
    }
    md.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every committed report's figures are in range; a negative time, a rate of 0 or a
    /// negative memory in a round is refused, naming the case and the figure.
    #[test]
    fn report_figures_are_checked() {
        let root = crate::harness::workspace_root().join("bench/results");
        let mut reports = vec![];
        let mut folders = vec![root];
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(folder).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    folders.push(path);
                } else if path.extension().is_some_and(|e| e == "json") {
                    reports.push(path);
                }
            }
        }
        assert!(reports.len() >= 5, "{reports:?}");
        for path in &reports {
            let report: Value = lra_runs::read_json(path, "a benchmark report").unwrap();
            check_figures(&report, path).unwrap();
        }
        let path = Path::new("r.json");
        for (figures, says) in [
            (
                serde_json::json!({"step_ms": -3.0}),
                "softmax n=64 (ours): `step_ms` is -3, not a positive number",
            ),
            (
                serde_json::json!({"steps_per_s": 0.0}),
                "`steps_per_s` is 0, not a positive number",
            ),
            (
                serde_json::json!({"rounds": [{"peak_mib": -1.0}]}),
                "`peak_mib` is -1, not a number at least 0",
            ),
        ] {
            let report = serde_json::json!({
                "cases": [{"attention": "softmax", "n": 64, "ours": figures, "torch": null}]
            });
            let err = check_figures(&report, path).unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
        }
    }
}
