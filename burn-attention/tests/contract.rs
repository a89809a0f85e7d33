//! The contract beyond self-attention, for every registered variant that supports it:
//! - cross-attention (queries from one sequence, keys and values from another of a different
//!   length, each with its own padding) against a float64 reference of each variant's formula,
//!   and its invariants: cross-attention of a sequence with itself is self-attention, and
//!   padding on either side leaves the real outputs unchanged;
//! - decoding token by token equals the causal forward pass, for a layer and for an encoder;
//!   the recurrent state of the kernelized variants does not grow with the position;
//! - what is not defined is refused with an error that says what, and so is an input whose
//!   shapes do not fit.

mod reference;
mod small;

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::{Distribution, Tolerance};
use burn_attention_zoo::{
    Attention, AttentionConfig, AttentionError, AttentionInput, AttentionModule, DecodingState,
    DeltaNetConfig, EncoderBlockConfig, EncoderConfig, FeedForwardKernel, FeedForwardKernelConfig,
    GlaConfig, HeadMasks, NystromConfig, PerformerConfig, ReformerConfig, SoftmaxAttentionConfig,
    SynthesizerConfig, VARIANTS, padding_mask_from_lengths,
};
use reference::{
    efficient_head, elu_plus_one, favor_features, hedgehog_f64, kernelized_head, matmul, matrix,
    max_rel_err, nystrom_cross_f64, phi_f64, project, softmax_head, softmax_rows, to_heads,
    to_rows, transpose,
};

const D_MODEL: usize = 16;
const N_HEADS: usize = 2;
const N_MAX: usize = 24;

fn device() -> Device {
    Device::flex()
}

/// A small configuration of the variant `name` (see [`small::small_config`]).
fn config_for(name: &str) -> AttentionConfig {
    small::small_config(name, D_MODEL, N_HEADS, N_MAX)
}

fn random<const D: usize>(shape: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
}

fn tol() -> Tolerance<f32> {
    Tolerance::absolute(1e-5).set_relative(1e-4)
}

fn names_with(capability: impl Fn(&burn_attention_zoo::Capabilities) -> bool) -> Vec<&'static str> {
    VARIANTS
        .iter()
        .filter(|v| capability(&v.capabilities))
        .map(|v| v.name)
        .collect()
}

fn map_rows(x: &[Vec<f64>], f: impl Fn(f64) -> f64) -> Vec<Vec<f64>> {
    x.iter()
        .map(|r| r.iter().map(|&a| f(a)).collect())
        .collect()
}

/// A `[p, k, n_max]` projection's first matrix as f64 rows `[k][n_max]`.
fn first_projection(p: Tensor<3>) -> Vec<Vec<f64>> {
    let [_, k, n_max] = p.dims();
    to_rows(&p.slice(s![0..1]).reshape([k, n_max]))
}

/// One head of cross-attention in float64, from each variant's formula and the module's own
/// parameters: `q_len` real queries over `k_len` real keys; `None` for a variant this file has
/// no formula for (a new variant checks its formula in its own tests).
fn cross_f64(
    attention: &Attention,
    (name, head): (&str, usize),
    [q, k, v]: [&[Vec<f64>]; 3],
    (q_len, k_len): (usize, usize),
) -> Option<Vec<Vec<f64>>> {
    let (q, k, v) = (&q[..q_len], &k[..k_len], &v[..k_len]);
    let d = q[0].len() as f64;
    let all = |_: usize, _: usize| false;
    Some(match (name, attention) {
        ("softmax", _) => softmax_head(q, k, v, all),
        ("efficient", _) => efficient_head(q, k, v),
        ("linear", _) => kernelized_head(
            &map_rows(q, elu_plus_one),
            &map_rows(k, elu_plus_one),
            v,
            all,
        ),
        ("performer-relu", _) => {
            let phi = |x: f64| x.max(0.0) + 1e-3;
            kernelized_head(&map_rows(q, phi), &map_rows(k, phi), v, all)
        }
        ("performer", Attention::Performer(m)) => {
            let w = matrix(m.features.as_ref().unwrap());
            kernelized_head(&favor_features(q, &w), &favor_features(k, &w), v, all)
        }
        (_, Attention::FeedForward(m)) => kernelized_head(&phi_f64(m, q), &phi_f64(m, k), v, all),
        (_, Attention::Hedgehog(m)) => {
            let map = |w: &Param<Tensor<3>>, x: &[Vec<f64>]| {
                let w = to_rows(&w.val().slice(s![head..head + 1]).squeeze_dim::<2>(0));
                hedgehog_f64(&w, x)
            };
            kernelized_head(&map(&m.query_map, q), &map(&m.key_map, k), v, all)
        }
        (_, Attention::Linformer(m)) => {
            let e = first_projection(m.e.as_ref().unwrap().val());
            let f = first_projection(m.f.as_ref().unwrap().val());
            let e: Vec<Vec<f64>> = e.iter().map(|r| r[..k_len].to_vec()).collect();
            let f: Vec<Vec<f64>> = f.iter().map(|r| r[..k_len].to_vec()).collect();
            let (ek, fv) = (project(&e, k, |_| false), project(&f, v, |_| false));
            if name == "linformer" {
                softmax_head(q, &ek, &fv, all)
            } else {
                // H (L X): H = ρ_q(Q/√d), L = ρ_k((E K)ᵀ/√d) over the k projected positions.
                let scaled = |x: &[Vec<f64>]| map_rows(x, |a| a / d.sqrt());
                let h = softmax_rows(&scaled(q));
                let l = softmax_rows(&transpose(&scaled(&ek)));
                matmul(&h, &matmul(&l, &fv))
            }
        }
        ("nystrom", _) => nystrom_cross_f64(q, k, v, (q_len, k_len), 4, 6),
        _ => return None,
    })
}

