//! Induced set attention against a float64 implementation of the Set Transformer's ISAB as Lee et
//! al. 2019 write it: `H = MAB(I, X) = LN(H' + rFF(H'))`, `H' = LN(I + Multihead(I, X, X))`, and
//! the attention's output `Multihead(X, H, H)` (in cross-attention `H = MAB(I, K, V)`: the
//! inducing points read the keys and take the values); with the module's own parameters, self-
//! and cross-attention (values unlike the keys), padding on both sides, inputs at scale 1 and 4.
//! The module's per-head form does not exist (its `H` passes through LayerNorms over all heads),
//! so the registry suite's per-head references skip it and this file checks it whole.

mod reference;

use burn::nn::LayerNorm;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn_attention_zoo::{
    AttentionInput, AttentionModule, QkvoProjection, SetTransformerAttention, SetTransformerConfig,
    padding_mask_from_lengths,
};
use reference::{
    linear_f64, matmul, matrix, max_rel_err, softmax_rows, to_rows, transpose, vector,
};

type Rows = Vec<Vec<f64>>;

const D_MODEL: usize = 16;
const HEADS: usize = 2;
const INDUCING: usize = 5;
const EPS: f64 = 1e-5;
/// The relative error allowed against the float64 ISAB. Over 400 fresh weight draws (seeds
/// 0-399) the module's largest error was 2.8e-4 (median 3.3e-5), always at inputs of scale 4,
/// where the two LayerNorms amplify f32 round-off; a wrong formula is off by 1e-1 or more (an
/// unbiased variance in the norms: 0.58; the feed-forward scaled by 1.01: 0.16).
const BOUND: f64 = 1e-3;

/// `(x − mean) / √(var + ε) · γ + β` over each row, the variance biased.
fn layer_norm_f64(norm: &LayerNorm, x: &[Vec<f64>]) -> Rows {
    let gamma = vector(&norm.gamma);
    let beta = norm.beta.as_ref().map_or(vec![0.0; gamma.len()], vector);
    x.iter()
        .map(|row| {
            let n = row.len() as f64;
            let mean = row.iter().sum::<f64>() / n;
            let var = row.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / n;
            row.iter()
                .enumerate()
                .map(|(j, a)| (a - mean) / (var + EPS).sqrt() * gamma[j] + beta[j])
                .collect()
        })
        .collect()
}

fn add(a: &[Vec<f64>], b: &[Vec<f64>]) -> Rows {
    a.iter()
        .zip(b)
        .map(|(r, s)| r.iter().zip(s).map(|(x, y)| x + y).collect())
        .collect()
}

/// Multi-head softmax attention of `queries` over `keys` and `values` (their real rows only)
/// with the projections `p`: each head's `softmax(Q_h K_hᵀ / √d_h) V_h`, side by side, projected
/// out.
fn multihead_f64(
    p: &QkvoProjection,
    queries: &[Vec<f64>],
    keys: &[Vec<f64>],
    values: &[Vec<f64>],
) -> Rows {
    let (q, k, v) = (
        linear_f64(&p.query, queries),
        linear_f64(&p.key, keys),
        linear_f64(&p.value, values),
    );
    let d_head = D_MODEL / HEADS;
    let cols = |x: &Rows, h: usize| -> Rows {
        x.iter()
            .map(|r| r[h * d_head..(h + 1) * d_head].to_vec())
            .collect()
    };
    let mut merged = vec![Vec::with_capacity(D_MODEL); queries.len()];
    for h in 0..HEADS {
        let scores: Rows = matmul(&cols(&q, h), &transpose(&cols(&k, h)))
            .into_iter()
            .map(|r| r.into_iter().map(|a| a / (d_head as f64).sqrt()).collect())
            .collect();
        let o = matmul(&softmax_rows(&scores), &cols(&v, h));
        for (row, part) in merged.iter_mut().zip(o) {
            row.extend(part);
        }
    }
    linear_f64(&p.output, &merged)
}

