//! Fused softmax attention with its own backward pass on Burn's CubeCL backend (`wgpu` here;
//! the same kernels compile for CUDA, ROCm and Metal), with the padding mask, the causal mask
//! and the counter-based weight dropout of the `flex` kernel.
//!
//! Three kernels, each one thread per row, rows in blocks of [`ROWS_PER_CUBE`] that share tiles
//! of the other side's rows in shared memory:
//! - the forward pass, one thread per query row: an online softmax over key tiles that keeps
//!   the output and the row's log-sum-exp, never the `n × n` weights;
//! - the query gradient, one thread per query row: each weight is recomputed from the
//!   log-sum-exp, and the row's `D = dO · O` is written for the next kernel;
//! - the key and value gradients, one thread per key row, over query tiles.
//!
//! Masked scores are [`MASK_FILL`](crate::contract::input::MASK_FILL) and carry no gradient, as
//! in the composed steps (a row whose keys are all masked is uniform over them). The dropout
//! mask is the one [`DropMask`] defines: each row's two key words are computed on the host (they
//! need 64-bit arithmetic, which WGSL lacks) and sent as four 16-bit halves; the column hash runs
//! in the kernels in 32-bit integer arithmetic.
//!
//! The kernels are exact but plain: scalar loops, no tensor cores, every key tile visited under
//! the causal mask too (skipping them would change the uniform row of a fully masked query).

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::wgpu::{CubeBackend, CubeTensor};
use burn::backend::{Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use cubecl::prelude::*;

use super::cube_extension::{CubeFlashAttention, CubeFlashParams};
use crate::contract::input::MASK_FILL;

/// Rows one cube (workgroup) takes, one per thread.
const ROWS_PER_CUBE: usize = 64;

/// The largest shared tile in 32-bit words (16 KiB: WebGPU's guaranteed workgroup storage).
const SHARED_WORDS: usize = 4096;

/// Rows of the other side per shared tile, for rows `width` words wide: a power of two, at
/// most 64, that fits [`SHARED_WORDS`].
fn tile_rows(width: usize) -> usize {
    let mut rows = 64;
    while rows > 1 && rows * width > SHARED_WORDS {
        rows /= 2;
    }
    rows
}

/// The 32-bit column hash of the dropout mask (see `kernels::hash::column_hash`), in the
/// kernels' arithmetic: wrapping 32-bit products.
#[cube]
fn column_hash(col: u32, key0: u32, key1: u32) -> u32 {
    let mut x = col + key0;
    x ^= x >> 16u32;
    x *= 0x7FEB_352Du32;
    x ^= key1;
    x ^= x >> 15u32;
    x *= 0x846C_A68Bu32;
    x ^ (x >> 16u32)
}

/// Word `word` (0 or 1) of query row `row`'s dropout key, from `keys`, which holds each row's
/// two words as four 16-bit halves; 0 without dropout or for a row past the end.
#[cube]
fn key_word<I: Numeric>(
    keys: &Tensor<I>,
    row: usize,
    word: usize,
    in_range: bool,
    #[comptime] dropout: bool,
) -> u32 {
    let mut out = 0u32;
    if dropout && in_range {
        let base = row * 4 + word * 2;
        out = u32::cast_from(keys[base]) * 65536u32 + u32::cast_from(keys[base + 1]);
    }
    out
}

/// The factor dropout applies to the weight of column `col` in the row whose key words are
/// `key0`, `key1`: 0 dropped, `keep_scale` kept; 1 without dropout.
#[cube]
fn drop_factor<F: Float>(
    key0: u32,
    key1: u32,
    col: usize,
    threshold: u32,
    keep_scale: f32,
    #[comptime] dropout: bool,
) -> F {
    let mut factor = F::new(1.0);
    if dropout {
        if column_hash(col as u32, key0, key1) >= threshold {
            factor = F::cast_from(keep_scale);
        } else {
            factor = F::new(0.0);
        }
    }
    factor
}

/// Whether key `j` is masked for query `i`: padded (`pad` is 1 there) or, with `causal`,
/// after the query.
#[cube]
fn masked<F: Float>(pad_flag: F, i: usize, j: usize, #[comptime] causal: bool) -> bool {
    let mut out = pad_flag > F::new(0.5);
    if causal {
        out = out || j > i;
    }
    out
}

/// Loads the key tile from key `j0` of sequence `bh` (of batch element `batch`) into workgroup
/// memory, the threads taking its rows in turn: keys, values and padding flags. The workgroup
/// waits before (the previous tile may still be read) and after.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_key_tile<F: Float>(
    k: &Tensor<F>,
    v: &Tensor<F>,
    pad: &Tensor<F>,
    k_tile: &mut Shared<[F]>,
    v_tile: &mut Shared<[F]>,
    p_tile: &mut Shared<[F]>,
    bh: usize,
    batch: usize,
    j0: usize,
    #[comptime] head_dim: usize,
    #[comptime] val_dim: usize,
    #[comptime] tile: usize,
) {
    let n_k = k.shape(2);
    sync_cube();
    let mut r = UNIT_POS_X as usize;
    while r < tile {
        let j = j0 + r;
        if j < n_k {
            let key_row = bh * n_k + j;
            for c in 0..head_dim {
                k_tile[r * head_dim + c] = k[key_row * head_dim + c];
            }
            for c in 0..val_dim {
                v_tile[r * val_dim + c] = v[key_row * val_dim + c];
            }
            p_tile[r] = pad[batch * n_k + j];
        }
        r += CUBE_DIM_X as usize;
    }
    sync_cube();
}

