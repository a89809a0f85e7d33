//! The kernels floor: backend extensions with their own backward passes, behind the engines.
//!
//! Fused softmax attention with its own backward pass, for training on `flex`, on `tch` (CPU
//! and CUDA) and on Burn's CubeCL backend (`wgpu`, with or without fusion).
//!
//! Burn's fused `attention` operation has no backward of its own: under autodiff Burn derives
//! one from the composed steps, which stores the `n × n` weights and walks them several times.
//! This module registers a Burn backend extension whose forward keeps only the log-sum-exp of
//! each score row and whose backward recomputes the weights tile by tile ([`kernel`]), as
//! FlashAttention does and as PyTorch's CPU `scaled_dot_product_attention` does. Time is the
//! same `O(n² d)`; memory beyond the inputs drops from `O(n²)` to `O(n)` per head. On `tch` the
//! same extension calls libtorch's own fused forward and backward (flash on the CPU,
//! memory-efficient on CUDA).
//!
//! [`try_attention`] is the entry point: it answers `None` wherever the fused path does not
//! apply (another backend, a dtype other than `f32`), and the caller composes the steps.

// The kernels' backward halves are called only by the autodiff forms (the `train` feature).
#[cfg(feature = "flex")]
#[cfg_attr(not(feature = "train"), allow(dead_code))]
mod gathered;
mod hash;
#[cfg(feature = "flex")]
#[cfg_attr(not(feature = "train"), allow(dead_code))]
mod kernel;
pub(crate) mod key_slots;
mod mask;
#[cfg(feature = "flex")]
#[cfg_attr(not(feature = "train"), allow(dead_code))]
mod recurrence;
#[cfg(feature = "flex")]
#[cfg_attr(not(feature = "train"), allow(dead_code))]
mod shared_gather;
#[cfg(feature = "flex")]
mod simd;

use std::sync::Arc;

use burn::prelude::*;

use crate::kernels::key_slots::KeySlots;
pub(crate) use mask::DropMask;

/// Key-padding flags shared between the forward and backward passes (`[batch, n_k]`,
/// `true` = padding).
#[cfg_attr(not(any(feature = "flex", feature = "tch")), allow(dead_code))]
pub(crate) type KeyPadding = Option<Arc<[bool]>>;

/// Whether every tensor is `f32`, the one dtype the fused kernels take.
#[cfg_attr(
    not(any(feature = "flex", feature = "tch", feature = "wgpu")),
    allow(dead_code)
)]
fn all_f32(tensors: &[&Tensor<4>]) -> bool {
    tensors
        .iter()
        .all(|t| t.dtype() == burn::tensor::DType::F32)
}

/// Fused softmax attention `softmax(scale · q kᵀ + masks) v` on `[batch, heads, n, d]` tensors
/// when the backend has the fused kernel, `None` otherwise (the caller then composes the steps).
///
/// Masked scores are replaced by [`MASK_FILL`](crate::contract::input::MASK_FILL), as in the composed
/// path, so the two agree to rounding, masks included; a dropout mask drops the weights the
/// composed path given the same mask drops (`flex`; libtorch's CUDA kernel draws its own mask
/// with the same probability, its CPU kernel takes none).
pub(crate) fn try_attention(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    mask_pad: Option<&Tensor<2, Bool>>,
    causal: bool,
    scale: f32,
    dropout: Option<DropMask>,
) -> Option<Tensor<4>> {
    #[cfg(feature = "wgpu")]
    if let Some(out) = cube_extension::try_attention(q, k, v, mask_pad, causal, scale, dropout) {
        return Some(out);
    }
    #[cfg(any(feature = "flex", feature = "tch"))]
    {
        let all_f32 = all_f32(&[q, k, v]);
        let n_q = q.dims()[2];
        let n_k = k.dims()[2];
        let same_head_size = q.dims()[3] == v.dims()[3];
        if !has_kernel(&q.device(), same_head_size) || !all_f32 || n_q == 0 || n_k == 0 {
            return None;
        }
        if dropout.is_some() && !kernel_takes_dropout(&q.device()) {
            return None;
        }
        let key_padding: KeyPadding = mask_pad.map(|mask| {
            let data = mask.clone().into_data();
            let flags: Vec<bool> = data.iter::<bool>().collect();
            Arc::from(flags)
        });
        let out = <burn::backend::Dispatch as FlashAttention>::flash_attention(
            q.clone().into_dispatch(),
            k.clone().into_dispatch(),
            v.clone().into_dispatch(),
            key_padding,
            scale,
            causal,
            dropout,
        );
        Some(Tensor::from_dispatch(out))
    }
    #[cfg(not(any(feature = "flex", feature = "tch")))]
    {
        let _ = (q, k, v, mask_pad, causal, scale, dropout);
        None
    }
}

/// Whether [`try_attention`] runs the CubeCL kernels for `q` (a CubeCL device, `f32`), which
/// take the counter-based dropout mask.
pub(crate) fn cube_kernel_applies(q: &Tensor<4>) -> bool {
    #[cfg(feature = "wgpu")]
    {
        cube_extension::applies(&q.device()) && q.dtype() == burn::tensor::DType::F32
    }
    #[cfg(not(feature = "wgpu"))]
    {
        let _ = q;
        false
    }
}

