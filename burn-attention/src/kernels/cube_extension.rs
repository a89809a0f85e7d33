//! The backend extension behind fused softmax attention on Burn's CubeCL backend (`wgpu`, and
//! with `wgpu-fused` the same kernels as opaque operations of Burn's fusion), and the entry
//! point [`try_attention`] calls for CubeCL devices. The kernels are in `cube`, their
//! autodiff form in `cube_autodiff`.

use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Backend, backend_extension};
use burn::prelude::*;

use super::{DropMask, RecurrenceForm};

/// What a call fixes besides its tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CubeFlashParams {
    /// The factor of the scores, `1 / √d` for softmax attention.
    pub scale: f32,
    /// Keys after each query are masked.
    pub causal: bool,
    /// Weight dropout is applied (with `threshold` and `keep_scale`, from the row keys).
    pub dropout: bool,
    /// A weight is kept when its column hash is at least this.
    pub threshold: u32,
    /// The factor of kept weights, `1 / (1 − p)`.
    pub keep_scale: f32,
}

/// The backend extension: fused softmax attention whose autodiff form has the kernels' own
/// backward. Tensors are `[batch, heads, n, d]`; `key_padding` is `[batch, n_k]` (1 = padding);
/// `row_keys` holds each query row's dropout key as four 16-bit halves (`[rows, 4]`, read only
/// with dropout).
#[backend_extension(
    Cube: cfg(feature = "wgpu"),
    Fusion: cfg(feature = "wgpu-fused"),
    Autodiff: cfg(feature = "train")
)]
pub trait CubeFlashAttention: Backend {
    /// The output and each row's log-sum-exp of its scaled, masked scores (`[.., n_q, 1]`).
    #[fusion(meta = forward_specs)]
    fn cube_flash_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        key_padding: FloatTensor<Self>,
        row_keys: IntTensor<Self>,
        params: CubeFlashParams,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// The gradients of `q`, `k` and `v` from the output's gradient `d_out`, the output and the
    /// log-sum-exp of the forward pass.
    #[allow(clippy::too_many_arguments)]
    #[fusion(meta = backward_specs)]
    fn cube_flash_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
        key_padding: FloatTensor<Self>,
        row_keys: IntTensor<Self>,
        params: CubeFlashParams,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// `dropout(softmax(scale · q kᵀ + masks)) v`: the forward pass's output; under autodiff it
    /// records the kernels' backward.
    #[fusion(default)]
    fn cube_flash_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        key_padding: FloatTensor<Self>,
        row_keys: IntTensor<Self>,
        params: CubeFlashParams,
    ) -> FloatTensor<Self> {
        Self::cube_flash_forward(q, k, v, key_padding, row_keys, params).0
    }
}

#[cfg(feature = "wgpu-fused")]
use burn::backend::fusion::custom::TensorSpec;

/// The output shapes of [`CubeFlashAttention::cube_flash_forward`] under fusion.
#[cfg(feature = "wgpu-fused")]
fn forward_specs(
    q: &TensorSpec,
    _k: &TensorSpec,
    v: &TensorSpec,
    _key_padding: &TensorSpec,
    _row_keys: &TensorSpec,
    _params: &CubeFlashParams,
) -> (TensorSpec, TensorSpec) {
    let [batch, heads, n_q, _] = q.shape.dims::<4>();
    let d_v = v.shape.dims::<4>()[3];
    (
        TensorSpec::new(burn::backend::Shape::new([batch, heads, n_q, d_v]), q.dtype),
        TensorSpec::new(burn::backend::Shape::new([batch, heads, n_q, 1]), q.dtype),
    )
}

