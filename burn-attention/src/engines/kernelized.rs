//! Kernelized attention: the form every feature-map variant shares (`linear`, `performer`,
//! `performer-relu`, the `ff-*` kernels).
//!
//! Given positive features `φ(Q_i)`, `φ(K_j)` of width `m`,
//! `O_i = Σ_j (φ(Q_i)·φ(K_j)) V_j / Σ_j φ(Q_i)·φ(K_j)`, computed without the `n × n` weights as
//! `O_i = φ(Q_i)ᵀ S / φ(Q_i)ᵀ z`, `S = Σ_j φ(K_j) V_jᵀ` (`[m, d]`), `z = Σ_j φ(K_j)` (`[m]`).
//! Padded keys are left out of both sums; causal attention takes them over `j ≤ i`.
//!
//! **No ε in the normaliser.** The Linear Transformer paper writes `φ(Q_i)ᵀ z + ε`; every
//! feature map here is positive, so the denominator is a sum of positive terms and needs no
//! ε, and an ε is not harmless: it is measured in the units of the features, which a
//! stabiliser (FAVOR+'s, see [`favor_features`](crate::favor_features)) or a small
//! input scale can shrink to the size of ε itself, and then it shrinks every output towards
//! zero. The denominator is only floored at the smallest normal `f32` (`1.2e-38`), which changes
//! nothing but a row whose features all underflowed (or a query with no real key to attend
//! to), which then returns zeros instead of NaN.
//!
//! **Range.** The forward pass holds for denominators down to that floor. The backward pass
//! divides by the denominator once, never by its square (see `normalise`), so its factors grow
//! as `1 / den`: gradients are finite and agree with float64 for denominators down to
//! [`GRADIENT_DENOMINATOR_FLOOR`] (`1e-30`) at the scales of a trained model's activations and
//! loss gradients (checked in tests/checks.rs, causal and not). Below it the backward's
//! intermediate products may leave the `f32` range.
//!
//! **Causal form, chunked.** The causal sums are prefix sums. Materialising `S` at every
//! position would take a `[batch, heads, n, m, d]` tensor (8.6 GB for FAVOR+ at n = 16K, m = 256,
//! d = 64, 8 heads). Instead the sequence is cut into chunks of `c` positions (the usual
//! chunkwise-parallel form of linear attention): within a chunk the masked `c × c` weights
//! `φ(Q) φ(K)ᵀ` are formed directly; across chunks each query reads the state `S`, `z` summed over
//! all earlier chunks. Memory: O(n (m + d) + n c) for the features, values and the intra-chunk
//! weights, plus `m × d` per chunk for the states; time O(n c (m + d) + n m d).
//!
//! **Recurrent form.** Decoding one token at a time carries `S` and `z` over the tokens so far
//! ([`RecurrentState`]); [`kernelized_step`] adds the new key and reads the new query in
//! O(m d), whatever the position.

use burn::prelude::*;

use crate::contract::error::AttentionError;
use crate::contract::input::{HeadMasks, causal_mask, zero_padded};
use crate::contract::{DecodingState, RecurrentState};
use crate::engines::rotary::{rotate_queries_keys, rotate_roformer};

/// Chunk length of the causal form (see the module docs): large enough that the intra-chunk
/// products are efficient matrix products, small enough that the `c × c` weights per chunk stay
/// below the features in memory for the usual widths (`m`, `d` of 64 and more).
pub const CAUSAL_CHUNK: usize = 64;

/// The floor under the normaliser: the smallest normal `f32`.
const DENOMINATOR_FLOOR: f32 = f32::MIN_POSITIVE;

/// The smallest denominator at which the backward pass is documented and tested to give finite
/// gradients that agree with float64 (see the module docs).
pub const GRADIENT_DENOMINATOR_FLOOR: f32 = 1e-30;

/// Kernelized attention from already-mapped, positive features `φ(Q)`, `φ(K)`: the form shared
/// by every feature-map variant (see the module docs). Causal attention runs the chunked form
/// with chunks of [`CAUSAL_CHUNK`] positions.
///
/// Each row of `φ(Q)` may carry any positive factor and `φ(K)` any positive factor per batch
/// element and head: both cancel in the normalisation, which is what lets FAVOR+ stabilise its
/// features.
///
/// # Shapes
/// - `phi_q`, `phi_k`: `[batch, heads, n, m]` (m features)
/// - `v`: `[batch, heads, n, d]`
/// - `mask_pad`: `[batch, n]`, `true` = padding
/// - output: `[batch, heads, n, d]`
pub fn kernelized_attention(
    phi_q: Tensor<4>,
    phi_k: Tensor<4>,
    v: Tensor<4>,
    mask_pad: Option<Tensor<2, Bool>>,
    causal: bool,
) -> Tensor<4> {
    if causal {
        return causal_kernelized_attention(phi_q, phi_k, v, mask_pad, CAUSAL_CHUNK);
    }
    let phi_k = zero_padded(phi_k, &mask_pad);
    let s = phi_k.clone().swap_dims(2, 3).matmul(v); // [b, h, m, d]
    let z = phi_k.sum_dim(2).swap_dims(2, 3); // [b, h, m, 1]
    let num = phi_q.clone().matmul(s);
    let den = phi_q.matmul(z); // [b, h, n, 1]
    normalise(num, den)
}

