//! Tiled ("flash") softmax attention on the CPU: forward with the per-row log-sum-exp, and the
//! backward that recomputes the weights tile by tile from it (Dao et al. 2022, arXiv 2205.14135;
//! the loop order of FlashAttention-2, arXiv 2307.08691).
//!
//! Tensors are contiguous row-major `f32` slices: `q` `[bh, n_q, d]`, `k` `[bh, n_k, d]`,
//! `v` `[bh, n_k, d_v]`, where `bh` runs over batch × heads. A key-padding mask holds one flag
//! per batch row and key (`[batch, n_k]`, `true` = padding). Masked scores are *replaced* by
//! [`MASK_FILL`] after scaling, exactly as the composed [`exact_softmax_attention`](crate::engines::softmax::exact_softmax_attention)
//! does, and pass no gradient. With a causal mask and no padding mask, tiles that lie wholly in
//! the future are skipped; every row keeps its own key 0, so the skipped weights are exactly
//! zero in `f32` as well.
//!
//! Padding is skipped too, where skipping changes nothing. A key tile that is wholly padding
//! adds `exp(MASK_FILL - m)` to a row whose largest score `m` is a real key's, and the
//! exponential below gives exactly 0 for that (below -87.3), so such tiles are left out: in the
//! forward pass once each row of the query tile has met a real key's score above
//! `MASK_FILL + 88` (otherwise, a sequence wholly padding say, they run after the rest, as
//! before); in the backward pass where each row's log-sum-exp is that far above. And a query
//! tile whose output gradient is all zero (the padded positions of a trained model, whose
//! outputs no loss reads) contributes nothing to any gradient: `dP = dO Vᵀ` and
//! `delta = Σ dO ∘ O` are 0, so `dS` and `dV`'s share are 0, and the tile is left out of the
//! backward pass. Both leave the results unchanged for finite inputs; with padding after each
//! sequence they are the same bits. At LRA's ListOps lengths (500 to 2,000 tokens, batches
//! padded to their longest) this leaves out about 40% of the forward pass's tiles and 60% of
//! the backward pass's.
//!
//! Products run on the `gemm` crate (the one Burn's `flex` backend uses) on tiles that stay in
//! cache; the exponentials on a polynomial that the compiler vectorises (AVX-512 or AVX2 where
//! the CPU has them, picked at run time). Work is spread over batch × heads (and query tiles in
//! the forward pass) with rayon. Memory beyond inputs and outputs: `O(n)` per row block.

use gemm::Parallelism;
use rayon::prelude::*;

use super::simd;

use super::DropMask;
use crate::contract::input::MASK_FILL;

/// Query rows per tile.
const BLOCK_Q: usize = 128;
/// Keys per tile.
const BLOCK_K: usize = 256;
/// A row whose largest score (forward) or log-sum-exp (backward) lies above this gives its
/// padded keys a weight of exactly 0: `exp(MASK_FILL - m)` with `MASK_FILL - m < -88`, below
/// the -87.3 under which the kernels' exponential is 0.
const PADDING_IS_NEGLIGIBLE_ABOVE: f32 = MASK_FILL + 88.0;

/// Sizes of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    /// Batch size.
    pub batch: usize,
    /// Heads.
    pub heads: usize,
    /// Query rows.
    pub n_q: usize,
    /// Keys.
    pub n_k: usize,
    /// Query and key width.
    pub d: usize,
    /// Value width.
    pub d_v: usize,
}

impl Dims {
    fn bh(&self) -> usize {
        self.batch * self.heads
    }

    /// `[batch, heads, n_q, d]`.
    pub fn q_shape(&self) -> [usize; 4] {
        [self.batch, self.heads, self.n_q, self.d]
    }

    /// `[batch, heads, n_k, d]`.
    pub fn k_shape(&self) -> [usize; 4] {
        [self.batch, self.heads, self.n_k, self.d]
    }