/// Fused softmax attention over gathered keys (see [`gathered_attention`](crate::engines::gathered_softmax::gathered_attention)):
/// the output `[batch, heads, n_q, d_v]` and log-sum-exp `[batch, heads, n_q, 1]`, both
/// differentiable, when the backend has the kernel (`flex`, `f32`), `None` otherwise. Its
/// backward recomputes the weights block by block: memory beyond inputs and outputs is one
/// block's buffers per thread, whatever the number of attended pairs.
pub(crate) fn try_gathered_attention(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    bias: Option<&Tensor<4>>,
    slots: &Arc<KeySlots>,
    scale: f32,
    dropout: Option<DropMask>,
) -> Option<(Tensor<4>, Tensor<4>)> {
    #[cfg(feature = "flex")]
    {
        let all_f32 = all_f32(&[q, k, v]) && bias.is_none_or(|bias| all_f32(&[bias]));
        let [batch, heads, n_q, _] = q.dims();
        let d_v = v.dims()[3];
        if !flex_kernels(&q.device()) || !all_f32 || n_q == 0 || k.dims()[2] == 0 {
            return None;
        }
        if let Some(bias) = bias {
            let rows = slots.n_blocks * slots.block;
            assert_eq!(
                bias.dims(),
                [batch, heads, rows, slots.slots],
                "a bias per query row and slot"
            );
        }
        // One tensor holds both outputs (the log-sum-exp as an extra column), so that one
        // backward receives the gradients of both.
        let [q, k, v] = [q, k, v].map(|x| x.clone().into_dispatch());
        let joint = match bias {
            None => <burn::backend::Dispatch as GatheredAttention>::gathered_attention(
                q,
                k,
                v,
                slots.clone(),
                scale,
                dropout,
            ),
            Some(bias) => {
                <burn::backend::Dispatch as GatheredAttention>::biased_gathered_attention(
                    q,
                    k,
                    v,
                    bias.clone().into_dispatch(),
                    slots.clone(),
                    scale,
                    dropout,
                )
            }
        };
        let joint = Tensor::<4>::from_dispatch(joint);
        let out = joint.clone().slice([0..batch, 0..heads, 0..n_q, 0..d_v]);
        let lse = joint.slice([0..batch, 0..heads, 0..n_q, d_v..d_v + 1]);
        Some((out, lse))
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = (q, k, v, bias, slots, scale, dropout);
        None
    }
}

/// The decaying core's causal recurrence (see [`crate::engines::decay`]) on `flex` (`f32`), token
/// by token with its own backward ([`recurrence`]), and on CubeCL devices (`wgpu`, `f32`; the
/// scans of `cube_recurrence`): the outputs `[batch, heads, n, d_v]` and the
/// state after the last position `[batch, heads, d_k, d_v]`, both differentiable; `None`
/// elsewhere (the caller runs the chunked form).
///
/// `log_decay` is `[batch, heads, n, 1]` or `[batch, heads, n, d_k]`, each entry at most 0.
/// `form` says from which end the recurrence runs (from the last position, `S_t` from `S_{t+1}`,
/// each output at its position) and whether the final state is wanted (`None` in its place
/// when not).
pub(crate) fn try_decayed_recurrence(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    log_decay: &Tensor<4>,
    form: RecurrenceForm,
) -> Option<(Tensor<4>, Option<Tensor<4>>)> {
    #[cfg(feature = "wgpu")]
    if let Some(joint) = cube_extension::try_decayed_recurrence(q, k, v, log_decay, form) {
        return Some(split_joint(joint, q.dims()[2], form));
    }
    #[cfg(feature = "flex")]
    if recurrence_applies([q, k, v, log_decay]) {
        let joint = <burn::backend::Dispatch as LinearRecurrence>::decayed_recurrence(
            q.clone().into_dispatch(),
            k.clone().into_dispatch(),
            v.clone().into_dispatch(),
            log_decay.clone().into_dispatch(),
            form,
        );
        return Some(split_joint(Tensor::from_dispatch(joint), q.dims()[2], form));
    }
    let _ = (q, k, v, log_decay, form);
    None
}

/// The delta-rule core's causal recurrence from a zero state (see [`crate::engines::delta`]) on
/// `flex` (`f32`), token by token with its own backward ([`recurrence`]): the outputs
/// `[batch, heads, n, d_v]` and the final state `[batch, heads, d_k, d_v]`; `None` elsewhere.
///
/// `beta` and `log_decay` are `[batch, heads, n, 1]`; `form` as for
/// [`try_decayed_recurrence`].
pub(crate) fn try_delta_recurrence(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    beta: &Tensor<4>,
    log_decay: &Tensor<4>,
    form: RecurrenceForm,
) -> Option<(Tensor<4>, Option<Tensor<4>>)> {
    #[cfg(feature = "wgpu")]
    if let Some(joint) = cube_extension::try_delta_recurrence(q, k, v, beta, log_decay, form) {
        return Some(split_joint(joint, q.dims()[2], form));
    }
    #[cfg(feature = "flex")]
    if recurrence_applies([q, k, v, log_decay]) && beta.dtype() == burn::tensor::DType::F32 {
        let joint = <burn::backend::Dispatch as LinearRecurrence>::delta_recurrence(
            q.clone().into_dispatch(),
            k.clone().into_dispatch(),
            v.clone().into_dispatch(),
            beta.clone().into_dispatch(),
            log_decay.clone().into_dispatch(),
            form,
        );
        return Some(split_joint(Tensor::from_dispatch(joint), q.dims()[2], form));
    }
    let _ = (q, k, v, beta, log_decay, form);
    None
}

/// Whether the recurrence kernel takes these tensors: `flex`, `f32`, at least one position.
#[cfg(feature = "flex")]
fn recurrence_applies(tensors: [&Tensor<4>; 4]) -> bool {
    flex_kernels(&tensors[0].device())
        && tensors[0].dims()[2] > 0
        && tensors
            .iter()
            .all(|t| t.dtype() == burn::tensor::DType::F32)
}

/// How a recurrence runs: from which end, and whether its final state is wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecurrenceForm {
    /// From the last position to the first (`S_t` from `S_{t+1}`), each output at its position.
    pub(crate) reverse: bool,
    /// Whether the final state comes back beside the outputs.
    pub(crate) with_state: bool,
}

impl RecurrenceForm {
    /// The causal form: from the first position, with the final state.
    pub(crate) const CAUSAL: Self = Self {
        reverse: false,
        with_state: true,
    };
    /// The outputs alone, from the first position.
    pub(crate) const FORWARD: Self = Self {
        reverse: false,
        with_state: false,
    };
    /// The outputs alone, from the last position.
    pub(crate) const BACKWARD: Self = Self {
        reverse: true,
        with_state: false,
    };
}

/// The recurrence's joint output as its outputs (the first `n` rows) and, where `form` asked
/// for it, its final state (the last `d_k`).
#[cfg(any(feature = "flex", feature = "wgpu"))]
fn split_joint(joint: Tensor<4>, n: usize, form: RecurrenceForm) -> (Tensor<4>, Option<Tensor<4>>) {
    if !form.with_state {
        return (joint, None);
    }
    let rows = joint.dims()[2];
    (
        joint.clone().slice(s![.., .., 0..n]),
        Some(joint.slice(s![.., .., n..rows])),
    )
}

