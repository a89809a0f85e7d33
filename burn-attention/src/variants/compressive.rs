//! Compressive Transformer attention: Transformer-XL whose oldest memories are compressed into a
//! second memory instead of being dropped.
//!
//! Rae et al. 2020, "Compressive Transformers for Long-Range Sequence Modelling", arXiv
//! 1911.05507. A segment of `segment_len` positions attends, with Transformer-XL's relative
//! score, to its compressed memory, its memory (the `mem_len` positions before it, gradient
//! stopped) and itself, one softmax. The memories that leave the memory are compressed at rate
//! `c` by the compression function `f_c`, here the paper's 1-D convolution with kernel and
//! stride `c` (3, its enwik8 rate) over the layer's input states; the newest `cmem_len` of them
//! form the compressed memory, attended after the key and value projections as any memory.
//!
//! With the whole sequence at hand every segment is computed at once, as
//! [`transformer-xl`](super::transformer_xl) does: the compressed slots are the blocks
//! `[j c, (j + 1) c)` of the sequence's positions (counted from its first), and segment `τ` sees
//! the newest `cmem_len` of those that end at or before its memory's start
//! `a_τ = max(0, τ s − mem_len)`. This is the paper's first-in-first-out recurrence where `s` and
//! `mem_len` are multiples of `c` (the defaults); otherwise the fewer than `c` positions between
//! the last whole block and `a_τ` are in neither memory. Relative distances run over the keys as
//! a segment sees them: the memory and the segment by position, the compressed slots one place
//! each before the memory's `mem_len` positions.
//!
//! Training: the paper trains `f_c` with the attention-reconstruction loss alone, never with the
//! task's loss (the compressed memory reaches later segments with the gradient stopped, as the
//! memory does). [`try_forward_with_loss`](AttentionModule::try_forward_with_loss) returns it,
//! weighted by [`reconstruction`](CompressiveConfig::reconstruction): for each segment, its
//! queries attend (content only, `softmax(q kᵀ/√d) v`, the layer's projections with the gradient
//! stopped) to the memories that leave the memory after it, once uncompressed and once
//! compressed; the loss is the mean squared difference of the two, over the heads' outputs of
//! the segments that evict something. Without that loss `f_c` keeps its initial weights.
//!
//! Masks: padding (padded states are zeroed before the compression and a slot wholly of padding
//! is masked), causal (the paper's language model). Decoding keeps, per sequence, the paper's
//! recurrent state ([`DecodingState::Compressive`]): the compressed memory (`f_c` of the newest
//! `cmem_len` blocks) and the layer's inputs over the positions later tokens read or compress
//! (at most `c − 1 + mem_len + s`); a step compresses the blocks that leave the memory and
//! attends one query to at most `cmem_len + mem_len + s` keys, whatever the position. No
//! cross-attention, attention mask, weights, per-head form (the compression mixes the heads'
//! channels) or memory across calls.

use crate::variants::prelude::*;
use burn::module::Param;
use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig};

use crate::contract::CompressiveMemory;
use crate::engines::heads::split_heads;
use crate::engines::segments::{
    RelativeScore, SegmentLayout, SegmentPrefix, relative_score_params, segment_attention,
};
use crate::kernels;

use crate::engines::gathered_softmax::{gathered_attention, padding_flags, suffix_lengths};
use crate::kernels::key_slots::KeySlots;

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "compressive",
    paper: "Rae et al. 2020, arXiv 1911.05507",
    time: "O(n (s + m + m_c) d)",
    memory: "O(n (s + m + m_c))",
    capabilities: Capabilities {
        causal: true,
        prefill_end_padding_only: true,
        ..Capabilities::PADDING_ONLY
    },
};

