//! Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology: Measuring and Improving
//! Recall in Efficient Language Models", arXiv 2312.04927): a sequence lists key-value pairs,
//! then asks for the values of its keys again, each at a later position.
//!
//! The construction is Zoology's (its `multiquery_ar` generator), with this harness's choices
//! where ours differs (docs/mqar.md says why):
//! - token 0 is padding here, so keys come from `[1, V/2)` and values from `[V/2, V)` as in
//!   Zoology, and every position that is neither a pair nor a query holds a random token of
//!   `[1, V)` (Zoology's default, `random_non_queries`, draws from `[0, V)`);
//! - the `n_pairs` pairs fill positions `0..2·n_pairs` (key, then its value); the rest of the
//!   sequence is `(n - 2·n_pairs) / 2` slots of two positions, and each key is queried once, at
//!   the first position of a slot drawn without replacement with probability proportional to
//!   `g^(a-1)` for the slot's gap `g = 1, 2, ...` (Zoology's power law, `a = power_a`);
//! - the target at a query is the value that followed that key; the next position does not
//!   give it away (it holds a random token), so bidirectional attention cannot read the answer
//!   and every model is trained on the same data. Positions without a query have no target.
//!
//! Generated splits are written to the cache as `{train,val,test}.tsv` with a checksum manifest,
//! as ListOps' are: one example a line, `tokens<TAB>targets`, both space-separated ids, a target
//! of 0 meaning none.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Result, bail};
use lra_runs::write_atomic;
use serde::{Deserialize, Serialize};

use super::{Dataset, Example};
use crate::rng::Rng;

/// The split files of a generated dataset.
pub const SPLIT_FILES: [&str; 3] = ["train.tsv", "val.tsv", "test.tsv"];

/// `[data.mqar]`: the generator's settings. The sequence length is `data.max_len`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqarConfig {
    /// Vocabulary size `V`, padding included: keys are `1..V/2`, values `V/2..V`.
    pub vocab_size: usize,
    /// Key-value pairs per sequence; each key is queried once.
    pub n_pairs: usize,
    /// Training examples.
    pub n_train: usize,
    /// Validation examples.
    pub n_val: usize,
    /// Test examples.
    pub n_test: usize,
    /// Generator seed (the test split is drawn after the others from the same stream).
    pub seed: u64,
    /// Power `a` of the query gaps' law, `p(g) ∝ g^(a-1)`: small `a` puts queries soon after
    /// the pairs, 1 spreads them uniformly (Zoology: 0.01).
    #[serde(default = "default_power_a")]
    pub power_a: f64,
}

fn default_power_a() -> f64 {
    0.01
}

impl MqarConfig {
    /// Checks the settings against the sequence length `len` (`data.max_len`); the error names
    /// the key.
    pub fn validate(&self, len: usize) -> Result<()> {
        for (key, n) in [
            ("n_pairs", self.n_pairs),
            ("n_train", self.n_train),
            ("n_val", self.n_val),
            ("n_test", self.n_test),
        ] {
            crate::limits::check_size(&format!("data.mqar.{key}"), n, true)?;
        }
        if !(4..=usize::from(u16::MAX) + 1).contains(&self.vocab_size) {
            bail!(
                "`data.mqar.vocab_size` must be between 4 and 65536 (ids are 16-bit), got {}",
                self.vocab_size
            );
        }
        let keys = self.vocab_size / 2 - 1;
        if self.n_pairs > keys {
            bail!(
                "`data.mqar.n_pairs` ({}) must be at most the {keys} keys of a vocabulary of {} \
                 (keys are distinct within a sequence)",
                self.n_pairs,
                self.vocab_size
            );
        }
        let needed = self.n_pairs.saturating_mul(4);
        if !len.is_multiple_of(2) || len < needed {
            bail!(
                "`data.max_len` ({len}), the MQAR sequence length, must be even and at least 4 × \
                 `data.mqar.n_pairs` ({needed}): the pairs, then a slot of two positions per query"
            );
        }
        if !(self.power_a.is_finite() && self.power_a > 0.0) {
            bail!(
                "`data.mqar.power_a` must be finite and > 0, got {}",
                self.power_a
            );
        }
        Ok(())
    }

    /// The cache folder's name, which every setting of the dataset and the length `len` enter.
    pub fn cache_name(&self, len: usize) -> String {
        format!(
            "mqar-s{}-v{}-n{len}-p{}-a{}-{}-{}-{}",
            self.seed,
            self.vocab_size,
            self.n_pairs,
            self.power_a,
            self.n_train,
            self.n_val,
            self.n_test
        )
    }
}