/// Cross-attention against each variant's float64 formula, on per-head tensors with the
/// module's own parameters: 7 queries over 11 keys, both sides padded (real lengths 7 and 4
/// queries, 11 and 6 keys), compared on the real queries; 1e-4 relative (floor 0.01, see
/// `max_rel_err`). Every registered variant with cross-attention takes part, but those without a
/// per-head form (`Capabilities::per_head_form`), which must refuse it and are checked whole in
/// their own float64 tests (tests/set_transformer.rs, tests/memory_compressed.rs, tests/etc.rs,
/// tests/compressive.rs, tests/retnet.rs, tests/mamba2.rs, tests/gla.rs, tests/deltanet.rs).
/// A variant `cross_f64` has no formula for (one added since) is named on stderr and checked
/// by the invariants below only; the 13 this file knows are always checked.
#[test]
fn cross_attention_matches_float64_reference() {
    let device = device();
    device.seed(12);
    let (n_q, n_k, d) = (7, 11, D_MODEL / N_HEADS);
    let (q_lens, k_lens) = ([7, 4], [11, 6]);
    let masks = HeadMasks::cross(
        Some(padding_mask_from_lengths(&k_lens, n_k, &device)),
        Some(padding_mask_from_lengths(&q_lens, n_q, &device)),
    );
    let names = names_with(|c| c.cross_attention);
    let (mut referenced, mut unreferenced) = (Vec::new(), Vec::new());
    for name in names {
        let attention = config_for(name).init(&device);
        let q = random([2, N_HEADS, n_q, d], &device);
        let [k, v] = [0, 1].map(|_| random([2, N_HEADS, n_k, d], &device));
        if !attention.capabilities().per_head_form {
            let err = attention.attend(q, k, v, masks.clone()).unwrap_err();
            assert!(err.to_string().contains("per-head"), "{name}: {err}");
            continue;
        }
        let out = attention
            .attend(q.clone(), k.clone(), v.clone(), masks.clone())
            .unwrap();
        assert_eq!(out.dims(), [2, N_HEADS, n_q, d], "{name}");
        let (q, k, v, out) = (to_heads(&q), to_heads(&k), to_heads(&v), to_heads(&out));
        let reference = |b: usize, h: usize| {
            cross_f64(
                &attention,
                (name, h),
                [&q[b][h], &k[b][h], &v[b][h]],
                (q_lens[b], k_lens[b]),
            )
        };
        if reference(0, 0).is_none() {
            unreferenced.push(name);
            continue;
        }
        referenced.push(name);
        for (b, heads) in out.iter().enumerate() {
            for (h, head) in heads.iter().enumerate() {
                let expected = reference(b, h).unwrap();
                let err = max_rel_err(&head[..q_lens[b]], &expected, 1e-2);
                assert!(
                    err < 1e-4,
                    "{name} batch {b} head {h}: relative error {err}"
                );
            }
        }
    }
    assert!(referenced.len() >= 13, "{referenced:?}");
    if !unreferenced.is_empty() {
        eprintln!(
            "cross_attention_matches_float64_reference: no float64 formula here for \
             {unreferenced:?}; their cross-attention is checked by the invariants only"
        );
    }
}

/// Cross-attention of a sequence with itself is self-attention, masks included, for every
/// variant with cross-attention.
#[test]
fn cross_attention_with_itself_is_self_attention() {
    let device = device();
    let mask = padding_mask_from_lengths(&[9, 5], 9, &device);
    for name in names_with(|c| c.cross_attention) {
        let attention = config_for(name).init(&device);
        let x = random([2, 9, D_MODEL], &device);
        let own = attention.forward(AttentionInput::new(x.clone()).mask_pad(mask.clone()));
        let cross = attention.forward(
            AttentionInput::cross(x.clone(), x.clone(), x)
                .mask_pad(mask.clone())
                .mask_pad_query(mask.clone()),
        );
        for (b, len) in [(0, 9), (1, 5)] {
            cross
                .clone()
                .slice(s![b..b + 1, 0..len])
                .into_data()
                .assert_approx_eq::<f32>(
                    &own.clone().slice(s![b..b + 1, 0..len]).into_data(),
                    tol(),
                );
        }
    }
}