    /// `[batch, heads, n_k, d_v]`.
    pub fn v_shape(&self) -> [usize; 4] {
        [self.batch, self.heads, self.n_k, self.d_v]
    }

    /// `[batch, heads, n_q, d_v]`.
    pub fn out_shape(&self) -> [usize; 4] {
        [self.batch, self.heads, self.n_q, self.d_v]
    }
}

/// Score options shared by the forward and backward passes.
#[derive(Debug, Clone, Copy)]
pub struct Scoring<'a> {
    /// Multiplies `q kᵀ` (usually `1/√d`).
    pub scale: f32,
    /// Key `j` is masked for query `i` when `j > i`.
    pub causal: bool,
    /// Key-padding flags `[batch, n_k]`, `true` = padding.
    pub key_padding: Option<&'a [bool]>,
    /// Dropout on the weights: the mask of weight (`h · n_q + i`, `j`) for head `h` of
    /// batch × heads, query `i` and key `j`, applied in the forward pass and regenerated in the
    /// backward pass.
    pub dropout: Option<DropMask>,
}

impl Scoring<'_> {
    /// Whether the tile of queries `rows` and keys from `k0` has any unmasked score that
    /// matters; only wholly-future causal tiles are skipped, and only without padding.
    fn skip(&self, rows: &std::ops::Range<usize>, k0: usize) -> bool {
        self.causal && self.key_padding.is_none() && k0 > rows.end - 1
    }

    /// The padding flags of batch row `batch`'s `keys`, or `None` without a padding mask.
    fn padding(&self, batch: usize, n_k: usize, keys: &std::ops::Range<usize>) -> Option<&[bool]> {
        self.key_padding
            .map(|mask| &mask[batch * n_k + keys.start..batch * n_k + keys.end])
    }

    /// Whether every key of `keys` is padding in batch row `batch`.
    fn all_padding(&self, batch: usize, n_k: usize, keys: &std::ops::Range<usize>) -> bool {
        self.padding(batch, n_k, keys)
            .is_some_and(|flags| flags.iter().all(|&pad| pad))
    }

    /// Writes `fill` over the masked entries of one tile `s` (`rows × keys`, row stride
    /// `BLOCK_K`): [`MASK_FILL`] over scores, 0 over the score gradients.
    fn mask_tile(
        &self,
        s: &mut [f32],
        batch: usize,
        n_k: usize,
        rows: &std::ops::Range<usize>,
        keys: &std::ops::Range<usize>,
        fill: f32,
    ) {
        // A tile without padding (most of them) has nothing to fill without a causal mask.
        let padding = self
            .padding(batch, n_k, keys)
            .filter(|flags| flags.contains(&true));
        if !self.causal && padding.is_none() {
            return;
        }
        for (r, i) in rows.clone().enumerate() {
            let row = &mut s[r * BLOCK_K..r * BLOCK_K + keys.len()];
            if let Some(padding) = padding {
                for (score, &pad) in row.iter_mut().zip(padding) {
                    if pad {
                        *score = fill;
                    }
                }
            }
            if self.causal && keys.end > i + 1 {
                let from = (i + 1).saturating_sub(keys.start);
                row[from..].fill(fill);
            }
        }
    }
}

