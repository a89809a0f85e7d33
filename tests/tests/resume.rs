//! Resuming a killed run, in its own test binary: Burn's device random generator is shared by
//! the whole process, so a run that must be reproduced exactly cannot train beside another test.

mod common;

use burn_lra::config::Schedule;
use burn_lra::plan::ResumeMode;
use burn_lra::run_dir::compare_run_dirs;
use common::{load_splits, metrics_without_time, options, short_listops, temp_dir, train};

/// A run stopped mid-way (after its step-20 checkpoint, 7 steps of work lost) and resumed ends
/// exactly where an unbroken run with the same seed ends: same metrics at every validation, same
/// test accuracies, identical final weights. Dropout is on, gradients are accumulated over
/// two micro-batches and clipped, and Performer redraws its features before step 16, so every piece
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
    opts.resume = ResumeMode::Resume;
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
    // Resumed by the build that started it: one commit recorded.
    assert_eq!(resumed.commits, [burn_lra::train::BUILD_COMMIT]);
    assert_eq!(
        metrics_without_time(&broken_dir),
        metrics_without_time(&unbroken_dir)
    );
    // Configuration, metrics, results and the values of both weight files: the same run.
    let differences = compare_run_dirs(&broken_dir, &unbroken_dir).unwrap();
    assert!(differences.is_empty(), "{differences:?}");
    // A finished run keeps no checkpoint, and --resume where no run was started is an error
    // that creates nothing.
    assert!(!broken_dir.join("checkpoint").exists());
    let mut fresh = options(dir.join("fresh"), "softmax");
    fresh.resume = ResumeMode::Resume;
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
    opts.resume = ResumeMode::Resume;
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
    // --restart starts it over and ends where an unbroken run of the same seed ends.
    opts.resume = ResumeMode::Restart;
    let restarted = train(&config, &splits, &opts).unwrap();
    let unbroken = train(&config, &splits, &options(dir.join("unbroken"), "softmax")).unwrap();
    assert_eq!(restarted.test_accuracy_last, unbroken.test_accuracy_last);
    assert!(
        compare_run_dirs(&run_dir, &dir.join("unbroken"))
            .unwrap()
            .is_empty()
    );
    assert!(!run_dir.join("checkpoint").exists());
    // A finished run is not restarted.
    let err = format!("{:#}", train(&config, &splits, &opts).unwrap_err());
    assert!(err.contains("already holds a finished run"), "{err}");
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
    opts.resume = ResumeMode::Resume;
    let resumed = train(&config, &splits, &opts).unwrap();
    assert_eq!(resumed.test_accuracy_last, unbroken.test_accuracy_last);
    assert_eq!(
        metrics_without_time(&run_dir),
        metrics_without_time(&dir.join("unbroken"))
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A run pushed into divergence on purpose (resumed from its step-10 checkpoint with a learning
/// rate of 1e36) stops naming its last good checkpoint and how to recover; resumed from it with a
/// lower learning rate and twice the accumulation, it finishes, and its result records the
/// change its weights trained under (the diverged attempt wrote no checkpoint, so none of its
/// steps is in the result, and its change is not either: the history comes from the verified
/// checkpoint, not from the run directory's `config.json`). A change to the model's shape is
/// refused, naming the field, with the run untouched.
#[test]
fn a_diverged_run_recovers_with_a_lower_learning_rate() {
    let _turn = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("diverge");
    let config = short_listops(30);
    let splits = load_splits(&config, None, &dir.join("data")).unwrap();
    let run_dir = dir.join("run");
    let mut opts = options(run_dir.clone(), "softmax");
    opts.stop_after = Some(10);
    train(&config, &splits, &opts).unwrap_err();
    opts.stop_after = None;
    opts.resume = ResumeMode::Resume;

    let mut wild = config.clone();
    wild.training.schedule = Schedule::OneCycle {
        peak: 1e36,
        warmup: 5,
    };
    let err = format!("{:#}", train(&wild, &splits, &opts).unwrap_err());
    assert!(err.contains("training diverged at step 1"), "{err}");
    assert!(
        err.contains("--resume") && err.contains("training.schedule"),
        "{err}"
    );
    let state = std::fs::read_to_string(run_dir.join("checkpoint/state.json")).unwrap();
    let state: serde_json::Value = serde_json::from_str(&state).unwrap();
    assert_eq!(state["step"], 10, "the last good checkpoint is kept");

    let mut wider = config.clone();
    wider.model.d_model = 128;
    let before = std::fs::read(run_dir.join("config.json")).unwrap();
    let err = format!("{:#}", train(&wider, &splits, &opts).unwrap_err());
    assert!(err.contains("`model.d_model` differs"), "{err}");
    assert_eq!(std::fs::read(run_dir.join("config.json")).unwrap(), before);

    let mut calm = config.clone();
    calm.training.schedule = Schedule::OneCycle {
        peak: 5e-4,
        warmup: 5,
    };
    calm.training.grad_accumulation = 2;
    let result = train(&calm, &splits, &opts).unwrap();
    assert_eq!(result.steps, 30);
    let changes: Vec<(usize, Vec<&str>)> = result
        .config_changes
        .iter()
        .map(|c| (c.from_step, c.fields.keys().map(String::as_str).collect()))
        .collect();
    assert_eq!(
        changes,
        vec![(
            10,
            vec!["training.grad_accumulation", "training.schedule.peak"]
        )]
    );
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(saved["run"]["training"]["schedule"]["peak"], 5e-4);
    assert_eq!(saved["config_changes"].as_array().unwrap().len(), 1);
    // A genuinely different run is told apart from an unbroken one.
    let unbroken = dir.join("unbroken");
    train(&config, &splits, &options(unbroken.clone(), "softmax")).unwrap();
    let differences = compare_run_dirs(&run_dir, &unbroken).unwrap();
    assert!(
        differences.contains(&"config.json".to_string()),
        "{differences:?}"
    );
    assert!(
        differences.contains(&"model-last.bpk".to_string()),
        "{differences:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Settings that work but look like mistakes are recorded in the result: a batch larger than
/// the training split, Linformer's `k` not below `n_max`.
#[test]
fn suspicious_settings_are_recorded_as_warnings() {
    let _turn = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("warnings");
    let mut config = short_listops(4);
    config.training.eval_every = 2;
    config.training.schedule = Schedule::OneCycle {
        peak: 1e-3,
        warmup: 1,
    };
    config.training.batch_size = 500;
    config.data.test_subset = Some(100);
    config.data.validation = burn_lra::config::Validation::Test;
    config.attention.insert(
        "linformer".into(),
        serde_json::from_str(r#"{"k": 100}"#).unwrap(),
    );
    let splits = load_splits(&config, None, &dir.join("data")).unwrap();
    let result = train(&config, &splits, &options(dir.join("run"), "linformer")).unwrap();
    let expected = [
        "`k` (100) is not below `n_max` (64)",
        "`training.batch_size` (500) is larger than the training split (200 examples)",
        "`data.validation = \"test\"`: model selection sees the test split, although listops has a validation split of its own",
        "`data.test_subset` (100) is larger than the test split (40 examples)",
    ];
    assert_eq!(
        result.warnings.len(),
        expected.len(),
        "{:?}",
        result.warnings
    );
    for (warning, expected) in result.warnings.iter().zip(expected) {
        assert!(warning.contains(expected), "{warning}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A run started on flex and continued on ndarray: refused without `--change-backend` (the error
/// names the field and the flag, and the run is left as it was); with it, the run finishes on
/// ndarray, its validations before the move are the unbroken flex run's, and config.json and
/// result.json name the new backend and record the move as the change of `backend` from the
/// checkpoint's step. The flag changes nothing where the backend is the same.
#[cfg(feature = "ndarray")]
#[test]
fn a_run_moves_to_another_backend_only_when_asked() {
    use burn_lra::backend::BackendKind;
    let _turn = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("move");
    let config = short_listops(30);
    let splits = load_splits(&config, None, &dir.join("data")).unwrap();
    let unbroken = dir.join("unbroken");
    train(&config, &splits, &options(unbroken.clone(), "softmax")).unwrap();
    let run_dir = dir.join("run");
    let mut opts = options(run_dir.clone(), "softmax");
    opts.stop_after = Some(20);
    train(&config, &splits, &opts).unwrap_err();
    opts.stop_after = None;
    opts.resume = ResumeMode::Resume;

    opts.backend = BackendKind::Ndarray;
    let before = std::fs::read(run_dir.join("config.json")).unwrap();
    let err = format!("{:#}", train(&config, &splits, &opts).unwrap_err());
    assert!(
        err.contains("`backend` differs") && err.contains("--change-backend"),
        "{err}"
    );
    assert_eq!(std::fs::read(run_dir.join("config.json")).unwrap(), before);

    opts.change_backend = true;
    let moved = train(&config, &splits, &opts).unwrap();
    assert_eq!(moved.backend, BackendKind::Ndarray);
    let change = backend_change(20, "flex", "ndarray");
    assert_eq!(moved.config_changes, std::slice::from_ref(&change));
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(record["backend"], "ndarray");
    assert_eq!(
        record["config_changes"],
        serde_json::to_value([change]).unwrap()
    );
    // Validations at steps 10 and 20 came before the move; the one at 30 after it.
    let (was, now) = (
        metrics_without_time(&unbroken),
        metrics_without_time(&run_dir),
    );
    assert_eq!(now.len(), was.len());
    assert_eq!(now[..2], was[..2]);
    assert_eq!(now[2]["step"], 30);

    // On the checkpoint's own backend the flag records nothing.
    let same_dir = dir.join("same");
    let mut same = options(same_dir.clone(), "softmax");
    same.stop_after = Some(20);
    train(&config, &splits, &same).unwrap_err();
    same.stop_after = None;
    same.resume = ResumeMode::Resume;
    same.change_backend = true;
    let resumed = train(&config, &splits, &same).unwrap();
    assert!(resumed.config_changes.is_empty());
    assert!(
        compare_run_dirs(&same_dir, &unbroken).unwrap().is_empty(),
        "a resume on the same backend is still the unbroken run"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The change a backend move records: `backend` from `was` to `now` from `from_step`.
#[cfg(feature = "ndarray")]
fn backend_change(from_step: usize, was: &str, now: &str) -> burn_lra::run_dir::ConfigChange {
    burn_lra::run_dir::ConfigChange {
        from_step,
        fields: [("backend".to_string(), [was.into(), now.into()])].into(),
    }
}

/// Performer's features are redrawn before the step that first trains on them, never after an
/// update: a run whose last step is a redraw step (20, redrawing every 20) validates, tests and
/// saves the features it trained with, exactly as the same run that never redraws; one more step
/// trains on new features and ends elsewhere. (A redraw after step 20's update left the step-20
/// validation and the last weights on untrained features, near chance.)
#[test]
fn a_redraw_comes_before_the_step_that_trains_on_it() {
    let _turn = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("redraw");
    let mut config = short_listops(20);
    let splits = load_splits(&config, None, &dir.join("data")).unwrap();
    let run = |config: &burn_lra::config::RunConfig, name: &str| {
        let out = dir.join(name);
        train(config, &splits, &options(out.clone(), "performer")).unwrap();
        out
    };
    config.training.redraw_every = None;
    let never = run(&config, "never");
    config.training.redraw_every = Some(20);
    let every_20 = run(&config, "every-20");
    // Only the configuration differs: every validation, both test accuracies, both weight files
    // are the run that never redraws.
    assert_eq!(
        compare_run_dirs(&every_20, &never).unwrap(),
        ["config.json"]
    );

    config.training.steps = 21;
    let redrawn = run(&config, "every-20-21-steps");
    config.training.redraw_every = None;
    let not_redrawn = run(&config, "never-21-steps");
    let differences = compare_run_dirs(&redrawn, &not_redrawn).unwrap();
    assert!(
        differences.iter().any(|d| d == "model-last.bpk"),
        "{differences:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
