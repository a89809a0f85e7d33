//! The query/key/value/output projections shared by the multi-head variants.

use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;

use crate::contract::DecodingState;
use crate::contract::error::AttentionError;
use crate::contract::input::{AttentionInput, HeadMasks};
use crate::engines::rotary::{real_positions, rotate_queries_keys};

/// Splits `[batch, n, d_model]` into heads `[batch, n_heads, n, d_head]`.
pub fn split_heads(x: Tensor<3>, n_heads: usize) -> Tensor<4> {
    let [batch, n, d_model] = x.dims();
    dense(
        x.reshape([batch, n, n_heads, d_model / n_heads])
            .swap_dims(1, 2),
    )
}

/// Merges heads `[batch, n_heads, n, d_head]` back into `[batch, n, n_heads * d_head]`.
pub fn merge_heads(x: Tensor<4>) -> Tensor<3> {
    let [batch, n_heads, n, d_head] = x.dims();
    dense(x)
        .swap_dims(1, 2)
        .reshape([batch, n, n_heads * d_head])
}

/// On `flex`, lays a per-head tensor `[batch, heads, n, d]` out in row-major order, and its
/// gradient in the backward pass: a reshape that merges `n` and `d` copies a strided view (a
/// no-op for a tensor already in that order), one pass of whole rows.
///
/// Flex's element-wise operations walk strided views element by element, so every operation
/// on the per-head views of `split_heads`, and on the gradients that `merge_heads` hands back,
/// paid for it: ReLU plus a constant on the `[1, 8, 16384, 64]` query view took 41 ms, against
/// 10 ms for the copy and the same operations on its result (measured on the 2-core
/// development machine), and the gap grew faster than n. Other backends handle strided
/// operands themselves; they get the tensor unchanged.
fn dense(x: Tensor<4>) -> Tensor<4> {
    #[cfg(feature = "flex")]
    if crate::kernels::is_flex(&x.device()) {
        let [batch, heads, n, d] = x.dims();
        return x
            .reshape([batch, heads, n * d])
            .reshape([batch, heads, n, d]);
    }
    x
}

/// Input projections to Q, K, V and the output projection, each `d_model -> d_model`,
/// Xavier-uniform initialised (the LRA reference), biases optional.
#[derive(Module, Debug)]
pub struct QkvoProjection {
    /// Query projection.
    pub query: Linear,
    /// Key projection.
    pub key: Linear,
    /// Value projection.
    pub value: Linear,
    /// Output projection.
    pub output: Linear,
    /// Number of heads the projections are split into.
    pub n_heads: usize,
    /// Rotary positions on ([`AttentionModule::with_rotary`](crate::AttentionModule::with_rotary)):
    /// the per-head masks carry each position, at which the attention rotates its queries and
    /// keys, and decoding rotates each token at its own position.
    pub rotary: bool,
}

impl QkvoProjection {
    /// Creates the four projections.
    pub fn new(d_model: usize, n_heads: usize, bias: bool, device: &Device) -> Self {
        let linear = LinearConfig::new(d_model, d_model)
            .with_bias(bias)
            .with_initializer(Initializer::XavierUniform { gain: 1.0 });
        Self {
            query: linear.init(device),
            key: linear.init(device),
            value: linear.init(device),
            output: linear.init(device),
            n_heads,
            rotary: false,
        }
    }

    /// Model width (the output projection's; read from its shape, so a lazily built module
    /// stays unallocated).
    pub fn d_model(&self) -> usize {
        self.output.weight.lazy_shape()[1]
    }

    /// Number of heads.
    pub fn n_heads(&self) -> usize {
        self.n_heads
    }