/// One MQAR sequence of length `len`: its tokens and, at each query, the value to recall.
pub fn example(cfg: &MqarConfig, len: usize, rng: &mut Rng) -> Example {
    let (v, p) = (cfg.vocab_size, cfg.n_pairs);
    let half = v / 2;
    let keys = distinct(rng, 1, half, p);
    let values = distinct(rng, half, v, p);
    // Filler everywhere, then the pairs, then the queries over it.
    let mut tokens: Vec<u16> = (0..len)
        .map(|_| rng.range_inclusive(1, v - 1) as u16)
        .collect();
    let mut targets = vec![0u16; len];
    for (i, (&key, &value)) in keys.iter().zip(&values).enumerate() {
        tokens[2 * i] = key;
        tokens[2 * i + 1] = value;
    }
    let context = 2 * p;
    let gaps = power_law_gaps(rng, (len - context) / 2, p, cfg.power_a);
    for ((&key, &value), gap) in keys.iter().zip(&values).zip(gaps) {
        let at = context + 2 * gap;
        tokens[at] = key;
        targets[at] = value;
    }
    Example::with_targets(tokens, targets)
}

/// `count` distinct integers of `[lo, hi)`, in the order drawn (a partial Fisher-Yates).
fn distinct(rng: &mut Rng, lo: usize, hi: usize, count: usize) -> Vec<u16> {
    let mut pool: Vec<u16> = (lo..hi).map(|t| t as u16).collect();
    for i in 0..count {
        let j = i + rng.below(pool.len() - i);
        pool.swap(i, j);
    }
    pool.truncate(count);
    pool
}

/// `count` distinct slots of `0..space`, drawn one after another without replacement, slot `s`
/// with probability proportional to `(s + 1)^(a - 1)` among those left (numpy's
/// `choice(replace=False, p=...)`, which Zoology uses, draws the same way).
fn power_law_gaps(rng: &mut Rng, space: usize, count: usize, a: f64) -> Vec<usize> {
    let mut weights: Vec<f64> = (1..=space).map(|g| (g as f64).powf(a - 1.0)).collect();
    let mut chosen = Vec::with_capacity(count);
    for _ in 0..count {
        let total: f64 = weights.iter().sum();
        let mut u = rng.uniform() * total;
        // The last slot still in play takes what rounding leaves.
        let mut pick = weights.iter().rposition(|&w| w > 0.0).expect("a slot left");
        for (slot, &w) in weights.iter().enumerate() {
            if w > 0.0 && u < w {
                pick = slot;
                break;
            }
            u -= w;
        }
        weights[pick] = 0.0;
        chosen.push(pick);
    }
    chosen
}

/// The three splits `cfg` describes, at length `len`: train, validation and test, drawn in
/// that order from one generator.
pub fn generate(cfg: &MqarConfig, len: usize) -> Result<[Vec<Example>; 3]> {
    cfg.validate(len)?;
    let mut rng = Rng::new(cfg.seed);
    let mut split = |n: usize| (0..n).map(|_| example(cfg, len, &mut rng)).collect();
    Ok([split(cfg.n_train), split(cfg.n_val), split(cfg.n_test)])
}

/// Generates the splits into the cache folder `dir`, published whole with its manifest.
pub fn write_dataset(dir: &Path, cfg: &MqarConfig, len: usize) -> Result<()> {
    lra_runs::create_dir_whole(dir, |staging| {
        for (file, examples) in SPLIT_FILES.iter().zip(generate(cfg, len)?) {
            write_atomic(&staging.join(file), split_text(&examples).as_bytes())?;
        }
        crate::data::write_manifest(staging)
    })
}

/// A split as its file holds it.
fn split_text(examples: &[Example]) -> String {
    let mut text = String::new();
    for e in examples {
        let ids = |ids: &[u16]| {
            let words: Vec<String> = ids.iter().map(u16::to_string).collect();
            words.join(" ")
        };
        let targets = e.targets.as_deref().unwrap_or(&[]);
        writeln!(text, "{}\t{}", ids(&e.tokens), ids(targets)).expect("writing to a String");
    }
    text
}