/// `dst (m×n) = alpha·dst + beta·lhs (m×k) · rhs (k×n)`, row-major with the given strides
/// (`(row stride, column stride)` per matrix). `alpha` is ignored when `accumulate` is false.
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    dst_rs: usize,
    accumulate: bool,
    lhs: &[f32],
    lhs_strides: (usize, usize),
    rhs: &[f32],
    rhs_strides: (usize, usize),
    beta: f32,
) {
    if m == 0 || n == 0 {
        return;
    }
    // Bounds of the furthest element each operand is read or written at.
    assert!(dst.len() > (m - 1) * dst_rs + (n - 1));
    if k > 0 {
        assert!(lhs.len() > (m - 1) * lhs_strides.0 + (k - 1) * lhs_strides.1);
        assert!(rhs.len() > (k - 1) * rhs_strides.0 + (n - 1) * rhs_strides.1);
    }
    // SAFETY: the asserts above keep every access of the m×n×k product inside the slices, and
    // `dst` is borrowed mutably, so it aliases neither operand.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_strides.1 as isize,
            lhs_strides.0 as isize,
            rhs.as_ptr(),
            rhs_strides.1 as isize,
            rhs_strides.0 as isize,
            1.0,
            beta,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

/// Forward pass: returns the output `[bh, n_q, d_v]` and the log-sum-exp of every score row
/// `[bh, n_q]`, which the backward pass needs.
pub fn forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: Dims,
    scoring: Scoring<'_>,
) -> (Vec<f32>, Vec<f32>) {
    let Dims {
        n_q, n_k, d, d_v, ..
    } = dims;
    assert_eq!(q.len(), dims.bh() * n_q * d, "query length");
    assert_eq!(k.len(), dims.bh() * n_k * d, "key length");
    assert_eq!(v.len(), dims.bh() * n_k * d_v, "value length");
    let mut out = vec![0.0f32; dims.bh() * n_q * d_v];
    let mut lse = vec![0.0f32; dims.bh() * n_q];
    if n_q == 0 {
        return (out, lse);
    }
    // One task per batch·head (its query tiles run in turn): each owns its rows of `out`
    // and `lse`.
    out.par_chunks_mut(n_q * d_v)
        .zip(lse.par_chunks_mut(n_q))
        .enumerate()
        .flat_map_iter(|(h, (out, lse))| {
            out.chunks_mut(BLOCK_Q * d_v)
                .zip(lse.chunks_mut(BLOCK_Q))
                .enumerate()
                .map(move |(t, chunk)| (h, t, chunk))
        })
        .for_each_init(
            || {
                (
                    vec![0.0f32; BLOCK_Q * BLOCK_K],
                    vec![0.0f32; BLOCK_Q],
                    vec![0.0f32; BLOCK_Q],
                )
            },
            |(s, m, l), (h, t, (out, lse))| {
                let rows = t * BLOCK_Q..(t * BLOCK_Q + BLOCK_Q).min(n_q);
                let q = &q[(h * n_q + rows.start) * d..(h * n_q + rows.end) * d];
                let k = &k[h * n_k * d..(h + 1) * n_k * d];
                let v = &v[h * n_k * d_v..(h + 1) * n_k * d_v];
                forward_tile(q, k, v, out, lse, s, m, l, &rows, h, dims, &scoring);
            },
        );
    (out, lse)
}

/// One query tile of the forward pass (head `h` of batch × heads): online softmax over the key
/// tiles. Dropout zeroes weights after they entered the row sums, so the normalisation is the
/// softmax's and only the product with `v` sees the mask. Key tiles wholly padding come last,
/// and only for rows that have not yet met a real key's score far above the fill (see the
/// module's documentation); with padding after the keys that is their own place.
#[allow(clippy::too_many_arguments)]
fn forward_tile(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    lse: &mut [f32],
    s: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
    rows: &std::ops::Range<usize>,
    h: usize,
    dims: Dims,
    scoring: &Scoring<'_>,
) {
    let Dims { n_k, d_v, .. } = dims;
    let b = h / dims.heads;
    let bq = rows.len();
    out.fill(0.0);
    m[..bq].fill(f32::NEG_INFINITY);
    l[..bq].fill(0.0);
    let mut padded_tiles = false;
    for k0 in (0..n_k).step_by(BLOCK_K) {
        if scoring.skip(rows, k0) {
            break;
        }
        let keys = k0..(k0 + BLOCK_K).min(n_k);
        if scoring.all_padding(b, n_k, &keys) {
            padded_tiles = true;
            continue;
        }
        forward_key_tile(q, k, v, out, s, m, l, rows, &keys, h, dims, scoring);
    }
    // A NaN maximum counts as not above, so its row takes the padded tiles too.
    let negligible = m[..bq].iter().all(|&max| max > PADDING_IS_NEGLIGIBLE_ABOVE);
    if padded_tiles && !negligible {
        for k0 in (0..n_k).step_by(BLOCK_K) {
            let keys = k0..(k0 + BLOCK_K).min(n_k);
            if scoring.all_padding(b, n_k, &keys) {
                forward_key_tile(q, k, v, out, s, m, l, rows, &keys, h, dims, scoring);
            }
        }
    }
    for r in 0..bq {
        let inv = 1.0 / l[r];
        for x in &mut out[r * d_v..(r + 1) * d_v] {
            *x *= inv;
        }
        lse[r] = m[r] + l[r].ln();
    }
}

