//! Images as pixel sequences (LRA's Image task): CIFAR-10's binary release and IDX files
//! (MNIST, Fashion-MNIST), read as grey-scale images flattened row by row.
//!
//! Tokens are the grey values, id = value + 1, 0 = padding (vocabulary 257: LRA's 256 pixel
//! values and the padding id every task here shares). Colour images are converted to grey as LRA
//! does (`tf.image.rgb_to_grayscale`, see [`grey`]).

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::{Dataset, Example};

/// Token vocabulary: 256 grey values and padding.
pub const VOCAB_SIZE: usize = 257;

/// Classes of CIFAR-10, MNIST and Fashion-MNIST.
pub const N_CLASSES: usize = 10;

/// CIFAR-10's training batches, in order, then its test batch.
pub const CIFAR_TRAIN_FILES: [&str; 5] = [
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
];
/// CIFAR-10's test batch.
pub const CIFAR_TEST_FILE: &str = "test_batch.bin";
/// The folder CIFAR-10's binary archive unpacks to.
pub const CIFAR_FOLDER: &str = "cifar-10-batches-bin";
/// One CIFAR-10 record: a label byte, then 1,024 red, 1,024 green and 1,024 blue bytes.
const CIFAR_RECORD: usize = 1 + 3 * 1024;

/// What `--data-dir` may hold for the image task, for error messages.
const IMAGE_LAYOUTS: &str = "CIFAR-10's binary release (cifar-10-batches-bin/ with \
                             data_batch_1..5.bin and test_batch.bin) or IDX files \
                             (train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, \
                             t10k-labels-idx1-ubyte, each optionally .gz)";

/// LRA's grey value of an RGB pixel: TensorFlow's `rgb_to_grayscale` on `uint8` images, i.e.
/// the luma `0.2989 R + 0.5870 G + 0.1140 B` of the values scaled to [0, 1], scaled back by
/// 255.5 and truncated (`convert_image_dtype`'s float-to-integer rule), in `f32` as there.
pub fn grey(r: u8, g: u8, b: u8) -> u8 {
    let luma = 0.2989f32 * (r as f32 / 255.0)
        + 0.5870f32 * (g as f32 / 255.0)
        + 0.1140f32 * (b as f32 / 255.0);
    (luma * 255.5).clamp(0.0, 255.0) as u8
}

/// The tokens of a grey image: value + 1, in row-major order.
pub fn pixel_tokens(pixels: &[u8]) -> Vec<u16> {
    pixels.iter().map(|&p| p as u16 + 1).collect()
}

/// The training and test images found in `dir` (CIFAR-10 or IDX), each refused when it has more
/// pixels than `max_len` (an image is never cut).
pub fn read_splits(dir: &Path, max_len: usize, max_archive_bytes: u64) -> Result<[Dataset; 2]> {
    super::expect_folder(dir, &format!("a folder holding {IMAGE_LAYOUTS}"))?;
    let splits = if let Some(cifar) = cifar_folder(dir) {
        let train = CIFAR_TRAIN_FILES
            .iter()
            .map(|f| read_cifar_batch(&cifar.join(f)))
            .collect::<Result<Vec<_>>>()?
            .concat();
        let test = read_cifar_batch(&cifar.join(CIFAR_TEST_FILE))?;
        [
            (format!("{} (train)", cifar.display()), train),
            (format!("{} (test)", cifar.display()), test),
        ]
    } else if let Some(train_images) = idx_file(dir, "train", "images-idx3") {
        let split = |prefix: &str, images: PathBuf| -> Result<(String, Vec<Example>)> {
            let labels = idx_file(dir, prefix, "labels-idx1").with_context(|| {
                format!(
                    "{}: no {prefix}-labels-idx1-ubyte[.gz] beside it",
                    images.display()
                )
            })?;
            Ok((
                images.display().to_string(),
                read_idx_pair(&images, &labels, max_archive_bytes)?,
            ))
        };
        let (test_prefix, test_images) = ["t10k", "test"]
            .into_iter()
            .find_map(|prefix| idx_file(dir, prefix, "images-idx3").map(|f| (prefix, f)))
            .with_context(|| {
                format!(
                    "{}: found train-images-idx3-ubyte but no t10k-images-idx3-ubyte[.gz]",
                    dir.display()
                )
            })?;
        [
            split("train", train_images)?,
            split(test_prefix, test_images)?,
        ]
    } else {
        bail!(
            "{}: no image data found; expected {IMAGE_LAYOUTS}",
            dir.display()
        );
    };
    let [train, test] = splits.map(|(source, examples)| {
        let pixels = examples.first().map_or(0, |e| e.tokens.len());
        if pixels > max_len {
            bail!(
                "{source}: images have {pixels} pixels but `data.max_len` is {max_len} (an image \
                 is a sequence of all its pixels and is never cut)"
            );
        }
        Dataset::new(source, examples, N_CLASSES)
    });
    Ok([train?, test?])
}