/// Reads one split file: every line `tokens<TAB>targets` of equal lengths, ids below
/// `vocab_size`, tokens never 0 (padding), at least one target; errors name the file and line.
pub fn read_split(path: &Path, vocab_size: usize) -> Result<Dataset> {
    let mut examples = Vec::new();
    crate::data::for_each_row(path, |line, row| {
        let at = |what: String| anyhow::anyhow!("{}:{line}: {what}", path.display());
        let text = std::str::from_utf8(row).map_err(|_| at("not UTF-8".into()))?;
        let (tokens, targets) = text
            .split_once('\t')
            .ok_or_else(|| at("expected `tokens<TAB>targets`".into()))?;
        let parse = |field: &str, what: &str| -> Result<Vec<u16>> {
            field
                .split(' ')
                .map(|word| match word.parse::<u16>() {
                    Ok(id) if (id as usize) < vocab_size => Ok(id),
                    _ => Err(at(format!(
                        "{what} `{}` is not an id below the vocabulary size {vocab_size}",
                        crate::data::shown(word)
                    ))),
                })
                .collect()
        };
        let tokens = parse(tokens, "token")?;
        let targets = parse(targets, "target")?;
        if targets.len() != tokens.len() {
            return Err(at(format!(
                "{} tokens but {} targets",
                tokens.len(),
                targets.len()
            )));
        }
        if tokens.contains(&0) {
            return Err(at(
                "token 0 is padding and cannot be part of a sequence".into()
            ));
        }
        if targets.iter().all(|&t| t == 0) {
            return Err(at("no position has a target".into()));
        }
        examples.push(Example::with_targets(tokens, targets));
        Ok(())
    })?;
    Dataset::new(path.display().to_string(), examples, vocab_size)
}

