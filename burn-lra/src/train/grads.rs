//! Gradients and the optimiser: the objective, global-norm clipping, AdamW, the finiteness check
//! and the per-step seed of the device's generator.

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLoss;
use burn::optim::{AdamWConfig, GradientsParams};
use burn::prelude::*;

use crate::config::OptimizerConfig;
use crate::model::LraClassifier;

/// Scales `grads` so that their global L2 norm is at most `max_norm` (PyTorch's
/// `clip_grad_norm_`); returns the norm before clipping.
pub fn clip_global_norm(
    model: &LraClassifier,
    grads: GradientsParams,
    max_norm: f32,
) -> (GradientsParams, f64) {
    struct SumSquares<'a> {
        grads: &'a GradientsParams,
        total: Option<Tensor<1>>,
    }
    impl ModuleVisitor for SumSquares<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(g) = self.grads.get::<D>(param.id) {
                let s = g.powi_scalar(2).sum();
                self.total = Some(match self.total.take() {
                    Some(t) => t + s,
                    None => s,
                });
            }
        }
    }
    struct Scale {
        grads: GradientsParams,
        factor: f32,
    }
    impl ModuleVisitor for Scale {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(g) = self.grads.remove::<D>(param.id) {
                self.grads.register(param.id, g.mul_scalar(self.factor));
            }
        }
    }
    let mut sum = SumSquares {
        grads: &grads,
        total: None,
    };
    model.visit(&mut sum);
    let norm = sum.total.map_or(0.0, |t| t.into_scalar::<f64>().sqrt());
    if norm <= max_norm as f64 || !norm.is_finite() {
        return (grads, norm);
    }
    let mut scale = Scale {
        grads,
        factor: (max_norm as f64 / (norm + 1e-6)) as f32,
    };
    model.visit(&mut scale);
    (scale.grads, norm)
}

/// Whether every parameter of `model` is finite.
pub(super) fn weights_finite(model: &LraClassifier) -> bool {
    struct Finite(Vec<Tensor<1>>);
    impl ModuleVisitor for Finite {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push(param.val().sum().reshape([1]));
        }
    }
    let mut sums = Finite(Vec::new());
    model.visit(&mut sums);
    Tensor::cat(sums.0, 0)
        .sum()
        .into_scalar::<f64>()
        .is_finite()
}

/// Seed of the device generator from `step` on (see the module docs).
pub(super) fn step_seed(seed: u64, step: usize) -> u64 {
    crate::rng::Rng::new(seed ^ (step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64()
}

/// The AdamW optimiser of a run configuration (Adam with decoupled weight decay).
pub fn adamw(o: &OptimizerConfig) -> AdamWConfig {
    AdamWConfig::new()
        .with_beta_1(o.beta1)
        .with_beta_2(o.beta2)
        .with_epsilon(o.epsilon)
        .with_weight_decay(o.weight_decay)
}

/// The training objective of one batch: the cross-entropy plus the attentions' regularisers
/// (the orthogonality penalty) and their auxiliary losses for the batch (`aux_loss`, from
/// [`LraClassifier::forward_with_loss`]: the compressive attention's reconstruction loss), and
/// the cross-entropy alone.
pub fn objective(
    model: &LraClassifier,
    (logits, aux_loss): (Tensor<2>, Option<Tensor<1>>),
    labels: Tensor<1, Int>,
    loss_fn: &CrossEntropyLoss,
) -> (Tensor<1>, Tensor<1>) {
    let loss = loss_fn.forward(logits, labels);
    let objective = [model.penalty(), aux_loss]
        .into_iter()
        .flatten()
        .fold(loss.clone(), |total, term| total + term);
    (objective, loss)
}
