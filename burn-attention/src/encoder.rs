//! The pre-LN Transformer encoder that any registered attention plugs into.
//!
//! Block: `x + Dropout(Attn(LN(x)))`, then `x + FF(LN(x))` with `FF = Dense(d_ff) GELU Dropout
//! Dense(d_model) Dropout` (the LRA reference block). The encoder ends with a final LayerNorm.

use burn::module::Param;
use burn::nn::{
    Dropout, DropoutConfig, Gelu, Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig,
};
use burn::prelude::*;

use crate::error::AttentionError;
use crate::input::AttentionInput;
use crate::linformer::LinformerSharing;
use crate::registry::{Attention, AttentionConfig};

/// Configuration of one [`EncoderBlock`].
#[derive(Config, Debug)]
pub struct EncoderBlockConfig {
    /// The attention of the block.
    pub attention: AttentionConfig,
    /// Width of the feed-forward hidden layer.
    pub d_ff: usize,
    /// Dropout after the attention and in the feed-forward.
    #[config(default = 0.1)]
    pub dropout: f64,
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
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(AttentionError::field(
                "encoder",
                "dropout",
                format!("must be in [0, 1), got {}", self.dropout),
            ));
        }
        Ok(())
    }

    /// Creates the block.
    ///
    /// # Panics
    /// If [`validate`](Self::validate) fails.
    pub fn init(&self, device: &Device) -> EncoderBlock {
        if let Err(err) = self.validate() {
            panic!("{err}");
        }
        let d_model = self.attention.d_model();
        let dense = |i, o| {
            LinearConfig::new(i, o)
                .with_initializer(Initializer::XavierUniform { gain: 1.0 })
                .init(device)
        };
        EncoderBlock {
            norm_attn: LayerNormConfig::new(d_model)
                .with_epsilon(self.norm_eps)
                .init(device),
            attention: self.attention.init(device),
            norm_ff: LayerNormConfig::new(d_model)
                .with_epsilon(self.norm_eps)
                .init(device),
            ff_in: dense(d_model, self.d_ff),
            ff_out: dense(self.d_ff, d_model),
            activation: Gelu::new(),
            dropout: DropoutConfig::new(self.dropout).init(),
        }
    }
}

/// A pre-LN encoder block around any [`Attention`].
#[derive(Module, Debug)]
pub struct EncoderBlock {
    /// LayerNorm before the attention.
    pub norm_attn: LayerNorm,
    /// The attention.
    pub attention: Attention,
    /// LayerNorm before the feed-forward.
    pub norm_ff: LayerNorm,
    /// Feed-forward input layer.
    pub ff_in: Linear,
    /// Feed-forward output layer.
    pub ff_out: Linear,
    /// Feed-forward activation.
    pub activation: Gelu,
    /// Residual dropout.
    pub dropout: Dropout,
}

impl EncoderBlock {
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
        let x = input.x.clone();
        let normed = AttentionInput {
            x: self.norm_attn.forward(input.x),
            ..input
        };
        let x = x.clone() + self.dropout.forward(self.attention.try_forward(normed)?);
        let h = self
            .activation
            .forward(self.ff_in.forward(self.norm_ff.forward(x.clone())));
        let h = self.ff_out.forward(self.dropout.forward(h));
        Ok(x + self.dropout.forward(h))
    }
}

/// Configuration of an [`Encoder`]: `n_layers` identical blocks and a final LayerNorm.
#[derive(Config, Debug)]
pub struct EncoderConfig {
    /// The block every layer repeats.
    pub block: EncoderBlockConfig,
    /// Number of blocks.
    pub n_layers: usize,
}

impl EncoderConfig {
    /// Checks the configuration; the error names the offending field.
    pub fn validate(&self) -> Result<(), AttentionError> {
        if self.n_layers == 0 {
            return Err(AttentionError::field(
                "encoder",
                "n_layers",
                "must be at least 1",
            ));
        }
        self.block.validate()
    }

    /// Creates the encoder.
    ///
    /// # Panics
    /// If [`validate`](Self::validate) fails.
    pub fn init(&self, device: &Device) -> Encoder {
        if let Err(err) = self.validate() {
            panic!("{err}");
        }
        let shared_projection = match &self.block.attention {
            AttentionConfig::Linformer(c) | AttentionConfig::LinformerLinear(c)
                if c.sharing == LinformerSharing::Layerwise =>
            {
                Some(c.init_shared_projection(device))
            }
            _ => None,
        };
        let d_model = self.block.attention.d_model();
        Encoder {
            blocks: (0..self.n_layers)
                .map(|_| self.block.init(device))
                .collect(),
            shared_projection,
            norm: LayerNormConfig::new(d_model)
                .with_epsilon(self.block.norm_eps)
                .init(device),
        }
    }
}

/// A stack of [`EncoderBlock`]s with a final LayerNorm; holds any projection its layers share.
#[derive(Module, Debug)]
pub struct Encoder {
    /// The blocks.
    pub blocks: Vec<EncoderBlock>,
    /// The projection shared by every layer (Linformer `layerwise`), if any.
    pub shared_projection: Option<Param<Tensor<3>>>,
    /// Final LayerNorm.
    pub norm: LayerNorm,
}

impl Encoder {
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
    pub fn try_forward(&self, mut input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        if let Some(shared) = &self.shared_projection {
            input.shared_projection = Some(shared.val());
        }
        let mut x = input.x.clone();
        for block in &self.blocks {
            x = block.try_forward(AttentionInput { x, ..input.clone() })?;
        }
        Ok(self.norm.forward(x))
    }
}
