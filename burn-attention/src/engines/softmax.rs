//! Exact softmax attention `softmax(Q Kᵀ / √d + M) V` on per-head tensors, with its backend
//! dispatch: the step every variant that ends in an exact softmax shares (`softmax` itself,
//! the softmax over Linformer's projected keys, Nyströmformer's two softmax products).

use burn::nn::Dropout;
use burn::prelude::*;
use burn::tensor::activation::softmax;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;

use crate::contract::input::{HeadMasks, MASK_FILL, causal_mask};
use crate::engines::dropout::WeightDropout;
use crate::kernels;

/// Softmax attention with optional dropout on the weights. The softmax runs over the keys (the
/// last axis of the scores); padded keys and, with `causal`, keys `j > i` get [`MASK_FILL`].
///
/// On `flex` (f32), `wgpu` (f32) and `tch` on a CPU (f32, no active weight dropout), it runs
/// the fused operation of the `kernels` module, whose backward recomputes the weights tile by
/// tile; on `flex` and `wgpu` the fused kernel applies the weight dropout itself, from a counter-based mask it
/// regenerates in the backward pass ([`dropout`](crate::engines::dropout)), so training with dropout
/// keeps `O(n)` memory per head. Elsewhere, without autodiff and without a padding mask, Burn's
/// fused attention operation; otherwise the composed steps, whose backward Burn derives and
/// which store the `n × n` weights (on `tch` with active weight dropout, for one).
///
/// # Shapes
/// - `q`: `[batch, heads, n_q, d]`; `k`, `v`: `[batch, heads, n_k, d]`
/// - `key_pad`: `[batch, n_k]`, `true` = padding
/// - output: `[batch, heads, n_q, d]`
pub fn exact_softmax_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    key_pad: Option<Tensor<2, Bool>>,
    causal: bool,
    dropout: Option<&Dropout>,
) -> Tensor<4> {
    let scale = 1.0 / (q.dims()[3] as f32).sqrt();
    let dropout = WeightDropout::for_fused_softmax(&q, dropout);
    if !matches!(dropout, WeightDropout::Layer(_))
        && let Some(out) =
            kernels::try_attention(&q, &k, &v, key_pad.as_ref(), causal, scale, dropout.mask())
    {
        return out;
    }
    composed_softmax_attention(q, k, v, key_pad, causal, scale, dropout)
}

/// [`exact_softmax_attention`] without the fused kernels: Burn's fused operation where it
/// computes the same, otherwise the composed steps.
fn composed_softmax_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    key_pad: Option<Tensor<2, Bool>>,
    causal: bool,
    scale: f32,
    dropout: WeightDropout<'_>,
) -> Tensor<4> {
    if !dropout.is_on() && key_pad.is_none() {
        // Without dropout the fused operation computes the same.
        // Padding masks take the composed path: Burn's masks mean `true` = masked, and
        // burn-tch 0.22.1 hands them unchanged to libtorch's scaled_dot_product_attention,
        // where `true` means attend (caught by the backend-agreement test).
        let options = AttentionModuleOptions {
            is_causal: causal,
            scale: Some(scale as f64),
            ..Default::default()
        };
        return attention(q, k, v, None, None, options);
    }
    let masks = HeadMasks {
        key_pad,
        causal,
        ..HeadMasks::default()
    };
    let weights = dropout.apply(softmax_weights(q, k, &masks, scale));
    weights.matmul(v)
}

/// The weights of softmax attention, `softmax(scale · Q Kᵀ + M)` `[batch, heads, n_q, n_k]`,
/// composed (the `n × n` scores are formed): `M` is [`MASK_FILL`] on padded keys, with
/// `causal` on keys `j > i`, and where the arbitrary attention mask `masks.attn`
/// (`[batch, n_q, n_k]`) is `true`. A row with every key masked is uniform over the keys.
///
/// # Shapes
/// - `q`: `[batch, heads, n_q, d]`; `k`: `[batch, heads, n_k, d]`
/// - output: `[batch, heads, n_q, n_k]`, each row summing to one
pub fn softmax_weights(q: Tensor<4>, k: Tensor<4>, masks: &HeadMasks, scale: f32) -> Tensor<4> {
    masked_softmax(q.matmul(k.swap_dims(2, 3)).mul_scalar(scale), masks)
}

