//! Reformer: LSH attention, each query scoring only the keys that hash near it.
//!
//! Kitaev, Kaiser & Levskaya 2020, "Reformer: The Efficient Transformer", arXiv 2001.04451.
//! Queries and keys share one projection (`k_j = q_j / ‖q_j‖`, so a query is most similar to
//! itself); per head and per hash round:
//! 1. angular LSH: position `j` goes to bucket `argmax([x_j R; −x_j R])` with `R` a random
//!    `d × n_buckets/2` Gaussian matrix of the round;
//! 2. positions are sorted by (bucket, position) and cut into chunks of `chunk_len`;
//! 3. each query scores the keys of its own chunk and of the previous one (the first chunk looks
//!    back to the last, cyclically);
//! 4. over the rounds, query `i` attends to the union `P_i` of the keys it met, each counted once,
//!    itself left out unless it has nothing else:
//!    `O_i = softmax_{j ∈ P_i}(q_i·k_j/√d) v_j`.
//!
//! Each round is one gathered attention over `chunk_len · 2` slots per query; the union's softmax
//! is the rounds' outputs merged by their log-sum-exp, a key met in `c` rounds scoring `− ln c`
//! lower in each of them (the paper's correction for duplicates).
//!
//! The rotations are drawn once, saved with the module and not trained (LRA's code draws them
//! anew per call): a trained model hashes the same way in evaluation as in its last training
//! steps, and every backend computes the same pattern. Padded positions hash to a bucket of
//! their own after all the others, so they never share a chunk with a real position's keys
//! except at the edge of the last real chunk, where they are masked.
//!
//! The paper's reversible layers and chunked feed-forward save activation memory in the
//! surrounding model; they are not part of the attention and not built here.
//!
//! Cost per head: O(r n c d) time and O(r n c) memory, `r` rounds, `c` the chunk length (plus
//! sorting, on the host). Masks: padding, an arbitrary attention mask (on the pairs the chunks
//! hold; a query's own key still counts only when nothing else is left). No causal form (which keys share a query's chunk
//! depends on where later positions hash; LRA's Reformer has none either), no cross-attention.
//!
//! Rotary positions: the positions are hashed and chunked from the keys as they are (content,
//! not position, decides what a query meets), and the scores within the chunks are those of
//! the rotated queries and keys (a position's score for itself unchanged: both turn alike).

use crate::variants::prelude::*;
use burn::module::Param;
use burn::nn::{Dropout, DropoutConfig, Initializer, Linear, LinearConfig};
use burn::tensor::Distribution;

use crate::contract::variant::check_rotary;
use crate::engines::heads::{merge_heads, split_heads, with_rotary_positions};
use crate::engines::rotary::rotate_queries_keys;
use crate::kernels::key_slots::KeySlots;

use crate::engines::params::lazy_param;

use crate::engines::gathered_softmax::{
    GatheredOutput, gathered_attention, merge_by_log_sum_exp, padding_flags,
};

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "reformer",
    paper: "Kitaev et al. 2020, arXiv 2001.04451",
    time: "O(r n c d)",
    memory: "O(r n c)",
    capabilities: Capabilities {
        attention_mask: true,
        weights_sum_to_one: true,
        per_head_form: true,
        rotary: true,
        ..Capabilities::PADDING_ONLY
    },
};

/// Added to a query's score for itself: far below any real score, far above a masked one
/// (`MASK_FILL`, −10⁴), so a query attends to itself only when it has no other key.
const SELF_BIAS: f32 = -5e3;

/// Configuration of [`ReformerAttention`].
#[derive(Config, Debug)]
pub struct ReformerConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Hash rounds (the paper trains with 1 to 8; more rounds, fewer keys missed).
    #[config(default = 2)]
    pub n_hashes: usize,
    /// Buckets per round (even).
    #[config(default = 32)]
    pub n_buckets: usize,
    /// Positions per chunk of the sorted sequence.
    #[config(default = 64)]
    pub chunk_len: usize,
    /// Dropout on the attention weights (default 0: none).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases on the projections.
    #[config(default = false)]
    pub bias: bool,
}

impl VariantConfig for ReformerConfig {
    variant_glue!(ReformerAttention, &[INFO], new(d_model, n_heads), dropout);

    /// Chunks of 3 and 4 buckets.
    fn small(self) -> Self {
        self.with_chunk_len(3).with_n_buckets(4)
    }

    fn frozen_params(&self) -> Option<usize> {
        // The random rotations, `[n_heads, d_head, n_hashes · n_buckets / 2]`.
        (self.n_hashes.checked_mul(self.n_buckets)? / 2).checked_mul(self.d_model)
    }

    fn check_fields(&self) -> Result<(), AttentionError> {
        for (field, value) in [("n_hashes", self.n_hashes), ("chunk_len", self.chunk_len)] {
            if value == 0 {
                return Err(INFO.field_error(field, "must be at least 1"));
            }
        }
        if self.n_buckets < 2 || !self.n_buckets.is_multiple_of(2) {
            return Err(INFO.field_error(
                "n_buckets",
                format!("must be even and at least 2, got {}", self.n_buckets),
            ));
        }
        Ok(())
    }

