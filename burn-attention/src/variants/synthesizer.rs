//! Synthesizer: attention weights synthesized without query-key dot products.
//!
//! Tay et al. 2021, "Synthesizer: Rethinking Self-Attention in Transformer Models", arXiv
//! 2005.00743, as LRA runs it (the dot product ignored, a value projection `G(X)`):
//!
//! - **Random** (`synthesizer`, LRA's factorised random): a learned matrix per head, the same for
//!   every input, `O = softmax(R) G(X)`, `R: [n_max, n_max]` cut to `n × n`; factorised,
//!   `R = R₁ R₂ᵀ` with `R₁, R₂: [n_max, k]` (the default).
//! - **Dense** (`synthesizer-dense`): each position synthesizes its own row of weights with a
//!   two-layer network, `B_i = W₂ ReLU(W₁ x_i)`, `W₁: d → d` (split into heads), `W₂: d/h →
//!   n_max` cut to the first `n` entries, `O = softmax(B) G(X)`; factorised, two narrow heads
//!   `A_i: d/h → a`, `C_i: d/h → c` with `a c >= n_max` whose outer product, flattened, is the row
//!   (`B_{i, αc+γ} = A_{iα} C_{iγ}`).
//!
//! Padded keys and, with causal masking, keys after the query are masked. An input longer than
//! `n_max` is an error naming `n_max`.
//!
//! Cost per head: O(n² d) time; O(n²) memory, except the factorised random form, which is
//! softmax attention with `R₁` as queries and `R₂` as keys and runs on the fused kernels (O(n) on
//! `flex` and `tch`). Parameters: the unfactorised random form holds `h n_max²`, which at LRA's
//! lengths is far more than the rest of a model (LRA's 10% rule cannot hold); the dense form
//! `d² + d n_max / h`. Masks: padding, causal (decoding with a cache of values), an arbitrary
//! attention mask (on the composed steps, which keep the `n × n` weights); its weights on
//! request. No cross-attention.
//!
//! The per-head form ([`AttentionModule::attend`]) ignores the keys; the random form ignores the
//! queries too, and the dense form reads its queries as the hidden layer `W₁ x` split into heads,
//! before the ReLU.

use crate::variants::prelude::*;
use burn::module::Param;
use burn::nn::{Dropout, DropoutConfig, Initializer, Linear, LinearConfig};
use burn::tensor::Distribution;
use burn::tensor::activation::relu;
use serde::{Deserialize, Serialize};

use crate::engines::dropout::dropout;

use crate::engines::heads::{merge_heads, split_heads};
use crate::engines::params::lazy_param;
use crate::kernels;

use crate::engines::softmax::{exact_softmax_attention, masked_softmax};

use crate::engines::gathered_softmax::{padding_flags, suffix_lengths};

const CAPABILITIES: Capabilities = Capabilities {
    attention_mask: true,
    returns_weights: true,
    causal: true,
    fixed_max_len: true,
    weights_sum_to_one: true,
    per_head_form: true,
    prefill_end_padding_only: true,
    ..Capabilities::PADDING_ONLY
};

/// The registry entry of the random Synthesizer.
pub const INFO: VariantInfo = VariantInfo {
    name: "synthesizer",
    paper: "Tay et al. 2021, arXiv 2005.00743 (random; factorised by default, as LRA)",
    time: "O(n² d)",
    memory: "O(n²); factorised O(n k), O(n) fused",
    capabilities: CAPABILITIES,
};

/// The registry entry of the dense Synthesizer.
pub const INFO_DENSE: VariantInfo = VariantInfo {
    name: "synthesizer-dense",
    paper: "Tay et al. 2021, arXiv 2005.00743 (dense)",
    time: "O(n² d)",
    memory: "O(n²)",
    capabilities: CAPABILITIES,
};

/// How the weights are synthesized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SynthesizerMode {
    /// A learned matrix per head.
    Random,
    /// A two-layer network per position.
    Dense,
}

