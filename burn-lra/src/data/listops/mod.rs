//! ListOps (Nangia and Bowman 2018) as Long Range Arena builds it: the operators, the TSV format
//! and the tokenizer here; the generator in [`generate`].

use std::path::Path;

use anyhow::{Context, Result, bail};

use super::{Dataset, Example};

mod generate;
pub use generate::{GeneratorConfig, Tree, generate, write_dataset, write_splits};

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
