//! Axial attention: the sequence laid out as a 2-D grid, rows of `width` positions, and softmax
//! attention along the rows and along the columns of the grid.
//!
//! Ho et al. 2019, "Axial Attention in Multidimensional Transformers", arXiv 1912.12180: an
//! axial attention layer attends along one axis of a multidimensional tensor, all other axes
//! held fixed (for an image of `h × w` positions, O(h w (h + w)) in place of O((h w)²)); the
//! Axial Transformer stacks row and column layers. Here one module does both, splitting its
//! heads: the first `⌈H/2⌉` heads attend along each position's row, the others along its column,
//! one output projection over all of them (so it has softmax's parameters, and two encoder
//! layers reach every position). Position `i` sits at row `⌊i / width⌋`, column `i mod width`;
//! the last row may be partial.
//!
//! `width` is configured, or, unset, read from each input as a square grid (`n` a perfect
//! square: 784 pixels of Fashion-MNIST are 28 × 28, 1,024 of CIFAR-10 and Pathfinder 32 × 32,
//! Path-X's 16,384 128 × 128); a sequence that is not a square then is refused with an error
//! naming `width`. A CLS token prepended to an image takes position 0 of the grid and shifts
//! the rows by one position (the columns stay columns).
//!
//! Causal in raster order: a row head sees its row's positions up to itself, a column head its
//! column's rows up to its own. (The paper's decoder also lets a position see the whole rows
//! above it by shifting its input a row down, a model-level device outside one attention.)
//! Masks: padding, causal, an arbitrary attention mask and the weights (on the composed dense
//! steps, `n × n` per head); decoding token by token over a cache of every key, each step
//! scoring its row and column (O((width + t / width) d)). No cross-attention: the pattern
//! relates query and key positions.
//!
//! Cost per head: O(n (w + n/w) d) time and O(n (w + n/w)) memory, O(n^1.5 d) for a square.

use crate::engines::rotary::rotate_queries_keys;
use crate::variants::prelude::*;
use burn::nn::{Dropout, DropoutConfig};

use crate::engines::dropout::dropout;

use crate::contract::input::{flags_framed, zeros_after};
use crate::engines::softmax::{exact_softmax_attention, softmax_weights};

use crate::engines::gathered_softmax::{
    cache_positions, flags_tensor, padding_flags, suffix_lengths,
};

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "axial",
    paper: "Ho et al. 2019, arXiv 1912.12180",
    time: "O(n (w + n/w) d)",
    memory: "O(n (w + n/w))",
    capabilities: Capabilities {
        attention_mask: true,
        returns_weights: true,
        causal: true,
        rotary: true,
        weights_sum_to_one: true,
        per_head_form: true,
        prefill_end_padding_only: true,
        ..Capabilities::PADDING_ONLY
    },
};

/// The axis of the grid a head attends along.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Axis {
    /// The positions of the query's row.
    Row,
    /// The positions of the query's column.
    Column,
}

impl Axis {
    /// Whether query `i` sees key `j` (either `<= i` when causal) on a grid of rows of `width`.
    fn sees(self, i: usize, j: usize, width: usize) -> bool {
        match self {
            Self::Row => i / width == j / width,
            Self::Column => i % width == j % width,
        }
    }
}

/// Configuration of [`AxialAttention`].
#[derive(Config, Debug)]
pub struct AxialConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads, at least 2: the first `⌈n_heads/2⌉` attend along rows, the others
    /// along columns.
    pub n_heads: usize,
    /// Positions per row of the grid; `None`: each input read as a square grid.
    #[config(default = "None")]
    pub width: Option<usize>,
    /// Dropout on the attention weights (default 0: none).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases on the Q, K, V and output projections.
    #[config(default = false)]
    pub bias: bool,
}

impl VariantConfig for AxialConfig {
    variant_glue!(AxialAttention, &[INFO], new(d_model, n_heads), dropout);

    /// Rows of 4: sequences of 1 to 96 positions are grids with a partial last row.
    fn small(self) -> Self {
        self.with_width(Some(4))
    }

    fn check_input(&self, n_q: usize, n_k: usize, causal: bool) -> Result<(), AttentionError> {
        check_capabilities(&INFO, n_q, n_k, causal)?;
        let width = grid_width(self.width, n_k)?;
        if width > n_k.max(1) {
            return Err(INFO.field_error(
                "width",
                format!("is {width}, a row wider than the {n_k} positions of the sequence"),
            ));
        }
        Ok(())
    }