/// Padding on both sides of cross-attention leaves the real outputs unchanged: a batch of two
/// with 5 and 3 real queries over 8 and 4 real keys, padded (with large junk) to 9 queries and 13
/// keys, equals each pair run alone without padding. For every variant with cross-attention.
#[test]
fn cross_attention_padding_on_both_sides() {
    let device = device();
    device.seed(13);
    let (q_lens, k_lens) = ([5, 3], [8, 4]);
    let (n_q, n_k) = (9, 13);
    for name in names_with(|c| c.cross_attention) {
        let attention = config_for(name).init(&device);
        let queries = random([2, n_q, D_MODEL], &device);
        let memory = random([2, n_k, D_MODEL], &device);
        let q_real = padding_mask_from_lengths(&q_lens, n_q, &device).bool_not();
        let k_real = padding_mask_from_lengths(&k_lens, n_k, &device).bool_not();
        let junk = |x: Tensor<3>, real: Tensor<2, Bool>| {
            let [b, n, d] = x.dims();
            random([b, n, d], &device)
                .mul_scalar(50.0)
                .mask_where(real.reshape([b, n, 1]).expand([b, n, d]), x)
        };
        let padded = attention.forward(
            AttentionInput::cross(
                junk(queries.clone(), q_real),
                junk(memory.clone(), k_real.clone()),
                junk(memory.clone(), k_real),
            )
            .mask_pad(padding_mask_from_lengths(&k_lens, n_k, &device))
            .mask_pad_query(padding_mask_from_lengths(&q_lens, n_q, &device)),
        );
        for b in 0..2 {
            let q = queries.clone().slice(s![b..b + 1, 0..q_lens[b]]);
            let m = memory.clone().slice(s![b..b + 1, 0..k_lens[b]]);
            let alone = attention.forward(AttentionInput::cross(q, m.clone(), m));
            padded
                .clone()
                .slice(s![b..b + 1, 0..q_lens[b]])
                .into_data()
                .assert_approx_eq::<f32>(&alone.into_data(), tol());
        }
    }
}

/// Cross-attention reads its values: with the same queries and keys and values unlike the keys,
/// other values give other outputs (at every real query), and the values receive a gradient
/// that is finite and not zero. For every variant with cross-attention, padded on both sides.
#[test]
fn cross_attention_reads_its_values() {
    let device = device().autodiff();
    device.seed(15);
    let (q_lens, k_lens) = ([7, 4], [11, 6]);
    let (n_q, n_k) = (7, 11);
    for name in names_with(|c| c.cross_attention) {
        let attention = config_for(name).init(&device);
        let queries = random([2, n_q, D_MODEL], &device);
        let keys = random([2, n_k, D_MODEL], &device);
        let [values, other] = [0, 1].map(|_| random([2, n_k, D_MODEL], &device));
        let values = values.require_grad();
        let run = |v: Tensor<3>| {
            attention.forward(
                AttentionInput::cross(queries.clone(), keys.clone(), v)
                    .mask_pad(padding_mask_from_lengths(&k_lens, n_k, &device))
                    .mask_pad_query(padding_mask_from_lengths(&q_lens, n_q, &device)),
            )
        };
        let out = run(values.clone());
        let moved = (out.clone() - run(other)).abs().max_dim(2); // [2, n_q, 1]
        for (b, len) in q_lens.into_iter().enumerate() {
            let least: f32 = moved
                .clone()
                .slice(s![b..b + 1, 0..len])
                .min()
                .into_scalar();
            assert!(
                least > 1e-4,
                "{name} batch {b}: a real query's output did not move with the values ({least})"
            );
        }
        let g = random([2, n_q, D_MODEL], &device);
        let grads = (out * g).sum().backward();
        let grad = values.grad(&grads).expect("the values' gradient");
        let largest: f32 = grad.clone().abs().max().into_scalar();
        assert!(
            largest.is_finite() && largest > 1e-6,
            "{name}: the values' gradient is {largest} at its largest"
        );
    }
}

/// A padding mask is honoured wherever the padding sits: at the start of a sequence, inside it
/// and at its end, other junk (50 times the inputs' scale) at the padded positions leaves every
/// real position's output unchanged. For every variant that takes a padding mask, without and
/// (where the variant has it) with causal masking, and again with rotary positions on where it
/// takes them.
#[test]
fn padding_anywhere_leaves_real_outputs_unchanged() {
    let device = device();
    device.seed(16);
    let n = 12;
    // Batch 0 padded at the start, 1 inside, 2 at the end.
    let padded = |b: usize, i: usize| match b {
        0 => i < 3,
        1 => (5..8).contains(&i),
        _ => i >= 9,
    };
    let flags: Vec<bool> = (0..3)
        .flat_map(|b| (0..n).map(move |i| padded(b, i)))
        .collect();
    let mask = Tensor::<2, Bool>::from_data(TensorData::new(flags, [3, n]), &device);
    let real = mask
        .clone()
        .bool_not()
        .reshape([3, n, 1])
        .expand([3, n, D_MODEL]);
    for name in names_with(|c| c.padding_mask) {
        let causal = VARIANTS
            .iter()
            .find(|v| v.name == name)
            .is_some_and(|v| v.capabilities.causal);
        let attention = config_for(name).init(&device);
        let rotary = attention.clone().with_rotary().ok();
        let x = random([3, n, D_MODEL], &device);
        let [a, b] = [0, 1].map(|_| {
            random([3, n, D_MODEL], &device)
                .mul_scalar(50.0)
                .mask_where(real.clone(), x.clone())
        });
        for (attention, positions) in [(Some(attention), "plain"), (rotary, "rotary")] {
            let Some(attention) = attention else { continue };
            for causal in [false, true].into_iter().filter(|&c| !c || causal) {
                let run = |x: Tensor<3>| {
                    attention.forward(AttentionInput::new(x).mask_pad(mask.clone()).causal(causal))
                };
                let (out_a, out_b) = (run(a.clone()), run(b.clone()));
                for batch in 0..3 {
                    for i in (0..n).filter(|&i| !padded(batch, i)) {
                        let at = |o: &Tensor<3>| o.clone().slice(s![batch..batch + 1, i..i + 1]);
                        let diff: f32 = (at(&out_a) - at(&out_b)).abs().max().into_scalar();
                        let size: f32 = at(&out_a).abs().max().into_scalar();
                        assert!(
                            diff <= 1e-4 * size.max(1.0),
                            "{name} ({positions}) causal {causal}: padding {} moved position {i} \
                             by {diff}",
                            ["at the start", "inside", "at the end"][batch]
                        );
                    }
                }
            }
        }
    }
}

