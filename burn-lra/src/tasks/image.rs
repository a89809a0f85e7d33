//! Image (LRA's sequential CIFAR-10): classify an image from its grey pixels, one token each,
//! 10 classes. Reads CIFAR-10's binary batches or IDX files (MNIST, Fashion-MNIST).

use anyhow::{Result, bail};

use super::{DataSource, LraTask, Prediction};
use crate::config::RunConfig;
use crate::data::{Splits, image};

/// The image classification task.
pub struct Image;

impl LraTask for Image {
    fn name(&self) -> &'static str {
        "image"
    }

    fn summary(&self) -> &'static str {
        "classify an image from its sequence of grey pixels (CIFAR-10, or IDX image sets)"
    }

    fn vocab_size(&self, _config: &RunConfig) -> Result<usize> {
        Ok(image::VOCAB_SIZE)
    }

    fn prediction(&self) -> Prediction {
        Prediction::Class(image::N_CLASSES)
    }

    fn has_validation_split(&self) -> bool {
        false
    }

    fn read(&self, _config: &RunConfig, source: &DataSource) -> Result<Splits> {
        let Some(dir) = source.data_dir else {
            bail!(
                "no image data: pass --data-dir with CIFAR-10's binary release \
                 (cifar-10-batches-bin/) or IDX files such as Fashion-MNIST's \
                 (Debian: dataset-fashion-mnist, /usr/share/datasets/fashion-mnist)"
            );
        };
        let [train, test] = image::read_splits(dir, source.max_len, source.max_archive_bytes)?;
        Ok(Splits::new(train, None, test))
    }
}
