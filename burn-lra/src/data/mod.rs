//! Datasets: tokenized examples, splits and batching.

pub mod bpe;
pub mod bytes;
pub mod image;
pub mod listops;
pub mod loader;
pub mod matching;
pub mod mqar;
pub mod pathfinder;

use std::path::Path;

use anyhow::{Context, Result, bail};
use burn::prelude::*;

/// The three splits of a task, as every task's reader returns them.
#[derive(Debug, Clone)]
pub struct Splits {
    /// Training split.
    pub train: Dataset,
    /// Validation split (model selection); `None` when the test split is also the validation
    /// split (`data.validation = "test"`, LRA's choice for IMDB).
    pub val: Option<Dataset>,
    /// Test split (reported).
    pub test: Dataset,
    /// The BPE tokenizer the tokens come from: its cached file and contents (recorded in the
    /// run directory); `None` for the tasks' own tokens.
    pub tokenizer: Option<(std::path::PathBuf, String)>,
}

impl Splits {
    /// The splits a reader found (no tokenizer: the task's own tokens).
    pub fn new(train: Dataset, val: Option<Dataset>, test: Dataset) -> Self {
        Self {
            train,
            val,
            test,
            tokenizer: None,
        }
    }

    /// The split model selection uses.
    pub fn validation(&self) -> &Dataset {
        self.val.as_ref().unwrap_or(&self.test)
    }

    /// Examples in the train, validation and test splits.
    pub fn sizes(&self) -> [usize; 3] {
        [self.train.len(), self.validation().len(), self.test.len()]
    }

    /// The SHA-256 of every example of every split (tokens, second documents, labels), in hex:
    /// what the run trained and was measured on, recorded in `config.json` (`data_sha256`) so
    /// that a resume on other data is refused and `compare` compares data, not paths.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        let mut bytes = Vec::new();
        for split in [Some(&self.train), self.val.as_ref(), Some(&self.test)] {
            let Some(split) = split else {
                hash.update([0u8]);
                continue;
            };
            hash.update([1u8]);
            hash.update((split.len() as u64).to_le_bytes());
            for example in &split.examples {
                bytes.clear();
                bytes.extend((example.label as u64).to_le_bytes());
                // Targets enter only where there are some, so that the fingerprints of the
                // per-example tasks' data stay what they were before token-level tasks.
                let documents = std::iter::once(&example.tokens)
                    .chain(example.pair.as_ref())
                    .chain(example.targets.as_ref());
                for document in documents {
                    bytes.extend((document.len() as u64).to_le_bytes());
                    bytes.extend(document.iter().flat_map(|t| t.to_le_bytes()));
                }
                hash.update(&bytes);
            }
        }
        crate::checksum::to_hex(&hash.finalize())
    }
}

/// One tokenized example. Token id 0 is padding and never appears inside `tokens`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// Token ids, already cut to the task's maximum length.
    pub tokens: Vec<u16>,
    /// The second document of a matching pair.
    pub pair: Option<Vec<u16>>,
    /// Class index (tasks that predict per example; 0 where `targets` are given).
    pub label: usize,
    /// Token-level tasks: the token to predict at each position of `tokens`, 0 where a position
    /// has none.
    pub targets: Option<Vec<u16>>,
}

impl Example {
    /// A single-sequence example.
    pub fn new(tokens: Vec<u16>, label: usize) -> Self {
        Self {
            tokens,
            pair: None,
            label,
            targets: None,
        }
    }

    /// An example of a token-level task: `targets[i]` is the token to predict at position `i`,
    /// 0 for none (as long as `tokens`).
    pub fn with_targets(tokens: Vec<u16>, targets: Vec<u16>) -> Self {
        Self {
            tokens,
            pair: None,
            label: 0,
            targets: Some(targets),
        }
    }

    /// The `(position, token)` of every target (none for a per-example task).
    pub fn scored(&self) -> impl Iterator<Item = (usize, u16)> + '_ {
        (self.targets.iter().flatten().enumerate())
            .filter(|(_, t)| **t != 0)
            .map(|(i, t)| (i, *t))
    }
}

