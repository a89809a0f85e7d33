//! A battery of bad inputs through the command line, with `RUST_BACKTRACE=1`: configuration,
//! data, checkpoint and run-directory mistakes each end the process with exit code 1 and one
//! error line naming the file, line or field, and leave every run directory as it was.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The tiny ListOps preset shrunk to seconds of training: 200 / 40 / 40 examples, 20 steps.
fn short_config() -> String {
    let preset = include_str!("../../configs/listops/tiny.toml");
    let mut text = preset.to_string();
    for (from, to) in [
        ("steps = 1500", "steps = 20"),
        ("eval_every = 250", "eval_every = 10"),
        ("warmup = 150", "warmup = 5"),
        ("n_train = 6000", "n_train = 200"),
        ("n_val = 500", "n_val = 40"),
        ("n_test = 1000", "n_test = 40"),
    ] {
        assert!(text.contains(from), "the tiny preset has `{from}`");
        text = text.replace(from, to);
    }
    text
}

fn burn_lra(args: &[String]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_burn-lra"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap()
}

/// Every file under `root` and its bytes.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

struct Battery {
    root: PathBuf,
    runs: PathBuf,
    cases: Vec<(String, Vec<String>, String)>,
}

impl Battery {
    fn path(&self, name: &str) -> String {
        self.root.join(name).to_str().unwrap().to_string()
    }

