//! Rotary position encoding: each pair of channels `(x_{2i}, x_{2i+1})` of a query or key at
//! position `p` rotated by the angle `p θ_i` (Su et al. 2021, RoFormer, arXiv 2104.09864), so
//! that `q_i·k_j` depends on the positions only through `i − j`. Two sets of angles:
//! RoFormer's, `θ_i = 10000^{−2i/d}` (`i = 0..d/2`; [`rotate_roformer`], the library's rotary
//! positions for any attention that takes them), and RetNet's (Sun et al. 2023, arXiv
//! 2307.08621: `θ_i = 10000^{−i / (d/2 − 1)}`, from 1 down to 1/10000; [`rotate`]), the `Θ` of
//! its retention.
//!
//! Positions are given per sequence, so that a padded position need not count: the variants
//! pass the index of each position among its sequence's real ones ([`real_positions`]).

use burn::prelude::*;

/// RetNet's rotation angles of `d`-wide heads (`d` even), each `θ_i` twice (for channels `2i`
/// and `2i + 1`), `[d]`.
fn retnet_angles(d: usize, device: &Device) -> Tensor<1> {
    let half = d / 2;
    let theta: Vec<f32> = (0..d)
        .map(|c| {
            let i = c / 2;
            let t = if half > 1 {
                i as f64 / (half - 1) as f64
            } else {
                0.0
            };
            10_000f64.powf(-t) as f32
        })
        .collect();
    Tensor::from_data(TensorData::new(theta, [d]), device)
}

/// RoFormer's rotation angles of `d`-wide heads (`d` even), `θ_i = 10000^{−2i/d}`, each twice
/// (for channels `2i` and `2i + 1`), `[d]`.
fn roformer_angles(d: usize, device: &Device) -> Tensor<1> {
    let theta: Vec<f32> = (0..d)
        .map(|c| 10_000f64.powf(-2.0 * (c / 2) as f64 / d as f64) as f32)
        .collect();
    Tensor::from_data(TensorData::new(theta, [d]), device)
}

/// The `d × d` matrix that takes each channel pair `(x_{2i}, x_{2i+1})` to `(−x_{2i+1}, x_{2i})`
/// (`x` times it, `x` a row).
fn quarter_turn(d: usize, device: &Device) -> Tensor<2> {
    let mut m = vec![0.0f32; d * d];
    for i in 0..d / 2 {
        let (even, odd) = (2 * i, 2 * i + 1);
        m[odd * d + even] = -1.0;
        m[even * d + odd] = 1.0;
    }
    Tensor::from_data(TensorData::new(m, [d, d]), device)
}

/// `x` rotated at `positions` by RetNet's angles (see the module docs): `x cos + (x J) sin`
/// channel by channel, with `J` the quarter turn of each pair, `(x_{2i}, x_{2i+1}) ↦
/// (−x_{2i+1}, x_{2i})`: one small product and three element-wise operations, where splitting
/// the pairs apart and stacking them back would copy `x` several times, forward and backward.
///
/// # Shapes
/// - `x`: `[batch, heads, n, d]`, `d` even
/// - `positions`: `[batch, n]`, each position's index (a float, exact up to 2^24)
///
/// # Panics
/// If `d` is odd (the variants refuse odd head widths when configured).
pub fn rotate(x: Tensor<4>, positions: Tensor<2>) -> Tensor<4> {
    Rotation::new(Angles::RetNet, &positions, x.dims()[3]).apply(x)
}

/// Queries and keys rotated at `positions` by RetNet's angles, the rotation built once for both
/// (see [`rotate`]).
pub fn rotate_retnet_queries_keys(
    q: Tensor<4>,
    k: Tensor<4>,
    positions: Tensor<2>,
) -> (Tensor<4>, Tensor<4>) {
    let rotation = Rotation::new(Angles::RetNet, &positions, q.dims()[3]);
    (rotation.apply(q), rotation.apply(k))
}

/// `x` rotated at `positions` by RoFormer's angles, `θ_i = 10000^{−2i/d}` (the library's rotary
/// positions); computed as [`rotate`] is.
///
/// # Shapes
/// As [`rotate`].
///
/// # Panics
/// If `d` is odd (the variants refuse odd head widths when rotary positions are asked for).
pub fn rotate_roformer(x: Tensor<4>, positions: Tensor<2>) -> Tensor<4> {
    Rotation::new(Angles::RoFormer, &positions, x.dims()[3]).apply(x)
}

/// Queries and keys rotated at `positions` by RoFormer's angles (the per-head masks' rotary
/// positions, self-attention), the rotation built once for both; unchanged without positions.
///
/// # Shapes
/// - `q`, `k`: `[batch, heads, n, d]`; `positions`: `[batch, n]`
pub fn rotate_queries_keys(
    q: Tensor<4>,
    k: Tensor<4>,
    positions: &Option<Tensor<2>>,
) -> (Tensor<4>, Tensor<4>) {
    match positions {
        Some(positions) => {
            let rotation = Rotation::new(Angles::RoFormer, positions, q.dims()[3]);
            (rotation.apply(q), rotation.apply(k))
        }
        None => (q, k),
    }
}

/// Which angles a rotation turns by.
#[derive(Clone, Copy)]
enum Angles {
    RetNet,
    RoFormer,
}

/// A rotation at given positions, built once (the angles' cosines and sines, `[batch, 1, n, d]`,
/// and the quarter turn `J`) and applied to as many tensors of those positions as need it.
struct Rotation {
    cos: Tensor<4>,
    sin: Tensor<4>,
    turn: Tensor<4>,
}

impl Rotation {
    /// The rotation of `d`-wide heads at `positions` (`[batch, n]`).
    ///
    /// # Panics
    /// If `d` is odd.
    fn new(angles: Angles, positions: &Tensor<2>, d: usize) -> Self {
        assert!(
            d.is_multiple_of(2),
            "rotary position encoding needs an even head width, not {d}"
        );
        let [batch, n] = positions.dims();
        let device = positions.device();
        let theta = match angles {
            Angles::RetNet => retnet_angles(d, &device),
            Angles::RoFormer => roformer_angles(d, &device),
        };
        let phase = positions.clone().reshape([batch, 1, n, 1]) * theta.reshape([1, 1, 1, d]);
        Self {
            cos: phase.clone().cos(),
            sin: phase.sin(),
            turn: quarter_turn(d, &device).reshape([1, 1, d, d]),
        }
    }

    /// `x cos + (x J) sin`, `x`: `[batch, heads, n, d]`.
    fn apply(&self, x: Tensor<4>) -> Tensor<4> {
        let turned = x.clone().matmul(self.turn.clone());
        x * self.cos.clone() + turned * self.sin.clone()
    }
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