/// A split of a task: its examples and class count.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Where it came from, for messages (a file path).
    pub source: String,
    /// The examples, in file order.
    pub examples: Vec<Example>,
    /// Number of classes of the task.
    pub n_classes: usize,
    /// What the reader found likely wrong but not fatal in the file (one sentence each; a run
    /// prints them and records them in `result.json`).
    pub warnings: Vec<String>,
}

impl Dataset {
    /// Builds a dataset, refusing an empty split.
    pub fn new(source: String, examples: Vec<Example>, n_classes: usize) -> Result<Self> {
        if examples.is_empty() {
            bail!("{source}: the split is empty");
        }
        Ok(Self {
            source,
            examples,
            n_classes,
            warnings: Vec::new(),
        })
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.examples.len()
    }

    /// Whether the split has no examples (never true for a constructed dataset).
    pub fn is_empty(&self) -> bool {
        self.examples.is_empty()
    }

    /// Predictions per class: examples per label, or for a token-level task targets per token.
    pub fn label_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.n_classes];
        for e in &self.examples {
            match e.targets {
                None => counts[e.label] += 1,
                Some(_) => e.scored().for_each(|(_, t)| counts[t as usize] += 1),
            }
        }
        counts
    }

    /// Share of the most frequent class among the predictions: the accuracy of always guessing
    /// it.
    pub fn majority_rate(&self) -> f64 {
        let counts = self.label_counts();
        let max = counts.iter().max().copied().unwrap_or(0);
        max as f64 / counts.iter().sum::<usize>().max(1) as f64
    }

    /// Predictions the split asks for: one per example, or one per target of a token-level
    /// task.
    pub fn predictions(&self) -> usize {
        (self.examples.iter())
            .map(|e| match e.targets {
                None => 1,
                Some(_) => e.scored().count(),
            })
            .sum()
    }

    /// Moves `n` examples, drawn by a fixed shuffle (seed 0), out of this split into a new one
    /// called `name` (a validation hold-out); the rest keep their order.
    pub fn split_off_holdout(&mut self, n: usize, name: &str) -> Result<Dataset> {
        if n >= self.len() {
            bail!(
                "{}: cannot hold out {n} of {} examples for validation",
                self.source,
                self.len()
            );
        }
        let mut order: Vec<usize> = (0..self.len()).collect();
        crate::rng::Rng::new(0).shuffle(&mut order);
        let mut held = vec![false; self.len()];
        order[self.len() - n..].iter().for_each(|&i| held[i] = true);
        let (mut kept, mut out) = (Vec::new(), Vec::new());
        for (example, held) in std::mem::take(&mut self.examples).into_iter().zip(held) {
            if held {
                out.push(example)
            } else {
                kept.push(example)
            }
        }
        self.examples = kept;
        Dataset::new(format!("{} ({name})", self.source), out, self.n_classes)
    }

    /// Longest example, in tokens.
    pub fn max_tokens(&self) -> usize {
        self.examples
            .iter()
            .map(|e| e.tokens.len())
            .max()
            .unwrap_or(0)
    }
}

/// Padded token ids and their padding mask, `[batch, n]` each.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// Token ids, 0 = padding.
    pub ids: Tensor<2, Int>,
    /// Padding mask, `true` = padding.
    pub mask_pad: Tensor<2, Bool>,
}

/// A batch on a device: tokens padded to the batch's longest example.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The (first) documents.
    pub tokens: Tokens,
    /// The second documents of matching pairs.
    pub pair: Option<Tokens>,
    /// Token-level tasks: where the model predicts, as flat indices `row · n + position` into
    /// the padded `[batch, n]` tokens, in order; `None` for per-example tasks.
    pub positions: Option<Tensor<1, Int>>,
    /// What the model should predict, one label per prediction: `[batch]` per example, or one
    /// per entry of `positions`.
    pub labels: Tensor<1, Int>,
}

/// A batch on the host, built where the examples are (the loader thread): padded ids and labels.
#[derive(Debug, Clone)]
pub struct HostBatch {
    tokens: TensorData,
    pair: Option<TensorData>,
    positions: Option<TensorData>,
    labels: TensorData,
}

