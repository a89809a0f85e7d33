//! BigBird: block-sparse attention with a window, global blocks and random blocks, computed over
//! the blocks each query block attends.
//!
//! Zaheer et al. 2020, "Big Bird: Transformers for Longer Sequences", arXiv 2007.14062, in its
//! ITC form as LRA runs it. The sequence is cut into blocks of `b` positions (64 in the paper and
//! LRA). Query block `β` attends to the keys of
//! - its window: blocks `β − 1`, `β`, `β + 1`;
//! - the global blocks: the first and the last;
//! - `r` random blocks (3 in the paper and LRA) drawn among the others;
//!
//! and the global blocks' queries attend to every key:
//! `O_i = softmax_{j : block(j) ∈ A(block(i))}(q_i·k_j/√d) v_j`.
//!
//! The random blocks are fixed per layer and head: the module holds a table of random priorities
//! `[heads, n_max/b, n_max/b]`, drawn when it is created and saved with it (not trained), and
//! query block `β` takes the `r` candidate blocks of highest priority in row `β`. The blocks are
//! counted on each sequence's real length, so the last global block is the sequence's last real
//! block and padding changes nothing.
//!
//! Cost per head: O(n (5 + r) b d + 2 b n d) time, O(n (5 + r) b) memory. Masks: padding, an
//! arbitrary attention mask (on the pattern's pairs and the global rows). No causal form, no
//! cross-attention; sequences up to `n_max`. Rotary positions rotate the queries and keys before
//! the pattern is scored.

use crate::variants::prelude::*;
use burn::module::Param;
use burn::nn::{Dropout, DropoutConfig};
use burn::tensor::Distribution;

use crate::engines::dropout::dropout;
use crate::engines::rotary::rotate_queries_keys;

use crate::kernels::key_slots::KeySlots;

use crate::engines::params::lazy_param;

use crate::engines::gathered_softmax::{
    gathered_attention, padding_flags, pattern_weights, pick_rows, real_lengths, with_full_rows,
};

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "bigbird",
    paper: "Zaheer et al. 2020, arXiv 2007.14062 (ITC)",
    time: "O(n (5 + r) b d)",
    memory: "O(n (5 + r) b)",
    capabilities: Capabilities {
        attention_mask: true,
        returns_weights: true,
        fixed_max_len: true,
        weights_sum_to_one: true,
        per_head_form: true,
        rotary: true,
        ..Capabilities::PADDING_ONLY
    },
};

/// Configuration of [`BigBirdAttention`].
#[derive(Config, Debug)]
pub struct BigBirdConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Longest sequence (sizes the table of random blocks).
    pub n_max: usize,
    /// Positions per block (paper and LRA: 64).
    #[config(default = 64)]
    pub block_size: usize,
    /// Random blocks per query block (paper and LRA: 3).
    #[config(default = 3)]
    pub random_blocks: usize,
    /// Dropout on the attention weights (default 0: none; on `flex` the fused kernel applies
    /// it itself).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases on the Q, K, V and output projections.
    #[config(default = false)]
    pub bias: bool,
}

impl VariantConfig for BigBirdConfig {
    variant_glue!(
        BigBirdAttention,
        &[INFO],
        new(d_model, n_heads, n_max),
        dropout
    );

    /// Blocks of 2 with 1 random block; a table for at least 96 positions.
    fn small(self) -> Self {
        Self {
            n_max: self.n_max.max(96),
            ..self
        }
        .with_block_size(2)
        .with_random_blocks(1)
    }

    fn check_input(&self, n_q: usize, n_k: usize, causal: bool) -> Result<(), AttentionError> {
        check_within_max_len(&INFO, self.n_max, n_q, n_k, causal)
    }

    fn frozen_params(&self) -> Option<usize> {
        // The random blocks' priorities, `[n_heads, blocks, blocks]`.
        let blocks = self.n_max.div_ceil(self.block_size);
        blocks.checked_mul(blocks)?.checked_mul(self.n_heads)
    }

    fn check_fields(&self) -> Result<(), AttentionError> {
        for (field, value) in [("block_size", self.block_size), ("n_max", self.n_max)] {
            if value == 0 {
                return Err(INFO.field_error(field, "must be at least 1"));
            }
        }
        Ok(())
    }

    fn build(&self, device: &Device) -> BigBirdAttention {
        let blocks = self.n_max.div_ceil(self.block_size);
        let shape = [self.n_heads, blocks, blocks];
        BigBirdAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            random_priorities: lazy_param(shape, device, false, move |device| {
                Tensor::random(shape, Distribution::Uniform(0.0, 1.0), device)
            }),
            dropout: DropoutConfig::new(self.dropout).init(),
            block_size: self.block_size,
            random_blocks: self.random_blocks,
            n_max: self.n_max,
        }
    }
}

inherent_config_methods!(BigBirdConfig);

/// Multi-head BigBird attention. Create with [`BigBirdConfig`].
#[derive(Module, Debug)]
pub struct BigBirdAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
    /// Priorities of the candidate random blocks, `[heads, query block, key block]`, uniform in
    /// [0, 1); saved, not trained.
    pub random_priorities: Param<Tensor<3>>,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// Positions per block.
    #[module(skip)]
    pub block_size: usize,
    /// Random blocks per query block.
    #[module(skip)]
    pub random_blocks: usize,
    /// Longest sequence.
    #[module(skip)]
    pub n_max: usize,
}

projection_shape!(BigBirdAttention);

