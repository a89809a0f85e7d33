//! What a crate that depends on the library with its default features builds: inference on
//! `flex` only, without Burn's training pieces (`autodiff`, `optim`) or flex's performance
//! choices (`rayon`, `simd`, `x86-v4`), which the library's own `train`, `fast` and `x86-v4`
//! features add. Read from `cargo tree` over the library alone (without its dev-dependencies),
//! which resolves features exactly as a dependent crate's build does.

use std::process::Command;

/// `cargo tree` over the library with its default features, with `args` added.
fn tree(args: &[&str]) -> String {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "--manifest-path", manifest])
        .args(["-p", "burn-attention-zoo", "--prefix", "none"])
        .args(args)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("cargo tree prints UTF-8")
}

#[test]
fn default_features_build_only_what_inference_needs() {
    let packages = tree(&["-e", "normal", "-f", "{p}"]);
    for name in ["burn-flex", "burn-nn"] {
        assert!(
            packages.lines().any(|l| l.starts_with(&format!("{name} "))),
            "{name} missing from the default build:\n{packages}"
        );
    }
    for name in [
        "burn-autodiff",
        "burn-optim",
        "burn-train",
        "burn-ndarray",
        "burn-cubecl",
    ] {
        assert!(
            !packages.lines().any(|l| l.starts_with(&format!("{name} "))),
            "the default build pulls in {name}"
        );
    }
    // Features of Burn and of its flex backend that the default build turns on: `{f}` prints
    // them comma-separated after the package's name and version.
    let features = tree(&["-e", "normal", "-f", "{p} {f}"]);
    let turned_on = |package: &str| -> Vec<String> {
        let prefix = format!("{package} v");
        features
            .lines()
            .filter(|l| l.starts_with(&prefix))
            .flat_map(|l| {
                let list = l.split(' ').nth(2).unwrap_or_default();
                list.split(',').map(str::to_string).collect::<Vec<_>>()
            })
            .collect()
    };
    let burn = turned_on("burn");
    for feature in ["autodiff", "optim", "rayon", "simd", "x86-v4"] {
        assert!(
            !burn.iter().any(|f| f == feature),
            "burn's `{feature}` is on by default: {burn:?}"
        );
    }
    let flex = turned_on("burn-flex");
    for feature in ["rayon", "simd", "x86-v4"] {
        assert!(
            !flex.iter().any(|f| f == feature),
            "burn-flex's `{feature}` is on by default: {flex:?}"
        );
    }
    assert!(
        burn.iter().any(|f| f == "flex"),
        "burn's `flex` is off: {burn:?}"
    );
}