/// `x` gathered along its last axis with one pattern for every leading position:
/// `out[…, r, c] = x[…, r, pattern[r · cols + c]]` (`x`: `[…, rows, len]`, out `[…, rows,
/// cols]`), as `x.gather(D − 1, index)` with the pattern expanded over the leading axes. On
/// `flex` (`f32`) a copy a row with a backward that adds each row's gradient back in place
/// ([`shared_gather`]); elsewhere Burn's `gather`.
///
/// # Panics
/// If the pattern is not `rows × cols` long, or holds an index past `len`.
pub(crate) fn gather_shared<const D: usize>(
    x: Tensor<D>,
    pattern: &[i64],
    cols: usize,
) -> Tensor<D> {
    let dims = x.dims();
    let (rows, len) = (dims[D - 2], dims[D - 1]);
    assert_eq!(pattern.len(), rows * cols, "a pattern of {rows} × {cols}");
    assert!(
        pattern.iter().all(|&i| (0..len as i64).contains(&i)),
        "pattern indices within the {len} values of a row"
    );
    #[cfg(feature = "flex")]
    if flex_kernels(&x.device()) && x.dtype() == burn::tensor::DType::F32 {
        let pattern: Arc<[u32]> = pattern.iter().map(|&i| i as u32).collect();
        return Tensor::from_dispatch(<burn::backend::Dispatch as RowGather>::gather_shared(
            x.into_dispatch(),
            pattern,
            cols,
        ));
    }
    let mut shape = [1; D];
    shape[D - 2] = rows;
    shape[D - 1] = cols;
    let mut out_dims = dims;
    out_dims[D - 1] = cols;
    let index = Tensor::<D, Int>::from_data(TensorData::new(pattern.to_vec(), shape), &x.device())
        .expand(out_dims);
    x.gather(D - 1, index)
}

/// `x.select(dim, rows)`: the slices `rows` along axis `dim`, in that order (repeats
/// allowed). On `flex` (`f32`) a copy a slice with a backward that adds each slice's gradient
/// back in place ([`shared_gather`]), where Burn's backward goes through a general
/// scatter-add; elsewhere Burn's `select`.
///
/// # Panics
/// If a row is past the axis's length.
pub(crate) fn select_rows<const D: usize>(x: Tensor<D>, dim: usize, rows: &[usize]) -> Tensor<D> {
    let len = x.dims()[dim];
    assert!(
        rows.iter().all(|&r| r < len),
        "rows within the axis's {len}"
    );
    #[cfg(feature = "flex")]
    if flex_kernels(&x.device()) && x.dtype() == burn::tensor::DType::F32 {
        let rows: Arc<[u32]> = rows.iter().map(|&r| r as u32).collect();
        return Tensor::from_dispatch(<burn::backend::Dispatch as RowGather>::select_rows(
            x.into_dispatch(),
            dim,
            rows,
        ));
    }
    let index: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    let index = Tensor::<1, Int>::from_data(TensorData::new(index, [rows.len()]), &x.device());
    x.select(dim, index)
}

/// `x.exp()`, on `flex` (f32) through the vectorised exponential of the fused kernel, whose
/// results are 0 below -87.3 (where `f32`'s are subnormal) and inputs clamped above 88.7; for
/// callers whose arguments are at most 0 (stabilised random features).
pub(crate) fn exp<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if flex_kernels(&x.device()) && x.dtype() == burn::tensor::DType::F32 {
        return Tensor::from_dispatch(<burn::backend::Dispatch as FlashAttention>::vector_exp(
            x.into_dispatch(),
        ));
    }
    x.exp()
}

/// The exact GELU, on `flex` (f32) through a vectorised `erfc` (relative error about 1e-6) and a
/// fused backward, where Burn's evaluates `erf` one element at a time and composes the
/// derivative from several operations; elsewhere Burn's own.
pub(crate) fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if flex_kernels(&x.device()) && x.dtype() == burn::tensor::DType::F32 {
        return Tensor::from_dispatch(<burn::backend::Dispatch as FlashAttention>::vector_gelu(
            x.into_dispatch(),
        ));
    }
    burn::tensor::activation::gelu(x)
}

/// Softmax over the last axis, on `flex` (f32) in one vectorised pass per row (the fused
/// kernel's exponential) with a backward that keeps only the output; elsewhere Burn's.
pub(crate) fn softmax<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if flex_kernels(&x.device()) && x.dtype() == burn::tensor::DType::F32 {
        return Tensor::from_dispatch(<burn::backend::Dispatch as FlashAttention>::vector_softmax(
            x.into_dispatch(),
        ));
    }
    burn::tensor::activation::softmax(x, D - 1)
}

/// The fewest elements for which [`layer_norm`] takes the fused path: measured on a 2-core
/// VM (docs/benchmarks.md), the fused LayerNorm made the ListOps `small` step (64,000 rows of
/// 64) 12% faster, and the `tiny` step (2,048 rows of 64) 12% slower than Burn's composed one.
#[cfg_attr(not(feature = "flex"), allow(dead_code))]
const FUSED_LAYER_NORM_MIN: usize = 1 << 18;

/// LayerNorm over the last axis with `norm`'s scale and bias and `epsilon` (the value `norm`
/// was configured with): on `flex` (f32, under autodiff, with a bias, at least
/// [`FUSED_LAYER_NORM_MIN`] elements) one pass a row forward and backward (Burn's autodiff
/// composes about eight operations each way); elsewhere `norm.forward(x)`.
pub(crate) fn layer_norm<const D: usize>(
    norm: &burn::nn::LayerNorm,
    x: Tensor<D>,
    epsilon: f64,
) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if let Some(beta) = &norm.beta
        && flex_kernels(&x.device())
        && x.device().is_autodiff()
        && x.dtype() == burn::tensor::DType::F32
        && x.shape().num_elements() >= FUSED_LAYER_NORM_MIN
    {
        return Tensor::from_dispatch(
            <burn::backend::Dispatch as FlashAttention>::vector_layer_norm(
                x.into_dispatch(),
                norm.gamma.val().into_dispatch(),
                beta.val().into_dispatch(),
                epsilon,
            ),
        );
    }
    let _ = epsilon;
    norm.forward(x)
}

