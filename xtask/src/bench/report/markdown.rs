//! The markdown of a benchmark report: the measured tables, the ratios over softmax and over
//! PyTorch, and how the figures grow with n.

use serde_json::Value;

use super::{cell, metric, not_measured, protocol, table};
use crate::bench::variants::has_torch;

/// LRA's Table 2 (Tay et al. 2021; TPU v3, batch 32, Text task): steps per second and peak
/// memory in GB at 1K, 2K, 3K, 4K, as quoted in docs/lra.md (the LRA paper's Table 2).
const LRA_TABLE2: &[(&str, [f64; 4], [f64; 4])] = &[
    (
        "Transformer",
        [8.1, 4.9, 2.3, 1.4],
        [0.85, 2.65, 5.51, 9.48],
    ),
    ("Linformer", [9.3, 9.1, 8.5, 7.7], [0.37, 0.55, 0.99, 0.99]),
    ("Performer", [9.5, 9.4, 8.7, 8.0], [0.37, 0.59, 0.82, 1.06]),
    (
        "Linear Trans.",
        [9.1, 9.3, 8.6, 7.8],
        [0.37, 0.57, 0.80, 1.03],
    ),
];

/// The machine a report was measured on, its commit and threads: `CPU (C cores, M GiB[, GPU
/// G]), commit X, T threads`.
fn machine(report: &Value) -> String {
    let m = &report["machine"];
    let gpu = m["gpu"]
        .as_str()
        .map_or(String::new(), |g| format!(", GPU {g}"));
    format!(
        "{} ({} cores, {} GiB{gpu}), commit {}, {} threads",
        m["cpu"].as_str().unwrap_or(""),
        m["cores"],
        m["memory_gib"],
        m["commit"].as_str().unwrap_or(""),
        report["threads"]
    )
}

/// The tables of a `bench attention` report.
pub(crate) fn attention(report: &Value, names: &[String], lengths: &[usize]) -> String {
    let s = &report["setup"];
    let mut md = format!(
        "# Attention efficiency{}, backend `{}`\n\n{}; PyTorch {}. Batch {}, {} heads, d_model {}; {}; peak memory is the process's resident high-water mark above its level before the first \
         input (Linux VmHWM - VmRSS).\n\n",
        if s["causal"].as_bool() == Some(true) {
            " with causal masking"
        } else {
            ""
        },
        report["backend"].as_str().unwrap_or(""),
        machine(report),
        report["torch"].as_str().unwrap_or("not measured"),
        s["batch"],
        s["heads"],
        s["d_model"],
        protocol(s, "runs"),
    );
    let all: Vec<&String> = names.iter().collect();
    for (title, key) in [
        ("Forward + backward time, ms (ours)", "forward_backward_ms"),
        ("Forward time, ms (ours)", "forward_ms"),
        ("Peak memory, MiB (ours, forward + backward)", "peak_mib"),
    ] {
        md.push_str(&format!("## {title}\n\n"));
        table(&mut md, &all, lengths, |name, n| {
            cell(metric(report, "ours", name, n, key), 1)
        });
    }
    md.push_str(
        "## Speed-up and memory saving over softmax (ours), as in the Linformer paper's table\n\n\
         Each cell: time(softmax) / time(variant) for forward + backward, then \
         memory(softmax) / memory(variant).\n\n",
    );
    let others: Vec<&String> = names.iter().filter(|n| *n != "softmax").collect();
    table(&mut md, &others, lengths, |name, n| {
        let ratio = |key| {
            Some(metric(report, "ours", "softmax", n, key)? / metric(report, "ours", name, n, key)?)
        };
        match (ratio("forward_backward_ms"), ratio("peak_mib")) {
            (Some(t), Some(m)) => format!("{t:.2}× / {m:.2}×"),
            _ => "–".to_string(),
        }
    });
    md.push_str("## Ours / PyTorch, forward + backward time (≤ 1 means ours is faster)\n\n");
    let with_torch: Vec<&String> = names.iter().filter(|n| has_torch(n)).collect();
    table(&mut md, &with_torch, lengths, |name, n| {
        let ratio = metric(report, "ours", name, n, "forward_backward_ms")
            .zip(metric(report, "torch", name, n, "forward_backward_ms"))
            .map(|(a, b)| a / b);
        cell(ratio, 2)
    });
    // The long-sequence span over which linear cost is judged: from 2,048 to the longest n.
    let span = lengths
        .iter()
        .copied()
        .filter(|&n| n >= 2048)
        .fold(None, |acc: Option<(usize, usize)>, n| match acc {
            None => Some((n, n)),
            Some((lo, hi)) => Some((lo.min(n), hi.max(n))),
        })
        .filter(|(lo, hi)| hi > lo);
    md.push_str(
        "## Growth per doubling of n (ours, forward + backward): time, then memory\n\n\
         Linear cost shows as about 2×; quadratic as about 4×. The last column is the \
         per-doubling factor over the whole long-sequence span (the geometric mean of the \
         doublings in it), which one noisy timing cannot swing.\n\n",
    );
    md.push_str("| attention |");
    for w in lengths.windows(2) {
        md.push_str(&format!(" {}→{} |", w[0], w[1]));
    }
    if let Some((lo, hi)) = span {
        md.push_str(&format!(" {lo}→{hi}, per doubling |"));
    }
    md.push_str("\n|---|");
    for _ in lengths.windows(2) {
        md.push_str("---|");
    }
    if span.is_some() {
        md.push_str("---|");
    }
    md.push('\n');
    for name in names {
        md.push_str(&format!("| {name} |"));
        let growth = |from: usize, to: usize, key| {
            let ratio =
                metric(report, "ours", name, to, key)? / metric(report, "ours", name, from, key)?;
            Some(ratio.powf(1.0 / (to as f64 / from as f64).log2()))
        };
        for w in lengths.windows(2) {
            md.push_str(&format!(
                " {} / {} |",
                cell(growth(w[0], w[1], "forward_backward_ms"), 2),
                cell(growth(w[0], w[1], "peak_mib"), 2)
            ));
        }
        if let Some((lo, hi)) = span {
            md.push_str(&format!(
                " {} / {} |",
                cell(growth(lo, hi, "forward_backward_ms"), 2),
                cell(growth(lo, hi, "peak_mib"), 2)
            ));
        }
        md.push('\n');
    }
    md.push_str(&not_measured(report));
    md
}

