//! Transformer-XL attention: the sequence in segments, each attending to itself and to the
//! gradient-stopped states of the positions before it, with relative positions.
//!
//! Dai et al. 2019, "Transformer-XL", arXiv 1901.02860. The sequence runs in segments of
//! `segment_len` positions; a segment's queries attend to its own keys and to the keys and values
//! of the `mem_len` positions before it, computed from the layer's input with the gradient
//! stopped (the paper's `SG(h^{n−1}_{τ−1})`). Scores use the paper's relative positional
//! encoding,
//!
//! `A_ij = q_iᵀ k_j + q_iᵀ W_R R_{i−j} + uᵀ k_j + vᵀ W_R R_{i−j}`, scaled by `1/√d`,
//!
//! with `R` the sinusoids of the distance `i − j`, `W_R` a learned projection and `u`, `v` learned
//! per-head vectors ([`r_w_bias`](TransformerXlAttention::r_w_bias),
//! [`r_r_bias`](TransformerXlAttention::r_r_bias)). The paper trains a causal language model:
//! there a query sees the memory and its segment up to itself. Without causal masking (the
//! encoder tasks) a query sees the memory and its whole segment, never a later segment.
//!
//! The memory of each layer is its own input over the previous positions: with the whole
//! sequence at hand, a layer computes every segment at once (each segment's memory is the
//! gradient-stopped keys and values of the positions before it), which is what running the
//! segments one after another through the whole stack gives, since a layer's input at a segment
//! never depends on that layer's later segments. Cost per head: O(n (s + m) d) time and
//! O(n (s + m)) memory for segments of s and memory m.
//!
//! Masks: padding, causal; decoding token by token over a cache of keys, each step scoring its
//! memory and its segment so far; the cache keeps only what a later token can see (fewer than
//! `mem_len + 2 s` keys a sequence), so a step's cost and the state stay flat with the position.
//! No cross-attention (positions relate queries and keys), no
//! attention mask, no weights. The per-head form ([`attend`](AttentionModule::attend)) stops the
//! memory's gradient at the per-head keys and values it is given, so the key and value
//! projections learn from the own segment only there; the forward pass stops it at the layer's
//! input, as the paper.

use crate::variants::prelude::*;
use burn::module::Param;
use burn::nn::{Dropout, DropoutConfig, Linear};

use crate::contract::SegmentMemory;
use crate::contract::input::MASK_FILL;
use crate::engines::heads::split_heads;
use crate::engines::segments::{
    RelativeScore, SegmentLayout, relative_score_params, segment_attention,
};
use crate::kernels;

use crate::engines::gathered_softmax::{
    cache_positions, flags_tensor, padding_flags, suffix_lengths, trimmed_cache,
};

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "transformer-xl",
    paper: "Dai et al. 2019, arXiv 1901.02860",
    time: "O(n (s + m) d)",
    memory: "O(n (s + m))",
    capabilities: Capabilities {
        causal: true,
        weights_sum_to_one: true,
        per_head_form: true,
        prefill_end_padding_only: true,
        ..Capabilities::PADDING_ONLY
    },
};

/// Configuration of [`TransformerXlAttention`].
#[derive(Config, Debug)]
pub struct TransformerXlConfig {
    /// Model width (even: the sinusoids come in sine and cosine pairs); split evenly across
    /// heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Positions per segment (the paper's enwik8 models: 512).
    #[config(default = 512)]
    pub segment_len: usize,
    /// Positions of memory before each segment (the paper's enwik8 training: 512).
    #[config(default = 512)]
    pub mem_len: usize,
    /// Dropout on the attention weights (default 0: none).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases on the Q, K, V and output projections (the paper has none).
    #[config(default = false)]
    pub bias: bool,
}

impl VariantConfig for TransformerXlConfig {
    variant_glue!(
        TransformerXlAttention,
        &[INFO],
        new(d_model, n_heads),
        dropout
    );

    /// Segments of 8 with 6 positions of memory (less than a segment, so that the oldest memory
    /// positions are masked).
    fn small(self) -> Self {
        self.with_segment_len(8).with_mem_len(6)
    }