/// What cross-attention cannot do is refused with an error that names it: causal masking
/// between sequences of different lengths, Nyströmformer's convolution skip, more keys than
/// Linformer's `n_max`.
#[test]
fn cross_attention_refusals_name_the_reason() {
    let device = device();
    let (q, m) = (
        random([1, 4, D_MODEL], &device),
        random([1, 6, D_MODEL], &device),
    );
    let cross = || AttentionInput::cross(q.clone(), m.clone(), m.clone());
    let err = config_for("softmax")
        .init(&device)
        .try_forward(cross().causal(true))
        .unwrap_err();
    assert!(err.to_string().contains("causal"), "{err}");
    let nystrom = AttentionConfig::Nystrom(
        NystromConfig::new(D_MODEL, N_HEADS)
            .with_n_landmarks(2)
            .with_conv_kernel(Some(3)),
    );
    let err = nystrom.init(&device).try_forward(cross()).unwrap_err();
    assert!(err.to_string().contains("conv_kernel"), "{err}");
    assert!(nystrom.check_input(4, 6, false).is_err());
    let long = random([1, N_MAX + 1, D_MODEL], &device);
    let err = config_for("linformer")
        .init(&device)
        .try_forward(AttentionInput::cross(q.clone(), long.clone(), long))
        .unwrap_err();
    assert!(err.to_string().contains("n_max"), "{err}");
}

/// Every causal configuration: each registered causal variant and the gated kernel at depth 2.
fn causal_configs() -> Vec<AttentionConfig> {
    let mut configs: Vec<AttentionConfig> = names_with(|c| c.causal)
        .into_iter()
        .map(config_for)
        .collect();
    configs.push(AttentionConfig::FeedForward(
        FeedForwardKernelConfig::new(D_MODEL, N_HEADS, FeedForwardKernel::Glu).with_depth(2),
    ));
    configs
}

/// Runs `decode` over the positions of `x: [batch, n, d_model]` one at a time, concatenating
/// the outputs; also returns the final state.
fn decode_all<S>(
    x: &Tensor<3>,
    mut state: S,
    mut step: impl FnMut(Tensor<3>, S) -> (Tensor<3>, S),
) -> (Tensor<3>, S) {
    let n = x.dims()[1];
    let mut outputs = Vec::with_capacity(n);
    for t in 0..n {
        let (y, next) = step(x.clone().slice(s![.., t..t + 1]), state);
        outputs.push(y);
        state = next;
    }
    (Tensor::cat(outputs, 1), state)
}

