//! Rotary positions (Su et al. 2021, RoFormer, arXiv 2104.09864) against float64 references
//! written from the paper: softmax over rotated queries and keys (eq. 16), and linear attention
//! in the paper's linear form (§3.4.3: rotated features in the numerator, plain ones in the
//! denominator); the relative-position property (shifting every position leaves the outputs
//! unchanged); padding anywhere in a sequence (positions count real tokens); decoding equal to
//! the causal forward pass; and the refusals (the variants without rotary positions, cross-
//! attention, odd head widths).

mod reference;
mod small;

use burn::prelude::*;
use burn::tensor::Tolerance;
use burn_attention_zoo::{
    Attention, AttentionConfig, AttentionInput, AttentionModule, DecodingState, HeadMasks,
    LocalForm, VARIANTS, padding_mask_from_lengths,
};
use reference::{
    elu_plus_one, favor_features, max_rel_err, normal_tensor, phi_f64, rotate_heads_f64,
    softmax_head, to_heads, to_rows,
};

const D_MODEL: usize = 16;
const N_HEADS: usize = 2;
const N_MAX: usize = 96;

fn device() -> Device {
    Device::flex()
}

fn rotary(name: &str, device: &Device) -> burn_attention_zoo::Attention {
    small::small_config(name, D_MODEL, N_HEADS, N_MAX)
        .init(device)
        .with_rotary()
        .unwrap()
}

fn rotate_rows(x: &[Vec<f64>], positions: &[f64]) -> Vec<Vec<f64>> {
    x.iter()
        .zip(positions)
        .map(|(row, &p)| rotate_heads_f64(row, p, 1, row.len()))
        .collect()
}

fn map_rows(x: &[Vec<f64>], f: impl Fn(f64) -> f64) -> Vec<Vec<f64>> {
    x.iter()
        .map(|r| r.iter().map(|&a| f(a)).collect())
        .collect()
}

/// RoFormer's linear attention for one head from the features `fq`, `fk`: `Σ_j (R_i φ(q_i))·(R_j
/// φ(k_j)) v_j / Σ_j φ(q_i)·φ(k_j)` over the keys `masked(i, j)` leaves.
fn rotary_linear_head(
    fq: &[Vec<f64>],
    fk: &[Vec<f64>],
    v: &[Vec<f64>],
    positions: &[f64],
    masked: impl Fn(usize, usize) -> bool,
) -> Vec<Vec<f64>> {
    let (q, k) = (fq, fk);
    let (rq, rk) = (rotate_rows(fq, positions), rotate_rows(fk, positions));
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    (0..q.len())
        .map(|i| {
            let keys: Vec<usize> = (0..k.len()).filter(|&j| !masked(i, j)).collect();
            let den: f64 = keys.iter().map(|&j| dot(&fq[i], &fk[j])).sum();
            (0..v[0].len())
                .map(|c| {
                    keys.iter()
                        .map(|&j| dot(&rq[i], &rk[j]) * v[j][c])
                        .sum::<f64>()
                        / den
                })
                .collect()
        })
        .collect()
}

/// The positions of a sequence whose padding is `padded`: each real position's index among the
/// real ones.
fn real_positions(padded: &[bool]) -> Vec<f64> {
    let mut seen = 0.0;
    padded
        .iter()
        .map(|&pad| {
            let p = seen;
            if !pad {
                seen += 1.0;
            }
            if pad { p - 1.0 } else { p }
        })
        .collect()
}