    /// The variant's input check, and a memory longer than the sequence refused where the
    /// sequence is cut into several segments: within one sequence a segment's memory never holds
    /// more than the positions before it, while the segments' layout is sized by `mem_len`.
    /// (One segment, `segment_len` at least the length, has no memory to lay out; recurrence
    /// over several calls, [`AttentionModule::forward_with_memory`], is not bound by one call's
    /// length and is not checked here.)
    fn check_input(&self, n_q: usize, n_k: usize, causal: bool) -> Result<(), AttentionError> {
        let longest = n_q.max(n_k);
        if self.segment_len < longest && self.mem_len > longest {
            return Err(INFO.field_error(
                "mem_len",
                format!(
                    "is {}, longer than the {longest} positions of the sequence it remembers \
                     (in segments of {})",
                    self.mem_len, self.segment_len
                ),
            ));
        }
        check_capabilities(&INFO, n_q, n_k, causal)
    }

    fn check_fields(&self) -> Result<(), AttentionError> {
        if !self.d_model.is_multiple_of(2) {
            return Err(INFO.field_error(
                "d_model",
                format!("must be even (sine and cosine pairs), got {}", self.d_model),
            ));
        }
        check_at_least_one(INFO.name, "segment_len", self.segment_len)?;
        if self.mem_len.checked_add(2 * self.segment_len).is_none() {
            return Err(INFO.field_error("mem_len", "is too large"));
        }
        Ok(())
    }

    fn build(&self, device: &Device) -> TransformerXlAttention {
        let (r_net, r_w_bias, r_r_bias) = relative_score_params(self.d_model, self.n_heads, device);
        TransformerXlAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            r_net,
            r_w_bias,
            r_r_bias,
            dropout: DropoutConfig::new(self.dropout).init(),
            segment_len: self.segment_len,
            mem_len: self.mem_len,
        }
    }
}

inherent_config_methods!(TransformerXlConfig);

/// Multi-head Transformer-XL attention. Create with [`TransformerXlConfig`].
#[derive(Module, Debug)]
pub struct TransformerXlAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
    /// `W_R`: the projection of the relative positions' sinusoids.
    pub r_net: Linear,
    /// `u`, `[heads, d_head]`: the content bias added to the queries against keys.
    pub r_w_bias: Param<Tensor<2>>,
    /// `v`, `[heads, d_head]`: the position bias added to the queries against positions.
    pub r_r_bias: Param<Tensor<2>>,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// Positions per segment.
    #[module(skip)]
    pub segment_len: usize,
    /// Positions of memory before each segment.
    #[module(skip)]
    pub mem_len: usize,
}

projection_shape!(TransformerXlAttention);