fn pad(rows: &[&[u16]]) -> TensorData {
    let n = rows.iter().map(|r| r.len()).max().unwrap_or(0).max(1);
    let mut ids = vec![0i64; rows.len() * n];
    for (row, tokens) in rows.iter().enumerate() {
        for (j, &t) in tokens.iter().enumerate() {
            ids[row * n + j] = t as i64;
        }
    }
    TensorData::new(ids, [rows.len(), n])
}

impl HostBatch {
    /// Pads `examples` (each document to the longest of its kind in the batch) and lists what
    /// the model predicts: each example's label, or, for a token-level task (examples with
    /// targets), the target at each scored position.
    pub fn new(examples: &[&Example]) -> Self {
        let firsts: Vec<&[u16]> = examples.iter().map(|e| e.tokens.as_slice()).collect();
        let pair = examples
            .iter()
            .map(|e| e.pair.as_deref())
            .collect::<Option<Vec<&[u16]>>>()
            .map(|seconds| pad(&seconds));
        let tokens = pad(&firsts);
        let (positions, labels) = match examples.first().and_then(|e| e.targets.as_ref()) {
            None => {
                let labels: Vec<i64> = examples.iter().map(|e| e.label as i64).collect();
                (None, labels)
            }
            Some(_) => {
                let n = tokens.shape()[1];
                let (positions, labels): (Vec<i64>, Vec<i64>) = (examples.iter().enumerate())
                    .flat_map(|(row, e)| {
                        e.scored()
                            .map(move |(i, t)| ((row * n + i) as i64, t as i64))
                    })
                    .unzip();
                let count = positions.len();
                (Some(TensorData::new(positions, [count])), labels)
            }
        };
        let count = labels.len();
        Self {
            tokens,
            pair,
            positions,
            labels: TensorData::new(labels, [count]),
        }
    }

    /// Moves the batch to `device`.
    pub fn to_device(self, device: &Device) -> Batch {
        let tokens = |data: TensorData| {
            let ids = Tensor::<2, Int>::from_data(data, device);
            Tokens {
                mask_pad: ids.clone().equal_elem(0),
                ids,
            }
        };
        Batch {
            tokens: tokens(self.tokens),
            pair: self.pair.map(tokens),
            positions: (self.positions).map(|p| Tensor::<1, Int>::from_data(p, device)),
            labels: Tensor::<1, Int>::from_data(self.labels, device),
        }
    }
}

impl Batch {
    /// Pads `examples` and moves them to `device`.
    pub fn new(examples: &[&Example], device: &Device) -> Self {
        HostBatch::new(examples).to_device(device)
    }
}

/// A fresh, empty folder for a test, `<temp dir>/burn-lra-<name>-<process id>`.
#[cfg(test)]
pub(crate) fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("burn-lra-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The UTF-8 byte-order mark some editors put at the start of a text file.
const BYTE_ORDER_MARK: &[u8] = b"\xEF\xBB\xBF";

/// Calls `row(line_number, line)` for every non-empty line of `path`, as people save text: lines
/// end in LF, CRLF or a lone CR (old Mac editors), all three alike, and a UTF-8 byte-order mark
/// at the start of the file is not part of the first line. Lines are bytes (text fields are
/// tokenized as bytes, not decoded); line numbers count every line, empty ones included.
pub(crate) fn for_each_row(
    path: &Path,
    mut row: impl FnMut(usize, &[u8]) -> Result<()>,
) -> Result<()> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut reader = std::io::BufReader::new(file);
    let mut line = Vec::new();
    let mut after_cr = false;
    let mut number = 0;
    loop {
        line.clear();
        let more = read_line(&mut reader, &mut line, &mut after_cr)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if !more {
            return Ok(());
        }
        number += 1;
        let text = match number {
            1 => line.strip_prefix(BYTE_ORDER_MARK).unwrap_or(&line),
            _ => &line,
        };
        if !text.is_empty() {
            row(number, text)?;
        }
    }
}

