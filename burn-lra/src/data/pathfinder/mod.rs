//! Pathfinder and Path-X: images of dashed paths, read from LRA's released layout or generated
//! into it ([`snakes`]).
//!
//! The layout (LRA's `lra_release/pathfinder{32,64,128}/`): one folder per difficulty,
//! `curv_baseline` (paths of 6 paddles), `curv_contour_length_9`, `curv_contour_length_14`, each
//! holding `imgs/<batch>/sample_<i>.png` (8-bit grey) and `metadata/<batch>.npy`. Despite the
//! extension the metadata files are text, one image per line, space-separated:
//! `imgs/<batch> sample_<i>.png <i> <label> ...` (LRA's input pipeline reads fields 0, 1 and 3).
//! The images of the metadata files, taken in batch order, split 80% / 10% / 10% into training,
//! validation and test, as LRA's pipeline splits them (`[:80%]`, `[80%:90%]`, `[90%:]`).
//!
//! Tokens are the grey values, id = value + 1 (vocabulary 257, as the Image task).

pub mod snakes;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::image::pixel_tokens;
use super::{Dataset, Example, write_atomic};
use crate::rng::Rng;
use snakes::SnakeParams;

/// Two classes: 1 when the two markers are joined by a path.
pub const N_CLASSES: usize = 2;

/// Images per `imgs/<batch>` folder and metadata file when generating.
const BATCH: usize = 1000;

/// How long the target paths are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Difficulty {
    /// Paths of 6 paddles (`curv_baseline`).
    Easy,
    /// Paths of 9 paddles (`curv_contour_length_9`).
    Intermediate,
    /// Paths of 14 paddles (`curv_contour_length_14`), LRA's Pathfinder and Path-X.
    Hard,
}

impl Difficulty {
    /// Paddles per target path.
    pub fn contour_length(self) -> usize {
        match self {
            Difficulty::Easy => 6,
            Difficulty::Intermediate => 9,
            Difficulty::Hard => 14,
        }
    }

    /// The folder of the released layout.
    pub fn folder(self) -> &'static str {
        match self {
            Difficulty::Easy => "curv_baseline",
            Difficulty::Intermediate => "curv_contour_length_9",
            Difficulty::Hard => "curv_contour_length_14",
        }
    }
}

/// `[data.pathfinder]`: the images a Pathfinder or Path-X run reads or generates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathfinderConfig {
    /// Image side in pixels: 32 or 64 (Pathfinder), 128 (Path-X).
    pub size: usize,
    /// Path length.
    pub difficulty: Difficulty,
    /// Images to generate when no `--data-dir` is given (split 80/10/10).
    pub n_images: usize,
    /// Generator seed.
    #[serde(default)]
    pub seed: u64,
}

impl PathfinderConfig {
    /// Checks the values; the error names the key.
    pub fn validate(&self) -> Result<()> {
        if SnakeParams::lra(self.size).is_none() {
            bail!(
                "`data.pathfinder.size` must be 32, 64 or 128 (LRA's resolutions), got {}",
                self.size
            );
        }
        crate::limits::check_size("data.pathfinder.n_images", self.n_images, false)?;
        if self.n_images < 10 {
            bail!(
                "`data.pathfinder.n_images` must be at least 10 (split 80/10/10), got {}",
                self.n_images
            );
        }
        Ok(())
    }

    /// The generated dataset's folder name under the cache: every setting that changes it.
    pub fn cache_name(&self) -> String {
        format!(
            "pathfinder{}-{}-n{}-seed{}-v1",
            self.size,
            self.difficulty.folder(),
            self.n_images,
            self.seed
        )
    }
}

/// Generates `config.n_images` images into `root/<difficulty folder>/` in the released layout
/// (with a [`super::MANIFEST`] of their SHA-256) and returns that folder. The images are written into a new staging folder beside it and
/// moved into place at the end, only where nothing is: an existing folder of that name that is
/// not empty is an error naming it (checked before anything is generated), and nothing else in
/// `root` is touched, so the other difficulties' folders can sit beside it as in LRA's release.
/// An interrupted or failed generation leaves no partial dataset behind.
pub fn write_dataset(root: &Path, config: &PathfinderConfig) -> Result<PathBuf> {
    config.validate()?;
    let params = SnakeParams::lra(config.size).expect("validated");
    let target = root.join(config.difficulty.folder());
    lra_runs::create_dir_whole(&target, |folder| {
        generate_into(folder, &params, config)?;
        super::write_manifest(folder)
    })?;
    Ok(target)
}