/// Configuration of [`CompressiveAttention`].
#[derive(Config, Debug)]
pub struct CompressiveConfig {
    /// Model width (even: the sinusoids come in sine and cosine pairs); split evenly across
    /// heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Positions per segment (512, as `transformer-xl`'s default).
    #[config(default = 512)]
    pub segment_len: usize,
    /// Positions of uncompressed memory before each segment (512).
    #[config(default = 512)]
    pub mem_len: usize,
    /// Compressed slots before the memory (512).
    #[config(default = 512)]
    pub cmem_len: usize,
    /// The compression rate `c`: positions per compressed slot, the convolution's kernel and
    /// stride (the paper's enwik8 models: 3).
    #[config(default = 3)]
    pub compression: usize,
    /// Weight of the attention-reconstruction loss in
    /// [`try_forward_with_loss`](AttentionModule::try_forward_with_loss) (1; 0 returns none,
    /// and the compression then keeps its initial weights).
    #[config(default = 1.0)]
    pub reconstruction: f64,
    /// Dropout on the attention weights (default 0: none).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases on the Q, K, V and output projections (the paper has none).
    #[config(default = false)]
    pub bias: bool,
}

/// The least common multiple, `None` on overflow.
fn lcm(a: usize, b: usize) -> Option<usize> {
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    (a / gcd(a, b)).checked_mul(b)
}

impl VariantConfig for CompressiveConfig {
    variant_glue!(
        CompressiveAttention,
        &[INFO],
        new(d_model, n_heads),
        dropout
    );

    /// Segments of 4, 2 positions of memory, slots of 2 positions, 3 of them: a sequence of 7
    /// already compresses a block, longer ones fill the compressed memory.
    fn small(self) -> Self {
        self.with_segment_len(4)
            .with_mem_len(2)
            .with_compression(2)
            .with_cmem_len(3)
    }

    fn check_fields(&self) -> Result<(), AttentionError> {
        let field = |name, message: String| Err(INFO.field_error(name, message));
        if !self.d_model.is_multiple_of(2) {
            return field(
                "d_model",
                format!("must be even (sine and cosine pairs), got {}", self.d_model),
            );
        }
        check_at_least_one(INFO.name, "segment_len", self.segment_len)?;
        check_at_least_one(INFO.name, "compression", self.compression)?;
        if !(self.reconstruction.is_finite() && self.reconstruction >= 0.0) {
            return field(
                "reconstruction",
                format!("must be finite and >= 0, got {}", self.reconstruction),
            );
        }
        let span = self
            .cmem_len
            .checked_mul(self.compression)
            .and_then(|c| c.checked_add(self.mem_len))
            .and_then(|m| m.checked_add(2 * self.segment_len))
            .and_then(|m| m.checked_add(lcm(self.segment_len, self.compression)?));
        if span.is_none() || self.d_model.checked_mul(self.compression).is_none() {
            return field(
                "cmem_len",
                "with compression, mem_len and segment_len is too large".into(),
            );
        }
        Ok(())
    }

    fn build(&self, device: &Device) -> CompressiveAttention {
        let (r_net, r_w_bias, r_r_bias) = relative_score_params(self.d_model, self.n_heads, device);
        CompressiveAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            r_net,
            r_w_bias,
            r_r_bias,
            // A convolution's default initialisation: uniform over ±1/√fan_in,
            // fan_in = c · d_model.
            compress: LinearConfig::new(self.compression * self.d_model, self.d_model).init(device),
            dropout: DropoutConfig::new(self.dropout).init(),
            segment_len: self.segment_len,
            mem_len: self.mem_len,
            cmem_len: self.cmem_len,
            compression: self.compression,
            reconstruction: self.reconstruction,
        }
    }
}

inherent_config_methods!(CompressiveConfig);