    fn check_fields(&self) -> Result<(), AttentionError> {
        if self.n_heads < 2 {
            return Err(
                INFO.field_error("n_heads", "must be at least 2 (row heads and column heads)")
            );
        }
        if self.width == Some(0) {
            return Err(INFO.field_error("width", "must be at least 1"));
        }
        Ok(())
    }

    fn build(&self, device: &Device) -> AxialAttention {
        AxialAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            dropout: DropoutConfig::new(self.dropout).init(),
            width: self.width,
        }
    }
}

inherent_config_methods!(AxialConfig);

/// The grid's row width for a sequence of `n`: `width`, or the side of `n` as a square.
fn grid_width(width: Option<usize>, n: usize) -> Result<usize, AttentionError> {
    if let Some(width) = width {
        return Ok(width);
    }
    let side = n.isqrt();
    if side * side == n {
        Ok(side)
    } else {
        Err(INFO.field_error(
            "width",
            format!(
                "is unset, and a sequence of {n} positions is not a square grid (set the \
                 positions per row)"
            ),
        ))
    }
}

/// Multi-head axial attention. Create with [`AxialConfig`].
#[derive(Module, Debug)]
pub struct AxialAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// Positions per row of the grid; `None`: each input read as a square.
    #[module(skip)]
    pub width: Option<usize>,
}

projection_shape!(AxialAttention);

/// Heads `[batch, heads, n, d]` as the rows of their grid, `[batch · rows, heads, width, d]`
/// (`n = rows · width`).
fn to_rows(x: Tensor<4>, width: usize) -> Tensor<4> {
    let [batch, heads, n, d] = x.dims();
    let rows = n / width;
    x.reshape([batch, heads, rows, width, d])
        .swap_dims(1, 2)
        .reshape([batch * rows, heads, width, d])
}

/// The inverse of [`to_rows`] for `batch` sequences.
fn from_rows(x: Tensor<4>, batch: usize) -> Tensor<4> {
    let [batch_rows, heads, width, d] = x.dims();
    let rows = batch_rows / batch;
    x.reshape([batch, rows, heads, width, d])
        .swap_dims(1, 2)
        .reshape([batch, heads, rows * width, d])
}

/// Heads `[batch, heads, n, d]` as the columns of their grid, `[batch · width, heads, rows, d]`.
fn to_columns(x: Tensor<4>, width: usize) -> Tensor<4> {
    let [batch, heads, n, d] = x.dims();
    let rows = n / width;
    x.reshape([batch, heads, rows, width, d])
        .permute([0, 3, 1, 2, 4])
        .reshape([batch * width, heads, rows, d])
}

/// The inverse of [`to_columns`] for `batch` sequences.
fn from_columns(x: Tensor<4>, batch: usize) -> Tensor<4> {
    let [batch_width, heads, rows, d] = x.dims();
    let width = batch_width / batch;
    x.reshape([batch, width, heads, rows, d])
        .permute([0, 2, 3, 1, 4])
        .reshape([batch, heads, rows * width, d])
}

/// The padding `[batch, n]` as the rows' (`[batch · rows, width]`) and columns' (`[batch · width,
/// rows]`) key masks.
fn axis_padding(pad: Tensor<2, Bool>, width: usize) -> (Tensor<2, Bool>, Tensor<2, Bool>) {
    let [batch, n] = pad.dims();
    let rows = n / width;
    let grid = pad.reshape([batch, rows, width]);
    (
        grid.clone().reshape([batch * rows, width]),
        grid.swap_dims(1, 2).reshape([batch * width, rows]),
    )
}

/// `x: [batch, heads, n, d]` followed by zeros up to `to` positions.
fn zero_filled(x: Tensor<4>, to: usize) -> Tensor<4> {
    let n = x.dims()[2];
    zeros_after(x, 2, to - n)
}

impl AxialAttention {
    /// The number of row heads: the first `⌈H/2⌉`.
    fn row_heads(&self, heads: usize) -> usize {
        heads.div_ceil(2)
    }

    /// The heads' axes, in order.
    fn axes(&self, heads: usize) -> impl Iterator<Item = (Axis, std::ops::Range<usize>)> {
        let split = self.row_heads(heads);
        [(Axis::Row, 0..split), (Axis::Column, split..heads)].into_iter()
    }

