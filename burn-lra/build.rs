//! Two facts of the checkout compiled into the harness:
//!
//! - the presets: every `configs/<task>/<preset>.toml`, as `$OUT_DIR/presets.rs` (a task's
//!   presets are its folder's files; nothing lists them by hand);
//! - the commit it is built from, so that every run names the code that trained it
//!   (`result.json`'s `commits`): `BURN_LRA_COMMIT` is the checkout's `git rev-parse HEAD`, with
//!   `-dirty` appended when tracked files differ from it; unset outside a git checkout.

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
    write_presets(&root.join("configs"));
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

/// Writes `$OUT_DIR/presets.rs`: `PRESET_FILES`, `(task, preset, contents)` for every
/// `configs/<task>/<preset>.toml`, sorted by task and preset.
fn write_presets(configs: &Path) {
    let mut presets = Vec::new();
    let folders = std::fs::read_dir(configs).expect("the workspace's configs/ folder");
    for folder in folders.map(|entry| entry.expect("a readable configs/ folder").path()) {
        if !folder.is_dir() {
            continue;
        }
        let task = folder.file_name().unwrap().to_string_lossy().into_owned();
        for file in std::fs::read_dir(&folder).expect("a readable task folder") {
            let file = file.expect("a readable task folder").path();
            if file.extension().is_some_and(|e| e == "toml") {
                let preset = file.file_stem().unwrap().to_string_lossy().into_owned();
                presets.push((task.clone(), preset, file.canonicalize().unwrap()));
            }
        }
    }
    presets.sort();
    let mut code =
        String::from("/// Every `configs/<task>/<preset>.toml`: `(task, preset, contents)`.\n");
    code.push_str("pub const PRESET_FILES: &[(&str, &str, &str)] = &[\n");
    for (task, preset, path) in &presets {
        code.push_str(&format!(
            "    ({task:?}, {preset:?}, include_str!({:?})),\n",
            path.display().to_string()
        ));
    }
    code.push_str("];\n");
    let out = Path::new(&std::env::var("OUT_DIR").unwrap()).join("presets.rs");
    std::fs::write(out, code).expect("a writable OUT_DIR");
}
