//! The autodiff forms of the fused kernels on `flex` (built with the `train` feature): each
//! backward recomputes what the forward did not keep, tile by tile.

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, NodeGuard, Ops, OpsKind};
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::TensorData;
use std::sync::Arc;

use super::DropMask;
use super::flex::{
    HeldInputs, Host, IndexedGather, RecurrenceHost, device_tensor, host, joint_tensor, with_values,
};
use super::kernel::{self, Dims, Scoring};
use super::{
    FlashAttention, GatheredAttention, KeyPadding, LinearRecurrence, RecurrenceForm, RowGather,
    gathered, recurrence,
};
use crate::kernels::key_slots::KeySlots;

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

    fn vector_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        match LayerNormBackward
            .prepare::<C>([x.node(), gamma.node(), beta.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let x = x.primitive().clone();
                let shape = x.layout().shape().to_vec();
                let (gamma, _) = host(gamma.primitive().clone());
                let (beta, _) = host(beta.primitive().clone());
                let d = gamma.len();
                let (out, mean, rstd) = with_values(&x, |values| {
                    kernel::layer_norm_forward(values, &gamma, &beta, d, epsilon as f32)
                });
                let out = burn::backend::flex::FlexTensor::from_data(TensorData::new(out, shape));
                let saved = NormSaved {
                    x,
                    gamma: Arc::new(gamma),
                    mean: Arc::new(mean),
                    rstd: Arc::new(rstd),
                };
                prep.finish(saved, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(Flex::vector_layer_norm(
                x.into_primitive(),
                gamma.into_primitive(),
                beta.into_primitive(),
                epsilon,
            )),
        }
    }

    fn vector_elu_plus_one(x: FloatTensor<Self>) -> FloatTensor<Self> {
        tracked_unary::<C>(
            x,
            Flex::vector_elu_plus_one,
            |grad, y, _| kernel::elu_plus_one_grad_in_place(grad, y),
            false,
        )
    }

    fn vector_sigmoid(x: FloatTensor<Self>) -> FloatTensor<Self> {
        tracked_unary::<C>(
            x,
            Flex::vector_sigmoid,
            |grad, y, _| kernel::sigmoid_grad_in_place(grad, y),
            false,
        )
    }

    fn vector_silu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        tracked_unary::<C>(
            x,
            Flex::vector_silu,
            |grad, x, _| kernel::silu_grad_in_place(grad, x),
            true,
        )
    }

    fn vector_softplus(x: FloatTensor<Self>) -> FloatTensor<Self> {
        tracked_unary::<C>(
            x,
            Flex::vector_softplus,
            |grad, x, _| kernel::softplus_grad_in_place(grad, x),
            true,
        )
    }
}

/// What LayerNorm's backward keeps: its input (the tensor itself, its storage shared, not
/// copied), its scale on the host, each row's mean and inverse deviation.
#[derive(Debug, Clone)]
struct NormSaved {
    x: FloatTensor<Flex>,
    gamma: Arc<Vec<f32>>,
    mean: Arc<Vec<f32>>,
    rstd: Arc<Vec<f32>>,
}

#[derive(Debug)]
struct LayerNormBackward;

impl Backward<Flex, 3> for LayerNormBackward {
    type State = NormSaved;