/// Writes the images and metadata files of a generated dataset into `folder`.
fn generate_into(folder: &Path, params: &SnakeParams, config: &PathfinderConfig) -> Result<()> {
    let batches: Vec<usize> = (0..config.n_images.div_ceil(BATCH)).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let work: Vec<&[usize]> = batches.chunks(batches.len().div_ceil(threads)).collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = work
            .into_iter()
            .map(|mine| {
                let (params, folder) = (params, folder);
                scope.spawn(move || -> Result<()> {
                    for &batch in mine {
                        let images = batch * BATCH..((batch + 1) * BATCH).min(config.n_images);
                        write_batch(folder, batch, images, params, config)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("generator thread panicked"))
    })
}

/// The image with index `i` of a generated dataset: its label alternates (balanced classes) and
/// its random draws depend only on the seed and `i`.
pub fn generate_image(
    params: &SnakeParams,
    config: &PathfinderConfig,
    i: usize,
) -> Result<snakes::PathfinderImage> {
    let mut rng = Rng::new(config.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i as u64);
    snakes::generate(params, config.difficulty.contour_length(), i % 2, &mut rng)
}

fn write_batch(
    folder: &Path,
    batch: usize,
    images: std::ops::Range<usize>,
    params: &SnakeParams,
    config: &PathfinderConfig,
) -> Result<()> {
    let sub = format!("imgs/{batch}");
    std::fs::create_dir_all(folder.join(&sub))
        .with_context(|| format!("cannot create {}", folder.join(&sub).display()))?;
    let mut metadata = String::new();
    let cl = config.difficulty.contour_length();
    for i in images {
        let image = generate_image(params, config, i)?;
        let name = format!("sample_{i}.png");
        write_atomic(
            &folder.join(&sub).join(&name),
            &png_bytes(&image.pixels, config.size, config.size)?,
        )?;
        // The script's fields: path, file, index, label, continuity, contour length, distractor
        // length, paddle length, thickness, margin, contrast count.
        metadata.push_str(&format!(
            "{sub} {name} {i} {} {} {cl} {} {} {} {} 1\n",
            image.label,
            params.continuity,
            params.distractor_length(cl),
            params.paddle_length,
            params.paddle_thickness,
            image.margin
        ));
    }
    write_atomic(
        &folder.join("metadata").join(format!("{batch}.npy")),
        metadata.as_bytes(),
    )
}

/// An 8-bit grey PNG of `width x height` pixels, encoded.
pub fn png_bytes(pixels: &[u8], width: usize, height: usize) -> Result<Vec<u8>> {
    let side = |n: usize| {
        u32::try_from(n).with_context(|| format!("a PNG side of {n} pixels is beyond the format"))
    };
    let mut bytes = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut bytes, side(width)?, side(height)?);
        encoder.set_color(png::ColorType::Grayscale);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header()?;
        writer.write_image_data(pixels)?;
    }
    Ok(bytes)
}

/// Reads a PNG of `side x side` pixels as 8-bit grey values (colour converted as the Image task
/// converts it). Another size is an error naming the file and both sizes, found from the header
/// before any pixel is decoded.
pub fn read_png(path: &Path, side: usize) -> Result<Vec<u8>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let bad = |e: png::DecodingError| anyhow::anyhow!("{}: unreadable PNG ({e})", path.display());
    let mut reader = decoder.read_info().map_err(bad)?;
    let (w, h) = (reader.info().width, reader.info().height);
    if (w as usize, h as usize) != (side, side) {
        bail!(
            "{}: {w} x {h} pixels, expected {side} x {side} (`data.pathfinder.size`)",
            path.display()
        );
    }
    let mut buffer = vec![0; reader.output_buffer_size().unwrap_or(0)];
    let info = reader.next_frame(&mut buffer).map_err(bad)?;
    let data = &buffer[..info.buffer_size()];
    let samples = info.color_type.samples();
    let pixels = match info.color_type {
        png::ColorType::Indexed => bail!("{}: an indexed PNG was not expanded", path.display()),
        png::ColorType::Grayscale | png::ColorType::GrayscaleAlpha => {
            data.chunks_exact(samples).map(|p| p[0]).collect()
        }
        png::ColorType::Rgb | png::ColorType::Rgba => (data.chunks_exact(samples))
            .map(|p| super::image::grey(p[0], p[1], p[2]))
            .collect(),
    };
    Ok(pixels)
}

