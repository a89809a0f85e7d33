//! ListOps (Nangia and Bowman 2018) as Long Range Arena builds it: the generator, the TSV format
//! and the tokenizer.
//!
//! The generator follows `lra_benchmarks/data/listops.py`: operators MIN, MAX, MED (`int` of the
//! median), SM (sum mod 10) over digits 0-9; a node at depth below `max_depth` is a single value
//! with probability 0.75, else an operator with 2 to `max_args` (inclusive) arguments; roots sit
//! at depth 1; only trees with `min_length < length < max_length` are kept, without duplicates.
//! The original draws from an unseeded RNG; this one takes a seed, so a dataset is reproducible.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::{Dataset, Example, write_atomic};
use crate::rng::Rng;

/// Number of classes (the value of the expression, 0-9).
pub const N_CLASSES: usize = 10;
/// Vocabulary: padding, ten digits, four operators and the closing bracket.
pub const VOCAB_SIZE: usize = 16;
/// The file names LRA ships, per split.
pub const SPLIT_FILES: [(&str, &str); 3] = [
    ("train", "basic_train.tsv"),
    ("val", "basic_val.tsv"),
    ("test", "basic_test.tsv"),
];

/// A ListOps operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Median, truncated to an integer (`int(np.median(...))`).
    Med,
    /// Sum modulo 10.
    Sm,
}

impl Op {
    /// Every operator, in token-id order (11-14, see [`tokenize`]).
    const ALL: [Op; 4] = [Op::Min, Op::Max, Op::Med, Op::Sm];