/// The output shapes of [`CubeFlashAttention::cube_flash_backward`] under fusion: those of
/// `q`, `k` and `v`.
#[cfg(feature = "wgpu-fused")]
#[allow(clippy::too_many_arguments)]
fn backward_specs(
    q: &TensorSpec,
    k: &TensorSpec,
    v: &TensorSpec,
    _out: &TensorSpec,
    _lse: &TensorSpec,
    _d_out: &TensorSpec,
    _key_padding: &TensorSpec,
    _row_keys: &TensorSpec,
    _params: &CubeFlashParams,
) -> (TensorSpec, TensorSpec, TensorSpec) {
    (q.clone(), k.clone(), v.clone())
}

/// Whether `device` is a CubeCL device (or an autodiff device wrapping one) on which the
/// kernels may run: under autodiff only with their backward (the `train` feature).
pub(super) fn applies(device: &Device) -> bool {
    (cfg!(feature = "train") || !device.is_autodiff())
        && matches!(
            device.as_dispatch().clone().inner(),
            burn::backend::DispatchDevice::Cube(_)
        )
}

/// Fused softmax attention on a CubeCL device (see [`super::try_attention`]), `None` on any
/// other device or dtype.
pub(super) fn try_attention(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    mask_pad: Option<&Tensor<2, Bool>>,
    causal: bool,
    scale: f32,
    dropout: Option<DropMask>,
) -> Option<Tensor<4>> {
    let device = q.device();
    let all_f32 = super::all_f32(&[q, k, v]);
    let [batch, heads, n_q, d] = q.dims();
    let n_k = k.dims()[2];
    if !applies(&device) || !all_f32 || n_q == 0 || n_k == 0 || d == 0 || v.dims()[3] == 0 {
        return None;
    }
    let key_padding = match mask_pad {
        Some(mask) => mask.clone().float(),
        None => Tensor::<2>::zeros([batch, n_k], &device),
    };
    let rows = batch.checked_mul(heads)?.checked_mul(n_q)?;
    let row_keys = match &dropout {
        Some(mask) => {
            let mut halves = Vec::with_capacity(rows.checked_mul(4)?);
            for row in 0..rows {
                for word in mask.row_key(row as u64) {
                    halves.extend([(word >> 16) as i32, (word & 0xFFFF) as i32]);
                }
            }
            Tensor::<2, Int>::from_data(TensorData::new(halves, [rows, 4]), &device)
        }
        None => Tensor::<2, Int>::zeros([1, 4], &device),
    };
    let params = CubeFlashParams {
        scale,
        causal,
        dropout: dropout.is_some(),
        threshold: dropout.map_or(0, |mask| mask.threshold()),
        keep_scale: dropout.map_or(1.0, |mask| mask.keep_scale()),
    };
    let out = <burn::backend::Dispatch as CubeFlashAttention>::cube_flash_attention(
        q.clone().into_dispatch(),
        k.clone().into_dispatch(),
        v.clone().into_dispatch(),
        key_padding.into_dispatch(),
        row_keys.into_dispatch(),
        params,
    );
    Some(Tensor::from_dispatch(out))
}

/// The backend extension: the decaying core's recurrence (`kernels/cube_recurrence.rs`) whose
/// autodiff form has the kernels' own backward. Tensors are `[batch, heads, n, d]`, `log_decay`
/// of width 1 or `d_k`; the output is the outputs then, with `form.with_state`, the final state
/// (`[batch, heads, n + d_k, d_v]`), as on `flex`.
#[backend_extension(
    Cube: cfg(feature = "wgpu"),
    Fusion: cfg(feature = "wgpu-fused"),
    Autodiff: cfg(feature = "train")
)]
pub trait CubeRecurrence: Backend {
    /// The recurrence's outputs (and final state).
    #[fusion(meta = recurrence_specs)]
    fn cube_decayed_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_decay: FloatTensor<Self>,
        form: RecurrenceForm,
    ) -> FloatTensor<Self>;

    /// The gradients of `q`, `k`, `v` and `log_decay` from the joint output's gradient.
    #[allow(clippy::too_many_arguments)]
    #[fusion(meta = recurrence_grad_specs)]
    fn cube_decayed_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_decay: FloatTensor<Self>,
        joint: FloatTensor<Self>,
        d_joint: FloatTensor<Self>,
        form: RecurrenceForm,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );

    /// The forward pass's output; under autodiff it records the kernels' backward.
    #[fusion(default)]
    fn cube_decayed_recurrence(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_decay: FloatTensor<Self>,
        form: RecurrenceForm,
    ) -> FloatTensor<Self> {
        Self::cube_decayed_forward(q, k, v, log_decay, form)
    }
}

