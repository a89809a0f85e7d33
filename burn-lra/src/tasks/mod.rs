//! The tasks, side by side: each file states one task's facts (vocabulary, classes, the settings
//! it reads, its data checks) and reads its splits; [`TASKS`] registers them, and everything
//! else (flags, presets, run directories, the docs' table) follows from the registry.
//!
//! Adding a task is its file here, its presets in `configs/<name>/` and one line in [`TASKS`]
//! (CONTRIBUTING.md lists the files).

pub mod image;
pub mod listops;
pub mod matching;
pub mod mqar;
pub mod pathfinder;
pub mod text;

use std::path::Path;

use anyhow::{Result, bail};

use crate::config::{PairFeatures, RunConfig, TokenizerKind, Validation, default_doc_bytes};
use crate::data::{Splits, bpe};

/// One LRA task: what its model needs to know of its data, which settings it reads, and how its
/// splits are read.
pub trait LraTask: Sync {
    /// The name flags, files and run directories spell (`listops`).
    fn name(&self) -> &'static str;

    /// One line saying what the task is, for `burn-lra tasks` and the docs.
    fn summary(&self) -> &'static str;

    /// Size of the token vocabulary of the task's data with `config`, padding included (a BPE
    /// run's is its tokenizer's instead, [`vocab_size`]); an error where `config` lacks what
    /// fixes it.
    fn vocab_size(&self, config: &RunConfig) -> Result<usize>;

    /// What the model predicts.
    fn prediction(&self) -> Prediction;

    /// Whether the task is one of Long Range Arena's six, which have LRA's own recipe (the `lra`
    /// preset).
    fn in_lra(&self) -> bool {
        true
    }

    /// Whether an example is two documents (matching), read by two towers of one encoder.
    fn pairs(&self) -> bool {
        false
    }

    /// Whether the task's data ship a validation split of their own (model selection on the test
    /// split is then worth a warning).
    fn has_validation_split(&self) -> bool {
        true
    }

    /// The settings only some tasks read that this one does: any other that a configuration sets
    /// is refused, naming the tasks that read it.
    fn settings(&self) -> &'static [TaskSetting] {
        &[]
    }

    /// Checks the task's own settings; the error names the key.
    fn check(&self, config: &RunConfig) -> Result<()> {
        let _ = config;
        Ok(())
    }

    /// Reads (or generates once into the cache, then reads) the task's splits, each example cut
    /// to `source.max_len` tokens; `val` only where the data have a validation split.
    fn read(&self, config: &RunConfig, source: &DataSource) -> Result<Splits>;
}

/// Every task, in the order listings show them: LRA's six, then associative recall.
pub static TASKS: &[&dyn LraTask] = &[
    &listops::ListOps,
    &text::Text,
    &matching::Matching,
    &image::Image,
    &pathfinder::PATHFINDER,
    &pathfinder::PATHX,
    &mqar::Mqar,
];

/// What a task's model predicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prediction {
    /// One of this many classes per example, from the pooled sequence (LRA's tasks).
    Class(usize),
    /// A token of the vocabulary at every position that has a target, from that position's
    /// output (token-level tasks): causal where every layer's attention has a causal form,
    /// bidirectional otherwise.
    Token,
}

/// The registered task called `name`; an error listing the known names otherwise.
pub fn find(name: &str) -> Result<&'static dyn LraTask> {
    match TASKS.iter().find(|task| task.name() == name) {
        Some(task) => Ok(*task),
        None => {
            let names: Vec<&str> = TASKS.iter().map(|task| task.name()).collect();
            bail!("unknown task `{name}` (known: {})", names.join(", "))
        }
    }
}

/// Size of the vocabulary a model of `task` reads with `config`, padding included: the task's,
/// or a BPE tokenizer's (`data.bpe_vocab_size` plus padding).
pub fn vocab_size(task: &dyn LraTask, config: &RunConfig) -> Result<usize> {
    match (config.data.tokenizer, config.data.bpe_vocab_size) {
        (TokenizerKind::Bpe, Some(vocab)) => Ok(vocab + 1),
        _ => task.vocab_size(config),
    }
}

/// How many outputs the model's head has: the classes, or for a token-level task the
/// vocabulary.
pub fn n_outputs(task: &dyn LraTask, config: &RunConfig) -> Result<usize> {
    match task.prediction() {
        Prediction::Class(n) => Ok(n),
        Prediction::Token => vocab_size(task, config),
    }
}