    fn token(self) -> &'static str {
        match self {
            Op::Min => "[MIN",
            Op::Max => "[MAX",
            Op::Med => "[MED",
            Op::Sm => "[SM",
        }
    }

    fn apply(self, values: &[u8]) -> u8 {
        match self {
            Op::Min => *values.iter().min().expect("operators have arguments"),
            Op::Max => *values.iter().max().expect("operators have arguments"),
            Op::Sm => (values.iter().map(|&v| v as u32).sum::<u32>() % 10) as u8,
            Op::Med => {
                let mut sorted = values.to_vec();
                sorted.sort_unstable();
                let m = sorted.len() / 2;
                if !sorted.len().is_multiple_of(2) {
                    sorted[m]
                } else {
                    // int() of the mean of the two middle values: floor, as both are >= 0.
                    ((sorted[m - 1] as u32 + sorted[m] as u32) / 2) as u8
                }
            }
        }
    }
}

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
/// [`super::MANIFEST`]): written into a staging folder beside it and moved into place complete,
/// only where nothing is (an existing `dir` that is not an empty folder is an error naming it).
pub fn write_dataset(dir: &Path, cfg: &GeneratorConfig) -> Result<()> {
    lra_runs::create_dir_whole(dir, |staging| {
        write_splits(staging, &generate(cfg)?)?;
        super::write_manifest(staging)
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

/// Tokenizes an expression as LRA does: parentheses dropped, `]` a closing token, split on
/// whitespace. Ids: 0 padding, 1-10 digits 0-9, 11-14 `[MIN [MAX [MED [SM`, 15 `]`.
///
/// Every operator must be closed by a `]` and every `]` close an operator: an unbalanced
/// expression has no value, and its label could only be noise.
pub fn tokenize(expr: &str) -> Result<Vec<u16>, String> {
    let mut out = Vec::with_capacity(expr.len() / 2);
    let mut open = 0usize;
    for token in expr.split_whitespace() {
        let id = match token {
            "(" | ")" => continue,
            "]" => {
                open = open
                    .checked_sub(1)
                    .ok_or("unbalanced expression: a `]` closes no operator")?;
                15
            }
            "[MIN" => 11,
            "[MAX" => 12,
            "[MED" => 13,
            "[SM" => 14,
            t if t.len() == 1 && t.as_bytes()[0].is_ascii_digit() => {
                1 + (t.as_bytes()[0] - b'0') as u16
            }
            t => return Err(format!("unknown token `{}`", super::shown(t))),
        };
        open += usize::from((11..=14).contains(&id));
        out.push(id);
    }
    if open > 0 {
        return Err(format!(
            "unbalanced expression: {open} operator(s) not closed by `]`"
        ));
    }
    Ok(out)
}

/// The value of a tokenized expression (ids as [`tokenize`] gives them, balanced): an error for
/// an operator with no arguments, or for several values at the top level, which have none.
pub fn value_of(tokens: &[u16]) -> Result<u8, String> {
    // One frame per open operator, the outermost (no operator) first.
    let mut frames: Vec<(Option<Op>, Vec<u8>)> = vec![(None, Vec::new())];
    for &id in tokens {
        match id {
            1..=10 => frames.last_mut().expect("a frame").1.push((id - 1) as u8),
            11..=14 => frames.push((Some(Op::ALL[(id - 11) as usize]), Vec::new())),
            _ => {
                let (op, values) = frames.pop().expect("balanced");
                let op = op.ok_or("unbalanced expression: a `]` closes no operator")?;
                if values.is_empty() {
                    return Err(format!("`{}` has no arguments, so no value", op.token()));
                }
                frames
                    .last_mut()
                    .ok_or("unbalanced expression")?
                    .1
                    .push(op.apply(&values));
            }
        }
    }
    match frames.as_slice() {
        [(None, values)] if values.len() == 1 => Ok(values[0]),
        [(None, values)] => Err(format!(
            "{} values at the top level; an expression has one",
            values.len()
        )),
        _ => Err("unbalanced expression".into()),
    }
}

/// Reads one LRA ListOps file (`Source<TAB>Target` header, then `expression<TAB>label` rows),
/// cutting each example to `max_len` tokens. Errors name the file and line.
pub fn read_tsv(path: &Path, max_len: usize) -> Result<Dataset> {
    let mut examples = Vec::new();
    // Rows whose label is not their expression's value (with the first), and rows cut.
    let (mut mislabelled, mut first_mislabelled, mut cut) = (0usize, None, 0usize);
    super::for_each_row(path, |lineno, row| {
        let line = String::from_utf8_lossy(row);
        if lineno == 1 && line.starts_with("Source") {
            return Ok(());
        }
        if line.trim().is_empty() {
            return Ok(());
        }
        let fields: Vec<&str> = line.split('\t').collect();
        if fields.len() != 2 {
            bail!(
                "{}:{lineno}: expected 2 tab-separated fields (expression, label), found {}",
                path.display(),
                fields.len()
            );
        }
        let label: usize = fields[1]
            .trim()
            .parse()
            .ok()
            .filter(|&l| l < N_CLASSES)
            .with_context(|| {
                format!(
                    "{}:{lineno}: label `{}` is not a class 0-{}",
                    path.display(),
                    super::shown(fields[1]),
                    N_CLASSES - 1
                )
            })?;
        let mut tokens =
            tokenize(fields[0]).map_err(|e| anyhow::anyhow!("{}:{lineno}: {e}", path.display()))?;
        if tokens.is_empty() {
            bail!("{}:{lineno}: empty expression", path.display());
        }
        let value =
            value_of(&tokens).map_err(|e| anyhow::anyhow!("{}:{lineno}: {e}", path.display()))?;
        if value as usize != label {
            mislabelled += 1;
            first_mislabelled.get_or_insert((lineno, label, value));
        }
        cut += usize::from(tokens.len() > max_len);
        tokens.truncate(max_len);
        examples.push(Example::new(tokens, label));
        Ok(())
    })?;
    let n = examples.len();
    let mut data = Dataset::new(path.display().to_string(), examples, N_CLASSES)?;
    if let Some((line, label, value)) = first_mislabelled {
        data.warnings.push(format!(
            "{}: {mislabelled} of {n} labels are not their expression's value (the first at line \
             {line}: label {label}, value {value})",
            path.display()
        ));
    }
    if cut > 0 {
        data.warnings.push(format!(
            "{}: {cut} of {n} expressions are longer than `data.max_len` ({max_len}) and were cut; \
             a cut expression's label is not the value of what the model reads",
            path.display()
        ));
    }
    Ok(data)
}

/// Reads the three splits from `dir` (`basic_{train,val,test}.tsv`).
pub fn read_splits(dir: &Path, max_len: usize) -> Result<[Dataset; 3]> {
    let files: Vec<&str> = SPLIT_FILES.iter().map(|(_, file)| *file).collect();
    super::expect_folder(
        dir,
        &format!("a ListOps folder holding {}", files.join(", ")),
    )?;
    let [train, val, test] = SPLIT_FILES.map(|(_, file)| dir.join(file));
    Ok([
        read_tsv(&train, max_len)?,
        read_tsv(&val, max_len)?,
        read_tsv(&test, max_len)?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A label that is not its expression's value, and an expression cut by `max_len`, are
    /// warnings of the split, naming the file (and the first line); an operator with no
    /// arguments is an error naming the line.
    #[test]
    fn mislabelled_and_cut_rows_are_warned() {
        let dir = crate::data::scratch_dir("listops-warn");
        let path = dir.join("basic_train.tsv");
        std::fs::write(
            &path,
            "Source\tTarget\n[MAX 2 9 ]\t9\n[MIN 2 9 ]\t9\n[SM 1 2 3 4 5 6 ]\t1\n",
        )
        .unwrap();
        let data = read_tsv(&path, 6).unwrap();
        assert_eq!(data.warnings.len(), 2, "{:?}", data.warnings);
        assert!(
            data.warnings[0].ends_with(
                "basic_train.tsv: 1 of 3 labels are not their expression's value (the first at line 3: label 9, value 2)"
            ),
            "{}",
            data.warnings[0]
        );
        assert!(
            data.warnings[1].contains("1 of 3 expressions are longer than `data.max_len` (6)"),
            "{}",
            data.warnings[1]
        );
        assert!(read_tsv(&path, 100).unwrap().warnings.len() == 1);
        std::fs::write(&path, "Source\tTarget\n[MAX 2 [MIN ] ]\t2\n").unwrap();
        let err = format!("{:#}", read_tsv(&path, 100).unwrap_err());
        assert!(
            err.ends_with("basic_train.tsv:2: `[MIN` has no arguments, so no value"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
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
    fn unbalanced_expressions_are_refused() {
        assert!(
            tokenize("[MAX 2 3")
                .unwrap_err()
                .contains("1 operator(s) not closed")
        );
        assert!(
            tokenize("[MAX [MIN 2 ] 3")
                .unwrap_err()
                .contains("1 operator(s) not closed")
        );
        assert!(
            tokenize("[MAX 2 ] ]")
                .unwrap_err()
                .contains("a `]` closes no operator")
        );
        assert!(tokenize("2 ]").unwrap_err().contains("closes no operator"));
        assert_eq!(tokenize("( [SM 1 ( [MED 2 ] ) ] )").unwrap().len(), 6);
    }

    #[test]
    fn operators_follow_lra_semantics() {
        // Hand-computed: median of [1, 2, 3, 8] is 2.5 -> int 2; sum 14 mod 10 = 4.
        assert_eq!(Op::Med.apply(&[8, 1, 3, 2]), 2);
        assert_eq!(Op::Med.apply(&[8, 1, 3]), 3);
        assert_eq!(Op::Sm.apply(&[9, 5]), 4);
        assert_eq!(Op::Min.apply(&[4, 0, 7]), 0);
    }

    #[test]
    fn tokenize_drops_parentheses() {
        assert_eq!(
            tokenize("( ( ( [MAX 2 ) 9 ) ] )").unwrap(),
            vec![12, 3, 10, 15]
        );
        assert!(tokenize("( [FOO 1 )").unwrap_err().contains("[FOO"));
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

    #[test]
    fn reader_names_file_and_line() {
        let dir = std::env::temp_dir().join(format!("listops-reader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.tsv");
        std::fs::write(
            &path,
            "Source\tTarget\n( ( [MAX 2 ) ] )\t2\n( ( [MIN 2 ) ] )\n",
        )
        .unwrap();
        let err = read_tsv(&path, 100).unwrap_err().to_string();
        assert!(
            err.contains("bad.tsv:3") && err.contains("2 tab-separated"),
            "{err}"
        );
        std::fs::write(&path, "Source\tTarget\n( ( [MAX 2 ) ] )\t12\n").unwrap();
        let err = read_tsv(&path, 100).unwrap_err().to_string();
        assert!(
            err.contains("bad.tsv:2") && err.contains("label `12`"),
            "{err}"
        );
        std::fs::write(&path, "Source\tTarget\n").unwrap();
        let err = read_tsv(&path, 100).unwrap_err().to_string();
        assert!(err.contains("empty"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