    fn backward(self, ops: Ops<NormSaved, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [x_node, gamma_node, beta_node] = ops.parents.map(|node| node.map(|node| node.id));
        let (dy, _) = host(grads.consume::<Flex>(&ops.node));
        let saved = ops.state;
        let d = saved.gamma.len();
        let shape = saved.x.layout().shape().to_vec();
        let (dx, d_gamma, d_beta) = with_values(&saved.x, |x| {
            kernel::layer_norm_backward(x, &dy, &saved.gamma, (&saved.mean, &saved.rstd), d)
        });
        let tensor = |values: Vec<f32>, shape: Vec<usize>| {
            burn::backend::flex::FlexTensor::from_data(TensorData::new(values, shape))
        };
        for (node, grad, shape) in [
            (x_node, dx, shape),
            (gamma_node, d_gamma, vec![d]),
            (beta_node, d_beta, vec![d]),
        ] {
            if let Some(node) = node {
                grads.register::<Flex>(node, tensor(grad, shape));
            }
        }
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

/// The backward of a gathered call with `N` inputs: `q, k, v`, then the learned bias if any.
#[derive(Debug)]
struct GatheredBackward;

impl GatheredBackward {
    /// The gradients of the inputs, handed to the parents that track one.
    fn run<const N: usize>(ops: Ops<GatheredSaved, N>, grads: &mut Gradients) {
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
        let found = gathered::backward(
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
        let mut named = vec![
            (found.dq, dims.q_shape()),
            (found.dk, dims.k_shape()),
            (found.dv, dims.v_shape()),
        ];
        if let (Some(d_bias), Some(shape)) = (found.d_bias, saved.inputs.bias_shape()) {
            named.push((d_bias, shape));
        }
        for (node, (grad, shape)) in parents.into_iter().zip(named) {
            if let Some(node) = node {
                grads.register::<Flex>(node, device_tensor(grad, shape));
            }
        }
    }
}

impl Backward<Flex, 3> for GatheredBackward {
    type State = GatheredSaved;

    fn backward(self, ops: Ops<GatheredSaved, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        Self::run(ops, grads);
    }
}

impl Backward<Flex, 4> for GatheredBackward {
    type State = GatheredSaved;

    fn backward(self, ops: Ops<GatheredSaved, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        Self::run(ops, grads);
    }
}

/// A gathered call under autodiff over the inputs behind `nodes` (`q, k, v`, then the bias if
/// any): `inputs` holds them, the forward is kept when the result is tracked.
fn tracked_gathered<C: CheckpointStrategy, const N: usize>(
    nodes: [NodeGuard; N],
    inputs: impl FnOnce() -> HeldInputs,
    (slots, scale, dropout): (Arc<KeySlots>, f32, Option<DropMask>),
) -> FloatTensor<Autodiff<Flex, C>>
where
    GatheredBackward: Backward<Flex, N, State = GatheredSaved>,
{
    match GatheredBackward
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let inputs = inputs();
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
        OpsKind::UnTracked(prep) => {
            let inputs = inputs();
            prep.finish(joint_tensor(
                &inputs.forward(&slots, scale, dropout),
                inputs.dims(),
            ))
        }
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
        let nodes = [q.node(), k.node(), v.node()];
        let inputs = || {
            HeldInputs::new(
                q.primitive().clone(),
                k.primitive().clone(),
                v.primitive().clone(),
                None,
            )
        };
        tracked_gathered::<C, 3>(nodes, inputs, (slots, scale, dropout))
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
        let nodes = [q.node(), k.node(), v.node(), bias.node()];
        let inputs = || {
            HeldInputs::new(
                q.primitive().clone(),
                k.primitive().clone(),
                v.primitive().clone(),
                Some(bias.primitive().clone()),
            )
        };
        tracked_gathered::<C, 4>(nodes, inputs, (slots, scale, dropout))
    }
}

/// What a recurrence's backward keeps: its inputs on the host and the forward's checkpoints.
#[derive(Debug, Clone)]
struct RecurrenceSaved {
    inputs: RecurrenceHost,
    checkpoints: Arc<Vec<f32>>,
}

/// The backward of a recurrence with `N` inputs: `q, k, v, g` (the decaying rule) or
/// `q, k, v, beta, g` (the delta rule).
#[derive(Debug)]
struct RecurrenceBackward;

impl RecurrenceBackward {
    /// The gradients of the inputs, handed to the parents (`q, k, v`, then `beta` if present,
    /// then `g`) that track one.
    fn run<const N: usize>(ops: Ops<RecurrenceSaved, N>, grads: &mut Gradients) {
        let parents = ops.parents.map(|node| node.map(|node| node.id));
        let (d_joint, _) = host(grads.consume::<Flex>(&ops.node));
        let saved = ops.state;
        let inputs = &saved.inputs;
        let dims = inputs.dims;
        let found = recurrence::backward(inputs.inputs(), dims, &saved.checkpoints, &d_joint);
        let (n, d_k, d_v) = (dims.n, dims.d_k, dims.d_v);
        let mut named = vec![
            (found.dq, inputs.shape(n, d_k)),
            (found.dk, inputs.shape(n, d_k)),
            (found.dv, inputs.shape(n, d_v)),
        ];
        if N == 5 {
            named.push((found.dbeta, inputs.shape(n, 1)));
        }
        named.push((found.dg, inputs.shape(n, dims.decay_width)));
        for (node, (grad, shape)) in parents.into_iter().zip(named) {
            if let Some(node) = node {
                grads.register::<Flex>(node, device_tensor(grad, shape));
            }
        }
    }
}

impl Backward<Flex, 4> for RecurrenceBackward {
    type State = RecurrenceSaved;

    fn backward(self, ops: Ops<RecurrenceSaved, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        Self::run(ops, grads);
    }
}

impl Backward<Flex, 5> for RecurrenceBackward {
    type State = RecurrenceSaved;

    fn backward(self, ops: Ops<RecurrenceSaved, 5>, grads: &mut Gradients, _: &mut Checkpointer) {
        Self::run(ops, grads);
    }
}

impl<C: CheckpointStrategy> LinearRecurrence for Autodiff<Flex, C> {
    fn decayed_recurrence(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_decay: FloatTensor<Self>,
        form: RecurrenceForm,
    ) -> FloatTensor<Self> {
        tracked_recurrence::<C, 4>([q.node(), k.node(), v.node(), log_decay.node()], || {
            RecurrenceHost::new(
                [&q, &k, &v, &log_decay].map(|t| t.primitive().clone()),
                None,
                form,
            )
        })
    }

    fn delta_recurrence(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        log_decay: FloatTensor<Self>,
        form: RecurrenceForm,
    ) -> FloatTensor<Self> {
        let nodes = [q.node(), k.node(), v.node(), beta.node(), log_decay.node()];
        tracked_recurrence::<C, 5>(nodes, || {
            RecurrenceHost::new(
                [&q, &k, &v, &log_decay].map(|t| t.primitive().clone()),
                Some(beta.primitive().clone()),
                form,
            )
        })
    }
}

/// A recurrence under autodiff over the inputs behind `nodes`: `host` gathers them, the
/// forward keeps its checkpoints when the result is tracked.
fn tracked_recurrence<C: CheckpointStrategy, const N: usize>(
    nodes: [NodeGuard; N],
    host: impl FnOnce() -> RecurrenceHost,
) -> FloatTensor<Autodiff<Flex, C>>
where
    RecurrenceBackward: Backward<Flex, N, State = RecurrenceSaved>,
{
    match RecurrenceBackward
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let inputs = host();
            let (joint, checkpoints) = inputs.forward(true);
            let saved = RecurrenceSaved {
                inputs,
                checkpoints: Arc::new(checkpoints),
            };
            prep.finish(saved, joint)
        }
        OpsKind::UnTracked(prep) => prep.finish(host().forward(false).0),
    }
}