impl TransformerXlAttention {
    /// The relative score's parameters.
    fn score(&self) -> RelativeScore<'_> {
        RelativeScore {
            r_net: &self.r_net,
            r_w_bias: &self.r_w_bias,
            r_r_bias: &self.r_r_bias,
        }
    }

    /// The forward pass on per-head tensors: `q`, `k`, `v` `[batch, heads, n, d]`, `k_mem`,
    /// `v_mem` the same keys and values with the gradient stopped.
    fn segments(
        &self,
        own: (Tensor<4>, Tensor<4>, Tensor<4>),
        memory: (Tensor<4>, Tensor<4>),
        key_pad: &Option<Tensor<2, Bool>>,
        causal: bool,
    ) -> Tensor<4> {
        let [batch, _, n, _] = own.0.dims();
        let layout = SegmentLayout::new(n, self.segment_len, self.mem_len);
        let padding = key_pad.as_ref().map(|_| padding_flags(key_pad, batch, n));
        segment_attention(
            self.score(),
            layout,
            own,
            memory,
            None,
            padding.as_deref(),
            causal,
            &self.dropout,
        )
    }

    /// Per-head queries, keys and values of `x`, and the keys and values of its input with the
    /// gradient stopped (the memory's).
    #[allow(clippy::type_complexity)]
    fn projections(
        &self,
        x: Tensor<3>,
    ) -> ((Tensor<4>, Tensor<4>, Tensor<4>), (Tensor<4>, Tensor<4>)) {
        let heads = self.proj.n_heads;
        let stopped = x.clone().detach();
        let memory = (
            split_heads(self.proj.key.forward(stopped.clone()), heads),
            split_heads(self.proj.value.forward(stopped), heads),
        );
        (self.proj.qkv(x), memory)
    }

    /// The key/value cache less what no later token can see. Per sequence, its oldest positions
    /// are masked in whole segments (a multiple of `segment_len`, so that each kept position's
    /// place in its segment and its distance to later tokens stay what they were, and positions
    /// counted from the first kept one give the same scores), up to the memory the next token
    /// reads (the `mem_len` positions before its segment); leading columns no sequence keeps
    /// are dropped. A sequence then keeps fewer than `mem_len + 2 segment_len` positions.
    fn window(&self, cache: DecodingState) -> DecodingState {
        let DecodingState::KeyValueCache {
            keys,
            values,
            padding,
        } = cache
        else {
            return cache;
        };
        let [batch, _, columns, _] = keys.dims();
        let s = self.segment_len;
        let mut unseen = padding_flags(&padding, batch, columns);
        let mut masked_any = false;
        for row in &mut unseen {
            let kept: Vec<usize> = (0..columns).filter(|&j| !row[j]).collect();
            // The next token's position, counted from the first kept one, and where the
            // memory it reads starts.
            let next = kept.len();
            let memory_start = (next / s * s).saturating_sub(self.mem_len);
            for &j in &kept[..memory_start / s * s] {
                row[j] = true;
                masked_any = true;
            }
        }
        if !masked_any {
            return DecodingState::KeyValueCache {
                keys,
                values,
                padding,
            };
        }
        trimmed_cache(keys, values, unseen)
    }

    /// A step over the cache (`padding` marking positions a sequence does not see: shorter
    /// prompts' padding and the positions `window` dropped):
    /// each sequence's token at position t scores the memory before its segment and its segment
    /// up to itself.
    fn decode_step(
        &self,
        q: Tensor<4>,
        keys: Tensor<4>,
        values: Tensor<4>,
        padding: &Option<Tensor<2, Bool>>,
    ) -> Tensor<4> {
        let [batch, _, columns, _] = keys.dims();
        let device = q.device();
        let positions = cache_positions(&padding_flags(padding, batch, columns));
        let s = self.segment_len;
        let span = self.mem_len + s;
        let mut hidden = Vec::with_capacity(batch * columns);
        let mut index = Vec::with_capacity(batch * columns);
        for row in &positions {
            let t = row.last().copied().flatten().unwrap_or(0);
            let start = (t / s * s).saturating_sub(self.mem_len);
            for p in row {
                match p {
                    Some(p) if *p >= start => {
                        hidden.push(false);
                        index.push((t - p) as i64);
                    }
                    _ => {
                        hidden.push(true);
                        index.push(0);
                    }
                }
            }
        }
        let heads = q.dims()[1];
        let content = self
            .score()
            .content_queries(q.clone())
            .matmul(keys.swap_dims(2, 3));
        let index =
            Tensor::<4, Int>::from_data(TensorData::new(index, [batch, 1, 1, columns]), &device)
                .expand([batch, heads, 1, columns]);
        let position = self
            .score()
            .position_scores_by_query(q, 0, span)
            .gather(3, index);
        let hidden = flags_tensor(
            &hidden
                .chunks(columns)
                .map(<[bool]>::to_vec)
                .collect::<Vec<_>>(),
            &device,
        );
        let scores =
            (content + position).mask_fill(hidden.reshape([batch, 1, 1, columns]), MASK_FILL);
        kernels::softmax(scores).matmul(values)
    }
}

impl AttentionModule for TransformerXlAttention {
    variant_facts!(INFO);

    rotary_refused!("it scores relative positions itself (Transformer-XL's relative terms)");

    fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        input.check_shapes(self.name(), self.d_model())?;
        let masks = input.head_masks();
        let n = input.key_len();
        check_capabilities(&INFO, input.query_len(), n, masks.causal)?;
        let (own, memory) = self.projections(input.query().clone());
        check_attention_mask(&INFO, &masks, &own.0, n)?;
        let o = self.segments(own, memory, &masks.key_pad, masks.causal);
        Ok(self.proj.out(o))
    }

    /// The call's positions after the memory's: the memory's states and the call's input in
    /// one pass (zero positions, masked, in front so that the call starts on a segment
    /// boundary), the memory's positions' outputs dropped; the next memory is the last
    /// `mem_len` positions of the memory and the call.
    fn forward_with_memory(
        &self,
        input: AttentionInput,
        memory: Option<SegmentMemory>,
    ) -> Result<(Tensor<3>, SegmentMemory), AttentionError> {
        input.check_shapes(self.name(), self.d_model())?;
        let masks = input.head_masks();
        let n = input.key_len();
        check_capabilities(&INFO, input.query_len(), n, masks.causal)?;
        refuse_attention_mask(&INFO, &masks)?;
        if self.mem_len == 0 {
            return Err(INFO.field_error("mem_len", "is 0: there is no memory to carry"));
        }
        let x = input.query().clone();
        let [batch, _, d_model] = x.dims();
        let device = x.device();
        let flags = |pad: Option<Tensor<2, Bool>>, len: usize| {
            pad.unwrap_or_else(|| Tensor::<2, Bool>::full([batch, len], false, &device))
        };
        // The memory's states and padding, if any (Burn has no empty tensors on every backend).
        let memory = memory.map(|memory| {
            let m = memory.states.dims()[1];
            (memory.states.detach(), flags(memory.padding, m))
        });
        let m = memory.as_ref().map_or(0, |(states, _)| states.dims()[1]);
        let front = (self.segment_len - m % self.segment_len) % self.segment_len;
        let x_pad = flags(masks.key_pad, n);
        let mut parts = Vec::new();
        if front > 0 {
            parts.push((
                Tensor::zeros([batch, front, d_model], &device),
                Tensor::<2, Bool>::full([batch, front], true, &device),
            ));
        }
        parts.extend(memory.clone());
        parts.push((x.clone(), x_pad.clone()));
        let (all, all_pad): (Vec<_>, Vec<_>) = parts.into_iter().unzip();
        let (own, memory_kv) = self.projections(Tensor::cat(all, 1));
        let o = self.segments(own, memory_kv, &Some(Tensor::cat(all_pad, 1)), masks.causal);
        let o = o.slice(s![.., .., front + m..]);
        // The next memory: the last mem_len positions of the memory and this call.
        let (kept, kept_pad): (Vec<_>, Vec<_>) =
            memory.into_iter().chain([(x.detach(), x_pad)]).unzip();
        let (kept, kept_pad) = (Tensor::cat(kept, 1), Tensor::cat(kept_pad, 1));
        let from = kept.dims()[1].saturating_sub(self.mem_len);
        let next = SegmentMemory {
            states: kept.slice(s![.., from..]),
            padding: Some(kept_pad.slice(s![.., from..])),
        };
        Ok((self.proj.out(o), next))
    }

    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        let (n, n_k) = (q.dims()[2], k.dims()[2]);
        check_capabilities(&INFO, n, n_k, masks.causal)?;
        check_attention_mask(&INFO, &masks, &q, n_k)?;
        let memory = (k.clone().detach(), v.clone().detach());
        Ok(self.segments((q, k, v), memory, &masks.key_pad, masks.causal))
    }

    /// The causal forward pass; the cache keeps the keys and values a later token can see (the
    /// memory before its segment and the segment so far, dropped in whole segments).
    fn prefill(&self, x: Tensor<3>) -> DecodeResult {
        check_prompt_shapes(self.name(), self.d_model(), &x, None)?;
        let (y, cache) = self
            .proj
            .prefill_full_cache(x, None, |q, k, v, masks| self.attend(q, k, v, masks))?;
        Ok((y, self.window(cache)))
    }

    /// Prompts padded at their end: the causal forward pass; the cache keeps what a later token
    /// of each sequence can see, with the padding marked, each sequence's positions read from it.
    fn prefill_padded(&self, x: Tensor<3>, mask_pad: Tensor<2, Bool>) -> DecodeResult {
        check_prompt_shapes(self.name(), self.d_model(), &x, Some(&mask_pad))?;
        suffix_lengths(INFO.name, &mask_pad)?;
        let (y, cache) = self
            .proj
            .prefill_full_cache(x, Some(mask_pad), |q, k, v, masks| {
                self.attend(q, k, v, masks)
            })?;
        Ok((y, self.window(cache)))
    }

    /// Appends the token's key and value to the cache and scores the `mem_len` positions
    /// before its segment and its segment so far, then keeps what a later token can see: a step
    /// costs O((m + s) d) and the cache at most `mem_len + 2 segment_len` positions a sequence,
    /// wherever the position.
    fn decode(&self, x: Tensor<3>, state: DecodingState) -> DecodeResult {
        check_token(self.name(), self.d_model(), &x)?;
        let (q, k, v) = self.proj.qkv(x);
        let (keys, values, padding) = state.append_to_padded_cache(INFO.name, k, v)?;
        let o = self.decode_step(q, keys.clone(), values.clone(), &padding);
        let cache = DecodingState::KeyValueCache {
            keys,
            values,
            padding,
        };
        Ok((self.proj.out(o), self.window(cache)))
    }
}
