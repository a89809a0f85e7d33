//! Byte-level BPE tokenization for the text and matching tasks (`data.tokenizer = "bpe"`),
//! through HuggingFace's `tokenizers`: trained on the training split only, cached under the
//! data cache with its settings and a fingerprint of its training text in the file name, and
//! copied into each run directory that uses it.
//!
//! Byte-level (GPT-2 style): every text is representable, nothing maps to an unknown token.
//! Token ids are BPE ids + 1 (0 stays padding), so the model's vocabulary is `vocab_size + 1`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use sha2::{Digest, Sha256};
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{Tokenizer, TokenizerBuilder};

use super::{Dataset, write_atomic};

/// A trained BPE tokenizer and where it is cached.
pub struct Bpe {
    tokenizer: Tokenizer,
    /// The cached `tokenizer.json`.
    pub path: PathBuf,
    /// Its contents (recorded in run directories).
    pub json: String,
}

/// The bytes of a byte-tokenized text (tokens are byte + 1).
pub fn text_of(tokens: &[u16]) -> String {
    let bytes: Vec<u8> = tokens.iter().map(|&t| (t - 1) as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Every document of `data` (both of a matching pair), as text.
fn documents(data: &Dataset) -> impl Iterator<Item = String> + '_ {
    data.examples
        .iter()
        .flat_map(|e| std::iter::once(text_of(&e.tokens)).chain(e.pair.as_deref().map(text_of)))
}

/// A fingerprint of the training text: the first 12 hex digits of its SHA-256.
fn fingerprint(train: &Dataset) -> String {
    let mut hash = Sha256::new();
    for doc in documents(train) {
        hash.update((doc.len() as u64).to_le_bytes());
        hash.update(doc.as_bytes());
    }
    crate::checksum::to_hex(&hash.finalize()[..6])
}

/// The tokenizer for `train` (byte-tokenized, uncut) with `vocab_size` tokens: read from
/// `cache_dir` when trained before on the same text, trained and cached otherwise.
pub fn load_or_train(
    cache_dir: &Path,
    task: &str,
    train: &Dataset,
    vocab_size: usize,
) -> Result<Bpe> {
    let path = cache_dir.join("tokenizers").join(format!(
        "bpe-{task}-v{vocab_size}-{}.json",
        fingerprint(train)
    ));
    // The tokenizer's own SHA-256 beside it, written first: a cached tokenizer is used only
    // when it is the one trained here, byte for byte.
    let sum_path = path.with_extension("json.sha256");
    if !path.is_file() {
        eprintln!(
            "training a {vocab_size}-token BPE on {} training documents into {}",
            train
                .examples
                .iter()
                .map(|e| 1 + usize::from(e.pair.is_some()))
                .sum::<usize>(),
            path.display()
        );
        let json = train_bpe(train, vocab_size)?;
        write_atomic(
            &sum_path,
            crate::checksum::sha256_hex(json.as_bytes()).as_bytes(),
        )?;
        write_atomic(&path, json.as_bytes())?;
    }
    let json = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let recorded = std::fs::read_to_string(&sum_path).unwrap_or_default();
    if recorded.trim() != crate::checksum::sha256_hex(json.as_bytes()) {
        anyhow::bail!(
            "{}: changed since it was trained (its SHA-256 differs from {}, or that file is \
             missing); remove both to train it again",
            path.display(),
            sum_path.display()
        );
    }
    let tokenizer = Tokenizer::from_file(&path)
        .map_err(|e| anyhow!("{}: not a tokenizer ({e})", path.display()))?;
    Ok(Bpe {
        tokenizer,
        path,
        json,
    })
}

fn train_bpe(train: &Dataset, vocab_size: usize) -> Result<String> {
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(vocab_size)
        .min_frequency(2)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tokenizer =
        TokenizerBuilder::<BPE, NormalizerWrapper, ByteLevel, ByteLevel, ByteLevel>::new()
            .with_model(BPE::default())
            .with_normalizer(None)
            .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
            .with_post_processor(Some(ByteLevel::default()))
            .with_decoder(Some(ByteLevel::default()))
            .build()
            .map_err(|e| anyhow!("cannot build a BPE tokenizer: {e}"))?;
    tokenizer
        .train(&mut trainer, documents(train))
        .map_err(|e| anyhow!("BPE training failed: {e}"))?;
    tokenizer
        .to_string(false)
        .map_err(|e| anyhow!("cannot serialise the tokenizer: {e}"))
}

impl Bpe {
    /// Vocabulary size with padding: BPE tokens + 1.
    pub fn model_vocab(&self) -> usize {
        self.tokenizer.get_vocab_size(true) + 1
    }

    /// The first `max_len` BPE tokens of `text` (ids + 1).
    pub fn tokens(&self, text: &str, max_len: usize) -> Result<Vec<u16>> {
        let encoding = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| anyhow!("BPE encoding failed: {e}"))?;
        Ok(encoding
            .get_ids()
            .iter()
            .take(max_len)
            .map(|&id| id as u16 + 1)
            .collect())
    }

    /// Re-tokenizes a byte-tokenized split with BPE, cutting each document to `max_len` tokens.
    pub fn retokenize(&self, data: &mut Dataset, max_len: usize) -> Result<()> {
        for example in &mut data.examples {
            example.tokens = self.tokens(&text_of(&example.tokens), max_len)?;
            if let Some(pair) = &mut example.pair {
                *pair = self.tokens(&text_of(pair), max_len)?;
            }
        }
        if let Some(e) = data.examples.iter().find(|e| e.tokens.is_empty()) {
            anyhow::bail!(
                "{}: a document has no BPE tokens (label {})",
                data.source,
                e.label
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Example;
    use crate::data::bytes::byte_tokens;

    #[test]
    fn bpe_trains_on_train_only_caches_and_round_trips() {
        let dir = crate::data::scratch_dir("bpe");
        let texts = [
            "the film was great, the acting great",
            "the film was dull and the plot dull",
            "great great film",
            "dull film, dull acting",
        ];
        let train = Dataset::new(
            "train".into(),
            texts
                .iter()
                .enumerate()
                .map(|(i, t)| Example::new(byte_tokens(t.as_bytes(), usize::MAX), i % 2))
                .collect(),
            2,
        )
        .unwrap();
        let bpe = load_or_train(&dir, "text", &train, 300).unwrap();
        assert!(bpe.path.is_file());
        assert!(
            bpe.path
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("bpe-text-v300-")
        );
        // Merges learned: a frequent word is one token, fewer tokens than bytes.
        let ids = bpe.tokens("the film was great", 100).unwrap();
        assert!(ids.len() < "the film was great".len(), "{ids:?}");
        assert!(
            ids.iter()
                .all(|&t| t >= 1 && (t as usize) < bpe.model_vocab())
        );
        // Unseen bytes still encode (byte-level), and decoding restores the text.
        let unseen = "Zürich ☃";
        let ids = bpe.tokens(unseen, 100).unwrap();
        let raw: Vec<u32> = ids.iter().map(|&t| t as u32 - 1).collect();
        assert_eq!(bpe.tokenizer.decode(&raw, false).unwrap(), unseen);
        // Truncation to max_len tokens.
        assert_eq!(
            bpe.tokens("great great film dull acting", 2).unwrap().len(),
            2
        );
        // The cache is reused: same file, same contents.
        let again = load_or_train(&dir, "text", &train, 300).unwrap();
        assert_eq!(
            (again.path.clone(), again.json.clone()),
            (bpe.path.clone(), bpe.json.clone())
        );
        // A cached tokenizer changed by hand is refused, naming it.
        std::fs::write(&bpe.path, bpe.json.replacen("\"merges\"", "\"merges\" ", 1)).unwrap();
        let err = format!(
            "{:#}",
            load_or_train(&dir, "text", &train, 300).err().unwrap()
        );
        assert!(err.contains("changed since it was trained"), "{err}");
        std::fs::write(&bpe.path, &bpe.json).unwrap();
        load_or_train(&dir, "text", &train, 300).unwrap();
        // Other training text: another file.
        let mut other = train.clone();
        other.examples.pop();
        let other = load_or_train(&dir, "text", &other, 300).unwrap();
        assert_ne!(other.path, bpe.path);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
