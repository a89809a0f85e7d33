//! Pathfinder and Path-X (Linsley et al. 2018; LRA's settings): are the two dots of an image
//! joined by one dashed path, from its pixels, 2 classes. 32 or 64 pixels a side (Pathfinder),
//! 128 (Path-X). Reads LRA's released layout, or generates `[data.pathfinder]` images once.

use anyhow::{Result, bail};

use super::{DataSource, LraTask, Prediction, TaskSetting, generated_cache};
use crate::config::RunConfig;
use crate::data::{Splits, image, pathfinder};

/// A Pathfinder task at the image sides it accepts.
pub struct Pathfinder {
    name: &'static str,
    summary: &'static str,
    sizes: &'static [usize],
    /// How the sizes read in a message ("32 or 64 pixels").
    sizes_text: &'static str,
}

/// Pathfinder at 32 (LRA's) or 64 pixels.
pub static PATHFINDER: Pathfinder = Pathfinder {
    name: "pathfinder",
    summary: "are the two dots joined by one dashed path, at 32 x 32 (or 64 x 64) pixels",
    sizes: &[32, 64],
    sizes_text: "32 or 64 pixels",
};

/// Path-X: Pathfinder at 128 pixels (16,384 tokens).
pub static PATHX: Pathfinder = Pathfinder {
    name: "pathx",
    summary: "Pathfinder at 128 x 128 pixels (16,384 tokens)",
    sizes: &[128],
    sizes_text: "128 pixels",
};

impl LraTask for Pathfinder {
    fn name(&self) -> &'static str {
        self.name
    }

    fn summary(&self) -> &'static str {
        self.summary
    }

    fn vocab_size(&self, _config: &RunConfig) -> Result<usize> {
        Ok(image::VOCAB_SIZE)
    }

    fn prediction(&self) -> Prediction {
        Prediction::Class(pathfinder::N_CLASSES)
    }

    fn settings(&self) -> &'static [TaskSetting] {
        &[TaskSetting::Pathfinder]
    }

    fn check(&self, config: &RunConfig) -> Result<()> {
        let Some(settings) = &config.data.pathfinder else {
            bail!(
                "`data.pathfinder` is required for {} (size, difficulty, n_images)",
                self.name
            );
        };
        if !self.sizes.contains(&settings.size) {
            bail!(
                "`data.pathfinder.size` is {} but {} images are {}",
                settings.size,
                self.name,
                self.sizes_text
            );
        }
        Ok(())
    }

    fn read(&self, config: &RunConfig, source: &DataSource) -> Result<Splits> {
        let Some(settings) = &config.data.pathfinder else {
            bail!("`data.pathfinder` is required for {}", self.name);
        };
        let dir = match source.data_dir {
            Some(dir) => dir.to_path_buf(),
            None => {
                let dir = source.cache_dir.join(settings.cache_name());
                let images = dir.join(settings.difficulty.folder());
                let what = format!("{} Pathfinder images", settings.n_images);
                generated_cache(&images, &what, || {
                    pathfinder::write_dataset(&dir, settings).map(|_| ())
                })?;
                dir
            }
        };
        let [train, val, test] = pathfinder::read_splits(&dir, settings, source.max_len)?;
        Ok(Splits::new(train, Some(val), test))
    }
}
