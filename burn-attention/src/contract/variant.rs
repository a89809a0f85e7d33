//! What a variant states about itself, once, in its own file: its facts ([`VariantInfo`]) and its configuration's side of the registry ([`VariantConfig`]).

use burn::prelude::*;

use crate::contract::error::AttentionError;
use crate::contract::input::{AttentionInput, HeadMasks, check_shape, check_width};
use crate::contract::{AttentionModule, Capabilities};

/// A registered variant: its name (as used by the CLI, config files and xtask) and facts.
#[derive(Debug, Clone, Copy)]
pub struct VariantInfo {
    /// Registry name.
    pub name: &'static str,
    /// Source paper.
    pub paper: &'static str,
    /// Time complexity per head (`n` length, `d` head width, `k` projected length).
    pub time: &'static str,
    /// Memory complexity per head.
    pub memory: &'static str,
    /// What it supports.
    pub capabilities: Capabilities,
}

impl VariantInfo {
    /// The error of a configuration field of this variant: `field` names it, `message` says
    /// what is wrong ("must be at least 1").
    pub fn field_error(&self, field: &'static str, message: impl Into<String>) -> AttentionError {
        AttentionError::field(self.name, field, message)
    }
}

/// The model's side of an attention's configuration: what every variant takes from the model
/// rather than from its own parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelShape {
    /// Model width.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Longest sequence.
    pub n_max: usize,
}

impl ModelShape {
    /// The configuration fields that carry the model's shape, set by the model and not by a
    /// config file's attention table.
    pub const FIELDS: &'static [&'static str] = &["d_model", "n_heads", "n_max"];
}

/// A variant's configuration as the registry sees it: each variant file implements it once,
/// and the registry derives the listing, name lookup, config parsing and dispatch from it.
///
/// One configuration type may make several registered variants (`performer` and
/// `performer-relu`, by its `kernel` field): [`VARIANTS`](Self::VARIANTS) lists them and
/// [`info`](Self::info) says which one a value is.
pub trait VariantConfig: Config + Clone {
    /// The module the configuration creates.
    type Module: AttentionModule;

    /// The registered variants this configuration makes, with their facts.
    const VARIANTS: &'static [VariantInfo];

    /// The configuration of the variant `name` (one of [`VARIANTS`](Self::VARIANTS)) with its
    /// paper defaults, for a model of the given shape.
    fn for_variant(name: &str, model: ModelShape) -> Self;

    /// The registered variant this configuration makes: by default the only one it lists.
    fn info(&self) -> &'static VariantInfo {
        &Self::VARIANTS[0]
    }

    /// Model width.
    fn d_model(&self) -> usize;

    /// Number of heads.
    fn n_heads(&self) -> usize;

    /// Checks the configuration, the error naming the offending field: the shape and dropout
    /// every variant has ([`check_heads`](crate::contract::error::check_heads)), then the variant's own fields
    /// ([`check_fields`](Self::check_fields)).
    fn check(&self) -> Result<(), AttentionError> {
        crate::contract::error::check_heads(
            self.info().name,
            self.d_model(),
            self.n_heads(),
            self.weight_dropout(),
        )?;
        self.check_fields()
    }

    /// Checks the variant's own fields (block sizes, features, landmarks), the error naming the
    /// offending one; nothing by default. [`check`](Self::check) has checked the heads first.
    fn check_fields(&self) -> Result<(), AttentionError> {
        Ok(())
    }

    /// The dropout on the attention weights: 0 by default, for the variants without a weight
    /// matrix (see [`with_weight_dropout`](Self::with_weight_dropout)).
    fn weight_dropout(&self) -> f64 {
        0.0
    }

    /// Checks that the variant can take `n_q` queries over `n_k` keys, causal or not. The
    /// default refuses what the capabilities exclude.
    fn check_input(&self, n_q: usize, n_k: usize, causal: bool) -> Result<(), AttentionError> {
        check_capabilities(self.info(), n_q, n_k, causal)
    }

    /// Settings that work but are likely a mistake (a projection that compresses nothing, say),
    /// one sentence each naming the field; none by default. Callers decide whether to print
    /// them; [`check`](Self::check) refuses what cannot work.
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }

    /// Creates the module from a configuration [`check`](Self::check) has accepted.
    fn build(&self, device: &Device) -> Self::Module;

    /// Checks the configuration, then creates the module: the one place a variant's checks run
    /// before construction.
    ///
    /// # Panics
    /// If [`check`](Self::check) fails; its message is the panic message.
    fn init(&self, device: &Device) -> Self::Module {
        if let Err(err) = self.check() {
            panic!("{err}");
        }
        self.build(device)
    }

    /// Scalars in the module's frozen parameters (drawn once and never trained: Performer's
    /// random features, say), counted from the configuration's shapes with checked arithmetic;
    /// `None` when the count does not fit in a `usize`. None by default.
    fn frozen_params(&self) -> Option<usize> {
        Some(0)
    }

    /// Whether the layers of an encoder share a projection of this attention's, one parameter
    /// for all (Linformer's `layerwise` sharing); `false` by default.
    fn shares_projection(&self) -> bool {
        false
    }

    /// The projection every layer of an encoder shares where
    /// [`shares_projection`](Self::shares_projection) says so: the encoder creates it once
    /// and hands it to each layer's input ([`AttentionInput::shared`]). `None` by default.
    fn layer_shared_projection(&self, device: &Device) -> Option<burn::module::Param<Tensor<3>>> {
        let _ = device;
        None
    }

    /// This configuration cut down to small inputs: the shared test suites run every variant
    /// at width 16 on sequences of up to 96 positions with it, so its blocks, windows, features,
    /// landmarks and segments are a few positions long and the checks cross their boundaries.
    /// Unchanged by default (a variant whose defaults are already small).
    fn small(self) -> Self {
        self
    }

    /// Sets the dropout on the attention weights, where the variant has a weight matrix.
    fn with_weight_dropout(self, dropout: f64) -> Self {
        let _ = dropout;
        self
    }
}