/// Where a task's data come from.
#[derive(Debug, Clone, Copy)]
pub struct DataSource<'a> {
    /// `--data-dir`: the task's files; `None` where the task generates its data.
    pub data_dir: Option<&'a Path>,
    /// The cache generated datasets and trained tokenizers are kept in (`<out>/data`).
    pub cache_dir: &'a Path,
    /// Examples are cut to this many tokens (`usize::MAX` where a BPE tokenizer cuts them later).
    pub max_len: usize,
    /// `data.max_archive_bytes`: how far a compressed or archived data file may expand.
    pub max_archive_bytes: u64,
}

/// A setting only some tasks read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskSetting {
    /// `[data.generate]`: the generator's settings.
    Generate,
    /// `[data.pathfinder]`: the images' size, difficulty and count.
    Pathfinder,
    /// `data.tokenizer = "bpe"`.
    Bpe,
    /// `data.doc_max_bytes`.
    DocMaxBytes,
    /// `model.pair_features`.
    PairFeatures,
    /// `[data.mqar]`: the associative-recall generator's settings.
    Mqar,
}

impl TaskSetting {
    /// Every such setting.
    pub const ALL: [TaskSetting; 6] = [
        TaskSetting::Generate,
        TaskSetting::Pathfinder,
        TaskSetting::Bpe,
        TaskSetting::DocMaxBytes,
        TaskSetting::PairFeatures,
        TaskSetting::Mqar,
    ];

    /// The key as a configuration file spells it.
    pub fn key(self) -> &'static str {
        match self {
            TaskSetting::Generate => "data.generate",
            TaskSetting::Pathfinder => "data.pathfinder",
            TaskSetting::Bpe => "data.tokenizer = \"bpe\"",
            TaskSetting::DocMaxBytes => "data.doc_max_bytes",
            TaskSetting::PairFeatures => "model.pair_features",
            TaskSetting::Mqar => "data.mqar",
        }
    }

    /// Whether `config` sets it (a value equal to the default cannot be told from an absent key
    /// and counts as not set).
    pub fn is_set(self, config: &RunConfig) -> bool {
        match self {
            TaskSetting::Generate => config.data.generate.is_some(),
            TaskSetting::Pathfinder => config.data.pathfinder.is_some(),
            TaskSetting::Bpe => config.data.tokenizer == TokenizerKind::Bpe,
            TaskSetting::DocMaxBytes => config.data.doc_max_bytes != default_doc_bytes(),
            TaskSetting::PairFeatures => config.model.pair_features != PairFeatures::default(),
            TaskSetting::Mqar => config.data.mqar.is_some(),
        }
    }
}

/// Checks `config` against `task`: the settings of other tasks are refused (naming the tasks
/// that read them), then the task checks its own.
pub fn check_config(task: &dyn LraTask, config: &RunConfig) -> Result<()> {
    for setting in TaskSetting::ALL {
        if setting.is_set(config) && !task.settings().contains(&setting) {
            let readers: Vec<&str> = (TASKS.iter())
                .filter(|t| t.settings().contains(&setting))
                .map(|t| t.name())
                .collect();
            let tasks = if readers.len() == 1 { "task" } else { "tasks" };
            bail!(
                "`{}` is for the {} {tasks} only",
                setting.key(),
                join_and(&readers)
            );
        }
    }
    task.check(config)
}

