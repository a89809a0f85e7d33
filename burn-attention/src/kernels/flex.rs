//! The fused kernels on `flex`: the forward operations of the backend extensions, and the
//! tensors the kernels read (copied to the host, or held in place). Their autodiff forms are in
//! `flex_autodiff`.

use burn::backend::Flex;
use burn::backend::tensor::FloatTensor;
use burn::tensor::TensorData;
use std::sync::Arc;

use super::DropMask;
use super::kernel::{self, Dims, Scoring};
use super::recurrence::{self, RecurrenceDims};
use super::shared_gather::{self, GatherDims, SelectDims};
use super::{
    FlashAttention, GatheredAttention, KeyPadding, LinearRecurrence, RecurrenceForm, RowGather,
    gathered,
};
use crate::kernels::key_slots::KeySlots;

/// A `flex` tensor as a contiguous `f32` vector and its shape. Per-head views
/// (`[batch, n, heads, d]` storage seen as `[batch, heads, n, d]`) are gathered a row of `d`
/// at a time, not element by element.
pub(super) fn host(tensor: FloatTensor<Flex>) -> (Vec<f32>, Vec<usize>) {
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

pub(super) fn device_tensor(values: Vec<f32>, shape: [usize; 4]) -> FloatTensor<Flex> {
    burn::backend::flex::FlexTensor::from_data(TensorData::new(values, shape))
}

/// Inputs of one call on the host.
#[derive(Debug, Clone)]
pub(super) struct Host {
    pub(super) q: Arc<Vec<f32>>,
    pub(super) k: Arc<Vec<f32>>,
    pub(super) v: Arc<Vec<f32>>,
    pub(super) dims: Dims,
}

impl Host {
    pub(super) fn new(q: FloatTensor<Flex>, k: FloatTensor<Flex>, v: FloatTensor<Flex>) -> Self {
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

    pub(super) fn forward(
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

    fn vector_sigmoid(x: FloatTensor<Self>) -> FloatTensor<Self> {
        in_place(x, kernel::sigmoid_in_place)
    }

    fn vector_silu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        in_place(x, kernel::silu_in_place)
    }

    fn vector_softplus(x: FloatTensor<Self>) -> FloatTensor<Self> {
        in_place(x, kernel::softplus_in_place)
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

/// A `flex` tensor held for the gathered kernel to read in place: the tensor itself (its
/// storage shared, not copied) and where its rows lie. A layout that is not a view of rows
/// (a negative or non-unit last stride) is copied contiguous first.
#[derive(Debug, Clone)]
pub(super) struct Held {
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

    pub(super) fn rows(&self) -> gathered::Rows<'_> {
        gathered::Rows::new(
            self.tensor.storage::<f32>(),
            self.shape,
            self.start,
            self.strides,
        )
    }
}

/// The queries, keys and values of a gathered call, and its learned bias if any, held in place.
#[derive(Debug, Clone)]
pub(super) struct HeldInputs {
    q: Held,
    k: Held,
    v: Held,
    bias: Option<Held>,
}

impl HeldInputs {
    pub(super) fn new(
        q: FloatTensor<Flex>,
        k: FloatTensor<Flex>,
        v: FloatTensor<Flex>,
        bias: Option<FloatTensor<Flex>>,
    ) -> Self {
        Self {
            q: Held::new(q),
            k: Held::new(k),
            v: Held::new(v),
            bias: bias.map(Held::new),
        }
    }

    /// The learned bias's shape, `[batch, heads, n_blocks · block, slots]` (read by the
    /// backward pass only, the `train` feature).
    #[cfg_attr(not(feature = "train"), allow(dead_code))]
    pub(super) fn bias_shape(&self) -> Option<[usize; 4]> {
        self.bias.as_ref().map(|bias| bias.shape)
    }

    pub(super) fn dims(&self) -> Dims {
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

    pub(super) fn rows(&self) -> gathered::Inputs<'_> {
        gathered::Inputs {
            q: self.q.rows(),
            k: self.k.rows(),
            v: self.v.rows(),
            bias: self.bias.as_ref().map(Held::rows),
        }
    }

    pub(super) fn forward(
        &self,
        slots: &KeySlots,
        scale: f32,
        dropout: Option<DropMask>,
    ) -> gathered::Forward {
        gathered::forward(self.rows(), self.dims(), slots, scale, dropout)
    }
}

/// The forward output and log-sum-exp as one `[batch, heads, n_q, d_v + 1]` tensor.
pub(super) fn joint_tensor(forward: &gathered::Forward, dims: Dims) -> FloatTensor<Flex> {
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
        let inputs = HeldInputs::new(q, k, v, None);
        joint_tensor(&inputs.forward(&slots, scale, dropout), inputs.dims())
    }

    fn biased_gathered_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        slots: Arc<KeySlots>,
        scale: f32,
        dropout: Option<DropMask>,
    ) -> FloatTensor<Self> {
        let inputs = HeldInputs::new(q, k, v, Some(bias));
        joint_tensor(&inputs.forward(&slots, scale, dropout), inputs.dims())
    }
}

/// `x` itself where its values lie contiguous in its storage (shared, not copied), else a
/// contiguous copy.
fn contiguous(x: FloatTensor<Flex>) -> FloatTensor<Flex> {
    if x.as_slice::<f32>().is_some() {
        return x;
    }
    let (values, shape) = host(x);
    burn::backend::flex::FlexTensor::from_data(TensorData::new(values, shape))
}

/// The values of a tensor made contiguous by [`contiguous`].
fn values(x: &FloatTensor<Flex>) -> &[f32] {
    x.as_slice::<f32>()
        .expect("the recurrence holds contiguous f32 tensors")
}

/// The inputs of a recurrence call, held contiguous (in place where they already are).
#[derive(Debug, Clone)]
pub(super) struct RecurrenceHost {
    /// `q, k, v, g`.
    tensors: [FloatTensor<Flex>; 4],
    beta: Option<FloatTensor<Flex>>,
    /// Batch and heads.
    outer: [usize; 2],
    pub(super) dims: RecurrenceDims,
}

impl RecurrenceHost {
    /// `beta` `Some` for the delta rule.
    pub(super) fn new(
        tensors: [FloatTensor<Flex>; 4],
        beta: Option<FloatTensor<Flex>>,
        form: RecurrenceForm,
    ) -> Self {
        let tensors = tensors.map(contiguous);
        let beta = beta.map(contiguous);
        let shape = |t: &FloatTensor<Flex>| t.layout().shape().to_vec();
        let (q_shape, v_shape, g_shape) =
            (shape(&tensors[0]), shape(&tensors[2]), shape(&tensors[3]));
        Self {
            beta,
            outer: [q_shape[0], q_shape[1]],
            dims: RecurrenceDims {
                m: q_shape[0] * q_shape[1],
                n: q_shape[2],
                d_k: q_shape[3],
                d_v: v_shape[3],
                decay_width: g_shape[3],
                reverse: form.reverse,
                with_state: form.with_state,
            },
            tensors,
        }
    }

    pub(super) fn inputs(&self) -> recurrence::Inputs<'_> {
        let [q, k, v, g] = &self.tensors;
        recurrence::Inputs {
            q: values(q),
            k: values(k),
            v: values(v),
            g: values(g),
            beta: self.beta.as_ref().map(values),
        }
    }

    /// `[batch, heads, rows, width]`.
    pub(super) fn shape(&self, rows: usize, width: usize) -> [usize; 4] {
        [self.outer[0], self.outer[1], rows, width]
    }

    /// The forward pass as a `[batch, heads, n (+ d_k), d_v]` tensor, and the checkpoints when
    /// `keep`.
    pub(super) fn forward(&self, keep: bool) -> (FloatTensor<Flex>, Vec<f32>) {
        let forward = recurrence::forward(self.inputs(), self.dims, keep);
        let shape = self.shape(self.dims.joint_rows(), self.dims.d_v);
        (device_tensor(forward.joint, shape), forward.checkpoints)
    }
}