/// Decoding token by token equals the causal forward pass at every position, for every causal
/// variant, over 70 positions (two chunks of the chunked causal form) at input norms of √d_model
/// and 3√d_model; the kernelized and decaying variants' state is the same size
/// ([`DecodingState::num_elements`]) after 1 token and after 70, softmax's cache n times the first.
#[test]
fn decoding_equals_causal_forward() {
    let device = device();
    device.seed(14);
    let n = 70;
    for config in causal_configs() {
        let attention = config.init(&device);
        for norm in [1.0, 3.0] {
            let x = random([2, n, D_MODEL], &device).mul_scalar(norm);
            let full = attention.forward(AttentionInput::new(x.clone()).causal(true));
            let (decoded, state) = decode_all(&x, DecodingState::default(), |x, state| {
                attention.decode(x, state).unwrap()
            });
            // Absolute 5e-5: outputs reach about 17 at the larger norm, and softmax's fused
            // forward and its step sum in different orders (up to 2e-5 apart over 200 draws of
            // weights and inputs; a per-element relative bound alone fails on outputs near 0).
            decoded.into_data().assert_approx_eq::<f32>(
                &full.into_data(),
                Tolerance::absolute(5e-5).set_relative(2e-4),
            );
            let (_, first) = attention
                .decode(x.clone().slice(s![.., 0..1]), DecodingState::default())
                .unwrap();
            let (first_size, last_size) = (first.num_elements(), state.num_elements());
            match (first, state) {
                (DecodingState::Recurrent(first), DecodingState::Recurrent(last)) => {
                    assert_eq!(first.s.dims(), last.s.dims(), "{}", config.name());
                    assert_eq!(first.z.dims(), last.z.dims(), "{}", config.name());
                    assert_eq!(first_size, last_size, "{}", config.name());
                }
                (DecodingState::Decayed(first), DecodingState::Decayed(last)) => {
                    assert_eq!(first.s.dims(), last.s.dims(), "{}", config.name());
                    let [b, h, d_k, d_v] = last.s.dims();
                    assert_eq!(last_size, b * h * d_k * d_v + b, "{}", config.name());
                    assert_eq!(first_size, last_size, "{}", config.name());
                    let seen = last.seen.into_data().try_to_vec::<f32>().unwrap();
                    assert_eq!(seen, [n as f32; 2], "{}", config.name());
                }
                (
                    DecodingState::KeyValueCache { .. },
                    DecodingState::KeyValueCache { keys, .. },
                ) if !config.name().starts_with("local") && config.name() != "transformer-xl" => {
                    assert_eq!(keys.dims()[2], n, "{}", config.name());
                    // Keys and values: 2 sequences × heads × n positions × d_head each.
                    let d_head = keys.dims()[3];
                    assert_eq!(last_size, 2 * 2 * N_HEADS * n * d_head, "{}", config.name());
                    assert_eq!(first_size * n, last_size, "{}", config.name());
                }
                (
                    DecodingState::KeyValueCache { .. },
                    DecodingState::KeyValueCache { keys, .. },
                ) => {
                    // Local attention keeps only its neighbourhood (small configurations:
                    // blocks of 4, windows of 2); Transformer-XL the memory and segments a later
                    // token can see (fewer than mem_len + 2 segment_len = 6 + 16 positions).
                    let bound = if config.name() == "transformer-xl" {
                        22
                    } else {
                        4
                    };
                    assert!(
                        keys.dims()[2] <= bound,
                        "{}: {:?}",
                        config.name(),
                        keys.dims()
                    );
                }
                (
                    DecodingState::Compressed { .. },
                    DecodingState::Compressed { blocks, current },
                ) => {
                    // Memory-compressed attention: the 23 finished blocks of 3, compressed, and
                    // the 70th position uncompressed.
                    let blocks = blocks.expect("finished blocks");
                    assert_eq!(blocks.keys.dims()[2], n / 3, "{}", config.name());
                    assert_eq!(current.expect("block under way").keys.dims()[2], n % 3);
                }
                (DecodingState::Compressive(_), DecodingState::Compressive(memories)) => {
                    // The Compressive Transformer: per sequence, at most c − 1 + mem_len + s
                    // inputs and cmem_len compressed slots (the small configuration's c, mem_len,
                    // s and cmem_len below), whatever the position.
                    let AttentionConfig::Compressive(sizes) = config_for(config.name()) else {
                        panic!(
                            "{}: a compressive state from another variant",
                            config.name()
                        );
                    };
                    let (c, mem_len, s, cmem_len) = (
                        sizes.compression,
                        sizes.mem_len,
                        sizes.segment_len,
                        sizes.cmem_len,
                    );
                    for memory in memories {
                        assert_eq!(memory.seen, n, "{}", config.name());
                        let inputs = memory.recent.expect("inputs")[0].dims()[0];
                        assert!(
                            inputs < c + mem_len + s,
                            "{}: {inputs} inputs",
                            config.name()
                        );
                        let slots = memory.compressed.expect("compressed slots")[0].dims()[0];
                        assert!(slots <= cmem_len, "{}: {slots} slots", config.name());
                    }
                }
                (_, other) => panic!("{}: unexpected state {other:?}", config.name()),
            }
        }
    }
}

/// Prefilling a prompt in one pass equals decoding it token by token, for every causal
/// variant: the prompt's outputs are the causal forward pass's, and decoding goes on from the
/// prefilled state exactly as from the token-by-token one (prompts of 1, 69 and 70 positions:
/// one token, and both sides of a chunk and of the local blocks' boundaries; input norms √d_model
/// and 3√d_model).
#[test]
fn prefill_equals_token_by_token_decoding() {
    let device = device();
    device.seed(16);
    let (n, more) = (70, 5);
    for config in causal_configs() {
        let attention = config.init(&device);
        for (prompt_len, norm) in [(1, 1.0), (n - 1, 3.0), (n, 1.0)] {
            let x = random([2, prompt_len + more, D_MODEL], &device).mul_scalar(norm);
            let full = attention.forward(AttentionInput::new(x.clone()).causal(true));
            let prompt = x.clone().slice(s![.., 0..prompt_len]);
            let (prefilled, state) = attention.prefill(prompt.clone()).unwrap();
            // As in `decoding_equals_causal_forward`: softmax's fused forward and its step sum in
            // different orders.
            let tolerance = Tolerance::absolute(5e-5).set_relative(2e-4);
            prefilled.into_data().assert_approx_eq::<f32>(
                &full.clone().slice(s![.., 0..prompt_len]).into_data(),
                tolerance,
            );
            let (_, stepped) = decode_all(&prompt, DecodingState::default(), |x, state| {
                attention.decode(x, state).unwrap()
            });
            let rest = x.slice(s![.., prompt_len..]);
            let step = |x, state| attention.decode(x, state).unwrap();
            let (after_prefill, _) = decode_all(&rest, state, step);
            let (after_steps, _) = decode_all(&rest, stepped, step);
            let expected = full.slice(s![.., prompt_len..]).into_data();
            after_prefill
                .into_data()
                .assert_approx_eq::<f32>(&expected, tolerance);
            after_steps
                .into_data()
                .assert_approx_eq::<f32>(&expected, tolerance);
        }
    }
}

