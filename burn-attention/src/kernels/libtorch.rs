//! libtorch on the CPU: its own flash-attention kernels (`_scaled_dot_product_flash_attention_for_cpu`
//! and its backward, what PyTorch's `scaled_dot_product_attention` runs there), so that training
//! on `tch` keeps the log-sum-exp instead of the `n × n` weights, as PyTorch does. The backward
//! (the autodiff form) is built with the `train` feature.
// burn-tch is marked deprecated in Burn 0.22 but is the project's `tch` backend.
#![allow(deprecated)]

use burn::backend::LibTorch;
use burn::backend::libtorch::TchTensor;
use burn::backend::tensor::FloatTensor;

use super::DropMask;
use super::{FlashAttention, KeyPadding};
use crate::contract::input::MASK_FILL;

/// The key-padding flags as an additive mask `[batch, 1, 1, n_k]`: `MASK_FILL` on padding.
/// A row with at least one real key gets the same weights as replacing its padded scores;
/// padded scores lie some 10⁴ below the real ones, so their weights underflow to zero.
fn additive_mask(key_padding: &KeyPadding, q: &TchTensor, k: &TchTensor) -> Option<tch::Tensor> {
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

/// The autodiff form: libtorch's flash-attention backward.
#[cfg(feature = "train")]
mod autodiff {
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::libtorch::TchTensor;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Autodiff, LibTorch};

    use super::super::{DropMask, FlashAttention, KeyPadding};
    use super::{additive_mask, forward};

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
