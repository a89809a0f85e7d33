//! The IMDB reviews (Maas et al. 2011, the `aclImdb` layout) for the examples: read from the
//! `.tar.gz`, a folder holding it, or the unpacked folder, without unpacking anything.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// A labelled review.
#[allow(dead_code)] // `char_lm` reads texts only.
#[derive(Clone, Debug)]
pub struct Review {
    /// The review's bytes (UTF-8 with the corpus's `<br />` markup).
    pub text: Vec<u8>,
    /// Whether it is under `pos/` (rated 7 or more of 10) rather than `neg/` (4 or less).
    pub positive: bool,
}

/// Reads at most `per_class` positive and `per_class` negative reviews of `split` (`train` or
/// `test`), in the order the archive or the sorted folder lists them, positives and negatives
/// interleaved. An error names the path when a class has no review at all.
#[allow(dead_code)] // `char_lm` reads texts only.
pub fn read_reviews(path: &Path, split: &str, per_class: usize) -> Result<Vec<Review>, String> {
    let (pos_dir, neg_dir) = (format!("{split}/pos/"), format!("{split}/neg/"));
    let (mut pos, mut neg) = (Vec::new(), Vec::new());
    for_each_text(path, &mut |name, text| {
        if name.contains(&pos_dir) && pos.len() < per_class {
            pos.push(Review {
                text,
                positive: true,
            });
        } else if name.contains(&neg_dir) && neg.len() < per_class {
            neg.push(Review {
                text,
                positive: false,
            });
        }
        pos.len() < per_class || neg.len() < per_class
    })?;
    for (class, found) in [(&pos_dir, pos.len()), (&neg_dir, neg.len())] {
        if found == 0 {
            return Err(format!(
                "{}: no review under `{class}` (expected the aclImdb layout)",
                path.display()
            ));
        }
    }
    let mut reviews = Vec::with_capacity(pos.len() + neg.len());
    let (mut pos, mut neg) = (pos.into_iter(), neg.into_iter());
    loop {
        match (pos.next(), neg.next()) {
            (None, None) => break,
            (p, n) => reviews.extend(p.into_iter().chain(n)),
        }
    }
    Ok(reviews)
}

/// Calls `visit(name, bytes)` for every `.txt` file under `path` (a `.tar.gz`, a folder holding
/// one, or a folder of text files searched recursively in name order) until `visit` returns
/// `false`. `name` is the entry's path inside the archive, or the file's path.
pub fn for_each_text(
    path: &Path,
    visit: &mut dyn FnMut(&str, Vec<u8>) -> bool,
) -> Result<(), String> {
    if path.is_file() && is_archive(path) {
        return visit_archive(path, visit);
    }
    if !path.is_dir() {
        return Err(format!(
            "{}: not a folder or a .tar.gz of the reviews",
            path.display()
        ));
    }
    match list(path)?.into_iter().find(|p| is_archive(p)) {
        Some(archive) => visit_archive(&archive, visit),
        None => visit_folder(path, visit).map(|_| ()),
    }
}

fn is_archive(path: &Path) -> bool {
    path.to_string_lossy().ends_with(".tar.gz")
}

fn list(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    paths.sort();
    Ok(paths)
}

/// Whether the walk goes on.
fn visit_folder(dir: &Path, visit: &mut dyn FnMut(&str, Vec<u8>) -> bool) -> Result<bool, String> {
    for path in list(dir)? {
        let go_on = if path.is_dir() {
            visit_folder(&path, visit)?
        } else if path.extension().is_some_and(|e| e == "txt") {
            let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            visit(&path.to_string_lossy(), bytes)
        } else {
            true
        };
        if !go_on {
            return Ok(false);
        }
    }
    Ok(true)
}

fn visit_archive(path: &Path, visit: &mut dyn FnMut(&str, Vec<u8>) -> bool) -> Result<(), String> {
    let unreadable = |e: std::io::Error| format!("{}: unreadable archive ({e})", path.display());
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(BufReader::new(file)));
    for entry in archive.entries().map_err(unreadable)? {
        let mut entry = entry.map_err(unreadable)?;
        let name = entry
            .path()
            .map_err(unreadable)?
            .to_string_lossy()
            .into_owned();
        if !name.ends_with(".txt") {
            continue;
        }
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).map_err(unreadable)?;
        if !visit(&name, bytes) {
            break;
        }
    }
    Ok(())
}
