//! Sparse Sinkhorn attention: block attention to the query's own block and to a block sorted
//! to it by a learned, Sinkhorn-balanced soft permutation.
//!
//! Tay et al. 2020, "Sparse Sinkhorn Attention", arXiv 2002.11296. The sequence is cut into
//! blocks of `b` positions (50 in LRA). Per head:
//! 1. each block is summarised by the sum of its keys, `s_β = Σ_{t} k_{βb+t}`;
//! 2. a sorting network scores, for block `β`, every block `c` it could draw from:
//!    `L_{βc} = (W s_β + w₀)_c / τ` (`W: d → n_max/b`, shared by the heads, τ the temperature);
//! 3. Sinkhorn normalisation (`iterations` rounds of row then column normalisation in log
//!    space) turns `exp(L)` into a doubly stochastic matrix `R`, a relaxed block permutation;
//! 4. block `β`'s sorted keys and values are `R`'s mixture of the blocks,
//!    `k̃_{β,t} = Σ_c R_{βc} k_{cb+t}` (likewise `ṽ`);
//! 5. each query of block `β` attends, in one softmax, to its own block's keys and to the sorted
//!    block: `O_i = softmax([q_i·k_j/√d]_{j ∈ β}, [q_i·k̃_{β,t}/√d]_t) [v_j; ṽ_{β,t}]`.
//!
//! As the paper and the `sinkhorn-transformer` package, one softmax over both key sets (LRA's
//! JAX code adds two separately normalised attentions instead). No Gumbel noise: the sorting is
//! deterministic, in training as in evaluation.
//!
//! Padding (at the end of each sequence): blocks are counted on each sequence's real length; blocks made only of padding take
//! no part in the sorting (their rows and columns of `R` are masked), padded keys are left out
//! of the block sums and of the mixtures (a sorted key is the `R`-weighted mean of the real keys
//! at its offset), so padding never changes a real output.
//!
//! Cost per head: O(n b d + (n/b)² (d + b d)) time, O(n b + (n/b)²) memory. Masks: padding. No
//! arbitrary attention mask: a query's sorted block holds mixtures of the keys of several
//! blocks, which a mask over query-key pairs cannot address (it refuses one). No causal form,
//! no cross-attention; sequences up to `n_max`.
//!
//! Rotary positions: the blocks are sorted from the sums of the keys as they are (content, not
//! position, sorts them), and the queries and keys are rotated before they are scored, each key
//! at its own position before it is mixed into a sorted block: a sorted key's score is then the
//! `R`-weighted sum of rotated scores, each depending only on a difference of positions.

use crate::variants::prelude::*;
use burn::nn::{Dropout, DropoutConfig, Initializer, Linear, LinearConfig};
use burn::tensor::activation::softmax;

use crate::contract::input::MASK_FILL;
use crate::kernels::key_slots::KeySlots;

use crate::engines::gathered_softmax::{gathered_attention, padding_flags, real_lengths};
use crate::engines::rotary::rotate_queries_keys;

use crate::contract::variant::check_iterations;

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "sinkhorn",
    paper: "Tay et al. 2020, arXiv 2002.11296",
    time: "O(n b d + (n/b)² b d)",
    memory: "O(n b + (n/b)²)",
    capabilities: Capabilities {
        fixed_max_len: true,
        weights_sum_to_one: true,
        per_head_form: true,
        rotary: true,
        ..Capabilities::PADDING_ONLY
    },
};

/// Configuration of [`SinkhornAttention`].
#[derive(Config, Debug)]
pub struct SinkhornConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Longest sequence (sizes the sorting network's output).
    pub n_max: usize,
    /// Positions per block (LRA: 50).
    #[config(default = 50)]
    pub block_size: usize,
    /// Rounds of Sinkhorn normalisation.
    #[config(default = 5)]
    pub iterations: usize,
    /// Temperature τ of the sorting scores.
    #[config(default = 0.75)]
    pub temperature: f64,
    /// Dropout on the attention weights (default 0: none).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases on the projections (the sorting network always has one).
    #[config(default = false)]
    pub bias: bool,
}

impl VariantConfig for SinkhornConfig {
    variant_glue!(
        SinkhornAttention,
        &[INFO],
        new(d_model, n_heads, n_max),
        dropout
    );

    /// Blocks of 3; a sorting table for at least 96 positions.
    fn small(self) -> Self {
        Self {
            n_max: self.n_max.max(96),
            ..self
        }
        .with_block_size(3)
    }

