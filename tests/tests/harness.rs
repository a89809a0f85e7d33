//! The harness end to end through its library API: a short run writes its run directory, and
//! the tiny preset clearly beats the majority class of its test set.

use burn_lra::backend::BackendKind;
use burn_lra::config::RunConfig;
use burn_lra::plan::{ResumeMode, TrainOptions};
use burn_lra::train::RunResult;

mod common;

use common::{load_splits, options, short_listops, temp_dir, train};

#[test]
fn short_run_writes_config_metrics_and_result() {
    let dir = temp_dir("short");
    let mut config = RunConfig::preset("listops", "tiny").unwrap();
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
        attention: lra_runs::AttentionName::new("linformer").unwrap(),
        seed: 1,
        backend: BackendKind::Flex,
        device: None,
        run_dir: run_dir.clone(),
        preset: "test".into(),
        progress: false,
        resume: ResumeMode::Start,
        change_backend: false,
        stop_after: None,
        init_from: None,
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
    // The result names the build that trained it: this checkout's commit (the tests run in a
    // git clone), `-dirty` where tracked files were edited.
    assert_eq!(saved.commits, [burn_lra::train::BUILD_COMMIT]);
    let head = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .expect("git runs");
    let head = String::from_utf8(head.stdout).unwrap();
    assert!(
        saved.commits[0].starts_with(head.trim()) && head.trim().len() == 40,
        "{:?} is not {head}",
        saved.commits
    );
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

/// A hybrid stack named by its pattern (`gla+local`) trains like any attention: each layer
/// takes its place in the pattern, config.json records every layer's configuration, the
/// parameters counted are those of the layers built; a pattern that does not divide
/// `model.n_layers` is refused with the field named.
#[test]
fn a_hybrid_stack_trains_and_records_its_layers() {
    let dir = temp_dir("hybrid");
    let mut config = RunConfig::preset("listops", "tiny").unwrap();
    let generate = config.data.generate.as_mut().unwrap();
    (generate.n_train, generate.n_val, generate.n_test) = (100, 20, 20);
    config.training.steps = 4;
    config.training.eval_every = 2;
    let splits = load_splits(&config, None, &dir.join("data")).unwrap();
    let run_dir = dir.join("run");
    let mut opts = options(run_dir.clone(), "gla+local");
    let result = train(&config, &splits, &opts).unwrap();
    let config_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("config.json")).unwrap())
            .unwrap();
    let layers = config_json["attention_resolved"].as_array().unwrap();
    assert_eq!(layers.len(), 2);
    assert!(layers[0].get("Gla").is_some() && layers[1].get("Local").is_some());
    let task = burn_lra::tasks::find("listops").unwrap();
    let spec = burn_lra::model::ClassifierSpec::resolve(&config, task, "gla+local").unwrap();
    let built = burn_lra::model::LraClassifier::new(&spec, &burn::prelude::Device::flex());
    assert_eq!(
        Some(result.n_params),
        burn_attention_zoo::num_params_checked(&built)
    );
    opts.attention = lra_runs::AttentionName::new("gla+gla+local").unwrap();
    opts.run_dir = dir.join("three");
    let err = format!("{:#}", train(&config, &splits, &opts).unwrap_err());
    assert!(
        err.contains("model.n_layers") && err.contains("pattern of 3"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The promise of the tiny preset (issue: "clearly beats the majority class"): one full seed of
/// the preset, as `cargo xtask lra --preset tiny` runs it, at least 10 points above the share of
/// the test set's most frequent class.
#[test]
fn tiny_preset_beats_majority_class_by_ten_points() {
    let dir = temp_dir("tiny");
    let config = RunConfig::preset("listops", "tiny").unwrap();
    let splits = load_splits(&config, None, &dir.join("data")).unwrap();
    let result = train(
        &config,
        &splits,
        &TrainOptions {
            attention: lra_runs::AttentionName::new("softmax").unwrap(),
            seed: 0,
            backend: BackendKind::Flex,
            device: None,
            run_dir: dir.join("run"),
            preset: "tiny".into(),
            progress: false,
            resume: ResumeMode::Start,
            change_backend: false,
            stop_after: None,
            init_from: None,
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

/// A diverging run stops with a message that names the step and keeps its last good checkpoint.
#[test]
fn a_diverging_run_stops_and_keeps_its_last_checkpoint() {
    let dir = temp_dir("diverge");
    let mut config = short_listops(40);
    // A learning rate far too high for Adam's normalised steps: the loss overflows.
    config.training.schedule = burn_lra::config::Schedule::OneCycle {
        peak: 1e9,
        warmup: 12,
    };
    // A checkpoint after every step: the first step leaves finite (if huge) weights, so a good
    // checkpoint exists by the time the loss or the weights overflow.
    config.training.checkpoint_every = Some(1);
    let splits = load_splits(&config, None, &dir.join("data")).unwrap();
    let run_dir = dir.join("run");
    let err = train(&config, &splits, &options(run_dir.clone(), "softmax"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("training diverged at step"), "{err}");
    assert!(
        run_dir.join("checkpoint").join("state.json").is_file(),
        "{err}"
    );
    assert!(!run_dir.join("result.json").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Matching end to end on generated AAN-format files: two towers, a short run writes its result.
#[test]
fn matching_trains_on_aan_format_files() {
    let dir = temp_dir("matching");
    let data_dir = dir.join("aan");
    burn_lra::data::matching::generate(
        &data_dir,
        &burn_lra::data::matching::PairGeneratorConfig {
            n_train: 64,
            n_val: 16,
            n_test: 16,
            seed: 1,
        },
    )
    .unwrap();
    let mut config = RunConfig::preset("matching", "tiny").unwrap();
    config.training.steps = 12;
    config.training.eval_every = 6;
    config.training.schedule = burn_lra::config::Schedule::OneCycle {
        peak: 1e-3,
        warmup: 2,
    };
    let splits = load_splits(&config, Some(&data_dir), &dir.join("cache")).unwrap();
    let result = train(&config, &splits, &options(dir.join("run"), "nystrom")).unwrap();
    assert_eq!(result.split_sizes, [64, 16, 16]);
    assert!(!result.validated_on_test);
    std::fs::remove_dir_all(&dir).unwrap();
}