/// The logistic sigmoid, on `flex` (f32) in one vectorised pass (the fused kernel's
/// exponential) with a backward that keeps only the output; elsewhere Burn's.
pub(crate) fn sigmoid<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if flex_kernels(&x.device()) && x.dtype() == burn::tensor::DType::F32 {
        return Tensor::from_dispatch(<burn::backend::Dispatch as FlashAttention>::vector_sigmoid(
            x.into_dispatch(),
        ));
    }
    burn::tensor::activation::sigmoid(x)
}

/// SiLU `x σ(x)`, on `flex` (f32) in one vectorised pass with a fused backward; elsewhere
/// Burn's.
pub(crate) fn silu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if flex_kernels(&x.device()) && x.dtype() == burn::tensor::DType::F32 {
        return Tensor::from_dispatch(<burn::backend::Dispatch as FlashAttention>::vector_silu(
            x.into_dispatch(),
        ));
    }
    burn::tensor::activation::silu(x)
}

/// Softplus `ln(1 + eˣ)`, on `flex` (f32) in one vectorised pass whose backward keeps only the
/// input (`softplus′ = σ`); elsewhere Burn's.
pub(crate) fn softplus<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if flex_kernels(&x.device()) && x.dtype() == burn::tensor::DType::F32 {
        return Tensor::from_dispatch(
            <burn::backend::Dispatch as FlashAttention>::vector_softplus(x.into_dispatch()),
        );
    }
    burn::tensor::activation::softplus(x, 1.0)
}

/// `elu(x) + 1`, on `flex` (f32) in one vectorised pass with a backward that keeps only the
/// output; elsewhere as `max(x, 0) + exp(min(x, 0))` (the same values and gradients).
pub(crate) fn elu_plus_one<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if flex_kernels(&x.device()) && x.dtype() == burn::tensor::DType::F32 {
        return Tensor::from_dispatch(
            <burn::backend::Dispatch as FlashAttention>::vector_elu_plus_one(x.into_dispatch()),
        );
    }
    x.clone().clamp_min(0.0) + x.clamp_max(0.0).exp()
}

/// Whether `device` (or the device an autodiff device wraps) has the fused kernel: `flex`, and
/// libtorch on the CPU and on CUDA (its own fused kernels), which needs queries, keys and values
/// of one head size (`same_head_size`; the factorised Synthesizer's are not).
#[cfg(any(feature = "flex", feature = "tch"))]
#[allow(deprecated)] // burn-tch's device, see the `libtorch` module
fn has_kernel(device: &Device, same_head_size: bool) -> bool {
    #[cfg(not(feature = "tch"))]
    let _ = same_head_size;
    #[cfg(feature = "flex")]
    if flex_kernels(device) {
        return true;
    }
    #[cfg(feature = "tch")]
    if same_head_size && extension_applies(device) && libtorch_device(device).is_some() {
        return true;
    }
    false
}

/// Whether the fused kernel on `device` applies attention dropout: flex's applies the mask it is
/// given; libtorch's on CUDA draws its own with the same probability (its random-number state
/// kept for its backward), as PyTorch's `scaled_dot_product_attention` does there; libtorch's
/// CPU kernel has none.
#[cfg(any(feature = "flex", feature = "tch"))]
#[allow(deprecated)] // burn-tch's device is marked deprecated in Burn 0.22
fn kernel_takes_dropout(device: &Device) -> bool {
    #[cfg(feature = "flex")]
    if flex_kernels(device) {
        return true;
    }
    #[cfg(feature = "tch")]
    if matches!(
        libtorch_device(device),
        Some(burn::backend::libtorch::LibTorchDevice::Cuda(_))
    ) {
        return true;
    }
    let _ = device;
    false
}

/// The libtorch device `device` is (or an autodiff device wraps), where its kernels run: the CPU
/// or a CUDA device; `None` for any other backend.
#[cfg(feature = "tch")]
#[allow(deprecated)] // burn-tch's device is marked deprecated in Burn 0.22
fn libtorch_device(device: &Device) -> Option<burn::backend::libtorch::LibTorchDevice> {
    use burn::backend::libtorch::LibTorchDevice;
    match device.as_dispatch().clone().inner() {
        burn::backend::DispatchDevice::LibTorch(
            inner @ (LibTorchDevice::Cpu | LibTorchDevice::Cuda(_)),
        ) => Some(inner),
        _ => None,
    }
}

/// Whether `device` is `flex`, or an autodiff device wrapping it.
#[cfg(feature = "flex")]
pub(crate) fn is_flex(device: &Device) -> bool {
    matches!(
        device.as_dispatch().clone().inner(),
        burn::backend::DispatchDevice::Flex(_)
    )
}

/// Whether the library's `flex` kernels run on `device`: `flex`, or an autodiff device wrapping
/// it where the kernels have their backward (the `train` feature).
#[cfg(feature = "flex")]
fn flex_kernels(device: &Device) -> bool {
    extension_applies(device) && is_flex(device)
}

/// Whether the backend extensions may take tensors of `device`: always, except an autodiff
/// device when the library is built without the `train` feature (Burn's `autodiff` turned on by
/// another crate), whose extensions then have no autodiff form; the composed steps run instead.
#[cfg(any(feature = "flex", feature = "tch"))]
fn extension_applies(device: &Device) -> bool {
    cfg!(feature = "train") || !device.is_autodiff()
}

#[cfg(any(feature = "flex", feature = "tch"))]
use extension::FlashAttention;

