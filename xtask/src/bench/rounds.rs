//! Rounds: every case measured once per pass over all the cases, so that a slow spell of a
//! shared machine lands in one round of a case rather than in all its repetitions; each figure
//! is the median over the rounds.

use std::time::Duration;

use serde_json::{Value, json};

use lra_runs::summary::median;

use super::protocol::{Case, run_case};

/// Runs every case `rounds` times, one round through all the cases after another, so that a
/// slow spell of the machine lands in one round of a case rather than in all of its
/// repetitions; prints each measurement (`show` formats one) and returns the report's cases:
/// per side, the median over rounds of every number, and each round's measurement.
pub(crate) fn run_rounds(
    cases: Vec<Case>,
    rounds: usize,
    timeout: Duration,
    show: impl Fn(&Value) -> String,
) -> Vec<Value> {
    type Measured = std::result::Result<Value, String>;
    let text = |r: &Measured| match r {
        Ok(v) => show(v),
        Err(e) => e.clone(),
    };
    let mut measured: Vec<(Vec<Measured>, Vec<Measured>)> =
        cases.iter().map(|_| Default::default()).collect();
    for round in 1..=rounds {
        eprintln!("-- round {round} of {rounds}");
        for (case, (ours, torch)) in cases.iter().zip(&mut measured) {
            let mine = match &case.ours {
                Ok(ours) => run_case(ours.command(), timeout),
                Err(reason) if round == 1 => Err(reason.clone()),
                Err(_) => continue,
            };
            eprintln!("{:<16} n={:<6} ours: {}", case.name, case.n, text(&mine));
            ours.push(mine);
            if let Some(invocation) = &case.torch {
                let theirs = run_case(invocation.command(), timeout);
                eprintln!("{:<16} {:<8} torch: {}", "", "", text(&theirs));
                torch.push(theirs);
            }
        }
    }
    cases
        .iter()
        .zip(measured)
        .map(|(case, (ours, torch))| {
            json!({
                "attention": case.name,
                "n": case.n,
                "params": case.params,
                "ours": combine(ours),
                "torch": case.torch.as_ref().map(|_| combine(torch)),
            })
        })
        .collect()
}

/// One side of a case over its rounds: the first round's fields with every number replaced by
/// its median over the rounds, and the rounds themselves under `rounds`; an error if any round
/// failed (a case that fails now and then is not reported as measured).
fn combine(rounds: Vec<std::result::Result<Value, String>>) -> Value {
    let values = match rounds
        .into_iter()
        .collect::<std::result::Result<Vec<_>, _>>()
    {
        Ok(values) if !values.is_empty() => values,
        Ok(_) => return json!({"error": "not run"}),
        Err(e) => return json!({"error": e}),
    };
    let mut combined = values[0].clone();
    if let Some(fields) = combined.as_object_mut() {
        for (key, value) in fields.iter_mut() {
            if value.is_number() && values.iter().any(|v| v[key] != *value) {
                let numbers: Vec<f64> = values.iter().filter_map(|v| v[key].as_f64()).collect();
                if numbers.len() == values.len() {
                    *value = json!(median(numbers));
                }
            }
        }
        fields.insert("rounds".into(), Value::Array(values));
    }
    combined
}
