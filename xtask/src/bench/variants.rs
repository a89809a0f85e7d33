//! Every variant's benchmark facts in one table: its PyTorch counterpart (in
//! `bench/torch_attention.py`), the parameters both sides use so that they do the same work, and
//! whether it keeps n × n scores. A registry name missing here has no PyTorch counterpart, runs
//! with its defaults and keeps no n × n scores.

use serde_json::Value;

/// The PyTorch packages of the comparison (`cargo xtask bench setup`).
pub(crate) const PIP_PACKAGES: &[&str] = &[
    "torch==2.9.0",
    "numpy",
    "einops",
    "linformer",
    "performer-pytorch",
    "nystrom-attention",
    "local-attention",
    "reformer-pytorch",
    "sinkhorn-transformer",
    "transformers",
    "memory-compressed-attention",
    "isab-pytorch",
    "axial-attention",
    "compressive-transformer-pytorch",
    "routing-transformer",
];

/// Where a variant keeps n × n scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scores {
    /// Never: its memory grows at most linearly in n.
    Never,
    /// Where it is composed from tensor operations; not on `flex` nor on `tch` (CPU), where it
    /// runs fused with memory linear in n, forward and backward.
    Composed,
    /// On every backend (no fused form).
    Always,
    /// `n × n/c` where composed: each query scores `n/c` compressed keys. The non-causal form
    /// runs the fused softmax on `flex` and `tch` (CPU), memory linear in n (1.4 GiB at the
    /// `small` model, n = 4,096, batch 32, where `n × n/c` scores would take 8); the causal form
    /// composes its scores on every backend.
    Compressed(usize),
}

/// One variant's benchmark facts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BenchFacts {
    /// Registry name.
    pub name: &'static str,
    /// Its PyTorch counterpart, by where it comes from (`None`: not measured on that side).
    pub torch: Option<&'static str>,
    /// The parameters both sides use, as JSON.
    pub params: &'static str,
    /// Where it keeps n × n scores.
    pub scores: Scores,
}

/// The variants with anything particular to the benchmarks.
pub(crate) const FACTS: &[BenchFacts] = &[
    BenchFacts {
        name: "softmax",
        torch: Some("bench/torch_attention.py"),
        params: "{}",
        scores: Scores::Composed,
    },
    BenchFacts {
        name: "linear",
        torch: Some("bench/torch_attention.py"),
        params: "{}",
        scores: Scores::Never,
    },
    BenchFacts {
        name: "efficient",
        torch: Some("bench/torch_attention.py"),
        params: "{}",
        scores: Scores::Never,
    },
    BenchFacts {
        name: "linformer",
        torch: Some("linformer"),
        params: r#"{"k":256}"#,
        scores: Scores::Never,
    },
    BenchFacts {
        name: "linformer-linear",
        torch: None,
        params: r#"{"k":256}"#,
        scores: Scores::Never,
    },
    BenchFacts {
        name: "performer",
        torch: Some("performer-pytorch"),
        params: r#"{"n_features":256}"#,
        scores: Scores::Never,
    },
    BenchFacts {
        name: "performer-relu",
        torch: Some("performer-pytorch"),
        params: "{}",
        scores: Scores::Never,
    },
    BenchFacts {
        name: "nystrom",
        torch: Some("nystrom-attention"),
        params: r#"{"n_landmarks":64}"#,
        scores: Scores::Never,
    },
    BenchFacts {
        name: "local",
        torch: Some("local-attention"),
        params: r#"{"block_size":50}"#,
        scores: Scores::Never,
    },
    BenchFacts {
        name: "reformer",
        torch: Some("reformer-pytorch"),
        params: r#"{"chunk_len":64,"n_hashes":2}"#,
        scores: Scores::Never,
    },
    // sinkhorn-transformer needs lengths divisible by its blocks: 64 divides the powers of two
    // the benchmark runs (LRA's 50 does not).
    BenchFacts {
        name: "sinkhorn",
        torch: Some("sinkhorn-transformer"),
        params: r#"{"block_size":64}"#,
        scores: Scores::Never,
    },
    BenchFacts {
        name: "longformer",
        torch: Some("transformers"),
        params: r#"{"window":512}"#,
        scores: Scores::Never,
    },
    BenchFacts {
        name: "bigbird",
        torch: Some("transformers"),
        params: r#"{"block_size":64,"random_blocks":3}"#,
        scores: Scores::Never,
    },
    BenchFacts {
        name: "memory-compressed",
        torch: Some("memory-compressed-attention"),
        params: r#"{"compression":3}"#,
        scores: Scores::Compressed(3),
    },
    BenchFacts {
        name: "set-transformer",
        torch: Some("isab-pytorch"),
        params: r#"{"n_inducing":32}"#,
        scores: Scores::Never,
    },
    // The grid read as a square: the benchmark's lengths (powers of four) are squares.
    BenchFacts {
        name: "axial",
        torch: Some("axial-attention"),
        params: "{}",
        scores: Scores::Never,
    },
    // compressive-transformer-pytorch's segment attention, without compressed memory for
    // Transformer-XL (no package has Transformer-XL's attention alone); the defaults of both
    // sides agree (segments, memory and compressed memory of 512, rate 3).
    BenchFacts {
        name: "transformer-xl",
        torch: Some("compressive-transformer-pytorch"),
        params: "{}",
        scores: Scores::Never,
    },
    BenchFacts {
        name: "compressive",
        torch: Some("compressive-transformer-pytorch"),
        params: "{}",
        scores: Scores::Never,
    },
    BenchFacts {
        name: "routing",
        torch: Some("routing-transformer"),
        params: r#"{"n_clusters":32,"window":128}"#,
        scores: Scores::Never,
    },
    // Retention written from the paper's chunkwise form in bench/torch_attention.py (no
    // package has it alone), non-causal as the benchmark runs: both directions less the diagonal.
    BenchFacts {
        name: "retnet",
        torch: Some("bench/torch_attention.py"),
        params: "{}",
        scores: Scores::Never,
    },
    // The rest of the family, written the same way from each paper's chunkwise form (their
    // packages, flash-linear-attention and mamba-ssm, need a GPU), non-causal as the benchmark
    // runs: both scans of the library's non-causal forms.
    BenchFacts {
        name: "mamba2",
        torch: Some("bench/torch_attention.py"),
        params: "{}",
        scores: Scores::Never,
    },
    BenchFacts {
        name: "gla",
        torch: Some("bench/torch_attention.py"),
        params: "{}",
        scores: Scores::Never,
    },
    BenchFacts {
        name: "deltanet",
        torch: Some("bench/torch_attention.py"),
        params: "{}",
        scores: Scores::Never,
    },
    BenchFacts {
        name: "gated-deltanet",
        torch: Some("bench/torch_attention.py"),
        params: "{}",
        scores: Scores::Never,
    },
    BenchFacts {
        name: "hedgehog",
        torch: Some("bench/torch_attention.py"),
        params: "{}",
        scores: Scores::Never,
    },
    BenchFacts {
        name: "synthesizer-dense",
        torch: None,
        params: "{}",
        scores: Scores::Always,
    },
];

