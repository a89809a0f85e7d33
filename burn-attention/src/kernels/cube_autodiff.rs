//! The autodiff form of fused softmax attention on CubeCL devices (built with the `train`
//! feature): the forward pass keeps the output and its log-sum-exp rows, and the backward runs
//! the gradient kernels, which recompute the weights tile by tile.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Autodiff, AutodiffBackend};

use super::cube_extension::{CubeFlashAttention, CubeFlashParams};

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