/// Multi-head Compressive Transformer attention. Create with [`CompressiveConfig`].
#[derive(Module, Debug)]
pub struct CompressiveAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
    /// `W_R`: the projection of the relative positions' sinusoids.
    pub r_net: Linear,
    /// `u`, `[heads, d_head]`: the content bias added to the queries against keys.
    pub r_w_bias: Param<Tensor<2>>,
    /// `v`, `[heads, d_head]`: the position bias added to the queries against positions.
    pub r_r_bias: Param<Tensor<2>>,
    /// `f_c`, the strided convolution, as the linear map `c · d_model -> d_model` of a block's
    /// states position after position.
    pub compress: Linear,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// Positions per segment.
    #[module(skip)]
    pub segment_len: usize,
    /// Positions of uncompressed memory before each segment.
    #[module(skip)]
    pub mem_len: usize,
    /// Compressed slots before the memory.
    #[module(skip)]
    pub cmem_len: usize,
    /// Positions per compressed slot.
    #[module(skip)]
    pub compression: usize,
    /// Weight of the attention-reconstruction loss.
    #[module(skip)]
    pub reconstruction: f64,
}

projection_shape!(CompressiveAttention);

/// Which compressed blocks each segment of a layout sees, and which it evicts.
#[derive(Debug)]
struct Slots {
    /// Blocks of `c` whole positions in the sequence.
    blocks: usize,
    /// Per segment, the first block not yet compressed when it runs: `hi_τ = a_τ / c`.
    hi: Vec<usize>,
    /// The compressed slots a segment sees, at most.
    width: usize,
}

impl Slots {
    fn new(layout: &SegmentLayout, n: usize, mem_len: usize, cmem_len: usize, c: usize) -> Self {
        let hi: Vec<usize> = (0..layout.blocks)
            .map(|tau| (tau * layout.s).saturating_sub(mem_len) / c)
            .collect();
        let width = hi.iter().map(|&h| h.min(cmem_len)).max().unwrap_or(0);
        Self {
            blocks: n / c,
            hi,
            width,
        }
    }

    /// Per segment, the `width` slots it sees, oldest first: the block, or `None` for a slot
    /// before the sequence's first block (`width` is at most `cmem_len`, so no slot reaches
    /// further back than the compressed memory).
    fn seen(&self) -> Vec<Option<usize>> {
        self.hi
            .iter()
            .flat_map(|&hi| (0..self.width).map(move |k| (hi + k).checked_sub(self.width)))
            .collect()
    }

    /// Per segment, the blocks that leave its memory after it (compressed for the next
    /// segment onwards): `[hi_τ, hi_{τ+1})`, the last segment's reaching as far as the
    /// sequence's whole blocks and `a` after it allow; `None` past them. With `width` the most
    /// any segment evicts.
    fn evicted(&self, s: usize, mem_len: usize, c: usize) -> (usize, Vec<Option<usize>>) {
        let next = |tau: usize| {
            self.hi
                .get(tau + 1)
                .copied()
                .unwrap_or_else(|| (((tau + 1) * s).saturating_sub(mem_len) / c).min(self.blocks))
        };
        let width = (0..self.hi.len())
            .map(|tau| next(tau).saturating_sub(self.hi[tau]))
            .max()
            .unwrap_or(0);
        let blocks = (0..self.hi.len())
            .flat_map(|tau| {
                let (from, to) = (self.hi[tau], next(tau));
                (0..width).map(move |k| Some(from + k).filter(|&j| j < to))
            })
            .collect();
        (width, blocks)
    }
}

/// `x @ W + b` with the layer's parameters' gradient stopped.
fn frozen(layer: &Linear, x: Tensor<3>) -> Tensor<3> {
    let y = x.matmul(layer.weight.val().detach().unsqueeze_dim(0));
    match &layer.bias {
        Some(bias) => y + bias.val().detach().unsqueeze_dim::<2>(0).unsqueeze_dim(0),
        None => y,
    }
}

/// Rows `index` (`None`: row 0, to be masked) of `x` along `dim`.
fn pick<const D: usize>(x: Tensor<D>, dim: usize, index: &[Option<usize>]) -> Tensor<D> {
    let rows: Vec<usize> = index.iter().map(|j| j.unwrap_or(0)).collect();
    kernels::select_rows(x, dim, &rows)
}

/// Whether block `j` (positions `[j c, (j + 1) c)`) of a sequence with padding flags `pad` is
/// wholly padding.
fn block_is_padding(pad: &[bool], j: usize, c: usize) -> bool {
    pad[j * c..(j + 1) * c].iter().all(|&p| p)
}

