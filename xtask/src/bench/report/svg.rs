//! The charts of a benchmark report: time and memory against n, log-log, one line per attention
//! (ours solid, PyTorch dashed), drawn with `plotters`.

use anyhow::Result;
use plotters::prelude::*;
use serde_json::Value;

use super::metric;

/// Size of one panel, in pixels.
const PANEL: (u32, u32) = (460, 340);
/// Width of the legend column.
const LEGEND: u32 = 170;

/// The line colours, one per attention (then again from the first).
pub(crate) const COLORS: [RGBColor; 14] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0x39, 0x3b, 0x79),
    RGBColor(0x63, 0x79, 0x39),
    RGBColor(0x84, 0x3c, 0x39),
    RGBColor(0x7b, 0x41, 0x73),
];

/// The colour of the `i`-th attention.
pub(crate) fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// A plotting error as an error naming what was drawn.
pub(crate) fn drawing<E: std::fmt::Debug>(what: &str) -> impl Fn(E) -> anyhow::Error + '_ {
    move |e| anyhow::anyhow!("cannot draw {what}: {e:?}")
}

/// Two log-log panels, `panels`' two metrics (key, title) against n, one line per attention
/// (ours solid, PyTorch dashed), and a legend: the SVG's text.
pub(crate) fn panels(
    report: &Value,
    names: &[String],
    lengths: &[usize],
    panels: [(&str, &str); 2],
) -> Result<String> {
    let mut svg = String::new();
    let err = drawing("the benchmark chart");
    {
        // Tall enough for the legend: one line per attention and the key.
        let legend_height = 55 + 14 * (names.len() as u32 + 2);
        let size = (2 * PANEL.0 + LEGEND, PANEL.1.max(legend_height));
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(&err)?;
        let (left, rest) = root.split_horizontally(PANEL.0);
        let (right, legend) = rest.split_horizontally(PANEL.0);
        let n_min = lengths.iter().copied().min().unwrap_or(1) as f64;
        let n_max = (lengths.iter().copied().max().unwrap_or(2) as f64).max(n_min * 2.0);
        for (area, (key, title)) in [left, right].iter().zip(panels) {
            let values: Vec<f64> = names
                .iter()
                .flat_map(|name| lengths.iter().map(move |&n| (name, n)))
                .flat_map(|(name, n)| {
                    ["ours", "torch"]
                        .into_iter()
                        .filter_map(move |side| metric(report, side, name, n, key))
                })
                .filter(|v| *v > 0.0)
                .collect();
            let lo = values
                .iter()
                .copied()
                .fold(f64::INFINITY, f64::min)
                .max(1e-3);
            let hi = values.iter().copied().fold(0.0, f64::max).max(lo * 10.0);
            let mut chart = ChartBuilder::on(area)
                .caption(format!("{title} vs n (log-log)"), ("sans-serif", 13))
                .margin(12)
                .x_label_area_size(30)
                .y_label_area_size(55)
                .build_cartesian_2d(
                    (n_min * 0.9..n_max * 1.1)
                        .log_scale()
                        .with_key_points(lengths.iter().map(|&n| n as f64).collect()),
                    (lo * 0.8..hi * 1.25).log_scale(),
                )
                .map_err(&err)?;
            chart
                .configure_mesh()
                .x_desc("n")
                .x_label_formatter(&|n| format!("{n:.0}"))
                .y_labels(6)
                .y_label_formatter(&|v| format!("{v}"))
                .light_line_style(WHITE)
                .draw()
                .map_err(&err)?;
            for (i, name) in names.iter().enumerate() {
                let style = color(i).stroke_width(2);
                let points = |side: &'static str| -> Vec<(f64, f64)> {
                    (lengths.iter())
                        .filter_map(|&n| {
                            let v = metric(report, side, name, n, key).filter(|v| *v > 0.0)?;
                            Some((n as f64, v))
                        })
                        .collect()
                };
                let ours = points("ours");
                if ours.len() > 1 {
                    chart
                        .draw_series(LineSeries::new(ours, style))
                        .map_err(&err)?;
                }
                let torch = points("torch");
                if torch.len() > 1 {
                    chart
                        .draw_series(DashedLineSeries::new(torch, 4, 3, style))
                        .map_err(&err)?;
                }
            }
        }
        let font = ("sans-serif", 11).into_font();
        for (i, name) in names.iter().enumerate() {
            let y = 55 + 14 * i as i32;
            legend
                .draw(&PathElement::new(
                    vec![(5, y), (25, y)],
                    color(i).stroke_width(2),
                ))
                .map_err(&err)?;
            legend
                .draw(&Text::new(name.as_str(), (30, y - 6), font.clone()))
                .map_err(&err)?;
        }
        let y = 55 + 14 * names.len() as i32 + 4;
        legend
            .draw(&Text::new("solid: ours, dashed: PyTorch", (5, y), font))
            .map_err(&err)?;
        root.present().map_err(&err)?;
    }
    Ok(svg)
}