/// Reads the three splits from `dir`.
pub fn read_splits(dir: &Path, vocab_size: usize) -> Result<[Dataset; 3]> {
    super::expect_folder(
        dir,
        &format!("an MQAR folder holding {}", SPLIT_FILES.join(", ")),
    )?;
    let [train, val, test] = SPLIT_FILES.map(|file| dir.join(file));
    Ok([
        read_split(&train, vocab_size)?,
        read_split(&val, vocab_size)?,
        read_split(&test, vocab_size)?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(n_pairs: usize) -> MqarConfig {
        MqarConfig {
            vocab_size: 64,
            n_pairs,
            n_train: 300,
            n_val: 20,
            n_test: 20,
            seed: 5,
            power_a: 0.01,
        }
    }

    /// Every generated example read back against the paper's definition: the pairs first (keys
    /// of the lower half, values of the upper, distinct), each key queried exactly once after
    /// the pairs, the target at a query the value that followed its key in the pairs, no target
    /// elsewhere, and the answer never in the input after its query.
    #[test]
    fn examples_follow_the_definition() {
        let (len, p) = (32, 4);
        let cfg = config(p);
        let [train, ..] = generate(&cfg, len).unwrap();
        for e in &train {
            let targets = e.targets.as_ref().unwrap();
            assert_eq!((e.tokens.len(), targets.len()), (len, len));
            assert!(e.tokens.iter().all(|&t| (1..64).contains(&t)));
            let pairs: Vec<(u16, u16)> = (0..p)
                .map(|i| (e.tokens[2 * i], e.tokens[2 * i + 1]))
                .collect();
            let mut keys: Vec<u16> = pairs.iter().map(|k| k.0).collect();
            keys.sort_unstable();
            keys.dedup();
            assert_eq!(keys.len(), p, "distinct keys");
            assert!(pairs.iter().all(|&(k, v)| k < 32 && v >= 32));
            let queries: Vec<usize> = (0..len).filter(|&i| targets[i] != 0).collect();
            assert_eq!(queries.len(), p, "each key queried once");
            for &q in &queries {
                assert!(
                    q >= 2 * p && (q - 2 * p).is_multiple_of(2),
                    "query at a slot start"
                );
                let (_, value) = pairs
                    .iter()
                    .find(|(k, _)| *k == e.tokens[q])
                    .expect("a key");
                assert_eq!(targets[q], *value);
            }
            let mut queried: Vec<u16> = queries.iter().map(|&q| e.tokens[q]).collect();
            queried.sort_unstable();
            assert_eq!(queried, keys);
        }
    }

    /// A hand-read example: two pairs in a sequence of 8 leave two slots, so both are queried,
    /// in an order the generator draws; every position is read against the definition.
    #[test]
    fn a_hand_read_example() {
        let cfg = MqarConfig {
            vocab_size: 8,
            n_pairs: 2,
            ..config(2)
        };
        let e = example(&cfg, 8, &mut Rng::new(0));
        let t = e.targets.as_ref().unwrap();
        // Keys of 1..4, values of 4..8, then two slots of two positions, one query each.
        let (k0, v0, k1, v1) = (e.tokens[0], e.tokens[1], e.tokens[2], e.tokens[3]);
        assert!(k0 < 4 && k1 < 4 && k0 != k1 && v0 >= 4 && v1 >= 4 && v0 != v1);
        assert_eq!(t[..4], [0, 0, 0, 0]);
        assert_eq!((t[5], t[7]), (0, 0));
        let recall = |q: usize| if e.tokens[q] == k0 { v0 } else { v1 };
        assert_eq!((t[4], t[6]), (recall(4), recall(6)));
        assert_ne!(e.tokens[4], e.tokens[6]);
    }

    /// The gaps follow the power law: with `a` = 0.01 the first slot is drawn first far more
    /// often than the last, and with `a` = 1 about as often (uniform).
    #[test]
    fn gaps_follow_the_power_law() {
        let mut rng = Rng::new(1);
        let first = |a: f64, rng: &mut Rng| {
            let draws: Vec<usize> = (0..4000)
                .map(|_| power_law_gaps(rng, 10, 1, a)[0])
                .collect();
            let count = |s| draws.iter().filter(|&&d| d == s).count() as f64;
            (count(0), count(9))
        };
        let (early, late) = first(0.01, &mut rng);
        // p(1) / p(10) = 10^0.99 ≈ 9.8.
        assert!((6.0..14.0).contains(&(early / late)), "{early} {late}");
        let (early, late) = first(1.0, &mut rng);
        assert!((0.7..1.4).contains(&(early / late)), "{early} {late}");
    }

    /// The cache reads back as generated, and bad lines are errors naming file and line.
    #[test]
    fn splits_read_back_and_bad_lines_are_named() {
        let dir = crate::data::scratch_dir("mqar");
        let cache = dir.join("cache");
        let cfg = config(2);
        write_dataset(&cache, &cfg, 16).unwrap();
        crate::data::verify_manifest(&cache).unwrap();
        let [train, val, test] = read_splits(&cache, 64).unwrap();
        let [g_train, g_val, g_test] = generate(&cfg, 16).unwrap();
        assert_eq!(train.examples, g_train);
        assert_eq!(val.examples, g_val);
        assert_eq!(test.examples, g_test);
        let bad = dir.join("bad.tsv");
        for (line, message) in [
            ("1 2 3\t0 0 0", "bad.tsv:2: no position has a target"),
            ("1 2 3\t0 5", "bad.tsv:2: 3 tokens but 2 targets"),
            ("1 0 3\t0 5 0", "bad.tsv:2: token 0 is padding"),
            ("1 99 3\t0 5 0", "bad.tsv:2: token `99` is not an id below"),
            ("1 2 3", "bad.tsv:2: expected `tokens<TAB>targets`"),
        ] {
            std::fs::write(&bad, format!("1 2 3\t0 5 0\n{line}\n")).unwrap();
            let err = format!("{:#}", read_split(&bad, 64).unwrap_err());
            assert!(err.contains(message), "{err}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A batch lists each scored position as `row · n + position` of the padded tokens, in
    /// order, with its target as the label.
    #[test]
    fn batches_list_the_scored_positions() {
        use burn::prelude::*;
        let a = Example::with_targets(vec![3, 4, 5, 6], vec![0, 9, 0, 8]);
        let b = Example::with_targets(vec![7, 8, 9, 10], vec![0, 0, 11, 0]);
        let batch = crate::data::Batch::new(&[&a, &b], &Device::flex());
        let ints = |t: Tensor<1, Int>| t.into_data().convert::<i64>().try_to_vec::<i64>().unwrap();
        assert_eq!(ints(batch.positions.unwrap()), [1, 3, 6]);
        assert_eq!(ints(batch.labels), [9, 8, 11]);
        let split = Dataset::new("s".into(), vec![a, b], 16).unwrap();
        assert_eq!(split.predictions(), 3);
        assert_eq!(split.label_counts()[8..12], [1, 1, 0, 1]);
        assert!((split.majority_rate() - 1.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn settings_are_checked_by_key() {
        let err = |cfg: MqarConfig, len| cfg.validate(len).unwrap_err().to_string();
        assert!(err(config(8), 30).contains("`data.max_len` (30)"));
        assert!(err(config(4), 15).contains("must be even"));
        assert!(err(config(40), 200).contains("`data.mqar.n_pairs` (40)"));
        let big = MqarConfig {
            vocab_size: 70_000,
            ..config(2)
        };
        assert!(err(big, 16).contains("`data.mqar.vocab_size`"));
        let flat = MqarConfig {
            power_a: 0.0,
            ..config(2)
        };
        assert!(err(flat, 16).contains("`data.mqar.power_a`"));
    }
}
