//! Fused softmax attention with its own backward pass, for training on `flex` and on `tch` (CPU).
//!
//! Burn's fused `attention` operation has no backward of its own: under autodiff Burn derives
//! one from the composed steps, which stores the `n × n` weights and walks them several times.
//! This module registers a Burn backend extension whose forward keeps only the log-sum-exp of
//! each score row and whose backward recomputes the weights tile by tile ([`kernel`]), as
//! FlashAttention does and as PyTorch's CPU `scaled_dot_product_attention` does. Time is the
//! same `O(n² d)`; memory beyond the inputs drops from `O(n²)` to `O(n)` per head. On `tch`
//! (CPU) the same extension calls libtorch's own flash-attention forward and backward.
//!
//! [`try_attention`] is the entry point: it answers `None` wherever the fused path does not
//! apply (another backend, a dtype other than `f32`), and the caller composes the steps.

#[cfg(feature = "flex")]
mod gathered;
mod hash;
#[cfg(feature = "flex")]
mod kernel;
mod mask;
#[cfg(feature = "flex")]
mod simd;

use std::sync::Arc;

use burn::prelude::*;

use crate::core::key_slots::KeySlots;
pub(crate) use mask::DropMask;

/// Key-padding flags shared between the forward and backward passes (`[batch, n_k]`,
/// `true` = padding).
pub(crate) type KeyPadding = Option<Arc<[bool]>>;