/// The forward pass: `out` and `lse` (natural log-sum-exp of each row's scores).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn forward_kernel<F: Float, I: Numeric>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    pad: &Tensor<F>,
    keys: &Tensor<I>,
    out: &mut Tensor<F>,
    lse: &mut Tensor<F>,
    scale: f32,
    threshold: u32,
    keep_scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] val_dim: usize,
    #[comptime] tile: usize,
    #[comptime] causal: bool,
    #[comptime] dropout: bool,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let heads = q.shape(1);
    let n_q = q.shape(2);
    let n_k = k.shape(2);
    let bh = CUBE_POS_Y as usize;
    let batch = bh / heads;
    let i = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    let valid = i < n_q;
    let row = bh * n_q + i;
    let key0 = key_word::<I>(keys, row, 0, valid, dropout);
    let key1 = key_word::<I>(keys, row, 1, valid, dropout);

    let mut q_row = Array::<F>::new(head_dim);
    for c in 0..head_dim {
        q_row[c] = F::new(0.0);
        if valid {
            q_row[c] = q[row * head_dim + c] * F::cast_from(scale);
        }
    }
    let mut acc = Array::<F>::new(val_dim);
    for c in 0..val_dim {
        acc[c] = F::new(0.0);
    }
    let mut scores = Array::<F>::new(tile);
    let mut m = F::new(-1.0e30);
    let mut l = F::new(0.0);

    let mut k_tile = Shared::<[F]>::new_slice(tile * head_dim);
    let mut v_tile = Shared::<[F]>::new_slice(tile * val_dim);
    let mut p_tile = Shared::<[F]>::new_slice(tile);

    let tiles = n_k.div_ceil(tile);
    for t in 0..tiles {
        let j0 = t * tile;
        load_key_tile::<F>(
            k,
            v,
            pad,
            &mut k_tile,
            &mut v_tile,
            &mut p_tile,
            bh,
            batch,
            j0,
            head_dim,
            val_dim,
            tile,
        );
        if valid {
            let mut tile_max = m;
            for r in 0..tile {
                let j = j0 + r;
                let mut s = F::new(MASK_FILL);
                if j < n_k && !masked::<F>(p_tile[r], i, j, causal) {
                    let mut dot = F::new(0.0);
                    for c in 0..head_dim {
                        dot += q_row[c] * k_tile[r * head_dim + c];
                    }
                    s = dot;
                }
                scores[r] = s;
                if j < n_k && s > tile_max {
                    tile_max = s;
                }
            }
            let correction = (m - tile_max).exp();
            l *= correction;
            for c in 0..val_dim {
                acc[c] *= correction;
            }
            m = tile_max;
            for r in 0..tile {
                let j = j0 + r;
                if j < n_k {
                    let p = (scores[r] - m).exp();
                    l += p;
                    let w = p * drop_factor::<F>(key0, key1, j, threshold, keep_scale, dropout);
                    for c in 0..val_dim {
                        acc[c] += w * v_tile[r * val_dim + c];
                    }
                }
            }
        }
    }
    if valid {
        for c in 0..val_dim {
            out[row * val_dim + c] = acc[c] / l;
        }
        lse[row] = m + l.ln();
    }
}

