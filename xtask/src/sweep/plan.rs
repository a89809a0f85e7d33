//! A sweep's plan: its flags, its runs and where each stands, and the `burn-lra` command line
//! that trains a run, which every executor runs.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use lra_runs::{BackendKind, RunState, Task};

/// Where the runs of a sweep are trained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Executor {
    /// On this host: `--jobs` runs at once.
    Local,
    /// As one Slurm job array (`sbatch --array`), one task per unfinished run.
    Slurm,
}

/// The flags of `cargo xtask lra`.
#[derive(clap::Args, Debug, Clone)]
pub struct LraArgs {
    /// The task (`burn-lra tasks` lists them).
    #[arg(long, default_value = "listops")]
    pub(super) task: Task,
    /// Seeds 0..N-1.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) seeds: u64,
    /// Registry names, comma-separated, or all (the default: every registered attention).
    #[arg(long, value_delimiter = ',')]
    pub(super) attention: Vec<String>,
    /// A preset of configs/TASK/ (tiny, small, lra).
    #[arg(long, default_value = "tiny", conflicts_with = "config")]
    pub(super) preset: String,
    /// A configuration file of your own (runs are filed under its stem).
    #[arg(long)]
    pub(super) config: Option<PathBuf>,
    /// Burn backend, compiled in through the burn-lra feature of that name.
    #[arg(long, value_enum, default_value_t = BackendKind::Flex)]
    pub(super) backend: BackendKind,
    /// Directory holding the task's data files; generated ListOps when absent.
    #[arg(long)]
    pub(super) data_dir: Option<PathBuf>,
    /// Root of the run directories (on a cluster: a folder every node sees at the same path).
    #[arg(long, default_value = "runs")]
    pub(super) out: PathBuf,
    /// A burn-lra binary built beforehand (with the backend's feature), instead of building one.
    #[arg(long)]
    pub(super) harness: Option<PathBuf>,
    /// List the registered attentions and exit.
    #[arg(long)]
    pub(super) list: bool,
    /// Where the runs are trained.
    #[arg(long, value_enum, default_value_t = Executor::Local)]
    pub(super) executor: Executor,
    /// Runs at once on this host (local executor): each on its own device from --devices, or, on
    /// a CPU backend, each on its share of the cores [default: one per --devices entry; on a
    /// CPU backend one per core, at most one per run; else 1].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) jobs: Option<u64>,
    /// Device numbers for the runs at once (local executor, GPU backends), e.g. 0,1,2,3.
    #[arg(long, value_delimiter = ',')]
    pub(super) devices: Vec<usize>,
    /// Extra sbatch options for the job array (slurm executor), e.g.
    /// "--partition=gpu --gres=gpu:1 --time=12:00:00".
    #[arg(long, allow_hyphen_values = true)]
    pub(super) slurm: Option<String>,
    /// At most this many array tasks running at once (slurm executor: `--array=...%K`).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) throttle: Option<u64>,
    /// Submit and return (slurm executor); collect later with --summarize.
    #[arg(long)]
    pub(super) no_wait: bool,
    /// Train nothing: summarise the sweep's finished runs (after a --no-wait submission).
    #[arg(long)]
    pub(super) summarize: bool,
    /// A grid over configuration values, `KEY=V1,V2,...` by dotted key (repeatable; several
    /// make a product): `--set training.schedule.peak=1e-4,3e-4,1e-3`. Each point is a sweep of
    /// its own, filed under the preset's name and the point's settings
    /// (`tiny,training.schedule.peak=3e-4`), and the grid's summary gives each attention at the
    /// point with its best mean validation accuracy.
    #[arg(long = "set", value_name = "KEY=V1,V2,...")]
    pub(super) set: Vec<String>,
    /// Self-pretrain first: for every attention and seed, a pretraining run on the task's
    /// training inputs (`burn-lra pretrain`: masked-token denoising), filed under
    /// `<preset>,training.objective=masked-tokens`, then the run fine-tuned from it (`train
    /// --init-from`), filed under `<preset>,spt`; the summaries are the fine-tuned runs'.
    #[arg(long)]
    pub(super) pretrain: bool,
    /// The grid point this sweep trains: its `KEY=VALUE` settings (empty outside a grid).
    #[arg(skip)]
    pub(super) point: Vec<String>,
    /// The pretraining sweep a fine-tuning sweep starts from (its runs' `--init-from`, the run
    /// of the same attention and seed); `None` for runs from scratch.
    #[arg(skip)]
    pub(super) init_from: Option<PathBuf>,
}