/// One key tile `keys` of [`forward_tile`]: its scores, the running maxima `m` and sums `l` of
/// the query tile's rows brought up to date, and its weighted values added to `out`.
#[allow(clippy::too_many_arguments)]
fn forward_key_tile(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    s: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
    rows: &std::ops::Range<usize>,
    keys: &std::ops::Range<usize>,
    h: usize,
    dims: Dims,
    scoring: &Scoring<'_>,
) {
    let Dims {
        n_q, n_k, d, d_v, ..
    } = dims;
    let b = h / dims.heads;
    let (bq, bk, k0) = (rows.len(), keys.len(), keys.start);
    matmul(
        bq,
        bk,
        d,
        s,
        BLOCK_K,
        false,
        q,
        (d, 1),
        &k[k0 * d..],
        (1, d),
        scoring.scale,
    );
    scoring.mask_tile(s, b, n_k, rows, keys, MASK_FILL);
    for r in 0..bq {
        let row = &mut s[r * BLOCK_K..r * BLOCK_K + bk];
        let new_max = m[r].max(simd::max(row));
        let sum = simd::exp_shift_sum(row, new_max);
        let rescale = (m[r] - new_max).exp();
        l[r] = l[r] * rescale + sum;
        m[r] = new_max;
        if rescale != 1.0 {
            for x in &mut out[r * d_v..(r + 1) * d_v] {
                *x *= rescale;
            }
        }
        if let Some(mask) = &scoring.dropout {
            mask.apply_row((h * n_q + rows.start + r) as u64, k0 as u32, row);
        }
    }
    matmul(
        bq,
        d_v,
        bk,
        out,
        d_v,
        true,
        s,
        (BLOCK_K, 1),
        &v[k0 * d_v..],
        (d_v, 1),
        1.0,
    );
}

