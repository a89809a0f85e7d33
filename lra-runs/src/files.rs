//! Atomic writes that never replace what they did not write, staging folders published only
//! where nothing is, the removal of the harness's own files, and the lock that keeps one process
//! per run directory.

use std::path::Path;

use anyhow::{Context, Result};

use crate::layout::LOCK;

/// `path` as the file system names it: absolute, with its existing part's links, `.` and `..`
/// resolved (the part that does not exist yet is appended as spelt), so that two spellings of
/// one path give one name.
pub fn absolute(path: &Path) -> Result<std::path::PathBuf> {
    let absolute = std::path::absolute(path)
        .with_context(|| format!("cannot resolve the path {}", path.display()))?;
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(canonical) = std::fs::canonicalize(existing) {
            return Ok(rest.iter().rev().fold(canonical, |p, part| p.join(part)));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => return Ok(absolute),
        }
    }
}

/// Writes `contents` to `path` so that a reader sees the old file or the new one, never a part:
/// a temporary file beside it (named after this process and thread), flushed to disk, then
/// renamed over it. Creates the parent folders.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    use std::io::Write;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create directory {}", parent.display()))?;
    }
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(
        ".tmp{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let tmp = path.with_file_name(name);
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(contents)?;
        file.sync_all()
    };
    write().with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot move {} to {}", tmp.display(), path.display()))
}

/// Writes `contents` to `path`, which must not exist: a complete temporary file beside it, then
/// linked into place (a link fails where anything already is, so nothing is ever replaced, not
/// even by a racing process); an existing `path` is an error naming it.
pub fn write_new(path: &Path, contents: &[u8]) -> Result<()> {
    refuse_existing(path, "path")?;
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".new{}", std::process::id()));
    let tmp = path.with_file_name(name);
    write_atomic(&tmp, contents)?;
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(()),
        // Written meanwhile by another process: left to it.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => refuse_existing(path, "path"),
        Err(e) => Err(e).with_context(|| format!("cannot write {}", path.display())),
    }
}

/// A new, empty staging folder beside `target` (`.<name>.partial-<pid>-<n>`), created here and
/// so the caller's to fill and [`publish_dir`] into place, or to remove when it fails.
pub fn staging_dir(target: &Path) -> Result<std::path::PathBuf> {
    let parent = target
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if let Some(file) = parent.ancestors().find(|p| p.is_file()) {
        anyhow::bail!(
            "{} is a file, not a folder to write {} into",
            file.display(),
            target.display()
        );
    }
    std::fs::create_dir_all(parent)
        .with_context(|| format!("cannot create directory {}", parent.display()))?;
    let name = target
        .file_name()
        .with_context(|| format!("{}: not a folder name", target.display()))?
        .to_string_lossy()
        .into_owned();
    for n in 0..1000 {
        let staging = parent.join(format!(".{name}.partial-{}-{n}", std::process::id()));
        match std::fs::create_dir(&staging) {
            Ok(()) => return Ok(staging),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(e).with_context(|| format!("cannot create {}", staging.display()));
            }
        }
    }
    anyhow::bail!(
        "cannot create a staging folder beside {}: 1000 names taken",
        target.display()
    )
}

/// Refuses a `target` that [`publish_dir`] could not fill: anything there but an empty folder is
/// an error naming it. (Checked before the work that fills a staging folder, so that a refusal
/// costs nothing; [`publish_dir`] checks again.)
pub fn ensure_vacant(target: &Path) -> Result<()> {
    match std::fs::symlink_metadata(target) {
        Err(_) => Ok(()),
        Ok(meta) if !meta.is_dir() => anyhow::bail!(
            "{} already exists and is not a folder; it is left as it is (choose another path, or \
             remove it first)",
            target.display()
        ),
        Ok(_) => {
            let empty = std::fs::read_dir(target)
                .with_context(|| format!("cannot read {}", target.display()))?
                .next()
                .is_none();
            if empty {
                Ok(())
            } else {
                anyhow::bail!(
                    "{} already exists and is not empty; it is left as it is (choose another \
                     path, or remove it first)",
                    target.display()
                )
            }
        }
    }
}

/// Moves the complete folder `staging` to `target` where nothing is (or an empty folder is);
/// anything else at `target` is an error naming it, and is left as it is. `staging` is removed
/// when it cannot be published (it is the caller's: [`staging_dir`] made it).
pub fn publish_dir(staging: &Path, target: &Path) -> Result<()> {
    if let Err(err) = ensure_vacant(target) {
        let _ = std::fs::remove_dir_all(staging);
        return Err(err);
    }
    // rename(2) replaces an empty folder and fails on a non-empty one, so a folder filled
    // meanwhile by another process is not replaced either.
    match std::fs::rename(staging, target) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_dir_all(staging);
            Err(e).with_context(|| {
                format!("cannot move {} to {}", staging.display(), target.display())
            })
        }
    }
}