/// The query gradient `dq`, and each query row's `D = dO · O` into `delta` for the key kernel.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn query_grad_kernel<F: Float, I: Numeric>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    out: &Tensor<F>,
    lse: &Tensor<F>,
    d_out: &Tensor<F>,
    pad: &Tensor<F>,
    keys: &Tensor<I>,
    dq: &mut Tensor<F>,
    delta: &mut Tensor<F>,
    scale: f32,
    threshold: u32,
    keep_scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] val_dim: usize,
    #[comptime] tile: usize,
    #[comptime] causal: bool,
    #[comptime] dropout: bool,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let heads = q.shape(1);
    let n_q = q.shape(2);
    let n_k = k.shape(2);
    let bh = CUBE_POS_Y as usize;
    let batch = bh / heads;
    let i = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    let valid = i < n_q;
    let row = bh * n_q + i;
    let key0 = key_word::<I>(keys, row, 0, valid, dropout);
    let key1 = key_word::<I>(keys, row, 1, valid, dropout);
    let scale = F::cast_from(scale);

    let mut q_row = Array::<F>::new(head_dim);
    let mut g_row = Array::<F>::new(val_dim);
    let mut acc = Array::<F>::new(head_dim);
    for c in 0..head_dim {
        q_row[c] = F::new(0.0);
        acc[c] = F::new(0.0);
        if valid {
            q_row[c] = q[row * head_dim + c] * scale;
        }
    }
    let mut row_delta = F::new(0.0);
    let mut row_lse = F::new(0.0);
    for c in 0..val_dim {
        g_row[c] = F::new(0.0);
        if valid {
            g_row[c] = d_out[row * val_dim + c];
            row_delta += g_row[c] * out[row * val_dim + c];
        }
    }
    if valid {
        row_lse = lse[row];
        delta[row] = row_delta;
    }

    let mut k_tile = Shared::<[F]>::new_slice(tile * head_dim);
    let mut v_tile = Shared::<[F]>::new_slice(tile * val_dim);
    let mut p_tile = Shared::<[F]>::new_slice(tile);

    let tiles = n_k.div_ceil(tile);
    for t in 0..tiles {
        let j0 = t * tile;
        load_key_tile::<F>(
            k,
            v,
            pad,
            &mut k_tile,
            &mut v_tile,
            &mut p_tile,
            bh,
            batch,
            j0,
            head_dim,
            val_dim,
            tile,
        );
        if valid {
            for r in 0..tile {
                let j = j0 + r;
                if j < n_k && !masked::<F>(p_tile[r], i, j, causal) {
                    let mut s = F::new(0.0);
                    for c in 0..head_dim {
                        s += q_row[c] * k_tile[r * head_dim + c];
                    }
                    let p = (s - row_lse).exp();
                    let mut dp = F::new(0.0);
                    for c in 0..val_dim {
                        dp += g_row[c] * v_tile[r * val_dim + c];
                    }
                    dp *= drop_factor::<F>(key0, key1, j, threshold, keep_scale, dropout);
                    let ds = p * (dp - row_delta);
                    for c in 0..head_dim {
                        acc[c] += ds * k_tile[r * head_dim + c];
                    }
                }
            }
        }
    }
    if valid {
        for c in 0..head_dim {
            dq[row * head_dim + c] = acc[c] * scale;
        }
    }
}

