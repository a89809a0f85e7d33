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
use crate::contract::input::{MASK_FILL, flags_framed, zeros_after};
use crate::engines::heads::split_heads;
use crate::engines::segments::{
    RelativeScore, SegmentLayout, SegmentPrefix, relative_score_params, segment_attention,
};
use crate::kernels;

use crate::engines::gathered_softmax::{flags_tensor, suffix_lengths};

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

/// The rows of `index` (`None`: row 0, to be masked).
fn rows_of(index: &[Option<usize>]) -> Vec<usize> {
    index.iter().map(|j| j.unwrap_or(0)).collect()
}

/// Rows `index` (`None`: row 0, to be masked) of `x` along `dim`.
fn pick<const D: usize>(x: Tensor<D>, dim: usize, index: &[Option<usize>]) -> Tensor<D> {
    kernels::select_rows(x, dim, &rows_of(index))
}

/// Columns `index` (`None`: column 0, to be masked) of the flags `[batch, m]` (selected as
/// integers: `flex` 0.22.1 selects booleans into a tensor its boolean operations refuse).
fn pick_flags(flags: Tensor<2, Bool>, index: &[Option<usize>]) -> Tensor<2, Bool> {
    let rows: Vec<i64> = rows_of(index).into_iter().map(|r| r as i64).collect();
    let rows = Tensor::<1, Int>::from_data(TensorData::new(rows, [index.len()]), &flags.device());
    flags.int().select(1, rows).equal_elem(1)
}

