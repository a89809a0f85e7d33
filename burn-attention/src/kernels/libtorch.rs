//! libtorch's own fused attention kernels, what PyTorch's `scaled_dot_product_attention` runs, so
//! that training on `tch` keeps the log-sum-exp instead of the `n × n` weights, as PyTorch does:
//! on the CPU the flash-attention kernel (`_scaled_dot_product_flash_attention_for_cpu` and its
//! backward); on CUDA the memory-efficient kernel (`_scaled_dot_product_efficient_attention`, and
//! `_efficient_attention_backward` as PyTorch's own backward calls it), the one of libtorch's GPU
//! kernels that takes `f32` and an additive mask (its flash kernel takes neither). The backward
//! (the autodiff form) is built with the `train` feature.
// burn-tch is marked deprecated in Burn 0.22 but is the project's `tch` backend.
#![allow(deprecated)]

use burn::backend::LibTorch;
use burn::backend::libtorch::TchTensor;
use burn::backend::tensor::FloatTensor;

use super::DropMask;
use super::{FlashAttention, KeyPadding};
use crate::contract::input::MASK_FILL;

/// Elements a row of the memory-efficient kernel's bias is aligned to (its check on the bias's
/// strides; PyTorch pads an unaligned mask the same way before calling it).
const BIAS_ALIGNMENT: i64 = 16;

/// The key-padding flags as an additive mask: `MASK_FILL` on padding. `[batch, 1, 1, n_k]` on
/// the CPU; on CUDA expanded to `[batch, heads, n_q, n_k]` (no copy) over rows aligned to
/// [`BIAS_ALIGNMENT`], as the memory-efficient kernel requires.
/// A row with at least one real key gets the same weights as replacing its padded scores;
/// padded scores lie some 10⁴ below the real ones, so their weights underflow to zero.
fn additive_mask(key_padding: &KeyPadding, q: &TchTensor, k: &TchTensor) -> Option<tch::Tensor> {
    key_padding.as_ref().map(|flags| {
        let [batch, heads, n_q, _] = q.tensor.size()[..] else {
            unreachable!("attention inputs are [batch, heads, n, d]")
        };
        let n_k = k.tensor.size()[2];
        let device = q.tensor.device();
        let values: Vec<f32> = flags
            .iter()
            .map(|&pad| if pad { MASK_FILL } else { 0.0 })
            .collect();
        let mask = tch::Tensor::from_slice(&values).reshape([batch, 1, 1, n_k]);
        if !device.is_cuda() {
            return mask.to_device(device);
        }
        let aligned = (n_k + BIAS_ALIGNMENT - 1) / BIAS_ALIGNMENT * BIAS_ALIGNMENT;
        let padded = tch::Tensor::zeros([batch, 1, 1, aligned], (tch::Kind::Float, device));
        padded.narrow(3, 0, n_k).copy_(&mask);
        padded
            .narrow(3, 0, n_k)
            .expand([batch, heads, n_q, n_k], false)
    })
}

/// What the forward pass hands its backward: the output, the log-sum-exp of each score row and,
/// on CUDA, the kernel's random-number state (the seed and offset its dropout mask was drawn
/// with; empty without dropout).
struct Fused {
    out: tch::Tensor,
    lse: tch::Tensor,
    philox: Option<(tch::Tensor, tch::Tensor)>,
}

/// The fused forward on the inputs' device.
fn forward(
    q: &TchTensor,
    k: &TchTensor,
    v: &TchTensor,
    mask: Option<&tch::Tensor>,
    scale: f32,
    causal: bool,
    dropout: f64,
) -> Fused {
    if q.tensor.device().is_cuda() {
        let (out, lse, seed, offset) = tch::Tensor::internal_scaled_dot_product_efficient_attention(
            &q.tensor,
            &k.tensor,
            &v.tensor,
            mask,
            true,
            dropout,
            causal,
            scale as f64,
        );
        return Fused {
            out,
            lse,
            philox: Some((seed, offset)),
        };
    }
    assert!(
        dropout == 0.0,
        "libtorch's CPU flash attention has no dropout"
    );
    let (out, lse) = tch::Tensor::internal_scaled_dot_product_flash_attention_for_cpu(
        &q.tensor,
        &k.tensor,
        &v.tensor,
        0.0,
        causal,
        mask,
        scale as f64,
    );
    Fused {
        out,
        lse,
        philox: None,
    }
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
        let mask = additive_mask(&key_padding, &q, &k);
        let dropout = dropout.map_or(0.0, |d| d.prob());
        TchTensor::new(forward(&q, &k, &v, mask.as_ref(), scale, causal, dropout).out)
    }
}