/// Gradients of the forward pass with respect to `q`, `k` and `v`, given the output `o`, its
/// log-sum-exp rows `lse` and the output gradient `d_o`.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    o: &[f32],
    lse: &[f32],
    d_o: &[f32],
    dims: Dims,
    scoring: Scoring<'_>,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let Dims {
        n_q, n_k, d, d_v, ..
    } = dims;
    let bh = dims.bh();
    assert_eq!(o.len(), bh * n_q * d_v, "output length");
    assert_eq!(d_o.len(), bh * n_q * d_v, "output-gradient length");
    assert_eq!(lse.len(), bh * n_q, "log-sum-exp length");
    let mut dq = vec![0.0f32; bh * n_q * d];
    let mut dk = vec![0.0f32; bh * n_k * d];
    let mut dv = vec![0.0f32; bh * n_k * d_v];
    if n_q == 0 || n_k == 0 {
        return (dq, dk, dv);
    }
    // One task per batch·head: it owns that head's dq, dk and dv.
    dq.par_chunks_mut(n_q * d)
        .zip(dk.par_chunks_mut(n_k * d))
        .zip(dv.par_chunks_mut(n_k * d_v))
        .enumerate()
        .for_each_init(
            || {
                (
                    vec![0.0f32; BLOCK_Q * BLOCK_K],
                    vec![0.0f32; BLOCK_Q * BLOCK_K],
                    vec![0.0f32; n_q],
                    // Per query tile: whether its output gradient is all zero.
                    vec![false; n_q.div_ceil(BLOCK_Q)],
                    // The dropped weights, with dropout.
                    vec![
                        0.0f32;
                        if scoring.dropout.is_some() {
                            BLOCK_Q * BLOCK_K
                        } else {
                            0
                        }
                    ],
                )
            },
            |(p, dp, delta, quiet, dropped), (h, ((dq, dk), dv))| {
                let b = h / dims.heads;
                let q = &q[h * n_q * d..(h + 1) * n_q * d];
                let k = &k[h * n_k * d..(h + 1) * n_k * d];
                let v = &v[h * n_k * d_v..(h + 1) * n_k * d_v];
                let o = &o[h * n_q * d_v..(h + 1) * n_q * d_v];
                let d_o = &d_o[h * n_q * d_v..(h + 1) * n_q * d_v];
                let lse = &lse[h * n_q..(h + 1) * n_q];
                // delta_i = Σ_c dO_ic O_ic = Σ_j P_ij dP_ij, the softmax backward's row term.
                for (i, delta) in delta.iter_mut().enumerate() {
                    *delta = simd::dot(&o[i * d_v..(i + 1) * d_v], &d_o[i * d_v..(i + 1) * d_v]);
                }
                // Tiles that contribute exactly nothing (the module's documentation): query
                // tiles with no output gradient, and wholly padded key tiles where every row's
                // log-sum-exp leaves their weights at 0.
                for (t, quiet) in quiet.iter_mut().enumerate() {
                    let rows = t * BLOCK_Q * d_v..((t + 1) * BLOCK_Q).min(n_q) * d_v;
                    *quiet = d_o[rows].iter().all(|&x| x == 0.0);
                }
                let negligible = |rows: &std::ops::Range<usize>| -> bool {
                    lse[rows.clone()]
                        .iter()
                        .all(|&x| x > PADDING_IS_NEGLIGIBLE_ABOVE)
                };
                for k0 in (0..n_k).step_by(BLOCK_K) {
                    let keys = k0..(k0 + BLOCK_K).min(n_k);
                    let bk = keys.len();
                    let padded = scoring.all_padding(b, n_k, &keys);
                    for q0 in (0..n_q).step_by(BLOCK_Q) {
                        let rows = q0..(q0 + BLOCK_Q).min(n_q);
                        if scoring.skip(&rows, k0)
                            || quiet[q0 / BLOCK_Q]
                            || (padded && negligible(&rows))
                        {
                            continue;
                        }
                        let bq = rows.len();
                        // P = exp(scale·Q Kᵀ (masked) - lse).
                        matmul(
                            bq,
                            bk,
                            d,
                            p,
                            BLOCK_K,
                            false,
                            &q[q0 * d..],
                            (d, 1),
                            &k[k0 * d..],
                            (1, d),
                            scoring.scale,
                        );
                        scoring.mask_tile(p, b, n_k, &rows, &keys, MASK_FILL);
                        for r in 0..bq {
                            simd::exp_shift(&mut p[r * BLOCK_K..r * BLOCK_K + bk], lse[q0 + r]);
                        }
                        // The weights the output was made of: P, or P ∘ Z with dropout.
                        let used: &[f32] = match &scoring.dropout {
                            Some(mask) => {
                                for r in 0..bq {
                                    let at = r * BLOCK_K..r * BLOCK_K + bk;
                                    let row = &mut dropped[at.clone()];
                                    row.copy_from_slice(&p[at]);
                                    mask.apply_row((h * n_q + q0 + r) as u64, k0 as u32, row);
                                }
                                dropped
                            }
                            None => p,
                        };
                        // dV += (P ∘ Z)ᵀ dO.
                        matmul(
                            bk,
                            d_v,
                            bq,
                            &mut dv[k0 * d_v..],
                            d_v,
                            true,
                            used,
                            (1, BLOCK_K),
                            &d_o[q0 * d_v..],
                            (d_v, 1),
                            1.0,
                        );
                        // dP = dO Vᵀ.
                        matmul(
                            bq,
                            bk,
                            d_v,
                            dp,
                            BLOCK_K,
                            false,
                            &d_o[q0 * d_v..],
                            (d_v, 1),
                            &v[k0 * d_v..],
                            (1, d_v),
                            1.0,
                        );
                        // dP ∘= Z: the gradient of the weights before dropout. Then
                        // dS = P ∘ (dP - delta), scaled once for both products below (delta =
                        // Σ_c dO O is Σ_j P dP with the mask as well).
                        for r in 0..bq {
                            let at = r * BLOCK_K..r * BLOCK_K + bk;
                            if let Some(mask) = &scoring.dropout {
                                mask.apply_row(
                                    (h * n_q + q0 + r) as u64,
                                    k0 as u32,
                                    &mut dp[at.clone()],
                                );
                            }
                            simd::softmax_grad(
                                &mut dp[at.clone()],
                                &p[at],
                                delta[q0 + r],
                                scoring.scale,
                            );
                        }
                        // Masked scores were replaced, not computed: no gradient flows to them.
                        scoring.mask_tile(dp, b, n_k, &rows, &keys, 0.0);
                        // dQ += dS K;  dK += dSᵀ Q.
                        matmul(
                            bq,
                            d,
                            bk,
                            &mut dq[q0 * d..],
                            d,
                            true,
                            dp,
                            (BLOCK_K, 1),
                            &k[k0 * d..],
                            (d, 1),
                            1.0,
                        );
                        matmul(
                            bk,
                            d,
                            bq,
                            &mut dk[k0 * d..],
                            d,
                            true,
                            dp,
                            (1, BLOCK_K),
                            &q[q0 * d..],
                            (d, 1),
                            1.0,
                        );
                    }
                }
            },
        );
    (dq, dk, dv)
}

