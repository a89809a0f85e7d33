//! The decaying core's recurrence on Burn's CubeCL backend (`wgpu`), forward and backward:
//! `S_t = Diag(α_t) S_{t−1} + k_t v_tᵀ`, `α_t = exp(g_t)` (one decay a position or one per key
//! channel), `o_t = S_tᵀ q_t`, from a zero state, in either direction, optionally with the final
//! state after the outputs (the layout of the `flex` kernel, `kernels/recurrence.rs`).
//!
//! Each kernel is one scan over the positions in which every thread owns a row or a column of
//! the state (or of its gradient) and needs nothing from the others, so no thread waits:
//! - forward, a thread per value column `c`: `S[:, c]`, and `o_t[c] = Σ_i q_t[i] S[i, c]`;
//! - `dq`, a thread per key row `i`, the same scan: `dq_t[i] = Σ_c S_t[i, c] do_t[c]`;
//! - `dk`, a thread per key row, from the other end: `dS += q_t do_tᵀ`, `dk_t = dS v_t`, then
//!   `dS ← Diag(α_t) dS`;
//! - `dv`, a thread per value column, the same reverse scan: `dv_t = dSᵀ k_t`;
//! - the log-decays' gradient, a thread per decay channel: with `b_t = Σ_{u ≤ t} g_u`, each
//!   weight `exp(b_s − b_r)` makes `∂L/∂b_t = q_t ∘ dq_t − k_t ∘ dk_t` (plus the final state's
//!   `Σ_c dS_fin ∘ S_fin` at the last position), and `dg_t` sums that over the positions from
//!   `t` on (over the channels too with one decay a position). The states never need to be
//!   walked backwards or kept.
//!
//! Plain scalar loops: a scan a sequence per workgroup column, not the chunked form that wants
//! a GPU's matrix units; its speed on a GPU is not measured.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::wgpu::{CubeBackend, CubeTensor};
use burn::backend::{Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use cubecl::prelude::*;

use super::RecurrenceForm;
use super::cube_extension::{CubeDeltaRule, CubeRecurrence, DELTA_CHECKPOINT};

/// Threads a workgroup: lanes (rows or columns of the state) of one sequence.
const LANES: u32 = 32;

/// The position of step `s` of `n`: from the first, or from the last with `reverse`.
#[cube]
fn position(s: usize, n: usize, #[comptime] reverse: bool) -> usize {
    let mut t = s;
    if reverse {
        t = n - 1 - s;
    }
    t
}

/// `α_t` at row `row` (sequence × position) when one decay serves every key channel, `exp(g)`;
/// 1 with one decay per channel (see [`channel_decay`]). Read once a step, not once a channel.
#[cube]
fn position_decay<F: Float>(g: &Tensor<F>, row: usize, #[comptime] per_channel: bool) -> F {
    let mut a = F::new(1.0);
    if !per_channel {
        a = g[row].exp();
    }
    a
}

/// `α_t` of key channel `i` at row `row`: `exp(g)` of the channel with one decay per channel,
/// else the step's `position` decay.
#[cube]
fn channel_decay<F: Float>(
    g: &Tensor<F>,
    row: usize,
    i: usize,
    position: F,
    #[comptime] d_k: usize,
    #[comptime] per_channel: bool,
) -> F {
    let mut a = position;
    if per_channel {
        a = g[row * d_k + i].exp();
    }
    a
}

/// The forward scan, a thread per value column: the outputs, then the final state.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn forward_kernel<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    g: &Tensor<F>,
    joint: &mut Tensor<F>,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] per_channel: bool,
    #[comptime] reverse: bool,
    #[comptime] with_state: bool,
    #[define(F)] _dtype: ElemType,
) {
    let n = q.shape(2);
    let m = CUBE_POS_Y as usize;
    let c = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    if c >= d_v {
        terminate!();
    }
    let rows = joint.shape(2);
    let mut state = Array::<F>::new(d_k);
    for i in 0..d_k {
        state[i] = F::new(0.0);
    }
    for s in 0..n {
        let t = position(s, n, reverse);
        let row = m * n + t;
        let value = v[row * d_v + c];
        let step_decay = position_decay::<F>(g, row, per_channel);
        let mut out = F::new(0.0);
        for i in 0..d_k {
            let a = channel_decay::<F>(g, row, i, step_decay, d_k, per_channel);
            state[i] = a * state[i] + k[row * d_k + i] * value;
            out += q[row * d_k + i] * state[i];
        }
        joint[(m * rows + t) * d_v + c] = out;
    }
    if with_state {
        for i in 0..d_k {
            joint[(m * rows + n + i) * d_v + c] = state[i];
        }
    }
}

