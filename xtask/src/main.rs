//! Project tasks. `cargo xtask lra ...` runs multi-seed LRA sweeps and reports mean, spread and
//! best per attention, in the shape of the source papers' tables.
//!
//! The xtask builds `burn-lra` with the asked-for backend's feature and runs its binary once per
//! (attention, seed); a seed whose run directory already holds `result.json` is skipped and one
//! with a checkpoint continues from it (`--resume`), so an interrupted sweep resumes where it
//! stopped.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

mod bench;

const USAGE: &str = "\
usage: cargo xtask lra --task <listops|text|matching> [--seeds N] [--attention a,b,...] [--preset tiny|small|lra]
                       [--config FILE] [--backend flex|ndarray|tch|tch-cuda|wgpu|cuda]
                       [--data-dir DIR] [--out DIR]
       cargo xtask lra --list
       cargo xtask bench setup | attention [...]   (cargo xtask bench for its flags)

  --seeds N        seeds 0..N-1 (default 5)
  --attention      comma-separated registry names, or all (the default: every registered attention)
  --preset         a preset of configs/<task>/ (default tiny); --config FILE for your own
  --backend        Burn backend, compiled in through the burn-lra feature of that name (default flex)
  --out            root of run directories (default runs)

Runs each seed that has no result.json yet, then prints mean ± std (sample, n-1) and best test
accuracy per attention and writes summary.json and summary.md beside the runs.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("lra") => lra(&args[1..]),
        Some("bench") => bench::bench(&args[1..]),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug)]
struct LraArgs {
    task: String,
    seeds: u64,
    attentions: Option<Vec<String>>,
    preset: String,
    config: Option<PathBuf>,
    backend: String,
    data_dir: Option<PathBuf>,
    out: PathBuf,
    list: bool,
}

fn parse(args: &[String]) -> Result<LraArgs> {
    let mut parsed = LraArgs {
        task: "listops".into(),
        seeds: 5,
        attentions: None,
        preset: "tiny".into(),
        config: None,
        backend: "flex".into(),
        data_dir: None,
        out: PathBuf::from("runs"),
        list: false,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--list" {
            parsed.list = true;
            continue;
        }
        if flag == "-h" || flag == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let value = it
            .next()
            .with_context(|| format!("{flag} needs a value\n{USAGE}"))?
            .clone();
        match flag.as_str() {
            "--task" => parsed.task = value,
            "--seeds" => {
                parsed.seeds =
                    value.parse().ok().filter(|&n| n > 0).with_context(|| {
                        format!("--seeds must be a positive integer, got `{value}`")
                    })?
            }
            "--attention" => {
                parsed.attentions = Some(value.split(',').map(|s| s.trim().to_string()).collect())
            }
            "--preset" => parsed.preset = value,
            "--config" => parsed.config = Some(value.into()),
            "--backend" => parsed.backend = value,
            "--data-dir" => parsed.data_dir = Some(value.into()),
            "--out" => parsed.out = value.into(),
            other => bail!("unknown flag `{other}`\n{USAGE}"),
        }
    }
    Ok(parsed)
}

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn cargo_feature(backend: &str) -> &str {
    if backend == "tch-cuda" {
        "tch"
    } else {
        backend
    }
}

/// A private copy of the burn-lra binary. On Linux the copy is deleted as soon as it is open and
/// runs through its descriptor (`/proc/self/fd/N`), so nothing is left on disk however the sweep
/// ends (SIGTERM and SIGKILL included); elsewhere its folder is removed when the sweep ends.
pub(crate) struct Harness {
    /// What `Command::new` runs.
    path: PathBuf,
    /// The open, already deleted copy (Linux).
    _file: Option<std::fs::File>,
    /// The folder to remove on drop (not Linux).
    folder: Option<PathBuf>,
}

impl Harness {
    #[cfg(target_os = "linux")]
    fn new(copy: &Path, folder: &Path) -> Result<Self> {
        use std::os::fd::AsRawFd;
        let file =
            std::fs::File::open(copy).with_context(|| format!("cannot open {}", copy.display()))?;
        std::fs::remove_dir_all(folder)
            .with_context(|| format!("cannot remove {}", folder.display()))?;
        Ok(Self {
            path: PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd())),
            _file: Some(file),
            folder: None,
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn new(copy: &Path, folder: &Path) -> Result<Self> {
        Ok(Self {
            path: copy.to_path_buf(),
            _file: None,
            folder: Some(folder.to_path_buf()),
        })
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(folder) = &self.folder {
            let _ = std::fs::remove_dir_all(folder);
        }
    }
}

impl AsRef<std::ffi::OsStr> for Harness {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }
}