    fn build(&self, device: &Device) -> ReformerAttention {
        let linear = LinearConfig::new(self.d_model, self.d_model)
            .with_bias(self.bias)
            .with_initializer(Initializer::XavierUniform { gain: 1.0 });
        let d_head = self.d_model / self.n_heads;
        let shape = [self.n_heads, d_head, self.n_hashes * self.n_buckets / 2];
        ReformerAttention {
            query_key: linear.init(device),
            value: linear.init(device),
            output: linear.init(device),
            rotations: lazy_param(shape, device, false, move |device| {
                Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
            }),
            dropout: DropoutConfig::new(self.dropout).init(),
            n_heads: self.n_heads,
            n_hashes: self.n_hashes,
            n_buckets: self.n_buckets,
            chunk_len: self.chunk_len,
            rotary: false,
        }
    }
}

inherent_config_methods!(ReformerConfig);

/// Multi-head LSH attention. Create with [`ReformerConfig`].
#[derive(Module, Debug)]
pub struct ReformerAttention {
    /// The shared query-key projection.
    pub query_key: Linear,
    /// Value projection.
    pub value: Linear,
    /// Output projection.
    pub output: Linear,
    /// The random rotations, `[heads, d_head, n_hashes · n_buckets/2]` (round-major), standard
    /// normal; saved, not trained.
    pub rotations: Param<Tensor<3>>,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// Number of heads.
    #[module(skip)]
    pub n_heads: usize,
    /// Hash rounds.
    #[module(skip)]
    pub n_hashes: usize,
    /// Buckets per round.
    #[module(skip)]
    pub n_buckets: usize,
    /// Positions per chunk.
    #[module(skip)]
    pub chunk_len: usize,
    /// Rotary positions on ([`AttentionModule::with_rotary`]).
    #[module(skip)]
    pub rotary: bool,
}

impl ReformerAttention {
    /// Model width (the output projection's, read from its shape).
    pub fn d_model(&self) -> usize {
        self.output.weight.lazy_shape()[1]
    }

    /// Number of heads.
    pub fn n_heads(&self) -> usize {
        self.n_heads
    }
}

/// One hash round of one (batch, head): the sorted positions and each position's chunk.
struct Round {
    /// Positions in (bucket, position) order, padding last.
    order: Vec<usize>,
    /// The chunk of each position.
    chunk: Vec<usize>,
}

impl ReformerAttention {
    /// The bucket of every position in every round, `[batch, heads, n, n_hashes]` on the host,
    /// from the vectors that are hashed (`x: [batch, heads, n, d]`).
    pub fn buckets(&self, x: Tensor<4>) -> Vec<i64> {
        let [batch, heads, n, _] = x.dims();
        let half = self.n_buckets / 2;
        let rotations = self.rotations.val().unsqueeze_dim::<4>(0);
        let rotated = x
            .detach()
            .matmul(rotations)
            .reshape([batch, heads, n, self.n_hashes, half]);
        Tensor::cat(vec![rotated.clone(), rotated.neg()], 4)
            .argmax(4)
            .into_data()
            .convert::<i64>()
            .iter::<i64>()
            .collect()
    }

    /// Sorts and chunks one (batch, head)'s positions, round by round. `buckets` holds
    /// `[n, n_hashes]`; padded positions go last.
    fn rounds(&self, buckets: &[i64], padding: &[bool], chunk_len: usize) -> Vec<Round> {
        let n = padding.len();
        (0..self.n_hashes)
            .map(|r| {
                let bucket = |j: usize| {
                    if padding[j] {
                        self.n_buckets as i64
                    } else {
                        buckets[j * self.n_hashes + r]
                    }
                };
                let mut order: Vec<usize> = (0..n).collect();
                order.sort_by_key(|&j| (bucket(j), j));
                let mut chunk = vec![0; n];
                for (t, &j) in order.iter().enumerate() {
                    chunk[j] = t / chunk_len;
                }
                Round { order, chunk }
            })
            .collect()
    }