/// Refuses an empty sequence (no queries or no keys), and what `info`'s capabilities exclude:
/// causal masking, or queries and keys of different lengths (cross-attention); causal masking
/// also needs as many queries as keys.
pub fn check_capabilities(
    info: &VariantInfo,
    n_q: usize,
    n_k: usize,
    causal: bool,
) -> Result<(), AttentionError> {
    let variant = info.name;
    if n_q == 0 || n_k == 0 {
        return Err(AttentionError::unsupported(
            variant,
            format!("an empty sequence ({n_q} queries, {n_k} keys; it needs one of each)"),
        ));
    }
    if causal && !info.capabilities.causal {
        return Err(AttentionError::unsupported(variant, "causal masking"));
    }
    if causal && n_q != n_k {
        return Err(AttentionError::unsupported(
            variant,
            format!(
                "causal masking between {n_q} queries and {n_k} keys (it needs as many of each)"
            ),
        ));
    }
    if n_q != n_k && !info.capabilities.cross_attention {
        return Err(AttentionError::unsupported(variant, "cross-attention"));
    }
    Ok(())
}

/// Refuses an empty prompt `x: [batch, 0, d_model]` to [`AttentionModule::prefill`] and
/// [`AttentionModule::prefill_padded`]: they need one token at least.
///
/// [`AttentionModule::prefill`]: crate::contract::AttentionModule::prefill
/// [`AttentionModule::prefill_padded`]: crate::contract::AttentionModule::prefill_padded
pub fn check_prompt(variant: &'static str, x: &Tensor<3>) -> Result<(), AttentionError> {
    if x.dims()[1] == 0 {
        return Err(AttentionError::unsupported(
            variant,
            "an empty prompt (prefilling needs one token at least)",
        ));
    }
    Ok(())
}

/// [`check_prompt`], and a prompt `x` other than `[batch, n, d_model]` or a padding mask other
/// than `[batch, n]`: the checks of every registered variant's prefilling.
pub fn check_prompt_shapes(
    variant: &'static str,
    d_model: usize,
    x: &Tensor<3>,
    mask_pad: Option<&Tensor<2, Bool>>,
) -> Result<(), AttentionError> {
    check_prompt(variant, x)?;
    check_width(variant, "a prompt", x, d_model)?;
    let [batch, n, _] = x.dims();
    match mask_pad {
        Some(mask) => check_shape(
            variant,
            "a padding mask",
            "[batch, n]",
            &mask.dims(),
            &[batch, n],
        ),
        None => Ok(()),
    }
}

