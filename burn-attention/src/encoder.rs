//! The pre-LN Transformer encoder that any attention plugs into: a registered one (through
//! [`EncoderConfig`]) or any module implementing [`AttentionModule`] (through
//! [`EncoderBlock::new`] and [`Encoder::new`]).
//!
//! Block: `x + Dropout(Attn(LN(x)))`, then `x + FF(LN(x))` with `FF = Dense(d_ff) GELU Dropout
//! Dense(d_model) Dropout` (the LRA reference block). The encoder ends with a final LayerNorm.
//! With causal masking the encoder is a decoder-only stack, and [`Encoder::decode`] runs it one
//! token at a time.

use burn::module::Param;
use burn::nn::{
    Dropout, DropoutConfig, Gelu, Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig,
};
use burn::prelude::*;

use crate::contract::error::AttentionError;
use crate::contract::input::{AttentionInput, check_width};
use crate::contract::{AttentionModule, DecodingState, SegmentMemory};
use crate::engines::dropout::dropout;
use crate::engines::params::num_params_checked;
use crate::kernels;
use crate::registry::{Attention, AttentionConfig};

/// Configuration of one [`EncoderBlock`].
#[derive(Config, Debug)]
pub struct EncoderBlockConfig {
    /// The attention of the block.
    pub attention: AttentionConfig,
    /// Width of the feed-forward hidden layer.
    pub d_ff: usize,
    /// Dropout on the residual branches: after the attention and in the feed-forward (0.1, as
    /// Burn's `TransformerEncoder`). The attention weights' own dropout is the attention's (see
    /// [`AttentionConfig::with_weight_dropout`]).
    #[config(default = 0.1)]
    pub residual_dropout: f64,
    /// LayerNorm epsilon (Flax's 1e-6, as the LRA reference).
    #[config(default = 1e-6)]
    pub norm_eps: f64,
}

impl EncoderBlockConfig {
    /// Checks the configuration; the error names the offending field.
    pub fn validate(&self) -> Result<(), AttentionError> {
        self.attention.validate()?;
        if self.d_ff == 0 {
            return Err(AttentionError::field(
                "encoder",
                "d_ff",
                "must be at least 1",
            ));
        }
        if !(0.0..1.0).contains(&self.residual_dropout) {
            return Err(AttentionError::field(
                "encoder",
                "residual_dropout",
                format!("must be in [0, 1), got {}", self.residual_dropout),
            ));
        }
        Ok(())
    }

    /// Creates the block.
    ///
    /// # Panics
    /// If [`validate`](Self::validate) fails.
    pub fn init(&self, device: &Device) -> EncoderBlock<Attention> {
        if let Err(err) = self.validate() {
            panic!("{err}");
        }
        let settings = BlockSettings {
            d_model: self.attention.d_model(),
            d_ff: self.d_ff,
            residual_dropout: self.residual_dropout,
            norm_eps: self.norm_eps,
        };
        EncoderBlock::new(self.attention.init(device), settings, device)
    }
}

/// The shape of an [`EncoderBlock`] around an attention of the user's: everything
/// [`EncoderBlockConfig`] sets except the attention.
#[derive(Debug, Clone, Copy)]
pub struct BlockSettings {
    /// Model width (the attention's input and output width).
    pub d_model: usize,
    /// Width of the feed-forward hidden layer.
    pub d_ff: usize,
    /// Dropout on the residual branches: after the attention and in the feed-forward.
    pub residual_dropout: f64,
    /// LayerNorm epsilon.
    pub norm_eps: f64,
}

/// A pre-LN encoder block around any attention module (the registry's [`Attention`] unless
/// said otherwise).
#[derive(Module, Debug)]
pub struct EncoderBlock<A: Module + AttentionModule = Attention> {
    /// LayerNorm before the attention.
    pub norm_attn: LayerNorm,
    /// The attention.
    pub attention: A,
    /// LayerNorm before the feed-forward.
    pub norm_ff: LayerNorm,
    /// Feed-forward input layer.
    pub ff_in: Linear,
    /// Feed-forward output layer.
    pub ff_out: Linear,
    /// Feed-forward activation: the exact GELU (computed by the library's vectorised kernel on
    /// `flex`, by Burn's elsewhere).
    pub activation: Gelu,
    /// Dropout on the residual branches (the attention weights' own is the attention's).
    pub dropout: Dropout,
    /// The LayerNorms' epsilon, kept beside them for the fused LayerNorm (Burn's `LayerNorm`
    /// does not expose it). Not part of the record.
    #[module(skip)]
    pub norm_eps: f64,
}

