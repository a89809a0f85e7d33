//! `bench attention`: one attention layer at doubling lengths, forward and forward + backward
//! time and peak memory, ours (`burn-lra bench-attention`) beside PyTorch's
//! (`bench/torch_attention.py`); with `--causal`, causal masking, beside PyTorch where the
//! script has the variant's causal form.

use anyhow::Result;
use serde_json::{Value, json};

use super::Args;
use super::protocol::{Benchmark, Session, case_args, figure, quadratic_skip, scores_gib, strings};
use super::rounds::{Case, Invocation};
use super::variants::{has_torch, has_torch_causal, params};

/// `bench attention` with its settings.
pub(crate) struct AttentionBenchmark<'a> {
    /// The settings.
    pub args: &'a Args,
}

impl Benchmark for AttentionBenchmark<'_> {
    fn name(&self) -> &'static str {
        if self.args.causal {
            "attention-causal"
        } else {
            "attention"
        }
    }

    fn script(&self) -> Option<&'static str> {
        Some("torch_attention.py")
    }

    fn causal_only(&self) -> bool {
        self.args.causal
    }

    fn case(&self, session: &Session, name: &str, n: usize) -> Result<Case> {
        let args = self.args;
        let mut common = case_args(name, n, args);
        common.extend(strings(&[
            "--heads",
            &args.heads.to_string(),
            "--d-model",
            &args.d_model.to_string(),
            "--reps",
            &args.reps.to_string(),
            "--params",
            &params(name).to_string(),
        ]));
        // Forward + backward keeps about three n × n tensors per head.
        let scores = scores_gib(3.0, args.heads as f64, args.batch, n);
        let ours = match quadratic_skip(name, args, scores) {
            Some(reason) => Err(reason),
            None => {
                let mut ours = vec!["bench-attention", "--backend", args.backend.name()];
                if args.causal {
                    ours.push("--causal");
                }
                Ok(Invocation::new(session.harness.as_ref(), &ours, &common))
            }
        };
        // Causal, only where the script has the variant's causal form.
        let with_torch = if args.causal {
            has_torch_causal(name)
        } else {
            has_torch(name)
        };
        let script = session.script.as_ref().filter(|_| args.torch && with_torch);
        let torch = script.map(|script| {
            let script = script.to_string_lossy();
            let threads = session.threads.to_string();
            let mut flags = vec![
                script.as_ref(),
                "--threads",
                &threads,
                "--device",
                &args.torch_device,
            ];
            if args.causal {
                flags.push("--causal");
            }
            Invocation::new("python3".as_ref(), &flags, &common)
        });
        Ok(Case {
            name: name.to_string(),
            n,
            params: params(name),
            ours,
            torch,
        })
    }

    fn show(&self, v: &Value) -> String {
        format!(
            "fwd {:.1} ms, fwd+bwd {:.1} ms, peak {:.0} MiB",
            figure(v, "forward_ms"),
            figure(v, "forward_backward_ms"),
            figure(v, "peak_mib")
        )
    }

    fn setup(&self) -> Value {
        let args = self.args;
        args.setup(json!({
            "batch": args.batch, "heads": args.heads, "d_model": args.d_model,
            "causal": args.causal, "torch_device": args.torch_device,
        }))
    }
}