    /// `burn-lra train --task <task> --attention <attention> --out <runs>` and `extra`.
    fn train_task(&self, task: &str, attention: &str, extra: &[&str]) -> Vec<String> {
        let runs = self.runs.to_str().unwrap();
        [
            "train",
            "--task",
            task,
            "--attention",
            attention,
            "--out",
            runs,
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
    }

    /// A ListOps run of `attention` with `extra` flags.
    fn train(&self, attention: &str, extra: &[&str]) -> Vec<String> {
        self.train_task("listops", attention, extra)
    }

    fn case(&mut self, name: &str, args: Vec<String>, needle: &str) {
        self.cases.push((name.into(), args, needle.into()));
    }

    /// A configuration file: the short config with `from` replaced by `to`.
    fn config_case(&mut self, name: &str, attention: &str, from: &str, to: &str, needle: &str) {
        let text = short_config();
        assert!(text.contains(from), "{name}: no `{from}` in the config");
        self.config_text_case(name, attention, &text.replacen(from, to, 1), needle);
    }

    /// A configuration file holding `text`.
    fn config_text_case(&mut self, name: &str, attention: &str, text: &str, needle: &str) {
        let path = self.path(&format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        let args = self.train(attention, &["--config", &path, "--no-progress"]);
        self.case(name, args, needle);
    }

    /// A ListOps data folder with good files, `file` replaced by `contents`.
    fn listops_case(&mut self, name: &str, file: &str, contents: &str, needle: &str) {
        let dir = self.root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let good = "Source\tTarget\n( ( [MAX 2 ) 3 ] )\t3\n( ( [MIN 2 ) 3 ] )\t2\n";
        for split in ["basic_train.tsv", "basic_val.tsv", "basic_test.tsv"] {
            let text = if split == file { contents } else { good };
            std::fs::write(dir.join(split), text).unwrap();
        }
        let data = dir.to_str().unwrap().to_string();
        let args = self.train("softmax", &["--data-dir", &data, "--no-progress"]);
        self.case(name, args, needle);
    }

    /// A text corpus folder (`train.tsv`, `test.tsv`) with `train` as its training file.
    fn text_case(&mut self, name: &str, train: &str, needle: &str) {
        let dir = self.root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("train.tsv"), train).unwrap();
        std::fs::write(dir.join("test.tsv"), "0\tok\n1\tfine\n").unwrap();
        let data = dir.to_str().unwrap().to_string();
        let args = self.task_args("text", &data);
        self.case(name, args, needle);
    }

    /// An AAN folder whose training file is `train`.
    fn matching_case(&mut self, name: &str, train: &str, needle: &str) {
        let dir = self.root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let good = "1\ta\tb\tsome text\tother text\n0\tc\td\tmore\tstill more\n";
        std::fs::write(dir.join("new_aan_pairs.train.tsv"), train).unwrap();
        std::fs::write(dir.join("new_aan_pairs.eval.tsv"), good).unwrap();
        std::fs::write(dir.join("new_aan_pairs.test.tsv"), good).unwrap();
        let data = dir.to_str().unwrap().to_string();
        let args = self.task_args("matching", &data);
        self.case(name, args, needle);
    }

    /// A softmax run of `task` on the data in `data`.
    fn task_args(&self, task: &str, data: &str) -> Vec<String> {
        self.train_task(task, "softmax", &["--data-dir", data, "--no-progress"])
    }
}

/// Trains the short config in `runs` with `seed` (and `extra` flags); panics on failure unless
/// `expect_stop`.
fn prepare_run(battery: &Battery, seed: &str, extra: &[&str], expect_stop: bool) {
    let config = battery.path("short.toml");
    let mut flags = vec!["--config", &config, "--seed", seed, "--no-progress"];
    flags.extend_from_slice(extra);
    let out = burn_lra(&battery.train("softmax", &flags));
    let stderr = String::from_utf8_lossy(&out.stderr);
    if expect_stop {
        assert!(stderr.contains("stopped after step"), "{stderr}");
    } else {
        assert!(out.status.success(), "{stderr}");
    }
}

#[test]
fn every_bad_input_is_one_error_line_and_changes_no_run() {
    let root = std::env::temp_dir().join(format!("burn-lra-battery-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let mut b = Battery {
        runs: root.join("runs"),
        root: root.clone(),
        cases: Vec::new(),
    };
    std::fs::write(b.path("short.toml"), short_config()).unwrap();
    // Run directories to leave alone: a finished run, an unfinished one and one whose
    // checkpoint has flipped bytes.
    prepare_run(&b, "0", &[], false);
    prepare_run(&b, "1", &["--stop-after", "10"], true);
    prepare_run(&b, "2", &["--stop-after", "10"], true);
    let runs = b.runs.clone();
    let seed_dir = move |seed: u32| runs.join(format!("listops/short/softmax/seed-{seed}"));
    let weights = seed_dir(2).join("checkpoint/model.bpk");
    let mut bytes = std::fs::read(&weights).unwrap();
    let at = bytes.len() / 2;
    bytes[at..at + 8].iter_mut().for_each(|x| *x ^= 0xff);
    std::fs::write(&weights, bytes).unwrap();
    let short = b.path("short.toml");

    // Configuration.
    b.config_case(
        "unknown-key",
        "softmax",
        "n_layers = 2",
        "n_layer = 2",
        "n_layer",
    );
    b.config_case(
        "wrong-type",
        "softmax",
        "steps = 20",
        "steps = \"ten\"",
        "`training.steps`",
    );
    b.config_case(
        "peak-nan",
        "softmax",
        "peak = 2e-3",
        "peak = nan",
        "`training.schedule.peak`",
    );
    b.config_case(
        "peak-inf",
        "softmax",
        "peak = 2e-3",
        "peak = inf",
        "`training.schedule.peak`",
    );
    b.config_case(
        "epsilon-nan",
        "softmax",
        "epsilon = 1e-9",
        "epsilon = nan",
        "`training.optimizer.epsilon`",
    );
    b.config_case(
        "decay-nan",
        "softmax",
        "weight_decay = 0.0",
        "weight_decay = nan",
        "`training.optimizer.weight_decay`",
    );
    b.config_case(
        "clip-negative",
        "softmax",
        "selection =",
        "grad_clip = -1.0\nselection =",
        "`training.grad_clip`",
    );
    b.config_case(
        "dropout",
        "softmax",
        "dropout = 0.1",
        "dropout = 1.5",
        "`model.dropout`",
    );
    b.config_case(
        "heads",
        "softmax",
        "d_model = 64",
        "d_model = 30",
        "`model.d_model` (30) must be a multiple",
    );
    b.config_case(
        "no-layers",
        "softmax",
        "n_layers = 2",
        "n_layers = 0",
        "`model.n_layers`",
    );
    b.config_case(
        "warmup",
        "softmax",
        "warmup = 5",
        "warmup = 20",
        "`training.schedule.warmup`",
    );
    b.config_case(
        "linformer-memory",
        "linformer",
        "max_len = 64",
        "max_len = 2000000000",
        "`data.max_len` = 2000000000",
    );
    b.config_case(
        "unknown-attention-table",
        "softmax",
        "[attention.nystrom]",
        "[attention.nope]\n[attention.nystrom]",
        "unknown attention `nope`",
    );
    b.config_case("unknown-param", "softmax", "k = 32", "kk = 32", "`kk`");
    b.config_case(
        "variant-key",
        "softmax",
        "n_features = 64",
        "n_features = 64\nkernel = \"relu\"",
        "kernel",
    );
    b.config_case(
        "other-task",
        "softmax",
        "task = \"listops\"",
        "task = \"text\"",
        "`data.generate` is for ListOps only",
    );
    b.config_case("toml-syntax", "softmax", "[model]", "[model", "line");
    // Learned positions grow with `max_len`.
    let learned = short_config()
        .replace("max_len = 64", "max_len = 2000000000")
        .replace("positions = \"sinusoidal\"", "positions = \"learned\"");
    b.config_text_case(
        "positions-memory",
        "softmax",
        &learned,
        "`data.max_len` = 2000000000 is too large",
    );
    // The command line.
    let missing_config = b.path("missing.toml");
    b.case(
        "config-missing",
        b.train("softmax", &["--config", &missing_config]),
        "missing.toml",
    );
    b.case(
        "attention",
        b.train("perfomer", &[]),
        "unknown attention `perfomer`",
    );
    b.case(
        "preset",
        b.train("softmax", &["--preset", "huge"]),
        "unknown preset `huge`",
    );
    // ListOps data.
    let no_dir = b.path("nowhere");
    b.case(
        "data-missing",
        b.train("softmax", &["--data-dir", &no_dir]),
        "nowhere does not exist",
    );
    let file = b.path("short.toml");
    b.case(
        "data-is-file",
        b.train("softmax", &["--data-dir", &file]),
        "short.toml is a file",
    );
    b.listops_case(
        "unbalanced",
        "basic_train.tsv",
        "Source\tTarget\n[MAX 2 3\t3\n",
        "basic_train.tsv:2: unbalanced expression",
    );
    b.listops_case(
        "extra-bracket",
        "basic_val.tsv",
        "Source\tTarget\n[MAX 2 ] ]\t2\n",
        "basic_val.tsv:2: unbalanced expression",
    );
    b.listops_case(
        "label-range",
        "basic_test.tsv",
        "Source\tTarget\n[MAX 2 ]\t12\n",
        "basic_test.tsv:2: label `12`",
    );
    b.listops_case(
        "token",
        "basic_train.tsv",
        "Source\tTarget\n[FOO 2 ]\t2\n",
        "basic_train.tsv:2: unknown token `[FOO`",
    );
    b.listops_case(
        "columns",
        "basic_train.tsv",
        "Source\tTarget\n[MAX 2 ]\t2\t7\n",
        "basic_train.tsv:2: expected 2 tab-separated fields",
    );
    b.listops_case(
        "empty-split",
        "basic_val.tsv",
        "Source\tTarget\n",
        "basic_val.tsv: the split is empty",
    );
    b.listops_case(
        "one-class",
        "basic_train.tsv",
        "Source\tTarget\n[MAX 2 ]\t2\n[MIN 2 ]\t2\n",
        "every training example has label 2",
    );
    // Text and matching data.
    b.text_case(
        "text-empty",
        "1\tgood\n0\t\n",
        "train.tsv:2: the text is empty",
    );
    b.text_case(
        "text-label",
        "1\tgood\nx\tbad\n",
        "train.tsv:2: label `x` is not a number",
    );
    b.text_case(
        "text-no-tab",
        "1\tgood\n0 bad\n",
        "train.tsv:2: expected `label<TAB>text`",
    );
    let tsv = b.root.join("text-empty").join("train.tsv");
    let tsv = tsv.to_str().unwrap().to_string();
    b.case(
        "imdb-is-tsv",
        b.task_args("text", &tsv),
        "train.tsv is a file",
    );
    b.matching_case(
        "aan-columns",
        "1\ta\tb\tx\ty\tz\n",
        "new_aan_pairs.train.tsv:1: expected 5 tab-separated fields",
    );
    b.matching_case(
        "aan-empty",
        "1\ta\tb\tx\t\n",
        "new_aan_pairs.train.tsv:1: text2 is empty",
    );
    b.matching_case(
        "aan-label",
        "3\ta\tb\tx\ty\n",
        "new_aan_pairs.train.tsv:1: label `3` is out of range",
    );
    // Run directories.
    let dir = |seed: u32| seed_dir(seed).to_str().unwrap().to_string();
    let nowhere = b.path("runs/nothing-here");
    b.case(
        "resume-nothing",
        b.train(
            "softmax",
            &["--config", &short, "--run-dir", &nowhere, "--resume"],
        ),
        "no run to resume",
    );
    b.case(
        "finished",
        b.train("softmax", &["--config", &short, "--seed", "0"]),
        "already holds a finished run",
    );
    b.case(
        "unfinished",
        b.train("softmax", &["--config", &short, "--seed", "1"]),
        "pass --resume",
    );
    b.case(
        "corrupted",
        b.train("softmax", &["--config", &short, "--seed", "2", "--resume"]),
        "model.bpk: corrupted",
    );
    let wider = short_config().replace("d_model = 64", "d_model = 128");
    std::fs::write(b.path("wider.toml"), wider).unwrap();
    let wider = b.path("wider.toml");
    b.case(
        "resume-model",
        b.train(
            "softmax",
            &[
                "--config",
                &wider,
                "--run-dir",
                &dir(1),
                "--seed",
                "1",
                "--resume",
            ],
        ),
        "`model.d_model` differs",
    );
    let fewer = short_config()
        .replace("steps = 20", "steps = 6")
        .replace("eval_every = 10", "eval_every = 2");
    std::fs::write(b.path("fewer.toml"), fewer).unwrap();
    let fewer = b.path("fewer.toml");
    b.case(
        "resume-steps",
        b.train(
            "softmax",
            &[
                "--config",
                &fewer,
                "--run-dir",
                &dir(1),
                "--seed",
                "1",
                "--resume",
            ],
        ),
        "`training.steps` (6) is below the checkpoint's step (10)",
    );
    b.case(
        "resume-seed",
        b.train(
            "softmax",
            &[
                "--config",
                &short,
                "--run-dir",
                &dir(1),
                "--seed",
                "5",
                "--resume",
            ],
        ),
        "`seed` differs",
    );
    let compare = vec!["compare".to_string(), dir(0), dir(1)];
    b.case("compare", compare, "differ in");

    // Image: a truncated CIFAR-10 batch, an IDX file whose header disagrees with its size.
    let cifar = b.root.join("cifar").join("cifar-10-batches-bin");
    std::fs::create_dir_all(&cifar).unwrap();
    std::fs::write(cifar.join("data_batch_1.bin"), vec![3u8; 3073 + 100]).unwrap();
    let args = b.task_args("image", b.root.join("cifar").to_str().unwrap());
    b.case(
        "cifar-truncated",
        args,
        "data_batch_1.bin: truncated: 3173 bytes",
    );
    let idx = b.root.join("idx");
    std::fs::create_dir_all(&idx).unwrap();
    let mut images = vec![0u8, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2];
    images.extend([0u8; 7]);
    std::fs::write(idx.join("train-images-idx3-ubyte"), images).unwrap();
    let labels = [0u8, 0, 8, 1, 0, 0, 0, 2, 1, 2];
    std::fs::write(idx.join("train-labels-idx1-ubyte"), labels).unwrap();
    std::fs::write(idx.join("t10k-labels-idx1-ubyte"), labels).unwrap();
    let mut good = vec![0u8, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2];
    good.extend([0u8; 8]);
    std::fs::write(idx.join("t10k-images-idx3-ubyte"), good).unwrap();
    let args = b.task_args("image", idx.to_str().unwrap());
    b.case(
        "idx-size",
        args,
        "train-images-idx3-ubyte: the header says 2 x 2 x 2 (8 bytes of data) but the file holds 7",
    );
    // Pathfinder: a PNG of the wrong size in LRA's layout, and a label out of range.
    let png_16 = {
        let mut bytes = Vec::new();
        let mut encoder = png::Encoder::new(&mut bytes, 16, 16);
        encoder.set_color(png::ColorType::Grayscale);
        encoder.set_depth(png::BitDepth::Eight);
        encoder
            .write_header()
            .unwrap()
            .write_image_data(&[0; 256])
            .unwrap();
        bytes
    };
    for (name, metadata, needle) in [
        (
            "pathfinder-png-size",
            "imgs/0 sample_0.png 0 1\n",
            "sample_0.png: 16 x 16 pixels, expected 32 x 32",
        ),
        (
            "pathfinder-label",
            "imgs/0 sample_0.png 0 3\n",
            "0.npy:1: label `3` is out of range",
        ),
    ] {
        let pf = b.root.join(name).join("curv_baseline");
        std::fs::create_dir_all(pf.join("imgs/0")).unwrap();
        std::fs::create_dir_all(pf.join("metadata")).unwrap();
        std::fs::write(pf.join("imgs/0/sample_0.png"), &png_16).unwrap();
        std::fs::write(pf.join("metadata/0.npy"), metadata).unwrap();
        let args = b.task_args("pathfinder", b.root.join(name).to_str().unwrap());
        b.case(name, args, needle);
    }
    // BPE where it does not apply, and without its vocabulary size.
    b.config_case(
        "bpe-listops",
        "softmax",
        "[data]\n",
        "[data]\ntokenizer = \"bpe\"\nbpe_vocab_size = 500\n",
        "`data.tokenizer = \"bpe\"` is for the text and matching tasks only",
    );
    b.config_case(
        "bpe-no-size",
        "softmax",
        "[data]\n",
        "[data]\nbpe_vocab_size = 500\n",
        "`data.bpe_vocab_size` applies to `data.tokenizer = \"bpe\"` only",
    );

    let cases = std::mem::take(&mut b.cases);
    assert!(cases.len() >= 30, "{} cases", cases.len());
    let before = snapshot(&b.runs);
    for (name, args, needle) in &cases {
        let out = burn_lra(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{name}: {stderr}");
        assert_eq!(
            stderr.trim_end().lines().last(),
            Some(errors[0]),
            "{name}: {stderr}"
        );
        assert!(
            errors[0].contains(needle.as_str()),
            "{name}: expected `{needle}` in {stderr}"
        );
        assert!(
            !stderr.contains("panicked") && !stderr.to_lowercase().contains("backtrace"),
            "{name}: {stderr}"
        );
        assert!(
            snapshot(&b.runs) == before,
            "{name} changed a run directory"
        );
    }
    // One more, with the lock held: a second process is refused, with the status that tells a
    // sweep to leave the run to the holder (75), by `--resume` and `--continue` alike.
    let lock = burn_lra::run_dir::RunDirLock::acquire(&seed_dir(1)).unwrap();
    for flag in ["--resume", "--continue"] {
        let out = burn_lra(&b.train("softmax", &["--config", &short, "--seed", "1", flag]));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(lra_runs::EXIT_IN_USE.into()),
            "{stderr}"
        );
        assert!(
            stderr
                .trim_end()
                .ends_with("is in use: another process is training in it"),
            "{stderr}"
        );
    }
    drop(lock);
    std::fs::remove_dir_all(&root).unwrap();
}