/// `dq`, a thread per key row: the forward scan of the state's rows.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn query_grad_kernel<F: Float>(
    k: &Tensor<F>,
    v: &Tensor<F>,
    g: &Tensor<F>,
    d_joint: &Tensor<F>,
    dq: &mut Tensor<F>,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] per_channel: bool,
    #[comptime] reverse: bool,
    #[define(F)] _dtype: ElemType,
) {
    let n = k.shape(2);
    let m = CUBE_POS_Y as usize;
    let i = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    if i >= d_k {
        terminate!();
    }
    let rows = d_joint.shape(2);
    let mut state = Array::<F>::new(d_v);
    for c in 0..d_v {
        state[c] = F::new(0.0);
    }
    for s in 0..n {
        let t = position(s, n, reverse);
        let row = m * n + t;
        let a = channel_decay::<F>(
            g,
            row,
            i,
            position_decay::<F>(g, row, per_channel),
            d_k,
            per_channel,
        );
        let key = k[row * d_k + i];
        let mut grad = F::new(0.0);
        for c in 0..d_v {
            state[c] = a * state[c] + key * v[row * d_v + c];
            grad += state[c] * d_joint[(m * rows + t) * d_v + c];
        }
        dq[row * d_k + i] = grad;
    }
}

/// `dk`, a thread per key row: the reverse scan of the state gradient's rows.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn key_grad_kernel<F: Float>(
    q: &Tensor<F>,
    v: &Tensor<F>,
    g: &Tensor<F>,
    d_joint: &Tensor<F>,
    dk: &mut Tensor<F>,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] per_channel: bool,
    #[comptime] reverse: bool,
    #[comptime] with_state: bool,
    #[define(F)] _dtype: ElemType,
) {
    let n = q.shape(2);
    let m = CUBE_POS_Y as usize;
    let i = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    if i >= d_k {
        terminate!();
    }
    let rows = d_joint.shape(2);
    let mut grad_state = Array::<F>::new(d_v);
    for c in 0..d_v {
        grad_state[c] = F::new(0.0);
        if with_state {
            grad_state[c] = d_joint[(m * rows + n + i) * d_v + c];
        }
    }
    for s in 0..n {
        let t = position(n - 1 - s, n, reverse);
        let row = m * n + t;
        let query = q[row * d_k + i];
        let mut grad = F::new(0.0);
        for c in 0..d_v {
            grad_state[c] += query * d_joint[(m * rows + t) * d_v + c];
            grad += grad_state[c] * v[row * d_v + c];
        }
        dk[row * d_k + i] = grad;
        let a = channel_decay::<F>(
            g,
            row,
            i,
            position_decay::<F>(g, row, per_channel),
            d_k,
            per_channel,
        );
        for c in 0..d_v {
            grad_state[c] *= a;
        }
    }
}

/// `dv`, a thread per value column: the reverse scan of the state gradient's columns.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn value_grad_kernel<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    g: &Tensor<F>,
    d_joint: &Tensor<F>,
    dv: &mut Tensor<F>,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] per_channel: bool,
    #[comptime] reverse: bool,
    #[comptime] with_state: bool,
    #[define(F)] _dtype: ElemType,
) {
    let n = q.shape(2);
    let m = CUBE_POS_Y as usize;
    let c = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    if c >= d_v {
        terminate!();
    }
    let rows = d_joint.shape(2);
    let mut grad_state = Array::<F>::new(d_k);
    for i in 0..d_k {
        grad_state[i] = F::new(0.0);
        if with_state {
            grad_state[i] = d_joint[(m * rows + n + i) * d_v + c];
        }
    }
    for s in 0..n {
        let t = position(n - 1 - s, n, reverse);
        let row = m * n + t;
        let grad_out = d_joint[(m * rows + t) * d_v + c];
        let step_decay = position_decay::<F>(g, row, per_channel);
        let mut grad = F::new(0.0);
        for i in 0..d_k {
            grad_state[i] += q[row * d_k + i] * grad_out;
            grad += grad_state[i] * k[row * d_k + i];
            grad_state[i] *= channel_decay::<F>(g, row, i, step_decay, d_k, per_channel);
        }
        dv[row * d_v + c] = grad;
    }
}