/// The softmax over the keys of `scores` `[batch, heads, n_q, n_k]` after [`MASK_FILL`] on
/// padded keys, with `masks.causal` on keys `j > i`, and where the attention mask `masks.attn`
/// is `true`: the weights of any attention that forms its scores (see [`softmax_weights`]). A
/// row with every key masked is uniform over the keys.
pub fn masked_softmax(scores: Tensor<4>, masks: &HeadMasks) -> Tensor<4> {
    let [batch, _, n_q, n_k] = scores.dims();
    let mut scores = scores;
    if let Some(mask) = &masks.key_pad {
        scores = scores.mask_fill(mask.clone().reshape([batch, 1, 1, n_k]), MASK_FILL);
    }
    if masks.causal {
        let mask = causal_mask(n_q.max(n_k), &scores.device())
            .slice([0..n_q, 0..n_k])
            .reshape([1, 1, n_q, n_k]);
        scores = scores.mask_fill(mask, MASK_FILL);
    }
    if let Some(mask) = &masks.attn {
        scores = scores.mask_fill(mask.clone().reshape([batch, 1, n_q, n_k]), MASK_FILL);
    }
    softmax(scores, 3)
}

/// Softmax attention with an arbitrary attention mask (see [`softmax_weights`]), its weights
/// before dropout and the output after it: the composed steps, which keep the `n × n` weights
/// (the fused kernels take padding and causal masks only). `dropout` as in
/// [`exact_softmax_attention`].
///
/// # Shapes
/// - `q`: `[batch, heads, n_q, d]`; `k`, `v`: `[batch, heads, n_k, d]`
/// - output: `([batch, heads, n_q, d], [batch, heads, n_q, n_k])`
pub fn softmax_attention_with_weights(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    masks: &HeadMasks,
    dropout: Option<&Dropout>,
) -> (Tensor<4>, Tensor<4>) {
    let scale = 1.0 / (q.dims()[3] as f32).sqrt();
    let dropout = WeightDropout::new(&q, dropout);
    let weights = softmax_weights(q, k, masks, scale);
    let out = dropout.apply(weights.clone()).matmul(v);
    (out, weights)
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use burn::prelude::*;
    use burn::tensor::Distribution;

    use super::{WeightDropout, composed_softmax_attention};
    use crate::kernels;
    use crate::kernels::DropMask;

    fn max_rel_diff(a: Tensor<4>, b: Tensor<4>) -> f32 {
        let scale = b.clone().abs().max().into_scalar::<f32>().max(1e-6);
        (a - b).abs().max().into_scalar::<f32>() / scale
    }

    /// The devices with a fused kernel that takes a dropout mask: `flex`, and with `wgpu` the
    /// default wgpu device (lavapipe where there is no GPU), both under autodiff.
    fn fused_devices() -> Vec<Device> {
        #[allow(unused_mut)] // pushed to only with wgpu compiled in
        let mut devices = vec![Device::flex().autodiff()];
        #[cfg(feature = "wgpu")]
        devices.push(Device::wgpu(DeviceKind::DefaultDevice).autodiff());
        devices
    }

    /// The tiled kernels against Burn's composed steps and derived backward, given the same
    /// dropout mask: output and the gradients of q, k and v, with padding, causal or neither,
    /// over several query and key tiles (300 > 128 rows, 300 > 256 keys on flex; 300 > 64 rows
    /// and keys on CubeCL), with and without dropout, on every device with a fused kernel. The
    /// third sequence has one real key. (A sequence of padding alone, whose rows are uniform over
    /// the keys, is left out: the kernels take each weight as `exp(s − lse)` with `s` the mask's
    /// fill, −10⁴, where f32 keeps about 10⁻³ of `s − lse`, and the key gradient's error reaches
    /// 6·10⁻⁵ of its largest entry on flex.)
    #[test]
    fn fused_dropout_matches_composed_with_gradients() {
        for device in fused_devices() {
            for mask in [Some(DropMask::new(0.2, 5)), None] {
                fused_matches_composed(&device, mask);
            }
        }
    }

    fn fused_matches_composed(device: &Device, mask: Option<DropMask>) {
        let device = device.clone();
        let (batch, heads, n, d) = (3, 3, 300, 16);
        let normal = Distribution::Normal(0.0, 1.0);
        let q = Tensor::<4>::random([batch, heads, n, d], normal, &device);
        let k = Tensor::<4>::random([batch, n, heads, d], normal, &device).swap_dims(1, 2);
        let v = Tensor::<4>::random([batch, heads, n, d], normal, &device);
        let g = Tensor::<4>::random([batch, heads, n, d], normal, &device);
        let lengths = [n, 211, 1];
        let pad = Tensor::<2, Bool>::from_data(
            TensorData::new(
                (0..batch * n)
                    .map(|i| i % n >= lengths[i / n])
                    .collect::<Vec<_>>(),
                [batch, n],
            ),
            &device,
        );
        for (padded, causal) in [(false, false), (true, false), (false, true), (true, true)] {
            let pad = padded.then(|| pad.clone());
            let run = |fused: bool| {
                let [q, k, v] = [&q, &k, &v].map(|t| t.clone().require_grad());
                let scale = 0.25;
                let out = if fused {
                    kernels::try_attention(&q, &k, &v, pad.as_ref(), causal, scale, mask)
                        .expect("the device has the fused kernel")
                } else {
                    let dropout = match mask {
                        Some(mask) => WeightDropout::Mask(mask),
                        None => WeightDropout::Off,
                    };
                    composed_softmax_attention(
                        q.clone(),
                        k.clone(),
                        v.clone(),
                        pad.clone(),
                        causal,
                        scale,
                        dropout,
                    )
                };
                let grads = (out.clone() * g.clone()).sum().backward();
                let grad = |t: &Tensor<4>| t.grad(&grads).expect("a gradient");
                [out.inner(), grad(&q), grad(&k), grad(&v)]
            };
            let fused = run(true);
            let composed = run(false);
            for (name, (a, b)) in ["out", "dq", "dk", "dv"]
                .iter()
                .zip(fused.into_iter().zip(composed))
            {
                let diff = max_rel_diff(a, b);
                assert!(
                    diff < 2e-5,
                    "{device:?} {name}: {diff} (padding {padded}, causal {causal}, \
                     dropout {mask:?})"
                );
            }
        }
    }

    /// Dropout keeps the weights' expectation: the fused output averaged over 400 seeds comes
    /// within a few standard errors of the output without dropout, and about 1 − p of the
    /// weights survive (the output of one-hot values is the kept weight itself).
    #[test]
    fn fused_dropout_is_unbiased() {
        let device = Device::flex();
        let (n, prob, seeds) = (64, 0.25, 400);
        let normal = Distribution::Normal(0.0, 1.0);
        let q = Tensor::<4>::random([1, 1, n, 8], normal, &device);
        let k = Tensor::<4>::random([1, 1, n, 8], normal, &device);
        // One-hot values: output column j is the (dropped) weight of key j.
        let v = Tensor::<2>::eye(n, &device).reshape([1, 1, n, n]);
        let attend = |mask: Option<DropMask>| {
            kernels::try_attention(&q, &k, &v, None, false, 0.35, mask)
                .expect("flex has the fused kernel")
        };
        let plain: Vec<f32> = attend(None).into_data().iter::<f32>().collect();
        let mut mean = vec![0.0f64; n * n];
        let mut zeros = 0usize;
        for seed in 0..seeds {
            let out: Vec<f32> = attend(Some(DropMask::new(prob, seed)))
                .into_data()
                .iter::<f32>()
                .collect();
            for (m, (&x, &w)) in mean.iter_mut().zip(out.iter().zip(&plain)) {
                *m += x as f64 / seeds as f64;
                if x == 0.0 && w != 0.0 {
                    zeros += 1;
                }
            }
        }
        let dropped = zeros as f64 / (seeds as usize * n * n) as f64;
        assert!((dropped - prob).abs() < 0.005, "dropped fraction {dropped}");
        // A kept weight w is w / (1 − p): variance w² p / (1 − p) per draw.
        for (&m, &w) in mean.iter().zip(&plain) {
            let w = w as f64;
            let se = (w * w * prob / (1.0 - prob) / seeds as f64).sqrt();
            assert!((m - w).abs() <= 5.0 * se + 1e-6, "mean {m} against {w}");
        }
    }
}