/// The setting a `--pretrain` sweep's pretraining runs add to their point.
pub(super) const PRETRAINING: &str = "training.objective=masked-tokens";

impl LraArgs {
    /// The name runs are filed under: the preset's (or the configuration file's stem), then
    /// the grid point's settings.
    pub(super) fn preset_name(&self) -> String {
        let base = lra_runs::preset_name(&self.preset, self.config.as_deref());
        let name = match self.point.as_slice() {
            [] => base,
            point => {
                let settings: Vec<&str> = point.iter().map(String::as_str).collect();
                lra_runs::point_name(&base, &settings)
            }
        };
        // As `burn-lra train --init-from` files a fine-tuned run.
        match self.init_from {
            Some(_) => format!("{name},spt"),
            None => name,
        }
    }

    /// The sweeps that train this point, in order: itself; with `--pretrain`, its pretraining
    /// sweep, then the fine-tuning sweep that starts from it.
    pub(super) fn stages(&self) -> Vec<Self> {
        match self.pretrain {
            false => vec![self.clone()],
            true => vec![self.pretraining(), self.fine_tuning()],
        }
    }

    /// The sweep whose summary stands for this point: the fine-tuning sweep with `--pretrain`.
    pub(super) fn summarized(self) -> Self {
        match self.pretrain {
            false => self,
            true => self.fine_tuning(),
        }
    }

    /// This point's pretraining sweep.
    fn pretraining(&self) -> Self {
        let mut point = self.point.clone();
        point.push(PRETRAINING.to_string());
        Self {
            point,
            pretrain: false,
            init_from: None,
            ..self.clone()
        }
    }

    /// This point's fine-tuning sweep, each run from its pretraining run.
    fn fine_tuning(&self) -> Self {
        Self {
            init_from: Some(self.pretraining().sweep_dir()),
            pretrain: false,
            ..self.clone()
        }
    }

    /// The grid's points, each a list of `KEY=VALUE` settings, in the order of the `--set` flags
    /// (the last varying fastest); one empty point without `--set`.
    pub(super) fn points(&self) -> Result<Vec<Vec<String>>> {
        let mut points = vec![Vec::new()];
        let mut keys = Vec::new();
        for flag in &self.set {
            let Some((key, values)) = flag.split_once('=') else {
                bail!("--set `{flag}` is not KEY=V1,V2,...");
            };
            if key.is_empty() || values.split(',').any(str::is_empty) {
                bail!("--set `{flag}`: a key and at least one value, none of them empty");
            }
            if keys.contains(&key) {
                bail!("--set: `{key}` is given twice (list its values in one flag)");
            }
            keys.push(key);
            points = points
                .into_iter()
                .flat_map(|point| {
                    values.split(',').map(move |value| {
                        let mut point = point.clone();
                        point.push(format!("{key}={value}"));
                        point
                    })
                })
                .collect();
        }
        Ok(points)
    }

    /// These flags for one point of the grid.
    pub(super) fn at(&self, point: Vec<String>) -> Self {
        Self {
            point,
            ..self.clone()
        }
    }

    /// The sweep's folder.
    pub(super) fn sweep_dir(&self) -> PathBuf {
        lra_runs::sweep_dir(&self.out, &self.task, &self.preset_name())
    }

    /// Flags that belong to the other executor are errors, not silently ignored; `--seeds`
    /// and `--jobs` keep the harness's bound on sizes (2^32 - 1).
    pub(super) fn check_executor_flags(&self) -> Result<()> {
        let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        lra_runs::limits::check_size("--seeds", count(self.seeds), true)?;
        if let Some(jobs) = self.jobs {
            lra_runs::limits::check_size("--jobs", count(jobs), true)?;
        }
        let local_only = [
            ("--jobs", self.jobs.is_some()),
            ("--devices", !self.devices.is_empty()),
        ];
        let slurm_only = [
            ("--slurm", self.slurm.is_some()),
            ("--throttle", self.throttle.is_some()),
            ("--no-wait", self.no_wait),
        ];
        if self.pretrain && self.no_wait {
            bail!("--pretrain waits for the pretraining runs before it fine-tunes; drop --no-wait");
        }
        let (wrong, executor) = match self.executor {
            Executor::Local => (&slurm_only[..], "local"),
            Executor::Slurm => (&local_only[..], "slurm"),
        };
        if let Some((flag, _)) = wrong.iter().find(|(_, set)| *set) {
            bail!("{flag} does not apply to the {executor} executor");
        }
        Ok(())
    }
}