/// `a`, `a and b`, `a, b and c`.
fn join_and(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => one.to_string(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// Loads the splits of `task` and applies `data.validation`, the BPE tokenizer and
/// `data.test_subset`; refuses a training split of one class.
pub fn load_splits(
    task: &dyn LraTask,
    config: &RunConfig,
    data_dir: Option<&Path>,
    cache_dir: &Path,
) -> Result<Splits> {
    // With BPE the documents are read whole (as bytes) and cut after re-tokenization.
    let bpe = config.data.tokenizer == TokenizerKind::Bpe;
    let source = DataSource {
        data_dir,
        cache_dir,
        max_len: if bpe { usize::MAX } else { config.data.max_len },
        max_archive_bytes: config.data.max_archive_bytes,
    };
    let Splits {
        mut train,
        val,
        mut test,
        ..
    } = task.read(config, &source)?;
    // Files a user brought may list a document twice, or in two splits: said, not refused.
    if data_dir.is_some() {
        let repeats = crate::data::repeated_examples(&train, val.as_ref(), &test);
        train.warnings.extend(repeats);
    }
    let mut val = match (config.data.validation, val) {
        (Validation::Split, Some(val)) => Some(val),
        (Validation::Split, None) => bail!(
            "{}: the corpus has no validation split; set `data.validation` to \"test\" (LRA's \
             choice for IMDB) or to {{ holdout = N }}",
            train.source
        ),
        // One copy of the tokens: the test split serves both roles.
        (Validation::Test, _) => None,
        (Validation::Holdout(n), _) => Some(train.split_off_holdout(n, "validation hold-out")?),
    };
    let tokenizer = match config.data.bpe_vocab_size.filter(|_| bpe) {
        None => None,
        Some(vocab) => {
            // Trained on what the model trains on: the training split, hold-out removed.
            let tokenizer = bpe::load_or_train(cache_dir, task.name(), &train, vocab)?;
            let cut = config.data.max_len;
            for split in [Some(&mut train), val.as_mut(), Some(&mut test)]
                .into_iter()
                .flatten()
            {
                tokenizer.retokenize(split, cut)?;
            }
            Some((tokenizer.path, tokenizer.json))
        }
    };
    let classes: Vec<usize> = (train.label_counts().iter())
        .enumerate()
        .filter(|(_, count)| **count > 0)
        .map(|(class, _)| class)
        .collect();
    if let [only] = classes.as_slice() {
        bail!(
            "{}: every training example has label {only}; a classifier needs at least two \
             classes to learn from",
            train.source
        );
    }
    if let Some(n) = config.data.test_subset
        && n < test.len()
    {
        let warnings = std::mem::take(&mut test.warnings);
        test = test.split_off_holdout(n, &format!("sample of {n}"))?;
        test.warnings = warnings;
    }
    Ok(Splits {
        train,
        val,
        test,
        tokenizer,
    })
}

/// Generates the cache `dir` with `generate` where it does not exist yet, then checks it against
/// its manifest. Where generating fails because another process (a sweep's other job) published
/// the same cache meanwhile, its copy serves.
pub fn generated_cache(
    dir: &Path,
    what: &str,
    generate: impl FnOnce() -> Result<()>,
) -> Result<()> {
    if !dir.exists() {
        eprintln!("generating {what} into {}", dir.display());
        match generate() {
            Err(_) if dir.exists() => {}
            other => other?,
        }
    }
    crate::data::verify_manifest(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found() {
        for task in TASKS {
            assert_eq!(find(task.name()).unwrap().name(), task.name());
            assert!(lra_runs::Task::new(task.name()).is_ok(), "{}", task.name());
        }
        let err = find("nope").err().unwrap().to_string();
        assert!(
            err.starts_with("unknown task `nope` (known: listops, "),
            "{err}"
        );
    }

    #[test]
    fn every_task_has_presets() {
        for task in TASKS {
            // `lra` is LRA's own recipe, which its six tasks have.
            let presets = ["tiny", "small", "lra"].into_iter();
            for preset in presets.filter(|p| task.in_lra() || *p != "lra") {
                RunConfig::preset(task.name(), preset)
                    .unwrap_or_else(|e| panic!("{} {preset}: {e:#}", task.name()));
            }
        }
    }

    /// README.md's task table is the registry's, row for row.
    #[test]
    fn readme_table_is_the_registry() {
        let readme = include_str!("../../../README.md");
        let start = "<!-- tasks: generated from burn-lra's TASKS -->\n";
        let table = readme
            .split_once(start)
            .and_then(|(_, rest)| rest.split_once("<!-- end tasks -->"))
            .expect("README.md has the task table's markers")
            .0;
        let mut expected = String::from("| task | what |\n|---|---|\n");
        for task in TASKS {
            expected.push_str(&format!("| `{}` | {} |\n", task.name(), task.summary()));
        }
        assert_eq!(
            table, expected,
            "README.md's task table is stale; it should read:\n{expected}"
        );
    }

    #[test]
    fn settings_of_other_tasks_name_their_readers() {
        assert_eq!(join_and(&["a"]), "a");
        assert_eq!(join_and(&["a", "b", "c"]), "a, b and c");
        let readers = |setting| {
            (TASKS.iter())
                .filter(|t| t.settings().contains(&setting))
                .count()
        };
        for setting in TaskSetting::ALL {
            assert!(readers(setting) > 0, "{} is read by no task", setting.key());
        }
    }
}