impl SynthesizerMode {
    /// The registry entry of the variant with this mode.
    pub fn info(self) -> &'static VariantInfo {
        match self {
            Self::Random => &INFO,
            Self::Dense => &INFO_DENSE,
        }
    }
}

/// Configuration of [`SynthesizerAttention`].
#[derive(Config, Debug)]
pub struct SynthesizerConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Longest sequence: the length of a synthesized row.
    pub n_max: usize,
    /// Random or dense.
    #[config(default = "SynthesizerMode::Random")]
    pub mode: SynthesizerMode,
    /// Factorise the matrix (random: rank `k`) or the row (dense: `a c >= n_max`).
    #[config(default = true)]
    pub factorized: bool,
    /// Rank of the factorised random matrix.
    #[config(default = 32)]
    pub k: usize,
    /// Dropout on the attention weights (default 0: none). In training on `flex` the fused
    /// kernel drops weights itself; on `tch`, whose CPU flash kernel has no dropout, a non-zero
    /// value runs the composed steps instead, which keep the n × n weights for the backward pass
    /// (several times slower and memory quadratic in n).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases on the projections.
    #[config(default = false)]
    pub bias: bool,
}

impl SynthesizerConfig {
    fn name(&self) -> &'static str {
        self.mode.info().name
    }

    /// The two factors of a factorised dense row, `a c >= n_max`, `a = ⌈√n_max⌉`.
    fn dense_factors(&self) -> [usize; 2] {
        let a = (self.n_max as f64).sqrt().ceil() as usize;
        [a, self.n_max.div_ceil(a)]
    }
}

impl VariantConfig for SynthesizerConfig {
    variant_glue!(SynthesizerAttention, &[INFO, INFO_DENSE], dropout);

    /// k = 4 for the factorized forms; synthesized rows for at least 96 positions.
    fn small(self) -> Self {
        Self {
            n_max: self.n_max.max(96),
            ..self
        }
        .with_k(4)
    }

    fn for_variant(name: &str, model: ModelShape) -> Self {
        let mode = if name == INFO_DENSE.name {
            SynthesizerMode::Dense
        } else {
            SynthesizerMode::Random
        };
        let config = Self::new(model.d_model, model.n_heads, model.n_max).with_mode(mode);
        // LRA's Synthesizer is the factorised random one; the dense row is the paper's plain one.
        config.with_factorized(mode == SynthesizerMode::Random)
    }