/// Creates the folder `target` complete or not at all: refuses a `target` that is there (and not
/// an empty folder) before any work, lets `fill` write into a new staging folder beside it, then
/// publishes it ([`publish_dir`]); the staging folder is removed when `fill` fails.
pub fn create_dir_whole(target: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    ensure_vacant(target)?;
    let staging = staging_dir(target)?;
    if let Err(err) = fill(&staging) {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(err);
    }
    publish_dir(&staging, target)
}

/// Refuses a `path` where anything already is, naming it; `choose` says what to choose instead
/// (`"--out"`, `"path"`).
pub fn refuse_existing(path: &Path, choose: &str) -> Result<()> {
    if std::fs::symlink_metadata(path).is_ok() {
        anyhow::bail!(
            "{} already exists; it is left as it is (choose another {choose}, or remove it first)",
            path.display()
        );
    }
    Ok(())
}

/// Removes the folder `dir` that the harness wrote, and only what it wrote: the files whose
/// names `owned` accepts, then the folder itself. Anything else inside (a file of the user's, a
/// subfolder) is an error naming it, and nothing is removed. A missing `dir` is not an error.
pub fn remove_owned_dir(dir: &Path, owned: impl Fn(&str) -> bool) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot read {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if !is_file || !owned(&name) {
            anyhow::bail!(
                "{} was not written by the harness; {} is left as it is (move it away, or \
                 remove the folder yourself)",
                entry.path().display(),
                dir.display()
            );
        }
        files.push(entry.path());
    }
    for file in files {
        std::fs::remove_file(&file).with_context(|| format!("cannot remove {}", file.display()))?;
    }
    std::fs::remove_dir(dir).with_context(|| format!("cannot remove {}", dir.display()))
}

/// The error of a run directory another process holds: `burn-lra train` exits with
/// [`crate::EXIT_IN_USE`] on it, and a sweep leaves that run to the holder.
#[derive(Debug)]
pub struct RunDirInUse(pub std::path::PathBuf);

impl std::fmt::Display for RunDirInUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is in use: another process is training in it",
            self.0.display()
        )
    }
}

impl std::error::Error for RunDirInUse {}

/// An exclusive lock on a run directory (`flock` on its `.lock` file), held while a process
/// trains in it and released when dropped or when the process ends, however it ends. (`flock`
/// works across the hosts of a cluster on NFS v4 and Lustre; see docs/sweeps.md.)
pub struct RunDirLock {
    _file: std::fs::File,
}

impl RunDirLock {
    /// Takes the lock of `run_dir`, or fails at once with [`RunDirInUse`] when another process
    /// holds it.
    pub fn acquire(run_dir: &Path) -> Result<Self> {
        let file = open_lock_file(run_dir, true)?.expect("created");
        if !flock(&file, false) {
            return Err(RunDirInUse(run_dir.to_path_buf()).into());
        }
        Ok(Self { _file: file })
    }

    /// Waits until no process holds the lock of `run_dir` (returns at once when none does, or
    /// when the directory has no lock file).
    pub fn wait_until_free(run_dir: &Path) -> Result<()> {
        if let Some(file) = open_lock_file(run_dir, false)? {
            flock(&file, true);
        }
        Ok(())
    }

    /// Whether another process holds the lock of `run_dir` now.
    pub fn is_held(run_dir: &Path) -> Result<bool> {
        Ok(match open_lock_file(run_dir, false)? {
            Some(file) => !flock(&file, false),
            None => false,
        })
    }
}

/// Opens `run_dir/.lock`, creating it when `create` (else `None` when it does not exist).
fn open_lock_file(run_dir: &Path, create: bool) -> Result<Option<std::fs::File>> {
    let path = run_dir.join(LOCK);
    match std::fs::OpenOptions::new()
        .create(create)
        .truncate(false)
        .write(true)
        .open(&path)
    {
        Ok(file) => Ok(Some(file)),
        Err(e) if !create && e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot open {}", path.display())),
    }
}

/// Takes an exclusive `flock` on `file` (waiting for it when `wait`); whether it was taken.
/// Elsewhere than on Unix, always taken (no lock).
fn flock(file: &std::fs::File, wait: bool) -> bool {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        let mode = if wait {
            libc::LOCK_EX
        } else {
            libc::LOCK_EX | libc::LOCK_NB
        };
        loop {
            // SAFETY: flock on a descriptor the caller owns; no memory is involved.
            if unsafe { libc::flock(file.as_raw_fd(), mode) } == 0 {
                return true;
            }
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return false;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (file, wait);
        true
    }
}
/// Reads the JSON file `path` as a `T`; an unreadable file is an error naming it, and one that
/// is not a `T` says "`path`: not `what`" (`what`: "a run result", say).
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not {what}", path.display()))
}
