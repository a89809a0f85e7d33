//! ListOps (Nangia & Bowman 2018; LRA's generator settings): evaluate a nested list expression,
//! 10 classes. Reads LRA's `basic_{train,val,test}.tsv`, or generates them once from
//! `[data.generate]`.

use anyhow::{Result, bail};

use super::{DataSource, LraTask, Prediction, TaskSetting, generated_cache};
use crate::config::RunConfig;
use crate::data::{Splits, listops};

/// The ListOps task.
pub struct ListOps;

impl LraTask for ListOps {
    fn name(&self) -> &'static str {
        "listops"
    }

    fn summary(&self) -> &'static str {
        "evaluate a nested list expression (10 classes); generated, or LRA's basic_*.tsv"
    }

    fn vocab_size(&self, _config: &RunConfig) -> Result<usize> {
        Ok(listops::VOCAB_SIZE)
    }

    fn prediction(&self) -> Prediction {
        Prediction::Class(listops::N_CLASSES)
    }

    fn settings(&self) -> &'static [TaskSetting] {
        &[TaskSetting::Generate]
    }

    fn read(&self, config: &RunConfig, source: &DataSource) -> Result<Splits> {
        let dir = match (source.data_dir, &config.data.generate) {
            (Some(dir), _) => dir.to_path_buf(),
            (None, Some(generate)) => {
                let dir = source.cache_dir.join(generate.cache_name());
                generated_cache(&dir, "ListOps", || listops::write_dataset(&dir, generate))?;
                dir
            }
            (None, None) => bail!(
                "no ListOps data: pass --data-dir with LRA's basic_{{train,val,test}}.tsv, \
                 or use a config with a [data.generate] table"
            ),
        };
        let [train, val, test] = listops::read_splits(&dir, source.max_len)?;
        Ok(Splits::new(train, Some(val), test))
    }
}
