//! Atomic writes, and the lock that keeps one process per run directory.

use std::path::Path;

use anyhow::{Context, Result};

use crate::layout::LOCK;

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
/// works across the hosts of a cluster on NFS v4 and Lustre; see the README.)
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