/// Per-head rotary attention of `softmax` and `linear` against the float64 formulas, with
/// padding inside a sequence (positions counting real tokens only), causal and not: 1e-4
/// relative (floor 0.01), at positions up to 40 and inputs of a trained model's scale.
#[test]
fn rotary_attention_matches_float64_reference() {
    let device = device();
    let (b, n, d) = (2, 41, D_MODEL / N_HEADS);
    // Sequence 0 unpadded; sequence 1 with padding in the middle and at the end.
    let padded: Vec<Vec<bool>> = vec![
        vec![false; n],
        (0..n).map(|j| (10..14).contains(&j) || j >= 37).collect(),
    ];
    let flags: Vec<bool> = padded.concat();
    let mask = Tensor::<2, Bool>::from_data(TensorData::new(flags, [b, n]), &device);
    let positions: Vec<Vec<f64>> = padded.iter().map(|p| real_positions(p)).collect();
    let positions_tensor = Tensor::<2>::from_data(
        TensorData::new(
            positions
                .concat()
                .iter()
                .map(|&p| p as f32)
                .collect::<Vec<_>>(),
            [b, n],
        ),
        &device,
    );
    let [q, k, v] = [1, 2, 3].map(|seed| normal_tensor([b, N_HEADS, n, d], seed, &device));
    let (qh, kh, vh) = (to_heads(&q), to_heads(&k), to_heads(&v));
    // The identity as values: per-head outputs that are the attention weights.
    let eye = Tensor::<2>::eye(n, &device)
        .reshape([1, 1, n, n])
        .expand([b, N_HEADS, n, n]);
    for name in [
        "softmax",
        "local",
        "local-window",
        "bigbird",
        "longformer",
        "reformer",
        "linear",
        "ff-oglu",
        "performer",
        "performer-relu",
        "hedgehog",
    ] {
        let attention = rotary(name, &device);
        let causal_forms = match attention.capabilities().causal {
            true => vec![false, true],
            false => vec![false],
        };
        for causal in causal_forms {
            let masks = HeadMasks {
                positions: Some(positions_tensor.clone()),
                ..HeadMasks::new(Some(mask.clone()), causal)
            };
            // The keys each query sees, read from the module's weights without positions
            // (BigBird's random blocks and Longformer's global rows included).
            let pattern = to_heads(
                &attention
                    .attend(
                        q.clone(),
                        k.clone(),
                        eye.clone(),
                        HeadMasks::new(Some(mask.clone()), causal),
                    )
                    .unwrap(),
            );
            let out = to_heads(
                &attention
                    .attend(q.clone(), k.clone(), v.clone(), masks)
                    .unwrap(),
            );
            for bi in 0..b {
                for h in 0..N_HEADS {
                    let pads = &padded[bi];
                    let masked = |i: usize, j: usize| pads[j] || (causal && j > i);
                    let p = &positions[bi];
                    let expected = match &attention {
                        Attention::Softmax(_) => {
                            let (rq, rk) = (rotate_rows(&qh[bi][h], p), rotate_rows(&kh[bi][h], p));
                            softmax_head(&rq, &rk, &vh[bi][h], masked)
                        }
                        // The module's pattern, the rotation by position among the real tokens.
                        Attention::BigBird(_) | Attention::Longformer(_) => {
                            let seen = &pattern[bi][h];
                            let (rq, rk) = (rotate_rows(&qh[bi][h], p), rotate_rows(&kh[bi][h], p));
                            softmax_head(&rq, &rk, &vh[bi][h], |i, j| {
                                masked(i, j) || seen[i][j] <= 0.0
                            })
                        }
                        // The keys each query met in its chunks (itself only when alone), the
                        // keys of unit length as the module normalises them, both rotated.
                        Attention::Reformer(_) => {
                            let seen = &pattern[bi][h];
                            let unit: Vec<Vec<f64>> = kh[bi][h]
                                .iter()
                                .map(|row| {
                                    let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt();
                                    row.iter().map(|x| x / norm).collect()
                                })
                                .collect();
                            let (rq, rk) = (rotate_rows(&qh[bi][h], p), rotate_rows(&unit, p));
                            softmax_head(&rq, &rk, &vh[bi][h], |i, j| {
                                masked(i, j) || seen[i][j] <= 0.0
                            })
                        }
                        // The neighbourhood by index (the block, or `window` on each side;
                        // causal: none after), the rotation by position among the real tokens.
                        Attention::Local(m) => {
                            let outside = |i: usize, j: usize| match m.form {
                                LocalForm::Blocks => i / m.block_size != j / m.block_size,
                                LocalForm::SlidingWindow => i.abs_diff(j) > m.window,
                            };
                            let (rq, rk) = (rotate_rows(&qh[bi][h], p), rotate_rows(&kh[bi][h], p));
                            softmax_head(&rq, &rk, &vh[bi][h], |i, j| masked(i, j) || outside(i, j))
                        }
                        Attention::Linear(_) => rotary_linear_head(
                            &map_rows(&qh[bi][h], elu_plus_one),
                            &map_rows(&kh[bi][h], elu_plus_one),
                            &vh[bi][h],
                            p,
                            masked,
                        ),
                        Attention::FeedForward(m) => rotary_linear_head(
                            &phi_f64(m, &qh[bi][h]),
                            &phi_f64(m, &kh[bi][h]),
                            &vh[bi][h],
                            p,
                            masked,
                        ),
                        // FAVOR+'s features as the paper writes them (no stabilisers), with
                        // the module's random features; the generalized ReLU kernel's,
                        // `ReLU(x) + 10⁻³`.
                        Attention::Performer(m) => {
                            let (fq, fk) = match &m.features {
                                Some(w) => {
                                    let w = to_rows(&w.val());
                                    (
                                        favor_features(&qh[bi][h], &w),
                                        favor_features(&kh[bi][h], &w),
                                    )
                                }
                                None => (
                                    map_rows(&qh[bi][h], |x| x.max(0.0) + 1e-3),
                                    map_rows(&kh[bi][h], |x| x.max(0.0) + 1e-3),
                                ),
                            };
                            rotary_linear_head(&fq, &fk, &vh[bi][h], p, masked)
                        }
                        Attention::Hedgehog(m) => rotary_linear_head(
                            &hedgehog_phi(&head_map(&m.query_map.val(), h), &qh[bi][h]),
                            &hedgehog_phi(&head_map(&m.key_map.val(), h), &kh[bi][h]),
                            &vh[bi][h],
                            p,
                            masked,
                        ),
                        _ => unreachable!("{name}"),
                    };
                    let real: Vec<usize> = (0..n).filter(|&i| !pads[i]).collect();
                    let pick = |rows: &[Vec<f64>]| {
                        real.iter().map(|&i| rows[i].clone()).collect::<Vec<_>>()
                    };
                    let err = max_rel_err(&pick(&out[bi][h]), &pick(&expected), 1e-2);
                    assert!(
                        err < 1e-4,
                        "{name} causal {causal} batch {bi} head {h}: {err}"
                    );
                }
            }
        }
    }
    // The reference is not the plain attention: rotation changes the outputs.
    let plain = to_heads(&burn_attention_zoo::softmax_attention(q, k, v, None, false));
    let p = &positions[0];
    let rotated = softmax_head(
        &rotate_rows(&qh[0][0], p),
        &rotate_rows(&kh[0][0], p),
        &vh[0][0],
        |_, _| false,
    );
    assert!(max_rel_err(&plain[0][0], &rotated, 1e-2) > 1e-2);
}

