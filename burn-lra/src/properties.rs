//! Property tests over every data reader and the configuration parser: arbitrary bytes, and
//! good inputs with arbitrary damage (bytes flipped, cut, repeated), never panic and never hang
//! (each case runs under a time limit), and every error is one line.
//!
//! CI runs a short pass (`CASES` each); a long run sets `PROPTEST_CASES`, e.g.
//! `PROPTEST_CASES=20000 cargo test --release -p burn-lra --lib properties`.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use proptest::prelude::*;

use crate::config::RunConfig;
use crate::data::{self, DEFAULT_MAX_ARCHIVE_BYTES};

/// Cases per property in a plain `cargo test` (`PROPTEST_CASES` overrides it).
const CASES: u32 = 256;

/// The longest one case may take before it counts as a hang.
const LIMIT: Duration = Duration::from_secs(20);

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Runs `read` on its own thread: it must return within [`LIMIT`] without panicking, and an
/// error must be one line. (A case that hangs is reported; its thread is left behind.)
fn outcome<T: Send + 'static>(
    what: &str,
    read: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> Result<(), TestCaseError> {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(read));
        let _ = send.send(result.map(|r| r.map(|_| ()).map_err(|e| format!("{e:#}"))));
    });
    match receive.recv_timeout(LIMIT) {
        Err(_) => Err(TestCaseError::fail(format!(
            "{what}: no answer in {LIMIT:?}"
        ))),
        Ok(Err(_)) => Err(TestCaseError::fail(format!("{what}: panicked"))),
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(message))) => {
            prop_assert!(
                !message.contains('\n') && !message.is_empty(),
                "{}: error of {} lines: {}",
                what,
                message.lines().count(),
                message
            );
            Ok(())
        }
    }
}

/// A fresh folder for one case, removed when the case ends.
struct Folder(PathBuf);

impl std::ops::Deref for Folder {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn folder(name: &str) -> Folder {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("burn-lra-prop-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Folder(dir)
}

/// Damage to a good input: flip some bytes, cut it, and repeat a stretch of it.
fn damaged(good: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = good.len().max(1);
    (
        prop::collection::vec((0..len, any::<u8>()), 0..8),
        0..=len,
        prop::option::of((0..len, 0..len)),
    )
        .prop_map(move |(flips, cut, repeat)| {
            let mut bytes = good.clone();
            for (at, byte) in flips {
                if at < bytes.len() {
                    bytes[at] ^= byte;
                }
            }
            if let Some((from, to)) = repeat {
                let (from, to) = (from.min(to), from.max(to).min(bytes.len()));
                let stretch = bytes[from.min(to)..to].to_vec();
                bytes.splice(to..to, stretch);
            }
            bytes.truncate(cut);
            bytes
        })
}

/// Either arbitrary bytes or a damaged `good`.
fn bytes_like(good: &[u8]) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..600),
        damaged(good.to_vec()),
    ]
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// A small aclImdb archive (tar, not yet gzipped).
fn imdb_tar() -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for split in ["train", "test"] {
        for (label, text) in [("neg", "dull"), ("pos", "fine")] {
            let mut header = tar::Header::new_gnu();
            header.set_size(text.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            let path = format!("aclImdb/{split}/{label}/0_5.txt");
            tar.append_data(&mut header, path, text.as_bytes()).unwrap();
        }
    }
    tar.into_inner().unwrap()
}

/// An IDX file of `dims` holding `data`.
fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0, 0, 0x08, dims.len() as u8];
    for d in dims {
        bytes.extend(d.to_be_bytes());
    }
    bytes.extend(data);
    bytes
}

const LISTOPS: &str = "Source\tTarget\n( ( [MAX 2 ) 3 ] )\t3\n[MIN 4 [SM 1 2 ] 9 ]\t3\n";
const LABELLED: &str = "0\tsome text\n1\tmore text\there\n";
const AAN: &str = "1\ta\tb\tsome text\tother text\n0\tc\td\tmore\tstill more\n";

