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

/// A PNG file whose header claims a grey image of `width x height` and whose data hold an empty
/// stream (a reader must refuse its size from the header, before it allocates for the pixels).
fn png_claiming(width: u32, height: u32) -> Vec<u8> {
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &byte in bytes {
            crc ^= byte as u32;
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }
    let chunk = |kind: &[u8], data: &[u8]| {
        let mut out = (data.len() as u32).to_be_bytes().to_vec();
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        out.extend_from_slice(&body);
        out.extend(crc32(&body).to_be_bytes());
        out
    };
    let mut header = width.to_be_bytes().to_vec();
    header.extend(height.to_be_bytes());
    header.extend([8, 0, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(chunk(b"IHDR", &header));
    png.extend(chunk(
        b"IDAT",
        &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
    ));
    png.extend(chunk(b"IEND", &[]));
    png
}

/// A small aclImdb archive as tar bytes (uncompressed): two reviews a split and label, and
/// tar's end-of-archive blocks (the last 1024 bytes).
fn imdb_archive() -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for split in ["train", "test"] {
        for (label, text) in [("neg", "a dull film"), ("pos", "a fine film")] {
            for i in 0..2 {
                let mut header = tar::Header::new_gnu();
                header.set_size(text.len() as u64);
                header.set_mode(0o644);
                header.set_cksum();
                let path = format!("aclImdb/{split}/{label}/{i}_5.txt");
                tar.append_data(&mut header, path, text.as_bytes()).unwrap();
            }
        }
    }
    let bytes = tar.into_inner().unwrap();
    assert!(bytes[bytes.len() - 1024..].iter().all(|&b| b == 0));
    bytes
}

/// `bytes` gzipped.
fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// Owned command-line arguments./// Owned command-line arguments.
fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
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
    prepare_run(&b, "3", &[], false);
    for seed in ["1", "2", "4", "5", "6", "7", "8", "9"] {
        prepare_run(&b, seed, &["--stop-after", "10"], true);
    }
    let runs = b.runs.clone();
    let seed_dir = move |seed: u32| runs.join(format!("listops/short/softmax/seed-{seed}"));
    let flip = |path: PathBuf| {
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.len() / 2;
        bytes[at..at + 8].iter_mut().for_each(|x| *x ^= 0xff);
        std::fs::write(&path, bytes).unwrap();
    };
    // Damaged run directories, each refused by what reads it, naming the file:
    flip(seed_dir(2).join("checkpoint/model.bpk"));
    flip(seed_dir(3).join("model-best.bpk"));
    let state = seed_dir(4).join("checkpoint/state.json");
    let text = std::fs::read_to_string(&state).unwrap();
    assert!(text.contains("\"step\": 10"), "{text}");
    std::fs::write(&state, text.replace("\"step\": 10", "\"step\": 5")).unwrap();
    std::fs::remove_file(seed_dir(5).join("checkpoint/checksums.json")).unwrap();
    std::fs::remove_file(seed_dir(6).join("checkpoint/state.json")).unwrap();
    std::fs::remove_dir_all(seed_dir(7).join("checkpoint")).unwrap();
    std::fs::write(seed_dir(7).join("checkpoint"), b"not a folder").unwrap();
    let metrics = seed_dir(8).join("metrics.jsonl");
    let text = std::fs::read_to_string(&metrics).unwrap();
    std::fs::write(&metrics, text.replacen("\"step\":10", "\"step\":11", 1)).unwrap();
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
        "`data.generate` is for the listops task only",
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
    std::fs::write(idx.join("t10k-images-idx3-ubyte"), &good).unwrap();
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
    // Sizes: every count taken from a configuration or a header is checked before anything is
    // built or allocated.
    b.config_case(
        "d-model-huge",
        "softmax",
        "d_model = 64",
        "d_model = 4000000000",
        "is too large",
    );
    b.config_case(
        "d-mlp-max",
        "softmax",
        "d_mlp = 128",
        "d_mlp = 9223372036854775807",
        "`model.d_mlp` must be at most 4294967295 (2^32 - 1), got 9223372036854775807",
    );
    b.config_case(
        "layers-huge",
        "softmax",
        "n_layers = 2",
        "n_layers = 1000000000000",
        "`model.n_layers` must be at most 4294967295",
    );
    b.config_case(
        "layers-memory",
        "softmax",
        "n_layers = 2",
        "n_layers = 4000000000",
        "`model.n_layers` = 4000000000 is too large",
    );
    let layers = short_config().replace("n_layers = 2", "n_layers = 4000000000");
    std::fs::write(b.path("layers.toml"), layers).unwrap();
    let layers = b.path("layers.toml");
    b.case(
        "params-layers",
        strings(&["params", "--task", "listops", "--config", &layers]),
        "`model.n_layers` = 4000000000 is too large",
    );
    b.config_case(
        "generate-huge",
        "softmax",
        "n_train = 200",
        "n_train = 9223372036854775807",
        "`data.generate.n_train` must be at most 4294967295",
    );
    let idx_huge = b.root.join("idx-huge");
    std::fs::create_dir_all(&idx_huge).unwrap();
    let mut claim = vec![0u8, 0, 8, 3];
    claim.extend([0xff; 12]);
    claim.extend([0u8; 16]);
    std::fs::write(idx_huge.join("train-images-idx3-ubyte"), claim).unwrap();
    std::fs::write(idx_huge.join("t10k-images-idx3-ubyte"), &good).unwrap();
    for file in ["train-labels-idx1-ubyte", "t10k-labels-idx1-ubyte"] {
        std::fs::write(idx_huge.join(file), labels).unwrap();
    }
    let args = b.task_args("image", idx_huge.to_str().unwrap());
    b.case(
        "idx-dims-overflow",
        args,
        "train-images-idx3-ubyte: the header says 4294967295 x 4294967295 x 4294967295, more bytes than can be addressed",
    );
    let huge_png = b.root.join("png-huge").join("curv_baseline");
    std::fs::create_dir_all(huge_png.join("imgs/0")).unwrap();
    std::fs::create_dir_all(huge_png.join("metadata")).unwrap();
    std::fs::write(
        huge_png.join("imgs/0/sample_0.png"),
        png_claiming(65_535, 65_535),
    )
    .unwrap();
    std::fs::write(huge_png.join("metadata/0.npy"), "imgs/0 sample_0.png 0 1\n").unwrap();
    let args = b.task_args("pathfinder", b.root.join("png-huge").to_str().unwrap());
    b.case(
        "png-huge",
        args,
        "sample_0.png: 65535 x 65535 pixels, expected 32 x 32",
    );
    // Checkpoints and results: every byte a resume or a result reads is verified.
    let resume = |b: &Battery, seed: &str| {
        b.train(
            "softmax",
            &[
                "--config",
                &short,
                "--seed",
                seed,
                "--resume",
                "--no-progress",
            ],
        )
    };
    b.case(
        "state-edited",
        resume(&b, "4"),
        "checkpoint/state.json: corrupted",
    );
    b.case(
        "checksums-deleted",
        resume(&b, "5"),
        "checkpoint/checksums.json is missing: the checkpoint's files cannot be verified (--restart starts the run over)",
    );
    b.case(
        "state-deleted",
        resume(&b, "6"),
        "checkpoint/state.json is missing",
    );
    b.case(
        "checkpoint-is-a-file",
        resume(&b, "7"),
        "seed-7/checkpoint is not a folder, but a checkpoint folder belongs at that path",
    );
    let continue_7 = b.train(
        "softmax",
        &[
            "--config",
            &short,
            "--seed",
            "7",
            "--continue",
            "--no-progress",
        ],
    );
    b.case(
        "checkpoint-is-a-file-continue",
        continue_7,
        "checkpoint is not a folder",
    );
    b.case(
        "metrics-edited",
        resume(&b, "8"),
        "metrics.jsonl: its first",
    );
    b.case(
        "best-weights-flipped",
        vec!["compare".to_string(), dir(0), dir(3)],
        "seed-3/model-best.bpk: corrupted",
    );
    let restart_finished = b.train("softmax", &["--config", &short, "--seed", "0", "--restart"]);
    b.case(
        "restart-finished",
        restart_finished,
        "already holds a finished run",
    );
    // The data a run trained on, by fingerprint: the generated cache copied with one label
    // changed is other data.
    let cache = std::fs::read_dir(b.runs.join("data"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("listops-")
        })
        .unwrap();
    let edited = b.root.join("edited-listops");
    std::fs::create_dir_all(&edited).unwrap();
    for file in ["basic_train.tsv", "basic_val.tsv", "basic_test.tsv"] {
        let text = std::fs::read_to_string(cache.join(file)).unwrap();
        let text = if file == "basic_test.tsv" {
            let mut lines: Vec<String> = text.lines().map(String::from).collect();
            let (expression, label) = lines[1].rsplit_once('\t').unwrap();
            let other = (label.parse::<u32>().unwrap() + 1) % 10;
            lines[1] = format!("{expression}\t{other}");
            lines.join("\n")
        } else {
            text
        };
        std::fs::write(edited.join(file), text).unwrap();
    }
    let edited = edited.to_str().unwrap().to_string();
    let other_data = b.train(
        "softmax",
        &[
            "--config",
            &short,
            "--seed",
            "9",
            "--resume",
            "--data-dir",
            &edited,
        ],
    );
    b.case("resume-other-data", other_data, "`data_sha256` differs");
    // Folders the harness did not make.
    let users = b.root.join("users-folder");
    std::fs::create_dir_all(&users).unwrap();
    std::fs::write(users.join("notes.txt"), b"mine").unwrap();
    let users = users.to_str().unwrap().to_string();
    b.case(
        "run-dir-with-user-file",
        b.train("softmax", &["--config", &short, "--run-dir", &users]),
        "holds notes.txt, which no run writes",
    );
    let users_config = b.root.join("users-config");
    std::fs::create_dir_all(&users_config).unwrap();
    std::fs::write(users_config.join("config.json"), b"{\"mine\": 1}").unwrap();
    let users_config = users_config.to_str().unwrap().to_string();
    b.case(
        "run-dir-with-user-config",
        b.train(
            "softmax",
            &["--config", &short, "--run-dir", &users_config, "--resume"],
        ),
        "config.json is not a run's configuration record; it is left as it is",
    );
    // Generators: an existing target is refused, before anything is written.
    let target = b.root.join("pathfinder-out");
    std::fs::create_dir_all(target.join("curv_baseline")).unwrap();
    std::fs::write(target.join("curv_baseline/mine.png"), b"mine").unwrap();
    let target_arg = target.to_str().unwrap().to_string();
    b.case(
        "pathfinder-target-taken",
        strings(&[
            "generate-pathfinder",
            "--out",
            &target_arg,
            "--difficulty",
            "easy",
            "--n",
            "10",
        ]),
        "curv_baseline already exists and is not empty",
    );
    let sheet = b.path("short.toml");
    b.case(
        "pathfinder-sheet-taken",
        strings(&[
            "generate-pathfinder",
            "--out",
            &target_arg,
            "--n",
            "10",
            "--sheet",
            &sheet,
        ]),
        "short.toml already exists",
    );
    let aan = b.root.join("aan-out");
    std::fs::create_dir_all(&aan).unwrap();
    std::fs::write(aan.join("new_aan_pairs.test.tsv"), b"mine").unwrap();
    let aan_arg = aan.to_str().unwrap().to_string();
    b.case(
        "matching-target-taken",
        strings(&["generate-matching", "--out", &aan_arg]),
        "new_aan_pairs.test.tsv already exists",
    );
    b.case(
        "matching-no-pairs",
        strings(&["generate-matching", "--out", &aan_arg, "--n-train", "0"]),
        "`--n-train` must be at least 2",
    );
    // Text as people save it: lines end in CR alone, the file starts with a byte-order mark;
    // an invisible character in a field is shown escaped.
    b.listops_case(
        "cr-lines",
        "basic_train.tsv",
        "\u{feff}Source\tTarget\r( ( [MAX 2 ) 3 ] )\t3\r[FOO 2 ]\t2\r",
        "basic_train.tsv:3: unknown token `[FOO`",
    );
    b.listops_case(
        "invisible-label",
        "basic_val.tsv",
        "Source\tTarget\n[MAX 2 ]\t\u{200b}2\n",
        "basic_val.tsv:2: label `\\u{200b}2` is not a class",
    );
    b.text_case(
        "text-bom-label",
        "\u{feff}1\tgood\r\nx\tbad\r\n",
        "train.tsv:2: label `x` is not a number",
    );
    b.matching_case(
        "aan-nbsp-label",
        "1\ta\tb\tx\ty\n\u{a0}1\u{a0}x\ta\tb\tx\ty\n",
        "new_aan_pairs.train.tsv:2: label `1\\u{a0}x` is not a number",
    );
    // Benchmark sizes.
    b.case(
        "bench-n-zero",
        strings(&["bench-attention", "--attention", "softmax", "--n", "0"]),
        "`--n` must be at least 1",
    );
    b.case(
        "bench-input-huge",
        strings(&[
            "bench-attention",
            "--attention",
            "softmax",
            "--n",
            "4000000000",
            "--d-model",
            "4000000",
        ]),
        "the input, its gradient and the output alone exceed the memory available",
    );
    b.case(
        "bench-train-no-steps",
        strings(&[
            "bench-train",
            "--attention",
            "softmax",
            "--n",
            "64",
            "--steps",
            "0",
        ]),
        "`--steps` must be at least 1",
    );
    // Attention parameters whose cost no parameter count shows.
    b.config_case(
        "nystrom-landmarks",
        "nystrom",
        "n_landmarks = 16",
        "n_landmarks = 4000000000",
        "`n_landmarks` is 4000000000, more landmarks than the 64 positions of the sequence",
    );
    b.config_case(
        "sinkhorn-iterations",
        "sinkhorn",
        "[attention.nystrom]",
        "[attention.sinkhorn]\niterations = 4000000000\n[attention.nystrom]",
        "`iterations` must be at most 1000",
    );
    // A setting of another task.
    b.config_case(
        "pair-features-listops",
        "softmax",
        "pooling = ",
        "pair_features = \"concat\"\npooling = ",
        "`model.pair_features` is for the matching task only",
    );
    b.config_case(
        "doc-bytes-listops",
        "softmax",
        "max_len = 64",
        "max_len = 64\ndoc_max_bytes = 500",
        "`data.doc_max_bytes` is for the matching task only",
    );
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

    // Sizes of the attentions' own parameters, refused before anything is allocated.
    b.config_case(
        "routing-clusters",
        "routing",
        "n_clusters = 8",
        "n_clusters = 4000000000",
        "`n_clusters` is 4000000000, more clusters than the 64 positions of the sequence",
    );
    b.config_case(
        "xl-memory",
        "transformer-xl",
        "mem_len = 16\n\n# Compressive",
        "mem_len = 4000000000\n\n# Compressive",
        "`mem_len` is 4000000000, longer than the 64 positions",
    );
    b.config_case(
        "axial-width",
        "axial",
        "width = 8",
        "width = 4000000000",
        "`width` is 4000000000, a row wider than the 64 positions",
    );
    b.config_case(
        "ff-depth",
        "ff-glu",
        "[attention.nystrom]",
        "[attention.ff-glu]\ndepth = 4000000000\n[attention.nystrom]",
        "`depth` must be at most 64",
    );
    b.config_case(
        "attention-size-past-limit",
        "local",
        "[attention.nystrom]",
        "[attention.local]\nwindow = 5000000000\n[attention.nystrom]",
        "`attention.local.window` must be at most 4294967295",
    );
    b.config_case(
        "attention-key-twice",
        "nystrom",
        "n_landmarks = 16",
        "n_landmarks = 16\nn_landmarks = 8",
        "n_landmarks",
    );
    b.config_case(
        "activations-huge",
        "softmax",
        "batch_size = 32",
        "batch_size = 4000000000",
        "`training.batch_size` x `data.max_len` (4000000000 x 64) is too large",
    );
    // Benchmark repetitions and sizes: every benchmark checks `--warmup` and its memory first.
    for (name, bench) in [
        ("bench-attention-warmup", "bench-attention"),
        ("bench-decode-warmup", "bench-decode"),
    ] {
        b.case(
            name,
            strings(&[
                bench,
                "--attention",
                "softmax",
                "--n",
                "8",
                "--warmup",
                "18446744073709551615",
            ]),
            "`--warmup` must be at most 4294967295",
        );
    }
    b.case(
        "bench-train-warmup",
        strings(&[
            "bench-train",
            "--attention",
            "softmax",
            "--n",
            "64",
            "--warmup",
            "18446744073709551615",
        ]),
        "`--warmup` must be at most 4294967295",
    );
    b.case(
        "bench-decode-huge",
        strings(&[
            "bench-decode",
            "--attention",
            "softmax",
            "--n",
            "4000000000",
            "--batch",
            "4000000000",
        ]),
        "`--batch` x `--n` x `--d-model` (4000000000 x 4000000001 x 512) is too large",
    );
    b.case(
        "bench-train-huge",
        strings(&[
            "bench-train",
            "--attention",
            "softmax",
            "--n",
            "4000000",
            "--batch",
            "4000000000",
            "--task",
            "listops",
            "--preset",
            "tiny",
        ]),
        "`--batch` x `--n` (4000000000 x 4000000) is too large",
    );
    b.case(
        "generate-matching-huge",
        strings(&[
            "generate-matching",
            "--out",
            &b.path("aan-huge"),
            "--n-train",
            "4000000000",
        ]),
        "`--n-train` (4000000000) is too large",
    );
    b.case(
        "generate-matching-past-limit",
        strings(&[
            "generate-matching",
            "--out",
            &b.path("aan-huge"),
            "--n-train",
            "18446744073709551615",
        ]),
        "`--n-train` must be at most 4294967295",
    );
    b.case(
        "bench-train-unknown-task",
        strings(&[
            "bench-train",
            "--attention",
            "softmax",
            "--n",
            "64",
            "--task",
            "nope",
        ]),
        "unknown task `nope`",
    );
    // Hybrid patterns: the pattern and the part named.
    for (name, pattern, says) in [
        (
            "pattern-plus",
            "+",
            "attention pattern `+`: layer 1 of 2 is empty",
        ),
        (
            "pattern-double-plus",
            "gla++local",
            "attention pattern `gla++local`: layer 2 of 3 is empty",
        ),
        (
            "pattern-trailing-plus",
            "gla+",
            "attention pattern `gla+`: layer 2 of 2 is empty",
        ),
        (
            "pattern-unknown-part",
            "linformer+nope",
            "attention pattern `linformer+nope`: layer 2 of 2: unknown attention `nope`",
        ),
    ] {
        let args = b.train(pattern, &["--config", &short, "--no-progress"]);
        b.case(name, args, says);
        b.case(
            &format!("{name}-bench-decode"),
            strings(&["bench-decode", "--attention", pattern, "--n", "8"]),
            says,
        );
    }
    // Archives: cut short at a member boundary, and expanding past the cap.
    let imdb = b.root.join("imdb-cut");
    std::fs::create_dir_all(&imdb).unwrap();
    let whole = imdb_archive();
    // The archive without its end-of-archive blocks: cut after the last member.
    std::fs::write(imdb.join("cut.tar.gz"), gzip(&whole[..whole.len() - 1024])).unwrap();
    let data = imdb.join("cut.tar.gz").to_str().unwrap().to_string();
    let args = b.task_args("text", &data);
    b.case("archive-cut", args, "cut.tar.gz: the archive ends early");
    let capped = b.root.join("imdb-capped");
    std::fs::create_dir_all(&capped).unwrap();
    std::fs::write(capped.join("whole.tar.gz"), gzip(&whole)).unwrap();
    let text_config = include_str!("../../configs/text/tiny.toml").replacen(
        "[data]\n",
        "[data]\nmax_archive_bytes = 2000\n",
        1,
    );
    assert!(text_config.contains("max_archive_bytes = 2000"));
    let config = b.path("archive-cap.toml");
    std::fs::write(&config, text_config).unwrap();
    let data = capped.join("whole.tar.gz").to_str().unwrap().to_string();
    let args = b.train_task(
        "text",
        "softmax",
        &["--config", &config, "--data-dir", &data, "--no-progress"],
    );
    b.case(
        "archive-cap",
        args,
        "expands past `data.max_archive_bytes` (2000 bytes)",
    );

    let cases = std::mem::take(&mut b.cases);
    assert!(cases.len() >= 106, "{} cases", cases.len());
    let before = snapshot(&b.root);
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
            snapshot(&b.root) == before,
            "{name} changed a run directory or a file of the user's"
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