/// The key and value gradients `dk`, `dv`: one thread per key row, over query tiles.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn key_grad_kernel<F: Float, I: Numeric>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    lse: &Tensor<F>,
    delta: &Tensor<F>,
    d_out: &Tensor<F>,
    pad: &Tensor<F>,
    keys: &Tensor<I>,
    dk: &mut Tensor<F>,
    dv: &mut Tensor<F>,
    scale: f32,
    threshold: u32,
    keep_scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] val_dim: usize,
    #[comptime] tile: usize,
    #[comptime] causal: bool,
    #[comptime] dropout: bool,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let heads = q.shape(1);
    let n_q = q.shape(2);
    let n_k = k.shape(2);
    let bh = CUBE_POS_Y as usize;
    let batch = bh / heads;
    let j = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    let valid = j < n_k;
    let key_row = bh * n_k + j;
    let scale = F::cast_from(scale);

    let mut k_row = Array::<F>::new(head_dim);
    let mut v_row = Array::<F>::new(val_dim);
    let mut dk_acc = Array::<F>::new(head_dim);
    let mut dv_acc = Array::<F>::new(val_dim);
    let mut pad_flag = F::new(0.0);
    for c in 0..head_dim {
        k_row[c] = F::new(0.0);
        dk_acc[c] = F::new(0.0);
        if valid {
            k_row[c] = k[key_row * head_dim + c] * scale;
        }
    }
    for c in 0..val_dim {
        v_row[c] = F::new(0.0);
        dv_acc[c] = F::new(0.0);
        if valid {
            v_row[c] = v[key_row * val_dim + c];
        }
    }
    if valid {
        pad_flag = pad[batch * n_k + j];
    }

    let mut q_tile = Shared::<[F]>::new_slice(tile * head_dim);
    let mut g_tile = Shared::<[F]>::new_slice(tile * val_dim);
    let mut lse_tile = Shared::<[F]>::new_slice(tile);
    let mut delta_tile = Shared::<[F]>::new_slice(tile);

    let tiles = n_q.div_ceil(tile);
    for t in 0..tiles {
        let i0 = t * tile;
        sync_cube();
        let mut r = UNIT_POS_X as usize;
        while r < tile {
            let i = i0 + r;
            if i < n_q {
                let row = bh * n_q + i;
                for c in 0..head_dim {
                    q_tile[r * head_dim + c] = q[row * head_dim + c];
                }
                for c in 0..val_dim {
                    g_tile[r * val_dim + c] = d_out[row * val_dim + c];
                }
                lse_tile[r] = lse[row];
                delta_tile[r] = delta[row];
            }
            r += CUBE_DIM_X as usize;
        }
        sync_cube();
        if valid {
            for r in 0..tile {
                let i = i0 + r;
                if i < n_q {
                    let is_masked = masked::<F>(pad_flag, i, j, causal);
                    let mut s = F::new(MASK_FILL);
                    if !is_masked {
                        let mut dot = F::new(0.0);
                        for c in 0..head_dim {
                            dot += q_tile[r * head_dim + c] * k_row[c];
                        }
                        s = dot;
                    }
                    let p = (s - lse_tile[r]).exp();
                    let row = bh * n_q + i;
                    let factor = drop_factor::<F>(
                        key_word::<I>(keys, row, 0, true, dropout),
                        key_word::<I>(keys, row, 1, true, dropout),
                        j,
                        threshold,
                        keep_scale,
                        dropout,
                    );
                    let w = p * factor;
                    let mut dp = F::new(0.0);
                    for c in 0..val_dim {
                        let g = g_tile[r * val_dim + c];
                        dv_acc[c] += w * g;
                        dp += g * v_row[c];
                    }
                    if !is_masked {
                        let ds = p * (dp * factor - delta_tile[r]);
                        for c in 0..head_dim {
                            dk_acc[c] += ds * q_tile[r * head_dim + c];
                        }
                    }
                }
            }
        }
    }
    if valid {
        for c in 0..head_dim {
            dk[key_row * head_dim + c] = dk_acc[c] * scale;
        }
        for c in 0..val_dim {
            dv[key_row * val_dim + c] = dv_acc[c];
        }
    }
}

/// The launch geometry shared by the three kernels: cubes of [`ROWS_PER_CUBE`] threads, as
/// many along x as `rows` needs, one per (batch, head) along y.
fn geometry(rows: usize, batch_heads: usize) -> (CubeCount, CubeDim) {
    let blocks = rows.div_ceil(ROWS_PER_CUBE).max(1);
    (
        CubeCount::Static(blocks as u32, batch_heads as u32, 1),
        CubeDim::new_1d(ROWS_PER_CUBE as u32),
    )
}

/// Shapes of a call: `[batch, heads, n_q, d]`, `n_k` and `d_v`.
struct Dims {
    q: [usize; 4],
    n_k: usize,
    d_v: usize,
}

impl Dims {
    fn of(q: &CubeTensor, v: &CubeTensor) -> Self {
        let q = q.shape().dims::<4>();
        let v = v.shape().dims::<4>();
        Self {
            q,
            n_k: v[2],
            d_v: v[3],
        }
    }