/// Head `h`'s `d × d` map of a Hedgehog feature-map parameter `[heads, d, d]`, in float64.
fn head_map(maps: &Tensor<3>, h: usize) -> Vec<Vec<f64>> {
    let [_, d, _] = maps.dims();
    let values = maps
        .clone()
        .slice(s![h..h + 1, .., ..])
        .into_data()
        .convert::<f64>();
    let values = values.as_slice::<f64>().unwrap();
    (0..d)
        .map(|r| values[r * d..(r + 1) * d].to_vec())
        .collect()
}

/// Hedgehog's feature map from the paper, `φ(x) = [softmax(x W), softmax(−x W)]` (softmax over
/// the features), on each row of `x`.
fn hedgehog_phi(w: &[Vec<f64>], x: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let softmax = |z: Vec<f64>| {
        let top = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = z.iter().map(|v| (v - top).exp()).collect();
        let sum: f64 = e.iter().sum();
        e.into_iter().map(|v| v / sum).collect::<Vec<f64>>()
    };
    x.iter()
        .map(|row| {
            let xw: Vec<f64> = (0..w[0].len())
                .map(|c| row.iter().zip(w).map(|(xi, wr)| xi * wr[c]).sum())
                .collect();
            let mut phi = softmax(xw.clone());
            phi.extend(softmax(xw.iter().map(|v| -v).collect()));
            phi
        })
        .collect()
}

