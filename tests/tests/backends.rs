//! Check 7 of docs/attention.md and the backend promise of the harness: on every compiled-in backend,
//! the same weights and inputs give the default backend's (`flex`) outputs, through a few
//! training steps.
//!
//! Each test runs [`burn_lra::agreement::check`] (the check `burn-lra check-backend` runs on a
//! GPU machine) for every attention: the ListOps classifier built once on flex, the same AdamW
//! steps on the same batches on both backends, the logits compared after every step.

use burn_lra::agreement::{self, starting_record, trajectory};
use burn_lra::backend::BackendKind;

// Unused when no backend besides flex is compiled in (the default `cargo test`).
#[cfg_attr(
    not(any(
        feature = "ndarray",
        feature = "tch",
        feature = "wgpu",
        feature = "cuda"
    )),
    allow(dead_code)
)]
fn matches_flex(backend: BackendKind) {
    for attention in burn_attention_zoo::VARIANTS.iter().map(|v| v.name) {
        let gaps = agreement::check(backend, attention).unwrap();
        for (step, gap) in gaps.iter().enumerate() {
            eprintln!("{backend} {attention} step {step}: {gap:?}");
            assert!(
                gap.agrees(),
                "{backend} {attention} step {step}: {gap:?} is outside the tolerance"
            );
        }
    }
}

#[test]
fn flex_is_deterministic() {
    // The reference itself: two flex runs from the same record agree exactly.
    let record = starting_record("softmax").unwrap();
    let a = trajectory(BackendKind::Flex, "softmax", record.clone()).unwrap();
    let b = trajectory(BackendKind::Flex, "softmax", record).unwrap();
    for (x, y) in a.iter().zip(&b) {
        x.assert_eq(y, true);
    }
}

#[cfg(feature = "ndarray")]
#[test]
fn ndarray_matches_flex() {
    matches_flex(BackendKind::Ndarray);
}

#[cfg(feature = "tch")]
#[test]
fn tch_matches_flex() {
    matches_flex(BackendKind::Tch);
}

/// libtorch on CUDA (its memory-efficient attention kernel for softmax): where libtorch sees a
/// CUDA device; elsewhere (CI) the test says it skipped.
#[cfg(feature = "tch")]
#[test]
fn tch_cuda_matches_flex() {
    if !tch::Cuda::is_available() {
        eprintln!("SKIPPED tch_cuda_matches_flex: libtorch sees no CUDA device");
        return;
    }
    matches_flex(BackendKind::TchCuda);
}

/// Every attention, Transformer-XL, the Compressive Transformer and routing included: each
/// left flex's trajectory on wgpu (Burn 0.22.1, lavapipe) until it stopped reading a tensor
/// through `swap_dims` where wgpu mishandles it (the gradient of an expanded tensor read that
/// way; top-k over it without autodiff).
#[cfg(all(feature = "wgpu", not(feature = "wgpu-fused")))]
#[test]
fn wgpu_matches_flex() {
    matches_flex(BackendKind::Wgpu);
}

/// The same with Burn's fusion and autotuning (a build of its own: `--features
/// integration-tests/wgpu-fused`, which `.ci/run` tests in a stage of its own when its time
/// allows).
#[cfg(feature = "wgpu-fused")]
#[test]
fn wgpu_fused_matches_flex() {
    matches_flex(BackendKind::WgpuFused);
}

/// Softmax attention's fused kernels on a GPU-path backend (on wgpu the crate's CubeCL kernels,
/// under fusion as opaque operations) against flex's: the output and the gradients of `q`, `k`
/// and `v` of `Σ G ∘ attention`, on a batch whose second sequence is padded, causal and not, at a
/// length that spans several tiles of either kernel (300 rows and keys), 1e-4 of the largest
/// entry.
#[cfg_attr(not(feature = "wgpu"), allow(dead_code))]
fn softmax_kernels_match_flex(backend: BackendKind) {
    use burn::prelude::*;
    use burn::tensor::Distribution;
    use burn_attention_zoo::{padding_mask_from_lengths, softmax_attention};
    use burn_lra::backend::BackendDevice;

    let (b, h, n, d) = (2, 2, 300, 16);
    let flex = Device::flex();
    let normal = Distribution::Normal(0.0, 1.0);
    let inputs: Vec<TensorData> = (0..4)
        .map(|_| Tensor::<4>::random([b, h, n, d], normal, &flex).into_data())
        .collect();
    let run = |device: Device, causal: bool| {
        let device = device.autodiff();
        let [q, k, v, g] = [0, 1, 2, 3].map(|i| Tensor::<4>::from_data(inputs[i].clone(), &device));
        let [q, k, v] = [q, k, v].map(Tensor::require_grad);
        let mask = padding_mask_from_lengths(&[n, 170], n, &device);
        let out = softmax_attention(q.clone(), k.clone(), v.clone(), Some(mask), causal);
        let grads = (out.clone() * g).sum().backward();
        [
            out.inner(),
            q.grad(&grads).unwrap(),
            k.grad(&grads).unwrap(),
            v.grad(&grads).unwrap(),
        ]
        .map(|t| t.into_data().iter::<f32>().collect::<Vec<f32>>())
    };
    for causal in [false, true] {
        let want = run(flex.clone(), causal);
        let got = run(backend.device().unwrap(), causal);
        for (name, (got, want)) in ["out", "dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
            let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
            let gap = got
                .iter()
                .zip(want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                gap <= 1e-4 * scale,
                "{backend} softmax {name}, causal {causal}: {gap} against largest {scale}"
            );
        }
    }
}

#[cfg(all(feature = "wgpu", not(feature = "wgpu-fused")))]
#[test]
fn wgpu_softmax_kernels_match_flex() {
    softmax_kernels_match_flex(BackendKind::Wgpu);
}

#[cfg(feature = "wgpu-fused")]
#[test]
fn wgpu_fused_softmax_kernels_match_flex() {
    softmax_kernels_match_flex(BackendKind::WgpuFused);
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_matches_flex() {
    matches_flex(BackendKind::Cuda);
}