/// The module's output for the real `queries` over the real rows of `keys` and `values`: the
/// inducing points read `Multihead(I, K, V)`, the queries `Multihead(X, H, H)`.
fn isab_f64(
    m: &SetTransformerAttention,
    queries: &[Vec<f64>],
    keys: &[Vec<f64>],
    values: &[Vec<f64>],
) -> Rows {
    let inducing = matrix(&m.inducing);
    let read = multihead_f64(&m.read, &inducing, keys, values);
    let h_prime = layer_norm_f64(&m.norm_read, &add(&inducing, &read));
    let ff: Rows = linear_f64(&m.feed_forward, &h_prime)
        .into_iter()
        .map(|r| r.into_iter().map(|a| a.max(0.0)).collect())
        .collect();
    let h = layer_norm_f64(&m.norm_feed_forward, &add(&h_prime, &ff));
    multihead_f64(&m.proj, queries, &h, &h)
}

fn rows_of(x: &Tensor<3>, b: usize, len: usize) -> Rows {
    let d = x.dims()[2];
    to_rows(&x.clone().slice(s![b..b + 1, 0..len]).reshape([len, d]))
}

#[test]
fn isab_matches_float64_reference_self_and_cross() {
    let device = Device::flex();
    device.seed(30);
    let module = SetTransformerConfig::new(D_MODEL, HEADS)
        .with_n_inducing(INDUCING)
        .with_bias(true)
        .init(&device);
    for scale in [1.0, 4.0] {
        let random = |n: usize| {
            Tensor::<3>::random([2, n, D_MODEL], Distribution::Normal(0.0, 1.0), &device)
                .mul_scalar(scale)
        };
        // Self-attention: 9 positions, the second sequence 5 of them real.
        let (x, lengths) = (random(9), [9, 5]);
        let out = module.forward(
            AttentionInput::new(x.clone())
                .mask_pad(padding_mask_from_lengths(&lengths, 9, &device)),
        );
        for (b, len) in lengths.into_iter().enumerate() {
            let real = rows_of(&x, b, len);
            let expected = isab_f64(&module, &real, &real, &real);
            let err = max_rel_err(&rows_of(&out, b, len), &expected, 1e-2);
            assert!(
                err < BOUND,
                "self, scale {scale}, batch {b}: relative error {err}"
            );
        }
        // Cross-attention: 7 queries (7 and 4 real) over 11 keys (11 and 6 real), with values
        // unlike the keys.
        let (queries, memory, values) = (random(7), random(11), random(11));
        let (q_lens, k_lens) = ([7, 4], [11, 6]);
        let out = module.forward(
            AttentionInput::cross(queries.clone(), memory.clone(), values.clone())
                .mask_pad(padding_mask_from_lengths(&k_lens, 11, &device))
                .mask_pad_query(padding_mask_from_lengths(&q_lens, 7, &device)),
        );
        for b in 0..2 {
            let expected = isab_f64(
                &module,
                &rows_of(&queries, b, q_lens[b]),
                &rows_of(&memory, b, k_lens[b]),
                &rows_of(&values, b, k_lens[b]),
            );
            let err = max_rel_err(&rows_of(&out, b, q_lens[b]), &expected, 1e-2);
            assert!(
                err < BOUND,
                "cross, scale {scale}, batch {b}: relative error {err}"
            );
        }
    }
}

/// Refusals: causal masking, an attention mask and the per-head form, each with an error that
/// names the variant.
#[test]
fn isab_refuses_what_it_does_not_define() {
    let device = Device::flex();
    let module = SetTransformerConfig::new(D_MODEL, HEADS)
        .with_n_inducing(INDUCING)
        .init(&device);
    let x = Tensor::<3>::zeros([1, 4, D_MODEL], &device);
    let causal = module
        .try_forward(AttentionInput::new(x.clone()).causal(true))
        .unwrap_err();
    assert!(causal.to_string().contains("set-transformer"), "{causal}");
    let mask = Tensor::<3, Bool>::from_data(TensorData::new(vec![false; 16], [1, 4, 4]), &device);
    let masked = module
        .try_forward(AttentionInput::new(x).mask_attn(mask))
        .unwrap_err();
    assert!(masked.to_string().contains("attention mask"), "{masked}");
    let q = Tensor::<4>::zeros([1, HEADS, 4, D_MODEL / HEADS], &device);
    let per_head = module
        .attend(q.clone(), q.clone(), q, Default::default())
        .unwrap_err();
    assert!(per_head.to_string().contains("per-head"), "{per_head}");
    let zero = SetTransformerConfig::new(D_MODEL, HEADS)
        .with_n_inducing(0)
        .validate()
        .unwrap_err();
    assert!(zero.to_string().contains("n_inducing"), "{zero}");
}