/// The relative-position property: shifting every position by the same amount leaves softmax's
/// outputs unchanged (its scores depend on positions only through their differences), and so
/// does the kernelized form's numerator and denominator; the patterns, buckets, clusters and
/// sorts of the sparse attentions do not read the rotation. For every attention that takes
/// rotary positions and has a per-head form, but those of [`NOT_RELATIVE`].
#[test]
fn shifting_every_position_changes_nothing() {
    let device = device();
    let (b, n, d) = (2, 24, D_MODEL / N_HEADS);
    let [q, k, v] = [4, 5, 6].map(|seed| normal_tensor([b, N_HEADS, n, d], seed, &device));
    let base = Tensor::<1, Int>::arange(0..n as i64, &device)
        .float()
        .reshape([1, n])
        .expand([b, n]);
    // Positions are given through the per-head form (the module's forward counts from 0).
    let relative = VARIANTS.iter().filter(|info| {
        let c = info.capabilities;
        c.rotary && c.per_head_form && !NOT_RELATIVE.contains(&info.name)
    });
    let names: Vec<&str> = relative.map(|info| info.name).collect();
    assert!(names.len() >= 20, "{names:?}");
    for name in names {
        let attention = rotary(name, &device);
        let at = |shift: f32| {
            let masks = HeadMasks {
                positions: Some(base.clone() + shift),
                ..HeadMasks::new(None, false)
            };
            attention
                .attend(q.clone(), k.clone(), v.clone(), masks)
                .unwrap()
        };
        at(0.0)
            .into_data()
            .assert_approx_eq::<f32>(&at(37.0).into_data(), Tolerance::absolute(1e-4));
    }
}

/// With rotary positions, padding anywhere in a sequence leaves its real outputs unchanged: the
/// module's forward pass over a padded batch equals each sequence alone without padding (causal
/// too, where the variant has a causal form). For every attention that takes rotary positions
/// except the patterns that read positions from token indices ([`BY_INDEX`]), for which padding
/// inside a sequence moves the pattern itself: that their plain forms do move is checked, so
/// the list cannot hide a variant the property holds for.
#[test]
fn rotary_padding_anywhere_changes_nothing() {
    let device = device();
    let n = 20;
    let x = normal_tensor([1, n, D_MODEL], 7, &device);
    // Junk inserted at 3..6 and appended after the end.
    let junk = normal_tensor([1, 3, D_MODEL], 8, &device) * 50.0;
    let tail = normal_tensor([1, 2, D_MODEL], 9, &device) * 50.0;
    let padded_x = Tensor::cat(
        vec![
            x.clone().slice(s![.., 0..3]),
            junk,
            x.clone().slice(s![.., 3..n]),
            tail,
        ],
        1,
    );
    let flags: Vec<bool> = (0..n + 5)
        .map(|j| (3..6).contains(&j) || j >= n + 3)
        .collect();
    let mask = Tensor::<2, Bool>::from_data(TensorData::new(flags, [1, n + 5]), &device);
    // The real outputs over the padded input, and the outputs over the sequence alone.
    let both = |attention: &Attention, causal: bool| {
        let alone = attention.forward(AttentionInput::new(x.clone()).causal(causal));
        let out = attention.forward(
            AttentionInput::new(padded_x.clone())
                .mask_pad(mask.clone())
                .causal(causal),
        );
        let real = Tensor::cat(
            vec![out.clone().slice(s![.., 0..3]), out.slice(s![.., 6..n + 3])],
            1,
        );
        (real, alone)
    };
    for info in VARIANTS.iter().filter(|info| info.capabilities.rotary) {
        let name = info.name;
        let forms = if info.capabilities.causal {
            vec![false, true]
        } else {
            vec![false]
        };
        if BY_INDEX.contains(&name) {
            let plain = small::small_config(name, D_MODEL, N_HEADS, N_MAX).init(&device);
            let (real, alone) = both(&plain, false);
            let moved: f32 = (real - alone).abs().max().into_scalar();
            assert!(
                moved > 1e-3,
                "{name}: its pattern did not move with padding ({moved})"
            );
            continue;
        }
        let attention = rotary(name, &device);
        for causal in forms {
            let (real, alone) = both(&attention, causal);
            real.into_data().assert_approx_eq::<f32>(
                &alone.into_data(),
                Tolerance::absolute(1e-4).set_relative(1e-3),
            );
        }
    }
}