impl<A: Module + AttentionModule> EncoderBlock<A> {
    /// A block around `attention`, any module implementing [`AttentionModule`].
    pub fn new(attention: A, settings: BlockSettings, device: &Device) -> Self {
        let BlockSettings {
            d_model,
            d_ff,
            residual_dropout,
            norm_eps,
        } = settings;
        let dense = |i, o| {
            LinearConfig::new(i, o)
                .with_initializer(Initializer::XavierUniform { gain: 1.0 })
                .init(device)
        };
        let norm = || {
            LayerNormConfig::new(d_model)
                .with_epsilon(norm_eps)
                .init(device)
        };
        Self {
            norm_attn: norm(),
            attention,
            norm_ff: norm(),
            ff_in: dense(d_model, d_ff),
            ff_out: dense(d_ff, d_model),
            activation: Gelu::new(),
            dropout: DropoutConfig::new(residual_dropout).init(),
            norm_eps,
        }
    }

    /// Model width (its first LayerNorm's).
    pub fn d_model(&self) -> usize {
        self.norm_attn.gamma.lazy_shape()[0]
    }

    /// Applies the block; the input's masks reach the attention.
    ///
    /// # Shapes
    /// - `x` in the input: `[batch, n, d_model]`; output: the same.
    pub fn forward(&self, input: AttentionInput) -> Tensor<3> {
        self.try_forward(input)
            .unwrap_or_else(|err| panic!("{err}"))
    }

    /// Applies the block, or says why its attention cannot take this input.
    pub fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        self.around_input(input, |input| {
            self.attention.try_forward(input).map(|y| (y, ()))
        })
        .map(|(y, ())| y)
    }

    /// Applies the block and returns its attention's auxiliary loss for this input, if any
    /// (see [`AttentionModule::try_forward_with_loss`]).
    pub fn try_forward_with_loss(
        &self,
        input: AttentionInput,
    ) -> Result<(Tensor<3>, Option<Tensor<1>>), AttentionError> {
        self.around_input(input, |input| self.attention.try_forward_with_loss(input))
    }

    /// Applies the block to positions that follow those `memory` holds, its attention carrying
    /// the memory (see [`AttentionModule::forward_with_memory`]); returns the memory of the next
    /// call.
    pub fn forward_with_memory(
        &self,
        input: AttentionInput,
        memory: Option<SegmentMemory>,
    ) -> Result<(Tensor<3>, SegmentMemory), AttentionError> {
        self.around_input(input, |input| {
            self.attention.forward_with_memory(input, memory)
        })
    }

    /// One token through the block, its attention decoding from `state` (see
    /// [`AttentionModule::decode`]): `x: [batch, 1, d_model]`.
    pub fn decode(
        &self,
        x: Tensor<3>,
        state: DecodingState,
    ) -> Result<(Tensor<3>, DecodingState), AttentionError> {
        self.around(x, |normed| self.attention.decode(normed, state))
    }

    /// A whole prompt `x: [batch, n, d_model]` through the block at once, its attention
    /// prefilling its decoding state (see [`AttentionModule::prefill`]): the causal output and
    /// the state from which [`decode`](Self::decode) goes on.
    pub fn prefill(&self, x: Tensor<3>) -> Result<(Tensor<3>, DecodingState), AttentionError> {
        self.around(x, |normed| self.attention.prefill(normed))
    }

    /// [`prefill`](Self::prefill) for prompts of different lengths, padded by `mask_pad`
    /// (see [`AttentionModule::prefill_padded`]).
    pub fn prefill_padded(
        &self,
        x: Tensor<3>,
        mask_pad: Tensor<2, Bool>,
    ) -> Result<(Tensor<3>, DecodingState), AttentionError> {
        self.around(x, |normed| self.attention.prefill_padded(normed, mask_pad))
    }

    /// The block around one call of its attention's contract: `attend` gets `LN(x)` and
    /// returns the attention's output with whatever else the call returns (a state, a memory,
    /// a loss); the block's output is `FF-half(x + Dropout(output))`, beside that.
    fn around<T>(
        &self,
        x: Tensor<3>,
        attend: impl FnOnce(Tensor<3>) -> Result<(Tensor<3>, T), AttentionError>,
    ) -> Result<(Tensor<3>, T), AttentionError> {
        check_width(self.attention.name(), "an input", &x, self.d_model())?;
        let normed = kernels::layer_norm(&self.norm_attn, x.clone(), self.norm_eps);
        let (attended, rest) = attend(normed)?;
        Ok((self.residual_then_feed_forward(x, attended), rest))
    }

    /// [`around`](Self::around) for the calls that take an input: its queries normalised, its
    /// masks and memory kept.
    fn around_input<T>(
        &self,
        input: AttentionInput,
        attend: impl FnOnce(AttentionInput) -> Result<(Tensor<3>, T), AttentionError>,
    ) -> Result<(Tensor<3>, T), AttentionError> {
        input.check_shapes(self.attention.name(), self.d_model())?;
        let x = input.query().clone();
        self.around(x, |normed| attend(input.with_query(normed)))
    }

    /// The block's output from its input `x` and the attention's output on it:
    /// `FF-half(x + Dropout(attended))`.
    fn residual_then_feed_forward(&self, x: Tensor<3>, attended: Tensor<3>) -> Tensor<3> {
        self.feed_forward(x + dropout(&self.dropout, attended))
    }

    /// The block's second half: `x + FF(LN(x))`.
    fn feed_forward(&self, x: Tensor<3>) -> Tensor<3> {
        // The exact GELU `activation` stands for, vectorised on `flex`.
        let h = kernels::gelu(self.ff_in.forward(kernels::layer_norm(
            &self.norm_ff,
            x.clone(),
            self.norm_eps,
        )));
        let h = self.ff_out.forward(dropout(&self.dropout, h));
        x + dropout(&self.dropout, h)
    }
}