/// Makes the child receive SIGTERM when this process ends (Linux), so that a sweep stopped by a
/// signal stops its training run too instead of leaving it running unattended (the run resumes
/// from its checkpoint next time).
fn stop_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

/// Builds burn-lra with the backend's feature (in the release profile for benchmarks) and
/// returns a private copy of the binary.
pub(crate) fn build_harness(backend: &str, release: bool) -> Result<Harness> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root()).args([
        "build",
        "--package",
        "burn-lra",
        "--features",
        cargo_feature(backend),
    ]);
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().context("cannot run cargo")?;
    if !status.success() {
        bail!(
            "building burn-lra with feature `{}` failed",
            cargo_feature(backend)
        );
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let exe = format!("burn-lra{}", std::env::consts::EXE_SUFFIX);
    // The sweep runs a private copy: a later `cargo build`/`cargo test` with other features
    // rewrites target/debug/burn-lra while the sweep is still going.
    let private = target
        .join("xtask")
        .join(format!("{}-{backend}", std::process::id()));
    std::fs::create_dir_all(&private)
        .with_context(|| format!("cannot create {}", private.display()))?;
    let copy = private.join(&exe);
    let profile = if release { "release" } else { "debug" };
    std::fs::copy(target.join(profile).join(&exe), &copy)
        .with_context(|| format!("cannot copy the harness to {}", copy.display()))?;
    Harness::new(&copy, &private)
}

/// The attentions a `--attention` list names: every registered one when the list is absent or
/// `all`; an unknown name is an error that lists the registered ones.
pub(crate) fn resolve_attentions(
    list: Option<&[String]>,
    harness: &Harness,
) -> Result<Vec<String>> {
    let output = Command::new(harness).args(["list", "--names"]).output()?;
    if !output.status.success() {
        bail!("burn-lra list --names failed");
    }
    let registered: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    match list {
        None => Ok(registered),
        Some([all]) if all == "all" => Ok(registered),
        Some(list) => {
            if let Some(unknown) = list.iter().find(|a| !registered.contains(a)) {
                bail!(
                    "unknown attention `{unknown}` (known: all, {})",
                    registered.join(", ")
                );
            }
            Ok(list.to_vec())
        }
    }
}

fn lra(args: &[String]) -> Result<()> {
    let args = parse(args)?;
    let harness = build_harness(&args.backend, false)?;
    if args.list {
        let status = Command::new(&harness).arg("list").status()?;
        if !status.success() {
            bail!("burn-lra list failed");
        }
        return Ok(());
    }
    let attentions = resolve_attentions(args.attentions.as_deref(), &harness)?;
    let preset = match &args.config {
        Some(path) => path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
        None => args.preset.clone(),
    };
    let sweep_dir = args.out.join(&args.task).join(&preset);
    let mut failures = Vec::new();
    for attention in &attentions {
        for seed in 0..args.seeds {
            let run_dir = sweep_dir.join(attention).join(format!("seed-{seed}"));
            if let Some(result) = read_result(&run_dir)? {
                eprintln!(
                    "{attention} seed {seed}: done before ({:.2}%), skipped",
                    100.0 * result["test_accuracy"].as_f64().unwrap_or(f64::NAN)
                );
                continue;
            }
            eprintln!(
                "== {} / {attention} / {preset} / seed {seed} on {}",
                args.task, args.backend
            );
            let mut cmd = Command::new(&harness);
            cmd.args(["train", "--task", &args.task, "--attention", attention])
                .args(["--seed", &seed.to_string(), "--backend", &args.backend])
                .arg("--out")
                .arg(&args.out)
                .arg("--run-dir")
                .arg(&run_dir);
            match &args.config {
                Some(path) => cmd.arg("--config").arg(path),
                None => cmd.args(["--preset", &args.preset]),
            };
            if let Some(dir) = &args.data_dir {
                cmd.arg("--data-dir").arg(dir);
            }
            // A seed killed after a checkpoint continues from it.
            if ["checkpoint", "checkpoint.old"]
                .iter()
                .any(|c| run_dir.join(c).join("state.json").is_file())
            {
                eprintln!("{attention} seed {seed}: resuming from its checkpoint");
                cmd.arg("--resume");
            }
            stop_with_parent(&mut cmd);
            if !cmd.status().context("cannot run burn-lra")?.success() {
                failures.push(format!("{attention} seed {seed}"));
            }
        }
    }
    summarize(&args, &preset, &sweep_dir)?;
    if !failures.is_empty() {
        bail!("{} run(s) failed: {}", failures.len(), failures.join(", "));
    }
    Ok(())
}

