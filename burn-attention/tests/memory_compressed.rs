//! Memory-compressed attention against a float64 implementation of Liu et al. 2018's layer: keys
//! and values projected, then shortened by a strided convolution (kernel = stride = c, over all
//! channels, the sequence zero-filled to a multiple of c), softmax attention of every query
//! over them; causal: query i over the compressed blocks before its own and its own block's
//! keys up to itself. With the module's own parameters, self- and cross-attention, padding,
//! lengths that are and are not multiples of c, inputs at scale 1 and 4. The compression mixes
//! the heads' channels, so the module has no per-head form: the registry suite's per-head
//! references skip it and this file checks it whole.

mod reference;

use burn::prelude::*;
use burn_attention_zoo::{
    AttentionInput, AttentionModule, MemoryCompressedAttention, MemoryCompressedConfig,
    padding_mask_from_lengths,
};
use reference::{linear_f64, max_rel_err, normal_tensor, softmax_rows, strided_conv_f64, to_rows};

type Rows = Vec<Vec<f64>>;

const D_MODEL: usize = 12;
const HEADS: usize = 3;
/// Largest relative error of the f32 module against float64 (floor 0.01): each compressed key
/// sums `c · d_model` products (60 at c = 5) of inputs up to scale 4, and the outputs, small
/// beside those sums, carry their rounding (1.7e-4 seen); a wrong block, mask or padding is off
/// by O(1).
const TOLERANCE: f64 = 5e-4;

/// `x` followed by zero rows up to a multiple of `c`.
fn zero_filled(x: &[Vec<f64>], c: usize) -> Rows {
    let mut out = x.to_vec();
    out.resize(x.len().next_multiple_of(c), vec![0.0; x[0].len()]);
    out
}

/// The module's output for the real `queries` over the real rows of `memory`; `causal` (self-
/// attention) as the module docs state the rule.
fn memory_compressed_f64(
    m: &MemoryCompressedAttention,
    queries: &[Vec<f64>],
    memory: &[Vec<f64>],
    causal: bool,
) -> Rows {
    let c = m.compression;
    let q = linear_f64(&m.proj.query, queries);
    let k = linear_f64(&m.proj.key, memory);
    let v = linear_f64(&m.proj.value, memory);
    let kc = strided_conv_f64(&m.compress_keys, &zero_filled(&k, c), c);
    let vc = strided_conv_f64(&m.compress_values, &zero_filled(&v, c), c);
    let d_head = D_MODEL / HEADS;
    let head = |x: &[f64], h: usize| x[h * d_head..(h + 1) * d_head].to_vec();
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let mut merged = vec![Vec::with_capacity(D_MODEL); q.len()];
    for h in 0..HEADS {
        for (i, row) in merged.iter_mut().enumerate() {
            let qi = head(&q[i], h);
            // (score, value) of every key query i sees.
            let mut seen: Vec<(f64, Vec<f64>)> = Vec::new();
            let visible_blocks = if causal { i / c } else { kc.len() };
            for g in 0..visible_blocks {
                seen.push((dot(&qi, &head(&kc[g], h)), head(&vc[g], h)));
            }
            if causal {
                for j in (i / c) * c..=i {
                    seen.push((dot(&qi, &head(&k[j], h)), head(&v[j], h)));
                }
            }
            let scores: Vec<f64> = seen
                .iter()
                .map(|(s, _)| s / (d_head as f64).sqrt())
                .collect();
            let weights = &softmax_rows(&[scores])[0];
            let mut o = vec![0.0; d_head];
            for (w, (_, value)) in weights.iter().zip(&seen) {
                for (acc, x) in o.iter_mut().zip(value) {
                    *acc += w * x;
                }
            }
            row.extend(o);
        }
    }
    linear_f64(&m.proj.output, &merged)
}

fn rows_of(x: &Tensor<3>, b: usize, len: usize) -> Rows {
    let d = x.dims()[2];
    to_rows(&x.clone().slice(s![b..b + 1, 0..len]).reshape([len, d]))
}

fn module(compression: usize, device: &Device) -> MemoryCompressedAttention {
    MemoryCompressedConfig::new(D_MODEL, HEADS)
        .with_compression(compression)
        .with_bias(true)
        .init(device)
}

