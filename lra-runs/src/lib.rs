#![warn(missing_docs)]
//! # lra-runs
//!
//! What the LRA harness (`burn-lra`) and the sweep tool (`cargo xtask lra`) agree on, defined
//! once and without Burn, so that the sweep tool reads and schedules runs without compiling a
//! backend:
//!
//! - [`layout`]: where a run lives (`<out>/<task>/<preset>/<attention>/seed-<n>/`), the names of
//!   its files, and its state (finished, checkpointed, fresh).
//! - [`metrics`]: [`MetricsLine`], a line of `metrics.jsonl`.
//! - [`record`]: [`RunRecord`], the contents of `config.json` (and of a checkpoint's copy).
//! - [`result`]: [`RunResult`], the contents of `result.json`.
//! - [`summary`]: [`Summary`], the contents of a sweep's `summary.json`.
//! - [`state`]: [`CheckpointState`], the contents of a checkpoint's `state.json`.
//! - [`files`]: atomic writes and the lock that keeps one process per run directory.
//! - [`names`]: the tasks and the backends by name, and each backend's cargo feature.
//! - [`cli`]: usage mistakes on the command line as one error line.

pub mod cli;
pub mod files;
pub mod layout;
pub mod limits;
pub mod metrics;
pub mod names;
pub mod record;
pub mod result;
pub mod state;
pub mod summary;

pub use files::{
    RunDirInUse, RunDirLock, absolute, create_dir_whole, publish_dir, read_json, refuse_existing,
    remove_owned_dir, staging_dir, write_atomic, write_new,
};
pub use layout::{point_name, preset_name, run_dir, sweep_dir};
pub use metrics::MetricsLine;
pub use names::{AttentionName, BackendKind, HYBRID_SEPARATOR, Task};
pub use record::RunRecord;
pub use result::{ConfigChange, InitFrom, RunResult, RunState, Selection, run_state};
pub use state::CheckpointState;
pub use summary::{AttentionSummary, Summary};

/// The exit status of `burn-lra train` when another process holds the run directory's lock
/// (`EX_TEMPFAIL`): nothing was done, and the run is that process's to finish.
pub const EXIT_IN_USE: u8 = 75;

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("lra-runs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_held_lock_refuses_a_second_holder_until_dropped() {
        let dir = temp_dir("lock");
        assert!(!RunDirLock::is_held(&dir).unwrap(), "no lock file yet");
        let lock = RunDirLock::acquire(&dir).unwrap();
        assert!(RunDirLock::is_held(&dir).unwrap());
        let err = RunDirLock::acquire(&dir).err().unwrap();
        assert!(err.downcast_ref::<RunDirInUse>().is_some(), "{err}");
        assert!(
            err.to_string()
                .ends_with("is in use: another process is training in it")
        );
        let waiter = std::thread::spawn({
            let dir = dir.clone();
            move || RunDirLock::wait_until_free(&dir).unwrap()
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!waiter.is_finished(), "waited through a held lock");
        drop(lock);
        waiter.join().unwrap();
        RunDirLock::acquire(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn states_follow_the_files() {
        let dir = temp_dir("state");
        assert_eq!(run_state(&dir).unwrap(), RunState::Fresh);
        write_atomic(&dir.join("checkpoint.old/state.json"), b"{}").unwrap();
        assert_eq!(run_state(&dir).unwrap(), RunState::Checkpointed);
        write_atomic(&dir.join("result.json"), b"{\"task\": \"listops\"}").unwrap();
        let err = run_state(&dir).unwrap_err();
        assert!(
            format!("{err:#}").contains("result.json: not a run result"),
            "{err:#}"
        );
        // Nothing but the written files is left behind.
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["checkpoint.old", "result.json"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn runs_are_filed_by_task_preset_attention_and_seed() {
        let sweep = sweep_dir(
            std::path::Path::new("runs"),
            &Task::new("text").unwrap(),
            "tiny",
        );
        assert_eq!(
            run_dir(&sweep, "softmax", 4),
            std::path::Path::new("runs/text/tiny/softmax/seed-4")
        );
        assert_eq!(
            preset_name("tiny", Some(std::path::Path::new("a/my.toml"))),
            "my"
        );
        assert_eq!(preset_name("small", None), "small");
    }

    /// The scratch files of atomic writes killed midway are the harness's to clear, Burn's
    /// included (a sweep cancelled while saving the optimiser state left one); anything else is
    /// the user's.
    #[test]
    fn scratch_files_of_owned_names_are_owned() {
        let names = ["optimizer.bpk", "config.json"];
        for owned in [
            "optimizer.bpk",
            "optimizer.bpk.tmp",
            "optimizer.bpk.tmp123",
            "config.json.new42",
            "optimizer.bpk.2668-5.tmp",
        ] {
            assert!(layout::is_owned_name(owned, &names), "{owned}");
        }
        for foreign in [
            "optimizer.bpk.bak",
            "optimizer.bpk.2668-.tmp",
            "optimizer.bpk.x-5.tmp",
            "optimizer.bpk.2668-5.tmpx",
            "notes.txt",
        ] {
            assert!(!layout::is_owned_name(foreign, &names), "{foreign}");
        }
    }

    #[test]
    fn task_names_are_checked_for_their_shape_only() {
        let task: Task = serde_json::from_str("\"path-x2\"").unwrap();
        assert_eq!(task.name(), "path-x2");
        assert_eq!(serde_json::to_string(&task).unwrap(), "\"path-x2\"");
        for bad in ["", "ListOps", "a b", "-x", "x-", "../x", "x/y"] {
            assert!(Task::new(bad).is_err(), "{bad:?}");
            assert!(
                serde_json::from_str::<Task>(&format!("{bad:?}")).is_err(),
                "{bad:?}"
            );
        }
    }
}