/// Configuration of an [`Encoder`]: `n_layers` blocks and a final LayerNorm. Every block is
/// `block`, or, in a hybrid stack, `block` around the attention `layers` gives that layer.
#[derive(Config, Debug)]
pub struct EncoderConfig {
    /// The block every layer repeats (its attention is every layer's unless `layers` is set).
    pub block: EncoderBlockConfig,
    /// Number of blocks.
    pub n_layers: usize,
    /// A hybrid stack's attention for each layer, `n_layers` of them, all of the block's width
    /// (e.g. a sliding-window softmax layer after every few linear ones); empty: every layer
    /// takes `block.attention`. Set with [`with_layers`](Self::with_layers) or
    /// [`named`](Self::named)'s `a+b` patterns.
    #[config(default = "Vec::new()")]
    pub layers: Vec<AttentionConfig>,
}

/// The separator of a hybrid stack's pattern of attentions in a name: `gla+gla+local`.
pub const HYBRID_SEPARATOR: char = '+';

/// The registry names in a hybrid stack's pattern (`gla+local` gives `gla` and `local`); a
/// single name for a plain one. Each part must be a registered name: the error names the
/// pattern and the part (an empty one, as in `gla++local` or `gla+`, included).
pub fn hybrid_pattern(name: &str) -> Result<Vec<&str>, AttentionError> {
    let parts: Vec<&str> = name.split(HYBRID_SEPARATOR).collect();
    if parts.len() == 1 {
        crate::registry::variant(name)?;
        return Ok(parts);
    }
    for (i, part) in parts.iter().enumerate() {
        let layer = format!("layer {} of {}", i + 1, parts.len());
        let message = if part.is_empty() {
            format!("{layer} is empty (a pattern joins names with one `+`, e.g. `gla+local`)")
        } else if let Err(err) = crate::registry::variant(part) {
            format!("{layer}: {err}")
        } else {
            continue;
        };
        return Err(AttentionError::InvalidPattern {
            pattern: name.to_string(),
            message,
        });
    }
    Ok(parts)
}

