//! A run planned and checked once. The command line, the configuration, the task's facts, the
//! attention (resolved once), the classifier it makes, its parameter budget and its memory check
//! become one [`RunPlan`]; the trainer takes it, and nothing after it resolves a name or checks
//! a field again.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::backend::BackendKind;
use crate::budget::{ParamBudget, ParamCount, check_memory};
use crate::config::RunConfig;
use crate::model::ClassifierSpec;
pub use crate::run_dir::open::ResumeMode;
use crate::tasks::{self, LraTask};

/// A run, planned and checked: what it trains, how, and where.
#[derive(Clone)]
pub struct RunPlan {
    /// The configuration, checked against its task.
    pub config: RunConfig,
    /// The task's facts and reader.
    pub task: &'static dyn LraTask,
    /// The classifier, its attention resolved.
    pub classifier: ClassifierSpec,
    /// Its trainable parameters beside the softmax baseline's.
    pub budget: ParamBudget,
    /// Which attention, seed and backend, and where the run writes.
    pub opts: TrainOptions,
}

impl std::fmt::Debug for RunPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunPlan")
            .field("task", &self.task.name())
            .field("config", &self.config)
            .field("budget", &self.budget)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl RunPlan {
    /// Plans the run `opts` describes with `config`: the task's settings checked, the attention
    /// resolved (the error names its field), the classifier's memory checked and its budget
    /// counted, all from shapes, before any data is read or weight drawn.
    pub fn new(config: RunConfig, opts: TrainOptions) -> Result<Self> {
        let task = tasks::find(config.task.name())?;
        tasks::check_config(task, &config)?;
        let classifier = ClassifierSpec::resolve(&config, task, &opts.attention)?;
        let count = ParamCount::of(&classifier)?;
        check_memory(&count, &config, task, &opts.attention)?;
        let softmax = match opts.attention.name() {
            "softmax" => count,
            _ => ParamCount::of(
                &ClassifierSpec::resolve(&config, task, "softmax")
                    .context("the softmax baseline")?,
            )?,
        };
        let budget = ParamBudget::new(&count, &softmax)?;
        Ok(Self {
            config,
            task,
            classifier,
            budget,
            opts,
        })
    }
}

/// What a run is: which attention, seed and backend, and where it writes.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// The attention: a registry name, or a hybrid stack's pattern of them.
    pub attention: lra_runs::AttentionName,
    /// Training seed (initialisation, data order, dropout).
    pub seed: u64,
    /// Backend to run on.
    pub backend: BackendKind,
    /// Which of the backend's devices (`None`: its default one).
    pub device: Option<usize>,
    /// Run directory.
    pub run_dir: PathBuf,
    /// The preset's name or the config file's path, recorded with the results.
    pub preset: String,
    /// Draw a progress bar on the terminal.
    pub progress: bool,
    /// Whether to start a run or continue the one in `run_dir`.
    pub resume: ResumeMode,
    /// Let a resume continue on another backend than the checkpoint's: recorded as a change of
    /// the field `backend` from the checkpoint's step (the run is then no longer the same, bit
    /// for bit, as one trained on a single backend).
    pub change_backend: bool,
    /// Stop after this step as if killed (no result written): for testing resumption.
    pub stop_after: Option<usize>,
    /// A finished self-pretraining run to start from (`--init-from`): its embedding, positions
    /// and encoder.
    pub init_from: Option<PathBuf>,
}

/// The configuration from `--config` or else the preset `preset` of `task`, checked to be a
/// configuration of `task`, and the name its runs are filed under.
pub fn load_config(
    task: &lra_runs::Task,
    preset: &str,
    config: Option<&Path>,
) -> Result<(RunConfig, String)> {
    let name = lra_runs::preset_name(preset, config);
    let config = match config {
        Some(path) => RunConfig::from_file(path)?,
        None => RunConfig::preset(task.name(), preset)?,
    };
    if config.task != *task {
        // A configuration of another task: what is wrong in it as such is named first.
        tasks::check_config(tasks::find(config.task.name())?, &config)?;
        bail!("the config is for task `{}`, not `{task}`", config.task);
    }
    Ok((config, name))
}

/// Where a run's generated data and tokenizers are cached: `<out>/data`.
pub fn cache_dir(out: &Path) -> PathBuf {
    out.join(lra_runs::layout::DATA_CACHE)
}