/// Fused softmax attention `softmax(scale · q kᵀ + masks) v` on `[batch, heads, n, d]` tensors
/// when the backend has the fused kernel, `None` otherwise (the caller then composes the steps).
///
/// Masked scores are replaced by [`MASK_FILL`](crate::core::input::MASK_FILL), as in the composed
/// path, so the two agree to rounding, masks included; a dropout mask drops the weights the
/// composed path given the same mask drops (`flex` only: libtorch's CPU kernel has no dropout).
pub(crate) fn try_attention(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    mask_pad: Option<&Tensor<2, Bool>>,
    causal: bool,
    scale: f32,
    dropout: Option<DropMask>,
) -> Option<Tensor<4>> {
    #[cfg(any(feature = "flex", feature = "tch"))]
    {
        let all_f32 = [q, k, v]
            .iter()
            .all(|t| t.dtype() == burn::tensor::DType::F32);
        let n_q = q.dims()[2];
        let n_k = k.dims()[2];
        let same_head_size = q.dims()[3] == v.dims()[3];
        if !has_kernel(&q.device(), same_head_size) || !all_f32 || n_q == 0 || n_k == 0 {
            return None;
        }
        #[cfg(feature = "flex")]
        let has_dropout = dropout.is_some() && is_flex(&q.device());
        #[cfg(not(feature = "flex"))]
        let has_dropout = false;
        if dropout.is_some() && !has_dropout {
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

/// Fused softmax attention over gathered keys (see [`gathered_attention`](crate::core::sparse::gathered_attention)):
/// the output `[batch, heads, n_q, d_v]` and log-sum-exp `[batch, heads, n_q, 1]`, both
/// differentiable, when the backend has the kernel (`flex`, `f32`), `None` otherwise. Its
/// backward recomputes the weights block by block: memory beyond inputs and outputs is one
/// block's buffers per thread, whatever the number of attended pairs.
pub(crate) fn try_gathered_attention(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    slots: &Arc<KeySlots>,
    scale: f32,
    dropout: Option<DropMask>,
) -> Option<(Tensor<4>, Tensor<4>)> {
    #[cfg(feature = "flex")]
    {
        let all_f32 = [q, k, v]
            .iter()
            .all(|t| t.dtype() == burn::tensor::DType::F32);
        let [batch, heads, n_q, _] = q.dims();
        let d_v = v.dims()[3];
        if !is_flex(&q.device()) || !all_f32 || n_q == 0 || k.dims()[2] == 0 {
            return None;
        }
        // One tensor holds both outputs (the log-sum-exp as an extra column), so that one
        // backward receives the gradients of both.
        let joint = <burn::backend::Dispatch as GatheredAttention>::gathered_attention(
            q.clone().into_dispatch(),
            k.clone().into_dispatch(),
            v.clone().into_dispatch(),
            slots.clone(),
            scale,
            dropout,
        );
        let joint = Tensor::<4>::from_dispatch(joint);
        let out = joint.clone().slice([0..batch, 0..heads, 0..n_q, 0..d_v]);
        let lse = joint.slice([0..batch, 0..heads, 0..n_q, d_v..d_v + 1]);
        Some((out, lse))
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = (q, k, v, slots, scale, dropout);
        None
    }
}

/// `x.exp()`, on `flex` (f32) through the vectorised exponential of the fused kernel, whose
/// inputs are clamped to [-87.3, 88.7]; for callers whose arguments are at most 0 (stabilised
/// random features), where the clamp only turns results below 1e-38 into about 1e-38.
pub(crate) fn exp<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if is_flex(&x.device()) && x.dtype() == burn::tensor::DType::F32 {
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
    if is_flex(&x.device()) && x.dtype() == burn::tensor::DType::F32 {
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
    if is_flex(&x.device()) && x.dtype() == burn::tensor::DType::F32 {
        return Tensor::from_dispatch(<burn::backend::Dispatch as FlashAttention>::vector_softmax(
            x.into_dispatch(),
        ));
    }
    burn::tensor::activation::softmax(x, D - 1)
}

/// `elu(x) + 1`, on `flex` (f32) in one vectorised pass with a backward that keeps only the
/// output; elsewhere as `max(x, 0) + exp(min(x, 0))` (the same values and gradients).
pub(crate) fn elu_plus_one<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if is_flex(&x.device()) && x.dtype() == burn::tensor::DType::F32 {
        return Tensor::from_dispatch(
            <burn::backend::Dispatch as FlashAttention>::vector_elu_plus_one(x.into_dispatch()),
        );
    }
    x.clone().clamp_min(0.0) + x.clamp_max(0.0).exp()
}

/// Whether `device` (or the device an autodiff device wraps) has the fused kernel: `flex`, and
/// libtorch on the CPU (its own flash-attention kernels), which needs queries, keys and values
/// of one head size (`same_head_size`; the factorised Synthesizer's are not).
#[cfg(any(feature = "flex", feature = "tch"))]
#[allow(deprecated)] // burn-tch's device, see the `libtorch` module
fn has_kernel(device: &Device, same_head_size: bool) -> bool {
    #[cfg(not(feature = "tch"))]
    let _ = same_head_size;
    #[cfg(feature = "flex")]
    if is_flex(device) {
        return true;
    }
    #[cfg(feature = "tch")]
    if same_head_size
        && matches!(
            device.as_dispatch().clone().inner(),
            burn::backend::DispatchDevice::LibTorch(burn::backend::libtorch::LibTorchDevice::Cpu)
        )
    {
        return true;
    }
    false
}

/// Whether `device` is `flex`, or an autodiff device wrapping it.
#[cfg(feature = "flex")]
pub(crate) fn is_flex(device: &Device) -> bool {
    matches!(
        device.as_dispatch().clone().inner(),
        burn::backend::DispatchDevice::Flex(_)
    )
}

#[cfg(any(feature = "flex", feature = "tch"))]
use extension::FlashAttention;

#[cfg(any(feature = "flex", feature = "tch"))]
#[allow(deprecated)] // burn-tch's backend, see the `libtorch` module
mod extension {
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Backend, backend_extension};

    use super::DropMask;
    use super::KeyPadding;

    /// The backend extension: fused attention whose autodiff form has a handwritten backward.
    #[backend_extension(Flex: cfg(feature = "flex"), LibTorch: cfg(feature = "tch"), Autodiff)]
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

        /// Element-wise `exp`. On `flex`, a vectorised exponential (about 2 ulp, inputs
        /// clamped to [-87.3, 88.7]) in place of the backend's scalar `expf`; elsewhere the
        /// backend's own.
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
    use crate::core::key_slots::KeySlots;

    /// The backend extension: fused attention over gathered keys, with a handwritten backward.
    #[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
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
    }
}

#[cfg(feature = "flex")]
mod flex {
    use burn::backend::autodiff::NodeId;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::ops::FloatTensorOps;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::TensorData;
    use std::sync::Arc;

    use super::DropMask;
    use super::kernel::{self, Dims, Scoring};
    use super::{FlashAttention, GatheredAttention, KeyPadding, gathered};
    use crate::core::key_slots::KeySlots;

    /// A `flex` tensor as a contiguous `f32` vector and its shape. Per-head views
    /// (`[batch, n, heads, d]` storage seen as `[batch, heads, n, d]`) are gathered a row of `d`
    /// at a time, not element by element.
    fn host(tensor: FloatTensor<Flex>) -> (Vec<f32>, Vec<usize>) {
        let layout = tensor.layout();
        let shape = layout.shape().to_vec();
        if let Some(values) = tensor.as_slice::<f32>() {
            return (values.to_vec(), shape);
        }
        let strides = layout.strides();
        if shape.len() == 4 && strides[3] == 1 && strides.iter().all(|&s| s >= 0) {
            let storage = tensor.storage::<f32>();
            let [s0, s1, s2] = [0, 1, 2].map(|i| strides[i] as usize);
            let row = shape[3];
            let mut values = Vec::with_capacity(shape.iter().product());
            for a in 0..shape[0] {
                for b in 0..shape[1] {
                    for c in 0..shape[2] {
                        let start = layout.start_offset() + a * s0 + b * s1 + c * s2;
                        values.extend_from_slice(&storage[start..start + row]);
                    }
                }
            }
            return (values, shape);
        }
        let values = tensor
            .into_data()
            .try_into_vec::<f32>()
            .expect("the fused attention path is only taken for f32 tensors");
        (values, shape)
    }

    fn device_tensor(values: Vec<f32>, shape: [usize; 4]) -> FloatTensor<Flex> {
        burn::backend::flex::FlexTensor::from_data(TensorData::new(values, shape))
    }

    /// Hands the gradients of `q`, `k` and `v` (contiguous, shaped by `dims`) to the parents
    /// that track one.
    fn register_qkv_grads(
        grads: &mut Gradients,
        parents: [Option<NodeId>; 3],
        [dq, dk, dv]: [Vec<f32>; 3],
        dims: Dims,
    ) {
        for (node, grad, shape) in [
            (parents[0], dq, dims.q_shape()),
            (parents[1], dk, dims.k_shape()),
            (parents[2], dv, dims.v_shape()),
        ] {
            if let Some(node) = node {
                grads.register::<Flex>(node, device_tensor(grad, shape));
            }
        }
    }

    /// Inputs of one call on the host.
    #[derive(Debug, Clone)]
    struct Host {
        q: Arc<Vec<f32>>,
        k: Arc<Vec<f32>>,
        v: Arc<Vec<f32>>,
        dims: Dims,
    }

    impl Host {
        fn new(q: FloatTensor<Flex>, k: FloatTensor<Flex>, v: FloatTensor<Flex>) -> Self {
            let (q, q_shape) = host(q);
            let (k, k_shape) = host(k);
            let (v, v_shape) = host(v);
            let dims = Dims {
                batch: q_shape[0],
                heads: q_shape[1],
                n_q: q_shape[2],
                n_k: k_shape[2],
                d: q_shape[3],
                d_v: v_shape[3],
            };
            Self {
                q: Arc::new(q),
                k: Arc::new(k),
                v: Arc::new(v),
                dims,
            }
        }

        fn forward(
            &self,
            key_padding: &KeyPadding,
            scale: f32,
            causal: bool,
            dropout: Option<DropMask>,
        ) -> (Vec<f32>, Vec<f32>) {
            kernel::forward(
                &self.q,
                &self.k,
                &self.v,
                self.dims,
                Scoring {
                    scale,
                    causal,
                    key_padding: key_padding.as_deref(),
                    dropout,
                },
            )
        }
    }

    impl FlashAttention for Flex {
        fn flash_attention(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            key_padding: KeyPadding,
            scale: f32,
            causal: bool,
            dropout: Option<DropMask>,
        ) -> FloatTensor<Self> {
            let host = Host::new(q, k, v);
            let (out, _) = host.forward(&key_padding, scale, causal, dropout);
            device_tensor(out, host.dims.out_shape())
        }

        fn vector_exp(x: FloatTensor<Self>) -> FloatTensor<Self> {
            in_place(x, kernel::exp_in_place)
        }

        fn vector_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
            in_place(x, kernel::gelu_in_place)
        }

        fn vector_elu_plus_one(x: FloatTensor<Self>) -> FloatTensor<Self> {
            in_place(x, kernel::elu_plus_one_in_place)
        }

        fn vector_softmax(x: FloatTensor<Self>) -> FloatTensor<Self> {
            let (mut values, shape) = host(x);
            kernel::softmax_rows_in_place(&mut values, shape.last().copied().unwrap_or(1));
            burn::backend::flex::FlexTensor::from_data(TensorData::new(values, shape))
        }
    }

    /// `f` applied to a copy of `x`'s values.
    fn in_place(x: FloatTensor<Flex>, f: fn(&mut [f32])) -> FloatTensor<Flex> {
        let (mut values, shape) = host(x);
        f(&mut values);
        burn::backend::flex::FlexTensor::from_data(TensorData::new(values, shape))
    }

    /// The backward of an operation whose input gradient is computed in place from the output
    /// gradient and one saved tensor (the input or the output), by `chain(grad, saved, row_len)`
    /// with `row_len` the length of the last axis: element-wise (`grad ∘ f′`, `row_len` unused)
    /// or row by row over the last axis (softmax).
    #[derive(Debug)]
    struct SavedTensorBackward(fn(&mut [f32], &[f32], usize));

    impl Backward<Flex, 1> for SavedTensorBackward {
        type State = FloatTensor<Flex>;

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
            let [node] = ops.parents;
            let grad = grads.consume::<Flex>(&ops.node);
            if let Some(node) = node {
                let (mut grad, shape) = host(grad);
                let row_len = shape.last().copied().unwrap_or(1);
                // The saved output is the kernel's own contiguous tensor: read in place.
                match ops.state.as_slice::<f32>() {
                    Some(saved) => (self.0)(&mut grad, saved, row_len),
                    None => (self.0)(&mut grad, &host(ops.state).0, row_len),
                }
                let grad = burn::backend::flex::FlexTensor::from_data(TensorData::new(grad, shape));
                grads.register::<Flex>(node.id, grad);
            }
        }
    }

    /// A one-input operation `forward` under autodiff, its backward `chain` (see
    /// [`SavedTensorBackward`]); the state is the input when `saves_input`, else the output.
    fn tracked_unary<C: CheckpointStrategy>(
        x: FloatTensor<Autodiff<Flex, C>>,
        forward: fn(FloatTensor<Flex>) -> FloatTensor<Flex>,
        chain: fn(&mut [f32], &[f32], usize),
        saves_input: bool,
    ) -> FloatTensor<Autodiff<Flex, C>> {
        match SavedTensorBackward(chain)
            .prepare::<C>([x.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let input = x.primitive().clone();
                let out = forward(input.clone());
                let state = if saves_input { input } else { out.clone() };
                prep.finish(state, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(forward(x.into_primitive())),
        }
    }

    /// `d exp(x) = exp(x) dx`: the backward keeps the output.
    #[derive(Debug)]
    struct ExpBackward;

    impl Backward<Flex, 1> for ExpBackward {
        type State = FloatTensor<Flex>;

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
            let [node] = ops.parents;
            let grad = grads.consume::<Flex>(&ops.node);
            if let Some(node) = node {
                grads.register::<Flex>(node.id, Flex::float_mul(grad, ops.state));
            }
        }
    }

    /// What the backward pass keeps: the inputs, the output (the contiguous tensor handed
    /// on, shared rather than copied) and its log-sum-exp rows.
    #[derive(Debug, Clone)]
    struct Saved {
        host: Host,
        out: FloatTensor<Flex>,
        lse: Arc<Vec<f32>>,
        key_padding: KeyPadding,
        scale: f32,
        causal: bool,
        dropout: Option<DropMask>,
    }

    #[derive(Debug)]
    struct FlashBackward;

    impl Backward<Flex, 3> for FlashBackward {
        type State = Saved;

        fn backward(self, ops: Ops<Saved, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
            let parents = ops.parents.map(|node| node.map(|node| node.id));
            let (d_out, _) = host(grads.consume::<Flex>(&ops.node));
            let saved = ops.state;
            let host = &saved.host;
            let (dq, dk, dv) = kernel::backward(
                &host.q,
                &host.k,
                &host.v,
                saved
                    .out
                    .as_slice::<f32>()
                    .expect("the kernel's output tensor is contiguous f32"),
                &saved.lse,
                &d_out,
                host.dims,
                Scoring {
                    scale: saved.scale,
                    causal: saved.causal,
                    key_padding: saved.key_padding.as_deref(),
                    dropout: saved.dropout,
                },
            );
            register_qkv_grads(grads, parents, [dq, dk, dv], host.dims);
        }
    }

    impl<C: CheckpointStrategy> FlashAttention for Autodiff<Flex, C> {
        fn flash_attention(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            key_padding: KeyPadding,
            scale: f32,
            causal: bool,
            dropout: Option<DropMask>,
        ) -> FloatTensor<Self> {
            match FlashBackward
                .prepare::<C>([q.node(), k.node(), v.node()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => {
                    let host = Host::new(
                        q.primitive().clone(),
                        k.primitive().clone(),
                        v.primitive().clone(),
                    );
                    let (out, lse) = host.forward(&key_padding, scale, causal, dropout);
                    let out = device_tensor(out, host.dims.out_shape());
                    let saved = Saved {
                        host,
                        out: out.clone(),
                        lse: Arc::new(lse),
                        key_padding,
                        scale,
                        causal,
                        dropout,
                    };
                    prep.finish(saved, out)
                }
                OpsKind::UnTracked(prep) => prep.finish(Flex::flash_attention(
                    q.into_primitive(),
                    k.into_primitive(),
                    v.into_primitive(),
                    key_padding,
                    scale,
                    causal,
                    dropout,
                )),
            }
        }

        fn vector_exp(x: FloatTensor<Self>) -> FloatTensor<Self> {
            match ExpBackward
                .prepare::<C>([x.node()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => {
                    let out = Flex::vector_exp(x.primitive().clone());
                    prep.finish(out.clone(), out)
                }
                OpsKind::UnTracked(prep) => prep.finish(Flex::vector_exp(x.into_primitive())),
            }
        }

        fn vector_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
            tracked_unary::<C>(
                x,
                Flex::vector_gelu,
                |grad, x, _| kernel::gelu_grad_in_place(grad, x),
                true,
            )
        }

        fn vector_softmax(x: FloatTensor<Self>) -> FloatTensor<Self> {
            tracked_unary::<C>(
                x,
                Flex::vector_softmax,
                kernel::softmax_rows_grad_in_place,
                false,
            )
        }

        fn vector_elu_plus_one(x: FloatTensor<Self>) -> FloatTensor<Self> {
            tracked_unary::<C>(
                x,
                Flex::vector_elu_plus_one,
                |grad, y, _| kernel::elu_plus_one_grad_in_place(grad, y),
                false,
            )
        }
    }

    /// A `flex` tensor held for the gathered kernel to read in place: the tensor itself (its
    /// storage shared, not copied) and where its rows lie. A layout that is not a view of rows
    /// (a negative or non-unit last stride) is copied contiguous first.
    #[derive(Debug, Clone)]
    struct Held {
        tensor: FloatTensor<Flex>,
        shape: [usize; 4],
        start: usize,
        strides: [usize; 3],
    }

    impl Held {
        fn new(tensor: FloatTensor<Flex>) -> Self {
            let layout = tensor.layout();
            let shape: [usize; 4] = layout
                .shape()
                .to_vec()
                .try_into()
                .expect("per-head tensors have four axes");
            let strides = layout.strides();
            if strides[3] == 1 && strides.iter().all(|&s| s >= 0) {
                return Self {
                    start: layout.start_offset(),
                    strides: [0, 1, 2].map(|a| strides[a] as usize),
                    tensor,
                    shape,
                };
            }
            let (values, _) = host(tensor);
            let [_, h, n, w] = shape;
            Self {
                tensor: device_tensor(values, shape),
                shape,
                start: 0,
                strides: [h * n * w, n * w, w],
            }
        }

        fn rows(&self) -> gathered::Rows<'_> {
            gathered::Rows::new(
                self.tensor.storage::<f32>(),
                self.shape,
                self.start,
                self.strides,
            )
        }
    }

    /// The queries, keys and values of a gathered call, held in place.
    #[derive(Debug, Clone)]
    struct HeldInputs {
        q: Held,
        k: Held,
        v: Held,
    }

    impl HeldInputs {
        fn new(q: FloatTensor<Flex>, k: FloatTensor<Flex>, v: FloatTensor<Flex>) -> Self {
            Self {
                q: Held::new(q),
                k: Held::new(k),
                v: Held::new(v),
            }
        }

        fn dims(&self) -> Dims {
            let [batch, heads, n_q, d] = self.q.shape;
            Dims {
                batch,
                heads,
                n_q,
                n_k: self.k.shape[2],
                d,
                d_v: self.v.shape[3],
            }
        }

        fn rows(&self) -> gathered::Inputs<'_> {
            gathered::Inputs {
                q: self.q.rows(),
                k: self.k.rows(),
                v: self.v.rows(),
            }
        }

        fn forward(
            &self,
            slots: &KeySlots,
            scale: f32,
            dropout: Option<DropMask>,
        ) -> gathered::Forward {
            gathered::forward(self.rows(), self.dims(), slots, scale, dropout)
        }
    }

    /// The forward output and log-sum-exp as one `[batch, heads, n_q, d_v + 1]` tensor.
    fn joint_tensor(forward: &gathered::Forward, dims: Dims) -> FloatTensor<Flex> {
        let d_v = dims.d_v;
        let mut joint = Vec::with_capacity(forward.lse.len() * (d_v + 1));
        for (row, &l) in forward.out.chunks(d_v.max(1)).zip(&forward.lse) {
            joint.extend_from_slice(&row[..d_v]);
            joint.push(l);
        }
        let [b, h, n_q, _] = dims.out_shape();
        device_tensor(joint, [b, h, n_q, d_v + 1])
    }

    impl GatheredAttention for Flex {
        fn gathered_attention(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            slots: Arc<KeySlots>,
            scale: f32,
            dropout: Option<DropMask>,
        ) -> FloatTensor<Self> {
            let inputs = HeldInputs::new(q, k, v);
            joint_tensor(&inputs.forward(&slots, scale, dropout), inputs.dims())
        }
    }

    /// What the gathered backward keeps: inputs and the forward pass (`O(n d)` per head).
    #[derive(Debug, Clone)]
    struct GatheredSaved {
        inputs: HeldInputs,
        forward: Arc<gathered::Forward>,
        slots: Arc<KeySlots>,
        scale: f32,
        dropout: Option<DropMask>,
    }

    #[derive(Debug)]
    struct GatheredBackward;

    impl Backward<Flex, 3> for GatheredBackward {
        type State = GatheredSaved;

        fn backward(self, ops: Ops<GatheredSaved, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
            let parents = ops.parents.map(|node| node.map(|node| node.id));
            let (joint, _) = host(grads.consume::<Flex>(&ops.node));
            let saved = ops.state;
            let dims = saved.inputs.dims();
            let d_v = dims.d_v;
            let mut d_out = Vec::with_capacity(saved.forward.out.len());
            let mut d_lse = Vec::with_capacity(saved.forward.lse.len());
            for row in joint.chunks(d_v + 1) {
                d_out.extend_from_slice(&row[..d_v]);
                d_lse.push(row[d_v]);
            }
            let (dq, dk, dv) = gathered::backward(
                saved.inputs.rows(),
                dims,
                &saved.slots,
                saved.scale,
                saved.dropout,
                gathered::Upstream {
                    forward: &saved.forward,
                    d_out: &d_out,
                    d_lse: Some(&d_lse),
                },
            );
            register_qkv_grads(grads, parents, [dq, dk, dv], dims);
        }
    }

    impl<C: CheckpointStrategy> GatheredAttention for Autodiff<Flex, C> {
        fn gathered_attention(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            slots: Arc<KeySlots>,
            scale: f32,
            dropout: Option<DropMask>,
        ) -> FloatTensor<Self> {
            match GatheredBackward
                .prepare::<C>([q.node(), k.node(), v.node()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => {
                    let inputs = HeldInputs::new(
                        q.primitive().clone(),
                        k.primitive().clone(),
                        v.primitive().clone(),
                    );
                    let forward = inputs.forward(&slots, scale, dropout);
                    let joint = joint_tensor(&forward, inputs.dims());
                    let saved = GatheredSaved {
                        inputs,
                        forward: Arc::new(forward),
                        slots,
                        scale,
                        dropout,
                    };
                    prep.finish(saved, joint)
                }
                OpsKind::UnTracked(prep) => prep.finish(Flex::gathered_attention(
                    q.into_primitive(),
                    k.into_primitive(),
                    v.into_primitive(),
                    slots,
                    scale,
                    dropout,
                )),
            }
        }
    }
}

