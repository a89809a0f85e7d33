//! The ListOps generator, after `lra_benchmarks/data/listops.py`: operators MIN, MAX, MED (`int`
//! of the median), SM (sum mod 10) over digits 0-9; a node at depth below `max_depth` is a single
//! value with probability 0.75, else an operator with 2 to `max_args` (inclusive) arguments;
//! roots sit at depth 1; only trees with `min_length < length < max_length` are kept, without
//! duplicates. The original draws from an unseeded RNG; this one takes a seed, so a dataset is
//! reproducible.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use super::{Op, SPLIT_FILES};
use crate::data::write_atomic;
use crate::rng::Rng;

/// A ListOps expression tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tree {
    /// A digit.
    Value(u8),
    /// An operator over its arguments.
    Op(Op, Vec<Tree>),
}

impl Tree {
    /// The value of the expression.
    pub fn evaluate(&self) -> u8 {
        match self {
            Tree::Value(v) => *v,
            Tree::Op(op, args) => {
                let values: Vec<u8> = args.iter().map(Tree::evaluate).collect();
                op.apply(&values)
            }
        }
    }

    /// Length in LRA's sense: values plus two per operator (the operator and its `]`).
    pub fn length(&self) -> usize {
        match self {
            Tree::Value(_) => 1,
            Tree::Op(_, args) => 2 + args.iter().map(Tree::length).sum::<usize>(),
        }
    }

    /// LRA's printed form, nested pairs in parentheses: `( ( ( [MAX 2 ) 9 ) ] )`.
    pub fn to_lra_string(&self) -> String {
        let mut out = String::new();
        self.write_lra(&mut out);
        out
    }

    fn write_lra(&self, out: &mut String) {
        match self {
            Tree::Value(v) => write!(out, "{v}").expect("writing to a String"),
            Tree::Op(op, args) => {
                // ((op, a0), a1), ...), END): one "( " per argument and one for the close.
                for _ in 0..=args.len() {
                    out.push_str("( ");
                }
                out.push_str(op.token());
                for arg in args {
                    out.push(' ');
                    arg.write_lra(out);
                    out.push_str(" )");
                }
                out.push_str(" ] )");
            }
        }
    }
}

/// Parameters of the generator; the defaults are LRA's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GeneratorConfig {
    /// Keep trees strictly longer than this.
    pub min_length: usize,
    /// Keep trees strictly shorter than this.
    pub max_length: usize,
    /// Depth at which nodes are forced to be values.
    pub max_depth: usize,
    /// Most arguments per operator (inclusive).
    pub max_args: usize,
    /// Training examples.
    pub n_train: usize,
    /// Validation examples.
    pub n_val: usize,
    /// Test examples.
    pub n_test: usize,
    /// Seed of the dataset (independent of the training seed).
    pub seed: u64,
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        Self {
            min_length: 500,
            max_length: 2000,
            max_depth: 10,
            max_args: 10,
            n_train: 96_000,
            n_val: 2_000,
            n_test: 2_000,
            seed: 0,
        }
    }
}

impl GeneratorConfig {
    /// Checks the parameters; the error names the field.
    pub fn validate(&self) -> Result<()> {
        if self.max_args < 2 {
            bail!(
                "data.generate.max_args must be at least 2, got {}",
                self.max_args
            );
        }
        if self.max_depth < 2 {
            bail!(
                "data.generate.max_depth must be at least 2, got {}",
                self.max_depth
            );
        }
        if self.max_length <= self.min_length + 1 || self.max_length < 5 {
            bail!(
                "data.generate: no tree length lies strictly between min_length ({}) and \
                 max_length ({}); operators are at least 4 long",
                self.min_length,
                self.max_length
            );
        }
        for (name, n) in [
            ("n_train", self.n_train),
            ("n_val", self.n_val),
            ("n_test", self.n_test),
            ("min_length", self.min_length),
            ("max_length", self.max_length),
            ("max_depth", self.max_depth),
            ("max_args", self.max_args),
        ] {
            crate::limits::check_size(&format!("data.generate.{name}"), n, false)?;
        }
        for (name, n) in [
            ("n_train", self.n_train),
            ("n_val", self.n_val),
            ("n_test", self.n_test),
        ] {
            if n == 0 {
                bail!("data.generate.{name} must be at least 1");
            }
        }
        Ok(())
    }

