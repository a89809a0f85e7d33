//! `cargo xtask lra` end to end on a shortened ListOps configuration (a 1-layer width-32 model,
//! 600 generated training expressions): several runs at once on this host write the summary one
//! run at a time writes; two sweeps over one `--out` train every run once; and a sweep through a
//! real one-node Slurm cluster writes the same summary, its cancelled tasks resuming from their
//! checkpoints when it is run again.
//!
//! The sweeps run the burn-lra binary the workspace's test build made (`target/<profile>/
//! burn-lra`, built here when missing) through `--harness`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The burn-lra binary beside this test's xtask binary, built when missing.
fn harness() -> &'static Path {
    static HARNESS: OnceLock<PathBuf> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let dir = Path::new(env!("CARGO_BIN_EXE_xtask")).parent().unwrap();
        let path = dir.join(format!("burn-lra{}", std::env::consts::EXE_SUFFIX));
        if !path.is_file() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "--package", "burn-lra"]);
            if dir.ends_with("release") {
                cmd.arg("--release");
            }
            assert!(cmd.status().unwrap().success(), "cannot build burn-lra");
        }
        path
    })
}

/// A fresh folder for one test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xtask-sweeps-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The shortened ListOps configuration with `steps` steps, as `<dir>/short.toml`.
fn short_config(dir: &Path, steps: usize) -> PathBuf {
    let path = dir.join("short.toml");
    std::fs::write(
        &path,
        format!(
            r#"task = "listops"
[data]
max_len = 32
[data.generate]
min_length = 8
max_length = 32
max_depth = 3
max_args = 4
n_train = 600
n_val = 100
n_test = 200
seed = 0
[model]
n_layers = 1
d_model = 32
n_heads = 2
d_ff = 64
d_mlp = 64
dropout = 0.1
attention_dropout = 0.1
pooling = "mean"
positions = "sinusoidal"
[training]
batch_size = 16
steps = {steps}
eval_every = 50
selection = "best-val"
[training.optimizer]
beta1 = 0.9
beta2 = 0.98
epsilon = 1e-9
weight_decay = 0.0
[training.schedule]
kind = "one-cycle"
peak = 2e-3
warmup = 20
"#
        ),
    )
    .unwrap();
    path
}

/// `cargo xtask lra` over `config` into `out` (2 seeds of `attentions`), plus `extra` flags.
fn sweep(config: &Path, out: &Path, attentions: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    cmd.args(["lra", "--seeds", "2", "--attention", attentions])
        .arg("--config")
        .arg(config)
        .arg("--out")
        .arg(out)
        .arg("--harness")
        .arg(harness())
        .args(extra);
    cmd
}

fn run(mut cmd: Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn summary(out: &Path) -> (String, String) {
    let dir = out.join("listops").join("short");
    (
        std::fs::read_to_string(dir.join("summary.json")).unwrap(),
        std::fs::read_to_string(dir.join("summary.md")).unwrap(),
    )
}

/// The summary of 2 seeds each of softmax and linear, one run at a time (computed once).
fn reference_summary() -> &'static (String, String) {
    static REFERENCE: OnceLock<(String, String)> = OnceLock::new();
    REFERENCE.get_or_init(|| {
        let dir = temp_dir("reference");
        let config = short_config(&dir, 200);
        run(sweep(&config, &dir.join("runs"), "softmax,linear", &[]));
        let summary = summary(&dir.join("runs"));
        let _ = std::fs::remove_dir_all(&dir);
        summary
    })
}