/// Refuses an input to [`AttentionModule::decode`] other than one token a batch element,
/// `x: [batch, 1, d_model]`.
///
/// [`AttentionModule::decode`]: crate::contract::AttentionModule::decode
pub fn check_token(
    variant: &'static str,
    d_model: usize,
    x: &Tensor<3>,
) -> Result<(), AttentionError> {
    let n = x.dims()[1];
    if n != 1 {
        return Err(AttentionError::unsupported(
            variant,
            format!(
                "decoding {n} tokens in one step (it takes one; a prompt goes through prefill)"
            ),
        ));
    }
    check_width(variant, "a token", x, d_model)
}

/// Refuses an attention mask in `masks` where `info`'s capabilities exclude one.
pub fn refuse_attention_mask(info: &VariantInfo, masks: &HeadMasks) -> Result<(), AttentionError> {
    if masks.attn.is_some() && !info.capabilities.attention_mask {
        return Err(AttentionError::unsupported(
            info.name,
            "an arbitrary attention mask (`mask_attn`)",
        ));
    }
    Ok(())
}

/// Refuses an attention mask in `masks` where `info`'s capabilities exclude one, and one whose
/// shape is not `[batch, n_q, n_k]` for queries `[batch, heads, n_q, d]` over `n_k` keys.
pub fn check_attention_mask(
    info: &VariantInfo,
    masks: &HeadMasks,
    q: &Tensor<4>,
    n_k: usize,
) -> Result<(), AttentionError> {
    refuse_attention_mask(info, masks)?;
    let Some(mask) = &masks.attn else {
        return Ok(());
    };
    let [batch, _, n_q, _] = q.dims();
    let (what, names) = ("an attention mask", "[batch, n_q, n_k]");
    check_shape(info.name, what, names, &mask.dims(), &[batch, n_q, n_k])
}

/// [`check_capabilities`], and an error naming `n_max` where the keys outnumber it: the check of
/// the variants whose parameters are sized for a longest sequence.
pub fn check_within_max_len(
    info: &VariantInfo,
    n_max: usize,
    n_q: usize,
    n_k: usize,
    causal: bool,
) -> Result<(), AttentionError> {
    if n_k > n_max {
        return Err(AttentionError::field(
            info.name,
            "n_max",
            format!("is {n_max}, shorter than the input sequence ({n_k})"),
        ));
    }
    check_capabilities(info, n_q, n_k, causal)
}

/// The most iterations a variant's inner loop may be given (Sinkhorn's balancing, Nyström's
/// iterative pseudo-inverse): each is a step of the forward pass that training keeps for the
/// backward, so their memory grows with the count, and the papers use 6 to 20.
pub const MAX_ITERATIONS: usize = 1000;

/// Refuses an iteration count of 0 or above [`MAX_ITERATIONS`], naming `variant`'s `field`.
pub fn check_iterations(
    variant: &'static str,
    field: &'static str,
    value: usize,
) -> Result<(), AttentionError> {
    if value == 0 {
        return Err(AttentionError::field(variant, field, "must be at least 1"));
    }
    if value > MAX_ITERATIONS {
        return Err(AttentionError::field(
            variant,
            field,
            format!(
                "must be at most {MAX_ITERATIONS} (each iteration is kept for the backward pass), \
                 got {value}"
            ),
        ));
    }
    Ok(())
}

/// The part of a [`VariantConfig`] implementation every variant shares, written once: the module
/// type, the registered variants, and `d_model` and `n_heads` read from the configuration's
/// fields of those names; with `new(d_model, n_heads)`, the defaults for every name it makes
/// (`for_variant`): `Self::new` of those fields of the model's shape; with `dropout`, the weight
/// dropout read from and set on its `dropout` field.
///
/// ```text
/// impl VariantConfig for LinearAttentionConfig {
///     variant_glue!(LinearAttention, &[INFO], new(d_model, n_heads));
///     fn check_fields(&self) -> Result<(), AttentionError> { ... }
///     fn build(&self, device: &Device) -> LinearAttention { ... }
/// }
/// inherent_config_methods!(LinearAttentionConfig);
/// ```
macro_rules! variant_glue {
    ($module:ty, $variants:expr, new($($field:ident),*) $(, $dropout:ident)?) => {
        variant_glue!($module, $variants $(, $dropout)?);

        fn for_variant(_name: &str, model: ModelShape) -> Self {
            Self::new($(model.$field),*)
        }
    };
    ($module:ty, $variants:expr, dropout) => {
        variant_glue!($module, $variants);

        fn weight_dropout(&self) -> f64 {
            self.dropout
        }

        fn with_weight_dropout(self, dropout: f64) -> Self {
            self.with_dropout(dropout)
        }
    };
    ($module:ty, $variants:expr) => {
        type Module = $module;

        const VARIANTS: &'static [VariantInfo] = $variants;

        fn d_model(&self) -> usize {
            self.d_model
        }

        fn n_heads(&self) -> usize {
            self.n_heads
        }
    };
}
pub(crate) use variant_glue;