    fn check_input(&self, n_q: usize, n_k: usize, causal: bool) -> Result<(), AttentionError> {
        check_within_max_len(&INFO, self.n_max, n_q, n_k, causal)
    }

    fn check_fields(&self) -> Result<(), AttentionError> {
        check_iterations(INFO.name, "iterations", self.iterations)?;
        for (field, value) in [("block_size", self.block_size), ("n_max", self.n_max)] {
            if value == 0 {
                return Err(INFO.field_error(field, "must be at least 1"));
            }
        }
        if self.temperature.is_nan() || self.temperature <= 0.0 {
            return Err(INFO.field_error(
                "temperature",
                format!("must be positive, got {}", self.temperature),
            ));
        }
        Ok(())
    }

    fn build(&self, device: &Device) -> SinkhornAttention {
        let d_head = self.d_model / self.n_heads;
        SinkhornAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            sort: LinearConfig::new(d_head, self.n_max.div_ceil(self.block_size))
                .with_initializer(Initializer::XavierUniform { gain: 1.0 })
                .init(device),
            dropout: DropoutConfig::new(self.dropout).init(),
            block_size: self.block_size,
            iterations: self.iterations,
            temperature: self.temperature,
            n_max: self.n_max,
        }
    }
}

inherent_config_methods!(SinkhornConfig);

/// Multi-head Sparse Sinkhorn attention. Create with [`SinkhornConfig`].
#[derive(Module, Debug)]
pub struct SinkhornAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
    /// The sorting network `W`, `d_head → n_max/b`, shared by the heads.
    pub sort: Linear,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// Positions per block.
    #[module(skip)]
    pub block_size: usize,
    /// Rounds of Sinkhorn normalisation.
    #[module(skip)]
    pub iterations: usize,
    /// Temperature of the sorting scores.
    #[module(skip)]
    pub temperature: f64,
    /// Longest sequence.
    #[module(skip)]
    pub n_max: usize,
}

projection_shape!(SinkhornAttention);

/// `x - logsumexp(x, dim)`, masked entries re-filled with [`MASK_FILL`].
fn normalise(x: Tensor<4>, dim: usize, masked: &Tensor<4, Bool>) -> Tensor<4> {
    let max = x.clone().max_dim(dim).detach();
    let lse = max.clone() + (x.clone() - max).exp().sum_dim(dim).log();
    (x - lse).mask_fill(masked.clone(), MASK_FILL)
}

impl SinkhornAttention {
    /// The relaxed block permutation in log space, `log R` `[batch, heads, blocks, blocks]`,
    /// from the keys summed per block, `sums: [batch, heads, blocks, d]`; entries where block `β`
    /// or `c` is padding (`masked`) hold [`MASK_FILL`].
    pub fn log_permutation(&self, sums: Tensor<4>, masked: &Tensor<4, Bool>) -> Tensor<4> {
        let blocks = sums.dims()[2];
        let mut log_r = self
            .sort
            .forward(sums)
            .slice(s![.., .., .., 0..blocks])
            .div_scalar(self.temperature)
            .mask_fill(masked.clone(), MASK_FILL);
        for _ in 0..self.iterations {
            log_r = normalise(log_r, 3, masked);
            log_r = normalise(log_r, 2, masked);
        }
        log_r
    }
}

impl AttentionModule for SinkhornAttention {
    variant_facts!(INFO);

    forward_through_projections!();

    rotary_on_projections!();

    /// With rotary positions in `masks`, the blocks sorted from the unrotated keys and every
    /// score over rotated queries and keys.
    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        let [batch, heads, n, d] = q.dims();
        let d_v = v.dims()[3];
        check_within_max_len(&INFO, self.n_max, n, k.dims()[2], masks.causal)?;
        check_attention_mask(&INFO, &masks, &q, k.dims()[2])?;
        let (q, k_scored) = rotate_queries_keys(q, k.clone(), &masks.positions);
        let device = q.device();
        let b = self.block_size.min(n.max(1));
        let blocks = n.div_ceil(b);
        let rows = blocks * b;
        let padding = padding_flags(&masks.key_pad, batch, n);
        let lengths = real_lengths(&padding);

