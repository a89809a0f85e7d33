//! Matching (LRA's AAN retrieval): are two papers linked by a citation, from their bytes; two
//! documents per example, 2 classes. Reads LRA's `new_aan_pairs.{train,eval,test}.tsv`.

use anyhow::{Result, bail};

use super::{DataSource, LraTask, Prediction, TaskSetting};
use crate::config::RunConfig;
use crate::data::{Splits, bytes, matching};

/// The document matching task.
pub struct Matching;

impl LraTask for Matching {
    fn name(&self) -> &'static str {
        "matching"
    }

    fn summary(&self) -> &'static str {
        "are two documents related, from their bytes (AAN citation pairs)"
    }

    fn vocab_size(&self, _config: &RunConfig) -> Result<usize> {
        Ok(bytes::VOCAB_SIZE)
    }

    fn prediction(&self) -> Prediction {
        Prediction::Class(2)
    }

    fn pairs(&self) -> bool {
        true
    }

    fn settings(&self) -> &'static [TaskSetting] {
        &[
            TaskSetting::Bpe,
            TaskSetting::DocMaxBytes,
            TaskSetting::PairFeatures,
        ]
    }

    fn read(&self, config: &RunConfig, source: &DataSource) -> Result<Splits> {
        let Some(dir) = source.data_dir else {
            bail!(
                "no matching data: pass --data-dir with LRA's new_aan_pairs.{{train,eval,test}}.tsv \
                 (lra_release, tsv_data/), or generate small files in that format with \
                 `burn-lra generate-matching --out DIR`"
            );
        };
        let [train, val, test] =
            matching::read_splits(dir, source.max_len, config.data.doc_max_bytes)?;
        Ok(Splits::new(train, Some(val), test))
    }
}