/// The autodiff form: libtorch's fused backward (flash on the CPU, memory-efficient on CUDA).
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
    use super::{Fused, additive_mask, forward};

    /// What the backward pass keeps: inputs, output, log-sum-exp and mask.
    #[derive(Debug, Clone)]
    struct Saved {
        q: TchTensor,
        k: TchTensor,
        v: TchTensor,
        out: TchTensor,
        lse: TchTensor,
        mask: Option<TchTensor>,
        /// CUDA's kernel: its random-number seed and offset.
        philox: Option<(TchTensor, TchTensor)>,
        /// CUDA's kernel: the drop probability.
        dropout: f64,
        scale: f32,
        causal: bool,
    }

    /// libtorch's CPU flash-attention backward: the gradients of `q`, `k` and `v`.
    fn cpu_backward(grad: &tch::Tensor, s: &Saved) -> (tch::Tensor, tch::Tensor, tch::Tensor) {
        tch::Tensor::internal_scaled_dot_product_flash_attention_for_cpu_backward(
            grad,
            &s.q.tensor,
            &s.k.tensor,
            &s.v.tensor,
            &s.out.tensor,
            &s.lse.tensor,
            0.0,
            s.causal,
            s.mask.as_ref().map(|m| &m.tensor),
            s.scale as f64,
        )
    }

    /// The memory-efficient kernel's backward on CUDA, called as PyTorch's own
    /// `_scaled_dot_product_efficient_attention` backward calls it: on `[batch, n, heads, d]`
    /// views, the causal mask as the kernel's "causal from top left" (1).
    fn cuda_backward(
        grad: &tch::Tensor,
        s: &Saved,
        (seed, offset): (&tch::Tensor, &tch::Tensor),
    ) -> (tch::Tensor, tch::Tensor, tch::Tensor) {
        let to_bnhd = |t: &tch::Tensor| t.transpose(1, 2);
        let (n_q, n_k) = (s.q.tensor.size()[2], s.k.tensor.size()[2]);
        let (dq, dk, dv, _) = tch::Tensor::internal_efficient_attention_backward(
            &to_bnhd(grad).contiguous(),
            &to_bnhd(&s.q.tensor),
            &to_bnhd(&s.k.tensor),
            &to_bnhd(&s.v.tensor),
            s.mask.as_ref().map(|m| &m.tensor),
            &to_bnhd(&s.out.tensor),
            None::<&tch::Tensor>,
            None::<&tch::Tensor>,
            n_q,
            n_k,
            &s.lse.tensor,
            s.dropout,
            seed,
            offset,
            i64::from(s.causal),
            false,
            s.scale as f64,
            None::<i64>,
            None::<i64>,
            false,
        );
        (to_bnhd(&dq), to_bnhd(&dk), to_bnhd(&dv))
    }

    #[derive(Debug)]
    struct TorchFlashBackward;

    impl Backward<LibTorch, 3> for TorchFlashBackward {
        type State = Saved;

        fn backward(self, ops: Ops<Saved, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
            let [node_q, node_k, node_v] = ops.parents;
            let grad = grads.consume::<LibTorch>(&ops.node);
            let s = ops.state;
            let (dq, dk, dv) = match &s.philox {
                Some((seed, offset)) => {
                    cuda_backward(&grad.tensor, &s, (&seed.tensor, &offset.tensor))
                }
                None => cpu_backward(&grad.tensor, &s),
            };
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
                    let drop = dropout.map_or(0.0, |d| d.prob());
                    let Fused { out, lse, philox } =
                        forward(&q, &k, &v, mask.as_ref(), scale, causal, drop);
                    let out = TchTensor::new(out);
                    let saved = Saved {
                        q,
                        k,
                        v,
                        out: out.clone(),
                        lse: TchTensor::new(lse),
                        mask: mask.map(TchTensor::new),
                        philox: philox
                            .map(|(seed, offset)| (TchTensor::new(seed), TchTensor::new(offset))),
                        dropout: drop,
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
