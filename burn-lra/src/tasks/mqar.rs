//! Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology", arXiv 2312.04927): recall
//! the value of each key queried again after a list of key-value pairs; a token-level task,
//! scored at the queries only. Generated from `[data.mqar]` (or read from `--data-dir` in the
//! same files: `{train,val,test}.tsv`).

use anyhow::{Context, Result, bail};

use super::{DataSource, LraTask, Prediction, TaskSetting, generated_cache};
use crate::config::{Pooling, RunConfig};
use crate::data::{Splits, mqar};

/// The associative-recall task.
pub struct Mqar;

impl Mqar {
    /// The generator's settings; an error where the configuration has none.
    fn settings_of(config: &RunConfig) -> Result<&mqar::MqarConfig> {
        config.data.mqar.as_ref().context(
            "the mqar task needs a [data.mqar] table (vocab_size, n_pairs, n_train, n_val, \
             n_test, seed): configs/mqar/tiny.toml has one",
        )
    }
}

impl LraTask for Mqar {
    fn name(&self) -> &'static str {
        "mqar"
    }

    fn summary(&self) -> &'static str {
        "recall the value of each key asked again after a list of key-value pairs (token-level; \
         Zoology's MQAR, generated)"
    }

    fn vocab_size(&self, config: &RunConfig) -> Result<usize> {
        Ok(Self::settings_of(config)?.vocab_size)
    }

    fn prediction(&self) -> Prediction {
        Prediction::Token
    }

    fn in_lra(&self) -> bool {
        false
    }

    fn settings(&self) -> &'static [TaskSetting] {
        &[TaskSetting::Mqar]
    }

    fn check(&self, config: &RunConfig) -> Result<()> {
        Self::settings_of(config)?.validate(config.data.max_len)?;
        if config.model.pooling == Pooling::Cls {
            bail!(
                "`model.pooling`: the mqar task predicts at positions and pools nothing; a CLS \
                 vector would shift every position, so set it to \"mean\""
            );
        }
        Ok(())
    }

    fn read(&self, config: &RunConfig, source: &DataSource) -> Result<Splits> {
        let settings = Self::settings_of(config)?;
        let len = config.data.max_len;
        let dir = match source.data_dir {
            Some(dir) => dir.to_path_buf(),
            None => {
                let dir = source.cache_dir.join(settings.cache_name(len));
                generated_cache(&dir, "MQAR", || mqar::write_dataset(&dir, settings, len))?;
                dir
            }
        };
        let [train, val, test] = mqar::read_splits(&dir, settings.vocab_size)?;
        for split in [&train, &val, &test] {
            if let Some(long) = split.examples.iter().find(|e| e.tokens.len() > len) {
                bail!(
                    "{}: a sequence of {} tokens is longer than `data.max_len` ({len}); MQAR \
                     sequences are not cut (a cut one could lose its pairs)",
                    split.source,
                    long.tokens.len()
                );
            }
        }
        Ok(Splits::new(train, Some(val), test))
    }
}