/// The log-decays' gradient, a thread per decay channel (one with a decay a position): the sum
/// of `q ∘ dq − k ∘ dk` from each position to the end of the scan.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn decay_grad_kernel<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    dq: &Tensor<F>,
    dk: &Tensor<F>,
    joint: &Tensor<F>,
    d_joint: &Tensor<F>,
    dg: &mut Tensor<F>,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] per_channel: bool,
    #[comptime] reverse: bool,
    #[comptime] with_state: bool,
    #[define(F)] _dtype: ElemType,
) {
    let n = q.shape(2);
    let m = CUBE_POS_Y as usize;
    let lane = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    let channels = comptime!(if per_channel { d_k } else { 1usize });
    let count = comptime!(if per_channel { 1usize } else { d_k });
    if lane >= channels {
        terminate!();
    }
    let mut first = 0usize;
    if per_channel {
        first = lane;
    }
    let rows = joint.shape(2);
    // The final state's term enters at the scan's last position.
    let mut acc = F::new(0.0);
    if with_state {
        for i in first..first + count {
            for c in 0..d_v {
                let at = (m * rows + n + i) * d_v + c;
                acc += d_joint[at] * joint[at];
            }
        }
    }
    for s in 0..n {
        let t = position(n - 1 - s, n, reverse);
        let row = m * n + t;
        for i in first..first + count {
            let at = row * d_k + i;
            acc += q[at] * dq[at] - k[at] * dk[at];
        }
        dg[row * channels + lane] = acc;
    }
}

/// Sizes of one call, from `q` `[batch, heads, n, d_k]`, `v` and `g`.
struct Dims {
    batch: usize,
    heads: usize,
    n: usize,
    d_k: usize,
    d_v: usize,
    per_channel: bool,
}

impl Dims {
    fn of(q: &CubeTensor, v: &CubeTensor, g: &CubeTensor) -> Self {
        let [batch, heads, n, d_k] = q.shape().dims::<4>();
        Self {
            batch,
            heads,
            n,
            d_k,
            d_v: v.shape().dims::<4>()[3],
            per_channel: g.shape().dims::<4>()[3] != 1,
        }
    }

    /// Workgroups for `lanes` threads a sequence.
    fn grid(&self, lanes: usize) -> (CubeCount, CubeDim) {
        (
            CubeCount::Static(
                lanes.div_ceil(LANES as usize).max(1) as u32,
                (self.batch * self.heads) as u32,
                1,
            ),
            CubeDim::new_1d(LANES),
        )
    }
}

fn empty_like(like: &CubeTensor, shape: Shape) -> CubeTensor {
    empty_device_dtype(like.client.clone(), like.device.clone(), shape, like.dtype)
}

impl CubeRecurrence for CubeBackend {
    fn cube_decayed_forward(
        q: CubeTensor,
        k: CubeTensor,
        v: CubeTensor,
        log_decay: CubeTensor,
        form: RecurrenceForm,
    ) -> CubeTensor {
        let [q, k, v, g] = [q, k, v, log_decay].map(into_contiguous);
        let dims = Dims::of(&q, &v, &g);
        let rows = dims.n + if form.with_state { dims.d_k } else { 0 };
        let joint = empty_like(&q, Shape::new([dims.batch, dims.heads, rows, dims.d_v]));
        let (count, cube_dim) = dims.grid(dims.d_v);
        forward_kernel::launch(
            &q.client.clone(),
            count,
            cube_dim,
            q.clone().into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            g.into_tensor_arg(),
            joint.clone().into_tensor_arg(),
            dims.d_k,
            dims.d_v,
            dims.per_channel,
            form.reverse,
            form.with_state,
            dtype_to_storage_type(q.dtype),
        );
        joint
    }