#[cfg(any(feature = "flex", feature = "tch"))]
#[allow(deprecated)]
// burn-tch's backend, see the `libtorch` module
// Only `flex` calls the vectorised element-wise operations.
#[cfg_attr(not(feature = "flex"), allow(dead_code))]
mod extension {
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Backend, backend_extension};

    use super::DropMask;
    use super::KeyPadding;

    /// The backend extension: fused attention whose autodiff form has a handwritten backward.
    #[backend_extension(
        Flex: cfg(feature = "flex"),
        LibTorch: cfg(feature = "tch"),
        Autodiff: cfg(feature = "train")
    )]
    pub trait FlashAttention: Backend {
        /// `dropout(softmax(scale · q kᵀ + masks)) v` on `[batch, heads, n, d]` tensors.
        fn flash_attention(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            key_padding: KeyPadding,
            scale: f32,
            causal: bool,
            dropout: Option<DropMask>,
        ) -> FloatTensor<Self>;

        /// Element-wise `exp`. On `flex`, a vectorised exponential (about 2 ulp, 0 below
        /// -87.3, inputs clamped above 88.7) in place of the backend's scalar `expf`;
        /// elsewhere the backend's own.
        fn vector_exp(x: FloatTensor<Self>) -> FloatTensor<Self> {
            Self::float_exp(x)
        }

        /// The exact GELU. On `flex`, vectorised, with a fused backward; elsewhere the
        /// backend's own.
        fn vector_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
            Self::gelu(x)
        }

        /// Softmax over the last axis. On `flex`, one vectorised pass per row with a fused
        /// backward that keeps only the output; elsewhere the backend's composed steps.
        fn vector_softmax(x: FloatTensor<Self>) -> FloatTensor<Self> {
            use burn::backend::TensorMetadata;
            let last = x.shape().num_dims() - 1;
            let max = Self::float_max_dim(x.clone(), last);
            let e = Self::float_exp(Self::float_sub(x, max));
            let sum = Self::float_sum_dim(e.clone(), last);
            Self::float_div(e, sum)
        }

        /// LayerNorm over the last axis, `(x − mean) / √(var + ε) · γ + β`. On `flex` under
        /// autodiff, one pass a row forward and backward; elsewhere the backend's own (on `flex`
        /// its fused forward, under autodiff Burn's composed steps).
        fn vector_layer_norm(
            x: FloatTensor<Self>,
            gamma: FloatTensor<Self>,
            beta: FloatTensor<Self>,
            epsilon: f64,
        ) -> FloatTensor<Self> {
            <Self as burn::backend::ops::ModuleOps<Self>>::layer_norm(x, gamma, Some(beta), epsilon)
        }

        /// The logistic sigmoid. On `flex`, one vectorised pass with a backward that keeps only
        /// the output; elsewhere the backend's own.
        fn vector_sigmoid(x: FloatTensor<Self>) -> FloatTensor<Self> {
            Self::sigmoid(x)
        }

        /// Softplus, `ln(1 + eˣ)`. On `flex`, one vectorised pass with a fused backward;
        /// elsewhere `ln(1 + eˣ)` from the backend's operations (as Burn's `softplus`).
        fn vector_softplus(x: FloatTensor<Self>) -> FloatTensor<Self> {
            Self::float_log1p(Self::float_exp(x))
        }

        /// SiLU, `x σ(x)`. On `flex`, one vectorised pass with a fused backward; elsewhere
        /// `x σ(x)` from the backend's sigmoid.
        fn vector_silu(x: FloatTensor<Self>) -> FloatTensor<Self> {
            Self::float_mul(x.clone(), Self::sigmoid(x))
        }

        /// `elu(x) + 1`. On `flex`, one vectorised pass; elsewhere `max(x, 0) + exp(min(x, 0))`.
        fn vector_elu_plus_one(x: FloatTensor<Self>) -> FloatTensor<Self> {
            let positive = Self::float_clamp_min(x.clone(), 0.0.into());
            Self::float_add(
                positive,
                Self::float_exp(Self::float_clamp_max(x, 0.0.into())),
            )
        }
    }
}

#[cfg(feature = "flex")]
use gathered_extension::GatheredAttention;

#[cfg(feature = "flex")]
mod gathered_extension {
    use std::sync::Arc;

    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Backend, backend_extension};

    use super::DropMask;
    use crate::kernels::key_slots::KeySlots;

    /// The backend extension: fused attention over gathered keys, with a handwritten backward.
    #[backend_extension(Flex: cfg(feature = "flex"), Autodiff: cfg(feature = "train"))]
    pub trait GatheredAttention: Backend {
        /// `dropout(softmax(scale · q k_slotsᵀ + bias + masks)) v_slots` per query block, on
        /// `[batch, heads, n, d]` tensors: `[batch, heads, n_q, d_v + 1]`, the output with each
        /// query's log-sum-exp as the last column.
        fn gathered_attention(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            slots: Arc<KeySlots>,
            scale: f32,
            dropout: Option<DropMask>,
        ) -> FloatTensor<Self>;

        /// [`gathered_attention`](GatheredAttention::gathered_attention) with a learned `bias`
        /// added to the scaled scores, `[batch, heads, n_blocks · block, slots]` in block order,
        /// which receives its gradient.
        fn biased_gathered_attention(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            bias: FloatTensor<Self>,
            slots: Arc<KeySlots>,
            scale: f32,
            dropout: Option<DropMask>,
        ) -> FloatTensor<Self>;
    }
}

#[cfg(feature = "flex")]
use gather_extension::RowGather;

#[cfg(feature = "flex")]
mod gather_extension {
    use std::sync::Arc;

    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Backend, backend_extension};

    /// The backend extension: gathering along the last axis with one index pattern for every
    /// leading position, and selecting slices along an axis, with handwritten backwards.
    #[backend_extension(Flex: cfg(feature = "flex"), Autodiff: cfg(feature = "train"))]
    pub trait RowGather: Backend {
        /// `out[…, r, c] = x[…, r, pattern[r · cols + c]]`.
        fn gather_shared(
            x: FloatTensor<Self>,
            pattern: Arc<[u32]>,
            cols: usize,
        ) -> FloatTensor<Self>;

        /// The slices `rows` of `x` along axis `dim`.
        fn select_rows(x: FloatTensor<Self>, dim: usize, rows: Arc<[u32]>) -> FloatTensor<Self>;
    }
}

#[cfg(feature = "flex")]
use recurrence_extension::LinearRecurrence;