impl BigBirdAttention {
    /// The key blocks query block `beta` attends to among `blocks` real ones, for head `head`
    /// (`priorities`: the head's `[n_max/b, n_max/b]` table, row-major), sorted.
    pub fn attended_blocks(&self, priorities: &[f32], beta: usize, blocks: usize) -> Vec<usize> {
        attended_blocks(
            priorities,
            self.table_width(),
            beta,
            blocks,
            self.random_blocks,
        )
    }

    fn table_width(&self) -> usize {
        self.n_max.div_ceil(self.block_size)
    }
}

/// See [`BigBirdAttention::attended_blocks`]; `width` is the table's row length.
fn attended_blocks(
    priorities: &[f32],
    width: usize,
    beta: usize,
    blocks: usize,
    random: usize,
) -> Vec<usize> {
    let last = blocks - 1;
    let mut fixed = vec![0, last, beta, beta.saturating_sub(1), (beta + 1).min(last)];
    fixed.sort_unstable();
    fixed.dedup();
    let row = &priorities[beta * width..beta * width + width];
    let mut candidates: Vec<usize> = (0..blocks).filter(|c| !fixed.contains(c)).collect();
    // Highest priority first; ties (never in practice) by block.
    candidates.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    candidates.truncate(random);
    fixed.extend(candidates);
    fixed.sort_unstable();
    fixed
}

impl BigBirdAttention {
    /// The pattern's key slots for the non-global query blocks (neighbours and random blocks,
    /// less padding and what an attention mask hides), and each batch element's global rows
    /// (the first and last blocks of its real length), which attend to every key.
    fn pattern(
        &self,
        [batch, heads, n]: [usize; 3],
        masks: &HeadMasks,
    ) -> (KeySlots, Vec<Vec<usize>>) {
        // A block at least as long as the sequence is the whole sequence, whatever its size.
        let b = self.block_size.min(n.max(1));
        let padding = padding_flags(&masks.key_pad, batch, n);
        let lengths = real_lengths(&padding);
        let priorities: Vec<f32> = self
            .random_priorities
            .val()
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .expect("f32 priorities");
        let width = self.table_width();
        let n_blocks = n.div_ceil(b);
        // A query block attends to at most 5 + r blocks, and never to more than there are (a
        // configuration may ask for more random blocks than a sequence has).
        let per_block = 5usize.saturating_add(self.random_blocks).min(n_blocks) * b;
        let mut slots = KeySlots::masked([batch, heads], n_blocks, b, per_block);
        let mut global_rows = Vec::with_capacity(batch);
        for (e, pad) in padding.iter().enumerate() {
            let blocks = lengths[e].div_ceil(b);
            for h in 0..heads {
                let g = slots.group(e, h);
                let table = &priorities[h * width * width..(h + 1) * width * width];
                // The global blocks (the first and last) go to full rows below.
                for beta in 1..blocks.saturating_sub(1) {
                    let attended = attended_blocks(table, width, beta, blocks, self.random_blocks);
                    for (t, &c) in attended.iter().enumerate() {
                        for s in 0..b {
                            let j = c * b + s;
                            if j < n && !pad[j] {
                                slots.set(g, beta, t * b + s, j, |_| true);
                            }
                        }
                    }
                }
            }
            let globals = [0, blocks.saturating_sub(1)];
            global_rows.push(
                (0..lengths[e])
                    .filter(|i| globals.contains(&(i / b)))
                    .collect::<Vec<_>>(),
            );
        }
        if let Some((flags, shape)) = masks.attention_flags() {
            slots.mask_attention(&flags, shape);
        }
        (slots, global_rows)
    }
}

impl AttentionModule for BigBirdAttention {
    variant_facts!(INFO);

    forward_through_projections!();

    rotary_on_projections!();

    /// With rotary positions in `masks`, the queries and keys rotated at them first.
    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        let [batch, heads, n, d] = q.dims();
        check_within_max_len(&INFO, self.n_max, n, k.dims()[2], masks.causal)?;
        check_attention_mask(&INFO, &masks, &q, k.dims()[2])?;
        let (q, k) = rotate_queries_keys(q, k, &masks.positions);
        let (slots, global_rows) = self.pattern([batch, heads, n], &masks);
        let scale = 1.0 / (d as f32).sqrt();
        let dropout = Some(&self.dropout);
        let out = gathered_attention(q.clone(), k.clone(), v.clone(), slots, scale, dropout).out;
        if global_rows.iter().all(Vec::is_empty) {
            return Ok(out);
        }
        Ok(with_full_rows(
            out,
            [pick_rows(q, &global_rows), k, v],
            &global_rows,
            &masks,
            dropout,
        ))
    }

    /// The weights over the pattern's keys, `[batch, heads, n, n]` (0 outside it; the global
    /// rows over every key).
    fn try_forward_with_weights(&self, input: AttentionInput) -> WeightsResult {
        input.check_shapes(self.name(), self.d_model())?;
        if self.proj.rotary && input.is_cross() {
            return Err(rotary_cross_attention(self.name()));
        }
        let masks = self.proj.with_positions(input.head_masks(), input.query());
        let (q, k, v) = self.proj.project(input);
        let [batch, heads, n, d] = q.dims();
        check_within_max_len(&INFO, self.n_max, n, k.dims()[2], masks.causal)?;
        check_attention_mask(&INFO, &masks, &q, k.dims()[2])?;
        let (q, k) = rotate_queries_keys(q, k, &masks.positions);
        let (slots, global_rows) = self.pattern([batch, heads, n], &masks);
        let scale = 1.0 / (d as f32).sqrt();
        let weights = pattern_weights(q, k, &[&slots], &global_rows, &masks, scale);
        let o = dropout(&self.dropout, weights.clone()).matmul(v);
        Ok((self.proj.out(o), weights))
    }
}
