//! The harness binary a sweep or a benchmark runs: built with the backend's feature, or given
//! (`--harness`), and run from a private copy.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use lra_runs::BackendKind;

/// The workspace's root folder.
pub(crate) fn workspace_root() -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf();
    if built.join("Cargo.toml").is_file() {
        return built;
    }
    // An xtask binary carried to another machine (a GPU machine without Rust, given the
    // binaries built here) runs from a copy of the workspace: its current folder.
    std::env::current_dir().unwrap_or(built)
}

/// A private copy of the burn-lra binary. On Linux the copy is deleted as soon as it is open and
/// runs through its descriptor (`/proc/self/fd/N`), so nothing is left on disk however the sweep
/// ends (SIGTERM and SIGKILL included); elsewhere its folder is removed when the sweep ends.
pub(crate) struct Harness {
    /// What `Command::new` runs.
    path: PathBuf,
    /// The open, already deleted copy (Linux).
    _file: Option<std::fs::File>,
    /// The folder to remove on drop (not Linux).
    folder: Option<PathBuf>,
}

impl Harness {
    #[cfg(target_os = "linux")]
    fn new(copy: &Path, folder: &Path) -> Result<Self> {
        use std::os::fd::AsRawFd;
        let file =
            std::fs::File::open(copy).with_context(|| format!("cannot open {}", copy.display()))?;
        std::fs::remove_dir_all(folder)
            .with_context(|| format!("cannot remove {}", folder.display()))?;
        Ok(Self {
            path: PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd())),
            _file: Some(file),
            folder: None,
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn new(copy: &Path, folder: &Path) -> Result<Self> {
        Ok(Self {
            path: copy.to_path_buf(),
            _file: None,
            folder: Some(folder.to_path_buf()),
        })
    }

    /// Writes a copy of the binary to `path` (executable), for runs started elsewhere (Slurm
    /// array tasks on the cluster's nodes).
    pub(crate) fn copy_to(&self, path: &Path) -> Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        let tmp = path.with_extension("tmp");
        std::fs::copy(&self.path, &tmp)
            .with_context(|| format!("cannot copy the harness to {}", tmp.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
                .with_context(|| format!("cannot make {} executable", tmp.display()))?;
        }
        std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(folder) = &self.folder {
            let _ = std::fs::remove_dir_all(folder);
        }
    }
}

impl AsRef<std::ffi::OsStr> for Harness {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }
}

/// Makes the child receive SIGTERM when this process ends (Linux), so that a sweep stopped by a
/// signal stops its training run too instead of leaving it running unattended (the run resumes
/// from its checkpoint next time).
pub(crate) fn stop_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

/// A private copy of `given` (a burn-lra binary built beforehand), or else of burn-lra built
/// with the backend's feature.
pub(crate) fn harness(given: Option<&Path>, backend: BackendKind) -> Result<Harness> {
    match given {
        Some(path) => private_copy(path, backend),
        None => build_harness(backend),
    }
}

/// Builds burn-lra with the backend's feature in the release profile (sweeps and benchmarks
/// alike: the dev profile builds the workspace at opt-level 1, which trains 1.4-1.95x slower)
/// and returns a private copy of the binary.
pub(crate) fn build_harness(backend: BackendKind) -> Result<Harness> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root()).args([
        "build",
        "--release",
        "--package",
        "burn-lra",
        "--features",
        backend.feature(),
    ]);
    let status = cmd.status().context("cannot run cargo")?;
    if !status.success() {
        bail!(
            "building burn-lra with feature `{}` failed",
            backend.feature()
        );
    }
    let exe = format!("burn-lra{}", std::env::consts::EXE_SUFFIX);
    private_copy(&target_dir().join("release").join(&exe), backend)
}

/// Cargo's target folder (`CARGO_TARGET_DIR`, else the workspace's `target/`).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// A private copy of the binary at `path`: a later `cargo build`/`cargo test` with other
/// features rewrites target/debug/burn-lra while the sweep is still going.
fn private_copy(path: &Path, backend: BackendKind) -> Result<Harness> {
    let private = target_dir()
        .join("xtask")
        .join(format!("{}-{backend}", std::process::id()));
    std::fs::create_dir_all(&private)
        .with_context(|| format!("cannot create {}", private.display()))?;
    let copy = private.join(path.file_name().unwrap_or_default());
    std::fs::copy(path, &copy).with_context(|| {
        format!(
            "cannot copy the harness {} to {}",
            path.display(),
            copy.display()
        )
    })?;
    Harness::new(&copy, &private)
}

/// Refuses a task the harness does not register, listing those it does.
pub(crate) fn check_task(task: &lra_runs::Task, harness: &Harness) -> Result<()> {
    let registered = harness_names(harness, &["tasks"])?;
    if !registered.iter().any(|name| task == name.as_str()) {
        bail!("unknown task `{task}` (known: {})", registered.join(", "));
    }
    Ok(())
}

/// The names `burn-lra <command> --names` prints, one per line.
fn harness_names(harness: &Harness, command: &[&str]) -> Result<Vec<String>> {
    let output = Command::new(harness)
        .args(command)
        .arg("--names")
        .output()?;
    if !output.status.success() {
        bail!("burn-lra {} --names failed", command.join(" "));
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect())
}

/// The attentions a `--attention` list names: every registered one (with `causal_only`, every
/// one with a causal form) when the list is empty or `all`; a hybrid stack by its pattern
/// (`gla+local`, each part registered); an unknown name is an error that lists the registered
/// ones.
pub(crate) fn resolve_attentions(
    list: &[String],
    harness: &Harness,
    causal_only: bool,
) -> Result<Vec<lra_runs::AttentionName>> {
    let parse = |name: &str| lra_runs::AttentionName::new(name).map_err(anyhow::Error::msg);
    let registered = harness_names(harness, &["list"])?;
    let every = || -> Result<Vec<lra_runs::AttentionName>> {
        match causal_only {
            true => harness_names(harness, &["list", "--causal"])?,
            false => registered.clone(),
        }
        .iter()
        .map(|name| parse(name))
        .collect()
    };
    match list {
        [] => every(),
        [all] if all == "all" => every(),
        list => {
            let mut names = Vec::with_capacity(list.len());
            for name in list {
                let name = parse(name)?;
                let parts = name.parts();
                if let Some((i, unknown)) =
                    (parts.iter().enumerate()).find(|(_, a)| !registered.iter().any(|r| r == *a))
                {
                    let place = match parts.len() {
                        1 => String::new(),
                        n => format!(" (layer {} of {n} of the pattern `{name}`)", i + 1),
                    };
                    bail!(
                        "unknown attention `{unknown}`{place} (known: all, {})",
                        registered.join(", ")
                    );
                }
                names.push(name);
            }
            Ok(names)
        }
    }
}