#[cfg(feature = "flex")]
mod recurrence_extension {
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Backend, backend_extension};

    use super::RecurrenceForm;

    /// The backend extension: the linear recurrences of the decaying and delta-rule cores,
    /// token by token, with a handwritten backward.
    #[backend_extension(Flex: cfg(feature = "flex"), Autodiff: cfg(feature = "train"))]
    pub trait LinearRecurrence: Backend {
        /// `S_t = Diag(exp(g_t)) S_{t−1} + k_t v_tᵀ`, `o_t = S_tᵀ q_t` from a zero state, on
        /// `[batch, heads, n, d]` tensors (`g` of width 1 or `d_k`): `[batch, heads, n + d_k,
        /// d_v]`, the outputs then the final state (`[batch, heads, n, d_v]` without it), run
        /// from either end as `form` says.
        fn decayed_recurrence(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            log_decay: FloatTensor<Self>,
            form: RecurrenceForm,
        ) -> FloatTensor<Self>;

        /// `S_t = α_t S_{t−1} + β_t k_t (v_t − α_t S_{t−1}ᵀ k_t)ᵀ`, `α_t = exp(g_t)`,
        /// `o_t = S_tᵀ q_t` from a zero state (`β`, `g` of width 1): `[batch, heads, n + d_k,
        /// d_v]`, the outputs then the final state (`[batch, heads, n, d_v]` without it), run
        /// from either end as `form` says.
        fn delta_recurrence(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            beta: FloatTensor<Self>,
            log_decay: FloatTensor<Self>,
            form: RecurrenceForm,
        ) -> FloatTensor<Self>;
    }
}

#[cfg(feature = "wgpu")]
mod cube;
#[cfg(all(feature = "wgpu", feature = "train"))]
mod cube_autodiff;
#[cfg(feature = "wgpu")]
mod cube_extension;
#[cfg(feature = "wgpu")]
mod cube_recurrence;
#[cfg(feature = "flex")]
mod flex;
#[cfg(all(feature = "flex", feature = "train"))]
mod flex_autodiff;
#[cfg(feature = "tch")]
mod libtorch;

#[cfg(test)]
mod tests {
    use burn::prelude::*;
    use burn::tensor::Distribution;

    /// Values and gradients of `f` against float64 references `(f(x), f′(x))` on an autodiff
    /// `flex` device: relative error of the values below `tol`, and of the gradient of
    /// `Σ g ∘ f(x)` likewise (absolute below `tol` where the reference is below 1).
    fn check_pointwise(
        f: fn(Tensor<2>) -> Tensor<2>,
        reference: fn(f64) -> (f64, f64),
        range: (f64, f64),
        tol: f64,
    ) {
        let device = Device::flex().autodiff();
        let x = Tensor::<2>::random([9, 1000], Distribution::Uniform(range.0, range.1), &device)
            .require_grad();
        let g = Tensor::<2>::random([9, 1000], Distribution::Normal(0.0, 1.0), &device);
        let y = f(x.clone());
        let grads = (y.clone() * g.clone()).sum().backward();
        let dx = x.grad(&grads).unwrap();
        let values = |t: Tensor<2>| t.into_data().iter::<f32>().collect::<Vec<_>>();
        let (x, g, y, dx) = (
            values(x.inner()),
            values(g.inner()),
            values(y.inner()),
            values(dx),
        );
        for i in 0..x.len() {
            let (want, slope) = reference(x[i] as f64);
            let err = (y[i] as f64 - want).abs() / want.abs().max(1.0);
            assert!(err < tol, "f({}) = {} against {want}", x[i], y[i]);
            let want = g[i] as f64 * slope;
            let err = (dx[i] as f64 - want).abs() / want.abs().max(1.0);
            assert!(
                err < tol,
                "f'({}) · {} = {} against {want}",
                x[i],
                g[i],
                dx[i]
            );
        }
    }

    /// The exact GELU `x Φ(x)` and its derivative `Φ(x) + x φ(x)` against a float64 error
    /// function written here (Maclaurin series below |x| = 3, continued fraction beyond).
    #[test]
    fn gelu_matches_float64() {
        check_pointwise(
            super::gelu,
            |x| {
                let cdf = 0.5 * erfc64(-x / std::f64::consts::SQRT_2);
                let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
                (x * cdf, cdf + x * pdf)
            },
            (-12.0, 12.0),
            2e-6,
        );
    }

    /// The sigmoid and its derivative `σ (1 − σ)` against float64, over the range a trained
    /// gate's logits reach and past `exp`'s limits.
    #[test]
    fn sigmoid_matches_float64() {
        check_pointwise(
            super::sigmoid,
            |x| {
                let s = 1.0 / (1.0 + (-x).exp());
                (s, s * (1.0 - s))
            },
            (-100.0, 100.0),
            2e-6,
        );
    }

    /// SiLU `x σ(x)` and its derivative `σ (1 + x (1 − σ))` against float64.
    #[test]
    fn silu_matches_float64() {
        check_pointwise(
            super::silu,
            |x| {
                let s = 1.0 / (1.0 + (-x).exp());
                (x * s, s * (1.0 + x * (1.0 - s)))
            },
            (-100.0, 100.0),
            2e-6,
        );
    }

    /// Softplus `ln(1 + eˣ)` and its derivative `σ(x)` against float64, over a gate's and a
    /// feature map's range and past `exp`'s limits (where `ln(1 + eˣ)` in f32 would overflow).
    #[test]
    fn softplus_matches_float64() {
        check_pointwise(
            super::softplus,
            |x| {
                let value = x.max(0.0) + (-x.abs()).exp().ln_1p();
                (value, 1.0 / (1.0 + (-x).exp()))
            },
            (-100.0, 100.0),
            2e-6,
        );
        check_pointwise(
            super::softplus,
            |x| {
                (
                    x.max(0.0) + (-x.abs()).exp().ln_1p(),
                    1.0 / (1.0 + (-x).exp()),
                )
            },
            (-4.0, 4.0),
            2e-6,
        );
    }

    /// `elu(x) + 1` and its derivative, `x + 1` and 1 above 0, `exp(x)` twice below.
    #[test]
    fn elu_plus_one_matches_float64() {
        check_pointwise(
            super::elu_plus_one,
            |x| {
                if x > 0.0 {
                    (x + 1.0, 1.0)
                } else {
                    (x.exp(), x.exp())
                }
            },
            (-30.0, 10.0),
            1e-6,
        );
    }