    /// A directory name that identifies this dataset, for caching it.
    pub fn cache_name(&self) -> String {
        format!(
            "listops-s{}-len{}-{}-d{}-a{}-n{}-{}-{}",
            self.seed,
            self.min_length,
            self.max_length,
            self.max_depth,
            self.max_args,
            self.n_train,
            self.n_val,
            self.n_test
        )
    }
}

fn random_tree(rng: &mut Rng, depth: usize, cfg: &GeneratorConfig) -> Tree {
    let r = if depth < cfg.max_depth {
        rng.uniform()
    } else {
        1.0
    };
    if r > 0.25 {
        return Tree::Value(rng.below(10) as u8);
    }
    let n_args = rng.range_inclusive(2, cfg.max_args);
    let args = (0..n_args)
        .map(|_| random_tree(rng, depth + 1, cfg))
        .collect();
    let op = Op::ALL[rng.below(Op::ALL.len())];
    Tree::Op(op, args)
}

/// Generates distinct trees until the three splits are full: `(train, val, test)`, each a list
/// of `(expression, label)` in LRA's printed form.
pub fn generate(cfg: &GeneratorConfig) -> Result<[Vec<(String, u8)>; 3]> {
    cfg.validate()?;
    // Each count is at most 2^32 - 1 (validated), so their sum and the draw budget fit in 64
    // bits; memory is reserved as the trees come, not for the count asked for.
    let total = cfg.n_train + cfg.n_val + cfg.n_test;
    let mut rng = Rng::new(cfg.seed);
    let mut seen = HashSet::with_capacity(total.min(1 << 20));
    let mut rows = Vec::with_capacity(total.min(1 << 20));
    let max_draws = 10_000 + 2_000 * total as u64;
    let mut draws = 0u64;
    while rows.len() < total {
        draws += 1;
        if draws > max_draws {
            bail!(
                "data.generate: only {} distinct trees with {} < length < {} after {draws} draws; \
                 widen the length range or ask for fewer examples",
                rows.len(),
                cfg.min_length,
                cfg.max_length
            );
        }
        let tree = random_tree(&mut rng, 1, cfg);
        let len = tree.length();
        if len <= cfg.min_length || len >= cfg.max_length {
            continue;
        }
        let text = tree.to_lra_string();
        if seen.insert(text.clone()) {
            rows.push((text, tree.evaluate()));
        }
    }
    let test = rows.split_off(cfg.n_train + cfg.n_val);
    let val = rows.split_off(cfg.n_train);
    Ok([rows, val, test])
}

/// Generates the dataset `cfg` describes into the new folder `dir` (LRA's three files and their
/// [`crate::data::MANIFEST`]): written into a staging folder beside it and moved into place complete,
/// only where nothing is (an existing `dir` that is not an empty folder is an error naming it).
pub fn write_dataset(dir: &Path, cfg: &GeneratorConfig) -> Result<()> {
    lra_runs::create_dir_whole(dir, |staging| {
        write_splits(staging, &generate(cfg)?)?;
        crate::data::write_manifest(staging)
    })
}

