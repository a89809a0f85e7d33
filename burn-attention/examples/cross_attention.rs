//! Cross-attention: queries from one sequence reading keys and values from another of a
//! different length, each side with its own padding, for every registered variant that supports
//! it.
//!
//! ```sh
//! cargo run --release --example cross_attention
//! ```
//!
//! A batch of two: 6 and 4 real queries (padded to 8) read a memory of 50 and 31 real positions
//! (padded to 64). Each output is compared with the same pair run alone, without padding: the
//! largest difference shows that padding on either side changes no real output.

use burn::prelude::*;
use burn::tensor::Distribution;
use burn_attention_zoo::{
    AttentionConfig, AttentionInput, AttentionModule, VARIANTS, padding_mask_from_lengths,
};

fn main() {
    let device = Device::flex();
    device.seed(0);
    let (d_model, heads) = (64, 4);
    let (n_q, n_k) = (8, 64);
    let (q_lens, k_lens) = ([6, 4], [50, 31]);
    let queries = Tensor::<3>::random([2, n_q, d_model], Distribution::Normal(0.0, 1.0), &device);
    let memory = Tensor::<3>::random([2, n_k, d_model], Distribution::Normal(0.0, 1.0), &device);

    println!("| attention | output | largest difference to unpadded |");
    println!("|---|---|---|");
    for info in VARIANTS.iter().filter(|v| v.capabilities.cross_attention) {
        let config = AttentionConfig::from_name(info.name, d_model, heads, n_k)
            .expect("a registered name")
            .with_weight_dropout(0.0);
        let attention = config.init(&device);
        // Keys and values from the memory, queries from their own sequence; both padded.
        let input = AttentionInput::cross(queries.clone(), memory.clone(), memory.clone())
            .mask_pad(padding_mask_from_lengths(&k_lens, n_k, &device))
            .mask_pad_query(padding_mask_from_lengths(&q_lens, n_q, &device));
        let output = match attention.try_forward(input) {
            Ok(output) => output,
            Err(err) => {
                println!("| {} | refused: {err} | |", info.name);
                continue;
            }
        };
        let mut largest = 0.0f32;
        for b in 0..2 {
            let q = queries.clone().slice(s![b..b + 1, 0..q_lens[b]]);
            let m = memory.clone().slice(s![b..b + 1, 0..k_lens[b]]);
            let alone = attention.forward(AttentionInput::cross(q, m.clone(), m));
            let padded = output.clone().slice(s![b..b + 1, 0..q_lens[b]]);
            largest = largest.max((padded - alone).abs().max().into_scalar());
        }
        println!("| {} | {:?} | {largest:.1e} |", info.name, output.dims());
    }
}