/// `num / den` with the denominator floored at [`DENOMINATOR_FLOOR`] (see the module docs),
/// taken as `(num / s) / (den / s)` with `s` the floored denominator held constant: the same
/// quotient, whose backward never squares a small denominator (the division's own backward
/// forms `num / den²`, which is 0 in `f32` below a denominator of about 1e-19 and made the
/// gradients NaN); each factor of the backward is then at most `1 / den`.
fn normalise<const D: usize>(num: Tensor<D>, den: Tensor<D>) -> Tensor<D> {
    let den = den.clamp_min(DENOMINATOR_FLOOR);
    let scale = den.clone().detach();
    num.div(scale.clone()).div(den.div(scale))
}

/// Causal kernelized attention in chunks of `chunk` positions (see the module docs); the result
/// does not depend on `chunk` beyond float round-off.
///
/// # Shapes
/// As [`kernelized_attention`].
///
/// # Panics
/// If `chunk` is 0.
pub fn causal_kernelized_attention(
    phi_q: Tensor<4>,
    phi_k: Tensor<4>,
    v: Tensor<4>,
    mask_pad: Option<Tensor<2, Bool>>,
    chunk: usize,
) -> Tensor<4> {
    let (num, den) = causal_sums(phi_q, phi_k, v, mask_pad, chunk);
    normalise(num, den)
}

/// The causal numerator `Σ_{j≤i} (φ(Q_i)·φ(K_j)) V_j` (`[batch, heads, n, d]`) and denominator
/// `Σ_{j≤i} φ(Q_i)·φ(K_j)` (`[batch, heads, n, 1]`), in chunks of `chunk` positions.
fn causal_sums(
    phi_q: Tensor<4>,
    phi_k: Tensor<4>,
    v: Tensor<4>,
    mask_pad: Option<Tensor<2, Bool>>,
    chunk: usize,
) -> (Tensor<4>, Tensor<4>) {
    assert!(chunk > 0, "the chunk length must be at least 1");
    let [batch, heads, n, _] = phi_q.dims();
    let d = v.dims()[3];
    let device = phi_q.device();
    let c = chunk.min(n);
    let chunks = n.div_ceil(c);
    // Zero rows at the end make the length a multiple of the chunk: a zero key adds nothing, and
    // the rows of the padding queries are cut off below.
    let fill = chunks * c - n;
    let extend = |x: Tensor<4>| -> Tensor<5> {
        let width = x.dims()[3];
        let x = if fill == 0 {
            x
        } else {
            let zeros = Tensor::zeros([batch, heads, fill, width], &device);
            Tensor::cat(vec![x, zeros], 2)
        };
        x.reshape([batch, heads, chunks, c, width])
    };
    let q = extend(phi_q);
    let k = extend(zero_padded(phi_k, &mask_pad));
    let v = extend(v);

    // Within each chunk: the c × c weights, key j of the chunk seen by query i when j <= i.
    let future = causal_mask(c, &device).reshape([1, 1, 1, c, c]);
    let weights = q
        .clone()
        .matmul(k.clone().swap_dims(3, 4))
        .mask_fill(future, 0.0); // [b, h, chunks, c, c]
    let num = weights.clone().matmul(v.clone()); // [b, h, chunks, c, d]
    let den = weights.sum_dim(4); // [b, h, chunks, c, 1]

    // Across chunks: the states summed over every earlier chunk (an exclusive prefix sum).
    let earlier = |x: Tensor<5>| -> Tensor<5> {
        let [b, h, _, rows, cols] = x.dims();
        let first = Tensor::zeros([b, h, 1, rows, cols], &device);
        if chunks == 1 {
            return first;
        }
        let sums = x.slice(s![.., .., 0..chunks - 1]).cumsum(2);
        Tensor::cat(vec![first, sums], 2)
    };
    let s = earlier(k.clone().swap_dims(3, 4).matmul(v)); // [b, h, chunks, m, d]
    let z = earlier(k.sum_dim(3).swap_dims(3, 4)); // [b, h, chunks, m, 1]
    let num = (num + q.clone().matmul(s)).reshape([batch, heads, chunks * c, d]);
    let den = (den + q.matmul(z)).reshape([batch, heads, chunks * c, 1]);
    if fill == 0 {
        (num, den)
    } else {
        (num.slice(s![.., .., 0..n]), den.slice(s![.., .., 0..n]))
    }
}