/// Reads the next line, ended by LF, CR or CRLF, into `line` without its ending; `false` at the
/// end of the file. `after_cr` carries, from one call to the next, that the last line ended in
/// CR, so that an LF right after it (a CRLF split across reads) ends nothing.
fn read_line(
    reader: &mut impl std::io::BufRead,
    line: &mut Vec<u8>,
    after_cr: &mut bool,
) -> std::io::Result<bool> {
    let mut read_any = false;
    loop {
        let buffer = reader.fill_buf()?;
        if buffer.is_empty() {
            return Ok(read_any);
        }
        if std::mem::take(after_cr) && buffer[0] == b'\n' {
            reader.consume(1);
            continue;
        }
        match buffer.iter().position(|&b| b == b'\n' || b == b'\r') {
            Some(end) => {
                line.extend_from_slice(&buffer[..end]);
                *after_cr = buffer[end] == b'\r';
                reader.consume(end + 1);
                return Ok(true);
            }
            None => {
                let n = buffer.len();
                line.extend_from_slice(buffer);
                reader.consume(n);
                read_any = true;
            }
        }
    }
}

/// `text` as an error message shows a field: control characters, and the invisible ones
/// (byte-order marks, zero-width and directional marks, non-breaking and other unusual spaces,
/// soft hyphens), escaped as `\u{feff}`, `\t` and the like, so that what made a field wrong can
/// be seen.
pub fn shown(text: &str) -> String {
    let invisible = |c: char| {
        c.is_control()
            || (c.is_whitespace() && c != ' ')
            || matches!(
                c,
                '\u{00ad}'
                    | '\u{034f}'
                    | '\u{061c}'
                    | '\u{180e}'
                    | '\u{200b}'..='\u{200f}'
                    | '\u{202a}'..='\u{202e}'
                    | '\u{2060}'..='\u{2064}'
                    | '\u{2066}'..='\u{206f}'
                    | '\u{feff}'
                    | '\u{fff9}'..='\u{fffb}'
            )
    };
    text.chars()
        .map(|c| {
            if invisible(c) {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The manifest of a generated dataset: the SHA-256 of each of its files, by path relative to
/// its folder, written last into the staging folder.
pub const MANIFEST: &str = "checksums.json";

/// Writes the [`MANIFEST`] of the generated dataset in `dir`.
pub fn write_manifest(dir: &Path) -> Result<()> {
    crate::checksum::write_list(dir, MANIFEST)
}

/// Checks the generated dataset in `dir` against its [`MANIFEST`]: a missing manifest, a
/// missing, extra or changed file is an error naming it (the cache is the harness's, but it is
/// not removed unasked: the message says to remove it to generate it again).
pub fn verify_manifest(dir: &Path) -> Result<()> {
    let advice = format!("remove {} to generate it again", dir.display());
    let wording = crate::checksum::Wording {
        files: "the generated data",
        changed: "changed since it was generated",
        advice: &advice,
    };
    crate::checksum::verify_list(dir, MANIFEST, &wording).map(|_| ())
}

/// Checks that `dir` is a folder; the error says what was found (nothing, or a file) and what
/// was expected (`expected`, e.g. "a folder holding basic_train.tsv, ...").
pub fn expect_folder(dir: &Path, expected: &str) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if dir.exists() {
        anyhow::bail!("{} is a file; expected {expected}", dir.display());
    }
    anyhow::bail!("{} does not exist; expected {expected}", dir.display())
}

/// The file a data file names at `relative` (a path relative to the dataset folder `root`),
/// resolved: it must exist, be a regular file (links are followed, then judged) and stay inside
/// `root` (no `..` or link leading out of it). Returns the resolved path, by which duplicates
/// are judged (two spellings of one file resolve alike). `root` is resolved by the caller once
/// ([`std::fs::canonicalize`]). The error says which of these failed, without the file's
/// location (the caller prefixes the file and line that named it).
pub fn resolve_inside(root: &Path, relative: &Path) -> Result<std::path::PathBuf> {
    if relative.is_absolute() {
        bail!(
            "{} is an absolute path; a dataset's files are named relative to its folder",
            relative.display()
        );
    }
    let joined = root.join(relative);
    let resolved = std::fs::canonicalize(&joined)
        .with_context(|| format!("{} cannot be found", joined.display()))?;
    if !resolved.starts_with(root) {
        bail!(
            "{} leads outside the dataset folder {} (to {})",
            relative.display(),
            root.display(),
            resolved.display()
        );
    }
    if !resolved.is_file() {
        bail!("{} is not a regular file", joined.display());
    }
    Ok(resolved)
}

/// What a reader reports of repeated examples, as warnings (one sentence each): examples whose
/// tokens (both documents, for matching) repeat an earlier one of the same split, and examples
/// of the validation and test splits that also appear in training (a corpus listing a document
/// twice trains on it twice; one found in two splits is measured on what was trained).
pub fn repeated_examples(train: &Dataset, val: Option<&Dataset>, test: &Dataset) -> Vec<String> {
    use std::collections::HashSet;
    use std::hash::{Hash, Hasher};
    let key = |e: &Example| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        e.tokens.hash(&mut h);
        e.pair.hash(&mut h);
        h.finish()
    };
    let mut warnings = Vec::new();
    let mut seen_in_train = HashSet::new();
    for (name, split) in [
        ("training", Some(train)),
        ("validation", val),
        ("test", Some(test)),
    ] {
        let Some(split) = split else { continue };
        let mut seen = HashSet::new();
        let (mut repeats, mut in_train) = (0usize, 0usize);
        for example in &split.examples {
            let k = key(example);
            if !seen.insert(k) {
                repeats += 1;
            } else if name != "training" && seen_in_train.contains(&k) {
                in_train += 1;
            }
        }
        if repeats > 0 {
            warnings.push(format!(
                "{}: {repeats} of the {name} split's {} examples repeat an earlier one of the \
                 split",
                split.source,
                split.len()
            ));
        }
        if in_train > 0 {
            warnings.push(format!(
                "{}: {in_train} of the {name} split's {} examples also appear in the training \
                 split",
                split.source,
                split.len()
            ));
        }
        if name == "training" {
            seen_in_train = seen;
        }
    }
    warnings
}

/// The default of `data.max_archive_bytes`: how many bytes a compressed or archived data file
/// may expand to (4 GiB; the IMDB reviews' archive expands to about 0.5 GB).
pub const DEFAULT_MAX_ARCHIVE_BYTES: u64 = 4 << 30;

/// A reader over an archive's expanded bytes that refuses to give more than `limit` of them
/// (an archive that expands without end, or far beyond any dataset, is an error naming the
/// archive and `data.max_archive_bytes`), and keeps the last 512 bytes it gave, so that a tar
/// reader's end can be told from a cut archive's ([`Self::ended_with_zero_block`]).
pub struct CappedReader<R> {
    inner: R,
    archive: std::path::PathBuf,
    limit: u64,
    given: u64,
    tail: Vec<u8>,
}

impl<R: std::io::Read> CappedReader<R> {
    /// `inner`'s bytes, at most `limit`, for messages about `archive`.
    pub fn new(inner: R, archive: &Path, limit: u64) -> Self {
        Self {
            inner,
            archive: archive.to_path_buf(),
            limit,
            given: 0,
            tail: Vec::with_capacity(1024),
        }
    }

    /// Whether the last 512 bytes given were all zero: what a tar archive's end-of-archive
    /// marker leaves. A tar archive cut at a member boundary ends without it.
    pub fn ended_with_zero_block(&self) -> bool {
        self.tail.len() >= 512 && self.tail[self.tail.len() - 512..].iter().all(|&b| b == 0)
    }

    /// Reads and discards the rest of the stream (under the cap), so that a compressed stream's
    /// own end and checksum are checked.
    pub fn drain(&mut self) -> std::io::Result<()> {
        std::io::copy(self, &mut std::io::sink()).map(|_| ())
    }
}

impl<R: std::io::Read> std::io::Read for CappedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.given = self.given.saturating_add(n as u64);
        if self.given > self.limit {
            return Err(std::io::Error::other(format!(
                "{} expands past `data.max_archive_bytes` ({} bytes); raise it if the archive \
                 is genuine",
                self.archive.display(),
                self.limit
            )));
        }
        self.tail.extend_from_slice(&buf[..n]);
        if self.tail.len() > 1024 {
            self.tail.drain(..self.tail.len() - 512);
        }
        Ok(n)
    }
}