/// `exp` of every element in place, vectorised and spread over the rayon pool in chunks.
/// Accuracy and range as the kernels' exponential: about 2 ulp, 0 below -87.3 (-inf included),
/// inputs clamped above 88.7 (+inf gives a large finite value).
pub fn exp_in_place(values: &mut [f32]) {
    par_chunks(values, |chunk| simd::exp_shift(chunk, 0.0));
}

/// Softmax over each row of `row_len` consecutive values, in place: `exp(x − max) / Σ`, through
/// the kernels' vectorised exponential, rows spread over the rayon pool.
pub fn softmax_rows_in_place(values: &mut [f32], row_len: usize) {
    par_rows(values, row_len, |row| {
        let max = simd::max(row);
        let inv = 1.0 / simd::exp_shift_sum(row, max);
        for x in row {
            *x *= inv;
        }
    });
}

/// The softmax backward per row in place, from the output `y`: `grad ← y ∘ (grad − ⟨grad, y⟩)`.
pub fn softmax_rows_grad_in_place(grad: &mut [f32], y: &[f32], row_len: usize) {
    assert_eq!(grad.len(), y.len(), "softmax gradient and output");
    if row_len == 0 {
        return;
    }
    let rows = rows_per_chunk(row_len) * row_len;
    grad.par_chunks_mut(rows)
        .zip(y.par_chunks(rows))
        .for_each(|(g, y)| {
            for (g, y) in g.chunks_exact_mut(row_len).zip(y.chunks_exact(row_len)) {
                let delta = simd::dot(g, y);
                simd::softmax_grad(g, y, delta, 1.0);
            }
        });
}