    fn cube_decayed_backward(
        q: CubeTensor,
        k: CubeTensor,
        v: CubeTensor,
        log_decay: CubeTensor,
        joint: CubeTensor,
        d_joint: CubeTensor,
        form: RecurrenceForm,
    ) -> (CubeTensor, CubeTensor, CubeTensor, CubeTensor) {
        let [q, k, v, g, joint, d_joint] =
            [q, k, v, log_decay, joint, d_joint].map(into_contiguous);
        let dims = Dims::of(&q, &v, &g);
        let (dq, dk, dv, dg) = (
            empty_like(&q, q.shape()),
            empty_like(&k, k.shape()),
            empty_like(&v, v.shape()),
            empty_like(&g, g.shape()),
        );
        let client = q.client.clone();
        let dtype = dtype_to_storage_type(q.dtype);
        let (count, cube_dim) = dims.grid(dims.d_k);
        query_grad_kernel::launch(
            &client,
            count,
            cube_dim,
            k.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            g.clone().into_tensor_arg(),
            d_joint.clone().into_tensor_arg(),
            dq.clone().into_tensor_arg(),
            dims.d_k,
            dims.d_v,
            dims.per_channel,
            form.reverse,
            dtype,
        );
        let (count, cube_dim) = dims.grid(dims.d_k);
        key_grad_kernel::launch(
            &client,
            count,
            cube_dim,
            q.clone().into_tensor_arg(),
            v.into_tensor_arg(),
            g.clone().into_tensor_arg(),
            d_joint.clone().into_tensor_arg(),
            dk.clone().into_tensor_arg(),
            dims.d_k,
            dims.d_v,
            dims.per_channel,
            form.reverse,
            form.with_state,
            dtype,
        );
        let (count, cube_dim) = dims.grid(dims.d_v);
        value_grad_kernel::launch(
            &client,
            count,
            cube_dim,
            q.clone().into_tensor_arg(),
            k.clone().into_tensor_arg(),
            g.into_tensor_arg(),
            d_joint.clone().into_tensor_arg(),
            dv.clone().into_tensor_arg(),
            dims.d_k,
            dims.d_v,
            dims.per_channel,
            form.reverse,
            form.with_state,
            dtype,
        );
        let channels = if dims.per_channel { dims.d_k } else { 1 };
        let (count, cube_dim) = dims.grid(channels);
        decay_grad_kernel::launch(
            &client,
            count,
            cube_dim,
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            dq.clone().into_tensor_arg(),
            dk.clone().into_tensor_arg(),
            joint.into_tensor_arg(),
            d_joint.into_tensor_arg(),
            dg.clone().into_tensor_arg(),
            dims.d_k,
            dims.d_v,
            dims.per_channel,
            form.reverse,
            form.with_state,
            dtype,
        );
        (dq, dk, dv, dg)
    }
}

/// One step of the delta rule on column `c` of the state: `S ← α S + k (β (v − α Sᵀ k))ᵀ`.
/// Returns `r = v − α Sᵀ k` at this column (`state` holds `S_{t−1}` on entry, `S_t` on exit).
#[cube]
#[allow(clippy::too_many_arguments)]
fn delta_step<F: Float>(
    state: &mut Array<F>,
    k: &Tensor<F>,
    value: F,
    beta: F,
    alpha: F,
    key_at: usize,
    #[comptime] d_k: usize,
) -> F {
    let mut predicted = F::new(0.0);
    for i in 0..d_k {
        state[i] = alpha * state[i];
        predicted += state[i] * k[key_at + i];
    }
    let r = value - predicted;
    let u = beta * r;
    for i in 0..d_k {
        state[i] += k[key_at + i] * u;
    }
    r
}

/// The delta rule's forward scan, a thread per value column: the outputs, the final state, and
/// the state before every [`DELTA_CHECKPOINT`]-th step for the backward.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn delta_forward_kernel<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    beta: &Tensor<F>,
    g: &Tensor<F>,
    joint: &mut Tensor<F>,
    checkpoints: &mut Tensor<F>,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] reverse: bool,
    #[comptime] with_state: bool,
    #[define(F)] _dtype: ElemType,
) {
    let n = q.shape(2);
    let m = CUBE_POS_Y as usize;
    let c = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    if c >= d_v {
        terminate!();
    }
    let rows = joint.shape(2);
    let stretches = checkpoints.shape(1);
    let mut state = Array::<F>::new(d_k);
    for i in 0..d_k {
        state[i] = F::new(0.0);
    }
    for s in 0..n {
        if s % DELTA_CHECKPOINT == 0 {
            let base = (m * stretches + s / DELTA_CHECKPOINT) * d_k;
            for i in 0..d_k {
                checkpoints[(base + i) * d_v + c] = state[i];
            }
        }
        let t = position(s, n, reverse);
        let row = m * n + t;
        let alpha = g[row].exp();
        let _r = delta_step::<F>(
            &mut state,
            k,
            v[row * d_v + c],
            beta[row],
            alpha,
            row * d_k,
            d_k,
        );
        let mut out = F::new(0.0);
        for i in 0..d_k {
            out += q[row * d_k + i] * state[i];
        }
        joint[(m * rows + t) * d_v + c] = out;
    }
    if with_state {
        for i in 0..d_k {
            joint[(m * rows + n + i) * d_v + c] = state[i];
        }
    }
}

