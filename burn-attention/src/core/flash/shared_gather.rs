//! Gathering along the last axis with one index pattern for every leading position: `out[…, r,
//! c] = x[…, r, pattern[r, c]]`, as relative-position scores are read from a table of scores by
//! distance (Transformer-XL's and the Compressive Transformer's segments, ETC's labels).
//!
//! Burn's `gather` takes an index as large as its output and, under autodiff, scatters the
//! gradient back through it with a general scatter-add, which on `flex` took a sixth of a
//! `tiny` training step of those variants. Here the pattern is `rows × cols` indices held once,
//! the forward a copy a row, and the backward adds each row's gradient into its row of `dx`.
//! Tensors are contiguous row-major `f32` slices `[outer, rows, len]` in, `[outer, rows, cols]`
//! out; work is spread over `outer` with rayon.

use rayon::prelude::*;

/// Leading positions per rayon task at least (each a `rows × cols` block).
const MIN_OUTER: usize = 8;

/// Sizes of one call: `outer` leading positions, each `rows` rows of `len` values in and `cols`
/// out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatherDims {
    /// Product of the leading axes.
    pub outer: usize,
    /// Rows (the second-to-last axis).
    pub rows: usize,
    /// Values a row in (the last axis of `x`).
    pub len: usize,
    /// Values a row out (the pattern's columns).
    pub cols: usize,
}

/// The forward pass: `[outer, rows, cols]`.
pub fn forward(x: &[f32], pattern: &[u32], dims: GatherDims) -> Vec<f32> {
    let GatherDims {
        outer,
        rows,
        len,
        cols,
    } = dims;
    assert_eq!(x.len(), outer * rows * len);
    assert_eq!(pattern.len(), rows * cols);
    assert!(pattern.iter().all(|&i| (i as usize) < len));
    let mut out = vec![0.0; outer * rows * cols];
    if out.is_empty() {
        return out;
    }
    out.par_chunks_mut(rows * cols)
        .with_min_len(MIN_OUTER)
        .zip(x.par_chunks(rows * len))
        .for_each(|(out, x)| {
            for ((out, x), pattern) in out
                .chunks_exact_mut(cols)
                .zip(x.chunks_exact(len))
                .zip(pattern.chunks_exact(cols))
            {
                for (o, &i) in out.iter_mut().zip(pattern) {
                    *o = x[i as usize];
                }
            }
        });
    out
}

/// The backward pass: `dx` `[outer, rows, len]` from `d_out` `[outer, rows, cols]`, each
/// gathered value's gradient added where it was read (a value read twice gets both).
pub fn backward(d_out: &[f32], pattern: &[u32], dims: GatherDims) -> Vec<f32> {
    let GatherDims {
        outer,
        rows,
        len,
        cols,
    } = dims;
    assert_eq!(d_out.len(), outer * rows * cols);
    let mut dx = vec![0.0; outer * rows * len];
    if dx.is_empty() || d_out.is_empty() {
        return dx;
    }
    dx.par_chunks_mut(rows * len)
        .with_min_len(MIN_OUTER)
        .zip(d_out.par_chunks(rows * cols))
        .for_each(|(dx, d_out)| {
            for ((dx, d_out), pattern) in dx
                .chunks_exact_mut(len)
                .zip(d_out.chunks_exact(cols))
                .zip(pattern.chunks_exact(cols))
            {
                for (&g, &i) in d_out.iter().zip(pattern) {
                    dx[i as usize] += g;
                }
            }
        });
    dx
}
