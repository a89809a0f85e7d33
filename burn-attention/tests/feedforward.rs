//! The trainable feed-forward kernels (the `feedforward` module docs): each feature map against a
//! float64 evaluation of its formula from the module's own weights, the gated kernel's limiting
//! case, and the orthogonality penalty.

mod reference;

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::{Distribution, Tolerance};
use burn_attention_zoo::{
    AttentionModule, FeedForwardKernel, FeedForwardKernelAttention, FeedForwardKernelConfig,
    kernelized_attention, padding_mask_from_lengths,
};
use reference::{kernelized_head, matmul, matrix, max_rel_err, phi_f64, to_heads, transpose};

const KERNELS: [FeedForwardKernel; 5] = [
    FeedForwardKernel::Linear,
    FeedForwardKernel::OrthLinear,
    FeedForwardKernel::Glu,
    FeedForwardKernel::Oglu,
    FeedForwardKernel::Aoglu,
];

fn device() -> Device {
    Device::flex()
}

/// Check 4 (and 5) for every kernel at depths 1-3 where it stacks: the module's feature map and
/// kernelized attention against the float64 quadratic form `normalize_rows(φ(Q) φ(K)ᵀ ⊙ mask) V`
/// with `φ` evaluated from the same weights; padding, causal and not; 1e-4 relative (floor 0.01,
/// see `max_rel_err`).
#[test]
fn feature_maps_match_float64_reference() {
    let device = device();
    device.seed(7);
    let (b, h, n, d) = (2, 2, 7, 8);
    let lengths = [7, 4];
    let mask = padding_mask_from_lengths(&lengths, n, &device);
    let qkv = [0, 1, 2]
        .map(|_| Tensor::<4>::random([b, h, n, d], Distribution::Normal(0.0, 1.0), &device));
    let (qh, kh, vh) = (to_heads(&qkv[0]), to_heads(&qkv[1]), to_heads(&qkv[2]));
    for kernel in KERNELS {
        let depths: &[usize] = match kernel {
            FeedForwardKernel::Linear | FeedForwardKernel::OrthLinear => &[1],
            _ => &[1, 2, 3],
        };
        for &depth in depths {
            let module = FeedForwardKernelConfig::new(h * d, h, kernel)
                .with_depth(depth)
                .init(&device);
            for causal in [false, true] {
                let out = to_heads(&kernelized_attention(
                    module.feature_map(qkv[0].clone()),
                    module.feature_map(qkv[1].clone()),
                    qkv[2].clone(),
                    Some(mask.clone()),
                    causal,
                ));
                for bi in 0..b {
                    for hi in 0..h {
                        let expected = kernelized_head(
                            &phi_f64(&module, &qh[bi][hi]),
                            &phi_f64(&module, &kh[bi][hi]),
                            &vh[bi][hi],
                            |i, j| j >= lengths[bi] || (causal && j > i),
                        );
                        let err = max_rel_err(&out[bi][hi], &expected, 1e-2);
                        assert!(
                            err < 1e-4,
                            "{} depth {depth} causal {causal} batch {bi} head {hi}: {err}",
                            kernel.name()
                        );
                    }
                }
            }
        }
    }
}

/// The low-rank gate of `ff-aoglu` has rank d/4: `U: [d, d/4]`, `V: [d/4, d]`.
#[test]
fn aoglu_gate_is_low_rank() {
    let device = device();
    let module = FeedForwardKernelConfig::new(32, 2, FeedForwardKernel::Aoglu)
        .with_depth(3)
        .init(&device);
    assert_eq!(module.units.len(), 3);
    for unit in &module.units {
        assert!(unit.w_g.is_none());
        assert_eq!(unit.gate_u.as_ref().unwrap().val().dims(), [16, 4]);
        assert_eq!(unit.gate_v.as_ref().unwrap().val().dims(), [4, 16]);
    }
}

/// Limiting case of the gated kernels: with a zero gate, `σ(0) = ½` scales `φ(Q)` and `φ(K)`
/// alike and cancels in the normalisation, so one GLU unit equals the linear kernel with the
/// same `W_f`, to f32 round-off.
#[test]
fn glu_with_zero_gate_is_the_linear_kernel() {
    let device = device();
    let (h, d) = (2, 8);
    let mut glu = FeedForwardKernelConfig::new(h * d, h, FeedForwardKernel::Glu).init(&device);
    let mut lin = FeedForwardKernelConfig::new(h * d, h, FeedForwardKernel::Linear).init(&device);
    glu.units[0].w_g = Some(Param::from_tensor(Tensor::zeros([d, d], &device)));
    lin.units[0].w_f = Param::from_tensor(glu.units[0].w_f.val());
    let [q, k, v] = [0, 1, 2]
        .map(|_| Tensor::<4>::random([1, h, 6, d], Distribution::Normal(0.0, 1.0), &device));
    let attend = |m: &FeedForwardKernelAttention| {
        kernelized_attention(
            m.feature_map(q.clone()),
            m.feature_map(k.clone()),
            v.clone(),
            None,
            false,
        )
    };
    attend(&glu).into_data().assert_approx_eq::<f32>(
        &attend(&lin).into_data(),
        Tolerance::absolute(1e-5).set_relative(1e-4),
    );
}

/// The orthogonality penalty: zero at the orthogonal initialisation; `λ Σ ‖W Wᵀ − I‖²_F` in
/// float64 once the weights move; absent for the kernels without orthogonality.
#[test]
fn orthogonality_penalty() {
    let device = device();
    let (h, d) = (2, 8);
    for kernel in KERNELS {
        let mut module = FeedForwardKernelConfig::new(h * d, h, kernel)
            .with_depth(
                if kernel == FeedForwardKernel::OrthLinear || kernel == FeedForwardKernel::Linear {
                    1
                } else {
                    2
                },
            )
            .with_ortho_penalty(0.5)
            .init(&device);
        let Some(at_init) = module.penalty() else {
            assert!(matches!(
                kernel,
                FeedForwardKernel::Linear | FeedForwardKernel::Glu
            ));
            continue;
        };
        assert!(at_init.into_scalar::<f64>() < 1e-9, "{}", kernel.name());
        for unit in &mut module.units {
            let moved =
                unit.w_f.val() + Tensor::random([d, d], Distribution::Normal(0.0, 0.3), &device);
            unit.w_f = Param::from_tensor(moved);
        }
        let expected: f64 = module
            .units
            .iter()
            .map(|unit| {
                let w = matrix(&unit.w_f);
                let gram = matmul(&w, &transpose(&w));
                (0..d)
                    .flat_map(|i| (0..d).map(move |j| (i, j)))
                    .map(|(i, j)| (gram[i][j] - if i == j { 1.0 } else { 0.0 }).powi(2))
                    .sum::<f64>()
            })
            .sum::<f64>()
            * 0.5;
        let got = module.penalty().unwrap().into_scalar::<f64>();
        assert!(
            (got - expected).abs() < 1e-4 * expected,
            "{}: {got} vs {expected}",
            kernel.name()
        );
    }
}