/// The attentions whose rotary outputs move when every position shifts: GLA's per-channel gates
/// decay the two channels of a rotated pair differently.
const NOT_RELATIVE: [&str; 1] = ["gla"];

/// The attentions whose pattern reads positions from token indices (windows, blocks, strides,
/// random blocks, routing's local heads, Sinkhorn's blocks): padding inside a sequence moves which keys a query sees, rotary or not.
const BY_INDEX: [&str; 9] = [
    "local",
    "local-window",
    "sparse",
    "sparse-strided",
    "axial",
    "bigbird",
    "longformer",
    "routing",
    "sinkhorn",
];

/// Decoding token by token with rotary positions equals the causal forward pass, and so does
/// prefilling a prompt then decoding on, padded prompts included.
#[test]
fn rotary_decoding_equals_the_causal_forward_pass() {
    let device = device();
    let n = 11;
    let taken = VARIANTS
        .iter()
        .filter(|info| info.capabilities.rotary && info.capabilities.causal);
    for name in taken.map(|info| info.name) {
        let attention = rotary(name, &device);
        let x = normal_tensor([2, n, D_MODEL], 10, &device);
        let full = attention.forward(AttentionInput::new(x.clone()).causal(true));
        let mut state = DecodingState::default();
        let mut steps = Vec::new();
        for t in 0..n {
            let (y, next) = attention
                .decode(x.clone().slice(s![.., t..t + 1]), state)
                .unwrap();
            steps.push(y);
            state = next;
        }
        Tensor::cat(steps, 1).into_data().assert_approx_eq::<f32>(
            &full.clone().into_data(),
            Tolerance::absolute(1e-4).set_relative(1e-3),
        );
        // A prompt of 6 then 5 decoded tokens.
        let (prompt_out, mut state) = attention.prefill(x.clone().slice(s![.., 0..6])).unwrap();
        prompt_out.into_data().assert_approx_eq::<f32>(
            &full.clone().slice(s![.., 0..6]).into_data(),
            Tolerance::absolute(1e-4).set_relative(1e-3),
        );
        for t in 6..n {
            let (y, next) = attention
                .decode(x.clone().slice(s![.., t..t + 1]), state)
                .unwrap();
            y.into_data().assert_approx_eq::<f32>(
                &full.clone().slice(s![.., t..t + 1]).into_data(),
                Tolerance::absolute(1e-4).set_relative(1e-3),
            );
            state = next;
        }
        // Prompts of 4 and 6 tokens padded to 6; sequence 0 then goes on from its 5th token.
        let mask = padding_mask_from_lengths(&[4, 6], 6, &device);
        let (_, state) = attention
            .prefill_padded(x.clone().slice(s![.., 0..6]), mask)
            .unwrap();
        let (y, _) = attention
            .decode(x.clone().slice(s![.., 4..5]), state)
            .unwrap();
        y.slice(s![0..1]).into_data().assert_approx_eq::<f32>(
            &full.slice(s![0..1, 4..5]).into_data(),
            Tolerance::absolute(1e-4).set_relative(1e-3),
        );
    }
}

