//! Byte-level text: IMDB reviews in the aclImdb layout (a directory or its `.tar.gz`, read
//! without unpacking), and a generic `label<TAB>text` corpus.
//!
//! Tokens are the UTF-8 bytes, id = byte + 1, 0 = padding (vocabulary 257; docs/lra.md).

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::{Dataset, Example, Splits, for_each_row};

/// Token vocabulary: 256 bytes and padding.
pub const VOCAB_SIZE: usize = 257;

/// The first `max_len` bytes of `bytes` as tokens (byte + 1).
pub fn byte_tokens(bytes: &[u8], max_len: usize) -> Vec<u16> {
    bytes.iter().take(max_len).map(|&b| b as u16 + 1).collect()
}

/// Reads a text corpus from `path`:
/// - a directory holding `train.tsv` and `test.tsv` (and optionally `val.tsv`): the generic
///   `label<TAB>text` format;
/// - the aclImdb layout: a directory with `train/{pos,neg}` and `test/{pos,neg}` (or one holding
///   `aclImdb/`), a `.tar.gz` of it, or a directory holding exactly one `.tar.gz`.
pub fn read_corpus(
    path: &Path,
    max_len: usize,
    n_classes: usize,
    max_archive_bytes: u64,
) -> Result<Splits> {
    if !path.exists() {
        bail!(
            "data path {} does not exist; expected {TEXT_LAYOUTS}",
            path.display()
        );
    }
    if path.is_dir() && path.join("train.tsv").is_file() {
        let read = |name: &str| read_labelled_tsv(&path.join(name), max_len, n_classes);
        let val = path.join("val.tsv");
        let train = read("train.tsv")?;
        let val = if val.is_file() {
            Some(read("val.tsv")?)
        } else {
            None
        };
        return Ok(Splits::new(train, val, read("test.tsv")?));
    }
    let [train, test] = read_imdb(path, max_len, max_archive_bytes)?;
    Ok(Splits::new(train, None, test))
}

/// Reads `label<TAB>text` lines (no header; the text is everything after the first tab, kept as
/// bytes). Labels are integers in `0..n_classes`.
pub fn read_labelled_tsv(path: &Path, max_len: usize, n_classes: usize) -> Result<Dataset> {
    let mut examples = Vec::new();
    for_each_row(path, |number, row| {
        let at = |message: String| anyhow::anyhow!("{}:{number}: {message}", path.display());
        let tab = row
            .iter()
            .position(|&b| b == b'\t')
            .ok_or_else(|| at("expected `label<TAB>text`, found no tab".into()))?;
        let label = parse_label(&row[..tab], n_classes).map_err(at)?;
        if row.len() == tab + 1 {
            return Err(at(
                "the text is empty (an example needs at least one byte)".into()
            ));
        }
        examples.push(Example::new(byte_tokens(&row[tab + 1..], max_len), label));
        Ok(())
    })?;
    Dataset::new(path.display().to_string(), examples, n_classes)
}

/// Parses a class label: an integer, or a float with no fractional part (AAN writes `1.0`).
pub fn parse_label(field: &[u8], n_classes: usize) -> Result<usize, String> {
    let text = String::from_utf8_lossy(field);
    let text = text.trim();
    let value: f64 = text
        .parse()
        .map_err(|_| format!("label `{}` is not a number", super::shown(text)))?;
    if value.fract() != 0.0 || value < 0.0 || value >= n_classes as f64 {
        return Err(format!(
            "label `{}` is out of range (expected 0..{})",
            super::shown(text),
            n_classes - 1
        ));
    }
    Ok(value as usize)
}

/// Where an aclImdb review sits: split (0 train, 1 test), label (0 neg, 1 pos), file name.
fn imdb_entry(path: &Path) -> Option<(usize, usize, String)> {
    let parts: Vec<&str> = path.iter().filter_map(|p| p.to_str()).collect();
    let [.., split, label, name] = parts.as_slice() else {
        return None;
    };
    if !name.ends_with(".txt") {
        return None;
    }
    let split = match *split {
        "train" => 0,
        "test" => 1,
        _ => return None,
    };
    let label = match *label {
        "neg" => 0,
        "pos" => 1,
        _ => return None,
    };
    Some((split, label, name.to_string()))
}

