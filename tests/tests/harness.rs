//! The harness end to end through its library API: a short run writes its run directory, and
//! the tiny preset clearly beats the majority class of its test set.

use burn_lra::backend::BackendKind;
use burn_lra::config::{RunConfig, Task};
use burn_lra::task::load_splits;
use burn_lra::train::{RunResult, TrainOptions, train};

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("burn-lra-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn short_run_writes_config_metrics_and_result() {
    let dir = temp_dir("short");
    let mut config = RunConfig::preset(Task::Listops, "tiny").unwrap();
    let generate = config.data.generate.as_mut().unwrap();
    (generate.n_train, generate.n_val, generate.n_test) = (200, 40, 40);
    config.training.steps = 20;
    config.training.eval_every = 10;
    config.training.schedule = burn_lra::config::Schedule::OneCycle {
        peak: 1e-3,
        warmup: 5,
    };
    let splits = load_splits(&config, None, &dir.join("data")).unwrap();
    let run_dir = dir.join("run");
    let opts = TrainOptions {
        attention: "linformer".into(),
        seed: 1,
        backend: BackendKind::Flex,
        run_dir: run_dir.clone(),
        preset: "test".into(),
        progress: false,
    };
    let result = train(&config, &splits, &opts).unwrap();
    let mut saved: RunResult =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("result.json")).unwrap())
            .unwrap();
    // JSON's shortest decimal form of an f64 may parse back one ulp away (serde_json's default
    // float parser): compare the time with a tolerance, everything else exactly.
    assert!((saved.train_seconds - result.train_seconds).abs() < 1e-9);
    saved.train_seconds = result.train_seconds;
    assert_eq!(saved, result);
    assert_eq!(saved.split_sizes, [200, 40, 40]);
    let metrics = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    let steps: Vec<u64> = metrics
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(steps, vec![10, 20]);
    let config_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(config_json["attention_resolved"]["Linformer"]["k"], 32);
    assert!(run_dir.join("model-best.bpk").is_file() && run_dir.join("model-last.bpk").is_file());
    // A finished run is never overwritten.
    let err = train(&config, &splits, &opts).unwrap_err().to_string();
    assert!(err.contains("already holds a finished run"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The promise of the tiny preset (issue: "clearly beats the majority class"): one full seed of
/// the preset, as `cargo xtask lra --preset tiny` runs it, at least 10 points above the share of
/// the test set's most frequent class.
#[test]
fn tiny_preset_beats_majority_class_by_ten_points() {
    let dir = temp_dir("tiny");
    let config = RunConfig::preset(Task::Listops, "tiny").unwrap();
    let splits = load_splits(&config, None, &dir.join("data")).unwrap();
    let result = train(
        &config,
        &splits,
        &TrainOptions {
            attention: "softmax".into(),
            seed: 0,
            backend: BackendKind::Flex,
            run_dir: dir.join("run"),
            preset: "tiny".into(),
            progress: false,
        },
    )
    .unwrap();
    assert!(
        result.test_accuracy >= result.test_majority_rate + 0.10,
        "test accuracy {:.3} vs majority {:.3}",
        result.test_accuracy,
        result.test_majority_rate
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