/// The output shape of [`CubeRecurrence::cube_decayed_forward`] under fusion.
#[cfg(feature = "wgpu-fused")]
fn recurrence_specs(
    q: &TensorSpec,
    _k: &TensorSpec,
    v: &TensorSpec,
    _log_decay: &TensorSpec,
    form: &RecurrenceForm,
) -> TensorSpec {
    let [batch, heads, n, d_k] = q.shape.dims::<4>();
    let rows = n + if form.with_state { d_k } else { 0 };
    let d_v = v.shape.dims::<4>()[3];
    TensorSpec::new(
        burn::backend::Shape::new([batch, heads, rows, d_v]),
        q.dtype,
    )
}

/// The output shapes of [`CubeRecurrence::cube_decayed_backward`] under fusion: those of the
/// inputs.
#[cfg(feature = "wgpu-fused")]
#[allow(clippy::too_many_arguments)]
fn recurrence_grad_specs(
    q: &TensorSpec,
    k: &TensorSpec,
    v: &TensorSpec,
    log_decay: &TensorSpec,
    _joint: &TensorSpec,
    _d_joint: &TensorSpec,
    _form: &RecurrenceForm,
) -> (TensorSpec, TensorSpec, TensorSpec, TensorSpec) {
    (q.clone(), k.clone(), v.clone(), log_decay.clone())
}

/// The decaying core's recurrence on a CubeCL device (see [`super::try_decayed_recurrence`]):
/// the joint output, `None` on any other device or dtype.
pub(super) fn try_decayed_recurrence(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    log_decay: &Tensor<4>,
    form: RecurrenceForm,
) -> Option<Tensor<4>> {
    let all_f32 = super::all_f32(&[q, k, v, log_decay]);
    let [_, _, n, d_k] = q.dims();
    if !applies(&q.device()) || !all_f32 || n == 0 || d_k == 0 || v.dims()[3] == 0 {
        return None;
    }
    let joint = <burn::backend::Dispatch as CubeRecurrence>::cube_decayed_recurrence(
        q.clone().into_dispatch(),
        k.clone().into_dispatch(),
        v.clone().into_dispatch(),
        log_decay.clone().into_dispatch(),
        form,
    );
    Some(Tensor::from_dispatch(joint))
}

/// Positions between the delta rule's checkpoints of the state (its backward re-runs each
/// stretch from one).
pub(super) const DELTA_CHECKPOINT: usize = 32;

/// The largest shared buffer of the delta rule's backward, in 32-bit words (16 KiB).
const DELTA_SHARED_WORDS: usize = 4096;

/// Whether the delta rule's backward takes heads of these sizes: a workgroup of `d_v` threads
/// and `d_k · d_v + 2 d_v` words of shared memory.
fn delta_fits(d_k: usize, d_v: usize) -> bool {
    d_v <= 256 && d_k * d_v + 2 * d_v <= DELTA_SHARED_WORDS
}

/// The gradients of the delta rule's inputs: `q`, `k`, `v`, `β` and the log-decays (the
/// extension's signature spells the tuple out, which its macro needs).
pub type DeltaGrads<B> = (
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
);