    /// The per-head attention: queries `q` at their positions, keys `k` (normalised here,
    /// hashed and sorted), values `v`, all over the same `n` positions.
    fn lsh_attention(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        masks: HeadMasks,
    ) -> Tensor<4> {
        let [batch, heads, n, d] = q.dims();
        let device = q.device();
        let padding = padding_flags(&masks.key_pad, batch, n);
        let buckets = self.buckets(k.clone());
        let c = self.chunk_len.min(n.max(1));
        let n_chunks = n.div_ceil(c);
        let rows = n_chunks * c;
        let rounds = self.n_hashes;
        // `ln c` for the c ≤ rounds rounds in which a pair can meet, read once per pair below.
        let ln_met: Vec<f32> = (0..=rounds).map(|c| (c as f32).ln()).collect();

        // All rounds in one gathered attention: round r's queries are rows r·rows.. of a
        // stack of the queries, each round padded to whole chunks.
        let mut slots = KeySlots::masked([batch, heads], rounds * n_chunks, c, 2 * c);
        let mut bias = vec![0.0f32; slots.mask.len()];
        let mut query_order = vec![0i64; batch * heads * rounds * rows];
        let attention = masks.attention_flags();
        for (b, pad) in padding.iter().enumerate() {
            let live = pad.iter().filter(|&&p| !p).count().div_ceil(c).max(1);
            let previous = |chunk: usize| if chunk == 0 { live - 1 } else { chunk - 1 };
            for h in 0..heads {
                let g = slots.group(b, h);
                let own = &buckets[(b * heads + h) * n * rounds..(b * heads + h + 1) * n * rounds];
                let hashed = self.rounds(own, pad, c);
                // How many rounds put key j in query i's chunk or the one before it.
                let met = |i: usize, j: usize| {
                    hashed
                        .iter()
                        .filter(|round| {
                            let (ci, cj) = (round.chunk[i], round.chunk[j]);
                            cj == ci || cj == previous(ci)
                        })
                        .count()
                };
                for (r, round) in hashed.iter().enumerate() {
                    let order_base = (g * rounds + r) * rows;
                    for t in 0..rows {
                        let pos = round.order.get(t).copied().unwrap_or(t);
                        query_order[order_base + t] = (r * rows + pos) as i64;
                    }
                    for beta in 0..n_chunks {
                        let block = r * n_chunks + beta;
                        let back = previous(beta);
                        // Slot s: the own chunk's keys, then the previous chunk's (none when
                        // it is the own chunk: a single live chunk).
                        for s in 0..2 * c {
                            let source = if s < c { beta } else { back };
                            if s >= c && back == beta {
                                continue;
                            }
                            let Some(&j) = round.order.get(source * c + s % c) else {
                                continue;
                            };
                            if pad[j] {
                                continue;
                            }
                            // Rows past n (whole-chunk padding) see nothing.
                            slots.set(g, block, s, j, |row| beta * c + row < n);
                            for row in 0..c {
                                let Some(&i) = round.order.get(beta * c + row) else {
                                    continue;
                                };
                                let at = slots.pair(g, block, row, s);
                                if let Some((flags, _)) = &attention {
                                    slots.mask[at] |= flags[(b * n + i) * n + j];
                                }
                                let self_bias = if i == j { SELF_BIAS } else { 0.0 };
                                bias[at] = self_bias - ln_met[met(i, j)];
                            }
                        }
                    }
                }
            }
        }
        slots.bias = Some(bias);
        slots.query_order = Some(query_order);

        let stack = |x: Tensor<4>| {
            let width = x.dims()[3];
            let padded = if rows > n {
                Tensor::cat(
                    vec![x, Tensor::zeros([batch, heads, rows - n, width], &device)],
                    2,
                )
            } else {
                x
            };
            Tensor::cat(vec![padded; rounds], 2)
        };
        let norm = k.clone().powi_scalar(2).sum_dim(3).sqrt().clamp_min(1e-12);
        let keys = k / norm;
        let (q, keys) = rotate_queries_keys(q, keys, &masks.positions);
        let scale = 1.0 / (d as f32).sqrt();
        let all = gathered_attention(stack(q), keys, v, slots, scale, Some(&self.dropout));
        let parts: Vec<GatheredOutput> = (0..rounds)
            .map(|r| GatheredOutput {
                out: all.out.clone().slice(s![.., .., r * rows..r * rows + n]),
                lse: all.lse.clone().slice(s![.., .., r * rows..r * rows + n]),
            })
            .collect();
        merge_by_log_sum_exp(parts).out
    }
}

impl AttentionModule for ReformerAttention {
    variant_facts!(INFO);

    fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        input.check_shapes(self.name(), self.d_model())?;
        check_capabilities(&INFO, input.query_len(), input.key_len(), input.is_causal())?;
        let x = input.query().clone();
        let masks = with_rotary_positions(self.rotary, input.head_masks(), &x);
        let qk = split_heads(self.query_key.forward(x.clone()), self.n_heads);
        let v = split_heads(self.value.forward(x), self.n_heads);
        check_attention_mask(&INFO, &masks, &qk, qk.dims()[2])?;
        let out = self.lsh_attention(qk.clone(), qk, v, masks);
        Ok(self.output.forward(merge_heads(out)))
    }

    fn with_rotary(mut self) -> Result<Self, AttentionError> {
        check_rotary(INFO.name, INFO.capabilities, self.d_model() / self.n_heads)?;
        self.rotary = true;
        Ok(self)
    }

    /// LSH attention on per-head tensors: the keys `k` are normalised, hashed and sorted, and
    /// query `i` takes the chunks of key position `i` (the module passes its shared query-key
    /// projection as both).
    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        check_head_input(&INFO, &q, &k, &masks)?;
        Ok(self.lsh_attention(q, k, v, masks))
    }
}