/// Sums `partial` (`lanes × d_v`, row `i` the threads' contributions to entry `i`) over the
/// threads into `out[at + i]`, one row a thread at a time; the workgroup waits before
/// and after.
#[cube]
#[allow(clippy::too_many_arguments)]
fn reduce_rows<F: Float>(
    partial: &Shared<[F]>,
    out: &mut Tensor<F>,
    at: usize,
    c: usize,
    #[comptime] lanes: usize,
    #[comptime] d_v: usize,
) {
    sync_cube();
    let mut i = c;
    while i < lanes {
        let mut sum = F::new(0.0);
        for j in 0..d_v {
            sum += partial[i * d_v + j];
        }
        out[at + i] = sum;
        i += d_v;
    }
    sync_cube();
}

/// The delta rule's backward, a workgroup a sequence, a thread per value column: each stretch
/// between checkpoints is re-run forward into `scratch` (the states before each step), then
/// walked backwards; the sums over columns (`dq`, `dk`, `dβ`, `dg`) go through shared memory.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn delta_backward_kernel<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    beta: &Tensor<F>,
    g: &Tensor<F>,
    checkpoints: &Tensor<F>,
    d_joint: &Tensor<F>,
    scratch: &mut Tensor<F>,
    dq: &mut Tensor<F>,
    dk: &mut Tensor<F>,
    dv: &mut Tensor<F>,
    d_beta: &mut Tensor<F>,
    dg: &mut Tensor<F>,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] reverse: bool,
    #[comptime] with_state: bool,
    #[define(F)] _dtype: ElemType,
) {
    let n = q.shape(2);
    let m = CUBE_POS_Y as usize;
    let c = UNIT_POS_X as usize;
    let rows = d_joint.shape(2);
    let stretches = checkpoints.shape(1);
    let mut partial = Shared::<[F]>::new_slice(d_k * d_v + 2 * d_v);
    let mut grad_state = Array::<F>::new(d_k);
    let mut before = Array::<F>::new(d_k);
    let mut after = Array::<F>::new(d_k);
    for i in 0..d_k {
        grad_state[i] = F::new(0.0);
        if with_state {
            grad_state[i] = d_joint[(m * rows + n + i) * d_v + c];
        }
    }
    for back in 0..stretches {
        let stretch = stretches - 1 - back;
        let first = stretch * DELTA_CHECKPOINT;
        let mut last = first + DELTA_CHECKPOINT;
        if last > n {
            last = n;
        }
        // Re-run the stretch: the state before each of its steps into the scratch.
        let base = (m * stretches + stretch) * d_k;
        for i in 0..d_k {
            before[i] = checkpoints[(base + i) * d_v + c];
        }
        for s in first..last {
            let at = ((m * DELTA_CHECKPOINT + s - first) * d_k) * d_v + c;
            for i in 0..d_k {
                scratch[at + i * d_v] = before[i];
            }
            let row = m * n + position(s, n, reverse);
            let _r = delta_step::<F>(
                &mut before,
                k,
                v[row * d_v + c],
                beta[row],
                g[row].exp(),
                row * d_k,
                d_k,
            );
        }
        // Walk it backwards.
        for back_step in 0..last - first {
            let s = last - 1 - back_step;
            let t = position(s, n, reverse);
            let row = m * n + t;
            let at = ((m * DELTA_CHECKPOINT + s - first) * d_k) * d_v + c;
            for i in 0..d_k {
                before[i] = scratch[at + i * d_v];
                after[i] = before[i];
            }
            let alpha = g[row].exp();
            let b = beta[row];
            let r = delta_step::<F>(&mut after, k, v[row * d_v + c], b, alpha, row * d_k, d_k);
            let u = b * r;
            let grad_out = d_joint[(m * rows + t) * d_v + c];
            // dq_t = S_t do_t.
            for i in 0..d_k {
                partial[i * d_v + c] = after[i] * grad_out;
            }
            reduce_rows::<F>(&partial, dq, row * d_k, c, d_k, d_v);
            // dS += q_t do_tᵀ; du = dSᵀ k_t; dr = dv = β du.
            let mut du = F::new(0.0);
            for i in 0..d_k {
                grad_state[i] += q[row * d_k + i] * grad_out;
                du += grad_state[i] * k[row * d_k + i];
            }
            let dr = b * du;
            dv[row * d_v + c] = dr;
            // dk_t = dS u − α S_{t−1} dr; dβ = du · r.
            for i in 0..d_k {
                partial[i * d_v + c] = grad_state[i] * u - alpha * before[i] * dr;
            }
            reduce_rows::<F>(&partial, dk, row * d_k, c, d_k, d_v);
            // dS' = dS − k dr ᵀ; dg = α ⟨dS', S_{t−1}⟩; dS_{t−1} = α dS'.
            let mut dot = F::new(0.0);
            for i in 0..d_k {
                grad_state[i] -= k[row * d_k + i] * dr;
                dot += grad_state[i] * before[i];
                grad_state[i] *= alpha;
            }
            partial[c] = du * r;
            partial[d_v + c] = alpha * dot;
            sync_cube();
            if c == 0 {
                let mut sum_beta = F::new(0.0);
                let mut sum_g = F::new(0.0);
                for j in 0..d_v {
                    sum_beta += partial[j];
                    sum_g += partial[d_v + j];
                }
                d_beta[row] = sum_beta;
                dg[row] = sum_g;
            }
            sync_cube();
        }
    }
}