/// The folder holding `metadata/`: `dir` itself, or its subfolder for `difficulty`.
fn difficulty_folder(dir: &Path, difficulty: Difficulty) -> Result<PathBuf> {
    super::expect_folder(
        dir,
        &format!(
            "LRA's Pathfinder layout: a folder holding {}/metadata/*.npy, or that folder itself",
            difficulty.folder()
        ),
    )?;
    for candidate in [dir.join(difficulty.folder()), dir.to_path_buf()] {
        if candidate.join("metadata").is_dir() {
            return Ok(candidate);
        }
    }
    bail!(
        "{}: no metadata/ folder here or in {}/ (LRA's Pathfinder layout)",
        dir.display(),
        difficulty.folder()
    )
}

/// Reads the images of one difficulty from the released layout under `dir` and splits them
/// 80/10/10 into training, validation and test.
pub fn read_splits(dir: &Path, config: &PathfinderConfig, max_len: usize) -> Result<[Dataset; 3]> {
    let folder = difficulty_folder(dir, config.difficulty)?;
    let pixels = config.size * config.size;
    if pixels > max_len {
        bail!(
            "`data.max_len` ({max_len}) is below the {pixels} pixels of a {0} x {0} image (an \
             image is never cut)",
            config.size
        );
    }
    let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(folder.join("metadata"))
        .with_context(|| format!("cannot read {}", folder.join("metadata").display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "npy"))
        .map(|p| {
            let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            (stem.parse().unwrap_or(u64::MAX), p)
        })
        .collect();
    files.sort();
    let mut examples = Vec::new();
    let mut listed = std::collections::HashMap::new();
    // Every image a metadata row names must be a file inside the dataset folder, judged after
    // resolving its path (`imgs/./0/x.png` and `imgs/0/x.png` are one image).
    let root = std::fs::canonicalize(&folder)
        .with_context(|| format!("cannot resolve {}", folder.display()))?;
    for (_, file) in &files {
        super::for_each_row(file, |number, row| {
            let at = |message: String| anyhow::anyhow!("{}:{number}: {message}", file.display());
            let text = String::from_utf8_lossy(row);
            let fields: Vec<&str> = text.split(' ').collect();
            if fields.len() < 4 {
                return Err(at(format!(
                    "expected at least 4 space-separated fields (folder, file, index, label), \
                     found {}",
                    fields.len()
                )));
            }
            let label = super::bytes::parse_label(fields[3].as_bytes(), N_CLASSES).map_err(at)?;
            let relative = Path::new(fields[0]).join(fields[1]);
            let path = super::resolve_inside(&root, &relative).map_err(|e| at(format!("{e:#}")))?;
            // An image listed twice would be trained on twice, or land in two splits.
            if let Some(first) = listed.insert(path.clone(), format!("{}:{number}", file.display()))
            {
                return Err(at(format!(
                    "{} {} is listed again (first at {first})",
                    super::shown(fields[0]),
                    super::shown(fields[1])
                )));
            }
            let grey = read_png(&path, config.size)?;
            examples.push(Example::new(pixel_tokens(&grey), label));
            Ok(())
        })?;
    }
    if examples.len() < 10 {
        bail!(
            "{}: {} images listed in metadata/*.npy; at least 10 are needed for an 80/10/10 split",
            folder.display(),
            examples.len()
        );
    }
    let n = examples.len();
    let (train_end, val_end) = (n * 8 / 10, n * 9 / 10);
    let test = examples.split_off(val_end);
    let val = examples.split_off(train_end);
    let name = |split: &str| format!("{} ({split})", folder.display());
    Ok([
        Dataset::new(name("train"), examples, N_CLASSES)?,
        Dataset::new(name("validation"), val, N_CLASSES)?,
        Dataset::new(name("test"), test, N_CLASSES)?,
    ])
}

