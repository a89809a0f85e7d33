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