/// Self-attention, causal and not: 10 positions (second sequence 7 real, then padding with
/// large junk), at c = 3 (10 and 7 not multiples of it) and c = 5, scales 1 and 4.
#[test]
fn self_attention_matches_float64_reference() {
    let device = Device::flex();
    for compression in [3, 5] {
        let m = module(compression, &device);
        for scale in [1.0, 4.0] {
            let x =
                normal_tensor([2, 10, D_MODEL], 31 + compression as u64, &device).mul_scalar(scale);
            let lengths = [10, 7];
            let junk = normal_tensor([1, 3, D_MODEL], 37, &device).mul_scalar(50.0);
            let x = Tensor::cat(
                vec![
                    x.clone().slice(s![0..1]),
                    Tensor::cat(vec![x.slice(s![1..2, 0..7]), junk], 1),
                ],
                0,
            );
            for causal in [false, true] {
                let out = m.forward(
                    AttentionInput::new(x.clone())
                        .mask_pad(padding_mask_from_lengths(&lengths, 10, &device))
                        .causal(causal),
                );
                for (b, len) in lengths.into_iter().enumerate() {
                    let real = rows_of(&x, b, len);
                    let expected = memory_compressed_f64(&m, &real, &real, causal);
                    let err = max_rel_err(&rows_of(&out, b, len), &expected, 1e-2);
                    assert!(
                        err < TOLERANCE,
                        "c {compression}, scale {scale}, causal {causal}, batch {b}: \
                         relative error {err}"
                    );
                }
            }
        }
    }
}

/// Cross-attention: 7 queries (7 and 4 real) over 11 keys (11 and 5 real), scales 1 and 4.
#[test]
fn cross_attention_matches_float64_reference() {
    let device = Device::flex();
    let m = module(3, &device);
    for scale in [1.0, 4.0] {
        let random =
            |n: usize| normal_tensor([2, n, D_MODEL], 32 + n as u64, &device).mul_scalar(scale);
        let (queries, memory) = (random(7), random(11));
        let (q_lens, k_lens) = ([7, 4], [11, 5]);
        let out = m.forward(
            AttentionInput::cross(queries.clone(), memory.clone(), memory.clone())
                .mask_pad(padding_mask_from_lengths(&k_lens, 11, &device))
                .mask_pad_query(padding_mask_from_lengths(&q_lens, 7, &device)),
        );
        for b in 0..2 {
            let expected = memory_compressed_f64(
                &m,
                &rows_of(&queries, b, q_lens[b]),
                &rows_of(&memory, b, k_lens[b]),
                false,
            );
            let err = max_rel_err(&rows_of(&out, b, q_lens[b]), &expected, 1e-2);
            assert!(
                err < TOLERANCE,
                "scale {scale}, batch {b}: relative error {err}"
            );
        }
    }
}

/// A causal query never reads the future: changing positions after i leaves outputs up to i
/// unchanged, at every i of a 13-position sequence (blocks of 3 and a partial one).
#[test]
fn causal_outputs_ignore_the_future() {
    let device = Device::flex();
    let m = module(3, &device);
    let x = normal_tensor([1, 13, D_MODEL], 33, &device);
    let out = m.forward(AttentionInput::new(x.clone()).causal(true));
    for i in 0..12 {
        let changed = Tensor::cat(
            vec![
                x.clone().slice(s![.., 0..i + 1]),
                normal_tensor([1, 12 - i, D_MODEL], 100 + i as u64, &device).mul_scalar(9.0),
            ],
            1,
        );
        let other = m.forward(AttentionInput::new(changed).causal(true));
        other
            .slice(s![.., 0..i + 1])
            .into_data()
            .assert_approx_eq::<f32>(
                &out.clone().slice(s![.., 0..i + 1]).into_data(),
                burn::tensor::Tolerance::absolute(1e-6),
            );
    }
}

/// Refusals: an attention mask, the per-head form, and a compression of 0, each with an error
/// that names what.
#[test]
fn refuses_what_it_does_not_define() {
    let device = Device::flex();
    let m = module(3, &device);
    let x = Tensor::<3>::zeros([1, 4, D_MODEL], &device);
    let mask = Tensor::<3, Bool>::from_data(TensorData::new(vec![false; 16], [1, 4, 4]), &device);
    let masked = m
        .try_forward(AttentionInput::new(x).mask_attn(mask))
        .unwrap_err();
    assert!(masked.to_string().contains("attention mask"), "{masked}");
    let q = Tensor::<4>::zeros([1, HEADS, 4, D_MODEL / HEADS], &device);
    let per_head = m
        .attend(q.clone(), q.clone(), q, Default::default())
        .unwrap_err();
    assert!(per_head.to_string().contains("per-head"), "{per_head}");
    let zero = MemoryCompressedConfig::new(D_MODEL, HEADS)
        .with_compression(0)
        .validate()
        .unwrap_err();
    assert!(zero.to_string().contains("compression"), "{zero}");
}