/// The facts of `attention` (the defaults for a name the table does not list).
pub(crate) fn facts(attention: &str) -> BenchFacts {
    FACTS
        .iter()
        .find(|facts| facts.name == attention)
        .copied()
        .unwrap_or(BenchFacts {
            name: "",
            torch: None,
            params: "{}",
            scores: Scores::Never,
        })
}

/// Whether `attention` has a PyTorch counterpart.
pub(crate) fn has_torch(attention: &str) -> bool {
    facts(attention).torch.is_some()
}

/// The attentions whose PyTorch side has a causal form in bench/torch_attention.py (its
/// `CAUSAL`): with `--causal` only these are measured beside PyTorch.
const TORCH_CAUSAL: &[&str] = &[
    "softmax",
    "retnet",
    "mamba2",
    "gla",
    "deltanet",
    "gated-deltanet",
    "hedgehog",
];

/// Whether `bench attention --causal` has a PyTorch side for `attention`.
pub(crate) fn has_torch_causal(attention: &str) -> bool {
    has_torch(attention) && TORCH_CAUSAL.contains(&attention)
}

/// The parameters both sides use for `attention` (`bench attention`).
pub(crate) fn params(attention: &str) -> Value {
    serde_json::from_str(facts(attention).params).expect("the table's parameters are JSON")
}

/// The parameters `bench decode` uses for `attention`: [`params`]'s, and rows of 64 positions for
/// `axial`, whose default grid is square (a prompt plus the decoded token is rarely a square).
pub(crate) fn decode_params(attention: &str) -> Value {
    let mut params = params(attention);
    if attention == "axial" {
        params["width"] = 64.into();
    }
    params
}

/// The share of an n × n score matrix `attention` keeps on `backend`, causal or not (0: none).
pub(crate) fn scores_fraction(attention: &str, backend: &str, causal: bool) -> f64 {
    let fused = ["flex", "tch"].contains(&backend);
    match facts(attention).scores {
        Scores::Never => 0.0,
        Scores::Composed if fused => 0.0,
        Scores::Composed | Scores::Always => 1.0,
        Scores::Compressed(_) if fused && !causal => 0.0,
        Scores::Compressed(c) => 1.0 / c as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each name once, every parameter table JSON, and the PyTorch script names what the table
    /// says it measures.
    #[test]
    fn the_table_is_well_formed() {
        let script = std::fs::read_to_string(
            crate::harness::workspace_root().join("bench/torch_attention.py"),
        )
        .unwrap();
        for (i, facts) in FACTS.iter().enumerate() {
            assert!(
                FACTS[..i].iter().all(|other| other.name != facts.name),
                "{} twice",
                facts.name
            );
            assert!(params(facts.name).is_object(), "{}", facts.name);
            if facts.torch.is_some() {
                assert!(
                    script.contains(&format!("\"{}\"", facts.name)),
                    "bench/torch_attention.py does not build {}",
                    facts.name
                );
            }
        }
        let causal_line = script
            .lines()
            .find(|line| line.starts_with("CAUSAL = ("))
            .expect("bench/torch_attention.py lists its causal forms");
        let listed: Vec<&str> = causal_line
            .trim_start_matches("CAUSAL = (")
            .trim_end_matches(')')
            .split(", ")
            .map(|name| name.trim_matches('"'))
            .collect();
        assert_eq!(listed, TORCH_CAUSAL, "the causal lists differ");
        assert!(has_torch_causal("gla") && !has_torch_causal("performer"));
        assert_eq!(scores_fraction("softmax", "wgpu", false), 1.0);
        assert_eq!(scores_fraction("softmax", "flex", false), 0.0);
        assert_eq!(scores_fraction("synthesizer-dense", "flex", false), 1.0);
        assert_eq!(scores_fraction("memory-compressed", "flex", false), 0.0);
        assert_eq!(
            scores_fraction("memory-compressed", "flex", true),
            1.0 / 3.0
        );
        assert_eq!(
            scores_fraction("memory-compressed", "wgpu", false),
            1.0 / 3.0
        );
        assert!(scores_fraction("linear", "wgpu", false) == 0.0 && !has_torch("ff-glu"));
    }
}