/// Kernelized attention with rotary positions, in RoFormer's form for linear attention (Su et
/// al. 2021, arXiv 2104.09864, §3.4.3): the features rotated at their positions in the
/// numerator only, `O_i = Σ_j (R_i φ(Q_i))·(R_j φ(K_j)) V_j / Σ_j φ(Q_i)·φ(K_j)`, so that the
/// denominator stays a sum of positive terms. Causal attention takes both sums over `j ≤ i`
/// in chunks of [`CAUSAL_CHUNK`].
///
/// # Shapes
/// As [`kernelized_attention`]; `positions`: `[batch, n]`, each position's index among its
/// sequence's real ones ([`real_positions`](crate::engines::rotary::real_positions)); `m` even.
pub fn rotary_kernelized_attention(
    phi_q: Tensor<4>,
    phi_k: Tensor<4>,
    v: Tensor<4>,
    positions: Tensor<2>,
    mask_pad: Option<Tensor<2, Bool>>,
    causal: bool,
) -> Tensor<4> {
    let (rotated_q, rotated_k) =
        rotate_queries_keys(phi_q.clone(), phi_k.clone(), &Some(positions));
    if causal {
        let (num, _) = causal_sums(rotated_q, rotated_k, v, mask_pad.clone(), CAUSAL_CHUNK);
        let [batch, heads, n, _] = phi_q.dims();
        let ones = Tensor::ones([batch, heads, n, 1], &phi_q.device());
        let (den, _) = causal_sums(phi_q, phi_k, ones, mask_pad, CAUSAL_CHUNK);
        return normalise(num, den);
    }
    let rotated_k = zero_padded(rotated_k, &mask_pad);
    let phi_k = zero_padded(phi_k, &mask_pad);
    let num = rotated_q.matmul(rotated_k.swap_dims(2, 3).matmul(v));
    let den = phi_q.matmul(phi_k.sum_dim(2).swap_dims(2, 3));
    normalise(num, den)
}

/// One step of causal kernelized attention: adds the new token's `φ(k) vᵀ` and `φ(k)` to the
/// recurrent state (`None` = no token yet) and returns the new token's output
/// `φ(q)ᵀ S / φ(q)ᵀ z` with the state that includes it. The state's `key_max` is passed through
/// unchanged.
///
/// # Shapes
/// - `phi_q`, `phi_k`: `[batch, heads, 1, m]`; `v`: `[batch, heads, 1, d]`
/// - output: `[batch, heads, 1, d]`
pub fn kernelized_step(
    phi_q: Tensor<4>,
    phi_k: Tensor<4>,
    v: Tensor<4>,
    state: Option<RecurrentState>,
) -> (Tensor<4>, RecurrentState) {
    let phi_k = phi_k.swap_dims(2, 3); // [b, h, m, 1]
    let s_new = phi_k.clone().matmul(v); // [b, h, m, d]
    let (s, z, key_max) = match state {
        Some(state) => (state.s + s_new, state.z + phi_k, state.key_max),
        None => (s_new, phi_k, None),
    };
    let num = phi_q.clone().matmul(s.clone());
    let den = phi_q.matmul(z.clone());
    (
        normalise(num, den),
        RecurrentState {
            s,
            z,
            key_max,
            seen: None,
        },
    )
}

/// The recurrent state after a whole prompt, read at once from its key features and values:
/// `S = Σ_j φ(K_j) V_jᵀ`, `z = Σ_j φ(K_j)` (what [`kernelized_step`] sums token by token), with
/// `key_max` for features computed in log space.
///
/// # Shapes
/// - `phi_k`: `[batch, heads, n, m]`; `v`: `[batch, heads, n, d]`
pub fn prompt_state(phi_k: Tensor<4>, v: Tensor<4>, key_max: Option<Tensor<4>>) -> RecurrentState {
    let z = phi_k.clone().sum_dim(2).swap_dims(2, 3); // [b, h, m, 1]
    RecurrentState {
        s: phi_k.swap_dims(2, 3).matmul(v),
        z,
        key_max,
        seen: None,
    }
}