/// The attention-reconstruction loss's patterns, built on the host from the padding flags:
/// which evicted positions each segment's queries score uncompressed, which compressed blocks
/// they score instead, and the weight of each query (1 at a real query of a segment that evicts
/// a real position, 0 elsewhere).
struct ReconstructionPattern {
    uncompressed: KeySlots,
    compressed: KeySlots,
    /// `[batch, n]` flattened.
    weight: Vec<f32>,
    /// Queries of weight 1.
    counted: usize,
}

impl ReconstructionPattern {
    /// Segments of `s` queries; `evicted` holds, per segment, the `width` blocks of `c`
    /// positions it evicts (`None` past them); `padding[b][i]`, `true` = padding. One group of
    /// slots per sequence when any position is padding, one shared group otherwise.
    fn new(
        padding: &[Vec<bool>],
        s: usize,
        c: usize,
        (width, evicted): (usize, &[Option<usize>]),
    ) -> Self {
        let n = padding.first().map_or(0, Vec::len);
        let nb = evicted.len() / width.max(1);
        let groups = if padding.iter().flatten().any(|&p| p) {
            padding.len()
        } else {
            1
        };
        let mut uncompressed = KeySlots::masked([groups, 1], nb, s, width * c);
        let mut compressed = KeySlots::masked([groups, 1], nb, s, width);
        let mut weight = vec![0.0; padding.len() * n];
        let mut counted = 0;
        for (b, pad) in padding.iter().enumerate() {
            for tau in 0..nb {
                let blocks = &evicted[tau * width..(tau + 1) * width];
                let mut evicts_real = false;
                for (k, j) in blocks.iter().enumerate() {
                    let Some(j) = *j else { continue };
                    if block_is_padding(pad, j, c) {
                        continue;
                    }
                    evicts_real = true;
                    if b < groups {
                        compressed.set(b, tau, k, j, |_| true);
                        for r in (0..c).filter(|&r| !pad[j * c + r]) {
                            uncompressed.set(b, tau, k * c + r, j * c + r, |_| true);
                        }
                    }
                }
                if evicts_real {
                    for i in (tau * s..((tau + 1) * s).min(n)).filter(|&i| !pad[i]) {
                        weight[b * n + i] = 1.0;
                        counted += 1;
                    }
                }
            }
        }
        Self {
            uncompressed,
            compressed,
            weight,
            counted,
        }
    }
}

