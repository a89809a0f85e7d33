//! `bench lra`: LRA's efficiency protocol, a task model's training steps per second and peak
//! memory at each length (the Text task's by default), ours (`burn-lra bench-train`) beside
//! PyTorch's (`bench/torch_lra.py`, which builds the same model from what ours describes).

use std::process::Command;

use anyhow::Result;
use serde_json::{Value, json};

use super::Args;
use super::protocol::{Benchmark, Session, case_args, figure, quadratic_skip, scores_gib, strings};
use super::rounds::{Case, Invocation, run_case};
use super::variants::has_torch;

/// `bench lra` with its settings.
pub(crate) struct LraBenchmark<'a> {
    /// The settings.
    pub args: &'a Args,
}

impl Benchmark for LraBenchmark<'_> {
    fn name(&self) -> &'static str {
        "lra"
    }

    fn script(&self) -> Option<&'static str> {
        Some("torch_lra.py")
    }

    fn case(&self, session: &Session, name: &str, n: usize) -> Result<Case> {
        let args = self.args;
        let mut common = case_args(name, n, args);
        common.extend(strings(&["--steps", &args.reps.to_string()]));
        let model_flags = [
            "--task",
            &args.task,
            "--preset",
            &args.preset,
            "--backend",
            args.backend.name(),
        ];
        // The model, optimiser and attention parameters the preset resolves to at this length,
        // which the PyTorch side builds too.
        let mut describe = Command::new(&session.harness);
        describe
            .args(["bench-train", "--describe"])
            .args(model_flags)
            .args(&common);
        let described = run_case(describe, session.timeout)
            .map_err(|e| anyhow::anyhow!("{name} at n={n}: {e}"))?;
        let model = &described["model"];
        let (layers, heads) = (
            model["n_layers"].as_u64().unwrap_or(1) as f64,
            model["n_heads"].as_u64().unwrap_or(1) as f64,
        );
        // Training keeps about three n × n tensors per head and layer for the backward.
        let scores = scores_gib(3.0, layers * heads, args.batch, n);
        let ours = match quadratic_skip(name, args, scores) {
            Some(reason) => Err(reason),
            None => {
                let mut ours = vec!["bench-train"];
                ours.extend(model_flags);
                Ok(Invocation::new(session.harness.as_ref(), &ours, &common))
            }
        };
        let script = session
            .script
            .as_ref()
            .filter(|_| args.torch && has_torch(name));
        let torch = script.map(|script| {
            let script = script.to_string_lossy();
            Invocation::new(
                "python3".as_ref(),
                &[
                    &script,
                    "--threads",
                    &session.threads.to_string(),
                    "--device",
                    &args.torch_device,
                    "--model",
                    &described["model"].to_string(),
                    "--optimizer",
                    &described["optimizer"].to_string(),
                    "--params",
                    &described["params"].to_string(),
                    "--vocab",
                    &described["vocab_size"].to_string(),
                    "--classes",
                    &described["n_classes"].to_string(),
                ],
                &common,
            )
        });
        Ok(Case {
            name: name.to_string(),
            n,
            params: described["params"].clone(),
            ours,
            torch,
        })
    }

    fn show(&self, v: &Value) -> String {
        format!(
            "{:.2} steps/s ({:.0} ms/step), peak {:.0} MiB",
            figure(v, "steps_per_s"),
            figure(v, "step_ms"),
            figure(v, "peak_mib")
        )
    }

    fn setup(&self) -> Value {
        let args = self.args;
        args.setup(json!({
            "task": args.task, "preset": args.preset, "batch": args.batch,
            "torch_device": args.torch_device,
        }))
    }
}