/// Rows of `row_len` values in one parallel task: about the element-wise chunk size.
fn rows_per_chunk(row_len: usize) -> usize {
    ((1 << 14) / row_len).max(1)
}

/// Applies `f` to every row of `row_len` values, rows grouped into tasks for the rayon pool.
fn par_rows(values: &mut [f32], row_len: usize, f: impl Fn(&mut [f32]) + Send + Sync) {
    if row_len == 0 {
        return;
    }
    values
        .par_chunks_mut(rows_per_chunk(row_len) * row_len)
        .for_each(|rows| rows.chunks_exact_mut(row_len).for_each(&f));
}

/// Applies `f` to `values` in chunks spread over the rayon pool (element-wise kernels).
fn par_chunks(values: &mut [f32], f: impl Fn(&mut [f32]) + Send + Sync) {
    const CHUNK: usize = 1 << 14;
    values.par_chunks_mut(CHUNK).for_each(f);
}

/// Applies `f` to matching chunks of `grad` (in place) and `other`, spread over the rayon pool.
fn par_chunks_with(grad: &mut [f32], other: &[f32], f: impl Fn(&mut [f32], &[f32]) + Send + Sync) {
    const CHUNK: usize = 1 << 14;
    assert_eq!(grad.len(), other.len(), "element-wise operands");
    grad.par_chunks_mut(CHUNK)
        .zip(other.par_chunks(CHUNK))
        .for_each(|(g, o)| f(g, o));
}

/// The exact GELU `x Φ(x) = ½ x erfc(−x/√2)` of every element in place, vectorised (see
/// `simd::erfc` for the accuracy).
pub fn gelu_in_place(values: &mut [f32]) {
    par_chunks(values, simd::gelu);
}

/// `grad ∘ GELU′(x)` in place, `GELU′(x) = Φ(x) + x φ(x)`.
pub fn gelu_grad_in_place(grad: &mut [f32], x: &[f32]) {
    par_chunks_with(grad, x, simd::gelu_grad);
}

/// The logistic sigmoid `1 / (1 + exp(−x))` of every element in place, vectorised.
pub fn sigmoid_in_place(values: &mut [f32]) {
    par_chunks(values, simd::sigmoid);
}

/// `grad ∘ σ′` in place, from the output `y = σ(x)`: `σ′ = y (1 − y)`.
pub fn sigmoid_grad_in_place(grad: &mut [f32], y: &[f32]) {
    par_chunks_with(grad, y, simd::sigmoid_grad);
}

/// SiLU `x σ(x)` of every element in place, vectorised.
pub fn silu_in_place(values: &mut [f32]) {
    par_chunks(values, simd::silu);
}

/// `grad ∘ SiLU′(x)` in place, `SiLU′(x) = σ(x) (1 + x (1 − σ(x)))`.
pub fn silu_grad_in_place(grad: &mut [f32], x: &[f32]) {
    par_chunks_with(grad, x, simd::silu_grad);
}

/// Softplus `ln(1 + eˣ)` of every element in place, vectorised and without overflow.
pub fn softplus_in_place(values: &mut [f32]) {
    par_chunks(values, simd::softplus);
}

/// `grad ∘ softplus′(x)` in place, `softplus′ = σ(x)` (from the input: from the output,
/// `1 − e^{−y}` would cancel where `y` is small).
pub fn softplus_grad_in_place(grad: &mut [f32], x: &[f32]) {
    par_chunks_with(grad, x, simd::softplus_grad);
}

/// `elu(x) + 1` of every element in place: `x + 1` for `x > 0`, `exp(x)` otherwise.
pub fn elu_plus_one_in_place(values: &mut [f32]) {
    par_chunks(values, simd::elu_plus_one);
}

/// `grad ∘ (elu + 1)′` in place, from the output `y`: the derivative is 1 where `x > 0` (there
/// `y > 1`) and `exp(x) = y` otherwise, that is `min(y, 1)`.
pub fn elu_plus_one_grad_in_place(grad: &mut [f32], y: &[f32]) {
    par_chunks_with(grad, y, simd::elu_plus_one_grad);
}