#[test]
fn two_jobs_at_once_write_the_same_summary() {
    let dir = temp_dir("jobs");
    let config = short_config(&dir, 200);
    let out = dir.join("runs");
    let output = run(sweep(&config, &out, "softmax,linear", &["--jobs", "2"]));
    assert_eq!(&summary(&out), reference_summary());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let logs = out.join("listops/short/logs");
    for log in [
        "softmax-seed-0",
        "softmax-seed-1",
        "linear-seed-0",
        "linear-seed-1",
    ] {
        let text = std::fs::read_to_string(logs.join(format!("{log}.log"))).unwrap();
        assert!(text.contains("from step 0"), "{log}: {text}");
    }
    // After each run the sweep says where it stands (a plain line: stderr is not a terminal).
    assert!(
        stderr.contains("sweep: 1/4 runs done, 0 failed"),
        "{stderr}"
    );
    assert!(stderr.contains("left"), "{stderr}");
    assert!(
        stderr.contains("sweep: 4/4 runs done, 0 failed"),
        "{stderr}"
    );
    // On a CPU backend each job is pinned to its own share of the cores.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores >= 2 {
        assert!(stderr.contains("started on cores [0]"), "{stderr}");
        assert!(
            stderr.contains(&format!("started on cores [{}]", cores / 2)),
            "{stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A summary believes only the records that check out, and names what it leaves out: a run
/// folder copied under another seed's or another attention's folder (its `result.json`
/// records where it came from), and a hand-edited `result.json` (its checksum no longer
/// matches, or a figure leaves its range) are left out with a line saying why, and the summary
/// is that of the runs that remain.
#[test]
fn summaries_leave_out_records_that_do_not_belong_or_do_not_check_out() {
    let dir = temp_dir("verify");
    let config = short_config(&dir, 200);
    let out = dir.join("runs");
    run(sweep(&config, &out, "softmax", &[]));
    let sweep_dir = out.join("listops/short");
    let result =
        |attention: &str, seed: u64| sweep_dir.join(format!("{attention}/seed-{seed}/result.json"));
    // Seed 1's record replaced by seed 0's; seed 0's copied under `linear`, and again under
    // `performer` with its accuracy edited to 150%, its attention name edited to match.
    std::fs::copy(result("softmax", 0), result("softmax", 1)).unwrap();
    for attention in ["linear", "performer"] {
        std::fs::create_dir_all(result(attention, 0).parent().unwrap()).unwrap();
    }
    std::fs::copy(result("softmax", 0), result("linear", 0)).unwrap();
    let mut edited: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(result("softmax", 0)).unwrap()).unwrap();
    edited["attention"] = "performer".into();
    edited["test_accuracy"] = 1.5.into();
    std::fs::write(result("performer", 0), edited.to_string()).unwrap();
    let output = run(sweep(&config, &out, "softmax", &["--summarize"]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    for says in [
        "softmax/seed-1/result.json: it records seed 0, but sits in the folder of seed 1; left \
         out of the summary",
        "linear/seed-0/result.json: it records the attention `softmax`, but sits in the folder \
         of `linear`; left out of the summary",
        "performer/seed-0/result.json: its checksum does not match its contents",
    ] {
        assert!(stderr.contains(says), "expected `{says}` in {stderr}");
    }
    let summary: serde_json::Value = serde_json::from_str(&summary(&out).0).unwrap();
    let attentions = summary["attentions"].as_object().unwrap();
    assert_eq!(
        attentions.keys().collect::<Vec<_>>(),
        ["softmax"],
        "{summary}"
    );
    assert_eq!(attentions["softmax"]["seeds"], serde_json::json!([0]));
    // Without its checksum, the edited record still fails its range check.
    edited.as_object_mut().unwrap().remove("sha256");
    std::fs::write(result("performer", 0), edited.to_string()).unwrap();
    let output = run(sweep(&config, &out, "softmax", &["--summarize"]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("performer/seed-0/result.json: `test_accuracy` is 1.5, outside [0, 1]"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn concurrent_sweeps_train_each_run_once() {
    let dir = temp_dir("concurrent");
    let config = short_config(&dir, 600);
    let out = dir.join("runs");
    let spawn = |mut cmd: Command| {
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    // One job each, so each sweep reports its runs on its own stderr (with more, the runs' output
    // goes to their log files, which both sweeps append to).
    let first = spawn(sweep(&config, &out, "softmax,linear", &["--jobs", "1"]));
    let second = spawn(sweep(&config, &out, "softmax,linear", &["--jobs", "1"]));
    let outputs = [
        first.wait_with_output().unwrap(),
        second.wait_with_output().unwrap(),
    ];
    let mut started = Vec::new();
    for output in &outputs {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        started.extend(
            stderr
                .lines()
                .filter(|l| l.starts_with("training ") && l.ends_with(" from step 0"))
                .map(str::to_string),
        );
    }
    started.sort();
    let before = started.len();
    started.dedup();
    assert_eq!(
        before,
        started.len(),
        "a run was trained twice: {started:?}"
    );
    assert_eq!(started.len(), 4, "{started:?}");
    // Both print the same table; every run directory is finished and unlocked.
    let table = |o: &Output| {
        let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
        stdout[stdout.find("LRA listops").expect("a table")..].to_string()
    };
    assert_eq!(table(&outputs[0]), table(&outputs[1]));
    for attention in ["softmax", "linear"] {
        for seed in 0..2 {
            let run = out.join(format!("listops/short/{attention}/seed-{seed}"));
            assert!(run.join("result.json").is_file(), "{}", run.display());
            assert!(!run.join("checkpoint").exists(), "{}", run.display());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A one-node Slurm cluster for the life of the value (`tests/slurm/cluster.sh`).
struct Cluster {
    dir: PathBuf,
    conf: PathBuf,
}

impl Cluster {
    /// The cluster, or why this host cannot have one.
    fn up(dir: &Path) -> Result<Self, String> {
        let installed = ["slurmctld", "slurmd", "sbatch", "munged"]
            .iter()
            .all(|tool| {
                ["/usr/sbin", "/usr/bin"]
                    .iter()
                    .any(|d| Path::new(d).join(tool).is_file())
            });
        if !installed {
            return Err(
                "Slurm is not installed (Debian: slurmctld slurmd slurm-client munge)".into(),
            );
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("starting slurmd and munged needs root".into());
        }
        let running = Command::new("pgrep").args(["-x", "slurmctld"]).output();
        if running.is_ok_and(|o| o.status.success()) {
            return Err(
                "a slurmctld already runs on this host (the test brings up its own)".into(),
            );
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/slurm/cluster.sh");
        let out = Command::new(&script).arg("up").arg(dir).output().unwrap();
        let cluster = Cluster {
            dir: dir.to_path_buf(),
            conf: dir.join("slurm.conf"),
        };
        if !out.status.success() {
            panic!(
                "the one-node cluster did not come up:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(cluster)
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("SLURM_CONF", &self.conf);
        cmd
    }

    /// Waits until the queue is empty.
    fn wait_idle(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let out = self.command("squeue").arg("--noheader").output().unwrap();
            if out.status.success() && out.stdout.is_empty() {
                return;
            }
            assert!(Instant::now() < deadline, "the queue did not drain");
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/slurm/cluster.sh");
        let _ = Command::new(script).arg("down").arg(&self.dir).status();
    }
}

/// Needs a one-node Slurm cluster on localhost (slurmctld, slurmd, sbatch and munged, brought
/// up by tests/slurm/cluster.sh), so it is ignored by default where a reader sees it; `.ci/run`
/// installs Slurm and runs it with `--ignored`, and it fails there if the cluster does not come
/// up.
#[test]
#[ignore = "needs Slurm (slurmctld, slurmd, sbatch, munged); .ci/run installs them and runs it with --ignored"]
fn slurm_sweep_matches_local_and_resumes_cancelled_tasks() {
    let dir = temp_dir("slurm");
    let cluster = Cluster::up(&dir.join("cluster"))
        .unwrap_or_else(|why| panic!("the Slurm cluster did not come up: {why}"));
    // Long enough to be cancelled between checkpoints (every 50 steps).
    let config = short_config(&dir, 2000);
    let local = dir.join("local");
    run(sweep(&config, &local, "softmax", &[]));

    let out = dir.join("slurm");
    let slurm_sweep = |extra: &[&str]| {
        let mut cmd = sweep(&config, &out, "softmax", &["--executor", "slurm"]);
        cmd.args(extra).env("SLURM_CONF", &cluster.conf);
        cmd
    };
    run(slurm_sweep(&["--no-wait", "--throttle", "1"]));
    // Cancel the array once seed 0 has a checkpoint and is still training.
    let seed0 = out.join("listops/short/softmax/seed-0");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !seed0.join("checkpoint/state.json").is_file() {
        assert!(Instant::now() < deadline, "no checkpoint appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
    let cancelled = cluster
        .command("scancel")
        .arg("--name=lra-listops-short")
        .status()
        .unwrap();
    assert!(cancelled.success());
    cluster.wait_idle();
    assert!(
        !seed0.join("result.json").exists(),
        "seed 0 finished before it could be cancelled; lengthen the run"
    );
    // Collecting now reports what is missing.
    let early = sweep(&config, &out, "softmax", &["--summarize"])
        .output()
        .unwrap();
    let early_err = String::from_utf8_lossy(&early.stderr);
    assert!(!early.status.success(), "{early_err}");
    assert!(early_err.contains("no finished runs"), "{early_err}");

    // Run again: only the unfinished runs are submitted, and they resume.
    let output = run(slurm_sweep(&[]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("2 task(s)"), "{stderr}");
    let logs = out.join("listops/short/slurm/logs");
    let resumed = std::fs::read_dir(&logs)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .any(|log| log.contains(&format!("resuming {} from step", seed0.display())));
    assert!(resumed, "no task log shows seed 0 resuming");
    assert_eq!(summary(&out), summary(&local));

    // Everything finished: a third run submits nothing and writes the same summary.
    let output = run(slurm_sweep(&[]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("submitted job"), "{stderr}");
    assert_eq!(summary(&out), summary(&local));
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