/// `dir/cifar-10-batches-bin`, or `dir` itself, when it holds CIFAR-10's first batch.
fn cifar_folder(dir: &Path) -> Option<PathBuf> {
    [dir.join(CIFAR_FOLDER), dir.to_path_buf()]
        .into_iter()
        .find(|d| d.join(CIFAR_TRAIN_FILES[0]).is_file())
}

/// `dir/<prefix>-<kind>-ubyte`, or the same with `.gz`, when present.
fn idx_file(dir: &Path, prefix: &str, kind: &str) -> Option<PathBuf> {
    let name = format!("{prefix}-{kind}-ubyte");
    [dir.join(&name), dir.join(format!("{name}.gz"))]
        .into_iter()
        .find(|p| p.is_file())
}

/// Reads one CIFAR-10 batch file: whole 3,073-byte records, labels 0-9, converted to grey.
pub fn read_cifar_batch(path: &Path) -> Result<Vec<Example>> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.is_empty() {
        bail!("{}: the file is empty", path.display());
    }
    if !bytes.len().is_multiple_of(CIFAR_RECORD) {
        bail!(
            "{}: truncated: {} bytes is not a whole number of {CIFAR_RECORD}-byte records \
             (record {} is cut short)",
            path.display(),
            bytes.len(),
            bytes.len() / CIFAR_RECORD + 1
        );
    }
    bytes
        .chunks_exact(CIFAR_RECORD)
        .enumerate()
        .map(|(i, record)| {
            let label = record[0] as usize;
            if label >= N_CLASSES {
                bail!(
                    "{}: record {}: label {label} is out of range (expected 0..{})",
                    path.display(),
                    i + 1,
                    N_CLASSES - 1
                );
            }
            let [r, g, b] = [0, 1, 2].map(|c| &record[1 + c * 1024..1 + (c + 1) * 1024]);
            let pixels: Vec<u8> = (0..1024).map(|p| grey(r[p], g[p], b[p])).collect();
            Ok(Example::new(pixel_tokens(&pixels), label))
        })
        .collect()
}

/// An IDX file's unsigned-byte contents: its dimensions and data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idx {
    /// Dimensions, outermost first (images: count, rows, columns; labels: count).
    pub dims: Vec<usize>,
    /// The values, row-major.
    pub data: Vec<u8>,
}

/// Reads an IDX file of unsigned bytes (`.gz` or not: read by its first bytes), checking that
/// the header's dimensions account for exactly the bytes that follow. The size the header
/// claims is computed with checked arithmetic and never allocated up front: the data are read
/// as they come, one byte past the claim at most, and a gzipped file expands to at most
/// `max_archive_bytes` (`data.max_archive_bytes`).
pub fn read_idx(path: &Path, max_archive_bytes: u64) -> Result<Idx> {
    let at = |message: String| anyhow::anyhow!("{}: {message}", path.display());
    let mut file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut magic = [0u8; 2];
    let gzip = file.read(&mut magic).is_ok_and(|n| n == 2) && magic == [0x1f, 0x8b];
    drop(file);
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut reader: Box<dyn Read> = if gzip {
        Box::new(super::CappedReader::new(
            flate2::read::GzDecoder::new(std::io::BufReader::new(file)),
            path,
            max_archive_bytes,
        ))
    } else {
        Box::new(std::io::BufReader::new(file))
    };
    let unreadable = |e: std::io::Error| {
        if gzip {
            at(format!("unreadable gzip data ({e})"))
        } else {
            at(format!("cannot read ({e})"))
        }
    };
    let mut header = Vec::new();
    (&mut reader)
        .take(4)
        .read_to_end(&mut header)
        .map_err(unreadable)?;
    let [0, 0, kind, n_dims] = header[..] else {
        return Err(if header.len() < 4 {
            at(format!(
                "not an IDX file ({} bytes; the header alone has 4)",
                header.len()
            ))
        } else {
            at("not an IDX file (the first two bytes of its magic number must be 0)".into())
        });
    };
    if kind != 0x08 {
        return Err(at(format!(
            "IDX data type 0x{kind:02x}; only unsigned bytes (0x08) are images or labels"
        )));
    }
    let mut dim_bytes = Vec::new();
    (&mut reader)
        .take(4 * n_dims as u64)
        .read_to_end(&mut dim_bytes)
        .map_err(unreadable)?;
    if dim_bytes.len() < 4 * n_dims as usize {
        return Err(at(format!(
            "the header announces {n_dims} dimensions but the file ends after {} bytes",
            4 + dim_bytes.len()
        )));
    }
    let dims: Vec<usize> = dim_bytes
        .chunks_exact(4)
        .map(|d| u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize)
        .collect();
    let shape = dims
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(" x ");
    let expected = dims
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .and_then(|n| u64::try_from(n).ok())
        .filter(|n| *n < u64::MAX)
        .ok_or_else(|| {
            at(format!(
                "the header says {shape}, more bytes than can be addressed"
            ))
        })?;
    let mut data = Vec::new();
    reader
        .take(expected + 1)
        .read_to_end(&mut data)
        .map_err(unreadable)?;
    if data.len() as u64 != expected {
        let found = if data.len() as u64 > expected {
            "more".to_string()
        } else {
            data.len().to_string()
        };
        return Err(at(format!(
            "the header says {shape} ({expected} bytes of data) but the file holds {found}"
        )));
    }
    Ok(Idx { dims, data })
}

