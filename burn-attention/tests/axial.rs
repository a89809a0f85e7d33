//! Axial attention against a float64 reference written from its definition: the sequence laid
//! out in rows of `width`, the first ⌈H/2⌉ heads attending along each query's row and the others
//! along its column, as masked softmax attention over the whole sequence (keys off the axis
//! excluded, with padding, causal raster order and an arbitrary attention mask on top). The
//! module computes it by reshaping the grid; the dense form serves masks and weights: both are
//! checked here, with rows that do and do not divide the length, a square grid read from the
//! input, 2 and 3 heads, inputs at scale 1 and 4. The registry suite adds padding, batch,
//! decoding and the invariants.

mod reference;

use burn::prelude::*;
use burn_attention_zoo::{
    AttentionConfig, AttentionInput, AttentionModule, AxialAttention, AxialConfig, DecodingState,
    HeadMasks, VariantConfig, padding_mask_from_lengths,
};
use reference::{max_rel_err, normal_tensor, softmax_head, to_heads};

/// One head's output in float64: query i over the keys j on its axis (`row`: same row, else same
/// column, rows of `width`), less padded keys, keys after i when `causal`, and `hidden(i, j)`.
#[allow(clippy::too_many_arguments)]
fn axial_head_f64(
    [q, k, v]: [&[Vec<f64>]; 3],
    row: bool,
    width: usize,
    len: usize,
    causal: bool,
    hidden: impl Fn(usize, usize) -> bool,
) -> Vec<Vec<f64>> {
    softmax_head(q, k, v, |i, j| {
        let on_axis = if row {
            i / width == j / width
        } else {
            i % width == j % width
        };
        !on_axis || j >= len || (causal && j > i) || hidden(i, j)
    })
}

fn module(heads: usize, width: Option<usize>, device: &Device) -> AxialAttention {
    AxialConfig::new(12, heads).with_width(width).init(device)
}

/// The per-head form against float64: (n, width, heads) = (10, 4, 2), (10, 3, 3), (16, unset,
/// 3) (read as 4 × 4) and (23, 5, 2); padded and not, causal and not, scale 1 and 4; and with an
/// attention mask (the dense form), whose weights are checked too.
#[test]
fn axial_matches_float64_reference() {
    let device = Device::flex();
    for (case, (n, width, heads)) in [
        (10, Some(4), 2),
        (10, Some(3), 3),
        (16, None, 3),
        (23, Some(5), 2),
    ]
    .into_iter()
    .enumerate()
    {
        let m = module(heads, width, &device);
        let rows = width.unwrap_or(4);
        let d = 12 / heads;
        for (variant, (causal, padded, scale)) in [
            (false, false, 1.0),
            (true, false, 4.0),
            (false, true, 4.0),
            (true, true, 1.0),
        ]
        .into_iter()
        .enumerate()
        {
            let seed = 10 * case as u64 + variant as u64;
            let [q, k, v] = [0, 1, 2]
                .map(|i| normal_tensor([2, heads, n, d], 3 * seed + i, &device).mul_scalar(scale));
            let lengths = if padded { [n, n - 3] } else { [n, n] };
            let pad = padded.then(|| padding_mask_from_lengths(&lengths, n, &device));
            let (mask, flags) = {
                let draws = normal_tensor([2, n, n], 1000 + seed, &device)
                    .into_data()
                    .try_to_vec::<f32>()
                    .unwrap();
                // About a fifth hidden, never a query's own position.
                let flags: Vec<bool> = draws
                    .iter()
                    .enumerate()
                    .map(|(x, &a)| a > 0.85 && x % n != x / n % n)
                    .collect();
                let mask = Tensor::<3, Bool>::from_data(
                    TensorData::new(flags.clone(), [2, n, n]),
                    &device,
                );
                (mask, flags)
            };
            for with_mask in [false, true] {
                let masks = HeadMasks {
                    key_pad: pad.clone(),
                    query_pad: pad.clone(),
                    attn: with_mask.then(|| mask.clone()),
                    causal,
                    positions: None,
                };
                let out = to_heads(&m.attend(q.clone(), k.clone(), v.clone(), masks).unwrap());
                let (qh, kh, vh) = (to_heads(&q), to_heads(&k), to_heads(&v));
                for b in 0..2 {
                    for h in 0..heads {
                        let hidden = |i: usize, j: usize| with_mask && flags[(b * n + i) * n + j];
                        let expected = axial_head_f64(
                            [&qh[b][h], &kh[b][h], &vh[b][h]],
                            h < heads.div_ceil(2),
                            rows,
                            lengths[b],
                            causal,
                            hidden,
                        );
                        let len = lengths[b];
                        let err = max_rel_err(&out[b][h][..len], &expected[..len], 1e-2);
                        assert!(
                            err < 1e-4,
                            "n {n} width {width:?} heads {heads} causal {causal} padded {padded} \
                             mask {with_mask} batch {b} head {h}: relative error {err}"
                        );
                    }
                }
            }
        }
    }
}

/// The weights returned: each head's row sums to one over its axis (0 off it), and the output
/// returned with them is the forward pass's.
#[test]
fn weights_lie_on_each_heads_axis() {
    let device = Device::flex();
    let (n, width) = (14, 4);
    let m = module(3, Some(width), &device);
    let x = normal_tensor([2, n, 12], 5, &device);
    let input = AttentionInput::new(x).causal(true);
    let (out, weights) = m.try_forward_with_weights(input.clone()).unwrap();
    out.into_data().assert_approx_eq::<f32>(
        &m.forward(input).into_data(),
        burn::tensor::Tolerance::absolute(1e-5),
    );
    for per_head in to_heads(&weights) {
        for (h, rows) in per_head.iter().enumerate() {
            for (i, row) in rows.iter().enumerate() {
                assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-5);
                for (j, &w) in row.iter().enumerate() {
                    let on_axis = if h < 2 {
                        i / width == j / width
                    } else {
                        i % width == j % width
                    };
                    if !on_axis || j > i {
                        assert_eq!(w, 0.0, "head {h} ({i}, {j})");
                    }
                }
            }
        }
    }
}

/// Refusals, each naming the field: a sequence that is not a square with `width` unset (at
/// configuration time through `check_input`, and at run time), decoding without `width`, one
/// head, a width of 0, cross-attention.
#[test]
fn refusals_name_the_field() {
    let device = Device::flex();
    let config = AxialConfig::new(12, 2);
    let err = config.check_input(500, 500, false).unwrap_err();
    assert!(err.to_string().contains("width"), "{err}");
    assert!(config.check_input(784, 784, false).is_ok());
    let m = config.init(&device);
    let x = normal_tensor([1, 10, 12], 1, &device);
    let err = m.try_forward(AttentionInput::new(x.clone())).unwrap_err();
    assert!(err.to_string().contains("width"), "{err}");
    let err = m
        .decode(x.clone().slice(s![.., 0..1]), DecodingState::default())
        .unwrap_err();
    assert!(err.to_string().contains("width"), "{err}");
    let err = AxialConfig::new(12, 1).validate().unwrap_err();
    assert!(err.to_string().contains("n_heads"), "{err}");
    let err = AxialConfig::new(12, 2)
        .with_width(Some(0))
        .validate()
        .unwrap_err();
    assert!(err.to_string().contains("width"), "{err}");
    let err = AttentionConfig::Axial(AxialConfig::new(12, 2))
        .check_input(4, 9, false)
        .unwrap_err();
    assert!(err.to_string().contains("cross"), "{err}");
}