/// Reads IMDB's train and test splits (25,000 reviews each in the full corpus) from a directory
/// or a `.tar.gz`, streaming the archive (nothing is unpacked to disk). Reviews are ordered by
/// label and file name, whatever the archive's or directory's order. The archive may expand to
/// at most `max_archive_bytes` (`data.max_archive_bytes`), and must be whole: an archive cut
/// short (at a member boundary, without tar's end-of-archive blocks, or inside its gzip
/// stream) is an error, not a smaller corpus.
pub fn read_imdb(path: &Path, max_len: usize, max_archive_bytes: u64) -> Result<[Dataset; 2]> {
    let mut found: [Vec<(usize, String, Example)>; 2] = [Vec::new(), Vec::new()];
    let mut add = |entry: &Path, bytes: &[u8]| -> Result<()> {
        if let Some((split, label, name)) = imdb_entry(entry) {
            if bytes.is_empty() {
                bail!(
                    "{}: the review is empty (an example needs at least one byte)",
                    super::shown(&entry.display().to_string())
                );
            }
            found[split].push((
                label,
                name,
                Example::new(byte_tokens(bytes, max_len), label),
            ));
        }
        Ok(())
    };
    let source = match imdb_source(path)? {
        ImdbSource::Archive(archive) => {
            let file = File::open(&archive)
                .with_context(|| format!("cannot open {}", archive.display()))?;
            let expanded = super::CappedReader::new(
                flate2::read::GzDecoder::new(BufReader::new(file)),
                &archive,
                max_archive_bytes,
            );
            let mut tar = tar::Archive::new(expanded);
            // The tar reader's messages quote a damaged header's bytes, newlines included.
            let unreadable = |e: std::io::Error| {
                let e = super::shown(&e.to_string());
                anyhow::anyhow!("{}: unreadable archive ({e})", archive.display())
            };
            let mut bytes = Vec::new();
            for entry in tar.entries().map_err(unreadable)? {
                let mut entry = entry.map_err(unreadable)?;
                let entry_path = entry.path().map_err(unreadable)?.into_owned();
                if imdb_entry(&entry_path).is_none() {
                    continue;
                }
                bytes.clear();
                entry.read_to_end(&mut bytes).map_err(unreadable)?;
                add(&entry_path, &bytes).with_context(|| archive.display().to_string())?;
            }
            let mut expanded = tar.into_inner();
            if !expanded.ended_with_zero_block() {
                bail!(
                    "{}: the archive ends early (no end-of-archive marker after its last \
                     member): it was cut short; download it again",
                    archive.display()
                );
            }
            // The rest of the gzip stream: its own end and checksum.
            expanded.drain().map_err(unreadable)?;
            archive
        }
        ImdbSource::Directory(root) => {
            for split in ["train", "test"] {
                for label in ["neg", "pos"] {
                    let dir = root.join(split).join(label);
                    let entries = std::fs::read_dir(&dir)
                        .with_context(|| format!("cannot read directory {}", dir.display()))?;
                    for entry in entries {
                        let file = entry
                            .with_context(|| format!("cannot read directory {}", dir.display()))?
                            .path();
                        if imdb_entry(&file).is_none() {
                            continue;
                        }
                        let bytes = std::fs::read(&file)
                            .with_context(|| format!("cannot read {}", file.display()))?;
                        add(&file, &bytes)?;
                    }
                }
            }
            root
        }
    };
    let [train, test] = found.map(|mut reviews| {
        reviews.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        reviews.into_iter().map(|(.., e)| e).collect::<Vec<_>>()
    });
    let name = |split: &str| format!("{} ({split})", source.display());
    Ok([
        Dataset::new(name("train"), train, 2)?,
        Dataset::new(name("test"), test, 2)?,
    ])
}

enum ImdbSource {
    Archive(PathBuf),
    Directory(PathBuf),
}

/// What `--data-dir` may hold for the text task, for error messages.
const TEXT_LAYOUTS: &str = "a folder holding train.tsv and test.tsv, the aclImdb folders \
                            train/{pos,neg} and test/{pos,neg}, or an aclImdb .tar.gz";