/// `validate` and `init` as inherent methods of a variant's configuration, the methods Burn users
/// call on a configuration (`LinearAttentionConfig::new(64, 4).init(&device)`) without importing
/// [`VariantConfig`]; both delegate to it.
macro_rules! inherent_config_methods {
    ($config:ty) => {
        impl $config {
            /// Checks the configuration; the error names the offending field.
            pub fn validate(&self) -> Result<(), $crate::contract::error::AttentionError> {
                <Self as $crate::contract::variant::VariantConfig>::check(self)
            }

            /// Creates the module.
            ///
            /// # Panics
            /// If [`validate`](Self::validate) fails; its message is the panic message.
            pub fn init(
                &self,
                device: &Device,
            ) -> <Self as $crate::contract::variant::VariantConfig>::Module {
                <Self as $crate::contract::variant::VariantConfig>::init(self, device)
            }
        }
    };
}
pub(crate) use inherent_config_methods;

/// The [`AttentionModule`] methods a variant's facts answer, `name` and `capabilities`, read
/// from its [`VariantInfo`]: `variant_facts!(INFO)` for a module that is one registered variant,
/// `variant_facts!(self.form)` for one whose field says which of its configuration's variants it
/// is (the field's type has `fn info(self) -> &'static VariantInfo`).
macro_rules! variant_facts {
    (self . $field:ident) => {
        fn name(&self) -> &'static str {
            self.$field.info().name
        }

        fn capabilities(&self) -> $crate::contract::Capabilities {
            self.$field.info().capabilities
        }
    };
    ($info:expr) => {
        fn name(&self) -> &'static str {
            $info.name
        }

        fn capabilities(&self) -> $crate::contract::Capabilities {
            $info.capabilities
        }
    };
}
pub(crate) use variant_facts;

/// The [`AttentionModule::try_forward`] of a variant built on a
/// [`QkvoProjection`](crate::engines::heads::QkvoProjection) in its `proj` field: the projections
/// around the variant's own [`attend`](AttentionModule::attend) on per-head tensors.
macro_rules! forward_through_projections {
    () => {
        fn try_forward(
            &self,
            input: $crate::contract::input::AttentionInput,
        ) -> Result<Tensor<3>, $crate::contract::error::AttentionError> {
            input.check_shapes(self.name(), self.proj.d_model())?;
            if self.proj.rotary && input.is_cross() {
                return Err($crate::contract::variant::rotary_cross_attention(
                    self.name(),
                ));
            }
            self.proj.apply(input, |q, k, v, masks| {
                $crate::contract::AttentionModule::attend(self, q, k, v, masks)
            })
        }
    };
}
pub(crate) use forward_through_projections;

/// [`AttentionModule::prefill`] and [`AttentionModule::prefill_padded`] through one inherent
/// method of the module, `fn $method(&self, x: Tensor<3>, mask_pad: Option<Tensor<2, Bool>>) ->
/// Result<(Tensor<3>, DecodingState), AttentionError>`: the causal forward pass over prompts
/// (padded by `mask_pad`) and the state after them, the padding left out (the kernelized
/// attentions' sums).
macro_rules! prefill_through {
    ($method:ident) => {
        fn prefill(
            &self,
            x: Tensor<3>,
        ) -> Result<
            (Tensor<3>, $crate::contract::DecodingState),
            $crate::contract::error::AttentionError,
        > {
            $crate::contract::variant::check_prompt_shapes(self.name(), self.d_model(), &x, None)?;
            self.$method(x, None)
        }

        fn prefill_padded(
            &self,
            x: Tensor<3>,
            mask_pad: Tensor<2, Bool>,
        ) -> Result<
            (Tensor<3>, $crate::contract::DecodingState),
            $crate::contract::error::AttentionError,
        > {
            $crate::contract::variant::check_prompt_shapes(
                self.name(),
                self.d_model(),
                &x,
                Some(&mask_pad),
            )?;
            self.$method(x, Some(mask_pad))
        }
    };
}
pub(crate) use prefill_through;