/// Prompts of different lengths in one batch: prefilled padded to the longest, each goes on
/// decoding from its own end (one new token per prompt a step) exactly as when it is alone:
/// softmax (its cache's padding masked), every kernelized variant (padding left out of the
/// sums), and the position-dependent patterns (`Capabilities::prefill_end_padding_only`:
/// positions read from where tokens sit, so padding must follow each prompt, and padding before
/// a prompt's end is refused; the other variants take it).
#[test]
fn prompts_of_different_lengths_decode_on_from_their_own_ends() {
    let device = device();
    device.seed(18);
    let (longest, shorter, more) = (70, 45, 5);
    for config in causal_configs() {
        let attention = config.init(&device);
        let name = config.name();
        // Two sequences, each with `more` tokens after its prompt.
        let seqs = [
            random([1, longest + more, D_MODEL], &device),
            random([1, shorter + more, D_MODEL], &device),
        ];
        let lengths = [longest, shorter];
        // The batch of prompts: the shorter one padded with unrelated values.
        let padded_short = Tensor::cat(
            vec![
                seqs[1].clone().slice(s![.., 0..shorter]),
                random([1, longest - shorter, D_MODEL], &device).mul_scalar(5.0),
            ],
            1,
        );
        let prompts = Tensor::cat(
            vec![seqs[0].clone().slice(s![.., 0..longest]), padded_short],
            0,
        );
        let mask = padding_mask_from_lengths(&lengths, longest, &device);
        let (prefilled, mut state) = attention
            .prefill_padded(prompts.clone(), mask)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // The variants that read a token's position from where it sits refuse padding before
        // the end of a prompt; the others take it.
        let mut inner = vec![false; 2 * longest];
        inner[longest + 3] = true;
        let inner = Tensor::<2, Bool>::from_data(TensorData::new(inner, [2, longest]), &device);
        match attention.prefill_padded(prompts, inner) {
            Err(err) => assert!(
                attention.capabilities().prefill_end_padding_only
                    && err.to_string().contains("after their end"),
                "{name}: {err}"
            ),
            Ok(_) => assert!(
                !attention.capabilities().prefill_end_padding_only,
                "{name}: took padding before a prompt's end"
            ),
        }
        let tolerance = Tolerance::absolute(1e-5).set_relative(2e-4);
        let alone: Vec<Tensor<3>> = seqs
            .iter()
            .map(|x| attention.forward(AttentionInput::new(x.clone()).causal(true)))
            .collect();
        for (b, len) in lengths.into_iter().enumerate() {
            prefilled
                .clone()
                .slice(s![b..b + 1, 0..len])
                .into_data()
                .assert_approx_eq::<f32>(
                    &alone[b].clone().slice(s![.., 0..len]).into_data(),
                    tolerance,
                );
        }
        for t in 0..more {
            let tokens = Tensor::cat(
                vec![
                    seqs[0].clone().slice(s![.., longest + t..longest + t + 1]),
                    seqs[1].clone().slice(s![.., shorter + t..shorter + t + 1]),
                ],
                0,
            );
            let (y, next) = attention.decode(tokens, state).unwrap();
            state = next;
            for (b, len) in lengths.into_iter().enumerate() {
                y.clone()
                    .slice(s![b..b + 1])
                    .into_data()
                    .assert_approx_eq::<f32>(
                        &alone[b]
                            .clone()
                            .slice(s![.., len + t..len + t + 1])
                            .into_data(),
                        tolerance,
                    );
            }
        }
    }
}

/// An encoder prefills every block's state from a prompt in one pass and decodes on from it as
/// the causal forward pass does.
#[test]
fn encoder_prefill_then_decoding_equals_causal_forward() {
    let device = device();
    device.seed(17);
    for name in ["softmax", "linear", "performer", "local", "ff-glu"] {
        let block = EncoderBlockConfig::new(config_for(name), 32);
        let encoder = EncoderConfig::new(block, 2).init(&device);
        let x = random([2, 45, D_MODEL], &device);
        let full = encoder.forward(AttentionInput::new(x.clone()).causal(true));
        let (prefilled, states) = encoder.prefill(x.clone().slice(s![.., 0..40])).unwrap();
        assert_eq!(states.len(), 2);
        let (decoded, _) = decode_all(&x.slice(s![.., 40..]), states, |x, states| {
            encoder.decode(x, states).unwrap()
        });
        let tolerance = Tolerance::absolute(1e-5).set_relative(2e-4);
        prefilled
            .into_data()
            .assert_approx_eq::<f32>(&full.clone().slice(s![.., 0..40]).into_data(), tolerance);
        decoded
            .into_data()
            .assert_approx_eq::<f32>(&full.slice(s![.., 40..]).into_data(), tolerance);
    }
}