    /// Attention along the grid's rows and columns, gathered by reshaping (no attention mask).
    fn attend_by_axis(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        masks: &HeadMasks,
        width: usize,
    ) -> Tensor<4> {
        let [batch, heads, n, _] = q.dims();
        let full = n.next_multiple_of(width);
        let device = q.device();
        // The partial last row: zero-filled positions, masked as padding.
        let pad = match (&masks.key_pad, full > n) {
            (Some(pad), _) => Some(flags_framed(pad.clone(), 0, full - n)),
            (None, true) => {
                let row: Vec<bool> = (0..full).map(|j| j >= n).collect();
                Some(flags_tensor(&vec![row; batch], &device))
            }
            (None, false) => None,
        };
        let (row_pad, column_pad) = match pad {
            Some(pad) => {
                let (rows, columns) = axis_padding(pad, width);
                (Some(rows), Some(columns))
            }
            None => (None, None),
        };
        let [q, k, v] = [q, k, v].map(|x| zero_filled(x, full));
        let outputs = self
            .axes(heads)
            .map(|(axis, range)| {
                let part = |x: &Tensor<4>| x.clone().slice(s![.., range.clone()]);
                let (q, k, v) = (part(&q), part(&k), part(&v));
                let dropout = Some(&self.dropout);
                match axis {
                    Axis::Row => from_rows(
                        exact_softmax_attention(
                            to_rows(q, width),
                            to_rows(k, width),
                            to_rows(v, width),
                            row_pad.clone(),
                            masks.causal,
                            dropout,
                        ),
                        batch,
                    ),
                    Axis::Column => from_columns(
                        exact_softmax_attention(
                            to_columns(q, width),
                            to_columns(k, width),
                            to_columns(v, width),
                            column_pad.clone(),
                            masks.causal,
                            dropout,
                        ),
                        batch,
                    ),
                }
            })
            .collect();
        Tensor::cat(outputs, 1).slice(s![.., .., 0..n])
    }

    /// The weights `[batch, heads, n, n]` (0 off each head's axis), from the dense scores with
    /// the axis as an attention mask beside the given masks.
    fn axis_weights(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        masks: &HeadMasks,
        width: usize,
    ) -> Tensor<4> {
        let [batch, heads, n, d] = q.dims();
        let device = q.device();
        let scale = 1.0 / (d as f32).sqrt();
        let weights = self
            .axes(heads)
            .map(|(axis, range)| {
                let off_axis: Vec<bool> = (0..n * n)
                    .map(|ij| !axis.sees(ij / n, ij % n, width))
                    .collect();
                let off_axis =
                    Tensor::<2, Bool>::from_data(TensorData::new(off_axis, [n, n]), &device)
                        .reshape([1, n, n])
                        .expand([batch, n, n]);
                let attn = match &masks.attn {
                    Some(mask) => mask.clone().bool_or(off_axis),
                    None => off_axis,
                };
                let masks = HeadMasks {
                    attn: Some(attn),
                    ..masks.clone()
                };
                let part = |x: &Tensor<4>| x.clone().slice(s![.., range.clone()]);
                softmax_weights(part(&q), part(&k), &masks, scale)
            })
            .collect();
        Tensor::cat(weights, 1)
    }

    /// A decoding step over a cache of every key (`padding` marking the positions of shorter
    /// prompts): each head group scores the cached keys on its axis through the token.
    fn decode_step(
        &self,
        q: Tensor<4>,
        keys: Tensor<4>,
        values: Tensor<4>,
        padding: Option<Tensor<2, Bool>>,
        width: usize,
    ) -> Tensor<4> {
        let [batch, heads, _, _] = q.dims();
        let columns = keys.dims()[2];
        let device = q.device();
        let outputs = self
            .axes(heads)
            .map(|(axis, range)| {
                let part = |x: &Tensor<4>| x.clone().slice(s![.., range.clone()]);
                let (q, keys, values) = (part(&q), part(&keys), part(&values));
                match &padding {
                    None => {
                        // Every sequence at position t: gather the axis's keys.
                        let t = columns - 1;
                        let seen: Vec<i64> = (0..=t)
                            .filter(|&j| axis.sees(t, j, width))
                            .map(|j| j as i64)
                            .collect();
                        let count = seen.len();
                        let index =
                            Tensor::<1, Int>::from_data(TensorData::new(seen, [count]), &device);
                        exact_softmax_attention(
                            q,
                            keys.select(2, index.clone()),
                            values.select(2, index),
                            None,
                            false,
                            None,
                        )
                    }
                    Some(padding) => {
                        // Each sequence's positions read from its padding; off-axis keys masked.
                        let flags = padding_flags(&Some(padding.clone()), batch, columns);
                        let hidden: Vec<Vec<bool>> = cache_positions(&flags)
                            .iter()
                            .map(|row| {
                                let t = row.last().copied().flatten().unwrap_or(0);
                                row.iter()
                                    .map(|j| j.is_none_or(|j| !axis.sees(t, j, width)))
                                    .collect()
                            })
                            .collect();
                        exact_softmax_attention(
                            q,
                            keys,
                            values,
                            Some(flags_tensor(&hidden, &device)),
                            false,
                            None,
                        )
                    }
                }
            })
            .collect();
        Tensor::cat(outputs, 1)
    }