/// What an indexed gather's backward keeps: the gather, its index and the input's shape.
#[derive(Debug, Clone)]
struct IndexedSaved {
    gather: IndexedGather,
    index: Arc<[u32]>,
    shape: Vec<usize>,
}

#[derive(Debug)]
struct IndexedBackward;

impl Backward<Flex, 1> for IndexedBackward {
    type State = IndexedSaved;

    fn backward(self, ops: Ops<IndexedSaved, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let (d_out, _) = host(grads.consume::<Flex>(&ops.node));
        if let Some(node) = node {
            let saved = ops.state;
            let dx = saved.gather.backward(&d_out, &saved.index);
            let dx = burn::backend::flex::FlexTensor::from_data(TensorData::new(dx, saved.shape));
            grads.register::<Flex>(node.id, dx);
        }
    }
}

/// An indexed gather of `x` at `index` under autodiff.
fn tracked_gather<C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<Flex, C>>,
    gather: IndexedGather,
    index: Arc<[u32]>,
) -> FloatTensor<Autodiff<Flex, C>> {
    match IndexedBackward
        .prepare::<C>([x.node()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let input = x.primitive();
            let out = gather.forward(input, &index);
            let shape = input.layout().shape().to_vec();
            prep.finish(
                IndexedSaved {
                    gather,
                    index,
                    shape,
                },
                out,
            )
        }
        OpsKind::UnTracked(prep) => prep.finish(gather.forward(x.primitive(), &index)),
    }
}

impl<C: CheckpointStrategy> RowGather for Autodiff<Flex, C> {
    fn gather_shared(x: FloatTensor<Self>, pattern: Arc<[u32]>, cols: usize) -> FloatTensor<Self> {
        let gather = IndexedGather::rows(x.primitive(), cols);
        tracked_gather::<C>(x, gather, pattern)
    }

    fn select_rows(x: FloatTensor<Self>, dim: usize, rows: Arc<[u32]>) -> FloatTensor<Self> {
        let gather = IndexedGather::slices(x.primitive(), dim);
        tracked_gather::<C>(x, gather, rows)
    }
}