/// The tables of a `bench lra` report.
pub(crate) fn lra(report: &Value, names: &[String], lengths: &[usize]) -> String {
    let s = &report["setup"];
    let (task, tokens) = match s["task"].as_str().unwrap_or("text") {
        "text" => ("Text".to_string(), "bytes"),
        "listops" => ("ListOps".to_string(), "tokens"),
        other => (other.to_string(), "tokens"),
    };
    let mut md = format!(
        "# LRA efficiency ({task} task), backend `{}`\n\n{}; PyTorch {}. The `{}` preset's {task} model at each length, batch {}, full-length \
         random {tokens}, the preset's dropout on both sides (attention dropout on the weights of \
         softmax and linformer, the attentions with weights on both sides); time of a training \
         step (forward, \
         backward, AdamW): {}; peak memory \
         is the process's resident high-water mark above its level once the model was built \
         (Linux VmHWM - VmRSS). Our model applies its padding mask at every layer; the PyTorch \
         packages take none.\n\n",
        report["backend"].as_str().unwrap_or(""),
        machine(report),
        report["torch"].as_str().unwrap_or("not measured"),
        s["preset"].as_str().unwrap_or(""),
        s["batch"],
        protocol(s, "steps"),
    );
    let all: Vec<&String> = names.iter().collect();
    let with_torch: Vec<&String> = names.iter().filter(|n| has_torch(n)).collect();
    let others: Vec<&String> = names.iter().filter(|n| *n != "softmax").collect();
    md.push_str("## Training steps per second (ours)\n\n");
    table(&mut md, &all, lengths, |name, n| {
        cell(metric(report, "ours", name, n, "steps_per_s"), 2)
    });
    md.push_str("## Peak memory, MiB (ours)\n\n");
    table(&mut md, &all, lengths, |name, n| {
        cell(metric(report, "ours", name, n, "peak_mib"), 0)
    });
    md.push_str(
        "## Relative to softmax (ours), as in LRA's Table 2\n\nEach cell: steps/s(variant) / \
         steps/s(softmax), then memory(variant) / memory(softmax).\n\n",
    );
    table(&mut md, &others, lengths, |name, n| {
        let speed = metric(report, "ours", name, n, "steps_per_s")
            .zip(metric(report, "ours", "softmax", n, "steps_per_s"))
            .map(|(a, b)| a / b);
        let memory = metric(report, "ours", name, n, "peak_mib")
            .zip(metric(report, "ours", "softmax", n, "peak_mib"))
            .map(|(a, b)| a / b);
        match (speed, memory) {
            (Some(t), Some(m)) => format!("{t:.2}× / {m:.2}×"),
            _ => "–".into(),
        }
    });
    md.push_str("## PyTorch: training steps per second\n\n");
    table(&mut md, &with_torch, lengths, |name, n| {
        cell(metric(report, "torch", name, n, "steps_per_s"), 2)
    });
    md.push_str("## Ours / PyTorch, time per training step (≤ 1 means ours is faster)\n\n");
    table(&mut md, &with_torch, lengths, |name, n| {
        let ratio = metric(report, "ours", name, n, "step_ms")
            .zip(metric(report, "torch", name, n, "step_ms"))
            .map(|(a, b)| a / b);
        cell(ratio, 2)
    });
    // LRA's Table 2 measured the Text task.
    if task == "Text" {
        md.push_str(
            "## For reference: LRA's Table 2 (Tay et al. 2021, TPU v3, batch 32)\n\nSteps per \
             second, then peak memory in GB, at 1K / 2K / 3K / 4K; other hardware, so compare the \
             shapes (how each row falls with n), not the figures.\n\n| model | steps/s | peak GB |\n\
             |---|---|---|\n",
        );
        for (model, steps, gb) in LRA_TABLE2 {
            let join = |xs: &[f64; 4], digits: usize| {
                xs.iter()
                    .map(|x| format!("{x:.digits$}"))
                    .collect::<Vec<_>>()
                    .join(" / ")
            };
            md.push_str(&format!(
                "| {model} | {} | {} |\n",
                join(steps, 1),
                join(gb, 2)
            ));
        }
    }
    md.push_str(&not_measured(report));
    md
}