    /// Softmax over the last axis and its backward against a float64 reference written from
    /// the definition: `y = exp(x − max) / Σ exp(x − max)`, and for the loss `Σ g ∘ y`,
    /// `∂/∂x_i = y_i (g_i − Σ_j g_j y_j)` (to 1e-5 of `y_i (|g_i| + Σ_j |g_j| y_j)`). Rows of several lengths (one, shorter than a vector,
    /// not a multiple of one, long), scores as wide as a trained model's (±40), and a
    /// transposed (non-contiguous) input, as Efficient Attention feeds it.
    #[test]
    fn softmax_matches_float64() {
        let device = Device::flex().autodiff();
        for (rows, row_len, transposed) in [
            (7, 1, false),
            (40, 5, false),
            (33, 37, false),
            (6, 2001, false),
            (300, 24, true),
        ] {
            let shape = if transposed {
                [2, row_len, rows / 2]
            } else {
                [1, rows, row_len]
            };
            let x = Tensor::<3>::random(shape, Distribution::Uniform(-40.0, 40.0), &device)
                .require_grad();
            let input = if transposed {
                x.clone().swap_dims(1, 2)
            } else {
                x.clone()
            };
            let dims = input.dims();
            let g = Tensor::<3>::random(dims, Distribution::Normal(0.0, 1.0), &device);
            let y = super::softmax(input.clone());
            let grads = (y.clone() * g.clone()).sum().backward();
            let dx = input.grad(&grads).unwrap_or_else(|| {
                // The gradient reaches the swapped view through `x`.
                x.grad(&grads).unwrap().swap_dims(1, 2)
            });
            let values = |t: Tensor<3>| t.into_data().iter::<f32>().collect::<Vec<_>>();
            let (x, g, y, dx) = (
                values(input.inner()),
                values(g.inner()),
                values(y.inner()),
                values(dx),
            );
            let len = dims[2];
            for r in 0..x.len() / len {
                let row = r * len..(r + 1) * len;
                let max = x[row.clone()]
                    .iter()
                    .fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
                let e: Vec<f64> = x[row.clone()]
                    .iter()
                    .map(|&v| (v as f64 - max).exp())
                    .collect();
                let sum: f64 = e.iter().sum();
                let want: Vec<f64> = e.iter().map(|v| v / sum).collect();
                let dot: f64 = want
                    .iter()
                    .zip(&g[row.clone()])
                    .map(|(y, &g)| y * g as f64)
                    .sum();
                // The scale of the terms `g_i − Σ g_j y_j` cancels: the bound is relative to it.
                let size: f64 = want
                    .iter()
                    .zip(&g[row.clone()])
                    .map(|(y, &g)| y * (g as f64).abs())
                    .sum();
                for (j, i) in row.enumerate() {
                    let err = (y[i] as f64 - want[j]).abs();
                    assert!(
                        err <= 1e-6 * want[j] + 1e-9,
                        "softmax row {r} ({len}) [{j}] = {} against {}",
                        y[i],
                        want[j]
                    );
                    let grad = want[j] * (g[i] as f64 - dot);
                    assert!(
                        (dx[i] as f64 - grad).abs()
                            <= 1e-5 * want[j] * ((g[i] as f64).abs() + size) + 1e-9,
                        "softmax gradient row {r} ({len}) [{j}] = {} against {grad}",
                        dx[i]
                    );
                }
            }
        }
    }

    /// `erfc` in float64: `1 − erf` from erf's Maclaurin series for |x| < 3, Lentz's continued
    /// fraction `erfc(x) = exp(−x²)/√π · 1/(x + 1/2/(x + 1/(x + 3/2/(x + …))))` for x ≥ 3.
    fn erfc64(x: f64) -> f64 {
        if x.abs() < 3.0 {
            // erf(x) = 2/√π Σ (−1)^n x^(2n+1) / (n! (2n+1))
            let mut term = x;
            let mut sum = x;
            for n in 1..200 {
                term *= -x * x / n as f64;
                let add = term / (2 * n + 1) as f64;
                sum += add;
                if add.abs() < 1e-18 {
                    break;
                }
            }
            return 1.0 - 2.0 / std::f64::consts::PI.sqrt() * sum;
        }
        if x < 0.0 {
            return 2.0 - erfc64(-x);
        }
        // Continued fraction evaluated from the tail: K = x + (n/2)/K.
        let mut k = x;
        for n in (1..200).rev() {
            k = x + (n as f64 / 2.0) / k;
        }
        (-x * x).exp() / std::f64::consts::PI.sqrt() / k
    }

    /// [`super::exp`] on an autodiff `flex` device: values against float64 `exp`, and the
    /// gradient of `Σ g ∘ exp(x)`, which is `g ∘ exp(x)`, on inputs in [-30, 5].
    #[test]
    fn exp_values_and_gradient_match_float64() {
        let device = Device::flex().autodiff();
        let x = Tensor::<2>::random([7, 300], Distribution::Uniform(-30.0, 5.0), &device)
            .require_grad();
        let g = Tensor::<2>::random([7, 300], Distribution::Normal(0.0, 1.0), &device);
        let y = super::exp(x.clone());
        let grads = (y.clone() * g.clone()).sum().backward();
        let dx = x.grad(&grads).unwrap();
        let values = |t: Tensor<2>| t.into_data().iter::<f32>().collect::<Vec<_>>();
        let (x, g, y, dx) = (
            values(x.inner()),
            values(g.inner()),
            values(y.inner()),
            values(dx),
        );
        for i in 0..x.len() {
            let want = (x[i] as f64).exp();
            assert!(
                ((y[i] as f64 - want) / want).abs() < 1e-6,
                "exp({}) = {}",
                x[i],
                y[i]
            );
            let want = g[i] as f64 * want;
            assert!(
                (dx[i] as f64 - want).abs() <= 1e-6 * want.abs().max(1e-6),
                "grad at {}",
                x[i]
            );
        }
    }

