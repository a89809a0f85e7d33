//! Compressive Transformer attention against a float64 implementation written from Rae et al.
//! 2020: query i, in segment τ = ⌊i/s⌋ (memory start a = max(0, τ s − mem_len)), attends with
//! Transformer-XL's relative score `((q_i + u)ᵀ k_j + (q_i + v)ᵀ W_R R_δ) / √d` to
//! - the compressed slots: blocks j of c positions with (j + 1) c ≤ a, the newest `cmem_len`,
//!   each `f_c` (a strided convolution, kernel = stride = c) of the block's inputs with padding
//!   zeroed, skipped when wholly padding, the k-th newest at distance δ = ρ + mem_len + k (ρ = i − τ s);
//! - the memory, positions [a, τ s), and its own segment (up to i when causal), δ = i − j;
//!
//! one softmax, then the output projection. And the attention-reconstruction loss: each
//! segment's real queries over the blocks that leave the memory after it (those of the next
//! segment's slots that are new), content only and with the same projections, uncompressed
//! against compressed; the mean squared difference. With the module's own parameters, padding
//! with large junk, memory shorter and longer than a segment, rates that do and do not divide
//! the segment, inputs at scale 1 and 4. The gradients: the output sends none to the
//! compression, the loss none to the projections, and the loss's gradient to the compression
//! equals the float64 loss's central differences.

mod reference;

use burn::prelude::*;
use burn_attention_zoo::{
    AttentionInput, AttentionModule, CompressiveAttention, CompressiveConfig,
    padding_mask_from_lengths,
};
use reference::{
    FlatWeight, central_difference_error, linear_f64, matrix, max_err_of_scale, normal_tensor,
    sinusoid, softmax_rows, strided_conv_f64, to_rows,
};

type Rows = Vec<Vec<f64>>;

const D_MODEL: usize = 12;
const HEADS: usize = 3;
const D_HEAD: usize = D_MODEL / HEADS;
/// Largest relative error of the f32 module against float64, with the floor 5% of the outputs'
/// root mean square (as routing's test): peaked softmaxes at input scale 4 round an output to a
/// few 1e-6 absolute whatever its own size, which a fixed floor of 0.01 read as up to 5.7e-4; a
/// wrong slot, distance or mask is off by a fraction of the RMS itself.
const TOLERANCE: f64 = 5e-4;