/// The tables of a `bench decode` report.
pub(crate) fn decode(report: &Value, names: &[String], lengths: &[usize]) -> String {
    let s = &report["setup"];
    let mut md = format!(
        "# Decoding cost by position, backend `{}`\n\n{}. Batch {}, {} heads, d_model {}, one attention layer without autodiff: a random \
         prompt of n tokens prefilled, then each timed token decoded from the prompt's state \
         (the token at position n + 1); {}. The state is the numbers it holds at 4 bytes each \
         (`DecodingState::num_elements`).\n\n",
        report["backend"].as_str().unwrap_or(""),
        machine(report),
        s["batch"],
        s["heads"],
        s["d_model"],
        protocol(s, "tokens"),
    );
    let all: Vec<&String> = names.iter().collect();
    for (title, key, digits) in [
        ("Time per decoded token, ms, at position n", "token_ms", 3),
        ("Decoding state after n tokens, MiB", "state_mib", 3),
        (
            "Prefill of the n-token prompt, ms (one pass)",
            "prefill_ms",
            1,
        ),
    ] {
        md.push_str(&format!("## {title}\n\n"));
        table(&mut md, &all, lengths, |name, n| {
            cell(metric(report, "ours", name, n, key), digits)
        });
    }
    if let (Some(&first), Some(&last)) = (lengths.first(), lengths.last())
        && last > first
    {
        md.push_str(&format!(
            "## Growth from position {first} to {last}: time per token, then state\n\n\
             A state of fixed size shows 1.00× whatever the position; a key/value cache \
             grows with it ({:.0}×).\n\n| attention | time | state |\n|---|---|---|\n",
            last as f64 / first as f64
        ));
        for name in names {
            let growth = |key| {
                Some(
                    metric(report, "ours", name, last, key)?
                        / metric(report, "ours", name, first, key)?,
                )
            };
            let times = |x: Option<f64>| x.map_or("–".into(), |x| format!("{x:.2}×"));
            md.push_str(&format!(
                "| {name} | {} | {} |\n",
                times(growth("token_ms")),
                times(growth("state_mib"))
            ));
        }
    }
    md.push_str(&not_measured(report));
    md
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// A decode report's growth table divides the last position's figures by the first's, and a
    /// case that failed is listed as not measured.
    #[test]
    fn decode_growth_is_last_over_first() {
        let case = |name: &str, n: usize, token_ms: f64, state_mib: f64| {
            json!({"attention": name, "n": n, "ours": {
                "token_ms": token_ms, "state_mib": state_mib, "prefill_ms": 1.0, "peak_mib": 1.0,
            }, "torch": null})
        };
        let report = json!({
            "benchmark": "decode", "backend": "flex", "threads": 2,
            "machine": {"cpu": "cpu", "cores": 2, "memory_gib": 1.0, "commit": "abc"},
            "setup": {"batch": 1, "heads": 8, "d_model": 512, "reps": 20, "warmup": 3,
                      "rounds": 1, "lengths": [100, 4000]},
            "cases": [
                case("softmax", 100, 0.5, 0.4),
                case("softmax", 4000, 5.0, 16.0),
                case("gla", 100, 0.2, 0.0625),
                case("gla", 4000, 0.2, 0.0625),
                {"attention": "retnet", "n": 100, "ours": {"error": "timed out after 600 s"}},
            ],
        });
        let names = ["softmax", "gla", "retnet"].map(String::from);
        let md = super::decode(&report, &names, &[100, 4000]);
        assert!(md.contains("| softmax | 10.00× | 40.00× |"), "{md}");
        assert!(md.contains("| gla | 1.00× | 1.00× |"), "{md}");
        assert!(md.contains("| retnet | – | – |"), "{md}");
        assert!(
            md.contains("- retnet n=100 (ours): timed out after 600 s"),
            "{md}"
        );
    }
}
