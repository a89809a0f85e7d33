//! What every variant file imports: the contract it implements, the facts and configuration glue
//! it states, the projections most variants are built on, and the checks and errors of its
//! inputs and configuration. `use crate::variants::prelude::*;` in a variant file; the rest of the
//! ground floor (the engines) is imported by name where it is used.

pub(crate) use burn::prelude::*;

pub(crate) use crate::contract::error::{AttentionError, check_at_least_one};
pub(crate) use crate::contract::input::{AttentionInput, HeadMasks};
pub(crate) use crate::contract::variant::{
    ModelShape, VariantConfig, VariantInfo, check_attention_mask, check_capabilities,
    check_head_input, check_prompt_shapes, check_token, check_within_max_len,
    forward_through_projections, inherent_config_methods, prefill_through, recurrent_module,
    refuse_attention_mask, rotary_cross_attention, rotary_on_projections, rotary_refused,
    rotary_without_meaning, variant_facts, variant_glue,
};
pub(crate) use crate::contract::{AttentionModule, Capabilities, DecodingState};
pub(crate) use crate::engines::heads::{QkvoProjection, projection_shape};

/// What [`AttentionModule::attend`] returns: the per-head outputs `[batch, heads, n_q, d_head]`,
/// or why the variant cannot take its input. Its signature then fits on one line in each
/// variant.
pub(crate) type PerHeadResult = Result<Tensor<4>, AttentionError>;

/// What decoding and prefilling return ([`AttentionModule::decode`],
/// [`AttentionModule::prefill`], [`AttentionModule::prefill_padded`]): the outputs and the state
/// after them, or why the variant cannot take its input.
pub(crate) type DecodeResult = Result<(Tensor<3>, DecodingState), AttentionError>;

/// What [`AttentionModule::try_forward_with_weights`] returns: the output and the attention
/// weights, or why the variant cannot take its input.
pub(crate) type WeightsResult = Result<(Tensor<3>, Tensor<4>), AttentionError>;