/// `with_rotary` succeeds exactly for the variants whose capabilities say so; the others, cross-
/// attention with rotary positions and odd head widths are errors that say what.
#[test]
fn rotary_positions_are_refused_where_they_are_not_taken() {
    let device = device();
    let mut taken = Vec::new();
    for info in VARIANTS {
        let attention = small::small_config(info.name, D_MODEL, N_HEADS, N_MAX).init(&device);
        match attention.with_rotary() {
            Ok(_) => {
                assert!(info.capabilities.rotary, "{}", info.name);
                taken.push(info.name);
            }
            Err(err) => {
                assert!(!info.capabilities.rotary, "{}: {err}", info.name);
                assert!(err.to_string().contains("rotary"), "{}: {err}", info.name);
            }
        }
    }
    assert!(
        taken.contains(&"softmax") && taken.contains(&"linear"),
        "{taken:?}"
    );
    // Every variant that refuses them says why rotating by position has no meaning for it.
    for info in VARIANTS.iter().filter(|info| !info.capabilities.rotary) {
        let err = small::small_config(info.name, D_MODEL, N_HEADS, N_MAX)
            .init(&device)
            .with_rotary()
            .unwrap_err();
        assert!(
            err.to_string().contains("no meaning for it: "),
            "{}: {err}",
            info.name
        );
    }

    let attention = rotary("softmax", &device);
    let x = normal_tensor([1, 5, D_MODEL], 11, &device);
    let memory = normal_tensor([1, 7, D_MODEL], 12, &device);
    let err = attention
        .try_forward(AttentionInput::cross(x, memory.clone(), memory))
        .unwrap_err();
    assert!(err.to_string().contains("cross-attention"), "{err}");

    // Heads of width 3 (6 = 2 × 3): rotations turn pairs of channels.
    let odd = AttentionConfig::from_name("softmax", 6, 2, 8)
        .unwrap()
        .init(&device)
        .with_rotary()
        .unwrap_err();
    assert!(odd.to_string().contains("odd head width"), "{odd}");
}

/// With rotary positions, a module's forward pass and its weighted forward pass (the weights it
/// returns, over rotated queries and keys) agree, padding included: for every attention that
/// takes rotary positions and returns weights (Longformer's separate global projections rotated
/// on both paths).
#[test]
fn rotary_weights_are_those_of_the_forward_pass() {
    let device = device();
    let n = 18;
    let x = normal_tensor([2, n, D_MODEL], 13, &device);
    let mask = padding_mask_from_lengths(&[n, 13], n, &device);
    let taken = VARIANTS
        .iter()
        .filter(|info| info.capabilities.rotary && info.capabilities.returns_weights);
    let mut names = Vec::new();
    for info in taken {
        let attention = rotary(info.name, &device);
        let input = AttentionInput::new(x.clone()).mask_pad(mask.clone());
        // The real rows (padded rows' outputs are left to each path).
        let real = |y: Tensor<3>| {
            Tensor::cat(
                vec![y.clone().slice(s![0..1, ..]), y.slice(s![1..2, 0..13])],
                1,
            )
        };
        let out = real(attention.forward(input.clone()));
        let (with_weights, _) = attention.try_forward_with_weights(input).unwrap();
        real(with_weights).into_data().assert_approx_eq::<f32>(
            &out.into_data(),
            Tolerance::absolute(1e-5).set_relative(1e-4),
        );
        names.push(info.name);
    }
    assert!(
        names.contains(&"longformer") && names.contains(&"bigbird"),
        "{names:?}"
    );
}