    /// The configured width, or an error: decoding cannot read a grid from an unfinished
    /// sequence.
    fn decoding_width(&self) -> Result<usize, AttentionError> {
        self.width.ok_or_else(|| {
            INFO.field_error(
                "width",
                "must be set to decode (an unfinished sequence does not give its grid)",
            )
        })
    }
}

impl AttentionModule for AxialAttention {
    variant_facts!(INFO);

    forward_through_projections!();

    rotary_on_projections!();

    /// With rotary positions in `masks`, the queries and keys rotated at them first (by their
    /// place in the sequence, whichever axis a head reads).
    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        let (heads, n) = (q.dims()[1], q.dims()[2]);
        check_head_input(&INFO, &q, &k, &masks)?;
        let (q, k) = rotate_queries_keys(q, k, &masks.positions);
        if heads < 2 {
            return Err(
                INFO.field_error("n_heads", "must be at least 2 (row heads and column heads)")
            );
        }
        let width = grid_width(self.width, n)?;
        if masks.attn.is_some() {
            let weights = self.axis_weights(q, k, &masks, width);
            return Ok(dropout(&self.dropout, weights).matmul(v));
        }
        Ok(self.attend_by_axis(q, k, v, &masks, width))
    }

    /// The weights over every key, `[batch, heads, n, n]`, 0 off each head's axis.
    fn try_forward_with_weights(&self, input: AttentionInput) -> WeightsResult {
        input.check_shapes(self.name(), self.d_model())?;
        if self.proj.rotary && input.is_cross() {
            return Err(rotary_cross_attention(INFO.name));
        }
        let masks = self.proj.with_positions(input.head_masks(), input.query());
        let (q, k, v) = self.proj.project(input);
        let n = q.dims()[2];
        check_head_input(&INFO, &q, &k, &masks)?;
        let (q, k) = rotate_queries_keys(q, k, &masks.positions);
        let width = grid_width(self.width, n)?;
        let weights = self.axis_weights(q, k, &masks, width);
        let o = dropout(&self.dropout, weights.clone()).matmul(v);
        Ok((self.proj.out(o), weights))
    }

    /// The causal forward pass over the prompt; the cache holds all its keys and values.
    fn prefill(&self, x: Tensor<3>) -> DecodeResult {
        check_prompt_shapes(self.name(), self.d_model(), &x, None)?;
        self.decoding_width()?;
        self.proj
            .prefill_full_cache(x, None, |q, k, v, masks| self.attend(q, k, v, masks))
    }

    /// Prompts padded at their end: the causal forward pass; the cache holds every key with the
    /// padding marked, each sequence's positions read from it.
    fn prefill_padded(&self, x: Tensor<3>, mask_pad: Tensor<2, Bool>) -> DecodeResult {
        check_prompt_shapes(self.name(), self.d_model(), &x, Some(&mask_pad))?;
        self.decoding_width()?;
        suffix_lengths(INFO.name, &mask_pad)?;
        self.proj
            .prefill_full_cache(x, Some(mask_pad), |q, k, v, masks| {
                self.attend(q, k, v, masks)
            })
    }

    /// Appends the token's key and value to the cache; its row heads score the cached keys of
    /// its row, its column heads those of its column: O((width + t / width) d) at position t
    /// (O(t d) for prompts of different lengths, whose cache is scored whole with the axis as a
    /// mask).
    fn decode(&self, x: Tensor<3>, state: DecodingState) -> DecodeResult {
        check_token(self.name(), self.d_model(), &x)?;
        let width = self.decoding_width()?;
        let (q, k, v) = self.proj.qkv_step(x, &state, INFO.name)?;
        let (keys, values, padding) = state.append_to_padded_cache(INFO.name, k, v)?;
        let o = self.decode_step(q, keys.clone(), values.clone(), padding.clone(), width);
        Ok((
            self.proj.out(o),
            DecodingState::KeyValueCache {
                keys,
                values,
                padding,
            },
        ))
    }
}