/// A pattern of `pattern.len()` attentions repeated to `n_layers` layers; the error names
/// `n_layers` when the pattern does not divide it.
pub fn repeat_pattern<T: Clone>(pattern: &[T], n_layers: usize) -> Result<Vec<T>, AttentionError> {
    if pattern.is_empty() || !n_layers.is_multiple_of(pattern.len()) {
        return Err(AttentionError::field(
            "encoder",
            "n_layers",
            format!(
                "must be a whole multiple of the hybrid pattern of {} layers, got {n_layers}",
                pattern.len()
            ),
        ));
    }
    let mut layers = Vec::new();
    if layers.try_reserve_exact(n_layers).is_err() {
        return Err(AttentionError::field(
            "encoder",
            "n_layers",
            format!("{n_layers} layers are more than memory can list"),
        ));
    }
    layers.extend(pattern.iter().cloned().cycle().take(n_layers));
    Ok(layers)
}

impl EncoderConfig {
    /// `n_layers` blocks of the variant called `name` with its paper defaults, width `d_model`,
    /// `n_heads` heads and a feed-forward layer of `d_ff`, in one call; the block's other
    /// settings at their defaults (see [`EncoderBlockConfig`]). A name of several variants
    /// joined by `+` (`gla+gla+local`) is a hybrid stack: the pattern of layers, repeated to
    /// `n_layers` (which it must divide). For the variants that need the longest sequence,
    /// [`AttentionConfig::named`]'s error says how to give it.
    pub fn named(
        name: &str,
        d_model: usize,
        n_heads: usize,
        d_ff: usize,
        n_layers: usize,
    ) -> Result<Self, AttentionError> {
        let pattern = hybrid_pattern(name)?
            .into_iter()
            .map(|part| AttentionConfig::named(part, d_model, n_heads))
            .collect::<Result<Vec<_>, _>>()?;
        let config = Self::new(EncoderBlockConfig::new(pattern[0].clone(), d_ff), n_layers);
        let config = if pattern.len() > 1 {
            config.with_layers(repeat_pattern(&pattern, n_layers)?)
        } else {
            config
        };
        config.validate()?;
        Ok(config)
    }

    /// The attention of layer `layer` (`block.attention` unless the stack is hybrid).
    ///
    /// # Panics
    /// If `layers` is set and `layer` is not below its length.
    pub fn layer_attention(&self, layer: usize) -> &AttentionConfig {
        if self.layers.is_empty() {
            &self.block.attention
        } else {
            &self.layers[layer]
        }
    }

    /// Every layer's attention, in order (`n_layers` of them).
    pub fn layer_attentions(&self) -> Vec<&AttentionConfig> {
        (0..self.n_layers)
            .map(|i| self.layer_attention(i))
            .collect()
    }

    /// The block of layer `layer`: `block` around the layer's attention.
    fn layer_block(&self, layer: usize) -> EncoderBlockConfig {
        let mut block = self.block.clone();
        block.attention = self.layer_attention(layer).clone();
        block
    }

    /// Whether the layers' attentions differ (a hybrid stack).
    pub fn is_hybrid(&self) -> bool {
        self.layers
            .iter()
            .any(|a| a.name() != self.block.attention.name())
    }

    /// Sets the dropout on the attention weights, in every layer's attention (see
    /// [`AttentionConfig::with_weight_dropout`]; 0 by default).
    pub fn with_weight_dropout(mut self, dropout: f64) -> Self {
        self.block.attention = self.block.attention.with_weight_dropout(dropout);
        self.layers = self
            .layers
            .into_iter()
            .map(|a| a.with_weight_dropout(dropout))
            .collect();
        self
    }

    /// Sets the dropout on every block's residual branches (see
    /// [`EncoderBlockConfig::residual_dropout`]; 0.1 by default).
    pub fn with_residual_dropout(mut self, dropout: f64) -> Self {
        self.block.residual_dropout = dropout;
        self
    }

    /// Model width.
    pub fn d_model(&self) -> usize {
        self.block.attention.d_model()
    }

    /// Number of heads (the first layer's).
    pub fn n_heads(&self) -> usize {
        self.layer_attention(0).n_heads()
    }

