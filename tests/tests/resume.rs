//! Resuming a killed run, in its own test binary: Burn's device random generator is shared by
//! the whole process, so a run that must be reproduced exactly cannot train beside another test.

mod common;

use burn_lra::config::RunConfig;
use burn_lra::task::load_splits;
use burn_lra::train::train;
use common::{metrics_without_time, options, short_listops, temp_dir};

/// Every float parameter of a run's `model-last.bpk`, in module order (the files themselves
/// differ: they embed random parameter ids).
fn last_weights(config: &RunConfig, run_dir: &std::path::Path) -> Vec<Vec<f32>> {
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::prelude::*;
    struct Collect(Vec<Vec<f32>>);
    impl ModuleVisitor for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push(
                param
                    .val()
                    .into_data()
                    .convert::<f32>()
                    .try_to_vec::<f32>()
                    .unwrap(),
            );
        }
    }
    let device = Device::flex();
    let model = burn_lra::model::LraClassifier::new(config, "performer", 16, 10, &device)
        .unwrap()
        .load_file(run_dir.join("model-last.bpk"));
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

/// A run stopped mid-way (after its step-20 checkpoint, 7 steps of work lost) and resumed ends
/// exactly where an unbroken run with the same seed ends: same metrics at every validation, same
/// test accuracies, identical final weights. Dropout is on, gradients are accumulated over
/// two micro-batches and clipped, and Performer redraws its features at step 15, so every piece
/// of state a checkpoint must carry is exercised.
/// The tests of this binary train on the same device, whose random generator is global: they
/// take turns, or one's draws would change the other's run.
static DEVICE: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_killed_run_resumes_to_the_same_result() {
    let _turn = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("resume");
    let mut config = short_listops(40);
    config.training.grad_accumulation = 2;
    config.training.grad_clip = Some(0.5);
    config.training.redraw_every = Some(15);
    let splits = load_splits(&config, None, &dir.join("data")).unwrap();

    let unbroken_dir = dir.join("unbroken");
    let unbroken = train(
        &config,
        &splits,
        &options(unbroken_dir.clone(), "performer"),
    )
    .unwrap();

    let broken_dir = dir.join("broken");
    let mut opts = options(broken_dir.clone(), "performer");
    opts.stop_after = Some(27);
    let err = train(&config, &splits, &opts).unwrap_err().to_string();
    assert!(err.contains("stopped after step 27"), "{err}");
    assert!(!broken_dir.join("result.json").exists());
    // Without --resume the unfinished run is not overwritten.
    opts.stop_after = None;
    let err = train(&config, &splits, &opts).unwrap_err().to_string();
    assert!(err.contains("pass --resume"), "{err}");
    // A resume with another seed is refused, naming the field.
    opts.resume = true;
    opts.seed = 4;
    let err = train(&config, &splits, &opts).unwrap_err().to_string();
    assert!(err.contains("`seed`"), "{err}");
    opts.seed = 3;
    let resumed = train(&config, &splits, &opts).unwrap();

    assert_eq!(resumed.test_accuracy_last, unbroken.test_accuracy_last);
    assert_eq!(
        resumed.test_accuracy_best_val,
        unbroken.test_accuracy_best_val
    );
    assert_eq!(resumed.best_val_step, unbroken.best_val_step);
    assert_eq!(
        metrics_without_time(&broken_dir),
        metrics_without_time(&unbroken_dir)
    );
    let weights = |dir: &std::path::Path| last_weights(&config, dir);
    assert!(
        weights(&broken_dir) == weights(&unbroken_dir),
        "the resumed run's final weights differ from the unbroken run's"
    );
    // A finished run keeps no checkpoint, and --resume where no run was started is an error
    // that creates nothing.
    assert!(!broken_dir.join("checkpoint").exists());
    let mut fresh = options(dir.join("fresh"), "softmax");
    fresh.resume = true;
    let err = train(&config, &splits, &fresh).unwrap_err().to_string();
    assert!(err.contains("no run to resume"), "{err}");
    assert!(!dir.join("fresh").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A checkpoint whose weights were overwritten after it was written is refused on resume, with
/// an error naming the file; the run directory is left as it was.
#[test]
fn a_corrupted_checkpoint_is_refused() {
    let _turn = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("corrupt");
    let config = short_listops(30);
    let splits = load_splits(&config, None, &dir.join("data")).unwrap();
    let run_dir = dir.join("run");
    let mut opts = options(run_dir.clone(), "softmax");
    opts.stop_after = Some(20);
    train(&config, &splits, &opts).unwrap_err();
    let weights = run_dir.join("checkpoint").join("model.bpk");
    let mut bytes = std::fs::read(&weights).unwrap();
    let at = bytes.len() - 100;
    for b in &mut bytes[at..at + 16] {
        *b ^= 0x5a;
    }
    std::fs::write(&weights, &bytes).unwrap();
    opts.stop_after = None;
    opts.resume = true;
    let metrics_before = std::fs::read(run_dir.join("metrics.jsonl")).unwrap();
    let err = format!("{:#}", train(&config, &splits, &opts).unwrap_err());
    assert!(
        err.contains("model.bpk") && err.contains("corrupted"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(std::fs::read(&weights).unwrap(), bytes);
    assert_eq!(
        std::fs::read(run_dir.join("metrics.jsonl")).unwrap(),
        metrics_before
    );
    assert!(!run_dir.join("result.json").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A run killed before its first checkpoint is started over by --resume, which says so, and ends
/// where an unbroken run ends.
#[test]
fn resume_before_the_first_checkpoint_starts_over() {
    let _turn = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("early");
    let config = short_listops(20);
    let splits = load_splits(&config, None, &dir.join("data")).unwrap();
    let unbroken = train(&config, &splits, &options(dir.join("unbroken"), "softmax")).unwrap();
    let run_dir = dir.join("run");
    let mut opts = options(run_dir.clone(), "softmax");
    opts.stop_after = Some(5);
    train(&config, &splits, &opts).unwrap_err();
    assert!(run_dir.join("config.json").exists() && !run_dir.join("checkpoint").exists());
    opts.stop_after = None;
    opts.resume = true;
    let resumed = train(&config, &splits, &opts).unwrap();
    assert_eq!(resumed.test_accuracy_last, unbroken.test_accuracy_last);
    assert_eq!(
        metrics_without_time(&run_dir),
        metrics_without_time(&dir.join("unbroken"))
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