/// Writes the generated splits as LRA's `basic_{train,val,test}.tsv` files in `dir`.
pub fn write_splits(dir: &Path, splits: &[Vec<(String, u8)>; 3]) -> Result<()> {
    for ((_, file), rows) in SPLIT_FILES.iter().zip(splits) {
        let mut text = String::from("Source\tTarget\n");
        for (expr, label) in rows {
            writeln!(text, "{expr}\t{label}").expect("writing to a String");
        }
        write_atomic(&dir.join(file), text.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::listops::{tokenize, value_of};

    fn small() -> GeneratorConfig {
        GeneratorConfig {
            min_length: 10,
            max_length: 60,
            n_train: 200,
            n_val: 20,
            n_test: 20,
            seed: 3,
            ..GeneratorConfig::default()
        }
    }

    /// The cache is written complete with its manifest, refused where a folder of that name
    /// holds anything, and checked at every use: a changed, added or missing file, or a missing
    /// manifest, is an error naming it.
    #[test]
    fn generated_cache_is_published_whole_and_verified() {
        use crate::data::{MANIFEST, scratch_dir, verify_manifest};
        let root = scratch_dir("listops-cache");
        let dir = root.join("cache");
        write_dataset(&dir, &small()).unwrap();
        verify_manifest(&dir).unwrap();
        let err = format!("{:#}", write_dataset(&dir, &small()).unwrap_err());
        assert!(
            err.contains("cache already exists and is not empty"),
            "{err}"
        );
        let test = dir.join("basic_test.tsv");
        let original = std::fs::read_to_string(&test).unwrap();
        std::fs::write(&test, original.replacen('\t', "\t\t", 1)).unwrap();
        let err = format!("{:#}", verify_manifest(&dir).unwrap_err());
        assert!(
            err.contains("basic_test.tsv: changed since it was generated")
                && err.ends_with("to generate it again"),
            "{err}"
        );
        std::fs::write(&test, &original).unwrap();
        std::fs::write(dir.join("extra.tsv"), b"x").unwrap();
        let err = format!("{:#}", verify_manifest(&dir).unwrap_err());
        assert!(err.contains("extra.tsv: not in checksums.json"), "{err}");
        std::fs::remove_file(dir.join("extra.tsv")).unwrap();
        std::fs::remove_file(&test).unwrap();
        let err = format!("{:#}", verify_manifest(&dir).unwrap_err());
        assert!(err.contains("basic_test.tsv is missing"), "{err}");
        std::fs::remove_file(dir.join(MANIFEST)).unwrap();
        let err = format!("{:#}", verify_manifest(&dir).unwrap_err());
        assert!(err.contains("checksums.json is missing"), "{err}");
        // Nothing but the cache was written beside it (its staging folder is gone).
        let names: Vec<_> = std::fs::read_dir(&root).unwrap().collect();
        assert_eq!(names.len(), 1);
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// The value of a tokenized expression is its tree's value (for every generated tree), and
    /// what has no value is named.
    #[test]
    fn tokenized_expressions_evaluate_as_their_trees() {
        let [train, ..] = generate(&small()).unwrap();
        for (expression, label) in &train {
            assert_eq!(
                value_of(&tokenize(expression).unwrap()),
                Ok(*label),
                "{expression}"
            );
        }
        let value = |text: &str| value_of(&tokenize(text).unwrap());
        assert_eq!(value("[MED 1 2 7 9 ]"), Ok(4));
        assert_eq!(value("[SM 9 9 [MAX 1 5 ] ]"), Ok(3));
        assert_eq!(
            value("[MAX 2 [MIN ] ]"),
            Err("`[MIN` has no arguments, so no value".into())
        );
        assert_eq!(
            value("2 [MAX 3 ]"),
            Err("2 values at the top level; an expression has one".into())
        );
    }

    #[test]
    fn printed_form_matches_lra() {
        // The example of docs/lra.md: MAX over 2 and 9.
        let tree = Tree::Op(Op::Max, vec![Tree::Value(2), Tree::Value(9)]);
        assert_eq!(tree.to_lra_string(), "( ( ( [MAX 2 ) 9 ) ] )");
        assert_eq!(tree.length(), 4);
        assert_eq!(tree.evaluate(), 9);
    }

    #[test]
    fn generator_is_seeded_distinct_and_in_range() {
        let a = generate(&small()).unwrap();
        let b = generate(&small()).unwrap();
        assert_eq!(a, b);
        let all: Vec<&(String, u8)> = a.iter().flatten().collect();
        assert_eq!(all.len(), 240);
        let distinct: HashSet<&String> = all.iter().map(|(s, _)| s).collect();
        assert_eq!(distinct.len(), 240);
        for (text, label) in all {
            let tokens = tokenize(text).unwrap();
            assert!(
                tokens.len() > 10 && tokens.len() < 60,
                "length {}",
                tokens.len()
            );
            assert!(*label < 10);
        }
    }

    #[test]
    fn generated_labels_match_an_independent_evaluator() {
        // Re-evaluate each printed expression with a stack machine over the token stream, an
        // evaluator that never sees the tree.
        let [train, ..] = generate(&small()).unwrap();
        for (text, label) in train {
            let mut stack: Vec<(Option<Op>, Vec<u8>)> = vec![(None, vec![])];
            for t in tokenize(&text).unwrap() {
                match t {
                    1..=10 => stack.last_mut().unwrap().1.push((t - 1) as u8),
                    11..=14 => stack.push((Some(Op::ALL[(t - 11) as usize]), vec![])),
                    15 => {
                        let (op, args) = stack.pop().unwrap();
                        let v = op.unwrap().apply(&args);
                        stack.last_mut().unwrap().1.push(v);
                    }
                    _ => unreachable!(),
                }
            }
            assert_eq!(stack[0].1, vec![label], "{text}");
        }
    }
}