    fn batch_heads(&self) -> usize {
        self.q[0] * self.q[1]
    }

    fn shape(&self, rows: usize, width: usize) -> Shape {
        Shape::new([self.q[0], self.q[1], rows, width])
    }
}

fn empty_like(like: &CubeTensor, shape: Shape) -> CubeTensor {
    empty_device_dtype(like.client.clone(), like.device.clone(), shape, like.dtype)
}

impl CubeFlashAttention for CubeBackend {
    fn cube_flash_forward(
        q: CubeTensor,
        k: CubeTensor,
        v: CubeTensor,
        key_padding: CubeTensor,
        row_keys: CubeTensor,
        params: CubeFlashParams,
    ) -> (CubeTensor, CubeTensor) {
        let [q, k, v, key_padding, row_keys] =
            [q, k, v, key_padding, row_keys].map(into_contiguous);
        let dims = Dims::of(&q, &v);
        let out = empty_like(&q, dims.shape(dims.q[2], dims.d_v));
        let lse = empty_like(&q, dims.shape(dims.q[2], 1));
        let (count, cube_dim) = geometry(dims.q[2], dims.batch_heads());
        let dtypes = [
            dtype_to_storage_type(q.dtype),
            dtype_to_storage_type(row_keys.dtype),
        ];
        let tile = tile_rows(dims.q[3] + dims.d_v + 1);
        forward_kernel::launch(
            &q.client.clone(),
            count,
            cube_dim,
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            key_padding.into_tensor_arg(),
            row_keys.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            params.scale,
            params.threshold,
            params.keep_scale,
            dims.q[3],
            dims.d_v,
            tile,
            params.causal,
            params.dropout,
            dtypes,
        );
        (out, lse)
    }

    fn cube_flash_backward(
        q: CubeTensor,
        k: CubeTensor,
        v: CubeTensor,
        out: CubeTensor,
        lse: CubeTensor,
        d_out: CubeTensor,
        key_padding: CubeTensor,
        row_keys: CubeTensor,
        params: CubeFlashParams,
    ) -> (CubeTensor, CubeTensor, CubeTensor) {
        let [q, k, v, out, lse, d_out, key_padding, row_keys] =
            [q, k, v, out, lse, d_out, key_padding, row_keys].map(into_contiguous);
        let dims = Dims::of(&q, &v);
        let head_dim = dims.q[3];
        let dq = empty_like(&q, q.shape());
        let dk = empty_like(&k, k.shape());
        let dv = empty_like(&v, v.shape());
        let delta = empty_like(&q, dims.shape(dims.q[2], 1));
        let dtypes = [
            dtype_to_storage_type(q.dtype),
            dtype_to_storage_type(row_keys.dtype),
        ];
        let client = q.client.clone();

        let (count, cube_dim) = geometry(dims.q[2], dims.batch_heads());
        query_grad_kernel::launch(
            &client,
            count,
            cube_dim,
            q.clone().into_tensor_arg(),
            k.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            out.into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            d_out.clone().into_tensor_arg(),
            key_padding.clone().into_tensor_arg(),
            row_keys.clone().into_tensor_arg(),
            dq.clone().into_tensor_arg(),
            delta.clone().into_tensor_arg(),
            params.scale,
            params.threshold,
            params.keep_scale,
            head_dim,
            dims.d_v,
            tile_rows(head_dim + dims.d_v + 1),
            params.causal,
            params.dropout,
            dtypes,
        );

        let (count, cube_dim) = geometry(dims.n_k, dims.batch_heads());
        key_grad_kernel::launch(
            &client,
            count,
            cube_dim,
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            lse.into_tensor_arg(),
            delta.into_tensor_arg(),
            d_out.into_tensor_arg(),
            key_padding.into_tensor_arg(),
            row_keys.into_tensor_arg(),
            dk.clone().into_tensor_arg(),
            dv.clone().into_tensor_arg(),
            params.scale,
            params.threshold,
            params.keep_scale,
            head_dim,
            dims.d_v,
            tile_rows(head_dim + dims.d_v + 2),
            params.causal,
            params.dropout,
            dtypes,
        );
        (dq, dk, dv)
    }
}
