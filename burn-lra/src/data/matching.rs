//! Byte-level document matching in LRA's AAN format, and a generator of small files in that
//! format.
//!
//! `new_aan_pairs.{train,eval,test}.tsv`: no header, no quoting, one pair per line,
//! `label<TAB>id1<TAB>id2<TAB>text1<TAB>text2`, the label written as a float (`1.0`). Each text is
//! cut to its first `doc_max_bytes` bytes (LRA: 10,000), then to the model's maximum length, and
//! tokenized as bytes ([`byte_tokens`]).
//!
//! The AAN files come with the LRA release (`lra_release.gz`, folder `tsv_data/`, from the
//! google-research/long-range-arena repository); they cannot be downloaded here.

use std::path::Path;

use anyhow::Result;

use super::bytes::{byte_tokens, parse_label};
use super::{Dataset, Example, for_each_row};
use crate::rng::Rng;

/// The three files, by split.
pub const SPLIT_FILES: [(&str, &str); 3] = [
    ("train", "new_aan_pairs.train.tsv"),
    ("val", "new_aan_pairs.eval.tsv"),
    ("test", "new_aan_pairs.test.tsv"),
];

/// Reads one AAN-format file.
pub fn read_tsv(path: &Path, max_len: usize, doc_max_bytes: usize) -> Result<Dataset> {
    let keep = max_len.min(doc_max_bytes);
    let mut examples = Vec::new();
    for_each_row(path, |number, row| {
        let at = |message: String| anyhow::anyhow!("{}:{number}: {message}", path.display());
        let fields: Vec<&[u8]> = row.split(|&b| b == b'\t').collect();
        let [label, _id1, _id2, text1, text2] = fields.as_slice() else {
            return Err(at(format!(
                "expected 5 tab-separated fields (label, id1, id2, text1, text2), found {}",
                fields.len()
            )));
        };
        let label = parse_label(label, 2).map_err(at)?;
        for (field, text) in [("text1", text1), ("text2", text2)] {
            if text.is_empty() {
                return Err(at(format!(
                    "{field} is empty (a document needs at least one byte)"
                )));
            }
        }
        examples.push(Example {
            pair: Some(byte_tokens(text2, keep)),
            ..Example::new(byte_tokens(text1, keep), label)
        });
        Ok(())
    })?;
    Dataset::new(path.display().to_string(), examples, 2)
}

/// Reads the three AAN files from `dir`.
pub fn read_splits(dir: &Path, max_len: usize, doc_max_bytes: usize) -> Result<[Dataset; 3]> {
    let files: Vec<&str> = SPLIT_FILES.iter().map(|(_, file)| *file).collect();
    super::expect_folder(dir, &format!("a folder holding {}", files.join(", ")))?;
    let read = |i: usize| read_tsv(&dir.join(SPLIT_FILES[i].1), max_len, doc_max_bytes);
    Ok([read(0)?, read(1)?, read(2)?])
}

/// Sizes and seed of a generated matching dataset.
#[derive(Debug, Clone, Copy)]
pub struct PairGeneratorConfig {
    /// Training pairs.
    pub n_train: usize,
    /// Validation pairs.
    pub n_val: usize,
    /// Test pairs.
    pub n_test: usize,
    /// Seed.
    pub seed: u64,
}

const TOPICS: usize = 8;

/// The fewest bytes a generated pair's row takes (two documents of at least 10 words of at
/// least 2 letters, their ids and the label).
const MIN_PAIR_BYTES: u64 = 64;