/// [`AttentionModule::with_rotary`] for a variant built on a
/// [`QkvoProjection`](crate::engines::heads::QkvoProjection) in its `proj` field: checked by
/// [`check_rotary`], then the projections carry each position to `attend`.
macro_rules! rotary_on_projections {
    () => {
        fn with_rotary(mut self) -> Result<Self, $crate::contract::error::AttentionError> {
            let d_head = self.proj.d_model() / self.proj.n_heads();
            $crate::contract::variant::check_rotary(self.name(), self.capabilities(), d_head)?;
            self.proj.rotary = true;
            Ok(self)
        }
    };
}
pub(crate) use rotary_on_projections;

/// Refuses rotary positions where `capabilities` exclude them, or with an odd head width
/// `d_head` (rotations turn pairs of channels).
pub fn check_rotary(
    variant: &'static str,
    capabilities: Capabilities,
    d_head: usize,
) -> Result<(), AttentionError> {
    if !capabilities.rotary {
        return Err(AttentionError::unsupported(variant, "rotary positions"));
    }
    if !d_head.is_multiple_of(2) {
        return Err(AttentionError::unsupported(
            variant,
            format!(
                "rotary positions with an odd head width ({d_head}): they turn pairs of channels"
            ),
        ));
    }
    Ok(())
}

/// The error of a variant for which rotating queries and keys by position has no meaning,
/// `why` saying what in its form stands in the way.
pub fn rotary_without_meaning(variant: &'static str, why: &str) -> AttentionError {
    AttentionError::unsupported(
        variant,
        format!("rotary positions, which have no meaning for it: {why}"),
    )
}

/// [`AttentionModule::with_rotary`] refused with `why` (see [`rotary_without_meaning`]): for a
/// variant whose form gives rotating its queries and keys by position no meaning.
macro_rules! rotary_refused {
    ($why:literal) => {
        fn with_rotary(self) -> Result<Self, $crate::contract::error::AttentionError> {
            Err($crate::contract::variant::rotary_without_meaning(
                self.name(),
                $why,
            ))
        }
    };
}
pub(crate) use rotary_refused;

/// The error of rotary positions in cross-attention: they relate the positions of one sequence.
pub fn rotary_cross_attention(variant: &'static str) -> AttentionError {
    AttentionError::unsupported(
        variant,
        "rotary positions in cross-attention (they relate the positions of one sequence)",
    )
}

/// [`check_capabilities`] and [`check_attention_mask`] for per-head queries `q` over keys `k`
/// (`[batch, heads, n, d]`): the opening of a variant's [`AttentionModule::attend`].
pub fn check_head_input(
    info: &VariantInfo,
    q: &Tensor<4>,
    k: &Tensor<4>,
    masks: &HeadMasks,
) -> Result<(), AttentionError> {
    let n_k = k.dims()[2];
    check_capabilities(info, q.dims()[2], n_k, masks.causal)?;
    check_positions(info, masks)?;
    check_attention_mask(info, masks, q, n_k)
}

/// Refuses rotary positions in `masks` where `info`'s capabilities exclude them.
pub fn check_positions(info: &VariantInfo, masks: &HeadMasks) -> Result<(), AttentionError> {
    if masks.positions.is_some() && !info.capabilities.rotary {
        return Err(AttentionError::unsupported(info.name, "rotary positions"));
    }
    Ok(())
}