impl CubeDeltaRule for CubeBackend {
    fn cube_delta_forward(
        q: CubeTensor,
        k: CubeTensor,
        v: CubeTensor,
        beta: CubeTensor,
        log_decay: CubeTensor,
        form: RecurrenceForm,
    ) -> (CubeTensor, CubeTensor) {
        let [q, k, v, beta, g] = [q, k, v, beta, log_decay].map(into_contiguous);
        let dims = Dims::of(&q, &v, &g);
        let rows = dims.n + if form.with_state { dims.d_k } else { 0 };
        let joint = empty_like(&q, Shape::new([dims.batch, dims.heads, rows, dims.d_v]));
        let stretches = dims.n.div_ceil(DELTA_CHECKPOINT);
        let checkpoints = empty_like(
            &q,
            Shape::new([dims.batch * dims.heads, stretches, dims.d_k, dims.d_v]),
        );
        let (count, cube_dim) = dims.grid(dims.d_v);
        delta_forward_kernel::launch(
            &q.client.clone(),
            count,
            cube_dim,
            q.clone().into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            beta.into_tensor_arg(),
            g.into_tensor_arg(),
            joint.clone().into_tensor_arg(),
            checkpoints.clone().into_tensor_arg(),
            dims.d_k,
            dims.d_v,
            form.reverse,
            form.with_state,
            dtype_to_storage_type(q.dtype),
        );
        (joint, checkpoints)
    }

    fn cube_delta_backward(
        q: CubeTensor,
        k: CubeTensor,
        v: CubeTensor,
        beta: CubeTensor,
        log_decay: CubeTensor,
        checkpoints: CubeTensor,
        d_joint: CubeTensor,
        form: RecurrenceForm,
    ) -> (CubeTensor, CubeTensor, CubeTensor, CubeTensor, CubeTensor) {
        let [q, k, v, beta, g, checkpoints, d_joint] =
            [q, k, v, beta, log_decay, checkpoints, d_joint].map(into_contiguous);
        let dims = Dims::of(&q, &v, &g);
        let sequences = dims.batch * dims.heads;
        let scratch = empty_like(
            &q,
            Shape::new([sequences, DELTA_CHECKPOINT, dims.d_k, dims.d_v]),
        );
        let (dq, dk, dv, d_beta, dg) = (
            empty_like(&q, q.shape()),
            empty_like(&k, k.shape()),
            empty_like(&v, v.shape()),
            empty_like(&beta, beta.shape()),
            empty_like(&g, g.shape()),
        );
        delta_backward_kernel::launch(
            &q.client.clone(),
            CubeCount::Static(1, sequences as u32, 1),
            CubeDim::new_1d(dims.d_v as u32),
            q.clone().into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            beta.into_tensor_arg(),
            g.into_tensor_arg(),
            checkpoints.into_tensor_arg(),
            d_joint.into_tensor_arg(),
            scratch.into_tensor_arg(),
            dq.clone().into_tensor_arg(),
            dk.clone().into_tensor_arg(),
            dv.clone().into_tensor_arg(),
            d_beta.clone().into_tensor_arg(),
            dg.clone().into_tensor_arg(),
            dims.d_k,
            dims.d_v,
            form.reverse,
            form.with_state,
            dtype_to_storage_type(q.dtype),
        );
        (dq, dk, dv, d_beta, dg)
    }
}