/// A two-layer encoder decoding token by token equals its causal forward pass (the LM use).
#[test]
fn encoder_decoding_equals_causal_forward() {
    let device = device();
    device.seed(15);
    for name in ["softmax", "linear", "performer", "ff-glu"] {
        let block = EncoderBlockConfig::new(config_for(name), 32);
        let encoder = EncoderConfig::new(block, 2).init(&device);
        let x = random([2, 40, D_MODEL], &device);
        let full = encoder.forward(AttentionInput::new(x.clone()).causal(true));
        let (decoded, states) = decode_all(&x, Vec::new(), |x, states| {
            encoder.decode(x, states).unwrap()
        });
        assert_eq!(states.len(), 2);
        decoded.into_data().assert_approx_eq::<f32>(
            &full.into_data(),
            Tolerance::absolute(1e-5).set_relative(2e-4),
        );
    }
}

/// Variants without a causal form refuse to decode, naming what they do not support.
#[test]
fn decoding_is_refused_without_a_causal_form() {
    let device = device();
    for name in names_with(|c| !c.causal) {
        let attention = config_for(name).init(&device);
        let err = attention
            .decode(random([1, 1, D_MODEL], &device), DecodingState::default())
            .unwrap_err();
        assert!(err.to_string().contains("decoding"), "{name}: {err}");
    }
}

/// Inputs whose shapes do not fit, through every entry point of every registered variant: an
/// error that names the variant, never a panic (Burn's ops panic on most of these shapes, so a
/// variant that reached its tensor work with one would fail here). `Attention` only passes each
/// call on, so this checks each variant's own module, as a model that embeds it directly uses
/// it. Empty sequences, decoding
/// steps of other than one token, a width other than `d_model`, keys and values that disagree
/// with each other or with the queries' batch, masks of the wrong shape.
#[test]
fn inputs_that_do_not_fit_are_refused_by_name() {
    let device = device();
    let sequence = |batch: usize, n: usize, d: usize| random([batch, n, d], &device);
    let (empty, x) = (sequence(2, 0, D_MODEL), sequence(2, 3, D_MODEL));
    let narrow = sequence(2, 3, D_MODEL / 2);
    let padding = |batch: usize, n: usize| padding_mask_from_lengths(&vec![n; batch], n, &device);
    for info in VARIANTS {
        let name = info.name;
        let attention = config_for(name).init(&device);
        let forward = |input: AttentionInput| attention.try_forward(input).map(drop);
        let cross = |k: Tensor<3>, v: Tensor<3>| AttentionInput::cross(x.clone(), k, v);
        type Call<'a> = &'a dyn Fn() -> Result<(), AttentionError>;
        let calls: [(&str, Call); 19] = [
            ("an empty sequence", &|| {
                forward(AttentionInput::new(empty.clone()))
            }),
            ("an empty causal sequence", &|| {
                forward(AttentionInput::new(empty.clone()).causal(true))
            }),
            ("no keys", &|| forward(cross(empty.clone(), empty.clone()))),
            ("no weights to return", &|| {
                let input = AttentionInput::new(empty.clone());
                attention.try_forward_with_weights(input).map(drop)
            }),
            ("an empty sequence with a loss", &|| {
                let input = AttentionInput::new(empty.clone());
                attention.try_forward_with_loss(input).map(drop)
            }),
            ("an empty sequence with memory", &|| {
                let input = AttentionInput::new(empty.clone());
                attention.forward_with_memory(input, None).map(drop)
            }),
            ("an empty prompt", &|| {
                attention.prefill(empty.clone()).map(drop)
            }),
            ("an empty padded prompt", &|| {
                attention
                    .prefill_padded(empty.clone(), padding(2, 0))
                    .map(drop)
            }),
            ("decoding no token", &|| {
                attention
                    .decode(empty.clone(), DecodingState::default())
                    .map(drop)
            }),
            ("decoding three tokens", &|| {
                attention
                    .decode(x.clone(), DecodingState::default())
                    .map(drop)
            }),
            ("a narrow sequence", &|| {
                forward(AttentionInput::new(narrow.clone()))
            }),
            ("narrow keys", &|| {
                forward(cross(narrow.clone(), narrow.clone()))
            }),
            ("fewer values than keys", &|| {
                forward(cross(sequence(2, 6, D_MODEL), sequence(2, 5, D_MODEL)))
            }),
            ("keys of another batch", &|| {
                let memory = sequence(3, 6, D_MODEL);
                forward(cross(memory.clone(), memory))
            }),
            ("a padding mask of another length", &|| {
                forward(AttentionInput::new(x.clone()).mask_pad(padding(2, 4)))
            }),
            ("a padding mask of another batch", &|| {
                forward(AttentionInput::new(x.clone()).mask_pad(padding(3, 3)))
            }),
            ("a narrow prompt", &|| {
                attention.prefill(narrow.clone()).map(drop)
            }),
            ("a prompt's padding mask of another length", &|| {
                attention.prefill_padded(x.clone(), padding(2, 4)).map(drop)
            }),
            ("decoding a narrow token", &|| {
                let token = sequence(2, 1, D_MODEL / 2);
                attention.decode(token, DecodingState::default()).map(drop)
            }),
        ];
        for (call, run) in calls {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run));
            let err = match result {
                Ok(Err(err)) => err.to_string(),
                Ok(Ok(())) => panic!("{name}, {call}: accepted"),
                Err(_) => panic!("{name}, {call}: panicked"),
            };
            assert!(err.starts_with(name), "{name}, {call}: {err}");
        }
    }
    // An encoder: its blocks check before their LayerNorm reads the width.
    let block = EncoderBlockConfig::new(config_for("softmax"), 32);
    let encoder = EncoderConfig::new(block, 2).init(&device);
    let err = encoder
        .try_forward(AttentionInput::new(narrow.clone()))
        .unwrap_err();
    assert!(err.to_string().contains("[batch, n_q, d_model]"), "{err}");
    let err = encoder.prefill(narrow.clone()).unwrap_err();
    assert!(err.to_string().contains("[batch, n, d_model]"), "{err}");
}

