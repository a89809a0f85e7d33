//! Longformer: a sliding window plus global tokens, computed over the window and the global
//! positions only.
//!
//! Beltagy et al. 2020, "Longformer: The Long-Document Transformer", arXiv 2004.05150, as LRA
//! configures it (a window of 512, no dilation). A query `i` that is not global attends to the
//! keys of its window, `i − ⌈w/2⌉ < j <= i + ⌊w/2⌋` (`w` positions with itself, one more on
//! the left when `w` is even, as LRA's code), and to every global position; a global position
//! attends to every key. The two kinds of rows use their own projections, as in the paper
//! (`Q_s, K_s, V_s` for the window, `Q_g, K_g, V_g` for the global rows); the output projection
//! is shared:
//!
//! `O_i = softmax_{j ∈ W(i) ∪ G}(q_i·k_j/√d) v_j` for `i ∉ G`,
//! `O_i = softmax_j(q^g_i·k^g_j/√d) v^g_j` for `i ∈ G`.
//!
//! The global positions default to position 0, the CLS token of a classifier that prepends one
//! (the LRA harness with CLS pooling); padded ones are ignored.
//!
//! Cost per head: O(n (w + g) d + g n d) time and O(n (w + g)) memory, `g` global positions.
//! Masks: padding, an arbitrary attention mask (on the window's pairs and the global rows). Its
//! weights on request (a window row's over its window and the global keys, a global row's over
//! every key, from the global projections). No causal form (LRA's Longformer has none either), no cross-attention.
//! Rotary positions rotate the queries and keys of both kinds of rows before they are scored.

use crate::variants::prelude::*;
use burn::nn::{Dropout, DropoutConfig, Initializer, Linear, LinearConfig};

use crate::engines::dropout::dropout;
use crate::engines::rotary::rotate_queries_keys;

use crate::engines::heads::split_heads;
use crate::kernels::key_slots::KeySlots;

use crate::engines::softmax::softmax_weights;

use crate::engines::gathered_softmax::{
    gathered_attention, padding_flags, pattern_weights, pick_rows, with_full_rows,
};

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "longformer",
    paper: "Beltagy et al. 2020, arXiv 2004.05150",
    time: "O(n (w + g) d)",
    memory: "O(n (w + g))",
    capabilities: Capabilities {
        attention_mask: true,
        returns_weights: true,
        weights_sum_to_one: true,
        per_head_form: true,
        rotary: true,
        ..Capabilities::PADDING_ONLY
    },
};

/// Configuration of [`LongformerAttention`].
#[derive(Config, Debug)]
pub struct LongformerConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Keys in each query's window, itself included (LRA: 512).
    #[config(default = 512)]
    pub window: usize,
    /// Global positions (default: the first, a classifier's CLS token).
    #[config(default = "vec![0]")]
    pub global_tokens: Vec<usize>,
    /// Dropout on the attention weights (default 0: none; on `flex` the fused kernel applies
    /// it itself).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases on the projections.
    #[config(default = false)]
    pub bias: bool,
}

impl VariantConfig for LongformerConfig {
    variant_glue!(LongformerAttention, &[INFO], new(d_model, n_heads), dropout);

    /// Windows of 4.
    fn small(self) -> Self {
        self.with_window(4)
    }

    fn check_fields(&self) -> Result<(), AttentionError> {
        check_at_least_one(INFO.name, "window", self.window)?;
        Ok(())
    }

    fn build(&self, device: &Device) -> LongformerAttention {
        let linear = LinearConfig::new(self.d_model, self.d_model)
            .with_bias(self.bias)
            .with_initializer(Initializer::XavierUniform { gain: 1.0 });
        let mut global_tokens = self.global_tokens.clone();
        global_tokens.sort_unstable();
        global_tokens.dedup();
        LongformerAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            query_global: linear.init(device),
            key_global: linear.init(device),
            value_global: linear.init(device),
            dropout: DropoutConfig::new(self.dropout).init(),
            window: self.window,
            global_tokens,
        }
    }
}

