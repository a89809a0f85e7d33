//! `bench decode`: what generating one more token costs, at each position: the time of one
//! decoding step after a prompt of n tokens and the size of the state it decodes from, ours
//! (`burn-lra bench-decode`) only. The point is how the cost grows with the position: a
//! key/value cache (softmax) grows with every token, the recurrent and decaying states
//! (kernelized, retnet, gla, mamba2, the delta rule) do not.

use anyhow::Result;
use serde_json::{Value, json};

use super::Args;
use super::protocol::{Benchmark, Session, case_args, figure, strings};
use super::rounds::{Case, Invocation};
use super::variants::decode_params;

/// `bench decode` with its settings.
pub(crate) struct DecodeBenchmark<'a> {
    /// The settings.
    pub args: &'a Args,
}

impl Benchmark for DecodeBenchmark<'_> {
    fn name(&self) -> &'static str {
        "decode"
    }

    fn script(&self) -> Option<&'static str> {
        None
    }

    fn causal_only(&self) -> bool {
        true
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
            &decode_params(name).to_string(),
        ]));
        let ours = ["bench-decode", "--backend", args.backend.name()];
        Ok(Case {
            name: name.to_string(),
            n,
            params: decode_params(name),
            ours: Ok(Invocation::new(session.harness.as_ref(), &ours, &common)),
            torch: None,
        })
    }

    fn show(&self, v: &Value) -> String {
        format!(
            "{:.2} ms a token, state {:.2} MiB, prefill {:.0} ms",
            figure(v, "token_ms"),
            figure(v, "state_mib"),
            figure(v, "prefill_ms")
        )
    }

    fn setup(&self) -> Value {
        let args = self.args;
        args.setup(json!({"batch": args.batch, "heads": args.heads, "d_model": args.d_model}))
    }
}