        // Real-position weights (1 real, 0 padding or past n), masked block pairs, and the
        // sorted slots with nothing to mix (a padded block's, or an offset no real block has).
        let mut real = vec![0.0f32; batch * rows];
        let mut block_masked = vec![true; batch * blocks * blocks];
        let mut without_last = vec![true; batch * blocks * blocks];
        let mut past_last = vec![false; batch * rows];
        for (e, pad) in padding.iter().enumerate() {
            for (j, &p) in pad.iter().enumerate() {
                real[e * rows + j] = if p { 0.0 } else { 1.0 };
            }
            let live = lengths[e].div_ceil(b);
            // Offsets past the last real block's length (the same in every block).
            let past: Vec<bool> = (0..b)
                .map(|s| {
                    let last = live.saturating_sub(1) * b + s;
                    last >= n || pad[last]
                })
                .collect();
            for beta in 0..live {
                for c in 0..live {
                    block_masked[(e * blocks + beta) * blocks + c] = false;
                }
                for c in 0..live.saturating_sub(1) {
                    without_last[(e * blocks + beta) * blocks + c] = false;
                }
                past_last[e * rows + beta * b..e * rows + (beta + 1) * b].copy_from_slice(&past);
            }
        }
        let real = Tensor::<4>::from_data(TensorData::new(real, [batch, 1, rows, 1]), &device);
        let block_masked = Tensor::<4, Bool>::from_data(
            TensorData::new(block_masked, [batch, 1, blocks, blocks]),
            &device,
        );
        let pad_rows = |x: Tensor<4>, width: usize| {
            if rows > n {
                Tensor::cat(
                    vec![x, Tensor::zeros([batch, heads, rows - n, width], &device)],
                    2,
                )
            } else {
                x
            }
        };
        let (k, v) = (pad_rows(k, d), pad_rows(v, d_v));
        let (k_real, v_real) = (k * real.clone(), v.clone() * real.clone());
        let k_scored = pad_rows(k_scored, d);

        let sums = k_real
            .clone()
            .reshape([batch, heads, blocks, b, d])
            .sum_dim(3)
            .reshape([batch, heads, blocks, d]);
        let log_r = self.log_permutation(
            sums,
            &block_masked.clone().expand([batch, heads, blocks, blocks]),
        );
        // Block β's sorted key at offset t is the R-weighted mean of the real keys at offset t:
        // weights R[β, c] / Σ_c' R[β, c'] over the source blocks, a softmax of log R over them
        // (no division by a sum that training can drive towards zero). Padding is a suffix, so
        // offsets within the last real block's length draw from every real block, the others
        // from all but the last.
        let shares = |masked: Tensor<4, Bool>| {
            softmax(
                log_r
                    .clone()
                    .mask_fill(masked.expand([batch, heads, blocks, blocks]), MASK_FILL),
                3,
            )
        };
        let from_all = shares(block_masked);
        let from_full = shares(Tensor::<4, Bool>::from_data(
            TensorData::new(without_last, [batch, 1, blocks, blocks]),
            &device,
        ));
        let past_last =
            Tensor::<4, Bool>::from_data(TensorData::new(past_last, [batch, 1, rows, 1]), &device);
        let mix = |x: Tensor<4>, width: usize| {
            let blocked = x.reshape([batch, heads, blocks, b * width]);
            let mix_with = |p: Tensor<4>| {
                p.matmul(blocked.clone())
                    .reshape([batch, heads, rows, width])
            };
            mix_with(from_all.clone()).mask_where(
                past_last.clone().expand([batch, heads, rows, width]),
                mix_with(from_full.clone()),
            )
        };
        let k_sorted = mix(k_scored.clone() * real, d);
        let v_sorted = mix(v_real, d_v);

        // Block β scores its own b positions, then its sorted block (rows past the real keys).
        let mut slots = KeySlots::masked([batch, 1], blocks, b, 2 * b);
        for (e, pad) in padding.iter().enumerate() {
            let live = lengths[e].div_ceil(b);
            // A sorted key exists at offset s where some real block has a real key there.
            let has_source: Vec<bool> = (0..b)
                .map(|s| (0..live).any(|c| c * b + s < n && !pad[c * b + s]))
                .collect();
            for beta in 0..live {
                for (s, &sourced) in has_source.iter().enumerate() {
                    let j = beta * b + s;
                    if j < n && !pad[j] {
                        slots.set(e, beta, s, j, |_| true);
                    }
                    if sourced {
                        slots.set(e, beta, b + s, rows + j, |_| true);
                    }
                }
            }
        }
        let keys = Tensor::cat(vec![k_scored, k_sorted], 2);
        let values = Tensor::cat(vec![v, v_sorted], 2);
        let scale = 1.0 / (d as f32).sqrt();
        Ok(gathered_attention(q, keys, values, slots, scale, Some(&self.dropout)).out)
    }
}
