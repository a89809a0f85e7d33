//! Dropout from a counter-based random generator: whether an element is kept is a pure function
//! of a per-call seed and the element's (row, column) position, as in FlashAttention's Philox
//! dropout (Dao et al. 2022, arXiv 2205.14135, §3.1). A fused kernel can therefore drop weights
//! it never stores and regenerate the same mask in its backward pass from the seed alone, and
//! a composed path given the same seed drops exactly the same elements.
//!
//! On `flex` the mask is computed here, vectorised, in place of Burn's `Dropout`, which draws
//! one ChaCha20 number per element (a quarter of a `small`-preset training step's time). The
//! seed of every call is drawn from the device's random generator, so a run seeded (or
//! reseeded at a checkpoint) as before drops the same elements on every replay. The fused
//! softmax kernels on `wgpu` take the same mask. Elsewhere [`dropout`] is Burn's own layer.
//!
//! The mask itself, shared with the fused kernels, lives beside them (`kernels/mask.rs`).

use burn::nn::Dropout;
use burn::prelude::*;

use crate::kernels::DropMask;

/// Whether `layer` drops anything on `x`'s device: only while training (autodiff, the layer
/// not frozen) with a non-zero rate, as Burn's `Dropout::forward` decides.
pub(crate) fn is_active(layer: &Dropout, device: &Device) -> bool {
    layer.prob > 0.0 && layer.training.is_enabled() && device.is_autodiff()
}

/// Burn's `Dropout::forward`, the same distribution and the same no-ops (inference, a frozen
/// layer, rate 0), with the counter-based mask on `flex` (`f32`): a vectorised hash per element
/// where Burn draws a ChaCha20 number per element.
pub fn dropout<const D: usize>(layer: &Dropout, x: Tensor<D>) -> Tensor<D> {
    let device = x.device();
    if !is_active(layer, &device) {
        return x;
    }
    if is_flex_f32(&x) {
        let mask = DropMask::draw(layer.prob, &device);
        let keep = mask.tensor(x.dims(), &device);
        return x * keep;
    }
    layer.forward(x)
}

/// Whether `x` lives on `flex` (or autodiff over it) as `f32`, where the mask is computed here.
pub(crate) fn is_flex_f32<const D: usize>(x: &Tensor<D>) -> bool {
    #[cfg(feature = "flex")]
    {
        crate::kernels::is_flex(&x.device()) && x.dtype() == burn::tensor::DType::F32
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = x;
        false
    }
}

/// Attention-weight dropout for one call of a softmax step: nothing, a counter-based mask
/// (which a fused kernel applies itself, and the composed steps as a tensor), or Burn's layer
/// (backends where the mask is not computed here).
#[derive(Debug, Clone, Copy)]
pub(crate) enum WeightDropout<'a> {
    /// No dropout: inference, a frozen layer, rate 0, or no layer.
    Off,
    /// The counter-based mask, seed drawn for this call.
    Mask(DropMask),
    /// Burn's layer.
    Layer(&'a Dropout),
}

impl<'a> WeightDropout<'a> {
    /// Decides, for weights computed from `q`, which dropout applies, drawing the mask's seed
    /// when it is the counter-based one.
    pub(crate) fn new(q: &Tensor<4>, layer: Option<&'a Dropout>) -> Self {
        match layer {
            Some(layer) if is_active(layer, &q.device()) => {
                if is_flex_f32(q) {
                    Self::Mask(DropMask::draw(layer.prob, &q.device()))
                } else {
                    Self::Layer(layer)
                }
            }
            _ => Self::Off,
        }
    }

    /// As [`new`](Self::new), for fused softmax attention: also the counter-based mask where
    /// the fused kernel of a CubeCL device (`wgpu`) applies it, in place of Burn's layer.
    pub(crate) fn for_fused_softmax(q: &Tensor<4>, layer: Option<&'a Dropout>) -> Self {
        match Self::new(q, layer) {
            Self::Layer(layer) if crate::kernels::cube_kernel_applies(q) => {
                Self::Mask(DropMask::draw(layer.prob, &q.device()))
            }
            other => other,
        }
    }

    /// The counter-based mask, if that is what applies.
    pub(crate) fn mask(&self) -> Option<DropMask> {
        match self {
            Self::Mask(mask) => Some(*mask),
            _ => None,
        }
    }

    /// Whether anything is dropped.
    pub(crate) fn is_on(&self) -> bool {
        !matches!(self, Self::Off)
    }

    /// Applies the dropout to composed weights (rows: every axis but the last, row-major).
    pub(crate) fn apply<const D: usize>(&self, weights: Tensor<D>) -> Tensor<D> {
        match self {
            Self::Off => weights,
            Self::Mask(mask) => {
                let keep = mask.tensor(weights.dims(), &weights.device());
                weights * keep
            }
            Self::Layer(layer) => layer.forward(weights),
        }
    }
}