impl CompressiveAttention {
    /// The relative score's parameters.
    fn score(&self) -> RelativeScore<'_> {
        RelativeScore {
            r_net: &self.r_net,
            r_w_bias: &self.r_w_bias,
            r_r_bias: &self.r_r_bias,
        }
    }

    /// `f_c` over the first `blocks` whole blocks of `states` (`[batch, n, d_model]`, padding
    /// zeroed): `[batch, blocks, d_model]`.
    fn compressed(&self, states: Tensor<3>, blocks: usize) -> Tensor<3> {
        let [batch, _, d_model] = states.dims();
        let c = self.compression;
        self.compress
            .forward(
                states
                    .slice(s![.., 0..blocks * c])
                    .reshape([batch, blocks, c * d_model]),
            )
    }

    /// The output before the output projection, `[batch, heads, n, d]`, and the
    /// attention-reconstruction loss when `with_loss` (`None` where no segment evicts a whole
    /// block, or its weight is 0).
    fn attention(
        &self,
        x: Tensor<3>,
        key_pad: &Option<Tensor<2, Bool>>,
        causal: bool,
        with_loss: bool,
    ) -> (Tensor<4>, Option<Tensor<1>>) {
        let [batch, n, _] = x.dims();
        let heads = self.proj.n_heads;
        let c = self.compression;
        let layout = SegmentLayout::new(n, self.segment_len, self.mem_len);
        let slots = Slots::new(&layout, n, self.mem_len, self.cmem_len, c);
        // The masks of the compressed slots and of the reconstruction loss are built on the
        // host, from the padding read once.
        let padding = padding_flags(key_pad, batch, n);
        // The states the memories hold: the layer's input, gradient stopped, padding zeroed.
        let states = match key_pad {
            Some(pad) => x
                .clone()
                .detach()
                .mask_fill(pad.clone().unsqueeze_dim(2), 0.0),
            None => x.clone().detach(),
        };
        let memory = (
            split_heads(self.proj.key.forward(states.clone()), heads),
            split_heads(self.proj.value.forward(states.clone()), heads),
        );
        let with_loss = with_loss && self.reconstruction > 0.0;
        let compressed = (slots.blocks > 0 && (slots.width > 0 || with_loss))
            .then(|| self.compressed(states, slots.blocks));
        let prefix = compressed
            .as_ref()
            .filter(|_| slots.width > 0)
            .map(|compressed| {
                let seen = slots.seen();
                let blocks = compressed.clone().detach();
                let per_slot = |layer: &Linear| {
                    let kv = pick(split_heads(layer.forward(blocks.clone()), heads), 2, &seen);
                    let d = kv.dims()[3];
                    kv.reshape([batch, heads, layout.blocks, slots.width, d])
                };
                // One group a sequence where there is padding, one shared otherwise.
                let groups = if key_pad.is_some() { batch } else { 1 };
                let missing: Vec<bool> = padding[..groups]
                    .iter()
                    .flat_map(|pad| {
                        seen.iter()
                            .map(move |j| j.is_none_or(|j| block_is_padding(pad, j, c)))
                    })
                    .collect();
                SegmentPrefix {
                    keys: per_slot(&self.proj.key),
                    values: per_slot(&self.proj.value),
                    missing,
                }
            });
        let (q, k, v) = self.proj.qkv(x);
        let loss = compressed.filter(|_| with_loss).and_then(|compressed| {
            let detached = (
                q.clone().detach(),
                memory.0.clone().detach(),
                memory.1.clone().detach(),
            );
            self.reconstruction_loss(detached, compressed, &padding, &layout, &slots)
        });
        let o = segment_attention(
            self.score(),
            layout,
            (q, k, v),
            memory,
            prefix,
            key_pad.as_ref().map(|_| padding.as_slice()),
            causal,
            &self.dropout,
        );
        (o, loss)
    }

    /// The attention-reconstruction loss: each segment's queries over the blocks it evicts,
    /// uncompressed against compressed (content only, projections frozen); the mean squared
    /// difference over the heads' outputs at the real queries of segments that evict a block
    /// with a real position, times the weight. `None` where no segment evicts a block.
    ///
    /// `q`, `k`, `v` are the layer's queries, keys and values (`[batch, heads, n, d]`, gradient
    /// stopped); both attentions run through
    /// [`gathered_attention`](crate::engines::gathered_softmax::gathered_attention) (a fused
    /// kernel on `flex`), so that the gradient reaches `f_c` through the compressed keys and
    /// values alone.
    fn reconstruction_loss(
        &self,
        (q, k, v): (Tensor<4>, Tensor<4>, Tensor<4>),
        compressed: Tensor<3>,
        padding: &[Vec<bool>],
        layout: &SegmentLayout,
        slots: &Slots,
    ) -> Option<Tensor<1>> {
        let c = self.compression;
        let (width, evicted) = slots.evicted(self.segment_len, self.mem_len, c);
        if width == 0 {
            return None;
        }
        let [batch, heads, n, d] = q.dims();
        let pattern = ReconstructionPattern::new(padding, layout.s, c, (width, &evicted));
        let scale = 1.0 / (d as f32).sqrt();
        let uncompressed = gathered_attention(q.clone(), k, v, pattern.uncompressed, scale, None);
        let per_head = |layer: &Linear| split_heads(frozen(layer, compressed.clone()), heads);
        let reconstructed = gathered_attention(
            q,
            per_head(&self.proj.key),
            per_head(&self.proj.value),
            pattern.compressed,
            scale,
            None,
        );
        let weight = Tensor::<4>::from_data(
            TensorData::new(pattern.weight, [batch, 1, n, 1]),
            &uncompressed.out.device(),
        );
        let count = (pattern.counted * heads * d).max(1);
        let squared = (uncompressed.out - reconstructed.out).powi_scalar(2) * weight;
        Some(
            squared
                .sum()
                .mul_scalar((self.reconstruction / count as f64) as f32),
        )
    }

    /// The forward pass after the input's checks, with the reconstruction loss when
    /// `with_loss`.
    fn checked_forward(
        &self,
        input: AttentionInput,
        with_loss: bool,
    ) -> Result<(Tensor<3>, Option<Tensor<1>>), AttentionError> {
        let masks = input.head_masks();
        let n = input.key_len();
        check_capabilities(&INFO, input.query_len(), n, masks.causal)?;
        refuse_attention_mask(&INFO, &masks)?;
        let (o, loss) = self.attention(
            input.query().clone(),
            &masks.key_pad,
            masks.causal,
            with_loss,
        );
        Ok((self.proj.out(o), loss))
    }

    /// Blocks compressed when the token at position `t` runs: those that end at or before its
    /// memory's start, `⌊max(0, τ s − mem_len) / c⌋` with `τ = ⌊t / s⌋`.
    fn blocks_before(&self, t: usize) -> usize {
        let s = self.segment_len;
        (t / s * s).saturating_sub(self.mem_len) / self.compression
    }

    /// The keys and values of the compressed blocks `from..to`, `f_c` of them projected, from
    /// `inputs` (`[len, d_model]`) whose first row is the position `first`: `[to − from,
    /// d_model]` each.
    fn compressed_slots(
        &self,
        inputs: &Tensor<2>,
        first: usize,
        (from, to): (usize, usize),
    ) -> [Tensor<2>; 2] {
        let c = self.compression;
        let d_model = inputs.dims()[1];
        let rows = inputs
            .clone()
            .slice(s![from * c - first..to * c - first])
            .reshape([to - from, c * d_model]);
        self.keys_and_values(
            self.compress
                .forward(rows.unsqueeze_dim::<3>(0))
                .reshape([to - from, d_model]),
        )
    }

    /// The layer's keys and values of `x` (`[len, d_model]`), `[len, d_model]` each.
    fn keys_and_values(&self, x: Tensor<2>) -> [Tensor<2>; 2] {
        [&self.proj.key, &self.proj.value].map(|layer| layer.forward(x.clone()))
    }

    /// One sequence's decoding memory after its inputs `x` (`[t, d_model]`, its real positions):
    /// as [`step`](Self::step) leaves it after the token at `t − 1`.
    fn memory_after(&self, x: Tensor<2>) -> CompressiveMemory {
        let t = x.dims()[0];
        if t == 0 {
            return CompressiveMemory::default();
        }
        let hi = self.blocks_before(t - 1);
        let from = hi.saturating_sub(self.cmem_len);
        let compressed = (hi > from).then(|| self.compressed_slots(&x, 0, (from, hi)));
        let kept = hi * self.compression;
        let recent = (kept < t).then(|| {
            let inputs = x.slice(s![kept..t]);
            let [keys, values] = self.keys_and_values(inputs.clone());
            [inputs, keys, values]
        });
        CompressiveMemory {
            seen: t,
            recent,
            compressed,
            compressed_end: hi,
        }
    }

    /// The token at position `memory.seen` of one sequence, `x: [1, d_model]`: its output
    /// (`[1, d_model]`) and the memory after it. The blocks that leave the memory are compressed
    /// (the newest `cmem_len` kept, as keys and values), the token attends to the compressed
    /// slots, the memory and its segment so far, and the positions no later token reads or
    /// compresses are dropped: at most `c − 1 + mem_len + s` positions and `cmem_len` slots are
    /// kept, whatever the position, and a step projects one input and at most the blocks that
    /// leave the memory.
    fn step(&self, x: Tensor<2>, memory: CompressiveMemory) -> (Tensor<2>, CompressiveMemory) {
        let t = memory.seen;
        let (s, c) = (self.segment_len, self.compression);
        let [k_x, v_x] = self.keys_and_values(x.clone());
        let own = [x.clone(), k_x, v_x];
        let first = t - memory.recent.as_ref().map_or(0, |r| r[0].dims()[0]);
        let recent = match memory.recent {
            Some(recent) => {
                let mut parts = own.into_iter();
                recent.map(|old| Tensor::cat(vec![old, parts.next().expect("three")], 0))
            }
            None => own,
        };
        let hi = self.blocks_before(t);
        let from = memory.compressed_end.max(hi.saturating_sub(self.cmem_len));
        let mut compressed = memory.compressed;
        if hi > from {
            let new = self.compressed_slots(&recent[0], first, (from, hi));
            compressed = Some(match compressed {
                Some(old) => {
                    let mut parts = new.into_iter();
                    old.map(|old| Tensor::cat(vec![old, parts.next().expect("two")], 0))
                }
                None => new,
            });
        }
        let compressed = compressed.and_then(|slots| {
            let m = slots[0].dims()[0];
            let keep = m.min(self.cmem_len);
            (keep > 0).then(|| slots.map(|x| x.slice(s![m - keep..m])))
        });
        let start = (t / s * s).saturating_sub(self.mem_len) - first;
        let read = [&recent[1], &recent[2]].map(|x| x.clone().slice(s![start..]));
        let y = self.attend_one(x, compressed.as_ref(), read, t - t / s * s);
        // Later tokens compress the blocks from `hi` on and read from their memories' starts,
        // which are at or after `hi c`.
        let kept = hi * c - first;
        let len = recent[0].dims()[0];
        let memory = CompressiveMemory {
            seen: t + 1,
            recent: (kept < len).then(|| recent.map(|x| x.slice(s![kept..len]))),
            compressed,
            compressed_end: hi,
        };
        (y, memory)
    }

    /// One query (`x: [1, d_model]`, at place `rho` of its segment) over the compressed slots'
    /// keys and values (`[p, d_model]` each, oldest first) and those of its memory and segment
    /// up to itself (`own`, `[len, d_model]` each, the query's own last), with the relative
    /// score of the forward pass: a slot `k`-th newest at distance `rho + mem_len + k`, a
    /// position at its distance. `[1, d_model]`.
    fn attend_one(
        &self,
        x: Tensor<2>,
        compressed: Option<&[Tensor<2>; 2]>,
        own: [Tensor<2>; 2],
        rho: usize,
    ) -> Tensor<2> {
        let heads = self.proj.n_heads;
        let d_model = x.dims()[1];
        let p = compressed.map_or(0, |slots| slots[0].dims()[0]);
        let len = own[0].dims()[0];
        let [k, v] = match compressed {
            Some(slots) => {
                let mut own = own.into_iter();
                slots
                    .clone()
                    .map(|slot| Tensor::cat(vec![slot, own.next().expect("two")], 0))
            }
            None => own,
        }
        .map(|x| split_heads(x.unsqueeze_dim::<3>(0), heads));
        let q = split_heads(self.proj.query.forward(x.unsqueeze_dim::<3>(0)), heads);
        let distances: Vec<i64> = (0..p)
            .map(|i| (rho + self.mem_len + (p - i)) as i64)
            .chain((0..len).map(|j| (len - 1 - j) as i64))
            .collect();
        let count = distances.iter().max().map_or(1, |&d| d as usize + 1);
        let score = self.score();
        let content = score.content_queries(q.clone()).matmul(k.swap_dims(2, 3));
        let position = kernels::gather_shared(
            score.position_scores_by_query(q, 0, count),
            &distances,
            p + len,
        );
        let o = kernels::softmax(content + position).matmul(v);
        self.proj.out(o).reshape([1, d_model])
    }

    /// The decoding memories of a batch after its prompts `x` (`[batch, t, d_model]`), each
    /// sequence's of its first `lengths[b]` positions.
    fn memories_after(&self, x: &Tensor<3>, lengths: &[usize]) -> Vec<CompressiveMemory> {
        let d_model = x.dims()[2];
        lengths
            .iter()
            .enumerate()
            .map(|(b, &len)| {
                let own = x
                    .clone()
                    .slice(s![b..b + 1, 0..len])
                    .reshape([len, d_model]);
                self.memory_after(own)
            })
            .collect()
    }
}