/// One run of the sweep.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Run {
    /// The attention (a hybrid stack's pattern).
    pub attention: lra_runs::AttentionName,
    /// Training seed.
    pub seed: u64,
    /// Its run directory.
    pub dir: PathBuf,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} seed {}", self.attention, self.seed)
    }
}

/// A run that did not finish, and where to read why.
pub(crate) struct Failure {
    /// The run.
    pub run: Run,
    /// What happened (exit status, the run's last error line).
    pub reason: String,
}

/// The sweep's unfinished runs, in order (attention-major); finished ones are reported and left.
pub(super) fn unfinished_runs(
    attentions: &[lra_runs::AttentionName],
    seeds: u64,
    sweep_dir: &Path,
) -> Result<Vec<Run>> {
    let mut unfinished = Vec::new();
    for attention in attentions {
        for seed in 0..seeds {
            let run = Run {
                attention: attention.clone(),
                seed,
                dir: lra_runs::run_dir(sweep_dir, attention, seed),
            };
            match lra_runs::run_state(&run.dir)? {
                RunState::Finished(result) => eprintln!(
                    "{run}: done before ({:.2}%), skipped",
                    100.0 * result.test_accuracy
                ),
                RunState::Checkpointed => {
                    eprintln!("{run}: unfinished, resumes from its checkpoint");
                    unfinished.push(run);
                }
                RunState::Fresh => unfinished.push(run),
            }
        }
    }
    Ok(unfinished)
}

/// The `burn-lra` arguments that train `run` (`train --continue ...`). Paths are made absolute
/// when `absolute` (for runs started from another working directory: Slurm tasks).
pub(super) fn train_args(args: &LraArgs, run: &Run, absolute: bool) -> Result<Vec<OsString>> {
    let path = |p: &Path| -> Result<OsString> {
        Ok(if absolute {
            std::path::absolute(p)
                .with_context(|| format!("cannot resolve {}", p.display()))?
                .into_os_string()
        } else {
            p.as_os_str().to_owned()
        })
    };
    let mut out: Vec<OsString> = ["train", "--continue", "--task"]
        .iter()
        .map(OsString::from)
        .collect();
    out.push(args.task.name().into());
    out.extend(["--attention".into(), run.attention.name().into()]);
    out.extend(["--seed".into(), run.seed.to_string().into()]);
    out.extend(["--backend".into(), args.backend.name().into()]);
    out.extend(["--out".into(), path(&args.out)?]);
    out.extend(["--run-dir".into(), path(&run.dir)?]);
    match &args.config {
        Some(config) => out.extend(["--config".into(), path(config)?]),
        None => out.extend(["--preset".into(), args.preset.clone().into()]),
    }
    if let Some(dir) = &args.data_dir {
        out.extend(["--data-dir".into(), path(dir)?]);
    }
    for setting in &args.point {
        out.extend(["--set".into(), setting.into()]);
    }
    if let Some(pretraining) = &args.init_from {
        let pretrained = lra_runs::run_dir(pretraining, &run.attention, run.seed);
        out.extend(["--init-from".into(), path(&pretrained)?]);
    }
    Ok(out)
}

/// The last line of a log that says what went wrong (`error: ...`), if any.
pub(super) fn last_error_line(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .rev()
        .find(|l| l.starts_with("error:"))
        .map(str::to_string)
}