/// The recurrent state after a whole prompt with rotary positions
/// ([`rotary_kernelized_attention`]): `S = Σ_j R_j φ(K_j) V_jᵀ` over the rotated key features,
/// `z = Σ_j φ(K_j)` over the plain ones, padded keys left out, and the real tokens seen per
/// sequence.
///
/// # Shapes
/// - `phi_k`: `[batch, heads, n, m]`; `v`: `[batch, heads, n, d]`; `positions`: `[batch, n]`
pub fn rotary_prompt_state(
    phi_k: Tensor<4>,
    v: Tensor<4>,
    positions: Tensor<2>,
    mask_pad: &Option<Tensor<2, Bool>>,
) -> RecurrentState {
    let [batch, _, n, _] = phi_k.dims();
    let rotated = zero_padded(rotate_roformer(phi_k.clone(), positions), mask_pad);
    let phi_k = zero_padded(phi_k, mask_pad);
    let seen = match mask_pad {
        Some(mask) => mask.clone().bool_not().float().sum_dim(1),
        None => Tensor::full([batch, 1], n as f32, &v.device()),
    };
    RecurrentState {
        s: rotated.swap_dims(2, 3).matmul(v),
        z: phi_k.sum_dim(2).swap_dims(2, 3),
        key_max: None,
        seen: Some(seen),
    }
}

/// One step of causal kernelized attention with rotary positions: the new token rotated at its
/// own position (the real tokens the state has seen), its rotated `φ(k) vᵀ` and plain `φ(k)`
/// added to the state (`None` = no token yet), and its output
/// `(R φ(q))ᵀ S / φ(q)ᵀ z`.
///
/// # Shapes
/// As [`kernelized_step`].
pub fn rotary_kernelized_step(
    phi_q: Tensor<4>,
    phi_k: Tensor<4>,
    v: Tensor<4>,
    state: Option<RecurrentState>,
) -> (Tensor<4>, RecurrentState) {
    let batch = phi_q.dims()[0];
    let seen = state
        .as_ref()
        .and_then(|state| state.seen.clone())
        .unwrap_or_else(|| Tensor::zeros([batch, 1], &phi_q.device()));
    let (rotated_q, rotated_k) =
        rotate_queries_keys(phi_q.clone(), phi_k.clone(), &Some(seen.clone()));
    let s_new = rotated_k.swap_dims(2, 3).matmul(v); // [b, h, m, d]
    let z_new = phi_k.swap_dims(2, 3); // [b, h, m, 1]
    let (s, z) = match state {
        Some(state) => (state.s + s_new, state.z + z_new),
        None => (s_new, z_new),
    };
    let num = rotated_q.matmul(s.clone());
    let den = phi_q.matmul(z.clone());
    let state = RecurrentState {
        s,
        z,
        key_max: None,
        seen: Some(seen + 1.0),
    };
    (normalise(num, den), state)
}

/// A kernelized variant's attention on per-head features under `masks`: RoFormer's rotary form
/// ([`rotary_kernelized_attention`]) where the masks carry positions, [`kernelized_attention`]
/// otherwise.
pub fn kernelized_heads(
    phi_q: Tensor<4>,
    phi_k: Tensor<4>,
    v: Tensor<4>,
    masks: HeadMasks,
) -> Tensor<4> {
    match masks.positions {
        Some(positions) => {
            rotary_kernelized_attention(phi_q, phi_k, v, positions, masks.key_pad, masks.causal)
        }
        None => kernelized_attention(phi_q, phi_k, v, masks.key_pad, masks.causal),
    }
}

/// A kernelized variant's state after a prompt whose padding is `mask_pad`: summed from the
/// rotated key features where `positions` are given ([`rotary_prompt_state`]), from the plain
/// ones otherwise ([`prompt_state`]).
pub fn kernelized_prompt_state(
    phi_k: Tensor<4>,
    v: Tensor<4>,
    positions: Option<Tensor<2>>,
    mask_pad: &Option<Tensor<2, Bool>>,
) -> RecurrentState {
    match positions {
        Some(positions) => rotary_prompt_state(phi_k, v, positions, mask_pad),
        None => prompt_state(zero_padded(phi_k, mask_pad), v, None),
    }
}

/// A kernelized variant's decoding step: [`rotary_kernelized_step`] with rotary positions on,
/// [`kernelized_step`] otherwise.
pub fn kernelized_decode(
    phi_q: Tensor<4>,
    phi_k: Tensor<4>,
    v: Tensor<4>,
    state: Option<RecurrentState>,
    rotary: bool,
) -> (Tensor<4>, RecurrentState) {
    if rotary {
        rotary_kernelized_step(phi_q, phi_k, v, state)
    } else {
        kernelized_step(phi_q, phi_k, v, state)
    }
}

/// The recurrent state inside a decoding state: `None` before the first token; an error if the
/// state was made by an attention of another kind.
pub fn recurrent_state(
    state: DecodingState,
    variant: &'static str,
) -> Result<Option<RecurrentState>, AttentionError> {
    match state {
        DecodingState::Empty => Ok(None),
        DecodingState::Recurrent(state) => Ok(Some(state)),
        DecodingState::KeyValueCache { .. }
        | DecodingState::Decayed(_)
        | DecodingState::Compressed { .. }
        | DecodingState::Compressive(_) => Err(AttentionError::unsupported(
            variant,
            "another variant's decoding state (it carries a recurrent state)",
        )),
    }
}
