//! Loading a task's splits from the configuration and the command line.

use std::path::Path;

use anyhow::{Result, bail};

use crate::config::{RunConfig, Task};
use crate::data::listops;
use crate::train::Splits;

/// Loads the three splits of `config.task`.
///
/// ListOps reads `basic_{train,val,test}.tsv` from `data_dir` when one is given; otherwise,
/// when the configuration has a `[data.generate]` table, it generates the dataset once into
/// `cache_dir` and reads it from there.
pub fn load_splits(
    config: &RunConfig,
    data_dir: Option<&Path>,
    cache_dir: &Path,
) -> Result<Splits> {
    match config.task {
        Task::Listops => {
            let dir = match (data_dir, &config.data.generate) {
                (Some(dir), _) => dir.to_path_buf(),
                (None, Some(generate)) => {
                    let dir = cache_dir.join(generate.cache_name());
                    let complete = listops::SPLIT_FILES
                        .iter()
                        .all(|(_, f)| dir.join(f).is_file());
                    if !complete {
                        eprintln!("generating ListOps into {}", dir.display());
                        listops::write_splits(&dir, &listops::generate(generate)?)?;
                    }
                    dir
                }
                (None, None) => bail!(
                    "no ListOps data: pass --data-dir with LRA's basic_{{train,val,test}}.tsv, \
                     or use a config with a [data.generate] table"
                ),
            };
            let [train, val, test] = listops::read_splits(&dir, config.data.max_len)?;
            Ok(Splits {
                train,
                val,
                test,
                vocab_size: listops::VOCAB_SIZE,
            })
        }
    }
}