    /// Checks the configuration; the error names the offending field.
    pub fn validate(&self) -> Result<(), AttentionError> {
        if self.n_layers == 0 {
            return Err(AttentionError::field(
                "encoder",
                "n_layers",
                "must be at least 1",
            ));
        }
        self.block.validate()?;
        if self.layers.is_empty() {
            return Ok(());
        }
        if self.layers.len() != self.n_layers {
            return Err(AttentionError::field(
                "encoder",
                "layers",
                format!(
                    "gives {} attentions for {} layers",
                    self.layers.len(),
                    self.n_layers
                ),
            ));
        }
        for (i, attention) in self.layers.iter().enumerate() {
            attention.validate()?;
            if attention.d_model() != self.d_model() {
                return Err(AttentionError::field(
                    "encoder",
                    "layers",
                    format!(
                        "layer {i} ({}) is {} wide, the block {}",
                        attention.name(),
                        attention.d_model(),
                        self.d_model()
                    ),
                ));
            }
            if self.is_hybrid() && attention.shares_projection() {
                return Err(AttentionError::field(
                    "encoder",
                    "layers",
                    format!(
                        "layer {i} ({}) shares its projection across the layers (Linformer's \
                         layerwise sharing), which needs every layer to be one",
                        attention.name()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Number of scalars the encoder's parameters will hold (frozen ones included), counted from
    /// their shapes with checked arithmetic before any is allocated: each layer's block is
    /// built, lazily, and counted (one block `n_layers` times unless the stack is hybrid), with
    /// the final norm and any projection the layers share. `None` when the count does not fit in
    /// a `usize`; an error when the configuration is invalid.
    pub fn num_params(&self, device: &Device) -> Result<Option<usize>, AttentionError> {
        self.validate()?;
        let blocks = if self.layers.is_empty() {
            num_params_checked(&self.block.init(device)).and_then(|b| b.checked_mul(self.n_layers))
        } else {
            (0..self.n_layers).try_fold(0usize, |sum, layer| {
                sum.checked_add(num_params_checked(&self.layer_block(layer).init(device))?)
            })
        };
        let shared = match self.layer_attention(0).init_shared_projection(device) {
            Some(projection) => num_params_checked(&projection),
            None => Some(0),
        };
        let norm = num_params_checked(&final_norm(
            self.block.attention.d_model(),
            self.block.norm_eps,
            device,
        ));
        Ok(blocks
            .zip(shared.zip(norm))
            .and_then(|(blocks, (shared, norm))| blocks.checked_add(shared)?.checked_add(norm)))
    }

    /// Number of scalars the encoder trains: [`num_params`](Self::num_params) less the frozen
    /// parameters of its layers' attentions ([`AttentionConfig::frozen_params`]), counted from
    /// shapes without allocating any. `None` when a count does not fit in a `usize`.
    pub fn num_trainable_params(&self, device: &Device) -> Result<Option<usize>, AttentionError> {
        // A plain stack's count from one layer's (n_layers may be too many to list).
        let frozen = if self.layers.is_empty() {
            (self.block.attention.frozen_params())
                .and_then(|per_layer| per_layer.checked_mul(self.n_layers))
        } else {
            (self.layers.iter()).try_fold(0usize, |sum, a| sum.checked_add(a.frozen_params()?))
        };
        Ok(self
            .num_params(device)?
            .zip(frozen)
            .map(|(all, frozen)| all - frozen))
    }

    /// Creates the encoder.
    ///
    /// # Panics
    /// If [`validate`](Self::validate) fails.
    pub fn init(&self, device: &Device) -> Encoder<Attention> {
        if let Err(err) = self.validate() {
            panic!("{err}");
        }
        let blocks = (0..self.n_layers)
            .map(|layer| self.layer_block(layer).init(device))
            .collect();
        let mut encoder = Encoder::new(blocks, self.block.norm_eps, device);
        encoder.shared_projection = self.layer_attention(0).init_shared_projection(device);
        encoder
    }
}

/// The LayerNorm after an encoder's last block.
fn final_norm(d_model: usize, norm_eps: f64, device: &Device) -> LayerNorm {
    LayerNormConfig::new(d_model)
        .with_epsilon(norm_eps)
        .init(device)
}

impl EncoderBlock<Attention> {
    /// Number of heads of the block's attention.
    pub fn n_heads(&self) -> usize {
        self.attention.n_heads()
    }
}

/// A stack of [`EncoderBlock`]s with a final LayerNorm; holds any projection its layers share.
#[derive(Module, Debug)]
pub struct Encoder<A: Module + AttentionModule = Attention> {
    /// The blocks.
    pub blocks: Vec<EncoderBlock<A>>,
    /// The projection shared by every layer (Linformer `layerwise`), if any.
    pub shared_projection: Option<Param<Tensor<3>>>,
    /// Final LayerNorm.
    pub norm: LayerNorm,
    /// The final LayerNorm's epsilon (see [`EncoderBlock::norm_eps`]). Not part of the record.
    #[module(skip)]
    pub norm_eps: f64,
}

impl<A: Module + AttentionModule> Encoder<A> {
    /// An encoder of `blocks` (at least one, e.g. from [`EncoderBlock::new`] around the user's
    /// attention) and a final LayerNorm of the blocks' width with epsilon `norm_eps`.
    ///
    /// # Panics
    /// If `blocks` is empty.
    pub fn new(blocks: Vec<EncoderBlock<A>>, norm_eps: f64, device: &Device) -> Self {
        // Read from the shape, not the tensor: a lazily built block stays unallocated.
        let d_model = blocks
            .first()
            .expect("an encoder needs at least one block")
            .norm_attn
            .gamma
            .lazy_shape()[0];
        Self {
            blocks,
            shared_projection: None,
            norm: final_norm(d_model, norm_eps, device),
            norm_eps,
        }
    }

    /// Model width (its final norm's).
    pub fn d_model(&self) -> usize {
        self.norm.gamma.lazy_shape()[0]
    }

    /// This encoder with rotary positions on in every block's attention (see
    /// [`AttentionModule::with_rotary`]); the first layer whose attention refuses them is the
    /// error.
    pub fn with_rotary(mut self) -> Result<Self, AttentionError> {
        self.blocks = self
            .blocks
            .into_iter()
            .map(|mut block| {
                block.attention = block.attention.with_rotary()?;
                Ok(block)
            })
            .collect::<Result<_, AttentionError>>()?;
        Ok(self)
    }

    /// Redraws the random features of every block's attention (see [`Attention::redraw`]).
    pub fn redraw(mut self) -> Self {
        self.blocks = self
            .blocks
            .into_iter()
            .map(|mut block| {
                block.attention = block.attention.redraw();
                block
            })
            .collect();
        self
    }

    /// The sum of every block's regularisation term ([`Attention::penalty`]), for the training
    /// loss to add; `None` when no block has one.
    pub fn penalty(&self) -> Option<Tensor<1>> {
        self.blocks
            .iter()
            .filter_map(|block| block.attention.penalty())
            .reduce(|a, b| a + b)
    }

    /// Applies every block, then the final LayerNorm.
    ///
    /// # Shapes
    /// - `x` in the input: `[batch, n, d_model]`; output: the same.
    pub fn forward(&self, input: AttentionInput) -> Tensor<3> {
        self.try_forward(input)
            .unwrap_or_else(|err| panic!("{err}"))
    }

    /// Applies the encoder, or says why its attention cannot take this input.
    pub fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        let input = self.with_shared_projection(input);
        let mut x = input.query().clone();
        for block in &self.blocks {
            x = block.try_forward(input.clone().with_query(x))?;
        }
        Ok(kernels::layer_norm(&self.norm, x, self.norm_eps))
    }

    /// Applies the encoder for training: the output and the sum of the blocks' auxiliary
    /// losses for this input (see [`AttentionModule::try_forward_with_loss`]; `None` when no
    /// block has one), for the training loss to add beside [`penalty`](Self::penalty).
    pub fn try_forward_with_loss(
        &self,
        input: AttentionInput,
    ) -> Result<(Tensor<3>, Option<Tensor<1>>), AttentionError> {
        let input = self.with_shared_projection(input);
        let mut x = input.query().clone();
        let mut total: Option<Tensor<1>> = None;
        for block in &self.blocks {
            let (y, loss) = block.try_forward_with_loss(input.clone().with_query(x))?;
            x = y;
            total = match (total, loss) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
        }
        Ok((kernels::layer_norm(&self.norm, x, self.norm_eps), total))
    }

    /// The input with the encoder's shared sequence projection, where it has one (Linformer's
    /// layerwise sharing).
    fn with_shared_projection(&self, input: AttentionInput) -> AttentionInput {
        match &self.shared_projection {
            Some(shared) => input.shared_projection(shared.val()),
            None => input,
        }
    }

    /// Applies the encoder to a stretch of a sequence that follows those `memories` hold (one
    /// per block, from the previous call; an empty `Vec` for the first), each block's attention
    /// carrying its memory (the recurrent attentions: Transformer-XL, see
    /// [`AttentionModule::forward_with_memory`]). Returns the output and the next call's
    /// memories: consecutive calls over a sequence cut at segment boundaries give what one call
    /// over the whole sequence gives, with the gradient stopped between calls.
    pub fn forward_with_memory(
        &self,
        input: AttentionInput,
        memories: Vec<SegmentMemory>,
    ) -> Result<(Tensor<3>, Vec<SegmentMemory>), AttentionError> {
        let mut memories = memories.into_iter().map(Some).collect::<Vec<_>>();
        memories.resize(self.blocks.len(), None);
        let mut x = input.query().clone();
        let mut next = Vec::with_capacity(self.blocks.len());
        for (block, memory) in self.blocks.iter().zip(memories) {
            let (y, memory) = block.forward_with_memory(input.clone().with_query(x), memory)?;
            x = y;
            next.push(memory);
        }
        Ok((kernels::layer_norm(&self.norm, x, self.norm_eps), next))
    }

    /// A whole prompt `x: [batch, n, d_model]` through every block at once: the causal forward
    /// pass's output and each block's decoding state after the prompt, from which
    /// [`decode`](Self::decode) goes on (equal to decoding the prompt token by token).
    pub fn prefill(&self, x: Tensor<3>) -> Result<(Tensor<3>, Vec<DecodingState>), AttentionError> {
        self.prefill_with(x, None)
    }

    /// [`prefill`](Self::prefill) for prompts of different lengths, padded to the longest and
    /// marked by `mask_pad: [batch, n]` (`true` = padding): decoding then goes on for every
    /// prompt from its own end, one new token per prompt a step (see
    /// [`AttentionModule::prefill_padded`] for the attentions that can).
    pub fn prefill_padded(
        &self,
        x: Tensor<3>,
        mask_pad: Tensor<2, Bool>,
    ) -> Result<(Tensor<3>, Vec<DecodingState>), AttentionError> {
        self.prefill_with(x, Some(mask_pad))
    }

    /// The prompt through every block (padded prompts where `mask_pad`), then the final norm.
    fn prefill_with(
        &self,
        mut x: Tensor<3>,
        mask_pad: Option<Tensor<2, Bool>>,
    ) -> Result<(Tensor<3>, Vec<DecodingState>), AttentionError> {
        let mut states = Vec::with_capacity(self.blocks.len());
        for block in &self.blocks {
            let (y, state) = match &mask_pad {
                None => block.prefill(x)?,
                Some(mask_pad) => block.prefill_padded(x, mask_pad.clone())?,
            };
            x = y;
            states.push(state);
        }
        Ok((kernels::layer_norm(&self.norm, x, self.norm_eps), states))
    }

    /// One token through every block, each block's attention decoding from its own state:
    /// `x: [batch, 1, d_model]` is the token after those `states` have seen (start from
    /// `vec![DecodingState::default(); n_layers]`, or an empty `Vec`). Returns the token's
    /// output, equal to the causal forward pass's at its position, and the new states.
    pub fn decode(
        &self,
        x: Tensor<3>,
        mut states: Vec<DecodingState>,
    ) -> Result<(Tensor<3>, Vec<DecodingState>), AttentionError> {
        states.resize(self.blocks.len(), DecodingState::Empty);
        let mut x = x;
        let mut next = Vec::with_capacity(self.blocks.len());
        for (block, state) in self.blocks.iter().zip(states) {
            let (y, state) = block.decode(x, state)?;
            x = y;
            next.push(state);
        }
        Ok((kernels::layer_norm(&self.norm, x, self.norm_eps), next))
    }
}

impl Encoder<Attention> {
    /// Number of heads of the first block's attention (a hybrid stack's layers may differ).
    pub fn n_heads(&self) -> usize {
        self.blocks[0].n_heads()
    }
}