    /// The shared-pattern gather (on an autodiff `flex` device) equals Burn's `gather` with the
    /// pattern expanded: outputs exactly, and the input's gradient (values read twice or never
    /// included) to round-off; a 5-axis input, and a transposed (non-contiguous) one.
    #[test]
    fn shared_gather_equals_burn_gather() {
        let device = Device::flex().autodiff();
        device.seed(5);
        let (rows, len, cols): (usize, usize, usize) = (6, 9, 11);
        // Row r reads r, r + 1, … wrapping around, and its first column twice.
        let pattern: Vec<i64> = (0..rows * cols)
            .map(|i| {
                let (r, c) = (i / cols, i % cols);
                ((r + c.saturating_sub(1)) % len) as i64
            })
            .collect();
        for transposed in [false, true] {
            let x = if transposed {
                Tensor::<5>::random(
                    [2, 3, 4, len, rows],
                    Distribution::Normal(0.0, 1.0),
                    &device,
                )
                .require_grad()
            } else {
                Tensor::<5>::random(
                    [2, 3, 4, rows, len],
                    Distribution::Normal(0.0, 1.0),
                    &device,
                )
                .require_grad()
            };
            let input = || {
                if transposed {
                    x.clone().swap_dims(3, 4)
                } else {
                    x.clone()
                }
            };
            let g = Tensor::<5>::random(
                [2, 3, 4, rows, cols],
                Distribution::Normal(0.0, 1.0),
                &device,
            );
            let ours = super::gather_shared(input(), &pattern, cols);
            let index = Tensor::<5, Int>::from_data(
                TensorData::new(pattern.clone(), [1, 1, 1, rows, cols]),
                &device,
            )
            .expand([2, 3, 4, rows, cols]);
            let theirs = input().gather(4, index);
            let grad = |y: Tensor<5>| x.grad(&(y * g.clone()).sum().backward()).unwrap();
            let (d_ours, d_theirs) = (grad(ours.clone()), grad(theirs.clone()));
            let err: f32 = (ours - theirs).abs().max().into_scalar();
            assert_eq!(err, 0.0, "transposed {transposed}: outputs");
            let err: f32 = (d_ours - d_theirs).abs().max().into_scalar();
            assert!(
                err <= 1e-6,
                "transposed {transposed}: gradients differ by {err}"
            );
        }
    }

    /// The selection of slices (on an autodiff `flex` device) equals Burn's `select`: outputs
    /// exactly, the input's gradient to round-off, along the first, a middle and the last axis,
    /// rows repeated and left out, on a transposed (non-contiguous) input too.
    #[test]
    fn select_rows_equals_burn_select() {
        let device = Device::flex().autodiff();
        device.seed(6);
        let rows = [3, 0, 3, 5, 1];
        for (dim, transposed) in [(0, false), (1, false), (3, false), (1, true)] {
            let x = Tensor::<4>::random([6, 7, 2, 6], Distribution::Normal(0.0, 1.0), &device)
                .require_grad();
            let input = || {
                if transposed {
                    x.clone().swap_dims(1, 3)
                } else {
                    x.clone()
                }
            };
            let ours = super::select_rows(input(), dim, &rows);
            let index: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
            let index = Tensor::<1, Int>::from_data(TensorData::new(index, [rows.len()]), &device);
            let theirs = input().select(dim, index);
            let g = Tensor::<4>::random(ours.dims(), Distribution::Normal(0.0, 1.0), &device);
            let grad = |y: Tensor<4>| x.grad(&(y * g.clone()).sum().backward()).unwrap();
            let (d_ours, d_theirs) = (grad(ours.clone()), grad(theirs.clone()));
            let err: f32 = (ours - theirs).abs().max().into_scalar();
            assert_eq!(err, 0.0, "axis {dim}, transposed {transposed}: outputs");
            let err: f32 = (d_ours - d_theirs).abs().max().into_scalar();
            assert!(
                err <= 1e-6,
                "axis {dim}, transposed {transposed}: gradients differ by {err}"
            );
        }
    }

    /// The fused LayerNorm (on an autodiff `flex` device) equals Burn's composed one: outputs,
    /// and the gradients of the input, the scale and the bias, relative 1e-4, at the scales a
    /// trained model's residual stream reaches (inputs of mean 3 and spread 1 to 30 a row),
    /// rows of 64 and 200, a padded-looking batch of zero rows included.
    #[test]
    fn fused_layer_norm_equals_burn_composed() {
        let device = Device::flex().autodiff();
        device.seed(3);
        for d in [64, 200] {
            let mut norm = burn::nn::LayerNormConfig::new(d)
                .with_epsilon(1e-6)
                .init(&device);
            norm.gamma = burn::module::Param::from_tensor(Tensor::random(
                [d],
                Distribution::Normal(1.0, 0.3),
                &device,
            ));
            norm.beta = Some(burn::module::Param::from_tensor(Tensor::random(
                [d],
                Distribution::Normal(0.0, 0.3),
                &device,
            )));
            // Enough rows for the fused path (`FUSED_LAYER_NORM_MIN` elements).
            let rows = super::FUSED_LAYER_NORM_MIN.div_ceil(2 * d);
            let spread =
                Tensor::<3>::random([2, rows, 1], Distribution::Uniform(1.0, 30.0), &device);
            let x = Tensor::<3>::random([2, rows, d], Distribution::Normal(0.0, 1.0), &device)
                .mul(spread)
                .add_scalar(3.0);
            // Two rows of zeros (a padded position's embedding, say).
            let zeros = Tensor::<3>::zeros([2, 2, d], &device);
            let x = Tensor::cat(vec![x, zeros], 1);
            let g = Tensor::<3>::random([2, rows + 2, d], Distribution::Normal(0.0, 1.0), &device);
            let run = |fused: bool| {
                let x = x.clone().require_grad();
                let y = if fused {
                    super::layer_norm(&norm, x.clone(), 1e-6)
                } else {
                    norm.forward(x.clone())
                };
                let grads = (y.clone() * g.clone()).sum().backward();
                let beta = norm.beta.as_ref().unwrap().val();
                [
                    y.inner(),
                    x.grad(&grads).unwrap(),
                    norm.gamma.val().grad(&grads).unwrap().unsqueeze::<3>(),
                    beta.grad(&grads).unwrap().unsqueeze::<3>(),
                ]
            };
            let (fused, composed) = (run(true), run(false));
            for (what, (a, b)) in ["output", "input", "scale", "bias"]
                .iter()
                .zip(fused.into_iter().zip(composed))
            {
                let scale: f32 = b.clone().abs().max().into_scalar();
                let err: f32 = (a - b).abs().max().into_scalar();
                assert!(
                    err <= 1e-4 * scale.max(1e-3),
                    "d {d}, {what}: {err} against {scale}"
                );
            }
        }
    }
}