impl AttentionModule for CompressiveAttention {
    variant_facts!(INFO);

    rotary_refused!("it scores relative positions itself (Transformer-XL's relative terms)");

    /// The output alone: the reconstruction loss is not computed.
    fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        input.check_shapes(self.name(), self.d_model())?;
        self.checked_forward(input, false).map(|(y, _)| y)
    }

    /// The output and the attention-reconstruction loss (the only loss that trains the
    /// compression), weighted by [`reconstruction`](Self::reconstruction).
    fn try_forward_with_loss(
        &self,
        input: AttentionInput,
    ) -> Result<(Tensor<3>, Option<Tensor<1>>), AttentionError> {
        input.check_shapes(self.name(), self.d_model())?;
        self.checked_forward(input, true)
    }

    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        let _ = (k, v);
        check_attention_mask(&INFO, &masks, &q, q.dims()[2])?;
        Err(AttentionError::unsupported(
            INFO.name,
            "attention on per-head tensors (the compression mixes the heads' channels)",
        ))
    }

    /// The causal forward pass; the state keeps, per sequence, the inputs later tokens read or
    /// compress and the compressed memory ([`DecodingState::Compressive`]).
    fn prefill(&self, x: Tensor<3>) -> DecodeResult {
        check_prompt_shapes(self.name(), self.d_model(), &x, None)?;
        let y = self.try_forward(AttentionInput::new(x.clone()).causal(true))?;
        let [batch, t, _] = x.dims();
        let memories = self.memories_after(&x, &vec![t; batch]);
        Ok((y, DecodingState::Compressive(memories)))
    }

    /// Prompts padded at their end: the causal forward pass with the padding masked; each
    /// sequence's memory is made from its own positions.
    fn prefill_padded(&self, x: Tensor<3>, mask_pad: Tensor<2, Bool>) -> DecodeResult {
        check_prompt_shapes(self.name(), self.d_model(), &x, Some(&mask_pad))?;
        let lengths = suffix_lengths(INFO.name, &mask_pad)?;
        let y = self.try_forward(
            AttentionInput::new(x.clone())
                .mask_pad(mask_pad.clone())
                .causal(true),
        )?;
        let memories = self.memories_after(&x, &lengths);
        Ok((y, DecodingState::Compressive(memories)))
    }

    /// One token per sequence from its memory (the module docs' recurrent state): a bounded
    /// amount of work and state whatever the position.
    fn decode(&self, x: Tensor<3>, state: DecodingState) -> DecodeResult {
        check_token(self.name(), self.d_model(), &x)?;
        let [batch, _, d_model] = x.dims();
        let memories = match state {
            DecodingState::Empty => vec![CompressiveMemory::default(); batch],
            DecodingState::Compressive(memories) if memories.len() == batch => memories,
            DecodingState::Compressive(memories) => {
                return Err(AttentionError::unsupported(
                    INFO.name,
                    format!(
                        "a decoding state of {} sequences for a batch of {batch}",
                        memories.len()
                    ),
                ));
            }
            _ => {
                return Err(AttentionError::unsupported(
                    INFO.name,
                    "another variant's decoding state (it carries its inputs and compressed memory)",
                ));
            }
        };
        let (outputs, memories): (Vec<_>, Vec<_>) = memories
            .into_iter()
            .enumerate()
            .map(|(b, memory)| {
                let token = x.clone().slice(s![b..b + 1]).reshape([1, d_model]);
                let (y, memory) = self.step(token, memory);
                (y.reshape([1, 1, d_model]), memory)
            })
            .unzip();
        Ok((
            Tensor::cat(outputs, 0),
            DecodingState::Compressive(memories),
        ))
    }
}