/// A grid of images, `columns` across, each scaled `scale` times (nearest pixel) with a one-
/// pixel mid-grey border: width, height and pixels, for a PNG.
pub fn contact_sheet(
    images: &[Vec<u8>],
    side: usize,
    columns: usize,
    scale: usize,
) -> (usize, usize, Vec<u8>) {
    let rows = images.len().div_ceil(columns);
    let cell = side * scale + 2;
    let (w, h) = (columns * cell, rows * cell);
    let mut out = vec![128u8; w * h];
    for (k, image) in images.iter().enumerate() {
        let (top, left) = ((k / columns) * cell + 1, (k % columns) * cell + 1);
        for y in 0..side * scale {
            for x in 0..side * scale {
                out[(top + y) * w + left + x] = image[(y / scale) * side + x / scale];
            }
        }
    }
    (w, h, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::scratch_dir;

    fn config(n: usize) -> PathfinderConfig {
        PathfinderConfig {
            size: 32,
            difficulty: Difficulty::Easy,
            n_images: n,
            seed: 3,
        }
    }

    #[test]
    fn generated_layout_reads_back_balanced_and_split() {
        let root = scratch_dir("pf-layout").join("data");
        let cfg = config(20);
        write_dataset(&root, &cfg).unwrap();
        assert!(root.join("curv_baseline/imgs/0/sample_19.png").is_file());
        let meta = std::fs::read_to_string(root.join("curv_baseline/metadata/0.npy")).unwrap();
        assert!(
            meta.starts_with("imgs/0 sample_0.png 0 0 1 6 2 2 0.5 1 1\n"),
            "{meta}"
        );
        for dir in [root.clone(), root.join("curv_baseline")] {
            let [train, val, test] = read_splits(&dir, &cfg, 1024).unwrap();
            assert_eq!([train.len(), val.len(), test.len()], [16, 2, 2]);
            assert_eq!(train.label_counts(), vec![8, 8]);
            assert_eq!(test.label_counts(), vec![1, 1]);
            let png = read_png(&root.join("curv_baseline/imgs/0/sample_17.png"), 32).unwrap();
            assert_eq!(val.examples[1].tokens, pixel_tokens(&png));
        }
        // The same seed writes the same images.
        let again = scratch_dir("pf-layout-again").join("data");
        write_dataset(&again, &cfg).unwrap();
        let file = "curv_baseline/imgs/0/sample_7.png";
        assert_eq!(
            std::fs::read(root.join(file)).unwrap(),
            std::fs::read(again.join(file)).unwrap()
        );
        let err = format!("{:#}", read_splits(&root, &cfg, 1000).unwrap_err());
        assert!(
            err.contains("`data.max_len` (1000) is below the 1024 pixels"),
            "{err}"
        );
        std::fs::remove_dir_all(root.parent().unwrap()).unwrap();
        std::fs::remove_dir_all(again.parent().unwrap()).unwrap();
    }

    /// The generator writes only into a folder of its own: a non-empty target is refused before
    /// anything is drawn, a user's files beside it are untouched, and `--out .` writes the
    /// difficulty's folder and nothing else.
    #[test]
    fn generating_never_touches_what_is_there() {
        let root = scratch_dir("pf-owned");
        let cfg = config(10);
        std::fs::write(root.join("notes.txt"), b"mine").unwrap();
        let target = root.join("curv_baseline");
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(target.join("keep.png"), b"mine too").unwrap();
        let err = format!("{:#}", write_dataset(&root, &cfg).unwrap_err());
        assert!(
            err.ends_with("curv_baseline already exists and is not empty; it is left as it is (choose another path, or remove it first)"),
            "{err}"
        );
        assert_eq!(std::fs::read(target.join("keep.png")).unwrap(), b"mine too");
        std::fs::remove_dir_all(&target).unwrap();
        // Beside the user's file, and beside another difficulty's folder.
        let other = config(10);
        let hard = PathfinderConfig {
            difficulty: Difficulty::Hard,
            ..other
        };
        assert_eq!(write_dataset(&root, &cfg).unwrap(), target);
        write_dataset(&root, &hard).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["curv_baseline", "curv_contour_length_14", "notes.txt"]
        );
        assert_eq!(std::fs::read(root.join("notes.txt")).unwrap(), b"mine");
        // A second generation over a complete folder is refused; the folder stays whole.
        let before = std::fs::read(target.join("metadata/0.npy")).unwrap();
        write_dataset(&root, &cfg).unwrap_err();
        assert_eq!(
            std::fs::read(target.join("metadata/0.npy")).unwrap(),
            before
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// Metadata rows name files inside the dataset folder only, and an image is one image
    /// however its path is spelt: a path leading out of the folder, an absolute path, a folder
    /// and a missing file are refused naming the row; the same file spelt twice is a repeat.
    #[test]
    fn metadata_paths_stay_inside_the_dataset() {
        let root = scratch_dir("pf-paths");
        let cfg = config(10);
        write_dataset(&root.join("d"), &cfg).unwrap();
        let folder = root.join("d/curv_baseline");
        let meta = folder.join("metadata/0.npy");
        let original = std::fs::read_to_string(&meta).unwrap();
        let first = original.lines().next().unwrap().to_string();
        std::fs::write(
            root.join("outside.png"),
            png_bytes(&[0; 32 * 32], 32, 32).unwrap(),
        )
        .unwrap();
        let cases = [
            ("../.. outside.png 0 1", "leads outside the dataset folder"),
            ("/ etc/passwd 0 1", "is an absolute path"),
            ("imgs 0 0 1", "is not a regular file"),
            ("imgs/0 nope.png 0 1", "cannot be found"),
            (
                &first.replacen("imgs/0", "imgs/./0", 1)[..],
                "is listed again",
            ),
        ];
        for (row, says) in cases {
            std::fs::write(&meta, format!("{original}{row}\n")).unwrap();
            let err = format!("{:#}", read_splits(&folder, &cfg, 1024).unwrap_err());
            assert!(err.contains(says) && err.contains("0.npy:"), "{row}: {err}");
            assert_eq!(err.lines().count(), 1, "{err}");
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn bad_layouts_name_file_and_line() {
        let root = scratch_dir("pf-bad");
        let cfg = config(10);
        write_dataset(&root.join("d"), &cfg).unwrap();
        let folder = root.join("d/curv_baseline");
        let meta = folder.join("metadata/0.npy");
        let original = std::fs::read_to_string(&meta).unwrap();
        // A label out of range on line 3.
        let lines: Vec<String> = original.lines().map(String::from).collect();
        let mut edited = lines.clone();
        edited[2] = edited[2].replacen(" 2 0 ", " 2 7 ", 1);
        std::fs::write(&meta, edited.join("\n")).unwrap();
        let err = format!("{:#}", read_splits(&folder, &cfg, 1024).unwrap_err());
        assert!(
            err.ends_with("metadata/0.npy:3: label `7` is out of range (expected 0..1)"),
            "{err}"
        );
        // A short line.
        std::fs::write(&meta, "imgs/0 sample_0.png\n").unwrap();
        let err = format!("{:#}", read_splits(&folder, &cfg, 1024).unwrap_err());
        assert!(err.contains("0.npy:1: expected at least 4"), "{err}");
        // A PNG of the wrong size.
        std::fs::write(&meta, &original).unwrap();
        std::fs::write(
            folder.join("imgs/0/sample_4.png"),
            png_bytes(&[0; 28 * 28], 28, 28).unwrap(),
        )
        .unwrap();
        let err = format!("{:#}", read_splits(&folder, &cfg, 1024).unwrap_err());
        assert!(
            err.ends_with(
                "sample_4.png: 28 x 28 pixels, expected 32 x 32 (`data.pathfinder.size`)"
            ),
            "{err}"
        );
        // Not a PNG.
        std::fs::write(folder.join("imgs/0/sample_4.png"), b"GIF89a").unwrap();
        let err = format!("{:#}", read_splits(&folder, &cfg, 1024).unwrap_err());
        assert!(err.contains("sample_4.png: unreadable PNG"), "{err}");
        let err = format!("{:#}", read_splits(&root, &cfg, 1024).unwrap_err());
        assert!(err.contains("no metadata/ folder"), "{err}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn colour_pngs_are_read_as_grey() {
        let dir = scratch_dir("pf-rgb");
        let path = dir.join("rgb.png");
        let mut bytes = Vec::new();
        {
            let mut encoder = png::Encoder::new(&mut bytes, 2, 1);
            encoder.set_color(png::ColorType::Rgb);
            encoder.set_depth(png::BitDepth::Eight);
            let mut writer = encoder.write_header().unwrap();
            writer.write_image_data(&[255, 0, 0, 0, 0, 255]).unwrap();
        }
        std::fs::write(&path, bytes).unwrap();
        let err = format!("{:#}", read_png(&path, 2).unwrap_err());
        assert!(
            err.ends_with("rgb.png: 2 x 1 pixels, expected 2 x 2 (`data.pathfinder.size`)"),
            "{err}"
        );
        let mut bytes = Vec::new();
        {
            let mut encoder = png::Encoder::new(&mut bytes, 2, 2);
            encoder.set_color(png::ColorType::Rgb);
            encoder.set_depth(png::BitDepth::Eight);
            let mut writer = encoder.write_header().unwrap();
            writer
                .write_image_data(&[255, 0, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255])
                .unwrap();
        }
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(read_png(&path, 2).unwrap(), vec![76, 29, 0, 255]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
