//! Rotary position encoding: each pair of channels `(x_{2i}, x_{2i+1})` of a query or key at
//! position `p` rotated by the angle `p θ_i` (Su et al. 2021, arXiv 2104.09864), so that
//! `q_i·k_j` depends on the positions only through `i − j`. The angles are RetNet's
//! (Sun et al. 2023, arXiv 2307.08621: `θ_i = 10000^{−i / (d/2 − 1)}`, `i = 0..d/2`, from 1
//! down to 1/10000), the `Θ` of its retention.
//!
//! Positions are given per sequence, so that a padded position need not count: the variants
//! pass the index of each position among its sequence's real ones.

use burn::prelude::*;

/// The rotation angles `θ_i` of `d`-wide heads (`d` even), `[d / 2]`.
fn angles(d: usize, device: &Device) -> Tensor<1> {
    let half = d / 2;
    let theta: Vec<f32> = (0..half)
        .map(|i| {
            let t = if half > 1 {
                i as f64 / (half - 1) as f64
            } else {
                0.0
            };
            10_000f64.powf(-t) as f32
        })
        .collect();
    Tensor::from_data(TensorData::new(theta, [half]), device)
}

/// `x` rotated at `positions`.
///
/// # Shapes
/// - `x`: `[batch, heads, n, d]`, `d` even
/// - `positions`: `[batch, n]`, each position's index (a float, exact up to 2^24)
///
/// # Panics
/// If `d` is odd (the variants refuse odd head widths when configured).
pub fn rotate(x: Tensor<4>, positions: Tensor<2>) -> Tensor<4> {
    let [batch, heads, n, d] = x.dims();
    assert!(
        d % 2 == 0,
        "rotary position encoding needs an even head width, not {d}"
    );
    let half = d / 2;
    let theta = angles(d, &x.device()).reshape([1, 1, 1, half]);
    let phase = positions.reshape([batch, 1, n, 1]) * theta; // [b, 1, n, d/2]
    let (cos, sin) = (phase.clone().cos(), phase.sin());
    let pairs = x.reshape([batch, heads, n, half, 2]);
    let even = pairs
        .clone()
        .slice(s![.., .., .., .., 0..1])
        .reshape([batch, heads, n, half]);
    let odd = pairs
        .slice(s![.., .., .., .., 1..2])
        .reshape([batch, heads, n, half]);
    let rotated_even = even.clone() * cos.clone() - odd.clone() * sin.clone();
    let rotated_odd = even * sin + odd * cos;
    Tensor::stack::<5>(vec![rotated_even, rotated_odd], 4).reshape([batch, heads, n, d])
}

/// The index of each position among its sequence's real ones, `[batch, n]` (a padded
/// position gets its predecessor's), from `mask_pad: [batch, n]` (`true` = padding); without a
/// mask, `0..n` in every row.
pub fn real_positions(
    mask_pad: &Option<Tensor<2, Bool>>,
    batch: usize,
    n: usize,
    device: &Device,
) -> Tensor<2> {
    match mask_pad {
        Some(mask) => mask.clone().bool_not().float().cumsum(1) - 1.0,
        None => Tensor::<1, Int>::arange(0..n as i64, device)
            .float()
            .reshape([1, n])
            .expand([batch, n]),
    }
}