inherent_config_methods!(LongformerConfig);

/// Multi-head Longformer attention. Create with [`LongformerConfig`].
#[derive(Module, Debug)]
pub struct LongformerAttention {
    /// The window's Q, K, V projections and the output projection.
    pub proj: QkvoProjection,
    /// Query projection of the global rows.
    pub query_global: Linear,
    /// Key projection of the global rows.
    pub key_global: Linear,
    /// Value projection of the global rows.
    pub value_global: Linear,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// Keys in each query's window.
    #[module(skip)]
    pub window: usize,
    /// Global positions, sorted.
    #[module(skip)]
    pub global_tokens: Vec<usize>,
}

projection_shape!(LongformerAttention);

impl LongformerAttention {
    /// The window attention with the global keys, `[batch, heads, n, d]` per head; the global
    /// rows are left to [`with_full_rows`].
    fn window_attention(
        &self,
        [q, k, v]: [Tensor<4>; 3],
        padding: &[Vec<bool>],
        masks: &HeadMasks,
    ) -> Tensor<4> {
        let d = q.dims()[3];
        let slots = self.window_slots(q.dims()[2], padding, masks);
        gathered_attention(q, k, v, slots, 1.0 / (d as f32).sqrt(), Some(&self.dropout)).out
    }

    /// The keys each block of window queries scores: the window and the global positions, less
    /// padding and what an attention mask hides.
    fn window_slots(&self, n: usize, padding: &[Vec<bool>], masks: &HeadMasks) -> KeySlots {
        let globals: Vec<usize> = self
            .global_tokens
            .iter()
            .copied()
            .filter(|&g| g < n)
            .collect();
        // A window wider than the sequence holds every key: the same slots as one of width 2n.
        let window = self.window.min(2 * n);
        let (before, after) = (window.div_ceil(2) - 1, window / 2);
        let block = window.div_ceil(4).max(1);
        let mut slots = KeySlots::band(n, block, [before, after], &globals, padding);
        if let Some((flags, shape)) = masks.attention_flags() {
            slots.mask_attention(&flags, shape);
        }
        slots
    }

    /// The global projections of `x: [batch, n, d_model]` per head: the queries of the global
    /// `rows` alone, and every key and value; with rotary positions in `masks`, the queries and
    /// keys rotated at their positions (the queries projected at every row, rotated, then
    /// picked).
    fn global_heads(&self, x: Tensor<3>, rows: &[Vec<usize>], masks: &HeadMasks) -> [Tensor<4>; 3] {
        let heads = self.proj.n_heads;
        let per_head = |linear: &Linear, x: Tensor<3>| split_heads(linear.forward(x), heads);
        let k = per_head(&self.key_global, x.clone());
        let v = per_head(&self.value_global, x.clone());
        match &masks.positions {
            None => {
                // The global queries are needed at the global rows only: project those alone.
                let x_rows = pick_rows(x.unsqueeze_dim(1), rows).squeeze_dim(1);
                [per_head(&self.query_global, x_rows), k, v]
            }
            Some(_) => {
                let q = per_head(&self.query_global, x);
                let (q, k) = rotate_queries_keys(q, k, &masks.positions);
                [pick_rows(q, rows), k, v]
            }
        }
    }

    /// The global rows of each batch element: the global positions that are not padding.
    fn global_rows(&self, n: usize, padding: &[Vec<bool>]) -> Vec<Vec<usize>> {
        padding
            .iter()
            .map(|pad| {
                self.global_tokens
                    .iter()
                    .copied()
                    .filter(|&g| g < n && !pad[g])
                    .collect()
            })
            .collect()
    }
}

impl AttentionModule for LongformerAttention {
    variant_facts!(INFO);

    rotary_on_projections!();

    fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        input.check_shapes(self.name(), self.d_model())?;
        let [n_q, n_k] = [input.query_len(), input.key_len()];
        check_capabilities(&INFO, n_q, n_k, input.is_causal())?;
        let masks = self.proj.with_positions(input.head_masks(), input.query());
        let x = input.query().clone();
        let [batch, n, _] = x.dims();
        let padding = padding_flags(&masks.key_pad, batch, n);
        let rows = self.global_rows(n, &padding);
        let (q, k, v) = self.proj.project(input);
        check_attention_mask(&INFO, &masks, &q, k.dims()[2])?;
        let (q, k) = rotate_queries_keys(q, k, &masks.positions);
        let out = self.window_attention([q, k, v], &padding, &masks);
        if rows.iter().all(Vec::is_empty) {
            return Ok(self.proj.out(out));
        }
        let global = self.global_heads(x, &rows, &masks);
        let out = with_full_rows(out, global, &rows, &masks, Some(&self.dropout));
        Ok(self.proj.out(out))
    }

    /// The window attention alone, with the global keys: per-head tensors carry one projection,
    /// so the global rows here use the window's (use [`try_forward`](Self::try_forward) for
    /// the paper's separate global projections).
    /// The weights `[batch, heads, n, n]`: a window row's over its window and the global keys
    /// (0 elsewhere), a global row's over every key, from the global projections (its output
    /// reads the global values, as in the forward pass).
    fn try_forward_with_weights(&self, input: AttentionInput) -> WeightsResult {
        input.check_shapes(self.name(), self.d_model())?;
        let [n_q, n_k] = [input.query_len(), input.key_len()];
        check_capabilities(&INFO, n_q, n_k, input.is_causal())?;
        let masks = self.proj.with_positions(input.head_masks(), input.query());
        let x = input.query().clone();
        let [batch, n, _] = x.dims();
        let padding = padding_flags(&masks.key_pad, batch, n);
        let heads = self.proj.n_heads;
        let (q, k, v) = self.proj.project(input);
        check_attention_mask(&INFO, &masks, &q, k.dims()[2])?;
        let (q, k) = rotate_queries_keys(q, k, &masks.positions);
        let scale = 1.0 / (q.dims()[3] as f32).sqrt();
        let slots = self.window_slots(n, &padding, &masks);
        let window = pattern_weights(q, k, &[&slots], &[], &masks, scale);
        let [q_g, k_g, v_g] = [&self.query_global, &self.key_global, &self.value_global]
            .map(|linear| split_heads(linear.forward(x.clone()), heads));
        let (q_g, k_g) = rotate_queries_keys(q_g, k_g, &masks.positions);
        let global = softmax_weights(q_g, k_g, &masks, scale);
        let rows = self.global_rows(n, &padding);
        let mut is_global = vec![false; batch * n];
        for (b, rows) in rows.iter().enumerate() {
            for &i in rows {
                is_global[b * n + i] = true;
            }
        }
        let is_global =
            Tensor::<4, Bool>::from_data(TensorData::new(is_global, [batch, 1, n, 1]), &x.device());
        let out = dropout(&self.dropout, window.clone()).matmul(v).mask_where(
            is_global
                .clone()
                .expand([batch, heads, n, self.proj.d_model() / heads]),
            dropout(&self.dropout, global.clone()).matmul(v_g),
        );
        let weights = window.mask_where(is_global.expand([batch, heads, n, n]), global);
        Ok((self.proj.out(out), weights))
    }

    /// With rotary positions in `masks`, the queries and keys rotated at them first.
    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        let [batch, _, n, _] = q.dims();
        check_capabilities(&INFO, n, k.dims()[2], masks.causal)?;
        check_attention_mask(&INFO, &masks, &q, k.dims()[2])?;
        let (q, k) = rotate_queries_keys(q, k, &masks.positions);
        let padding = padding_flags(&masks.key_pad, batch, n);
        let out = self.window_attention([q.clone(), k.clone(), v.clone()], &padding, &masks);
        let rows = self.global_rows(n, &padding);
        if rows.iter().all(Vec::is_empty) {
            return Ok(out);
        }
        Ok(with_full_rows(
            out,
            [pick_rows(q, &rows), k, v],
            &rows,
            &masks,
            Some(&self.dropout),
        ))
    }
}
