//! Helpers shared by the harness test binaries.
#![allow(dead_code)]

use burn_lra::backend::BackendKind;
use burn_lra::config::RunConfig;
use burn_lra::data::Splits;
use burn_lra::plan::{ResumeMode, RunPlan, TrainOptions};
use burn_lra::train::RunResult;

/// The splits of `config`'s task (generated data cached in `cache_dir`).
pub fn load_splits(
    config: &RunConfig,
    data_dir: Option<&std::path::Path>,
    cache_dir: &std::path::Path,
) -> anyhow::Result<Splits> {
    let task = burn_lra::tasks::find(config.task.name())?;
    burn_lra::tasks::load_splits(task, config, data_dir, cache_dir)
}

/// Plans the run `opts` describes with `config` and trains it on `splits`.
pub fn train(
    config: &RunConfig,
    splits: &Splits,
    opts: &TrainOptions,
) -> anyhow::Result<RunResult> {
    burn_lra::train::train(&RunPlan::new(config.clone(), opts.clone())?, splits)
}

/// A fresh temporary directory for one test.
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("burn-lra-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The tiny ListOps preset shrunk to 200 / 40 / 40 examples and `steps` steps.
pub fn short_listops(steps: usize) -> RunConfig {
    let mut config = RunConfig::preset("listops", "tiny").unwrap();
    let generate = config.data.generate.as_mut().unwrap();
    (generate.n_train, generate.n_val, generate.n_test) = (200, 40, 40);
    config.training.steps = steps;
    config.training.eval_every = 10;
    config.training.schedule = burn_lra::config::Schedule::OneCycle {
        peak: 1e-3,
        warmup: 5,
    };
    config
}

/// Options for a flex run of `attention` with seed 3 in `run_dir`.
pub fn options(run_dir: std::path::PathBuf, attention: &str) -> TrainOptions {
    TrainOptions {
        attention: lra_runs::AttentionName::new(attention).unwrap(),
        seed: 3,
        backend: BackendKind::Flex,
        device: None,
        run_dir,
        preset: "test".into(),
        progress: false,
        resume: ResumeMode::Start,
        change_backend: false,
        stop_after: None,
        init_from: None,
    }
}

/// Every line of a run's `metrics.jsonl` without its wall-clock field.
pub fn metrics_without_time(run_dir: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("elapsed_s");
            v
        })
        .collect()
}
