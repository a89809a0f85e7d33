//! SHA-256 in hex, and the checksum list of a folder: what the run directory's checkpoints, the
//! generated caches and the tokenizer cache record of their files, and check before they are
//! read again.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};

/// `bytes` in lowercase hex.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The SHA-256 of `bytes`, in hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    to_hex(&Sha256::digest(bytes))
}

/// The SHA-256 of `path`'s bytes, in hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(sha256_hex(&bytes))
}

/// How the refusals of a folder's checksum list read: what its files are, the word for a file
/// that no longer matches, and what to do about it.
pub struct Wording<'a> {
    /// What the files are, e.g. "the checkpoint's files".
    pub files: &'a str,
    /// What a file whose SHA-256 differs is, e.g. "corrupted".
    pub changed: &'a str,
    /// What to do, e.g. "--restart starts the run over".
    pub advice: &'a str,
}

/// Writes the checksum list `list` (a JSON object, path relative to `dir` -> SHA-256) of every
/// file under `dir`, the list itself aside; written last, it vouches for a complete folder.
pub fn write_list(dir: &Path, list: &str) -> Result<()> {
    let mut sums = BTreeMap::new();
    for name in files_under(dir, list)? {
        sums.insert(name.clone(), sha256_file(&dir.join(&name))?);
    }
    lra_runs::write_atomic(
        &dir.join(list),
        serde_json::to_string_pretty(&sums)?.as_bytes(),
    )
}

/// Checks every file under `dir` against its checksum list `list` and returns the list: a
/// missing or unreadable list, a file missing, changed or not listed is an error naming it,
/// worded by `wording`.
pub fn verify_list(dir: &Path, list: &str, wording: &Wording) -> Result<BTreeMap<String, String>> {
    let Wording {
        files,
        changed,
        advice,
    } = wording;
    let path = dir.join(list);
    if !path.is_file() {
        bail!(
            "{} is missing: {files} cannot be verified ({advice})",
            path.display()
        );
    }
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let sums: BTreeMap<String, String> = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}: not a checksum list ({e}); {advice}", path.display()))?;
    if let Some(extra) = files_under(dir, list)?
        .into_iter()
        .find(|f| !sums.contains_key(f))
    {
        bail!(
            "{}: not in {list}; {files} cannot be verified ({advice})",
            dir.join(extra).display()
        );
    }
    for (name, sum) in &sums {
        let file = dir.join(name);
        if !file.is_file() {
            bail!(
                "{} is missing (its SHA-256 is in {list}); {advice}",
                file.display()
            );
        }
        if sha256_file(&file)? != *sum {
            bail!(
                "{}: {changed} (its SHA-256 differs from the one in {list}); {advice}",
                file.display()
            );
        }
    }
    Ok(sums)
}

/// Every file under `dir` but the list `list`, by path relative to it with `/` separators,
/// sorted.
fn files_under(dir: &Path, list: &str) -> Result<Vec<String>> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(folder) = stack.pop() {
        let entries = std::fs::read_dir(&folder)
            .with_context(|| format!("cannot read {}", folder.display()))?;
        for entry in entries {
            let path = entry
                .with_context(|| format!("cannot read {}", folder.display()))?
                .path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let name: Vec<String> = (path.strip_prefix(dir).expect("under dir").iter())
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            if name != [list] {
                files.push(name.join("/"));
            }
        }
    }
    files.sort();
    Ok(files)
}
