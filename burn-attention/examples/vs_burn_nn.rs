//! The library's attention built with its defaults beside burn-nn's `MultiHeadAttention`, side by
//! side in one process: one layer's forward and backward pass, rounds alternating between the
//! two, the median of each and their ratio.
//!
//! ```sh
//! cargo run --release --example vs_burn_nn                      # softmax, batch 4, n 2048
//! cargo run --release --example vs_burn_nn -- performer 1 4096  # attention, batch, n
//! ```
//!
//! Shape: d_model 128, 8 heads (burn-nn's `MultiHeadAttentionConfig::new(128, 8)`, whose
//! defaults drop 0.1 of the attention weights; the library's defaults drop none), on `flex`.

use std::time::Instant;

use burn::nn::attention::{MhaInput, MultiHeadAttentionConfig};
use burn::prelude::*;
use burn_attention_zoo::{AttentionConfig, AttentionInput, AttentionModule};

const D_MODEL: usize = 128;
const HEADS: usize = 8;
const ROUNDS: usize = 5;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let name = args.first().map_or("softmax", String::as_str);
    let count = |i: usize, default: usize| match args.get(i) {
        None => default,
        Some(v) => v.parse().unwrap_or_else(|_| {
            eprintln!("error: argument {}: not a count: {v}", i + 1);
            std::process::exit(2)
        }),
    };
    let (batch, n) = (count(1, 4), count(2, 2048));
    let device = Device::flex().autodiff();
    device.seed(0);
    let ours = match AttentionConfig::from_name(name, D_MODEL, HEADS, n) {
        Ok(config) => config.init(&device),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2)
        }
    };
    let theirs = MultiHeadAttentionConfig::new(D_MODEL, HEADS).init(&device);
    let x = Tensor::<3>::random([batch, n, D_MODEL], Default::default(), &device);
    let step = |f: &dyn Fn(Tensor<3>) -> Tensor<3>| {
        let started = Instant::now();
        let _ = f(x.clone().require_grad()).sum().backward();
        started.elapsed().as_secs_f64() * 1e3
    };
    let ours_step = |x| ours.forward(AttentionInput::new(x));
    let theirs_step = |x| theirs.forward(MhaInput::self_attn(x)).context;
    // One warm-up each, then alternating rounds.
    step(&ours_step);
    step(&theirs_step);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        a.push(step(&ours_step));
        b.push(step(&theirs_step));
    }
    let (a, b) = (median(a), median(b));
    println!(
        "batch {batch}, n {n}, d_model {D_MODEL}, {HEADS} heads, forward + backward, median of \
         {ROUNDS}:\n  burn-attention `{name}` (defaults): {a:.0} ms\n  burn-nn \
         MultiHeadAttention (defaults): {b:.0} ms\n  ratio ours / burn-nn: {:.2}",
        a / b
    );
}

fn median(mut ms: Vec<f64>) -> f64 {
    ms.sort_by(f64::total_cmp);
    ms[ms.len() / 2]
}