    /// Projects `x: [batch, n, d_model]` to per-head `(Q, K, V)`, each `[batch, h, n, d]`.
    pub fn qkv(&self, x: Tensor<3>) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        self.project_each(x.clone(), x.clone(), x)
    }

    /// Projects an input's queries, keys and values to heads `[batch, h, n, d]` (in
    /// self-attention all three from its one sequence).
    pub fn project(&self, input: AttentionInput) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        match input.into_sequences() {
            (x, None) => self.qkv(x),
            (query, Some((key, value))) => self.project_each(query, key, value),
        }
    }

    fn project_each(
        &self,
        query: Tensor<3>,
        key: Tensor<3>,
        value: Tensor<3>,
    ) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let heads = |linear: &Linear, x| split_heads(linear.forward(x), self.n_heads);
        (
            heads(&self.query, query),
            heads(&self.key, key),
            heads(&self.value, value),
        )
    }

    /// Projection, per-head attention, output projection: the forward pass of every variant
    /// built on these projections, `attend` being its attention on per-head tensors.
    pub fn apply(
        &self,
        input: AttentionInput,
        attend: impl FnOnce(
            Tensor<4>,
            Tensor<4>,
            Tensor<4>,
            HeadMasks,
        ) -> Result<Tensor<4>, AttentionError>,
    ) -> Result<Tensor<3>, AttentionError> {
        let masks = self.with_positions(input.head_masks(), input.query());
        let (q, k, v) = self.project(input);
        Ok(self.out(attend(q, k, v, masks)?))
    }

    /// `masks` with each position among its sequence's real ones, where rotary positions are on
    /// (self-attention over `x: [batch, n, d_model]`).
    pub fn with_positions(&self, masks: HeadMasks, x: &Tensor<3>) -> HeadMasks {
        with_rotary_positions(self.rotary, masks, x)
    }

    /// [`qkv`](Self::qkv) for one decoded token `x: [batch, 1, d_model]` after those `state`
    /// has seen: with rotary positions, its query and key rotated at its own position.
    pub fn qkv_step(
        &self,
        x: Tensor<3>,
        state: &DecodingState,
        variant: &'static str,
    ) -> Result<(Tensor<4>, Tensor<4>, Tensor<4>), AttentionError> {
        let (q, k, v) = self.qkv(x);
        if !self.rotary {
            return Ok((q, k, v));
        }
        let positions = state.tokens_seen(variant, q.dims()[0], &q.device())?;
        let (q, k) = rotate_queries_keys(q, k, &Some(positions));
        Ok((q, k, v))
    }

    /// The prefill of the attentions that decode over a cache of every key: the causal forward
    /// pass through `attend` with the prompts' padding (`mask_pad`, `[batch, n]`, if any)
    /// masked, and the cache of the prompts' keys and values with that padding marked.
    pub fn prefill_full_cache(
        &self,
        x: Tensor<3>,
        mask_pad: Option<Tensor<2, Bool>>,
        attend: impl FnOnce(
            Tensor<4>,
            Tensor<4>,
            Tensor<4>,
            HeadMasks,
        ) -> Result<Tensor<4>, AttentionError>,
    ) -> Result<(Tensor<3>, DecodingState), AttentionError> {
        let masks = self.with_positions(HeadMasks::new(mask_pad.clone(), true), &x);
        let (q, k, v) = self.qkv(x);
        // With rotary positions the queries and keys are rotated once, here: `attend` takes them
        // rotated (its masks without positions), and the cache holds the keys as later tokens
        // score them.
        let (q, k) = rotate_queries_keys(q, k, &masks.positions);
        let masks = HeadMasks {
            positions: None,
            ..masks
        };
        let o = attend(q, k.clone(), v.clone(), masks)?;
        let cache = DecodingState::KeyValueCache {
            keys: k,
            values: v,
            padding: mask_pad,
        };
        Ok((self.out(o), cache))
    }

    /// Merges per-head outputs `[batch, h, n, d]` and applies the output projection.
    pub fn out(&self, o: Tensor<4>) -> Tensor<3> {
        self.output.forward(merge_heads(o))
    }
}

/// `masks` with each position among its sequence's real ones where `rotary` positions are on
/// (self-attention over `x: [batch, n, d_model]`), unchanged otherwise: what
/// [`QkvoProjection::with_positions`] gives, for the variants with projections of their own.
pub fn with_rotary_positions(rotary: bool, masks: HeadMasks, x: &Tensor<3>) -> HeadMasks {
    if !rotary {
        return masks;
    }
    let [batch, n, _] = x.dims();
    let positions = real_positions(&masks.key_pad, batch, n, &x.device());
    HeadMasks {
        positions: Some(positions),
        ..masks
    }
}

/// `d_model()` and `n_heads()` on a variant's module built on a [`QkvoProjection`] in its `proj`
/// field.
macro_rules! projection_shape {
    ($module:ty) => {
        impl $module {
            /// Model width.
            pub fn d_model(&self) -> usize {
                self.proj.d_model()
            }

            /// Number of heads.
            pub fn n_heads(&self) -> usize {
                self.proj.n_heads()
            }
        }
    };
}
pub(crate) use projection_shape;
