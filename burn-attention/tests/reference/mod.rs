//! Float64 reference implementations of the variants' formulas (as their module docs write them), written with plain loops
//! over `Vec<f64>` so that they share no code with the Burn modules they check.
//! Each test binary uses a different subset of them.
#![allow(dead_code)]

use burn::module::Param;
use burn::nn::Linear;
use burn::prelude::*;
use burn_attention_zoo::FeedForwardKernelAttention;

/// A `[heads][n][d]` array of one batch element.
pub type Heads = Vec<Vec<Vec<f64>>>;

/// Reads a `[b, h, n, d]` tensor into `b` arrays of heads, in f64.
pub fn to_heads(t: &Tensor<4>) -> Vec<Heads> {
    let [b, h, n, d] = t.dims();
    let data: Vec<f32> = t
        .clone()
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .unwrap();
    (0..b)
        .map(|bi| {
            (0..h)
                .map(|hi| {
                    (0..n)
                        .map(|i| {
                            (0..d)
                                .map(|j| data[((bi * h + hi) * n + i) * d + j] as f64)
                                .collect()
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

fn softmax_row(row: &[f64]) -> Vec<f64> {
    let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = row.iter().map(|x| (x - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

/// `softmax(q kᵀ / √d) v` for one head, with keys where `masked(i, j)` excluded.
pub fn softmax_head(
    q: &[Vec<f64>],
    k: &[Vec<f64>],
    v: &[Vec<f64>],
    masked: impl Fn(usize, usize) -> bool,
) -> Vec<Vec<f64>> {
    let d = q[0].len();
    q.iter()
        .enumerate()
        .map(|(i, qi)| {
            let keep: Vec<usize> = (0..k.len()).filter(|&j| !masked(i, j)).collect();
            let scores: Vec<f64> = keep
                .iter()
                .map(|&j| qi.iter().zip(&k[j]).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt())
                .collect();
            let w = softmax_row(&scores);
            (0..v[0].len())
                .map(|c| keep.iter().zip(&w).map(|(&j, wj)| wj * v[j][c]).sum())
                .collect()
        })
        .collect()
}

/// `P X` for a projection `p: [k][n]` and rows `x: [n][d]`, rows with `padded(j)` zeroed first.
pub fn project(p: &[Vec<f64>], x: &[Vec<f64>], padded: impl Fn(usize) -> bool) -> Vec<Vec<f64>> {
    p.iter()
        .map(|pr| {
            (0..x[0].len())
                .map(|c| {
                    (0..x.len())
                        .filter(|&j| !padded(j))
                        .map(|j| pr[j] * x[j][c])
                        .sum()
                })
                .collect()
        })
        .collect()
}

/// The largest of `errors` (0 for none), and infinity where one is NaN: a NaN output is the
/// worst error, never one left out (`f64::max` drops a NaN, so a fold with it would pass one).
pub fn largest_error(errors: impl IntoIterator<Item = f64>) -> f64 {
    errors
        .into_iter()
        .map(|err| if err.is_nan() { f64::INFINITY } else { err })
        .fold(0.0, f64::max)
}

/// Largest `|a - b| / max(|b|, floor)` over two nested arrays.
pub fn max_rel_err(a: &[Vec<f64>], b: &[Vec<f64>], floor: f64) -> f64 {
    largest_error(
        a.iter()
            .flatten()
            .zip(b.iter().flatten())
            .map(|(x, y)| (x - y).abs() / y.abs().max(floor)),
    )
}

/// Largest `|a - b| / max(|b|, floor · rms(b))`: [`max_rel_err`] with its floor a fraction of
/// the expected output's root mean square, so that outputs at any input scale are judged alike.
/// f32 rounds each output to within a few `1e-7` of the magnitudes summed into it, whatever the
/// output's own size; an element near zero is therefore judged against the outputs' scale.
pub fn max_err_of_scale(a: &[Vec<f64>], b: &[Vec<f64>], floor: f64) -> f64 {
    let (sum, count) = b
        .iter()
        .flatten()
        .fold((0.0, 0usize), |(s, c), y| (s + y * y, c + 1));
    let rms = (sum / count.max(1) as f64).sqrt();
    max_rel_err(a, b, floor * rms)
}

/// Each row's groups of `width` entries divided by their root mean square (`centred`: their
/// deviations from the group's mean divided by the standard deviation, as a group norm does),
/// `eps` added to the mean square; with each row's conditioning, the factor by which that
/// division can enlarge round-off: the largest, over groups, of the group's root mean square
/// over all rows divided by its (centred) root mean square, with `eps`, at this row.
///
/// f32 computes a group's entries to within a few `1e-7` of the magnitudes summed into them,
/// which are of the group's size over the sequence rather than at one row: where a row's group
/// is (nearly) zero, as a head's output is where its terms cancel, dividing by its own root mean
/// square makes that round-off `conditioning` times larger against the normalised output.
/// [`max_conditioned_err`] allows for it.
pub fn normalise_groups_f64(
    rows: &[Vec<f64>],
    width: usize,
    eps: f64,
    centred: bool,
) -> (Vec<Vec<f64>>, Vec<f64>) {
    let groups = rows.first().map_or(0, |r| r.len() / width);
    let scale: Vec<f64> = (0..groups)
        .map(|g| {
            let sum: f64 = rows
                .iter()
                .flat_map(|r| &r[g * width..(g + 1) * width])
                .map(|a| a * a)
                .sum();
            (sum / (rows.len() * width).max(1) as f64).sqrt()
        })
        .collect();
    let mut conditioning = vec![0.0; rows.len()];
    let normalised = rows
        .iter()
        .zip(&mut conditioning)
        .map(|(row, kappa)| {
            row.chunks(width)
                .zip(&scale)
                .flat_map(|(group, scale)| {
                    let mean = if centred {
                        group.iter().sum::<f64>() / width as f64
                    } else {
                        0.0
                    };
                    let square = group.iter().map(|a| (a - mean).powi(2)).sum::<f64>();
                    let rms = (square / width as f64 + eps).sqrt();
                    *kappa = f64::max(*kappa, scale / rms);
                    group.iter().map(move |a| (a - mean) / rms)
                })
                .collect()
        })
        .collect();
    (normalised, conditioning)
}

/// Largest `|a - b| / max(|b|, floor)` of each row divided by the row's conditioning where that
/// is above 1 (from [`normalise_groups_f64`]): [`max_rel_err`] for outputs that pass through a
/// normalisation, judged against the round-off the normalisation itself enlarges.
pub fn max_conditioned_err(
    a: &[Vec<f64>],
    b: &[Vec<f64>],
    floor: f64,
    conditioning: &[f64],
) -> f64 {
    largest_error(a.iter().zip(b).zip(conditioning).map(|((a, b), kappa)| {
        max_rel_err(std::slice::from_ref(a), std::slice::from_ref(b), floor) / kappa.max(1.0)
    }))
}

/// Row-wise softmax.
pub fn softmax_rows(rows: &[Vec<f64>]) -> Vec<Vec<f64>> {
    rows.iter()
        .map(|r| {
            let max = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = r.iter().map(|x| (x - max).exp()).collect();
            let s: f64 = e.iter().sum();
            e.iter().map(|x| x / s).collect()
        })
        .collect()
}

/// Transpose.
pub fn transpose(m: &[Vec<f64>]) -> Vec<Vec<f64>> {
    (0..m[0].len())
        .map(|j| m.iter().map(|r| r[j]).collect())
        .collect()
}

/// Matrix product.
pub fn matmul(a: &[Vec<f64>], b: &[Vec<f64>]) -> Vec<Vec<f64>> {
    a.iter()
        .map(|r| {
            (0..b[0].len())
                .map(|j| r.iter().zip(b).map(|(x, br)| x * br[j]).sum())
                .collect()
        })
        .collect()
}

/// Every entry times `s`.
pub fn scale(m: &[Vec<f64>], s: f64) -> Vec<Vec<f64>> {
    m.iter()
        .map(|r| r.iter().map(|x| x * s).collect())
        .collect()
}

/// `normalize_rows(φ(Q) φ(K)ᵀ ⊙ keep) V` for one head, from already-mapped features, pairs with
/// `masked(i, j)` left out: each output row is the average of the values weighted by
/// `φ(Q_i)·φ(K_j)` (no ε, no stabiliser).
pub fn kernelized_head(
    phi_q: &[Vec<f64>],
    phi_k: &[Vec<f64>],
    v: &[Vec<f64>],
    masked: impl Fn(usize, usize) -> bool,
) -> Vec<Vec<f64>> {
    phi_q
        .iter()
        .enumerate()
        .map(|(i, qi)| {
            let w: Vec<f64> = phi_k
                .iter()
                .enumerate()
                .map(|(j, kj)| {
                    if masked(i, j) {
                        0.0
                    } else {
                        qi.iter().zip(kj).map(|(a, c)| a * c).sum()
                    }
                })
                .collect();
            let norm: f64 = w.iter().sum::<f64>();
            (0..v[0].len())
                .map(|c| w.iter().zip(v).map(|(wj, vj)| wj * vj[c]).sum::<f64>() / norm)
                .collect()
        })
        .collect()
}

/// The paper's FAVOR+ features of the rows of `x: [n][d]` with random features `w: [m][d]`
/// (Choromanski et al. 2021, eq. for positive random features):
/// `φ(x) = m^{-1/2} exp(w_f·x̂ − ‖x̂‖²/2)`, `x̂ = x d^{-1/4}`, as written, without stabilisers.
pub fn favor_features(x: &[Vec<f64>], w: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let d = x[0].len() as f64;
    let m = w.len() as f64;
    x.iter()
        .map(|row| {
            let xh: Vec<f64> = row.iter().map(|a| a * d.powf(-0.25)).collect();
            let half_sq = xh.iter().map(|a| a * a).sum::<f64>() / 2.0;
            w.iter()
                .map(|wf| {
                    let dot: f64 = wf.iter().zip(&xh).map(|(a, b)| a * b).sum();
                    (dot - half_sq).exp() / m.sqrt()
                })
                .collect()
        })
        .collect()
}

/// Reads a `[rows, cols]` tensor into f64 rows.
pub fn to_rows(t: &Tensor<2>) -> Vec<Vec<f64>> {
    let [rows, cols] = t.dims();
    let data: Vec<f32> = t
        .clone()
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .unwrap();
    (0..rows)
        .map(|i| (0..cols).map(|j| data[i * cols + j] as f64).collect())
        .collect()
}

/// `Σ|a − b| / Σ|b|` over two nested arrays: the mean relative error of an approximation `a`
/// to `b`.
pub fn mean_rel_err(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    let num: f64 = a
        .iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .sum();
    let den: f64 = b.iter().flatten().map(|y| y.abs()).sum();
    num / den
}

/// Largest `‖a_i − b_i‖ / ‖b_i‖` over the rows `i` of two `[n][d]` arrays: the relative error of
/// each output vector, which an f32 computation of an average of O(1) values can meet where a
/// per-entry ratio cannot (an entry near zero is a difference of O(1) terms).
pub fn max_row_rel_err(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    largest_error(a.iter().zip(b).map(|(x, y)| {
        let diff: f64 = x.iter().zip(y).map(|(p, q)| (p - q).powi(2)).sum::<f64>();
        let norm: f64 = y.iter().map(|q| q * q).sum::<f64>();
        (diff / norm).sqrt()
    }))
}

/// Segment `s` of a sequence of real length `len` with `m` landmarks (as the `nystrom` module
/// docs define it for lengths that are not multiples of `m`).
pub fn segment(s: usize, len: usize, m: usize) -> std::ops::Range<usize> {
    let start = s * len / m;
    let end = ((s + 1) * len / m).max(start + 1);
    start..end
}

/// The means of the `m` segments of the first `len` rows of `x`.
pub fn means(x: &[Vec<f64>], len: usize, m: usize) -> Vec<Vec<f64>> {
    (0..m)
        .map(|s| {
            let rows = segment(s, len, m);
            let count = rows.len() as f64;
            (0..x[0].len())
                .map(|c| rows.clone().map(|j| x[j][c]).sum::<f64>() / count)
                .collect()
        })
        .collect()
}

/// The iterative pseudo-inverse of the Nyströmformer paper, `iterations` steps.
pub fn pinv_f64(a: &[Vec<f64>], iterations: usize) -> Vec<Vec<f64>> {
    let m = a.len();
    let max_col = (0..m)
        .map(|j| (0..m).map(|i| a[i][j].abs()).sum::<f64>())
        .fold(0.0, f64::max);
    let max_row = a
        .iter()
        .map(|r| r.iter().map(|x| x.abs()).sum::<f64>())
        .fold(0.0, f64::max);
    let mut z = scale(&transpose(a), 1.0 / (max_col * max_row));
    let shift = |c: f64, x: &[Vec<f64>]| -> Vec<Vec<f64>> {
        (0..m)
            .map(|i| {
                (0..m)
                    .map(|j| if i == j { c } else { 0.0 } - x[i][j])
                    .collect()
            })
            .collect()
    };
    for _ in 0..iterations {
        let az = matmul(a, &z);
        let inner = shift(7.0, &az);
        let inner = shift(15.0, &matmul(&az, &inner));
        let inner = shift(13.0, &matmul(&az, &inner));
        z = scale(&matmul(&z, &inner), 0.25);
    }
    z
}

/// Nyströmformer's formula for one head over its first `len` (real) positions.
pub fn nystrom_f64(
    q: &[Vec<f64>],
    k: &[Vec<f64>],
    v: &[Vec<f64>],
    len: usize,
    m: usize,
    iterations: usize,
) -> Vec<Vec<f64>> {
    nystrom_cross_f64(q, k, v, (len, len), m, iterations)
}

/// Nyströmformer's formula for one head of cross-attention: the first `q_len` queries over the
/// first `k_len` keys and values, query landmarks from the queries, key landmarks from the keys.
pub fn nystrom_cross_f64(
    q: &[Vec<f64>],
    k: &[Vec<f64>],
    v: &[Vec<f64>],
    (q_len, k_len): (usize, usize),
    m: usize,
    iterations: usize,
) -> Vec<Vec<f64>> {
    let s = (q[0].len() as f64).powf(-0.25);
    let (q, k, v) = (scale(&q[..q_len], s), scale(&k[..k_len], s), &v[..k_len]);
    let (q_land, k_land) = (means(&q, q_len, m), means(&k, k_len, m));
    let kernel_1 = softmax_rows(&matmul(&q, &transpose(&k_land)));
    let kernel_2 = softmax_rows(&matmul(&q_land, &transpose(&k_land)));
    let kernel_3 = softmax_rows(&matmul(&q_land, &transpose(&k)));
    matmul(
        &matmul(&kernel_1, &pinv_f64(&kernel_2, iterations)),
        &matmul(&kernel_3, v),
    )
}

/// A parameter matrix in f64 rows.
pub fn matrix(p: &Param<Tensor<2>>) -> Vec<Vec<f64>> {
    let t = p.val();
    let [_, cols] = t.dims();
    let data: Vec<f32> = t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
    data.chunks(cols)
        .map(|r| r.iter().map(|&a| a as f64).collect())
        .collect()
}

/// A parameter vector in f64.
pub fn vector(p: &Param<Tensor<1>>) -> Vec<f64> {
    let data = p.val().into_data().convert::<f32>();
    data.iter::<f32>().map(f64::from).collect()
}

/// `x W + b` (Burn's `Linear` stores `W` as `[d_in, d_out]`).
pub fn linear_f64(layer: &Linear, x: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let out = matmul(x, &matrix(&layer.weight));
    match &layer.bias {
        None => out,
        Some(bias) => {
            let b = vector(bias);
            out.into_iter()
                .map(|row| row.iter().zip(&b).map(|(a, c)| a + c).collect())
                .collect()
        }
    }
}

/// `ln(1 + eˣ)`.
pub fn softplus(x: f64) -> f64 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// `1 / (1 + e⁻ˣ)`.
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `φ` in float64 from the module's weights: each unit `X W_f` (Softplus on the last), times
/// `σ(X W_g)` or `σ(X U V)` where the unit has a gate.
pub fn phi_f64(module: &FeedForwardKernelAttention, x: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let last = module.units.len() - 1;
    let mut x = x.to_vec();
    for (i, unit) in module.units.iter().enumerate() {
        let mut value = matmul(&x, &matrix(&unit.w_f));
        if i == last {
            value.iter_mut().flatten().for_each(|a| *a = softplus(*a));
        }
        let gate = match (&unit.w_g, &unit.gate_u, &unit.gate_v) {
            (Some(w_g), _, _) => Some(matmul(&x, &matrix(w_g))),
            (None, Some(u), Some(v)) => Some(matmul(&matmul(&x, &matrix(u)), &matrix(v))),
            _ => None,
        };
        if let Some(gate) = gate {
            value
                .iter_mut()
                .flatten()
                .zip(gate.iter().flatten())
                .for_each(|(a, g)| *a *= sigmoid(*g));
        }
        x = value;
    }
    x
}

/// `elu(x) + 1` in float64, as the Linear Transformer paper writes it.
pub fn elu_plus_one(x: f64) -> f64 {
    if x > 0.0 { x + 1.0 } else { x.exp() }
}

/// Efficient Attention's `ρ_q(Q) (ρ_k(K)ᵀ V)` for one head over the given (real) keys: each
/// query row's softmax over its features, each key feature's softmax over the key rows.
pub fn efficient_head(q: &[Vec<f64>], k: &[Vec<f64>], v: &[Vec<f64>]) -> Vec<Vec<f64>> {
    matmul(&softmax_rows(q), &matmul(&softmax_rows(&transpose(k)), v))
}

/// A tensor of standard normal draws from its own generator (SplitMix64 and Box-Muller), the
/// same for a given `seed` whatever else runs: the device's generator is shared by the tests of
/// a binary, which run in parallel, so its draws depend on their interleaving.
pub fn normal_tensor<const D: usize>(shape: [usize; D], seed: u64, device: &Device) -> Tensor<D> {
    let mut state = seed;
    let mut uniform = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // In (0, 1]: 53 random bits.
        ((z >> 11) + 1) as f64 / (1u64 << 53) as f64
    };
    let count: usize = shape.iter().product();
    let values: Vec<f32> = (0..count)
        .map(|_| {
            let (u, v) = (uniform(), uniform());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        })
        .collect();
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// A strided convolution over the rows of `x` (`[n][channels]`, `n` a multiple of `c`):
/// output row `g`, channel `o` is `b_o + Σ_s Σ_ch kernel[o][ch][s] · x[g c + s][ch]`, with the
/// module's kernel read from its linear map (`W[s · d_model + ch][o]`, a block's rows one after
/// another).
pub fn strided_conv_f64(layer: &Linear, x: &[Vec<f64>], c: usize) -> Vec<Vec<f64>> {
    let w = matrix(&layer.weight);
    let b = layer.bias.as_ref().map(vector).unwrap();
    let channels = x[0].len();
    let kernel = |o: usize, ch: usize, s: usize| w[s * channels + ch][o];
    (0..x.len() / c)
        .map(|g| {
            (0..b.len())
                .map(|o| {
                    let mut acc = b[o];
                    for s in 0..c {
                        for (ch, &a) in x[g * c + s].iter().enumerate() {
                            acc += kernel(o, ch, s) * a;
                        }
                    }
                    acc
                })
                .collect()
        })
        .collect()
}

/// `R_δ` of Transformer-XL's relative score: `sin(δ / 10000^{2f/D})` for f < D/2, then the
/// cosines (`D = d_model`).
pub fn sinusoid(delta: i64, d_model: usize) -> Vec<f64> {
    let angle = |f: usize| delta as f64 / 10000f64.powf(2.0 * f as f64 / d_model as f64);
    let half = d_model / 2;
    (0..half)
        .map(|f| angle(f).sin())
        .chain((0..half).map(|f| angle(f).cos()))
        .collect()
}

/// Hedgehog's feature map in float64, `[softmax(x W), softmax(−x W)]` per row.
pub fn hedgehog_f64(w: &[Vec<f64>], x: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let z = matmul(x, w);
    let neg: Vec<Vec<f64>> = z.iter().map(|r| r.iter().map(|a| -a).collect()).collect();
    softmax_rows(&z)
        .into_iter()
        .zip(softmax_rows(&neg))
        .map(|(mut a, b)| {
            a.extend(b);
            a
        })
        .collect()
}

/// The batch the one-sequence variants' float64 tests take: two sequences of `n` rows of
/// standard normal draws times `scale` (from `seed`); the second with a padded position inside
/// it (3, or `n − 2` when shorter) and its last quarter padded, all with junk of scale 50 (which
/// must change nothing). Returns the batch `[2, n, width]`, its padding mask and each sequence's
/// real positions.
pub fn padded_pair(
    [n, width]: [usize; 2],
    seed: u64,
    scale: f64,
    device: &Device,
) -> (Tensor<3>, Tensor<2, Bool>, [Vec<usize>; 2]) {
    let x = normal_tensor([2, n, width], seed, device).mul_scalar(scale);
    let inner = 3.min(n - 2);
    let tail = n - n / 4;
    let padded: Vec<bool> = (0..n).map(|i| i == inner || i >= tail).collect();
    let junk = normal_tensor([1, n, width], seed + 1, device).mul_scalar(50.0);
    let flags = Tensor::<1, Bool>::from_data(TensorData::new(padded.clone(), [n]), device)
        .reshape([1, n, 1]);
    let second = x.clone().slice(s![1..2]).mask_where(flags, junk);
    let x = Tensor::cat(vec![x.slice(s![0..1]), second], 0);
    let mut mask = vec![false; n];
    mask.extend(&padded);
    let mask = Tensor::<2, Bool>::from_data(TensorData::new(mask, [2, n]), device);
    let real = [
        (0..n).collect::<Vec<_>>(),
        (0..n).filter(|&i| !padded[i]).collect(),
    ];
    (x, mask, real)
}

/// RoFormer's rotation (Su et al. 2021, eq. 34) of a row at position `p`, head by head: in each
/// of the `heads` blocks of `d_head` channels, pair `(2i, 2i+1)` turned by `p θ_i`,
/// `θ_i = 10000^{−2i/d_head}`.
pub fn rotate_heads_f64(row: &[f64], p: f64, heads: usize, d_head: usize) -> Vec<f64> {
    let mut out = row.to_vec();
    for h in 0..heads {
        for i in 0..d_head / 2 {
            let theta = 10_000f64.powf(-2.0 * i as f64 / d_head as f64);
            let (cos, sin) = ((p * theta).cos(), (p * theta).sin());
            let (a, b) = (row[h * d_head + 2 * i], row[h * d_head + 2 * i + 1]);
            out[h * d_head + 2 * i] = a * cos - b * sin;
            out[h * d_head + 2 * i + 1] = a * sin + b * cos;
        }
    }
    out
}

/// Serialises the draws of [`draw_alone`] within one test binary.
static DRAWS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `draw` while no other test of this binary draws through here, the device seeded with
/// `seed` first where one is given: a module built and used once inside `draw` (parameters are
/// drawn on first use) gets the same weights in every run, whatever runs beside it.
pub fn draw_alone<T>(device: &Device, seed: Option<u64>, draw: impl FnOnce() -> T) -> T {
    let _held = DRAWS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(seed) = seed {
        device.seed(seed);
    }
    draw()
}

/// A 2-D weight as the difference checks read it: its gradient from a backward pass and its
/// values, both flattened, and the weight with one entry moved.
#[allow(dead_code)]
pub struct FlatWeight {
    /// The gradient, flattened.
    pub got: Vec<f32>,
    /// The values, flattened.
    pub values: Vec<f32>,
    shape: [usize; 2],
    device: Device,
}

#[allow(dead_code)]
impl FlatWeight {
    /// `weight`'s gradient in `grads` (a panic naming `name` when it has none) and its values.
    pub fn new(weight: &Param<Tensor<2>>, grads: &burn::tensor::Gradients, name: &str) -> Self {
        let value = weight.val();
        let got = value
            .grad(grads)
            .unwrap_or_else(|| panic!("a gradient to {name}"))
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let inner = value.inner();
        Self {
            got,
            shape: inner.dims(),
            device: inner.device(),
            values: inner.into_data().try_to_vec::<f32>().unwrap(),
        }
    }

    /// The weight with entry `at` set to `to`.
    pub fn moved(&self, at: usize, to: f32) -> Param<Tensor<2>> {
        let mut moved = self.values.clone();
        moved[at] = to;
        Param::from_tensor(Tensor::from_data(
            TensorData::new(moved, self.shape),
            &self.device,
        ))
    }
}

/// The step of the central differences. The float64 loss leaves round-off far below it; the
/// truncation error (the step squared times the third derivative) does not: with steps of 2e-3
/// Transformer-XL's key weights once came out 1.2e-4 of the largest entry off, at 2e-4 the
/// Transformer-XL and compressive gradient tests stayed below 2e-6 over six runs (routing's
/// below 5e-7).
#[allow(dead_code)]
pub const DIFFERENCE_STEP: f32 = 2e-4;

/// How far the gradient `got` of a loss over the parameters `flat` is from the float64 loss's
/// central differences (`loss_at(i, value)`: the loss with parameter `i` set to `value`, steps
/// of ±[`DIFFERENCE_STEP`]): the largest error over the largest expected entry, and that entry
/// (0 when no gradient is expected).
#[allow(dead_code)]
pub fn central_difference_error(
    got: &[f32],
    flat: &[f32],
    loss_at: impl Fn(usize, f32) -> f64,
) -> (f64, f64) {
    let expected: Vec<f64> = (0..flat.len())
        .map(|at| {
            let (up, down) = (flat[at] + DIFFERENCE_STEP, flat[at] - DIFFERENCE_STEP);
            (loss_at(at, up) - loss_at(at, down)) / (f64::from(up) - f64::from(down))
        })
        .collect();
    let scale = expected.iter().fold(0.0f64, |a, g| a.max(g.abs()));
    let err = largest_error(
        got.iter()
            .zip(&expected)
            .map(|(&g, e)| (f64::from(g) - e).abs() / scale),
    );
    (err, scale)
}

/// How far the gradient `got` of a loss over the parameters `flat` is from the float64 loss's
/// central differences (steps of ±[`DIFFERENCE_STEP`]) where the loss is smooth, for a loss
/// with steps in it (a routing that changes with the parameters): the largest error over the
/// largest expected entry, that entry, and how many entries were left out. A step that moves a query or key into another
/// cluster makes the loss jump, its one-sided difference far above any gradient: such an entry
/// shows as one-sided differences further apart than the entries' median size (a smooth loss's
/// differ by the step times its curvature) and is left out.
#[allow(dead_code)]
pub fn smooth_difference_error(
    got: &[f32],
    flat: &[f32],
    loss_at: impl Fn(usize, f32) -> f64,
) -> (f64, f64, usize) {
    let step = DIFFERENCE_STEP;
    let one_sided: Vec<[f64; 2]> = (0..flat.len())
        .map(|at| {
            let (up, down) = (flat[at] + step, flat[at] - step);
            let mid = loss_at(at, flat[at]);
            [
                (loss_at(at, up) - mid) / (f64::from(up) - f64::from(flat[at])),
                (mid - loss_at(at, down)) / (f64::from(flat[at]) - f64::from(down)),
            ]
        })
        .collect();
    let mut sizes: Vec<f64> = one_sided.iter().map(|[u, d]| (u + d).abs() / 2.0).collect();
    sizes.sort_by(f64::total_cmp);
    let median = sizes[sizes.len() / 2];
    let smooth: Vec<(f32, f64)> = got
        .iter()
        .zip(&one_sided)
        .filter(|(_, [u, d])| (u - d).abs() <= median)
        .map(|(&g, [u, d])| (g, (u + d) / 2.0))
        .collect();
    let scale = smooth.iter().fold(0.0f64, |a, (_, e)| a.max(e.abs()));
    let err = largest_error(
        smooth
            .iter()
            .map(|&(g, e)| (f64::from(g) - e).abs() / scale),
    );
    (err, scale, flat.len() - smooth.len())
}