fn read_result(run_dir: &Path) -> Result<Option<Value>> {
    let path = run_dir.join("result.json");
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", path.display()))?;
    Ok(Some(value))
}

/// Mean, sample standard deviation (n - 1; 0 for one value) and maximum.
fn stats(values: &[f64]) -> (f64, f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = if values.len() > 1 {
        values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    let best = values.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    (mean, var.sqrt(), best)
}

/// Collects every attention under the sweep directory with results for seeds `0..seeds`, prints
/// the table, and writes `summary.json` and `summary.md`.
fn summarize(args: &LraArgs, preset: &str, sweep_dir: &Path) -> Result<()> {
    let mut names: Vec<String> = match std::fs::read_dir(sweep_dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "data")
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    let mut table = String::new();
    table.push_str(&format!(
        "LRA {} — preset `{preset}`, backend {}, seeds 0..{}\n\n",
        args.task, args.backend, args.seeds
    ));
    table.push_str("| attention | seeds | test acc % (mean ± std) | best % | last-ckpt mean % | best-val-ckpt mean % | params | vs softmax | majority % |\n");
    table.push_str("|---|---|---|---|---|---|---|---|---|\n");
    let mut attentions = serde_json::Map::new();
    for name in &names {
        let mut results = Vec::new();
        for seed in 0..args.seeds {
            if let Some(r) = read_result(&sweep_dir.join(name).join(format!("seed-{seed}")))? {
                results.push(r);
            }
        }
        if results.is_empty() {
            continue;
        }
        let field =
            |key: &str| -> Vec<f64> { results.iter().filter_map(|r| r[key].as_f64()).collect() };
        let (acc, last, best_val) = (
            field("test_accuracy"),
            field("test_accuracy_last"),
            field("test_accuracy_best_val"),
        );
        let (mean, std, best) = stats(&acc);
        let seeds: Vec<u64> = results.iter().filter_map(|r| r["seed"].as_u64()).collect();
        let majority = results[0]["test_majority_rate"]
            .as_f64()
            .unwrap_or(f64::NAN);
        table.push_str(&format!(
            "| {name} | {} | {:.2} ± {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {:.2} |\n",
            seeds.len(),
            100.0 * mean,
            100.0 * std,
            100.0 * best,
            100.0 * stats(&last).0,
            100.0 * stats(&best_val).0,
            results[0]["n_params"],
            results[0]["param_increase"]
                .as_f64()
                .map_or("–".to_string(), |x| format!("{:+.2}%", 100.0 * x)),
            100.0 * majority
        ));
        attentions.insert(
            name.clone(),
            json!({
                "seeds": seeds,
                "selection": results[0]["selection"],
                "accuracies": acc,
                "mean": mean,
                "std": std,
                "best": best,
                "accuracies_last": last,
                "accuracies_best_val": best_val,
                "n_params": results[0]["n_params"],
                "param_increase": results[0]["param_increase"],
                "steps": results[0]["steps"],
                "backend": results[0]["backend"],
                "test_majority_rate": majority,
            }),
        );
    }
    if attentions.is_empty() {
        bail!("no finished runs under {}", sweep_dir.display());
    }
    table.push_str("\nstd is the sample standard deviation over seeds; \"test acc\" uses each run's configured model selection.\n");
    println!("\n{table}");
    let summary = json!({
        "task": args.task,
        "preset": preset,
        "seeds_requested": args.seeds,
        "attentions": attentions,
    });
    write_atomic(
        &sweep_dir.join("summary.json"),
        serde_json::to_string_pretty(&summary)?.as_bytes(),
    )?;
    write_atomic(&sweep_dir.join("summary.md"), table.as_bytes())?;
    eprintln!(
        "wrote {} and summary.md",
        sweep_dir.join("summary.json").display()
    );
    Ok(())
}

fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::stats;

    #[test]
    fn stats_are_sample_mean_std_and_max() {
        // Hand-computed: mean 0.3; deviations -0.1, 0, 0.1 -> variance 0.02 / 2 = 0.01.
        let (mean, std, best) = stats(&[0.2, 0.3, 0.4]);
        assert!((mean - 0.3).abs() < 1e-12);
        assert!((std - 0.1).abs() < 1e-12);
        assert_eq!(best, 0.4);
        assert_eq!(stats(&[0.5]).1, 0.0);
    }
}
