//! The autodiff form of fused softmax attention on CubeCL devices (built with the `train`
//! feature): the forward pass keeps the output and its log-sum-exp rows, and the backward runs
//! the gradient kernels, which recompute the weights tile by tile.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Autodiff, AutodiffBackend};

use super::RecurrenceForm;
use super::cube_extension::{
    CubeDeltaRule, CubeFlashAttention, CubeFlashParams, CubeRecurrence, DeltaGrads,
};

/// What the backward pass keeps: the inputs, the output and its log-sum-exp, the masks.
#[derive(Debug, Clone)]
struct Saved<B: CubeFlashAttention> {
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    out: FloatTensor<B>,
    lse: FloatTensor<B>,
    key_padding: FloatTensor<B>,
    row_keys: IntTensor<B>,
    params: CubeFlashParams,
}

#[derive(Debug)]
struct CubeFlashBackward;

impl<B: CubeFlashAttention> Backward<B, 3> for CubeFlashBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Saved<B>, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_out = grads.consume::<B>(&ops.node);
        let s = ops.state;
        let (dq, dk, dv) = B::cube_flash_backward(
            s.q,
            s.k,
            s.v,
            s.out,
            s.lse,
            d_out,
            s.key_padding,
            s.row_keys,
            s.params,
        );
        for (parent, grad) in ops.parents.into_iter().zip([dq, dk, dv]) {
            if let Some(parent) = parent {
                grads.register::<B>(parent.id, grad);
            }
        }
    }
}

impl<B: CubeFlashAttention, C: CheckpointStrategy> CubeFlashAttention for Autodiff<B, C> {
    /// Untracked: the two outputs are constants of the graph (the tracked form is
    /// [`cube_flash_attention`](CubeFlashAttention::cube_flash_attention)).
    fn cube_flash_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        key_padding: FloatTensor<Self>,
        row_keys: IntTensor<Self>,
        params: CubeFlashParams,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (out, lse) = B::cube_flash_forward(
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            key_padding.into_primitive(),
            row_keys,
            params,
        );
        (Self::from_inner(out), Self::from_inner(lse))
    }

    /// Untracked, as [`cube_flash_forward`](CubeFlashAttention::cube_flash_forward).
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
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (dq, dk, dv) = B::cube_flash_backward(
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            out.into_primitive(),
            lse.into_primitive(),
            d_out.into_primitive(),
            key_padding.into_primitive(),
            row_keys,
            params,
        );
        (
            Self::from_inner(dq),
            Self::from_inner(dk),
            Self::from_inner(dv),
        )
    }

    fn cube_flash_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        key_padding: FloatTensor<Self>,
        row_keys: IntTensor<Self>,
        params: CubeFlashParams,
    ) -> FloatTensor<Self> {
        match CubeFlashBackward
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
                let key_padding = key_padding.into_primitive();
                let (out, lse) = B::cube_flash_forward(
                    q.clone(),
                    k.clone(),
                    v.clone(),
                    key_padding.clone(),
                    row_keys.clone(),
                    params,
                );
                let saved = Saved {
                    q,
                    k,
                    v,
                    out: out.clone(),
                    lse,
                    key_padding,
                    row_keys,
                    params,
                };
                prep.finish(saved, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(
                B::cube_flash_forward(
                    q.into_primitive(),
                    k.into_primitive(),
                    v.into_primitive(),
                    key_padding.into_primitive(),
                    row_keys,
                    params,
                )
                .0,
            ),
        }
    }
}

/// What the recurrence's backward keeps: the inputs and the joint output (its final state
/// enters the log-decays' gradient).
#[derive(Debug, Clone)]
struct SavedRecurrence<B: CubeRecurrence> {
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    log_decay: FloatTensor<B>,
    joint: FloatTensor<B>,
    form: RecurrenceForm,
}

#[derive(Debug)]
struct CubeRecurrenceBackward;

impl<B: CubeRecurrence> Backward<B, 4> for CubeRecurrenceBackward {
    type State = SavedRecurrence<B>;

    fn backward(
        self,
        ops: Ops<SavedRecurrence<B>, 4>,
        grads: &mut Gradients,
        _: &mut Checkpointer,
    ) {
        let d_joint = grads.consume::<B>(&ops.node);
        let s = ops.state;
        let (dq, dk, dv, dg) =
            B::cube_decayed_backward(s.q, s.k, s.v, s.log_decay, s.joint, d_joint, s.form);
        for (parent, grad) in ops.parents.into_iter().zip([dq, dk, dv, dg]) {
            if let Some(parent) = parent {
                grads.register::<B>(parent.id, grad);
            }
        }
    }
}