/// The backend extension: the delta-rule core's recurrence (`kernels/cube_recurrence.rs`) whose
/// autodiff form has the kernels' own backward. Tensors are `[batch, heads, n, d]`, `beta` and
/// `log_decay` of width 1; the output as [`CubeRecurrence`]'s.
#[backend_extension(
    Cube: cfg(feature = "wgpu"),
    Fusion: cfg(feature = "wgpu-fused"),
    Autodiff: cfg(feature = "train")
)]
pub trait CubeDeltaRule: Backend {
    /// The recurrence's outputs (and final state), and the states its backward re-runs from
    /// (`[batch · heads, ⌈n / 32⌉, d_k, d_v]`).
    #[fusion(meta = delta_specs)]
    fn cube_delta_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        log_decay: FloatTensor<Self>,
        form: RecurrenceForm,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// The gradients of `q`, `k`, `v`, `beta` and `log_decay` from the joint output's gradient.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    #[fusion(meta = delta_grad_specs)]
    fn cube_delta_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        log_decay: FloatTensor<Self>,
        checkpoints: FloatTensor<Self>,
        d_joint: FloatTensor<Self>,
        form: RecurrenceForm,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );

    /// The forward pass's output; under autodiff it records the kernels' backward.
    #[fusion(default)]
    fn cube_delta_recurrence(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        log_decay: FloatTensor<Self>,
        form: RecurrenceForm,
    ) -> FloatTensor<Self> {
        Self::cube_delta_forward(q, k, v, beta, log_decay, form).0
    }
}

/// The output shapes of [`CubeDeltaRule::cube_delta_forward`] under fusion.
#[cfg(feature = "wgpu-fused")]
fn delta_specs(
    q: &TensorSpec,
    k: &TensorSpec,
    v: &TensorSpec,
    _beta: &TensorSpec,
    log_decay: &TensorSpec,
    form: &RecurrenceForm,
) -> (TensorSpec, TensorSpec) {
    let [batch, heads, n, d_k] = q.shape.dims::<4>();
    let d_v = v.shape.dims::<4>()[3];
    let stretches = n.div_ceil(DELTA_CHECKPOINT);
    (
        recurrence_specs(q, k, v, log_decay, form),
        TensorSpec::new(
            burn::backend::Shape::new([batch * heads, stretches, d_k, d_v]),
            q.dtype,
        ),
    )
}

/// The output shapes of [`CubeDeltaRule::cube_delta_backward`] under fusion: those of the
/// inputs.
#[cfg(feature = "wgpu-fused")]
#[allow(clippy::too_many_arguments)]
fn delta_grad_specs(
    q: &TensorSpec,
    k: &TensorSpec,
    v: &TensorSpec,
    beta: &TensorSpec,
    log_decay: &TensorSpec,
    _checkpoints: &TensorSpec,
    _d_joint: &TensorSpec,
    _form: &RecurrenceForm,
) -> (TensorSpec, TensorSpec, TensorSpec, TensorSpec, TensorSpec) {
    (
        q.clone(),
        k.clone(),
        v.clone(),
        beta.clone(),
        log_decay.clone(),
    )
}

/// The delta-rule core's recurrence on a CubeCL device (see [`super::try_delta_recurrence`]): the
/// joint output, `None` on any other device or dtype, or with heads too large for the
/// backward's workgroup.
pub(super) fn try_delta_recurrence(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    beta: &Tensor<4>,
    log_decay: &Tensor<4>,
    form: RecurrenceForm,
) -> Option<Tensor<4>> {
    let all_f32 = super::all_f32(&[q, k, v, beta, log_decay]);
    let [_, _, n, d_k] = q.dims();
    let d_v = v.dims()[3];
    if !applies(&q.device()) || !all_f32 || n == 0 || d_k == 0 || d_v == 0 || !delta_fits(d_k, d_v)
    {
        return None;
    }
    let joint = <burn::backend::Dispatch as CubeDeltaRule>::cube_delta_recurrence(
        q.clone().into_dispatch(),
        k.clone().into_dispatch(),
        v.clone().into_dispatch(),
        beta.clone().into_dispatch(),
        log_decay.clone().into_dispatch(),
        form,
    );
    Some(Tensor::from_dispatch(joint))
}