impl LinearRecurrence for Flex {
    fn decayed_recurrence(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_decay: FloatTensor<Self>,
        form: RecurrenceForm,
    ) -> FloatTensor<Self> {
        RecurrenceHost::new([q, k, v, log_decay], None, form)
            .forward(false)
            .0
    }

    fn delta_recurrence(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        log_decay: FloatTensor<Self>,
        form: RecurrenceForm,
    ) -> FloatTensor<Self> {
        RecurrenceHost::new([q, k, v, log_decay], Some(beta), form)
            .forward(false)
            .0
    }
}

/// `f` of `x`'s values, read in place where `x` is contiguous (else from a contiguous copy).
pub(super) fn with_values<T>(x: &FloatTensor<Flex>, f: impl FnOnce(&[f32]) -> T) -> T {
    match x.as_slice::<f32>() {
        Some(values) => f(values),
        None => f(&host(x.clone()).0),
    }
}

/// A gather with one index for every leading position (see `shared_gather`), with the sizes
/// it reads: rows of a pattern along the last axis, or slices along an axis.
#[derive(Debug, Clone, Copy)]
pub(super) enum IndexedGather {
    /// `out[…, r, c] = x[…, r, pattern[r · cols + c]]`.
    Rows(GatherDims),
    /// `out[o, r, …] = x[o, rows[r], …]` along axis `dim`.
    Slices {
        /// The sizes around the axis.
        dims: SelectDims,
        /// The axis.
        dim: usize,
    },
}