/// LayerNorm's forward over rows of `d`: `out = (x − μ) r γ + β` with `μ` the row's mean and
/// `r = 1 / √(σ² + ε)` (`σ²` its biased variance, both accumulated in f64); returns the output
/// and each row's `μ` and `r`, which the backward reuses.
pub fn layer_norm_forward(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    d: usize,
    epsilon: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = x.len() / d.max(1);
    let mut out = vec![0.0f32; x.len()];
    let mut stats = vec![(0.0f32, 0.0f32); rows];
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .zip(stats.par_iter_mut())
        .for_each(|((out, x), stats)| {
            let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / d as f64;
            let var = x
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / d as f64;
            let r = 1.0 / (var + f64::from(epsilon)).sqrt();
            let (mean, r) = (mean as f32, r as f32);
            for j in 0..d {
                out[j] = (x[j] - mean) * r * gamma[j] + beta[j];
            }
            *stats = (mean, r);
        });
    let (mean, rstd) = stats.into_iter().unzip();
    (out, mean, rstd)
}

/// LayerNorm's backward from the output's gradient `dy`: with `x̂ = (x − μ) r` and `g = dy γ`,
/// `dx = r (g − mean(g) − x̂ mean(g x̂))` a row, `dγ = Σ_rows dy x̂`, `dβ = Σ_rows dy`.
pub fn layer_norm_backward(
    x: &[f32],
    dy: &[f32],
    gamma: &[f32],
    (mean, rstd): (&[f32], &[f32]),
    d: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut dx = vec![0.0f32; x.len()];
    dx.par_chunks_mut(d)
        .zip(x.par_chunks(d).zip(dy.par_chunks(d)))
        .zip(mean.par_iter().zip(rstd.par_iter()))
        .for_each(|((dx, (x, dy)), (&mean, &r))| {
            let (mut a, mut b) = (0.0f64, 0.0f64);
            for j in 0..d {
                let g = f64::from(dy[j] * gamma[j]);
                a += g;
                b += g * f64::from((x[j] - mean) * r);
            }
            let (a, b) = ((a / d as f64) as f32, (b / d as f64) as f32);
            for j in 0..d {
                let x_hat = (x[j] - mean) * r;
                dx[j] = r * (dy[j] * gamma[j] - a - x_hat * b);
            }
        });
    // dγ and dβ: sums over rows, a block of rows a task, the blocks' sums then added in order
    // (the same result whatever the threads did: a resumed run repeats its steps exactly).
    const BLOCK: usize = 256;
    let partial: Vec<(Vec<f64>, Vec<f64>)> = x
        .par_chunks(d * BLOCK)
        .zip(dy.par_chunks(d * BLOCK))
        .zip(mean.par_chunks(BLOCK).zip(rstd.par_chunks(BLOCK)))
        .map(|((x, dy), (mean, rstd))| {
            let (mut dg, mut db) = (vec![0.0f64; d], vec![0.0f64; d]);
            for (row, (&mean, &r)) in mean.iter().zip(rstd).enumerate() {
                for j in 0..d {
                    let i = row * d + j;
                    dg[j] += f64::from(dy[i] * (x[i] - mean) * r);
                    db[j] += f64::from(dy[i]);
                }
            }
            (dg, db)
        })
        .collect();
    let (mut d_gamma, mut d_beta) = (vec![0.0f64; d], vec![0.0f64; d]);
    for (dg, db) in partial {
        d_gamma.iter_mut().zip(dg).for_each(|(a, b)| *a += b);
        d_beta.iter_mut().zip(db).for_each(|(a, b)| *a += b);
    }
    let narrow = |v: Vec<f64>| v.into_iter().map(|v| v as f32).collect();
    (dx, narrow(d_gamma), narrow(d_beta))
}