/// Writes a synthetic matching dataset in the AAN format into `dir`: documents of lowercase
/// words, each document on one of 8 topics (a topic draws most of its words' letters from its
/// own 6-letter alphabet); a pair is labelled 1 when both documents share a topic, 0 otherwise
/// (half each). Learnable from byte statistics, so a small model beats chance quickly: a
/// harness check, not a benchmark.
///
/// The three files are written only where nothing is: an existing one is an error naming it,
/// raised before anything is written, and nothing else in `dir` is touched.
pub fn generate(dir: &Path, cfg: &PairGeneratorConfig) -> Result<()> {
    for (flag, n, least) in [
        ("--n-train", cfg.n_train, 2),
        ("--n-val", cfg.n_val, 1),
        ("--n-test", cfg.n_test, 1),
    ] {
        if n < least {
            anyhow::bail!(
                "`{flag}` must be at least {least}{}, got {n}",
                if least == 2 {
                    " (pairs alternate between the two labels, and training needs both)"
                } else {
                    ""
                }
            );
        }
    }
    // Each split is written from memory: refused, before anything is generated, where its
    // rows alone (at least 64 bytes a pair: two documents of 10 words or more) cannot fit.
    let available = crate::memory::available_memory().unwrap_or(u64::MAX);
    for (flag, n) in [
        ("--n-train", cfg.n_train),
        ("--n-val", cfg.n_val),
        ("--n-test", cfg.n_test),
    ] {
        crate::limits::check_size(flag, n, true)?;
        if (n as u64).saturating_mul(MIN_PAIR_BYTES) > available {
            anyhow::bail!(
                "`{flag}` ({n}) is too large: its pairs alone (at least {MIN_PAIR_BYTES} bytes \
                 each) exceed the memory available"
            );
        }
    }
    if dir.exists() && !dir.is_dir() {
        anyhow::bail!(
            "{} is a file; expected a folder to write into",
            dir.display()
        );
    }
    for (_, file) in SPLIT_FILES {
        lra_runs::refuse_existing(&dir.join(file), "--out")?;
    }
    let mut rng = Rng::new(cfg.seed);
    let letters: Vec<u8> = (b'a'..=b'z').collect();
    let alphabets: Vec<Vec<u8>> = (0..TOPICS)
        .map(|_| {
            let mut l = letters.clone();
            rng.shuffle(&mut l);
            l[..6].to_vec()
        })
        .collect();
    let mut doc_id = 0usize;
    let mut document = |rng: &mut Rng, topic: usize| -> (String, String) {
        let words = rng.range_inclusive(10, 30);
        let mut text = String::new();
        for w in 0..words {
            if w > 0 {
                text.push(' ');
            }
            for _ in 0..rng.range_inclusive(2, 8) {
                let c = if rng.uniform() < 0.7 {
                    alphabets[topic][rng.below(6)]
                } else {
                    letters[rng.below(26)]
                };
                text.push(c as char);
            }
        }
        doc_id += 1;
        (format!("doc{doc_id}"), text)
    };
    for ((_, file), n) in SPLIT_FILES.iter().zip([cfg.n_train, cfg.n_val, cfg.n_test]) {
        let mut out = String::new();
        for i in 0..n {
            let label = i % 2;
            let topic_1 = rng.below(TOPICS);
            let topic_2 = if label == 1 {
                topic_1
            } else {
                (topic_1 + 1 + rng.below(TOPICS - 1)) % TOPICS
            };
            let (id1, text1) = document(&mut rng, topic_1);
            let (id2, text2) = document(&mut rng, topic_2);
            out.push_str(&format!("{label}.0\t{id1}\t{id2}\t{text1}\t{text2}\n"));
        }
        lra_runs::write_new(&dir.join(file), out.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::scratch_dir;

    #[test]
    fn aan_rows_are_cut_then_tokenized() {
        let dir = scratch_dir("aan-rows");
        let path = dir.join("pairs.tsv");
        std::fs::write(&path, "1.0\tid1\tid2\tabcdef\txy\n0\ta\tb\tq\trs\n").unwrap();
        // doc_max_bytes 4 then max_len 3: the first 3 bytes.
        let data = read_tsv(&path, 3, 4).unwrap();
        let t = |s: &str| s.bytes().map(|b| b as u16 + 1).collect::<Vec<_>>();
        assert_eq!(data.examples[0].tokens, t("abc"));
        assert_eq!(data.examples[0].pair, Some(t("xy")));
        assert_eq!(data.examples[0].label, 1);
        assert_eq!(data.examples[1].pair, Some(t("rs")));
        assert_eq!(read_tsv(&path, 10, 2).unwrap().examples[0].tokens, t("ab"));
        // A sixth column is not glued into the second document: the row is refused.
        std::fs::write(&path, "1\ta\tb\tq\tr\ts\n").unwrap();
        let err = format!("{:#}", read_tsv(&path, 10, 10).unwrap_err());
        assert!(err.ends_with("pairs.tsv:1: expected 5 tab-separated fields (label, id1, id2, text1, text2), found 6"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_aan_rows_are_named() {
        let dir = scratch_dir("aan-bad");
        let path = dir.join("pairs.tsv");
        std::fs::write(&path, "1.0\tid1\tid2\tabc\tdef\n1.0\tid1\tid2\tabc\n").unwrap();
        let e = format!("{:#}", read_tsv(&path, 8, 8).unwrap_err());
        assert!(
            e.contains("pairs.tsv:2") && e.contains("5 tab-separated fields"),
            "{e}"
        );
        std::fs::write(&path, "0.5\ta\tb\tc\td\n").unwrap();
        let e = format!("{:#}", read_tsv(&path, 8, 8).unwrap_err());
        assert!(
            e.contains("pairs.tsv:1") && e.contains("out of range"),
            "{e}"
        );
        let e = format!("{:#}", read_splits(&dir.join("none"), 8, 8).unwrap_err());
        assert!(e.contains("does not exist"), "{e}");
        // A file given where the folder of the three files is expected.
        let e = format!("{:#}", read_splits(&path, 8, 8).unwrap_err());
        assert!(
            e.contains("pairs.tsv is a file; expected a folder holding new_aan_pairs.train.tsv"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn generated_files_read_back_balanced() {
        let dir = scratch_dir("aan-gen");
        let cfg = PairGeneratorConfig {
            n_train: 40,
            n_val: 10,
            n_test: 20,
            seed: 3,
        };
        generate(&dir, &cfg).unwrap();
        let [train, val, test] = read_splits(&dir, 10_000, 10_000).unwrap();
        assert_eq!([train.len(), val.len(), test.len()], [40, 10, 20]);
        assert_eq!(train.label_counts(), vec![20, 20]);
        assert!(train.examples.iter().all(|e| e.pair.is_some()));
        // Generating again into the same folder is refused before anything is written; a
        // user's file in it and the files already there are untouched.
        std::fs::write(dir.join("notes.txt"), b"mine").unwrap();
        let before = std::fs::read(dir.join("new_aan_pairs.eval.tsv")).unwrap();
        let other = PairGeneratorConfig { seed: 4, ..cfg };
        let err = format!("{:#}", generate(&dir, &other).unwrap_err());
        assert!(
            err.ends_with("new_aan_pairs.train.tsv already exists; it is left as it is (choose another --out, or remove it first)"),
            "{err}"
        );
        assert_eq!(
            std::fs::read(dir.join("new_aan_pairs.eval.tsv")).unwrap(),
            before
        );
        assert_eq!(std::fs::read(dir.join("notes.txt")).unwrap(), b"mine");
        let err = generate(&dir.join("new"), &PairGeneratorConfig { n_train: 1, ..cfg });
        assert!(format!("{:#}", err.unwrap_err()).contains("`--n-train` must be at least 2"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
