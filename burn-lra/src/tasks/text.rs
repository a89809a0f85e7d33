//! Text (LRA's byte-level IMDB): classify a review from its bytes, 2 classes. Reads the aclImdb
//! folders or their `.tar.gz`, or any `label<TAB>text` corpus (`train.tsv`, `test.tsv`,
//! optionally `val.tsv`).

use anyhow::{Result, bail};

use super::{DataSource, LraTask, Prediction, TaskSetting};
use crate::config::RunConfig;
use crate::data::{Splits, bytes};

/// The text classification task.
pub struct Text;

/// Negative and positive.
const N_CLASSES: usize = 2;

impl LraTask for Text {
    fn name(&self) -> &'static str {
        "text"
    }

    fn summary(&self) -> &'static str {
        "classify a document from its bytes (IMDB reviews, or any label<TAB>text corpus)"
    }

    fn vocab_size(&self, _config: &RunConfig) -> Result<usize> {
        Ok(bytes::VOCAB_SIZE)
    }

    fn prediction(&self) -> Prediction {
        Prediction::Class(N_CLASSES)
    }

    fn has_validation_split(&self) -> bool {
        false
    }

    fn settings(&self) -> &'static [TaskSetting] {
        &[TaskSetting::Bpe]
    }

    fn read(&self, _config: &RunConfig, source: &DataSource) -> Result<Splits> {
        let Some(dir) = source.data_dir else {
            bail!(
                "no text data: pass --data-dir with the IMDB reviews (the aclImdb folders or \
                 their .tar.gz) or a folder holding train.tsv and test.tsv (label<TAB>text)"
            );
        };
        bytes::read_corpus(dir, source.max_len, N_CLASSES, source.max_archive_bytes)
    }
}
