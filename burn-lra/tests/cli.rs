//! The command line's errors: one line that names the problem, no backtrace.

use std::process::Command;

fn burn_lra(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_burn-lra"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `burn-lra train --task listops --attention softmax` followed by `extra`.
fn train_softmax(extra: &[&str]) -> (bool, String) {
    let mut args = vec!["train", "--task", "listops", "--attention", "softmax"];
    args.extend_from_slice(extra);
    burn_lra(&args)
}

fn assert_one_line_error(stderr: &str, needle: &str) {
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains(needle),
        "expected `{needle}` in: {stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("burn-lra-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn unknown_attention_is_named() {
    let (ok, stderr) = burn_lra(&["train", "--task", "listops", "--attention", "perfomer"]);
    assert!(!ok);
    assert_one_line_error(&stderr, "unknown attention `perfomer`");
}

#[test]
fn missing_data_file_is_named() {
    let dir = temp_dir("missing");
    std::fs::write(
        dir.join("basic_train.tsv"),
        "Source\tTarget\n( ( [MAX 2 ) ] )\t2\n",
    )
    .unwrap();
    let (ok, stderr) = train_softmax(&[
        "--data-dir",
        dir.to_str().unwrap(),
        "--out",
        dir.join("runs").to_str().unwrap(),
    ]);
    assert!(!ok);
    assert_one_line_error(&stderr, "basic_val.tsv");
    let (ok, stderr) = train_softmax(&["--data-dir", "/nonexistent/listops"]);
    assert!(!ok);
    assert_one_line_error(&stderr, "/nonexistent/listops does not exist");
}

#[test]
fn malformed_tsv_row_names_file_and_line() {
    let dir = temp_dir("malformed");
    let good = "Source\tTarget\n( ( [MAX 2 ) ] )\t2\n";
    std::fs::write(dir.join("basic_train.tsv"), good).unwrap();
    std::fs::write(dir.join("basic_val.tsv"), good).unwrap();
    std::fs::write(
        dir.join("basic_test.tsv"),
        format!("{good}( ( [MIN 3 ) ] ) 3\n"),
    )
    .unwrap();
    let (ok, stderr) = train_softmax(&[
        "--data-dir",
        dir.to_str().unwrap(),
        "--out",
        dir.join("runs").to_str().unwrap(),
    ]);
    assert!(!ok);
    assert_one_line_error(&stderr, "basic_test.tsv:3: expected 2 tab-separated fields");
}

#[test]
fn bad_config_key_is_named() {
    let dir = temp_dir("config");
    let preset = include_str!("../../configs/listops/tiny.toml");
    let path = dir.join("mine.toml");
    std::fs::write(
        &path,
        preset.replace("n_layers = 2", "n_layers = 2\nn_layer = 3"),
    )
    .unwrap();
    let (ok, stderr) = train_softmax(&["--config", path.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains("n_layer") && stderr.contains("mine.toml"),
        "{stderr}"
    );
    std::fs::write(&path, preset.replace("d_model = 64", "d_model = 63")).unwrap();
    let (ok, stderr) = train_softmax(&["--config", path.to_str().unwrap()]);
    assert!(!ok);
    assert_one_line_error(
        &stderr,
        "`model.d_model` (63) must be a multiple of `model.n_heads` (4)",
    );
}

#[test]
fn backend_not_compiled_names_the_feature() {
    let missing = burn_lra::backend::BackendKind::ALL
        .into_iter()
        .find(|b| !burn_lra::backend::BackendDevice::is_compiled(b));
    if let Some(backend) = missing {
        let (ok, stderr) = train_softmax(&["--backend", backend.name()]);
        assert!(!ok);
        assert_one_line_error(&stderr, &format!("--features {}", backend.feature()));
    }
}

/// The text and matching tasks' bad inputs, through the command line: each is one error line
/// before any training.
#[test]
fn text_and_matching_bad_inputs_are_named() {
    let dir = temp_dir("text");
    let out = dir.to_str().unwrap();
    let text = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "--task",
            "text",
            "--attention",
            "softmax",
            "--out",
            out,
        ];
        args.extend_from_slice(extra);
        burn_lra(&args)
    };
    let (ok, stderr) = text(&[]);
    assert!(!ok);
    assert_one_line_error(&stderr, "pass --data-dir with the IMDB reviews");
    let missing = dir.join("no-such-dir");
    let (_, stderr) = text(&["--data-dir", missing.to_str().unwrap()]);
    assert_one_line_error(&stderr, "does not exist");
    let archive = dir.join("reviews.tar.gz");
    std::fs::write(&archive, b"\x1f\x8b garbage").unwrap();
    let (_, stderr) = text(&["--data-dir", archive.to_str().unwrap()]);
    assert_one_line_error(&stderr, "reviews.tar.gz: unreadable archive");
    let tsv = dir.join("corpus");
    std::fs::create_dir_all(&tsv).unwrap();
    std::fs::write(tsv.join("train.tsv"), "1\tgood\n5\tbad label\n").unwrap();
    std::fs::write(tsv.join("test.tsv"), "0\tok\n").unwrap();
    let (_, stderr) = text(&["--data-dir", tsv.to_str().unwrap()]);
    assert_one_line_error(&stderr, "train.tsv:2: label `5` is out of range");

    let (ok, stderr) = burn_lra(&[
        "train",
        "--task",
        "matching",
        "--attention",
        "softmax",
        "--out",
        out,
    ]);
    assert!(!ok);
    assert_one_line_error(&stderr, "burn-lra generate-matching");
    let aan = dir.join("aan");
    let (ok, _) = burn_lra(&[
        "generate-matching",
        "--out",
        aan.to_str().unwrap(),
        "--n-train",
        "8",
        "--n-val",
        "4",
        "--n-test",
        "1",
    ]);
    assert!(ok);
    std::fs::write(aan.join("new_aan_pairs.test.tsv"), "").unwrap();
    let (_, stderr) = burn_lra(&[
        "train",
        "--task",
        "matching",
        "--attention",
        "softmax",
        "--out",
        out,
        "--data-dir",
        aan.to_str().unwrap(),
    ]);
    assert_one_line_error(&stderr, "new_aan_pairs.test.tsv: the split is empty");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--resume` where no run was started is an error that says so and creates nothing.
#[test]
fn resume_without_a_run_is_an_error() {
    let dir = temp_dir("resume");
    let run_dir = dir.join("run");
    let (ok, stderr) = train_softmax(&[
        "--out",
        dir.to_str().unwrap(),
        "--run-dir",
        run_dir.to_str().unwrap(),
        "--resume",
    ]);
    assert!(!ok);
    assert_one_line_error(&stderr, "no run to resume");
    assert!(!run_dir.exists(), "--resume created {}", run_dir.display());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The JSON line a successful benchmark command printed.
fn json_line(out: std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap()
}

/// The small layer and short timing both benchmark commands' tests measure.
const SMALL_LAYER: [&str; 8] = [
    "--d-model",
    "32",
    "--heads",
    "2",
    "--reps",
    "2",
    "--warmup",
    "0",
];

/// `bench-attention` prints one JSON line with positive timings, for a quadratic and a linear
/// variant (the numbers themselves belong to `cargo xtask bench`, not to tests).
#[test]
fn bench_attention_prints_one_json_line() {
    for (attention, params) in [("softmax", "{}"), ("nystrom", r#"{"n_landmarks": 8}"#)] {
        let out = Command::new(env!("CARGO_BIN_EXE_burn-lra"))
            .args(["bench-attention", "--attention", attention, "--n", "64"])
            .args(SMALL_LAYER)
            .args(["--params", params])
            .output()
            .unwrap();
        let v = json_line(out);
        let line = v.to_string();
        assert_eq!(v["attention"], attention);
        assert_eq!(v["n"], 64);
        for key in ["forward_ms", "forward_backward_ms"] {
            assert!(v[key].as_f64().unwrap() > 0.0, "{line}");
        }
        assert!(v["peak_mib"].as_f64().unwrap() >= 0.0, "{line}");
    }
}

/// `bench-decode` (one case of `cargo xtask bench decode`) prints one JSON line: its state is a
/// key/value cache for softmax, 2 × heads × n × d_head numbers (both positions' exact sizes),
/// and retnet's fixed `d_head × (d_head + 1)` per head (its last column the decayed count its
/// normalisation reads) plus the count of tokens seen, at both; a
/// variant without a causal form is refused, naming it.
#[test]
fn bench_decode_prints_one_json_line() {
    let decode = |attention: &str, n: usize| {
        Command::new(env!("CARGO_BIN_EXE_burn-lra"))
            .args([
                "bench-decode",
                "--attention",
                attention,
                "--n",
                &n.to_string(),
            ])
            .args(SMALL_LAYER)
            .output()
            .unwrap()
    };
    let mib = |numbers: usize| numbers as f64 * 4.0 / (1u64 << 20) as f64;
    for n in [10, 40] {
        let v = json_line(decode("softmax", n));
        assert_eq!(
            (v["attention"].as_str(), v["n"].as_u64()),
            (Some("softmax"), Some(n as u64))
        );
        assert!(v["token_ms"].as_f64().unwrap() > 0.0, "{v}");
        assert!(v["prefill_ms"].as_f64().unwrap() > 0.0, "{v}");
        assert_eq!(v["state_mib"].as_f64(), Some(mib(2 * 2 * n * 16)), "{v}");
        let v = json_line(decode("retnet", n));
        assert_eq!(v["state_mib"].as_f64(), Some(mib(2 * 16 * 17 + 1)), "{v}");
    }
    let refused = decode("nystrom", 10);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("nystrom"),
        "{stderr}"
    );
    // A hybrid pattern decodes through a block per layer: its state is its layers' together
    // (retnet's fixed state beside softmax's cache), and a pattern with a layer that has no
    // causal form is refused, naming it.
    for n in [10, 40] {
        let v = json_line(decode("retnet+softmax", n));
        assert_eq!(v["attention"], "retnet+softmax");
        assert_eq!(
            v["state_mib"].as_f64(),
            Some(mib(2 * 16 * 17 + 1 + 2 * 2 * n * 16)),
            "{v}"
        );
    }
    let refused = decode("retnet+nystrom", 10);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("nystrom"),
        "{stderr}"
    );
}

/// `list --causal` lists the attentions with a causal form: softmax and retnet, not nystrom.
#[test]
fn list_causal_keeps_the_causal_attentions() {
    let out = Command::new(env!("CARGO_BIN_EXE_burn-lra"))
        .args(["list", "--names", "--causal"])
        .output()
        .unwrap();
    let names = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = names.lines().collect();
    assert!(
        names.contains(&"softmax") && names.contains(&"retnet"),
        "{names:?}"
    );
    assert!(!names.contains(&"nystrom"), "{names:?}");
}

/// `bench-train` (one case of `cargo xtask bench lra`) trains the Text model at the requested
/// length and batch and prints one JSON line whose rate is the inverse of its step time and whose
/// parameter count is the one `burn-lra params` reports for the same preset; `--describe` prints
/// the resolved model (the preset's, dropout included), optimiser and attention parameters the
/// PyTorch side is built from.
#[test]
fn bench_train_prints_one_json_line() {
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_burn-lra"))
            .args(["bench-train", "--attention", "nystrom", "--preset", "tiny"])
            .args(["--n", "48", "--batch", "2", "--steps", "2", "--warmup", "0"])
            .args(extra)
            .output()
            .unwrap();
        json_line(out)
    };
    let v = run(&[]);
    assert_eq!(
        (
            v["attention"].as_str(),
            v["n"].as_u64(),
            v["batch"].as_u64()
        ),
        (Some("nystrom"), Some(48), Some(2))
    );
    let (rate, ms) = (
        v["steps_per_s"].as_f64().unwrap(),
        v["step_ms"].as_f64().unwrap(),
    );
    assert!(ms > 0.0 && (rate * ms - 1000.0).abs() < 1e-6, "{v}");
    assert!(v["peak_mib"].as_f64().unwrap() >= 0.0, "{v}");

    let params = Command::new(env!("CARGO_BIN_EXE_burn-lra"))
        .args(["params", "--task", "text", "--preset", "tiny"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&params.stdout);
    let count = v["n_params"].as_u64().unwrap();
    assert!(
        listed.contains(&count.to_string()),
        "bench-train counted {count} parameters; burn-lra params printed:\n{listed}"
    );

    let d = run(&["--describe"]);
    assert_eq!(d["model"]["d_model"].as_u64(), Some(64), "{d}");
    // The benchmark trains the preset as it is, attention dropout included (0.1 in the tiny
    // Text preset).
    let preset = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/text/tiny.toml"),
    )
    .unwrap();
    assert!(preset.contains("attention_dropout = 0.1"), "{preset}");
    assert_eq!(d["model"]["attention_dropout"].as_f64(), Some(0.1), "{d}");
    assert!(d["optimizer"]["beta2"].as_f64().is_some(), "{d}");
    assert!(d["params"].is_object(), "{d}");
}

/// `compare` compares runs, not spellings: two identical BPE runs (a model whose vocabulary is
/// the tokenizer's, not the task's bytes), one started with relative paths from its folder and
/// one with absolute paths, are the same run; a run compared with itself under two spellings
/// is too. A generator run in the current folder (`--out .`) leaves the user's file there.
#[test]
fn compare_takes_each_runs_own_configuration_and_any_spelling_of_its_paths() {
    let dir = temp_dir("compare-bpe");
    let words = [
        "good", "bad", "film", "plot", "actor", "great", "awful", "scene",
    ];
    let mut corpus = String::new();
    for i in 0..80 {
        let text: Vec<&str> = (0..12).map(|j| words[(i * 7 + j * 3) % 8]).collect();
        corpus.push_str(&format!("{}\t{}\n", i % 2, text.join(" ")));
    }
    std::fs::create_dir_all(dir.join("imdb")).unwrap();
    std::fs::write(dir.join("imdb/train.tsv"), &corpus).unwrap();
    std::fs::write(dir.join("imdb/test.tsv"), &corpus[..corpus.len() / 2]).unwrap();
    let config = include_str!("../../configs/text/tiny-bpe.toml")
        .replace("bpe_vocab_size = 2000", "bpe_vocab_size = 300")
        .replace("max_len = 256", "max_len = 32")
        .replace(
            "validation = { holdout = 1000 }",
            "validation = { holdout = 10 }",
        )
        .replace("test_subset = 2000\n", "")
        .replace("batch_size = 32", "batch_size = 8")
        .replace("steps = 600", "steps = 6")
        .replace("eval_every = 200", "eval_every = 3")
        .replace("warmup = 60", "warmup = 2");
    std::fs::write(dir.join("bpe.toml"), config).unwrap();
    let run = |cwd: &std::path::Path, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_burn-lra"))
            .args(args)
            .current_dir(cwd)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {stderr}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let train = |cwd: &std::path::Path, [config, data, out, run_dir]: [&str; 4]| {
        let args = [
            "train",
            "--task",
            "text",
            "--attention",
            "softmax",
            "--config",
            config,
            "--data-dir",
            data,
            "--out",
            out,
            "--run-dir",
            run_dir,
            "--no-progress",
        ];
        run(cwd, &args);
    };
    let absolute = |p: &str| dir.join(p).to_str().unwrap().to_string();
    train(&dir, ["bpe.toml", "imdb", "runs", "runs/a"]);
    train(
        &std::env::temp_dir(),
        [
            &absolute("bpe.toml"),
            &absolute("./imdb/../imdb"),
            &absolute("runs"),
            &absolute("runs/b"),
        ],
    );
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("runs/a/config.json")).unwrap())
            .unwrap();
    assert!(record["run"]["data"]["bpe_vocab_size"] == 300, "{record}");
    let same = run(&dir, &["compare", "runs/a", &absolute("runs/b")]);
    assert!(same.contains("are the same run"), "{same}");
    let same = run(&dir, &["compare", "runs/a", &absolute("runs/../runs/a")]);
    assert!(same.contains("are the same run"), "{same}");
    // `--out .` writes the generated folder beside the user's file, and nothing else.
    let here = dir.join("here");
    std::fs::create_dir_all(&here).unwrap();
    std::fs::write(here.join("notes.txt"), b"mine").unwrap();
    run(
        &here,
        &[
            "generate-pathfinder",
            "--out",
            ".",
            "--n",
            "10",
            "--difficulty",
            "easy",
        ],
    );
    let mut names: Vec<String> = std::fs::read_dir(&here)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["curv_baseline", "notes.txt"]);
    assert_eq!(std::fs::read(here.join("notes.txt")).unwrap(), b"mine");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A usage mistake (a bad value, a missing flag, an unknown subcommand) is one error line too,
/// with clap's exit status 2; `--help` still prints the help.
#[test]
fn usage_mistakes_are_one_error_line() {
    for (args, needle) in [
        (
            &["train", "--task", "foo", "--attention", "softmax"][..],
            "invalid value 'foo' for '--task <TASK>' [possible values: listops",
        ),
        (&["train", "--attention", "softmax"][..], "--task <TASK>"),
        (&["bogus"][..], "unrecognized subcommand 'bogus'"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_burn-lra"))
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert_one_line_error(&stderr, needle);
    }
    let (ok, _) = burn_lra(&["train", "--help"]);
    assert!(ok);
}

/// Output into a pipe whose reader has gone (`burn-lra list | head -1`) ends the process quietly,
/// not with a panic and a backtrace.
#[cfg(unix)]
#[test]
fn a_closed_pipe_ends_the_listing_quietly() {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_burn-lra"))
        .args(["params", "--task", "listops", "--preset", "tiny"])
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reading end closes before the listing is written.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `bench-gemm` prints one JSON line: the product's side, its time and the rate `2 n³ / time`.
#[test]
fn bench_gemm_prints_one_json_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_burn-lra"))
        .args(["bench-gemm", "--n", "64", "--reps", "2", "--warmup", "0"])
        .output()
        .unwrap();
    let v = json_line(out);
    let (ms, rate) = (
        v["ms"].as_f64().unwrap(),
        v["gflop_per_s"].as_f64().unwrap(),
    );
    assert_eq!(v["n"], 64);
    assert!(ms > 0.0, "{v}");
    assert!(
        (rate - 2.0 * 64f64.powi(3) / (ms * 1e6)).abs() < 1e-9 * rate,
        "{v}"
    );
}

/// A configuration's `[pretraining]` table reaches `burn-lra pretrain`'s run (its steps, masking
/// and schedule, as its `config.json` records them), and `train` ignores it.
#[test]
fn pretrain_takes_the_configuration_s_pretraining_table() {
    let dir = temp_dir("pretraining-table");
    let text = format!(
        "{}\n[pretraining]\nsteps = 4\nmask_rate = 0.3\n\
         schedule = {{ kind = \"constant\", peak = 1e-3, warmup = 1 }}\n",
        burn_lra::config::preset_text("listops", "tiny").unwrap()
    );
    let config = dir.join("protocol.toml");
    std::fs::write(&config, text).unwrap();
    let small = [
        "--set",
        "data.generate.n_train=48",
        "--set",
        "data.generate.n_val=8",
        "--set",
        "data.generate.n_test=8",
        "--set",
        "training.steps=3",
        "--set",
        "training.eval_every=2",
        "--set",
        "training.schedule.warmup=1",
    ];
    let seen = std::cell::RefCell::new(Vec::new());
    let recorded = |command: &str| {
        let mut args = vec![command, "--task", "listops", "--attention", "softmax"];
        args.extend(["--config", config.to_str().unwrap()]);
        args.extend(["--out", dir.to_str().unwrap()]);
        args.extend(small);
        let (ok, stderr) = burn_lra(&args);
        assert!(ok, "{command}: {stderr}");
        // The sweep folder this command made (long names are shortened with a hash).
        let sweeps = || -> Vec<std::path::PathBuf> {
            std::fs::read_dir(dir.join("listops"))
                .map(|entries| entries.map(|e| e.unwrap().path()).collect())
                .unwrap_or_default()
        };
        let sweep = sweeps()
            .into_iter()
            .find(|p| !seen.borrow().contains(p))
            .unwrap();
        seen.borrow_mut().push(sweep.clone());
        let run = sweep.join("softmax/seed-0/config.json");
        serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(run).unwrap()).unwrap()
    };
    let pretraining = recorded("pretrain");
    assert_eq!(pretraining["run"]["training"]["steps"], 4);
    assert_eq!(pretraining["run"]["training"]["mask_rate"], 0.3);
    assert_eq!(
        pretraining["run"]["training"]["schedule"]["kind"],
        "constant"
    );
    let task = recorded("train");
    assert_eq!(task["run"]["training"]["steps"], 3);
    assert_eq!(task["run"]["training"]["schedule"]["kind"], "one-cycle");
    let _ = std::fs::remove_dir_all(&dir);
}