proptest! {
    #![proptest_config(config())]

    #[test]
    fn listops_files(bytes in bytes_like(LISTOPS.as_bytes())) {
        let dir = folder("listops");
        let path = write(&dir, "basic_train.tsv", &bytes);
        outcome("listops", move || data::listops::read_tsv(&path, 64))?;
    }

    #[test]
    fn labelled_text_files(bytes in bytes_like(LABELLED.as_bytes())) {
        let dir = folder("text");
        let path = write(&dir, "train.tsv", &bytes);
        outcome("labelled tsv", move || data::bytes::read_labelled_tsv(&path, 64, 2))?;
    }

    #[test]
    fn matching_files(bytes in bytes_like(AAN.as_bytes())) {
        let dir = folder("aan");
        let path = write(&dir, "new_aan_pairs.train.tsv", &bytes);
        outcome("aan", move || data::matching::read_tsv(&path, 64, 100))?;
    }

    #[test]
    fn imdb_archives(tar in damaged(imdb_tar()), compressed in damaged(gzip(&imdb_tar()))) {
        let dir = folder("imdb");
        let damaged_tar = write(&dir, "a.tar.gz", &gzip(&tar));
        outcome("imdb (damaged tar)", move || {
            data::bytes::read_imdb(&damaged_tar, 64, DEFAULT_MAX_ARCHIVE_BYTES)
        })?;
        let damaged_gzip = write(&dir, "b.tar.gz", &compressed);
        outcome("imdb (damaged gzip)", move || {
            data::bytes::read_imdb(&damaged_gzip, 64, 1 << 20)
        })?;
    }

    #[test]
    fn idx_files(
        bytes in bytes_like(&idx(&[2, 2, 2], &[1, 2, 3, 4, 5, 6, 7, 8])),
        gzipped in any::<bool>(),
    ) {
        let bytes = if gzipped { gzip(&bytes) } else { bytes };
        let dir = folder("idx");
        let path = write(&dir, "train-images-idx3-ubyte", &bytes);
        outcome("idx", move || data::image::read_idx(&path, 1 << 16))?;
    }

    #[test]
    fn cifar_batches(bytes in bytes_like(&[[3u8].as_slice(), &[9u8; 3072]].concat())) {
        let dir = folder("cifar");
        let path = write(&dir, "data_batch_1.bin", &bytes);
        outcome("cifar", move || data::image::read_cifar_batch(&path))?;
    }

    #[test]
    fn png_files(bytes in bytes_like(&data::pathfinder::png_bytes(&[7; 16], 4, 4).unwrap())) {
        let dir = folder("png");
        let path = write(&dir, "x.png", &bytes);
        outcome("png", move || data::pathfinder::read_png(&path, 4))?;
    }

    #[test]
    fn pathfinder_metadata(bytes in bytes_like(b"imgs/0 sample_0.png 0 1\nimgs/0 ../x 0 0\n")) {
        let config = data::pathfinder::PathfinderConfig {
            size: 32,
            difficulty: data::pathfinder::Difficulty::Easy,
            n_images: 10,
            seed: 0,
        };
        let dir = folder("pathfinder");
        let images = dir.join(config.difficulty.folder());
        std::fs::create_dir_all(images.join("metadata")).unwrap();
        std::fs::create_dir_all(images.join("imgs/0")).unwrap();
        let png = data::pathfinder::png_bytes(&[0; 32 * 32], 32, 32).unwrap();
        std::fs::write(images.join("imgs/0/sample_0.png"), png).unwrap();
        write(&images.join("metadata"), "0.npy", &bytes);
        let root = dir.to_path_buf();
        outcome("pathfinder", move || data::pathfinder::read_splits(&root, &config, 1024))?;
    }

    #[test]
    fn toml_configurations(
        bytes in bytes_like(crate::config::preset_text("listops", "tiny").unwrap().as_bytes()),
    ) {
        let dir = folder("toml");
        let path = write(&dir, "c.toml", &bytes);
        outcome("toml config", move || RunConfig::from_file(&path))?;
    }

    #[test]
    fn json_configurations(
        bytes in bytes_like(
            &serde_json::to_vec_pretty(&RunConfig::preset("listops", "tiny").unwrap()).unwrap()
        ),
    ) {
        let dir = folder("json");
        let path = write(&dir, "c.json", &bytes);
        outcome("json config", move || RunConfig::from_file(&path))?;
    }
}

/// The inputs the properties damage are good ones: undamaged, each reads without error (so
/// that the properties exercise the readers past their first check).
#[test]
fn the_undamaged_inputs_read() {
    let dir = folder("good");
    let listops = write(&dir, "basic_train.tsv", LISTOPS.as_bytes());
    data::listops::read_tsv(&listops, 64).unwrap();
    let text = write(&dir, "train.tsv", LABELLED.as_bytes());
    data::bytes::read_labelled_tsv(&text, 64, 2).unwrap();
    let aan = write(&dir, "aan.tsv", AAN.as_bytes());
    data::matching::read_tsv(&aan, 64, 100).unwrap();
    let imdb = write(&dir, "a.tar.gz", &gzip(&imdb_tar()));
    data::bytes::read_imdb(&imdb, 64, 1 << 20).unwrap();
    let images = write(
        &dir,
        "i",
        &gzip(&idx(&[2, 2, 2], &[1, 2, 3, 4, 5, 6, 7, 8])),
    );
    data::image::read_idx(&images, 1 << 16).unwrap();
    let cifar = write(&dir, "c.bin", &[[3u8].as_slice(), &[9u8; 3072]].concat());
    data::image::read_cifar_batch(&cifar).unwrap();
    let png = write(
        &dir,
        "x.png",
        &data::pathfinder::png_bytes(&[7; 16], 4, 4).unwrap(),
    );
    data::pathfinder::read_png(&png, 4).unwrap();
    let toml = write(
        &dir,
        "c.toml",
        crate::config::preset_text("listops", "tiny")
            .unwrap()
            .as_bytes(),
    );
    RunConfig::from_file(&toml).unwrap();
    let config = RunConfig::preset("listops", "tiny").unwrap();
    let json = write(&dir, "c.json", &serde_json::to_vec_pretty(&config).unwrap());
    RunConfig::from_file(&json).unwrap();
}
