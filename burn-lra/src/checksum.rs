//! SHA-256 in hex: what the run directory, the generated caches and the tokenizer cache record
//! of their files, and check before they are read again.

use std::path::Path;

use anyhow::{Context, Result};

/// The SHA-256 of `bytes`, in hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The SHA-256 of `path`'s bytes, in hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(sha256_hex(&bytes))
}