#[cfg(test)]
pub(crate) mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: LraArgs,
    }

    /// `cargo xtask lra` with `flags`.
    pub(crate) fn args(flags: &[&str]) -> LraArgs {
        Wrapper::try_parse_from(std::iter::once("lra").chain(flags.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn flags_of_the_other_executor_are_errors() {
        let err = args(&["--jobs", "2", "--executor", "slurm"])
            .check_executor_flags()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "--jobs does not apply to the slurm executor"
        );
        let err = args(&["--no-wait"]).check_executor_flags().unwrap_err();
        assert_eq!(
            err.to_string(),
            "--no-wait does not apply to the local executor"
        );
        args(&[
            "--executor",
            "slurm",
            "--slurm",
            "--partition=gpu --gres=gpu:1",
        ])
        .check_executor_flags()
        .unwrap();
        let err = args(&["--seeds", "18446744073709551615"])
            .check_executor_flags()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "`--seeds` must be at most 4294967295 (2^32 - 1), got 18446744073709551615"
        );
    }

    /// `--set` flags make the product of their values, each point filed under the preset and
    /// its settings and trained with them.
    #[test]
    fn grids_are_products_filed_by_point() {
        let a = args(&[
            "--task",
            "mqar",
            "--set",
            "training.schedule.peak=1e-4,1e-3",
            "--set",
            "model.d_model=64,128",
            "--out",
            "o",
        ]);
        let points = a.points().unwrap();
        assert_eq!(points.len(), 4);
        assert_eq!(
            points[1],
            ["training.schedule.peak=1e-4", "model.d_model=128"]
        );
        let point = a.at(points[1].clone());
        assert_eq!(
            point.sweep_dir(),
            Path::new("o/mqar/tiny,training.schedule.peak=1e-4,model.d_model=128")
        );
        let run = Run {
            attention: lra_runs::AttentionName::new("gla").unwrap(),
            seed: 0,
            dir: lra_runs::run_dir(&point.sweep_dir(), "gla", 0),
        };
        let train: Vec<String> = train_args(&point, &run, false)
            .unwrap()
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        assert!(
            train.join(" ").ends_with(
                "--preset tiny --set training.schedule.peak=1e-4 --set model.d_model=128"
            ),
            "{train:?}"
        );
        assert_eq!(args(&[]).points().unwrap(), [Vec::<String>::new()]);
        for bad in ["peak", "a=1,,2", "=1"] {
            assert!(args(&["--set", bad]).points().is_err(), "{bad}");
        }
        let twice = args(&["--set", "a=1", "--set", "a=2"])
            .points()
            .unwrap_err();
        assert!(twice.to_string().contains("`a` is given twice"), "{twice}");
    }

    /// `--pretrain`: each point is a pretraining sweep, then a fine-tuning sweep whose runs
    /// start from the pretraining run of their attention and seed.
    #[test]
    fn a_pretrain_sweep_pretrains_then_fine_tunes_from_each_run() {
        let a = args(&["--pretrain", "--set", "model.d_model=32", "--out", "o"]);
        let point = a.at(a.points().unwrap()[0].clone());
        let [pretraining, fine_tuning] = point.stages().try_into().unwrap();
        assert_eq!(
            pretraining.sweep_dir(),
            Path::new("o/listops/tiny,model.d_model=32,training.objective=masked-tokens")
        );
        assert_eq!(
            fine_tuning.sweep_dir(),
            Path::new("o/listops/tiny,model.d_model=32,spt")
        );
        assert_eq!(point.summarized().sweep_dir(), fine_tuning.sweep_dir());
        let run = |at: &LraArgs| Run {
            attention: lra_runs::AttentionName::new("gla").unwrap(),
            seed: 1,
            dir: lra_runs::run_dir(&at.sweep_dir(), "gla", 1),
        };
        let line = |at: &LraArgs| -> String {
            let args: Vec<String> = train_args(at, &run(at), false)
                .unwrap()
                .into_iter()
                .map(|s| s.into_string().unwrap())
                .collect();
            args.join(" ")
        };
        assert!(
            line(&pretraining)
                .ends_with("--set model.d_model=32 --set training.objective=masked-tokens"),
            "{}",
            line(&pretraining)
        );
        assert!(
            line(&fine_tuning).ends_with(
                "--set model.d_model=32 --init-from \
                 o/listops/tiny,model.d_model=32,training.objective=masked-tokens/gla/seed-1"
            ),
            "{}",
            line(&fine_tuning)
        );
        assert_eq!(args(&[]).stages().len(), 1);
        let err = args(&["--pretrain", "--executor", "slurm", "--no-wait"])
            .check_executor_flags()
            .unwrap_err();
        assert!(err.to_string().contains("drop --no-wait"), "{err}");
    }

    #[test]
    fn runs_are_filed_under_the_config_stem() {
        let a = args(&["--task", "text", "--config", "dir/mine.toml", "--out", "o"]);
        assert_eq!(a.sweep_dir(), Path::new("o/text/mine"));
        let run = Run {
            attention: lra_runs::AttentionName::new("softmax").unwrap(),
            seed: 3,
            dir: lra_runs::run_dir(&a.sweep_dir(), "softmax", 3),
        };
        let train: Vec<String> = train_args(&a, &run, false)
            .unwrap()
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        assert_eq!(
            train.join(" "),
            "train --continue --task text --attention softmax --seed 3 --backend flex --out o \
             --run-dir o/text/mine/softmax/seed-3 --config dir/mine.toml"
        );
    }
}