fn head(x: &[f64], h: usize) -> &[f64] {
    &x[h * D_HEAD..(h + 1) * D_HEAD]
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn plus(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

/// `Σ_j w_j v_j` over one head.
fn weighted(weights: &[f64], values: &[&[f64]]) -> Vec<f64> {
    let mut o = vec![0.0; D_HEAD];
    for (w, v) in weights.iter().zip(values) {
        for (acc, a) in o.iter_mut().zip(v.iter()) {
            *acc += w * a;
        }
    }
    o
}

/// `f_c` of block `j` of `x` (rows past `x`'s end, and padded rows, as zeros).
fn compressed_block(m: &CompressiveAttention, x: &[Vec<f64>], real: &[bool], j: usize) -> Vec<f64> {
    let c = m.compression;
    let rows: Rows = (j * c..(j + 1) * c)
        .map(|p| match x.get(p) {
            Some(row) if real[p] => row.clone(),
            _ => vec![0.0; D_MODEL],
        })
        .collect();
    strided_conv_f64(&m.compress, &rows, c).remove(0)
}

/// The first block not compressed when segment `tau` runs.
fn first_uncompressed(m: &CompressiveAttention, tau: usize) -> usize {
    (tau * m.segment_len).saturating_sub(m.mem_len) / m.compression
}

/// The module's output at every position of one sequence `x` (`real[p]`: not padding).
fn compressive_f64(m: &CompressiveAttention, x: &[Vec<f64>], real: &[bool], causal: bool) -> Rows {
    let (s, mem, c) = (m.segment_len, m.mem_len, m.compression);
    let (u, v_bias) = (matrix(&m.r_w_bias), matrix(&m.r_r_bias));
    let q = linear_f64(&m.proj.query, x);
    let k = linear_f64(&m.proj.key, x);
    let v = linear_f64(&m.proj.value, x);
    let n = x.len();
    let mut merged = vec![Vec::with_capacity(D_MODEL); n];
    for (i, row) in merged.iter_mut().enumerate() {
        let tau = i / s;
        let rho = i - tau * s;
        let hi = first_uncompressed(m, tau);
        // (key, value, distance) of everything query i sees.
        let mut seen: Vec<(Vec<f64>, Vec<f64>, i64)> = Vec::new();
        for j in hi.saturating_sub(m.cmem_len)..hi {
            if (j * c..(j + 1) * c).all(|p| !real[p]) {
                continue;
            }
            let block = compressed_block(m, x, real, j);
            let key = linear_f64(&m.proj.key, std::slice::from_ref(&block)).remove(0);
            let value = linear_f64(&m.proj.value, &[block]).remove(0);
            seen.push((key, value, (rho + mem + hi - j) as i64));
        }
        let start = (tau * s).saturating_sub(mem);
        let end = if causal {
            i + 1
        } else {
            ((tau + 1) * s).min(n)
        };
        for j in (start..end).filter(|&j| real[j]) {
            seen.push((k[j].clone(), v[j].clone(), i as i64 - j as i64));
        }
        for h in 0..HEADS {
            let scores: Vec<f64> = seen
                .iter()
                .map(|(key, _, delta)| {
                    let r = linear_f64(&m.r_net, &[sinusoid(*delta, D_MODEL)]);
                    (dot(&plus(head(&q[i], h), &u[h]), head(key, h))
                        + dot(&plus(head(&q[i], h), &v_bias[h]), head(&r[0], h)))
                        / (D_HEAD as f64).sqrt()
                })
                .collect();
            let weights = &softmax_rows(&[scores])[0];
            let values: Vec<&[f64]> = seen.iter().map(|(_, value, _)| head(value, h)).collect();
            row.extend(weighted(weights, &values));
        }
    }
    linear_f64(&m.proj.output, &merged)
}

/// The attention-reconstruction loss of a batch (`xs[b]` all `n` positions, `reals[b][p]`: not
/// padding): the sum of squared differences over the real queries of the segments that evict a
/// real position, over the count of their entries, times the weight.
fn reconstruction_f64(m: &CompressiveAttention, xs: &[Rows], reals: &[Vec<bool>]) -> f64 {
    let (s, c) = (m.segment_len, m.compression);
    let (mut total, mut count) = (0.0, 0.0);
    for (x, real) in xs.iter().zip(reals) {
        let n = x.len();
        let q = linear_f64(&m.proj.query, x);
        let k = linear_f64(&m.proj.key, x);
        let v = linear_f64(&m.proj.value, x);
        for tau in 0..n.div_ceil(s) {
            let from = first_uncompressed(m, tau);
            let to = first_uncompressed(m, tau + 1).min(n / c);
            let raw: Vec<usize> = (from * c..to.max(from) * c).filter(|&p| real[p]).collect();
            if raw.is_empty() {
                continue;
            }
            let packed: Vec<(Vec<f64>, Vec<f64>)> = (from..to)
                .filter(|&j| (j * c..(j + 1) * c).any(|p| real[p]))
                .map(|j| {
                    let block = compressed_block(m, x, real, j);
                    (
                        linear_f64(&m.proj.key, std::slice::from_ref(&block)).remove(0),
                        linear_f64(&m.proj.value, &[block]).remove(0),
                    )
                })
                .collect();
            for i in (tau * s..((tau + 1) * s).min(n)).filter(|&i| real[i]) {
                for h in 0..HEADS {
                    let attend = |keys: Vec<&[f64]>, values: Vec<&[f64]>| {
                        let scores: Vec<f64> = keys
                            .iter()
                            .map(|key| dot(head(&q[i], h), key) / (D_HEAD as f64).sqrt())
                            .collect();
                        weighted(&softmax_rows(&[scores])[0], &values)
                    };
                    let a = attend(
                        raw.iter().map(|&p| head(&k[p], h)).collect(),
                        raw.iter().map(|&p| head(&v[p], h)).collect(),
                    );
                    let b = attend(
                        packed.iter().map(|(key, _)| head(key, h)).collect(),
                        packed.iter().map(|(_, value)| head(value, h)).collect(),
                    );
                    total += a.iter().zip(&b).map(|(x, y)| (x - y).powi(2)).sum::<f64>();
                    count += D_HEAD as f64;
                }
            }
        }
    }
    total / count.max(1.0) * m.reconstruction
}

fn rows_of(x: &Tensor<3>, b: usize) -> Rows {
    let [_, n, d] = x.dims();
    to_rows(&x.clone().slice(s![b..b + 1]).reshape([n, d]))
}

/// The batch both loss tests use: two sequences of `N` positions at `scale`, the second
/// padded after `LENGTHS[1]` with large junk; and which positions are real.
fn padded_batch(seed: u64, scale: f32, device: &Device) -> (Tensor<3>, Vec<Vec<bool>>) {
    let x = normal_tensor([2, N, D_MODEL], seed, device).mul_scalar(scale);
    let junk = normal_tensor([1, N - LENGTHS[1], D_MODEL], seed + 1, device).mul_scalar(50.0);
    let x = Tensor::cat(
        vec![
            x.clone().slice(s![0..1]),
            Tensor::cat(vec![x.slice(s![1..2, 0..LENGTHS[1]]), junk], 1),
        ],
        0,
    );
    let reals = LENGTHS
        .iter()
        .map(|&l| (0..N).map(|p| p < l).collect())
        .collect();
    (x, reals)
}

/// Positions per sequence of [`padded_batch`], and the real ones of each.
const N: usize = 23;
const LENGTHS: [usize; 2] = [23, 15];

/// (segment_len, mem_len, compression, cmem_len): memory shorter than and equal to a segment,
/// longer than one, a rate that does not divide the segment, a compressed memory shorter than
/// what a late segment could see.
const CASES: [(usize, usize, usize, usize); 4] =
    [(4, 2, 2, 3), (4, 4, 2, 8), (3, 7, 2, 2), (6, 3, 4, 5)];

#[test]
fn compressive_matches_float64_reference() {
    let device = Device::flex();
    for (case, (segment, mem, c, cmem)) in CASES.into_iter().enumerate() {
        let m = CompressiveConfig::new(D_MODEL, HEADS)
            .with_segment_len(segment)
            .with_mem_len(mem)
            .with_compression(c)
            .with_cmem_len(cmem)
            .with_reconstruction(0.5)
            .with_bias(true)
            .init(&device);
        for scale in [1.0, 4.0] {
            let (x, reals) = padded_batch(10 * case as u64 + scale as u64, scale, &device);
            let xs: Vec<Rows> = (0..2).map(|b| rows_of(&x, b)).collect();
            for causal in [false, true] {
                let (out, loss) = m
                    .try_forward_with_loss(
                        AttentionInput::new(x.clone())
                            .mask_pad(padding_mask_from_lengths(&LENGTHS, N, &device))
                            .causal(causal),
                    )
                    .unwrap();
                for (b, len) in LENGTHS.into_iter().enumerate() {
                    let expected = compressive_f64(&m, &xs[b], &reals[b], causal);
                    let got = rows_of(&out, b);
                    let err = max_err_of_scale(&got[..len], &expected[..len], 0.05);
                    assert!(
                        err < TOLERANCE,
                        "case {case} scale {scale} causal {causal} batch {b}: relative error {err}"
                    );
                }
                let expected = reconstruction_f64(&m, &xs, &reals);
                let got = loss.expect("a loss").into_scalar::<f64>();
                assert!(expected > 0.0, "case {case}: nothing evicted");
                assert!(
                    (got - expected).abs() <= 1e-3 * expected,
                    "case {case} scale {scale} causal {causal}: loss {got}, float64 {expected}"
                );
            }
        }
    }
}

/// The compression learns from the reconstruction loss alone: the output sends it no gradient
/// (its memory reaches later segments with the gradient stopped) though it changes the output,
/// and the loss sends none to the attention's projections.
#[test]
fn compression_learns_from_the_reconstruction_loss_alone() {
    let device = Device::flex().autodiff();
    let m = CompressiveConfig::new(D_MODEL, HEADS)
        .with_segment_len(4)
        .with_mem_len(2)
        .with_compression(2)
        .with_cmem_len(3)
        .init(&device);
    let x = normal_tensor([2, 16, D_MODEL], 5, &device);
    let (out, loss) = m
        .try_forward_with_loss(AttentionInput::new(x.clone()))
        .unwrap();
    let grads = out.clone().sum().backward();
    assert!(
        m.compress
            .weight
            .val()
            .grad(&grads)
            .is_none_or(|g| g.abs().max().into_scalar::<f32>() == 0.0)
    );
    assert!(m.proj.key.weight.val().grad(&grads).is_some());
    let grads = loss.unwrap().backward();
    let to_compress = m.compress.weight.val().grad(&grads).unwrap().abs().max();
    assert!(to_compress.into_scalar::<f32>() > 0.0);
    for layer in [&m.proj.query, &m.proj.key, &m.proj.value] {
        assert!(
            layer
                .weight
                .val()
                .grad(&grads)
                .is_none_or(|g| g.abs().max().into_scalar::<f32>() == 0.0)
        );
    }
    // The compressed memory is read: other compression weights change the last segment.
    let other = CompressiveConfig::new(D_MODEL, HEADS)
        .with_segment_len(4)
        .with_mem_len(2)
        .with_compression(2)
        .with_cmem_len(3)
        .init(&device);
    let moved = CompressiveAttention {
        compress: other.compress,
        ..m.clone()
    }
    .forward(AttentionInput::new(x))
        - out;
    let moved = moved.slice(s![.., 12..16]).abs().max().into_scalar::<f32>();
    assert!(moved > 1e-4, "the compressed memory is not read ({moved})");
}

/// The loss's gradient reaches `f_c` as the float64 loss's central differences say it should:
/// every weight and bias of the compression, on a padded batch whose padding holds large junk
/// (the fused kernels' backward on `flex`).
#[test]
fn reconstruction_gradient_matches_float64_differences() {
    let device = Device::flex().autodiff();
    for (case, (segment, mem, c, cmem)) in CASES.into_iter().enumerate() {
        let m = CompressiveConfig::new(D_MODEL, HEADS)
            .with_segment_len(segment)
            .with_mem_len(mem)
            .with_compression(c)
            .with_cmem_len(cmem)
            .with_reconstruction(0.5)
            .init(&device);
        let (x, reals) = padded_batch(100 + case as u64, 2.0, &device);
        let xs: Vec<Rows> = (0..2).map(|b| rows_of(&x, b)).collect();
        let (_, loss) = m
            .try_forward_with_loss(
                AttentionInput::new(x).mask_pad(padding_mask_from_lengths(&LENGTHS, N, &device)),
            )
            .unwrap();
        let grads = loss.expect("a loss").backward();
        let flat = FlatWeight::new(&m.compress.weight, &grads, "the compression");
        let loss_at = |at: usize, value: f32| {
            let mut compress = m.compress.clone();
            compress.weight = flat.moved(at, value);
            let m = CompressiveAttention {
                compress,
                ..m.clone()
            };
            reconstruction_f64(&m, &xs, &reals)
        };
        let (err, scale) = central_difference_error(&flat.got, &flat.values, loss_at);
        assert!(scale > 0.0, "case {case}: no gradient expected");
        assert!(
            err < 1e-4,
            "case {case}: the gradient to the compression is off by {err} of its largest entry"
        );
    }
}

/// No segment evicts a whole block (one segment): no loss; a weight of 0: none either.
#[test]
fn no_loss_without_eviction() {
    let device = Device::flex();
    let x = normal_tensor([1, 8, D_MODEL], 2, &device);
    let m = CompressiveConfig::new(D_MODEL, HEADS).init(&device);
    let (_, loss) = m
        .try_forward_with_loss(AttentionInput::new(x.clone()))
        .unwrap();
    assert!(loss.is_none());
    let m = CompressiveConfig::new(D_MODEL, HEADS)
        .with_segment_len(2)
        .with_mem_len(2)
        .with_compression(2)
        .with_reconstruction(0.0)
        .init(&device);
    let (_, loss) = m.try_forward_with_loss(AttentionInput::new(x)).unwrap();
    assert!(loss.is_none());
}
