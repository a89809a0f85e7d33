//! Gathering with one index for every leading position: along the last axis, `out[…, r, c] =
//! x[…, r, pattern[r, c]]`, as relative-position scores are read from a table of scores by
//! distance (Transformer-XL's and the Compressive Transformer's segments, ETC's labels); and
//! whole slices along an axis, `out[o, r, …] = x[o, rows[r], …]` (Burn's `select`), as the
//! Compressive Transformer picks its compressed memories.
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

/// Sizes of a selection along an axis: `outer` positions before the axis, `len` along it in,
/// `inner` values after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelectDims {
    /// Product of the axes before the selected one.
    pub outer: usize,
    /// The selected axis's length in.
    pub len: usize,
    /// Product of the axes after it.
    pub inner: usize,
}

/// `out[o, r, i] = x[o, rows[r], i]`: `[outer, rows.len(), inner]`.
pub fn select_forward(x: &[f32], rows: &[u32], dims: SelectDims) -> Vec<f32> {
    let SelectDims { outer, len, inner } = dims;
    assert_eq!(x.len(), outer * len * inner);
    assert!(rows.iter().all(|&r| (r as usize) < len));
    let mut out = vec![0.0; outer * rows.len() * inner];
    if out.is_empty() {
        return out;
    }
    out.par_chunks_mut(rows.len() * inner)
        .zip(x.par_chunks(len * inner))
        .for_each(|(out, x)| {
            for (out, &r) in out.chunks_exact_mut(inner).zip(rows) {
                let r = r as usize;
                out.copy_from_slice(&x[r * inner..(r + 1) * inner]);
            }
        });
    out
}

/// The backward of [`select_forward`]: `dx[o, rows[r], i] += d_out[o, r, i]`.
pub fn select_backward(d_out: &[f32], rows: &[u32], dims: SelectDims) -> Vec<f32> {
    let SelectDims { outer, len, inner } = dims;
    assert_eq!(d_out.len(), outer * rows.len() * inner);
    let mut dx = vec![0.0; outer * len * inner];
    if dx.is_empty() || d_out.is_empty() {
        return dx;
    }
    dx.par_chunks_mut(len * inner)
        .zip(d_out.par_chunks(rows.len() * inner))
        .for_each(|(dx, d_out)| {
            for (g, &r) in d_out.chunks_exact(inner).zip(rows) {
                let r = r as usize;
                for (dx, &g) in dx[r * inner..(r + 1) * inner].iter_mut().zip(g) {
                    *dx += g;
                }
            }
        });
    dx
}