pub use lra_runs::write_atomic;

#[cfg(test)]
mod tests {
    use super::*;

    /// Repeats within a split and test or validation examples found in training are counted,
    /// naming the split; distinct examples say nothing.
    #[test]
    fn repeated_examples_are_counted_by_split() {
        let split = |name: &str, docs: &[&[u16]]| {
            let examples = docs.iter().map(|d| Example::new(d.to_vec(), 0)).collect();
            Dataset::new(name.into(), examples, 2).unwrap()
        };
        let train = split("train.tsv", &[&[1, 2], &[3], &[1, 2], &[1, 2]]);
        let test = split("test.tsv", &[&[3], &[4], &[5, 5]]);
        let warnings = repeated_examples(&train, None, &test);
        assert_eq!(
            warnings,
            [
                "train.tsv: 2 of the training split's 4 examples repeat an earlier one of the \
                 split",
                "test.tsv: 1 of the test split's 3 examples also appear in the training split",
            ]
        );
        let fresh = split("test.tsv", &[&[7], &[8]]);
        assert!(repeated_examples(&fresh, None, &split("t", &[&[9]])).is_empty());
    }

    /// The capped reader gives up to its cap and refuses past it, naming the archive and the
    /// key; it tells tar's end-of-archive blocks from an archive cut at a member.
    #[test]
    fn archives_expand_under_a_cap_and_must_end_whole() {
        use std::io::Read;
        let archive = Path::new("x.tar.gz");
        let mut out = Vec::new();
        let mut capped = CappedReader::new(&[7u8; 100][..], archive, 100);
        capped.read_to_end(&mut out).unwrap();
        assert_eq!(out.len(), 100);
        assert!(!capped.ended_with_zero_block());
        let err = CappedReader::new(&[7u8; 101][..], archive, 100)
            .read_to_end(&mut Vec::new())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("x.tar.gz expands past `data.max_archive_bytes` (100 bytes)"),
            "{err}"
        );
        let mut ended = vec![7u8; 600];
        ended.extend([0u8; 1024]);
        let mut capped = CappedReader::new(&ended[..], archive, 10_000);
        capped.read_to_end(&mut Vec::new()).unwrap();
        assert!(capped.ended_with_zero_block());
    }

    /// Every line ending people save with, mixed in one file and split across the reader's
    /// buffer (a CRLF whose two bytes land in different reads), and a byte-order mark: the
    /// same rows, numbered as an editor numbers them.
    #[test]
    fn rows_end_in_lf_crlf_or_cr_after_an_optional_byte_order_mark() {
        let dir = scratch_dir("rows");
        let path = dir.join("rows.tsv");
        // 12 bytes before it, so the CR after it is the last byte of an 8 KiB read.
        let long = "x".repeat(8179);
        let text = format!("\u{feff}a\r\nb\rc\n\r\n{long}\r\ne\rf");
        std::fs::write(&path, &text).unwrap();
        let mut rows = Vec::new();
        for_each_row(&path, |number, row| {
            rows.push((number, String::from_utf8(row.to_vec()).unwrap()));
            Ok(())
        })
        .unwrap();
        let expected: Vec<(usize, String)> = [
            (1, "a"),
            (2, "b"),
            (3, "c"),
            (5, long.as_str()),
            (6, "e"),
            (7, "f"),
        ]
        .into_iter()
        .map(|(n, s)| (n, s.to_string()))
        .collect();
        assert_eq!(rows, expected);
        // A mark anywhere but at the start of the file is data.
        std::fs::write(&path, "a\n\u{feff}b\n").unwrap();
        let mut second = Vec::new();
        for_each_row(&path, |_, row| {
            second.push(row.to_vec());
            Ok(())
        })
        .unwrap();
        assert_eq!(second[1], "\u{feff}b".as_bytes());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn invisible_characters_are_shown_escaped() {
        assert_eq!(shown("\u{feff}0"), "\\u{feff}0");
        assert_eq!(shown("a\tb\u{200b}c\u{a0}d"), "a\\tb\\u{200b}c\\u{a0}d");
        assert_eq!(shown("naïve 1.0"), "naïve 1.0");
    }
}