/// Which entries of `index` are `None`, for every sequence of the batch: `[batch, len]`.
fn unfilled(index: &[Option<usize>], batch: usize, device: &Device) -> Tensor<2, Bool> {
    let flags: Vec<bool> = index.iter().map(Option::is_none).collect();
    flags_tensor(&[flags], device).expand([batch, index.len()])
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

    /// Whether each of the first `blocks` whole blocks is wholly padding: `[batch, blocks]`.
    fn block_padding(&self, pad: &Tensor<2, Bool>, blocks: usize) -> Tensor<2, Bool> {
        let [batch, _] = pad.dims();
        let c = self.compression;
        pad.clone()
            .slice(s![.., 0..blocks * c])
            .reshape([batch, blocks, c])
            .all_dim(2)
            .reshape([batch, blocks])
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
        let device = x.device();
        let layout = SegmentLayout::new(n, self.segment_len, self.mem_len);
        let slots = Slots::new(&layout, n, self.mem_len, self.cmem_len, self.compression);
        let pad = key_pad
            .clone()
            .unwrap_or_else(|| Tensor::<2, Bool>::full([batch, n], false, &device));
        // The states the memories hold: the layer's input, gradient stopped, padding zeroed.
        let states = x
            .clone()
            .detach()
            .mask_fill(pad.clone().unsqueeze_dim(2), 0.0);
        let memory = (
            split_heads(self.proj.key.forward(states.clone()), heads),
            split_heads(self.proj.value.forward(states.clone()), heads),
        );
        let with_loss = with_loss && self.reconstruction > 0.0;
        let compressed = (slots.blocks > 0 && (slots.width > 0 || with_loss))
            .then(|| self.compressed(states.clone(), slots.blocks));
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
                let missing = pick_flags(self.block_padding(&pad, slots.blocks), &seen)
                    .bool_or(unfilled(&seen, batch, &device));
                SegmentPrefix {
                    keys: per_slot(&self.proj.key),
                    values: per_slot(&self.proj.value),
                    missing: missing.reshape([batch, layout.blocks, slots.width]),
                }
            });
        let loss = compressed
            .filter(|_| with_loss)
            .and_then(|compressed| self.reconstruction_loss(&x, &pad, &layout, &slots, compressed));
        let o = segment_attention(
            self.score(),
            layout,
            self.proj.qkv(x),
            memory,
            prefix,
            key_pad,
            causal,
            &self.dropout,
        );
        (o, loss)
    }

    /// The attention-reconstruction loss: each segment's queries over the blocks it evicts,
    /// uncompressed against compressed (content only, projections frozen); the mean squared
    /// difference over the heads' outputs at the real queries of segments that evict a block
    /// with a real position, times the weight. `None` where no segment evicts a block.
    fn reconstruction_loss(
        &self,
        x: &Tensor<3>,
        pad: &Tensor<2, Bool>,
        layout: &SegmentLayout,
        slots: &Slots,
        compressed: Tensor<3>,
    ) -> Option<Tensor<1>> {
        let c = self.compression;
        let (width, evicted) = slots.evicted(self.segment_len, self.mem_len, c);
        if width == 0 {
            return None;
        }
        let [batch, n, _] = x.dims();
        let heads = self.proj.n_heads;
        let device = x.device();
        let (nb, s) = (layout.blocks, layout.s);
        let np = nb * s;
        let states = x.clone().detach();
        let per_head = |layer: &Linear, x: Tensor<3>| split_heads(frozen(layer, x), heads);
        let d = self.proj.d_model() / heads;
        // Queries per segment, `[batch, heads, nb, s, d]`.
        let q = zeros_after(per_head(&self.proj.query, states.clone()), 2, np - n)
            .reshape([batch, heads, nb, s, d])
            .mul_scalar(1.0 / (d as f32).sqrt());
        // The evicted positions, uncompressed: `[batch, heads, nb, width · c, d]`.
        let positions: Vec<Option<usize>> = evicted
            .iter()
            .flat_map(|j| (0..c).map(move |r| j.map(|j| j * c + r)))
            .collect();
        let raw = |layer: &Linear| {
            pick(per_head(layer, states.clone()), 2, &positions).reshape([
                batch,
                heads,
                nb,
                width * c,
                d,
            ])
        };
        let raw_missing =
            pick_flags(pad.clone(), &positions).bool_or(unfilled(&positions, batch, &device));
        // The same blocks compressed: `[batch, heads, nb, width, d]`.
        let packed = |layer: &Linear| {
            pick(per_head(layer, compressed.clone()), 2, &evicted)
                .reshape([batch, heads, nb, width, d])
        };
        let packed_missing = pick_flags(self.block_padding(pad, slots.blocks), &evicted)
            .bool_or(unfilled(&evicted, batch, &device));
        let attend = |keys: Tensor<5>, values: Tensor<5>, missing: Tensor<2, Bool>| {
            let keys_per = keys.dims()[3];
            let scores = q
                .clone()
                .matmul(keys.swap_dims(3, 4))
                .mask_fill(missing.reshape([batch, 1, nb, 1, keys_per]), MASK_FILL);
            kernels::softmax(scores).matmul(values)
        };
        let uncompressed = attend(
            raw(&self.proj.key),
            raw(&self.proj.value),
            raw_missing.clone(),
        );
        let reconstructed = attend(
            packed(&self.proj.key),
            packed(&self.proj.value),
            packed_missing,
        );
        // Real queries of segments that evict a real position.
        let evicts = raw_missing
            .reshape([batch, nb, width * c])
            .all_dim(2)
            .bool_not();
        let real = flags_framed(pad.clone(), 0, np - n)
            .reshape([batch, nb, s])
            .bool_not()
            .bool_and(evicts.reshape([batch, nb, 1]).expand([batch, nb, s]));
        let weight = real.float().reshape([batch, 1, nb, s, 1]);
        let count = weight.clone().sum().mul_scalar((heads * d) as f32);
        let squared = (uncompressed - reconstructed).powi_scalar(2) * weight;
        Some(
            squared
                .sum()
                .div(count.clamp_min(1.0))
                .mul_scalar(self.reconstruction as f32),
        )
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

    fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        self.try_forward_with_loss(input).map(|(y, _)| y)
    }

    /// The output and the attention-reconstruction loss (the only loss that trains the
    /// compression), weighted by [`reconstruction`](Self::reconstruction).
    fn try_forward_with_loss(
        &self,
        input: AttentionInput,
    ) -> Result<(Tensor<3>, Option<Tensor<1>>), AttentionError> {
        let masks = input.head_masks();
        let n = input.key_len();
        check_capabilities(&INFO, input.query_len(), n, masks.causal)?;
        if masks.attn.is_some() {
            return Err(AttentionError::unsupported(
                INFO.name,
                "an arbitrary attention mask (`mask_attn`)",
            ));
        }
        let (o, loss) = self.attention(input.query().clone(), &masks.key_pad, masks.causal, true);
        Ok((self.proj.out(o), loss))
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
        let y = self.try_forward(AttentionInput::new(x.clone()).causal(true))?;
        let [batch, t, _] = x.dims();
        let memories = self.memories_after(&x, &vec![t; batch]);
        Ok((y, DecodingState::Compressive(memories)))
    }

    /// Prompts padded at their end: the causal forward pass with the padding masked; each
    /// sequence's memory is made from its own positions.
    fn prefill_padded(&self, x: Tensor<3>, mask_pad: Tensor<2, Bool>) -> DecodeResult {
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
