//! Nyströmformer (the `nystrom` module docs): the functional form against a float64 evaluation of
//! the formula, its limiting case `m = n` against exact softmax attention, and the landmarks.

mod reference;

use burn::prelude::*;
use burn::tensor::Distribution;
use burn_attention_zoo::{
    iterative_pinv, landmark_segments, nystrom_attention, padding_mask_from_lengths,
    softmax_attention,
};
use reference::{max_rel_err, normal_tensor, nystrom_f64, segment, to_heads};

fn device() -> Device {
    Device::flex()
}

/// Queries, keys and values ~ N(0, 1), the same for a given `seed` (see `normal_tensor`).
fn qkv(b: usize, h: usize, n: usize, d: usize, seed: u64, device: &Device) -> [Tensor<4>; 3] {
    [0, 1, 2].map(|i| normal_tensor([b, h, n, d], seed * 3 + i, device))
}

/// Check 4: the functional form against the float64 formula, with padding (the averaging
/// matrix of `landmark_segments`) and without (`n` a multiple of `m`: block means by reshape;
/// `n` not a multiple: the averaging matrix again), for lengths that divide by `m` (the paper's
/// case) and lengths that do not; 1e-4 relative (floor 0.01, see `max_rel_err`), on the real
/// positions.
#[test]
fn nystrom_matches_float64_reference() {
    let device = device();
    device.seed(11);
    let (b, h, d, m) = (3, 2, 8, 4);
    for (n, lengths, padded) in [
        (12, [12, 9, 3], true),
        (12, [12, 12, 12], false),
        (10, [10, 10, 10], false),
    ] {
        let [q, k, v] = qkv(b, h, n, d, n as u64 + lengths[2] as u64, &device);
        let mask = padded.then(|| padding_mask_from_lengths(&lengths, n, &device));
        let out = to_heads(&nystrom_attention(
            q.clone(),
            k.clone(),
            v.clone(),
            mask,
            m,
            6,
        ));
        let (qh, kh, vh) = (to_heads(&q), to_heads(&k), to_heads(&v));
        for bi in 0..b {
            for hi in 0..h {
                let len = lengths[bi];
                let expected = nystrom_f64(&qh[bi][hi], &kh[bi][hi], &vh[bi][hi], len, m, 6);
                let err = max_rel_err(&out[bi][hi][..len], &expected, 1e-2);
                assert!(
                    err < 1e-4,
                    "n {n} padded {padded} batch {bi} (length {len}) head {hi}: {err}"
                );
            }
        }
    }
}

/// The landmark matrix averages the paper's consecutive segments when the length divides by
/// `m`, and never reaches a padded position.
#[test]
fn landmark_segments_average_real_positions() {
    let device = device();
    let (n, m) = (10, 4);
    let lengths = [8, 6];
    let mask = padding_mask_from_lengths(&lengths, n, &device);
    let seg: Vec<f32> = landmark_segments(Some(mask), 2, n, m, &device)
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .unwrap();
    for (bi, &len) in lengths.iter().enumerate() {
        for s in 0..m {
            let rows = segment(s, len, m);
            for j in 0..n {
                let expected = if rows.contains(&j) {
                    1.0 / rows.len() as f32
                } else {
                    0.0
                };
                assert_eq!(seg[(bi * m + s) * n + j], expected, "b {bi} s {s} j {j}");
            }
        }
    }
    // Length 8, m = 4: segments of two, as in the paper.
    assert_eq!(segment(1, 8, 4), 2..4);
}

/// The iterative pseudo-inverse of a well-conditioned matrix is its inverse.
#[test]
fn iterative_pinv_inverts() {
    let device = device();
    let m = 6;
    let a = Tensor::<4>::random([2, 1, m, m], Distribution::Normal(0.0, 0.1), &device)
        + Tensor::<2>::eye(m, &device).reshape([1, 1, m, m]);
    let z = iterative_pinv(a.clone(), 12);
    let eye = Tensor::<2>::eye(m, &device)
        .reshape([1, 1, m, m])
        .expand([2, 1, m, m]);
    let err = (a.matmul(z) - eye).abs().max().into_scalar::<f64>();
    assert!(err < 1e-4, "|A Z - I| = {err}");
}

/// Check 4, the limiting case: with one landmark per position (`m = n`), `Q̃ = Q`, `K̃ = K` and the
/// formula is `A pinv(A) A V = A V`, exact softmax attention, as far as six iterations of the
/// pseudo-inverse converge. They converge fast when `A` is well conditioned: keys close to their
/// queries (`K = Q + 0.1 N(0, 1)`) make `A` diagonally dominant, and six iterations then reach
/// f32 round-off (2e-6 measured), so the tolerance is the suite's 1e-4 relative. (With
/// independent random keys `A` can be near singular and six iterations fall far short; that is
/// the method, not this implementation: the float64 reference test above covers that case.)
#[test]
fn nystrom_with_every_position_a_landmark_is_softmax() {
    let device = device();
    let n = 8;
    let [q, noise, v] = qkv(2, 2, n, 16, n as u64, &device);
    let k = q.clone() + noise.mul_scalar(0.1);
    let approx = to_heads(&nystrom_attention(
        q.clone(),
        k.clone(),
        v.clone(),
        None,
        n,
        6,
    ));
    let exact = to_heads(&softmax_attention(q, k, v, None, false));
    for b in 0..2 {
        for h in 0..2 {
            let err = max_rel_err(&approx[b][h], &exact[b][h], 1e-2);
            assert!(err < 1e-4, "batch {b} head {h}: {err}");
        }
    }
}