/// Whether `path` starts with gzip's magic bytes.
fn is_gzip(path: &Path) -> Result<bool> {
    let mut magic = [0u8; 2];
    let mut file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let read = std::io::Read::read(&mut file, &mut magic)
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(read == 2 && magic == [0x1f, 0x8b])
}

fn imdb_source(path: &Path) -> Result<ImdbSource> {
    let is_archive = |p: &Path| {
        p.to_string_lossy().ends_with(".tar.gz") || p.extension().is_some_and(|e| e == "tgz")
    };
    if path.is_file() {
        if !is_gzip(path)? {
            bail!(
                "{} is a file but not a gzip archive; expected {TEXT_LAYOUTS}",
                path.display()
            );
        }
        return Ok(ImdbSource::Archive(path.to_path_buf()));
    }
    for root in [path.to_path_buf(), path.join("aclImdb")] {
        if root.join("train").is_dir() || root.join("test").is_dir() {
            return Ok(ImdbSource::Directory(root));
        }
    }
    let archives: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("cannot read directory {}", path.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && is_archive(p))
        .collect();
    match archives.as_slice() {
        [one] => Ok(ImdbSource::Archive(one.clone())),
        [] => bail!(
            "{}: no text data found; expected {TEXT_LAYOUTS}",
            path.display()
        ),
        _ => bail!(
            "{}: several .tar.gz archives; pass the one to read as --data-dir",
            path.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::scratch_dir;

    /// A small corpus in the aclImdb layout: (split, label folder, file name, text).
    const REVIEWS: [(&str, &str, &str, &str); 5] = [
        ("train", "pos", "1_9.txt", "Great film."),
        ("train", "neg", "2_1.txt", "Dull."),
        ("train", "neg", "0_2.txt", "Bad, \u{e9}p\u{e9}e."),
        ("test", "pos", "5_10.txt", "Loved it"),
        ("test", "neg", "7_3.txt", "No"),
    ];

    fn write_tree(root: &Path) {
        for (split, label, name, text) in REVIEWS {
            let dir = root.join("aclImdb").join(split).join(label);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(name), text).unwrap();
        }
        std::fs::write(root.join("aclImdb").join("README"), "not a review").unwrap();
    }

    fn write_archive(root: &Path, path: &Path) {
        let file = File::create(path).unwrap();
        let gz = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
        let mut tar = tar::Builder::new(gz);
        tar.append_dir_all("aclImdb", root.join("aclImdb")).unwrap();
        tar.into_inner().unwrap().finish().unwrap();
    }

    #[test]
    fn an_empty_review_is_named_in_folder_and_archive() {
        let root = scratch_dir("bytes-empty-review");
        write_tree(&root);
        std::fs::write(root.join("aclImdb/train/pos/3_8.txt"), "").unwrap();
        let err = format!(
            "{:#}",
            read_imdb(
                &root.join("aclImdb"),
                16,
                crate::data::DEFAULT_MAX_ARCHIVE_BYTES
            )
            .unwrap_err()
        );
        assert!(
            err.ends_with("3_8.txt: the review is empty (an example needs at least one byte)"),
            "{err}"
        );
        let archive = root.join("imdb.tar.gz");
        write_archive(&root, &archive);
        let err = format!(
            "{:#}",
            read_imdb(&archive, 16, crate::data::DEFAULT_MAX_ARCHIVE_BYTES).unwrap_err()
        );
        assert!(
            err.starts_with(&format!(
                "{}: aclImdb/train/pos/3_8.txt: the review is empty",
                archive.display()
            )),
            "{err}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// Expected tokens: the bytes plus one, cut to `max_len`; ordered by label, then file name.
    fn expected(split: &str, max_len: usize) -> Vec<Example> {
        let mut rows: Vec<_> = REVIEWS.iter().filter(|r| r.0 == split).collect();
        rows.sort_by_key(|r| (r.1 == "pos", r.2));
        rows.iter()
            .map(|r| {
                let tokens = r.3.bytes().take(max_len).map(|b| b as u16 + 1).collect();
                Example::new(tokens, usize::from(r.1 == "pos"))
            })
            .collect()
    }

    #[test]
    fn imdb_folder_and_archive_read_the_same_reviews() {
        let dir = scratch_dir("bytes-imdb");
        write_tree(&dir);
        let archive_dir = dir.join("archive");
        std::fs::create_dir_all(&archive_dir).unwrap();
        write_archive(&dir, &archive_dir.join("aclImdb_v1.tar.gz"));
        for source in [
            dir.clone(),
            dir.join("aclImdb"),
            archive_dir.clone(),
            archive_dir.join("aclImdb_v1.tar.gz"),
        ] {
            let [train, test] =
                read_imdb(&source, 6, crate::data::DEFAULT_MAX_ARCHIVE_BYTES).unwrap();
            assert_eq!(train.examples, expected("train", 6), "{}", source.display());
            assert_eq!(test.examples, expected("test", 6), "{}", source.display());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_text_inputs_are_named() {
        let dir = scratch_dir("bytes-bad");
        let err = |path: &Path| {
            format!(
                "{:#}",
                read_corpus(path, 8, 2, crate::data::DEFAULT_MAX_ARCHIVE_BYTES)
                    .err()
                    .unwrap()
            )
        };
        // Missing path.
        let missing = dir.join("nope");
        assert!(
            err(&missing).contains("does not exist"),
            "{}",
            err(&missing)
        );
        // A file that is not an archive (a TSV given as the data path): what was found, and
        // what was expected.
        let tsv = dir.join("train.tsv");
        std::fs::write(&tsv, b"1\tgreat film\n").unwrap();
        let e = err(&tsv);
        assert!(
            e.contains("train.tsv is a file but not a gzip archive; expected a folder"),
            "{e}"
        );
        // A gzip header followed by junk: an unreadable archive.
        let broken = dir.join("broken.tar.gz");
        std::fs::write(&broken, b"\x1f\x8b this is not gzip").unwrap();
        let e = err(&broken);
        assert!(
            e.contains("broken.tar.gz") && e.contains("unreadable archive"),
            "{e}"
        );
        // A tar header whose checksum field holds a newline: the reader's message quotes it,
        // and the error stays one line (a property test found it).
        let mut header = [0u8; 512];
        header[..25].copy_from_slice(b"aclImdb/train/neg/0_5.txt");
        header[148..156].copy_from_slice(b"00\n0724\0");
        let damaged = dir.join("damaged.tar.gz");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &header).unwrap();
        std::fs::write(&damaged, gz.finish().unwrap()).unwrap();
        let e = err(&damaged);
        assert!(
            e.contains("damaged.tar.gz: unreadable archive") && !e.contains('\n'),
            "{e}"
        );
        // A folder with no text data.
        let empty = dir.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        assert!(
            err(&empty).contains("no text data found"),
            "{}",
            err(&empty)
        );
        // TSV: malformed row, label out of range, empty split.
        let tsv = dir.join("tsv");
        std::fs::create_dir_all(&tsv).unwrap();
        std::fs::write(tsv.join("test.tsv"), "1\tfine\n").unwrap();
        std::fs::write(tsv.join("train.tsv"), "0\tgood\n1 no tab here\n").unwrap();
        let e = err(&tsv);
        assert!(e.contains("train.tsv:2") && e.contains("no tab"), "{e}");
        std::fs::write(tsv.join("train.tsv"), "0\tgood\n2\tthree classes?\n").unwrap();
        let e = err(&tsv);
        assert!(
            e.contains("train.tsv:2") && e.contains("out of range"),
            "{e}"
        );
        std::fs::write(tsv.join("train.tsv"), "\n").unwrap();
        let e = err(&tsv);
        assert!(e.contains("train.tsv") && e.contains("empty"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn labelled_tsv_keeps_tabs_inside_the_text() {
        let dir = scratch_dir("bytes-tsv");
        std::fs::write(dir.join("train.tsv"), "1\ta\tb\r\n0.0\tc\n").unwrap();
        std::fs::write(dir.join("test.tsv"), "0\tz\n").unwrap();
        let splits = read_corpus(&dir, 10, 2, crate::data::DEFAULT_MAX_ARCHIVE_BYTES).unwrap();
        assert_eq!(
            splits.train.examples,
            vec![
                Example::new(vec![b'a' as u16 + 1, 10, b'b' as u16 + 1], 1),
                Example::new(vec![b'c' as u16 + 1], 0)
            ]
        );
        assert!(splits.val.is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