    fn info(&self) -> &'static VariantInfo {
        self.mode.info()
    }

    fn check_input(&self, n_q: usize, n_k: usize, causal: bool) -> Result<(), AttentionError> {
        check_within_max_len(self.mode.info(), self.n_max, n_q, n_k, causal)
    }

    fn check_fields(&self) -> Result<(), AttentionError> {
        check_at_least_one(self.name(), "n_max", self.n_max)?;
        if self.mode == SynthesizerMode::Random && self.factorized && self.k == 0 {
            return Err(AttentionError::field(
                self.name(),
                "k",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    fn build(&self, device: &Device) -> SynthesizerAttention {
        let linear = |d_in: usize, d_out: usize| {
            LinearConfig::new(d_in, d_out)
                .with_bias(self.bias)
                .with_initializer(Initializer::XavierUniform { gain: 1.0 })
                .init(device)
        };
        let (h, d, n_max) = (self.n_heads, self.d_model, self.n_max);
        let d_head = d / h;
        let normal = |shape: [usize; 3], std: f64| {
            lazy_param(shape, device, true, move |device| {
                Tensor::random(shape, Distribution::Normal(0.0, std), device)
            })
        };
        let mut module = SynthesizerAttention {
            value: linear(d, d),
            output: linear(d, d),
            hidden: None,
            rows: Vec::new(),
            random: Vec::new(),
            dropout: DropoutConfig::new(self.dropout).init(),
            mode: self.mode,
            n_heads: h,
            n_max,
        };
        match (self.mode, self.factorized) {
            // R₁ R₂ᵀ entries of unit variance: each factor N(0, k^{-1/2}).
            (SynthesizerMode::Random, true) => {
                let std = (self.k as f64).powf(-0.25);
                module.random = vec![
                    normal([h, n_max, self.k], std),
                    normal([h, n_max, self.k], std),
                ];
            }
            (SynthesizerMode::Random, false) => {
                module.random = vec![normal([h, n_max, n_max], 1.0)]
            }
            (SynthesizerMode::Dense, factorized) => {
                module.hidden = Some(linear(d, d));
                module.rows = if factorized {
                    self.dense_factors()
                        .map(|width| linear(d_head, width))
                        .to_vec()
                } else {
                    vec![linear(d_head, n_max)]
                };
            }
        }
        module
    }
}

inherent_config_methods!(SynthesizerConfig);

/// Multi-head Synthesizer attention. Create with [`SynthesizerConfig`].
#[derive(Module, Debug)]
pub struct SynthesizerAttention {
    /// The value projection `G`.
    pub value: Linear,
    /// The output projection.
    pub output: Linear,
    /// Dense: the hidden layer `W₁`.
    pub hidden: Option<Linear>,
    /// Dense: `W₂` (one layer), or the two factors of the row.
    pub rows: Vec<Linear>,
    /// Random: `R` `[heads, n_max, n_max]`, or `R₁`, `R₂` `[heads, n_max, k]`.
    pub random: Vec<Param<Tensor<3>>>,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// Random or dense.
    #[module(skip)]
    pub mode: SynthesizerMode,
    /// Number of heads.
    #[module(skip)]
    pub n_heads: usize,
    /// Longest sequence.
    #[module(skip)]
    pub n_max: usize,
}

impl SynthesizerAttention {
    /// Model width (the output projection's, read from its shape).
    pub fn d_model(&self) -> usize {
        self.output.weight.lazy_shape()[1]
    }

    /// Number of heads.
    pub fn n_heads(&self) -> usize {
        self.n_heads
    }
}

impl SynthesizerAttention {
    /// The synthesized scores of queries `rows` over keys `0..n_k`, `[batch or 1, heads, rows,
    /// n_k]`; `hidden` the dense form's per-head hidden layer before its ReLU.
    fn scores(
        &self,
        hidden: Option<Tensor<4>>,
        rows: std::ops::Range<usize>,
        n_k: usize,
    ) -> Tensor<4> {
        match (self.mode, self.random.as_slice()) {
            (SynthesizerMode::Random, [r]) => {
                r.val().slice(s![.., rows, 0..n_k]).unsqueeze_dim::<4>(0)
            }
            (SynthesizerMode::Random, [r1, r2]) => {
                let a = r1.val().slice(s![.., rows]);
                let c = r2.val().slice(s![.., 0..n_k]);
                a.matmul(c.swap_dims(1, 2)).unsqueeze_dim::<4>(0)
            }
            _ => {
                let hidden = relu(hidden.expect("the dense form reads its hidden layer"));
                match self.rows.as_slice() {
                    [w2] => w2.forward(hidden).slice(s![.., .., .., 0..n_k]),
                    [a, c] => {
                        let (a, c) = (a.forward(hidden.clone()), c.forward(hidden));
                        let [b, h, n, wa] = a.dims();
                        let wc = c.dims()[3];
                        (a.reshape([b, h, n, wa, 1]) * c.reshape([b, h, n, 1, wc]))
                            .reshape([b, h, n, wa * wc])
                            .slice(s![.., .., .., 0..n_k])
                    }
                    _ => unreachable!("one or two row layers"),
                }
            }
        }
    }
}

impl SynthesizerAttention {
    /// The per-head values of `x` and what the weights read from it: the dense form's hidden
    /// layer input (its queries), the values again for the random form (which reads nothing).
    fn queries_and_values(&self, x: Tensor<3>) -> (Tensor<4>, Tensor<4>) {
        let v = split_heads(self.value.forward(x.clone()), self.n_heads);
        let q = match &self.hidden {
            Some(hidden) => split_heads(hidden.forward(x), self.n_heads),
            None => v.clone(),
        };
        (q, v)
    }

    /// The synthesized weights over `n` positions, `[batch, heads, n, n]`, under `masks`.
    fn weights(&self, q: Tensor<4>, [batch, heads, n]: [usize; 3], masks: &HeadMasks) -> Tensor<4> {
        let scores = self.scores(Some(q), 0..n, n).expand([batch, heads, n, n]);
        masked_softmax(scores, masks)
    }
}

impl SynthesizerAttention {
    /// A step over the cache of prompts of different lengths ([`prefill_padded`]), one sequence
    /// at a time: its cached values (padding left out) weighed with the synthesized row of its
    /// own position.
    ///
    /// [`prefill_padded`]: AttentionModule::prefill_padded
    fn decode_padded(
        &self,
        x: Tensor<3>,
        values: Tensor<4>,
        padding: Option<Tensor<2, Bool>>,
    ) -> DecodeResult {
        let [batch, heads, columns, d_head] = values.dims();
        let device = values.device();
        let flags = padding_flags(&padding, batch, columns);
        let mut outputs = Vec::with_capacity(batch);
        for (b, row) in flags.iter().enumerate() {
            let real: Vec<i64> = (0..columns)
                .filter(|&j| !row[j])
                .map(|j| j as i64)
                .collect();
            let seen = real.len();
            check_within_max_len(self.mode.info(), self.n_max, seen, seen, true)?;
            let index = Tensor::<1, Int>::from_data(TensorData::new(real, [seen]), &device);
            let own = values.clone().slice(s![b..b + 1]).select(2, index);
            let hidden = self
                .hidden
                .as_ref()
                .map(|hidden| split_heads(hidden.forward(x.clone().slice(s![b..b + 1])), heads));
            let scores = self
                .scores(hidden, seen - 1..seen, seen)
                .expand([1, heads, 1, seen]);
            outputs.push(kernels::softmax(scores).matmul(own));
        }
        let o: Tensor<4> = Tensor::cat(outputs, 0);
        debug_assert_eq!(o.dims(), [batch, heads, 1, d_head]);
        let state = DecodingState::KeyValueCache {
            keys: values.clone(),
            values,
            padding,
        };
        Ok((self.output.forward(merge_heads(o)), state))
    }
}

impl AttentionModule for SynthesizerAttention {
    variant_facts!(self.mode);

    rotary_refused!(
        "its weights are synthesized from each query alone or learned outright, not formed from query-key products a rotation would make relative"
    );

    fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        input.check_shapes(self.name(), self.d_model())?;
        let [n_q, n_k] = [input.query_len(), input.key_len()];
        check_within_max_len(self.mode.info(), self.n_max, n_q, n_k, input.is_causal())?;
        let masks = input.head_masks();
        let (q, v) = self.queries_and_values(input.query().clone());
        let o = self.attend(q, v.clone(), v, masks)?;
        Ok(self.output.forward(merge_heads(o)))
    }

    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        let [batch, heads, n, _] = v.dims();
        check_within_max_len(
            self.mode.info(),
            self.n_max,
            q.dims()[2],
            k.dims()[2],
            masks.causal,
        )?;
        check_attention_mask(self.mode.info(), &masks, &q, k.dims()[2])?;
        if masks.attn.is_some() {
            let weights = self.weights(q, [batch, heads, n], &masks);
            return Ok(dropout(&self.dropout, weights).matmul(v));
        }
        if let (SynthesizerMode::Random, [r1, r2]) = (self.mode, self.random.as_slice()) {
            // softmax(R₁ R₂ᵀ) V is softmax attention with R₁ as queries and R₂ as keys, without
            // the 1/√k the kernel applies. Broadcast over the batch, then cut to n positions:
            // on wgpu (Burn 0.22.1) the other order (cut, then broadcast) gave R₂, the
            // transposed operand of the score matmul, a wrong gradient (caught by the
            // backend-agreement test; reproduced on a [2, 16, 4] parameter).
            let [_, n_max, rank] = r1.dims();
            let factor = |r: &Param<Tensor<3>>| {
                r.val()
                    .unsqueeze_dim::<4>(0)
                    .expand([batch, heads, n_max, rank])
                    .slice(s![.., .., 0..n])
            };
            let queries = factor(r1).mul_scalar((rank as f32).sqrt());
            return Ok(exact_softmax_attention(
                queries,
                factor(r2),
                v,
                masks.key_pad,
                masks.causal,
                Some(&self.dropout),
            ));
        }
        let weights = self.weights(q, [batch, heads, n], &masks);
        Ok(dropout(&self.dropout, weights).matmul(v))
    }

    /// The synthesized weights `[batch, heads, n, n]`, before dropout.
    fn try_forward_with_weights(&self, input: AttentionInput) -> WeightsResult {
        input.check_shapes(self.name(), self.d_model())?;
        let masks = input.head_masks();
        let (q, v) = self.queries_and_values(input.query().clone());
        let [batch, heads, n, _] = v.dims();
        check_within_max_len(self.mode.info(), self.n_max, n, n, masks.causal)?;
        check_attention_mask(self.mode.info(), &masks, &q, n)?;
        let weights = self.weights(q, [batch, heads, n], &masks);
        let o = dropout(&self.dropout, weights.clone()).matmul(v);
        Ok((self.output.forward(merge_heads(o)), weights))
    }

    /// The causal forward pass over the prompt; its values are the cache.
    fn prefill(&self, x: Tensor<3>) -> DecodeResult {
        check_prompt_shapes(self.name(), self.d_model(), &x, None)?;
        let (q, v) = self.queries_and_values(x);
        let o = self.attend(q, v.clone(), v.clone(), HeadMasks::new(None, true))?;
        Ok((
            self.output.forward(merge_heads(o)),
            DecodingState::KeyValueCache {
                keys: v.clone(),
                values: v,
                padding: None,
            },
        ))
    }

    /// Prompts of different lengths, padded at their end: the causal forward pass; the cache is
    /// every value, the padding marked.
    fn prefill_padded(&self, x: Tensor<3>, mask_pad: Tensor<2, Bool>) -> DecodeResult {
        check_prompt_shapes(self.name(), self.d_model(), &x, Some(&mask_pad))?;
        suffix_lengths(self.name(), &mask_pad)?;
        let (q, v) = self.queries_and_values(x);
        let o = self.attend(
            q,
            v.clone(),
            v.clone(),
            HeadMasks::new(Some(mask_pad.clone()), true),
        )?;
        Ok((
            self.output.forward(merge_heads(o)),
            DecodingState::KeyValueCache {
                keys: v.clone(),
                values: v,
                padding: Some(mask_pad),
            },
        ))
    }

    /// Appends the token's value to the cache and weighs the cached values with the token's
    /// synthesized row (the row of its position `t`, the number of values cached before it).
    fn decode(&self, x: Tensor<3>, state: DecodingState) -> DecodeResult {
        check_token(self.name(), self.d_model(), &x)?;
        let v = split_heads(self.value.forward(x.clone()), self.n_heads);
        if state.is_padded_cache() {
            let (_, values, padding) = state.append_to_padded_cache(self.name(), v.clone(), v)?;
            return self.decode_padded(x, values, padding);
        }
        // The cache's keys are its values: the weights read no keys.
        let (_, values) = state.append_to_cache(self.name(), v.clone(), v)?;
        let seen = values.dims()[2];
        check_within_max_len(self.mode.info(), self.n_max, seen, seen, true)?;
        let hidden = self
            .hidden
            .as_ref()
            .map(|hidden| split_heads(hidden.forward(x), self.n_heads));
        let t = seen - 1;
        let batch = values.dims()[0];
        let scores = self
            .scores(hidden, t..t + 1, seen)
            .expand([batch, self.n_heads, 1, seen]);
        let weights = kernels::softmax(scores);
        let o = weights.matmul(values.clone());
        let out = self.output.forward(merge_heads(o));
        Ok((
            out,
            DecodingState::KeyValueCache {
                keys: values.clone(),
                values,
                padding: None,
            },
        ))
    }
}