impl<B: CubeRecurrence, C: CheckpointStrategy> CubeRecurrence for Autodiff<B, C> {
    /// Untracked: the output is a constant of the graph (the tracked form is
    /// [`cube_decayed_recurrence`](CubeRecurrence::cube_decayed_recurrence)).
    fn cube_decayed_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_decay: FloatTensor<Self>,
        form: RecurrenceForm,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::cube_decayed_forward(
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            log_decay.into_primitive(),
            form,
        ))
    }

    /// Untracked, as [`cube_decayed_forward`](CubeRecurrence::cube_decayed_forward).
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
    ) {
        let (dq, dk, dv, dg) = B::cube_decayed_backward(
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            log_decay.into_primitive(),
            joint.into_primitive(),
            d_joint.into_primitive(),
            form,
        );
        (
            Self::from_inner(dq),
            Self::from_inner(dk),
            Self::from_inner(dv),
            Self::from_inner(dg),
        )
    }

    fn cube_decayed_recurrence(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_decay: FloatTensor<Self>,
        form: RecurrenceForm,
    ) -> FloatTensor<Self> {
        match CubeRecurrenceBackward
            .prepare::<C>([q.node(), k.node(), v.node(), log_decay.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let [q, k, v, log_decay] = [&q, &k, &v, &log_decay].map(|t| t.primitive().clone());
                let joint = B::cube_decayed_forward(
                    q.clone(),
                    k.clone(),
                    v.clone(),
                    log_decay.clone(),
                    form,
                );
                let saved = SavedRecurrence {
                    q,
                    k,
                    v,
                    log_decay,
                    joint: joint.clone(),
                    form,
                };
                prep.finish(saved, joint)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::cube_decayed_forward(
                q.into_primitive(),
                k.into_primitive(),
                v.into_primitive(),
                log_decay.into_primitive(),
                form,
            )),
        }
    }
}

/// What the delta rule's backward keeps: the inputs and the states it re-runs from.
#[derive(Debug, Clone)]
struct SavedDeltaRule<B: CubeDeltaRule> {
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    beta: FloatTensor<B>,
    log_decay: FloatTensor<B>,
    checkpoints: FloatTensor<B>,
    form: RecurrenceForm,
}

#[derive(Debug)]
struct CubeDeltaBackward;

impl<B: CubeDeltaRule> Backward<B, 5> for CubeDeltaBackward {
    type State = SavedDeltaRule<B>;

    fn backward(self, ops: Ops<SavedDeltaRule<B>, 5>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_joint = grads.consume::<B>(&ops.node);
        let s = ops.state;
        let (dq, dk, dv, d_beta, dg) = B::cube_delta_backward(
            s.q,
            s.k,
            s.v,
            s.beta,
            s.log_decay,
            s.checkpoints,
            d_joint,
            s.form,
        );
        for (parent, grad) in ops.parents.into_iter().zip([dq, dk, dv, d_beta, dg]) {
            if let Some(parent) = parent {
                grads.register::<B>(parent.id, grad);
            }
        }
    }
}

impl<B: CubeDeltaRule, C: CheckpointStrategy> CubeDeltaRule for Autodiff<B, C> {
    /// Untracked: the outputs are constants of the graph (the tracked form is
    /// [`cube_delta_recurrence`](CubeDeltaRule::cube_delta_recurrence)).
    fn cube_delta_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        log_decay: FloatTensor<Self>,
        form: RecurrenceForm,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (joint, checkpoints) = B::cube_delta_forward(
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            beta.into_primitive(),
            log_decay.into_primitive(),
            form,
        );
        (Self::from_inner(joint), Self::from_inner(checkpoints))
    }

    /// Untracked, as [`cube_delta_forward`](CubeDeltaRule::cube_delta_forward).
    fn cube_delta_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        log_decay: FloatTensor<Self>,
        checkpoints: FloatTensor<Self>,
        d_joint: FloatTensor<Self>,
        form: RecurrenceForm,
    ) -> DeltaGrads<Self> {
        let (dq, dk, dv, d_beta, dg) = B::cube_delta_backward(
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            beta.into_primitive(),
            log_decay.into_primitive(),
            checkpoints.into_primitive(),
            d_joint.into_primitive(),
            form,
        );
        (
            Self::from_inner(dq),
            Self::from_inner(dk),
            Self::from_inner(dv),
            Self::from_inner(d_beta),
            Self::from_inner(dg),
        )
    }

    fn cube_delta_recurrence(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        log_decay: FloatTensor<Self>,
        form: RecurrenceForm,
    ) -> FloatTensor<Self> {
        match CubeDeltaBackward
            .prepare::<C>([q.node(), k.node(), v.node(), beta.node(), log_decay.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let [q, k, v, beta, log_decay] =
                    [&q, &k, &v, &beta, &log_decay].map(|t| t.primitive().clone());
                let (joint, checkpoints) = B::cube_delta_forward(
                    q.clone(),
                    k.clone(),
                    v.clone(),
                    beta.clone(),
                    log_decay.clone(),
                    form,
                );
                let saved = SavedDeltaRule {
                    q,
                    k,
                    v,
                    beta,
                    log_decay,
                    checkpoints,
                    form,
                };
                prep.finish(saved, joint)
            }
            OpsKind::UnTracked(prep) => prep.finish(
                B::cube_delta_forward(
                    q.into_primitive(),
                    k.into_primitive(),
                    v.into_primitive(),
                    beta.into_primitive(),
                    log_decay.into_primitive(),
                    form,
                )
                .0,
            ),
        }
    }
}