/// The masks of an input to a variant defined on one sequence only (the decaying attentions):
/// refuses cross-attention, even between sequences of one length, and whatever else `info`'s
/// capabilities exclude.
pub fn check_self_attention(
    info: &VariantInfo,
    input: &AttentionInput,
) -> Result<HeadMasks, AttentionError> {
    let masks = input.head_masks();
    check_capabilities(info, input.query_len(), input.key_len(), masks.causal)?;
    if input.is_cross() {
        return Err(AttentionError::unsupported(info.name, "cross-attention"));
    }
    let probe = Tensor::<4>::zeros([1, 1, input.query_len(), 1], &input.query().device());
    check_attention_mask(info, &masks, &probe, input.key_len())?;
    Ok(masks)
}

/// The [`AttentionModule`](crate::contract::AttentionModule) of a variant defined on one
/// sequence that decodes from a state it carries (the decaying, gated and delta-rule
/// attentions), from three inherent methods of the module:
/// `fn info(&self) -> &'static VariantInfo`;
/// `fn mix(&self, x: Tensor<3>, mask_pad: Option<Tensor<2, Bool>>, causal: bool) ->
/// (Tensor<3>, Option<DecodingState>)`, the attention over `x` with the padding left out (the
/// causal form also returns the state after the last position);
/// `fn step(&self, x: Tensor<3>, state: DecodingState) -> Result<(Tensor<3>, DecodingState),
/// AttentionError>`, one token from the state. Cross-attention and attention masks are refused
/// by [`check_self_attention`].
macro_rules! recurrent_module {
    ($module:ty) => {
        recurrent_module!($module, {});
    };
    // With `rotary: field`: `with_rotary` setting that `bool` field (`rotary`, `proj.rotary`)
    // after checking an inherent `fn rotary_head_width(&self) -> usize` (the width of a head's
    // queries and keys); the module's `mix` and `step` rotate them when the field is set.
    ($module:ty, rotary: $($field:ident).+) => {
        recurrent_module!($module, {
            fn with_rotary(
                mut self,
            ) -> Result<Self, $crate::contract::error::AttentionError> {
                $crate::contract::variant::check_rotary(
                    self.info().name,
                    self.info().capabilities,
                    self.rotary_head_width(),
                )?;
                self.$($field).+ = true;
                Ok(self)
            }
        });
    };
    ($module:ty, { $($extra:item)* }) => {
        impl $crate::contract::AttentionModule for $module {
            $($extra)*

            fn name(&self) -> &'static str {
                self.info().name
            }

            fn capabilities(&self) -> $crate::contract::Capabilities {
                self.info().capabilities
            }

            fn try_forward(
                &self,
                input: $crate::contract::input::AttentionInput,
            ) -> Result<Tensor<3>, $crate::contract::error::AttentionError> {
                input.check_shapes(self.info().name, self.d_model())?;
                let masks = $crate::contract::variant::check_self_attention(self.info(), &input)?;
                let x = input.query().clone();
                Ok(self.mix(x, masks.key_pad, masks.causal).0)
            }

            /// The chunked causal form over the prompt; the state after it.
            fn prefill(
                &self,
                x: Tensor<3>,
            ) -> Result<
                (Tensor<3>, $crate::contract::DecodingState),
                $crate::contract::error::AttentionError,
            > {
                $crate::contract::variant::check_prompt_shapes(
                    self.info().name,
                    self.d_model(),
                    &x,
                    None,
                )?;
                let (y, state) = self.mix(x, None, true);
                Ok((y, state.expect("the causal form returns its state")))
            }

            /// As `prefill`, the padding left out of the state (it neither
            /// decays nor writes it).
            fn prefill_padded(
                &self,
                x: Tensor<3>,
                mask_pad: Tensor<2, Bool>,
            ) -> Result<
                (Tensor<3>, $crate::contract::DecodingState),
                $crate::contract::error::AttentionError,
            > {
                $crate::contract::variant::check_prompt_shapes(
                    self.info().name,
                    self.d_model(),
                    &x,
                    Some(&mask_pad),
                )?;
                let (y, state) = self.mix(x, Some(mask_pad), true);
                Ok((y, state.expect("the causal form returns its state")))
            }

            fn decode(
                &self,
                x: Tensor<3>,
                state: $crate::contract::DecodingState,
            ) -> Result<
                (Tensor<3>, $crate::contract::DecodingState),
                $crate::contract::error::AttentionError,
            > {
                $crate::contract::variant::check_token(self.info().name, self.d_model(), &x)?;
                self.step(x, state)
            }
        }
    };
}
pub(crate) use recurrent_module;
