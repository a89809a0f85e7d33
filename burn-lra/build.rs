//! Records which commit the harness is built from, so that every run names the code that trained
//! it (`result.json`'s `commits`): `BURN_LRA_COMMIT` is the checkout's `git rev-parse HEAD`, with
//! `-dirty` appended when tracked files differ from it; unset outside a git checkout.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // What the recorded commit and its dirty state depend on: the sources of the crates the
    // harness is built from, and the checkout's HEAD, branch and index (where git keeps them,
    // worktrees included).
    for path in [
        "burn-lra/src",
        "burn-attention/src",
        "lra-runs/src",
        "configs",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }
    let Some(head) = git(&["rev-parse", "HEAD"]) else {
        return;
    };
    let branch = git(&["rev-parse", "--symbolic-full-name", "HEAD"]).unwrap_or_default();
    for name in ["HEAD", "index", "packed-refs", branch.as_str()] {
        if let Some(path) = git(&["rev-parse", "--git-path", name]).filter(|_| !name.is_empty())
            && Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
        .is_none_or(|status| !status.is_empty());
    let suffix = if dirty { "-dirty" } else { "" };
    println!("cargo:rustc-env=BURN_LRA_COMMIT={head}{suffix}");
}
