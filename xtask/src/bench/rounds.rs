//! A benchmark's cases and how they run: each side a command line started fresh per run
//! ([`Invocation`], [`run_case`]), every case measured once per pass over all the cases (rounds),
//! so that a slow spell of a shared machine lands in one round of a case rather than in all its
//! repetitions; each figure is the median over the rounds.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use lra_runs::summary::median;

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

/// Runs `cmd` with a time limit; its last stdout line parsed as JSON, or why there is none.
pub(crate) fn run_case(mut cmd: Command, timeout: Duration) -> std::result::Result<Value, String> {
    let out_path = std::env::temp_dir().join(format!("xtask-bench-{}.out", std::process::id()));
    let err_path = out_path.with_extension("err");
    let stdout = std::fs::File::create(&out_path).map_err(|e| e.to_string())?;
    let stderr = std::fs::File::create(&err_path).map_err(|e| e.to_string())?;
    let mut child = cmd
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("cannot start: {e}"))?;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("timed out after {} s", timeout.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = std::fs::read_to_string(&out_path).unwrap_or_default();
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    if !status.success() {
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(format!("failed ({status}): {last}"));
    }
    out.lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| "printed no result".to_string())
}

/// One side of a case as a command line, kept as data: each round starts a fresh process.
pub(crate) struct Invocation {
    program: PathBuf,
    args: Vec<String>,
}

impl Invocation {
    /// `program` with `args`, then the arguments `common` to both sides of the case.
    pub(crate) fn new(program: &std::ffi::OsStr, args: &[&str], common: &[String]) -> Self {
        let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        all.extend_from_slice(common);
        Invocation {
            program: program.into(),
            args: all,
        }
    }

    /// The command of one run of it.
    pub(crate) fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        cmd
    }
}

/// One benchmark case: an attention at one length, our side (or why it is skipped) and
/// PyTorch's.
pub(crate) struct Case {
    /// The attention.
    pub name: String,
    /// The length.
    pub n: usize,
    /// The attention's parameters, as both sides use them.
    pub params: Value,
    /// Our side, or why it is skipped.
    pub ours: std::result::Result<Invocation, String>,
    /// PyTorch's side, where it has one.
    pub torch: Option<Invocation>,
}