impl IndexedGather {
    /// Rows of `cols` along the last axis of `x`.
    pub(super) fn rows(x: &FloatTensor<Flex>, cols: usize) -> Self {
        let shape = x.layout().shape();
        let d = shape.len();
        Self::Rows(GatherDims {
            outer: shape[..d - 2].iter().product(),
            rows: shape[d - 2],
            len: shape[d - 1],
            cols,
        })
    }

    /// Slices along axis `dim` of `x`.
    pub(super) fn slices(x: &FloatTensor<Flex>, dim: usize) -> Self {
        let shape = x.layout().shape();
        Self::Slices {
            dims: SelectDims {
                outer: shape[..dim].iter().product(),
                len: shape[dim],
                inner: shape[dim + 1..].iter().product(),
            },
            dim,
        }
    }

    /// `x` gathered at `index`.
    pub(super) fn forward(&self, x: &FloatTensor<Flex>, index: &[u32]) -> FloatTensor<Flex> {
        let mut shape = x.layout().shape().to_vec();
        let out = with_values(x, |values| match *self {
            Self::Rows(dims) => shared_gather::forward(values, index, dims),
            Self::Slices { dims, .. } => shared_gather::select_forward(values, index, dims),
        });
        match *self {
            Self::Rows(dims) => *shape.last_mut().expect("at least two axes") = dims.cols,
            Self::Slices { dim, .. } => shape[dim] = index.len(),
        }
        burn::backend::flex::FlexTensor::from_data(TensorData::new(out, shape))
    }

    /// The input's gradient (its values, contiguous) from the output's, `d_out`.
    #[cfg_attr(not(feature = "train"), allow(dead_code))]
    pub(super) fn backward(&self, d_out: &[f32], index: &[u32]) -> Vec<f32> {
        match *self {
            Self::Rows(dims) => shared_gather::backward(d_out, index, dims),
            Self::Slices { dims, .. } => shared_gather::select_backward(d_out, index, dims),
        }
    }
}

impl RowGather for Flex {
    fn gather_shared(x: FloatTensor<Self>, pattern: Arc<[u32]>, cols: usize) -> FloatTensor<Self> {
        IndexedGather::rows(&x, cols).forward(&x, &pattern)
    }

    fn select_rows(x: FloatTensor<Self>, dim: usize, rows: Arc<[u32]>) -> FloatTensor<Self> {
        IndexedGather::slices(&x, dim).forward(&x, &rows)
    }
}