/// Reads an IDX images file and its labels file into examples.
pub fn read_idx_pair(images: &Path, labels: &Path, max_archive_bytes: u64) -> Result<Vec<Example>> {
    let image_data = read_idx(images, max_archive_bytes)?;
    let [n, rows, cols] = image_data.dims[..] else {
        bail!(
            "{}: images need 3 dimensions (count, rows, columns), the header has {}",
            images.display(),
            image_data.dims.len()
        );
    };
    let label_data = read_idx(labels, max_archive_bytes)?;
    if label_data.dims != [n] {
        bail!(
            "{}: {} labels for {n} images in {}",
            labels.display(),
            label_data.dims.first().copied().unwrap_or(0),
            images.display()
        );
    }
    let size = rows * cols; // checked by read_idx: the product of the header's dimensions
    if size == 0 || n == 0 {
        bail!(
            "{}: the header says {n} images of {rows} x {cols} pixels; images need at least one \
             pixel, and a split at least one image",
            images.display()
        );
    }
    image_data
        .data
        .chunks_exact(size.max(1))
        .zip(&label_data.data)
        .enumerate()
        .map(|(i, (pixels, &label))| {
            if label as usize >= N_CLASSES {
                bail!(
                    "{}: label {} (record {}) is out of range (expected 0..{})",
                    labels.display(),
                    label,
                    i + 1,
                    N_CLASSES - 1
                );
            }
            Ok(Example::new(pixel_tokens(pixels), label as usize))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: u64 = crate::data::DEFAULT_MAX_ARCHIVE_BYTES;
    use crate::data::scratch_dir;

    /// A CIFAR-10 record: `label`, then each channel filled by `pixel(channel, index)`.
    fn cifar_record(label: u8, pixel: impl Fn(usize, usize) -> u8) -> Vec<u8> {
        let mut r = vec![label];
        for c in 0..3 {
            r.extend((0..1024).map(|p| pixel(c, p)));
        }
        r
    }

    fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut out = vec![0, 0, 0x08, dims.len() as u8];
        for d in dims {
            out.extend(d.to_be_bytes());
        }
        out.extend(data);
        out
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(bytes).unwrap();
        gz.finish().unwrap()
    }

    /// TensorFlow's values, computed by hand from the formula in float64: the truncation of
    /// 255.5 · (0.2989 r + 0.587 g + 0.114 b) / 255.
    #[test]
    fn grey_follows_tensorflow() {
        for (rgb, expected) in [
            ([0, 0, 0], 0),
            ([255, 255, 255], 255), // 255.5 · 0.9999 = 255.47
            ([255, 0, 0], 76),      // 255.5 · 0.2989 = 76.37
            ([0, 255, 0], 149),     // 149.98
            ([0, 0, 255], 29),      // 29.13
            ([10, 200, 30], 124),   // 255.5 · (2.989 + 117.4 + 3.42) / 255 = 124.05
        ] {
            let [r, g, b] = rgb;
            let f64_value =
                255.5 * (0.2989 * r as f64 + 0.587 * g as f64 + 0.114 * b as f64) / 255.0;
            let reference = f64_value.floor() as u8;
            assert_eq!(reference, expected, "{rgb:?}: f64 {f64_value}");
            assert_eq!(grey(r, g, b), expected, "{rgb:?}");
        }
    }

    #[test]
    fn cifar_batches_in_the_official_layout_load() {
        let root = scratch_dir("image-cifar");
        let dir = root.join(CIFAR_FOLDER);
        std::fs::create_dir_all(&dir).unwrap();
        // Batch k holds two records with labels k and 9 - k; pixel values encode the channel.
        for (k, file) in CIFAR_TRAIN_FILES.iter().enumerate() {
            let mut bytes = cifar_record(k as u8, |c, p| if c == 0 { (p % 256) as u8 } else { 0 });
            bytes.extend(cifar_record(
                9 - k as u8,
                |c, _| if c == 1 { 255 } else { 0 },
            ));
            std::fs::write(dir.join(file), bytes).unwrap();
        }
        std::fs::write(
            dir.join(CIFAR_TEST_FILE),
            cifar_record(3, |c, _| if c == 2 { 255 } else { 0 }),
        )
        .unwrap();
        for source in [root.clone(), dir.clone()] {
            let [train, test] = read_splits(&source, 1024, CAP).unwrap();
            assert_eq!(train.len(), 10);
            assert_eq!(test.len(), 1);
            let labels: Vec<usize> = train.examples.iter().map(|e| e.label).collect();
            assert_eq!(labels, vec![0, 9, 1, 8, 2, 7, 3, 6, 4, 5]);
            // Red ramp: grey of (p % 256, 0, 0), row-major, plus one.
            let first = &train.examples[0].tokens;
            assert_eq!(first.len(), 1024);
            assert_eq!(first[0], 1);
            assert_eq!(first[255], grey(255, 0, 0) as u16 + 1);
            assert_eq!(first[256 + 100], grey(100, 0, 0) as u16 + 1);
            assert!(train.examples[1].tokens.iter().all(|&t| t == 150));
            assert!(test.examples[0].tokens.iter().all(|&t| t == 30));
        }
        let err = format!("{:#}", read_splits(&dir, 784, CAP).unwrap_err());
        assert!(
            err.contains("images have 1024 pixels but `data.max_len` is 784"),
            "{err}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn bad_cifar_batches_name_file_and_record() {
        let dir = scratch_dir("image-cifar-bad");
        let path = dir.join("data_batch_1.bin");
        let mut bytes = cifar_record(1, |_, _| 0);
        bytes.extend(cifar_record(2, |_, _| 0));
        bytes.truncate(bytes.len() - 5);
        std::fs::write(&path, &bytes).unwrap();
        let err = format!("{:#}", read_cifar_batch(&path).unwrap_err());
        assert!(
            err.ends_with("data_batch_1.bin: truncated: 6141 bytes is not a whole number of 3073-byte records (record 2 is cut short)"),
            "{err}"
        );
        let mut bytes = cifar_record(1, |_, _| 0);
        bytes.extend(cifar_record(12, |_, _| 0));
        std::fs::write(&path, &bytes).unwrap();
        let err = format!("{:#}", read_cifar_batch(&path).unwrap_err());
        assert!(
            err.ends_with("data_batch_1.bin: record 2: label 12 is out of range (expected 0..9)"),
            "{err}"
        );
        // A folder with the first batch but not the others.
        let err = format!("{:#}", read_splits(&dir, 1024, CAP).unwrap_err());
        assert!(
            err.contains("data_batch_1.bin: record 2: label 12"),
            "{err}"
        );
        std::fs::write(&path, cifar_record(1, |_, _| 0)).unwrap();
        let err = format!("{:#}", read_splits(&dir, 1024, CAP).unwrap_err());
        assert!(
            err.contains("cannot read") && err.contains("data_batch_2.bin"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn idx_files_load_plain_and_gzipped() {
        let dir = scratch_dir("image-idx");
        // Three 2 x 3 images with labels 4, 0, 9.
        let pixels: Vec<u8> = (0..18).map(|i| (i * 14) as u8).collect();
        std::fs::write(
            dir.join("train-images-idx3-ubyte.gz"),
            gzip(&idx(&[3, 2, 3], &pixels)),
        )
        .unwrap();
        std::fs::write(dir.join("train-labels-idx1-ubyte"), idx(&[3], &[4, 0, 9])).unwrap();
        std::fs::write(dir.join("t10k-images-idx3-ubyte"), idx(&[1, 2, 3], &[7; 6])).unwrap();
        std::fs::write(
            dir.join("t10k-labels-idx1-ubyte.gz"),
            gzip(&idx(&[1], &[2])),
        )
        .unwrap();
        let [train, test] = read_splits(&dir, 6, CAP).unwrap();
        assert_eq!(train.len(), 3);
        assert_eq!(
            train.examples[1],
            Example::new((6..12).map(|i| i * 14 + 1).collect(), 0)
        );
        assert_eq!(train.label_counts()[4], 1);
        assert_eq!(test.examples, vec![Example::new(vec![8; 6], 2)]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_idx_files_are_named() {
        let dir = scratch_dir("image-idx-bad");
        let path = dir.join("train-images-idx3-ubyte");
        // The header says 3 images of 2 x 3, the data holds 17 bytes.
        std::fs::write(&path, idx(&[3, 2, 3], &[0; 17])).unwrap();
        let err = format!("{:#}", read_idx(&path, CAP).unwrap_err());
        assert!(
            err.ends_with("train-images-idx3-ubyte: the header says 3 x 2 x 3 (18 bytes of data) but the file holds 17"),
            "{err}"
        );
        std::fs::write(&path, [0, 0, 0x0d, 1, 0, 0, 0, 0]).unwrap();
        let err = format!("{:#}", read_idx(&path, CAP).unwrap_err());
        assert!(err.contains("IDX data type 0x0d"), "{err}");
        std::fs::write(&path, b"PK\x03\x04 not idx").unwrap();
        let err = format!("{:#}", read_idx(&path, CAP).unwrap_err());
        assert!(err.contains("not an IDX file"), "{err}");
        std::fs::write(&path, idx(&[2, 1, 2], &[0; 4])).unwrap();
        let labels = dir.join("train-labels-idx1-ubyte");
        std::fs::write(&labels, idx(&[2], &[1, 10])).unwrap();
        let err = format!("{:#}", read_idx_pair(&path, &labels, CAP).unwrap_err());
        assert!(
            err.ends_with(
                "train-labels-idx1-ubyte: label 10 (record 2) is out of range (expected 0..9)"
            ),
            "{err}"
        );
        std::fs::write(&labels, idx(&[3], &[1, 1, 1])).unwrap();
        let err = format!("{:#}", read_idx_pair(&path, &labels, CAP).unwrap_err());
        assert!(err.contains("3 labels for 2 images"), "{err}");
        // Dimensions whose product overflows, claimed in a header of a few bytes: refused by
        // checked arithmetic, with nothing allocated for them.
        std::fs::write(&path, idx(&[u32::MAX, u32::MAX, u32::MAX], &[0; 4])).unwrap();
        let err = format!("{:#}", read_idx(&path, CAP).unwrap_err());
        assert!(
            err.ends_with("the header says 4294967295 x 4294967295 x 4294967295, more bytes than can be addressed"),
            "{err}"
        );
        // A large claim, a short file: the claim is not allocated, the shortfall is named.
        std::fs::write(&path, idx(&[u32::MAX, 65_535], &[0; 4])).unwrap();
        let err = format!("{:#}", read_idx(&path, CAP).unwrap_err());
        assert!(err.ends_with("but the file holds 4"), "{err}");
        // More bytes than the header accounts for.
        std::fs::write(&path, idx(&[2, 1, 2], &[0; 9])).unwrap();
        let err = format!("{:#}", read_idx(&path, CAP).unwrap_err());
        assert!(
            err.ends_with("(4 bytes of data) but the file holds more"),
            "{err}"
        );
        // Images of no pixels.
        std::fs::write(&path, idx(&[2, 0, 5], &[])).unwrap();
        std::fs::write(&labels, idx(&[2], &[1, 1])).unwrap();
        let err = format!("{:#}", read_idx_pair(&path, &labels, CAP).unwrap_err());
        assert!(err.contains("2 images of 0 x 5 pixels"), "{err}");
        std::fs::write(&path, idx(&[2, 1, 2], &[0; 4])).unwrap();
        // No test files beside the training ones.
        std::fs::write(&labels, idx(&[2], &[1, 1])).unwrap();
        let err = format!("{:#}", read_splits(&dir, 8, CAP).unwrap_err());
        assert!(err.contains("no t10k-images-idx3-ubyte"), "{err}");
        let err = format!("{:#}", read_splits(&dir.join("nope"), 8, CAP).unwrap_err());
        assert!(err.contains("does not exist"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