/// A variant's own module, built from its own configuration and used without the registry,
/// refuses a narrow sequence, a narrow prompt and a step of three tokens by name, as through
/// `Attention`: one module of each way the contract is implemented (the shared projections,
/// the recurrent macro, the kernelized prefill, modules of their own).
#[test]
fn variant_modules_used_alone_refuse_what_does_not_fit() {
    fn refuses(m: &impl AttentionModule, device: &Device) {
        let narrow = random([2, 3, D_MODEL / 2], device);
        let three = random([2, 3, D_MODEL], device);
        let calls = [
            (
                "a narrow sequence",
                m.try_forward(AttentionInput::new(narrow.clone())).map(drop),
            ),
            ("a narrow prompt", m.prefill(narrow).map(drop)),
            (
                "three tokens",
                m.decode(three, DecodingState::default()).map(drop),
            ),
        ];
        for (call, result) in calls {
            let err = result.expect_err(call).to_string();
            assert!(err.starts_with(m.name()), "{}, {call}: {err}", m.name());
        }
    }
    let device = device();
    refuses(
        &SoftmaxAttentionConfig::new(D_MODEL, N_HEADS).init(&device),
        &device,
    );
    refuses(
        &PerformerConfig::new(D_MODEL, N_HEADS).init(&device),
        &device,
    );
    refuses(
        &DeltaNetConfig::new(D_MODEL, N_HEADS).init(&device),
        &device,
    );
    refuses(&GlaConfig::new(D_MODEL, N_HEADS).init(&device), &device);
    refuses(
        &ReformerConfig::new(D_MODEL, N_HEADS).init(&device),
        &device,
    );
    refuses(
        &SynthesizerConfig::new(D_MODEL, N_HEADS, N_MAX).init(&device),
        &device,
    );
}

/// `EncoderConfig::num_params` counts before anything is built: for every variant (Linformer's
/// layer-wise shared projection included) it equals Burn's count over the built encoder (and
/// `num_trainable_params` the count of what that encoder trains), and a
/// configuration whose count overflows gives `None` rather than a panic or an allocation.
#[test]
fn encoder_parameters_are_counted_from_shapes_before_building() {
    let device = device();
    for variant in VARIANTS {
        for n_layers in [1, 3] {
            let config = EncoderConfig::new(
                EncoderBlockConfig::new(config_for(variant.name), 24),
                n_layers,
            );
            let counted = config.num_params(&device).unwrap();
            let built = config.init(&device);
            assert_eq!(
                counted,
                Some(built.num_params()),
                "{} at {n_layers} layers",
                variant.name
            );
            // And what it trains: the frozen parameters (random features, rotations,
            // priorities) counted from the configuration's shapes.
            assert_eq!(
                config.num_trainable_params(&device).unwrap(),
                Some(burn_attention_zoo::num_trainable_params(&built)),
                "{} at {n_layers} layers: trainable",
                variant.name
            );
        }
    }
    let shared = AttentionConfig::from_name("linformer", D_MODEL, N_HEADS, N_MAX)
        .unwrap()
        .with_params(
            serde_json::json!({"sharing": "layerwise"})
                .as_object()
                .unwrap(),
        )
        .unwrap();
    let config = EncoderConfig::new(EncoderBlockConfig::new(shared, 24), 3);
    assert_eq!(
        config.num_params(&device).unwrap(),
        Some(config.init(&device).num_params())
    );
    let huge = AttentionConfig::from_name("softmax", 1 << 31, 1, N_MAX).unwrap();
    let config = EncoderConfig::new(EncoderBlockConfig::new(huge, 1 << 31), usize::MAX / 2);
    assert_eq!(config.num_params(&device).unwrap(), None);
}
