//! The counter-based dropout mask (see [`crate::engines::dropout`]): whether an element is kept is
//! a pure function of a per-call seed and its (row, column), so the fused kernels regenerate in
//! their backward pass the mask their forward pass applied, and the composed steps given the
//! same seed drop the same elements.
//!
//! With `(a, b)` two 32-bit words of SplitMix64 applied to the seed and the row, an element of
//! column `c` is kept when a 32-bit avalanche hash of `c + a`, with `b` mixed in half way, is at
//! least `p · 2³²`. Kept elements are multiplied by `1 / (1 − p)`.

use burn::prelude::*;
use burn::tensor::Distribution;

/// The dropout mask of one call: a seed, the drop threshold and the scale of kept elements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DropMask {
    seed: u64,
    /// An element is kept when its hash is at least this (`p · 2³²`, rounded).
    threshold: u32,
    /// `1 / (1 − p)`.
    scale: f32,
}

/// SplitMix64's output function (Steele, Lea and Flood 2014).
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl DropMask {
    /// The mask of drop probability `prob` (in `[0, 1)`) for `seed`.
    pub(crate) fn new(prob: f64, seed: u64) -> Self {
        let threshold = (prob * 4_294_967_296.0).round().min(u32::MAX as f64) as u32;
        Self {
            seed,
            threshold,
            scale: (1.0 / (1.0 - prob)) as f32,
        }
    }

    /// The drop probability `p` (recovered from the scale of kept elements): what a kernel
    /// that draws its own mask (libtorch's on CUDA) is given instead of the mask.
    #[cfg_attr(not(feature = "tch"), allow(dead_code))]
    pub(crate) fn prob(&self) -> f64 {
        1.0 - 1.0 / f64::from(self.scale)
    }

    /// The drop threshold: an element is kept when its hash is at least this.
    #[cfg_attr(not(feature = "wgpu"), allow(dead_code))]
    pub(crate) fn threshold(&self) -> u32 {
        self.threshold
    }

    /// The factor of kept elements, `1 / (1 − p)`.
    #[cfg_attr(not(feature = "wgpu"), allow(dead_code))]
    pub(crate) fn keep_scale(&self) -> f32 {
        self.scale
    }

    /// A mask with a seed drawn from `device`'s random generator.
    pub(crate) fn draw(prob: f64, device: &Device) -> Self {
        // Four draws of 16 bits each, exact whatever the device's integer type.
        let seed = Tensor::<1, Int>::random([4], Distribution::Uniform(0.0, 65_536.0), device)
            .into_data()
            .convert::<i64>()
            .iter::<i64>()
            .fold(0u64, |seed, word| (seed << 16) | (word as u64 & 0xFFFF));
        Self::new(prob, seed)
    }

    /// The two words of row `row`'s key.
    pub(crate) fn row_key(&self, row: u64) -> [u32; 2] {
        let z = splitmix64(self.seed ^ splitmix64(row));
        [z as u32, (z >> 32) as u32]
    }

    /// Whether the element at (`row`, `col`) is kept.
    #[cfg(test)]
    pub(crate) fn keeps(&self, row: u64, col: u32) -> bool {
        super::hash::column_hash(col, self.row_key(row)) >= self.threshold
    }

    /// Multiplies `values`, the columns from `col0` of row `row`, by the mask: 0 where dropped,
    /// `1 / (1 − p)` where kept.
    pub(crate) fn apply_row(&self, row: u64, col0: u32, values: &mut [f32]) {
        let key = self.row_key(row);
        #[cfg(feature = "flex")]
        super::simd::dropout_row(values, key, col0, self.threshold, self.scale);
        #[cfg(not(feature = "flex"))]
        for (c, x) in values.iter_mut().enumerate() {
            let keep = super::hash::column_hash(col0.wrapping_add(c as u32), key) >= self.threshold;
            *x = if keep { *x * self.scale } else { 0.0 };
        }
    }

    /// The mask as a tensor of `shape`: rows are the positions of every axis but the last,
    /// in row-major order, columns the last axis.
    pub(crate) fn tensor<const D: usize>(&self, shape: [usize; D], device: &Device) -> Tensor<D> {
        let width = shape[D - 1];
        let count: usize = shape.iter().product();
        let mut values = vec![1.0f32; count];
        if width > 0 {
            self.apply_rows(&mut values, width);
        }
        Tensor::from_data(TensorData::new(values, shape), device)
    }

    /// Applies the mask to `values` seen as rows of `width` (row `r` is `values[r·width..]`).
    fn apply_rows(&self, values: &mut [f32], width: usize) {
        #[cfg(feature = "flex")]
        {
            use rayon::prelude::*;
            // Enough rows per task that a task is worth its scheduling.
            let rows_per_task = (16_384 / width).max(1);
            values
                .par_chunks_mut(rows_per_task * width)
                .enumerate()
                .for_each(|(t, chunk)| {
                    for (r, row) in chunk.chunks_mut(width).enumerate() {
                        self.apply_row((t * rows_per_task + r) as u64, 0, row);
                    }
                });
        }
        #[cfg(not(feature = "flex"))]
        for (r, row) in values.chunks_mut(width).enumerate() {
            self.apply_row(r as u64, 0, row);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fraction kept over 4M elements is `1 − p` within five standard deviations, and so
    /// is the fraction of rows' and columns' neighbours kept together (`(1 − p)²`): no
    /// correlation along either axis.
    #[test]
    fn kept_fraction_and_independence() {
        for prob in [0.1, 0.5, 0.9] {
            let mask = DropMask::new(prob, 0xDEAD_BEEF);
            let (rows, cols) = (2048u64, 2048u32);
            let (mut kept, mut both_row, mut both_col) = (0u64, 0u64, 0u64);
            for r in 0..rows {
                for c in 0..cols {
                    let k = mask.keeps(r, c);
                    kept += k as u64;
                    both_row += (k && c + 1 < cols && mask.keeps(r, c + 1)) as u64;
                    both_col += (k && r + 1 < rows && mask.keeps(r + 1, c)) as u64;
                }
            }
            let n = (rows * cols as u64) as f64;
            let keep = 1.0 - prob;
            let check = |count: u64, total: f64, p: f64, what: &str| {
                let sd = (total * p * (1.0 - p)).sqrt();
                let diff = (count as f64 - total * p).abs();
                assert!(
                    diff < 5.0 * sd,
                    "p={prob} {what}: {count} of {total}, want {p}"
                );
            };
            check(kept, n, keep, "kept");
            check(both_row, n - rows as f64, keep * keep, "row neighbours");
            check(both_col, n - cols as f64, keep * keep, "column neighbours");
        }
    }

    /// Two seeds give masks that agree on about `p² + (1 − p)²` of the elements, as independent
    /// masks do; the same seed gives the same mask.
    #[test]
    fn seeds_are_independent_and_reproducible() {
        let prob = 0.3;
        let (a, b) = (DropMask::new(prob, 1), DropMask::new(prob, 2));
        let mut agree = 0u64;
        let n = 1000u64 * 1000;
        for r in 0..1000 {
            for c in 0..1000u32 {
                agree += (a.keeps(r, c) == b.keeps(r, c)) as u64;
                assert_eq!(a.keeps(r, c), DropMask::new(prob, 1).keeps(r, c));
            }
        }
        let p = prob * prob + (1.0 - prob) * (1.0 - prob);
        let sd = (n as f64 * p * (1.0 - p)).sqrt();
        assert!((agree as f64 - n as f64 * p).abs() < 5.0 * sd, "{agree}");
    }

    /// The vectorised row kernel computes what the scalar definition says, from any column.
    #[test]
    fn row_kernel_matches_definition() {
        let mask = DropMask::new(0.25, 99);
        for col0 in [0u32, 5, 1000] {
            let mut values: Vec<f32> = (0..77).map(|i| i as f32 + 1.0).collect();
            mask.apply_row(12, col0, &mut values);
            for (c, &x) in values.iter().enumerate() {
                let want = if mask.keeps(12, col0 + c as u32) {
                    (c as f32 + 1.0) * (1.0 / 0.75f64) as f32
                } else {
                    0.0
                };
                assert_eq!(x, want, "column {}", col0 as usize + c);
            }
        }
    }
}