/// libtorch on the CPU: its own flash-attention kernels (`_scaled_dot_product_flash_attention_for_cpu`
/// and its backward, what PyTorch's `scaled_dot_product_attention` runs there), so that training
/// on `tch` keeps the log-sum-exp instead of the `n × n` weights, as PyTorch does.
// burn-tch is marked deprecated in Burn 0.22 but is the project's `tch` backend.
#[cfg(feature = "tch")]
#[allow(deprecated)]
mod libtorch {
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::libtorch::TchTensor;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Autodiff, LibTorch};

    use super::DropMask;
    use super::{FlashAttention, KeyPadding};
    use crate::core::input::MASK_FILL;

    /// The key-padding flags as an additive mask `[batch, 1, 1, n_k]`: `MASK_FILL` on padding.
    /// A row with at least one real key gets the same weights as replacing its padded scores;
    /// padded scores lie some 10⁴ below the real ones, so their weights underflow to zero.
    fn additive_mask(
        key_padding: &KeyPadding,
        q: &TchTensor,
        k: &TchTensor,
    ) -> Option<tch::Tensor> {
        key_padding.as_ref().map(|flags| {
            let batch = q.tensor.size()[0];
            let n_k = k.tensor.size()[2];
            let values: Vec<f32> = flags
                .iter()
                .map(|&pad| if pad { MASK_FILL } else { 0.0 })
                .collect();
            tch::Tensor::from_slice(&values)
                .reshape([batch, 1, 1, n_k])
                .to_device(q.tensor.device())
        })
    }

    fn forward(
        q: &TchTensor,
        k: &TchTensor,
        v: &TchTensor,
        mask: Option<&tch::Tensor>,
        scale: f32,
        causal: bool,
    ) -> (tch::Tensor, tch::Tensor) {
        tch::Tensor::internal_scaled_dot_product_flash_attention_for_cpu(
            &q.tensor,
            &k.tensor,
            &v.tensor,
            0.0,
            causal,
            mask,
            scale as f64,
        )
    }

    impl FlashAttention for LibTorch {
        fn flash_attention(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            key_padding: KeyPadding,
            scale: f32,
            causal: bool,
            dropout: Option<DropMask>,
        ) -> FloatTensor<Self> {
            assert!(
                dropout.is_none(),
                "libtorch's CPU flash attention has no dropout"
            );
            let mask = additive_mask(&key_padding, &q, &k);
            let (out, _) = forward(&q, &k, &v, mask.as_ref(), scale, causal);
            TchTensor::new(out)
        }
    }

    /// What the backward pass keeps: inputs, output, log-sum-exp and mask.
    #[derive(Debug, Clone)]
    struct Saved {
        q: TchTensor,
        k: TchTensor,
        v: TchTensor,
        out: TchTensor,
        lse: TchTensor,
        mask: Option<TchTensor>,
        scale: f32,
        causal: bool,
    }

    #[derive(Debug)]
    struct TorchFlashBackward;

    impl Backward<LibTorch, 3> for TorchFlashBackward {
        type State = Saved;

        fn backward(self, ops: Ops<Saved, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
            let [node_q, node_k, node_v] = ops.parents;
            let grad = grads.consume::<LibTorch>(&ops.node);
            let s = ops.state;
            let (dq, dk, dv) =
                tch::Tensor::internal_scaled_dot_product_flash_attention_for_cpu_backward(
                    &grad.tensor,
                    &s.q.tensor,
                    &s.k.tensor,
                    &s.v.tensor,
                    &s.out.tensor,
                    &s.lse.tensor,
                    0.0,
                    s.causal,
                    s.mask.as_ref().map(|m| &m.tensor),
                    s.scale as f64,
                );
            for (node, grad) in [(node_q, dq), (node_k, dk), (node_v, dv)] {
                if let Some(node) = node {
                    grads.register::<LibTorch>(node.id, TchTensor::new(grad));
                }
            }
        }
    }

    impl<C: CheckpointStrategy> FlashAttention for Autodiff<LibTorch, C> {
        fn flash_attention(
            q: FloatTensor<Self>,
            k: FloatTensor<Self>,
            v: FloatTensor<Self>,
            key_padding: KeyPadding,
            scale: f32,
            causal: bool,
            dropout: Option<DropMask>,
        ) -> FloatTensor<Self> {
            assert!(
                dropout.is_none(),
                "libtorch's CPU flash attention has no dropout"
            );
            match TorchFlashBackward
                .prepare::<C>([q.node(), k.node(), v.node()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => {
                    let (q, k, v) = (
                        q.primitive().clone(),
                        k.primitive().clone(),
                        v.primitive().clone(),
                    );
                    let mask = additive_mask(&key_padding, &q, &k);
                    let (out, lse) = forward(&q, &k, &v, mask.as_ref(), scale, causal);
                    let out = TchTensor::new(out);
                    let saved = Saved {
                        q,
                        k,
                        v,
                        out: out.clone(),
                        lse: TchTensor::new(lse),
                        mask: mask.map(TchTensor::new),
                        scale,
                        causal,
                    };
                    prep.finish(saved, out)
                }
                OpsKind::UnTracked(prep) => prep.finish(LibTorch::flash_attention(
                    q.into_primitive(),
                    k.into_primitive(),
                    v.into_primitive(),
                    key_padding,
                    scale,
                    causal,
                    dropout,
                )),
            }
        }
    }
}

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
}
