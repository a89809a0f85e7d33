//! ETC's global-local attention: a few global tokens beside the long input, and four pieces of
//! attention between them, with relative positions.
//!
//! Ainslie et al. 2020, "ETC: Encoding Long and Structured Inputs in Transformers", arXiv
//! 2004.08483. The input is split into a short global input and the long input; attention is
//! global-to-global (g2g) and global-to-long (g2l), both unrestricted, long-to-global (l2g),
//! unrestricted, and long-to-long (l2l) within a radius `r` (the paper's default 84). Positions
//! enter as relative position labels (Shaw et al. 2018): each pair (i, j) gets a label, the
//! clipped distance `clip(j − i, −k, k)` for l2l and g2g (k = 12, the paper's code default), and
//! for the pairs between a long token and a global token whether the global token is its own
//! segment's or another's; each label has a learned vector per head added to the key, so a score
//! is `q_i · (k_j + a_{l(i,j)}) / √d`.
//!
//! Global tokens ([`EtcGlobal`]): one per fixed-size segment of `segment_len` long tokens (the
//! paper's long-input setting, a global token per sentence), or `n_global` learned tokens. In
//! ETC every layer carries both inputs; an attention inside an encoder block receives the long
//! input only, so here the global input is made afresh in each layer, from the layer's input:
//! a segment's global token is a learned embedding plus the mean of its segment's (real)
//! positions, a learned token is its parameter. The global tokens attend first (g2g and g2l, one
//! softmax), pass through the output projection, and the long tokens then attend to their
//! result and their window (l2g and l2l, one softmax), so the global summary reaches the long
//! tokens in the same layer. Projections are shared between the two inputs.
//!
//! Cost per head: O(n (r + g) d) time and memory (g global tokens; the window is computed in
//! blocks of `r` queries over three blocks of keys, or over the one block when `r` spans the
//! sequence). Masks: padding (padded positions never reach a global token; a segment wholly of
//! padding is masked). Not causal, no cross-attention (the
//! pieces relate positions), no attention mask, no weights, and no per-head form (the global
//! tokens pass through the output projection over all heads).

use crate::variants::prelude::*;
use burn::module::Param;
use burn::nn::{Dropout, DropoutConfig};
use burn::tensor::Distribution;
use serde::{Deserialize, Serialize};

use crate::engines::dropout::dropout;

use crate::contract::input::{MASK_FILL, flags_framed, zeros_after, zeros_before};
use crate::engines::heads::{merge_heads, split_heads};
use crate::engines::params::lazy_param;
use crate::kernels;

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "etc",
    paper: "Ainslie et al. 2020, arXiv 2004.08483",
    time: "O(n (r + g) d)",
    memory: "O(n (r + g))",
    capabilities: Capabilities {
        ..Capabilities::PADDING_ONLY
    },
};

/// Where ETC's global tokens come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EtcGlobal {
    /// One per segment of `segment_len` consecutive positions (the paper's long-input setting).
    Segments,
    /// `n_global` learned tokens.
    Learned,
}

/// Configuration of [`EtcAttention`].
#[derive(Config, Debug)]
pub struct EtcConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// The l2l radius `r`: a long token attends to the positions within `r` of it (the paper:
    /// 84).
    #[config(default = 84)]
    pub radius: usize,
    /// The relative positions' clipping distance `k` (the paper's code: 12).
    #[config(default = 12)]
    pub max_distance: usize,
    /// Where the global tokens come from.
    #[config(default = "EtcGlobal::Segments")]
    pub global: EtcGlobal,
    /// Positions per segment, one global token each (`Segments`).
    #[config(default = 32)]
    pub segment_len: usize,
    /// Learned global tokens (`Learned`).
    #[config(default = 16)]
    pub n_global: usize,
    /// Dropout on the attention weights (default 0: none).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases on the Q, K, V and output projections.
    #[config(default = false)]
    pub bias: bool,
}

impl VariantConfig for EtcConfig {
    variant_glue!(EtcAttention, &[INFO], new(d_model, n_heads), dropout);

    fn check_fields(&self) -> Result<(), AttentionError> {
        let at_least_one = |field: &'static str, value: usize| {
            if value == 0 {
                Err(INFO.field_error(field, "must be at least 1"))
            } else {
                Ok(())
            }
        };
        at_least_one("radius", self.radius)?;
        match self.global {
            EtcGlobal::Segments => at_least_one("segment_len", self.segment_len)?,
            EtcGlobal::Learned => at_least_one("n_global", self.n_global)?,
        }
        if self
            .max_distance
            .checked_mul(2)
            .and_then(|k| k.checked_add(3))
            .is_none()
        {
            return Err(INFO.field_error("max_distance", "is too large"));
        }
        Ok(())
    }

    fn build(&self, device: &Device) -> EtcAttention {
        let d = self.d_model;
        let labels = 2 * self.max_distance + 3;
        // Embeddings drawn as the paper's code initialises them, N(0, 0.02²).
        let normal = move |shape: [usize; 2]| {
            move |device: &Device| Tensor::random(shape, Distribution::Normal(0.0, 0.02), device)
        };
        let n_tokens = match self.global {
            EtcGlobal::Segments => 1,
            EtcGlobal::Learned => self.n_global,
        };
        EtcAttention {
            proj: QkvoProjection::new(d, self.n_heads, self.bias, device),
            relative: lazy_param([labels, d], device, true, normal([labels, d])),
            global_tokens: lazy_param([n_tokens, d], device, true, normal([n_tokens, d])),
            dropout: DropoutConfig::new(self.dropout).init(),
            radius: self.radius,
            max_distance: self.max_distance,
            global: self.global,
            segment_len: self.segment_len,
        }
    }
}

inherent_config_methods!(EtcConfig);

/// Multi-head ETC global-local attention. Create with [`EtcConfig`].
#[derive(Module, Debug)]
pub struct EtcAttention {
    /// Q, K, V and output projections, shared by the global and the long input.
    pub proj: QkvoProjection,
    /// The relative position labels' vectors, `[2k + 3, d_model]` (head h: columns
    /// `h d..(h + 1) d`): distances −k..=k, then "its own segment's global token" and
    /// "another's".
    pub relative: Param<Tensor<2>>,
    /// `Segments`: the global tokens' shared embedding `[1, d_model]`; `Learned`: the global
    /// tokens `[n_global, d_model]`.
    pub global_tokens: Param<Tensor<2>>,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// The l2l radius.
    #[module(skip)]
    pub radius: usize,
    /// The relative positions' clipping distance.
    #[module(skip)]
    pub max_distance: usize,
    /// Where the global tokens come from.
    #[module(skip)]
    pub global: EtcGlobal,
    /// Positions per segment (`Segments`).
    #[module(skip)]
    pub segment_len: usize,
}

projection_shape!(EtcAttention);

impl EtcAttention {
    fn label_own(&self) -> i64 {
        2 * self.max_distance as i64 + 1
    }

    /// The label of a distance `j − i`, clipped to ±k.
    fn label_distance(&self, delta: i64) -> i64 {
        let k = self.max_distance as i64;
        delta.clamp(-k, k) + k
    }

    /// The label between long position `i` and global token `g`: its own segment's or
    /// another's (a learned token: always "own").
    fn label_global(&self, i: usize, g: usize) -> i64 {
        match self.global {
            EtcGlobal::Segments if i / self.segment_len != g => self.label_own() + 1,
            _ => self.label_own(),
        }
    }

    /// `q · a_l / √d` for every label: `q: [batch, heads, n, d]` -> `[batch, heads, n, 2k + 3]`.
    fn label_scores(&self, q: Tensor<4>) -> Tensor<4> {
        let [batch, heads, _, d] = q.dims();
        let labels = self.relative.val().dims()[0];
        let table = self
            .relative
            .val()
            .reshape([1, labels, heads, d])
            .permute([0, 2, 3, 1])
            .expand([batch, heads, d, labels]);
        q.matmul(table).mul_scalar(1.0 / (d as f32).sqrt())
    }

    /// `scores [batch, heads, rows, cols]` plus each pair's label score, the labels
    /// `[rows, cols]` (row-major) read from `by_label` (`[batch, heads, rows, 2k + 3]`).
    fn add_labels(scores: Tensor<4>, by_label: Tensor<4>, labels: Vec<i64>) -> Tensor<4> {
        let cols = scores.dims()[3];
        scores + kernels::gather_shared(by_label, &labels, cols)
    }

    /// The global input `[batch, g, d_model]` and its padding `[batch, g]` (`true` = a segment
    /// wholly of padding), from the long input `x: [batch, n, d_model]`.
    fn global_input(
        &self,
        x: &Tensor<3>,
        key_pad: &Option<Tensor<2, Bool>>,
    ) -> (Tensor<3>, Option<Tensor<2, Bool>>) {
        let [batch, n, d_model] = x.dims();
        let device = x.device();
        match self.global {
            EtcGlobal::Learned => {
                let g = self.global_tokens.val().dims()[0];
                let tokens = self
                    .global_tokens
                    .val()
                    .unsqueeze_dim::<3>(0)
                    .expand([batch, g, d_model]);
                (tokens, None)
            }
            EtcGlobal::Segments => {
                // A segment longer than the sequence is the whole sequence: one global token.
                let s = self.segment_len.min(n.max(1));
                let g = n.div_ceil(s);
                let real = match key_pad {
                    Some(pad) => pad.clone().bool_not().float(),
                    None => Tensor::ones([batch, n], &device),
                };
                let real = zeros_after(real, 1, g * s - n).reshape([batch, g, s, 1]);
                let x = zeros_after(x.clone(), 1, g * s - n).reshape([batch, g, s, d_model]);
                let count = real.clone().sum_dim(2);
                let sum = (x * real).sum_dim(2);
                let mean = (sum / count.clone().clamp_min(1.0)).reshape([batch, g, d_model]);
                let embedding = self.global_tokens.val().unsqueeze_dim::<3>(0);
                let pad = key_pad
                    .as_ref()
                    .map(|_| count.reshape([batch, g]).equal_elem(0.0));
                (mean + embedding, pad)
            }
        }
    }

    /// g2g and g2l: the global tokens' attention over themselves and the long input, through the
    /// output projection: `[batch, g, d_model]`.
    fn global_step(
        &self,
        global: Tensor<3>,
        x: Tensor<3>,
        key_pad: &Option<Tensor<2, Bool>>,
        global_pad: &Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        let heads = self.proj.n_heads;
        let [batch, g, _] = global.dims();
        let n = x.dims()[1];
        let project = |layer: &burn::nn::Linear, x: Tensor<3>| split_heads(layer.forward(x), heads);
        let q = project(&self.proj.query, global.clone());
        let keys = Tensor::cat(vec![global.clone(), x.clone()], 1);
        let k = project(&self.proj.key, keys.clone());
        let v = project(&self.proj.value, keys);
        let d = q.dims()[3];
        let scores = q
            .clone()
            .matmul(k.swap_dims(2, 3))
            .mul_scalar(1.0 / (d as f32).sqrt());
        // Row i (a global token): the other global tokens by distance, then the long positions.
        let labels: Vec<i64> = (0..g)
            .flat_map(|i| {
                let to_global = (0..g).map(move |j| self.label_distance(j as i64 - i as i64));
                to_global.chain((0..n).map(move |p| self.label_global(p, i)))
            })
            .collect();
        let mut scores = Self::add_labels(scores, self.label_scores(q), labels);
        let device = scores.device();
        let pad = Tensor::cat(
            vec![
                global_pad
                    .clone()
                    .unwrap_or_else(|| Tensor::<2, Bool>::full([batch, g], false, &device)),
                key_pad
                    .clone()
                    .unwrap_or_else(|| Tensor::<2, Bool>::full([batch, n], false, &device)),
            ],
            1,
        );
        scores = scores.mask_fill(pad.reshape([batch, 1, 1, g + n]), MASK_FILL);
        let weights = dropout(&self.dropout, kernels::softmax(scores));
        self.proj.output.forward(merge_heads(weights.matmul(v)))
    }

    /// l2g and l2l: each long token over the global tokens and the positions within `r` of it,
    /// one softmax, in blocks of `r` queries over three blocks of keys (one when `r` spans the
    /// sequence).
    fn long_step(
        &self,
        x: Tensor<3>,
        global: Tensor<3>,
        key_pad: &Option<Tensor<2, Bool>>,
        global_pad: &Option<Tensor<2, Bool>>,
    ) -> Tensor<3> {
        let heads = self.proj.n_heads;
        let [batch, n, _] = x.dims();
        let g = global.dims()[1];
        let device = x.device();
        let project = |layer: &burn::nn::Linear, x: Tensor<3>| split_heads(layer.forward(x), heads);
        let (q, k, v) = self.proj.qkv(x);
        let (kg, vg) = (
            project(&self.proj.key, global.clone()),
            project(&self.proj.value, global),
        );
        let d = q.dims()[3];
        let scale = 1.0 / (d as f32).sqrt();
        let b = self.radius.min(n);
        let nb = n.div_ceil(b);
        let np = nb * b;
        let q = zeros_after(q, 2, np - n);
        let by_label = self.label_scores(q.clone());
        // l2g: [batch, heads, np, g].
        let labels: Vec<i64> = (0..np)
            .flat_map(|i| (0..g).map(move |j| (i, j)))
            .map(|(i, j)| self.label_global(i, j))
            .collect();
        let mut to_global = Self::add_labels(
            q.clone().matmul(kg.swap_dims(2, 3)).mul_scalar(scale),
            by_label.clone(),
            labels,
        );
        if let Some(pad) = global_pad {
            to_global = to_global.mask_fill(pad.clone().reshape([batch, 1, 1, g]), MASK_FILL);
        }
        // l2l: each block of queries over its block and, when there are several, the block on
        // each side (the keys framed by a block of zeros at both ends).
        let side = usize::from(nb > 1);
        let blocks_seen = 1 + 2 * side;
        let framed = |x: Tensor<4>| zeros_after(zeros_before(x, 2, side * b), 2, np - n + side * b);
        let windows = |x: Tensor<4>| {
            let blocks = x.reshape([batch, heads, nb + 2 * side, b, d]);
            Tensor::cat(
                (0..blocks_seen)
                    .map(|o| blocks.clone().slice(s![.., .., o..o + nb]))
                    .collect(),
                3,
            )
        };
        let width = blocks_seen * b;
        let (kt, vt) = (windows(framed(k)), windows(framed(v)));
        let qb = q.reshape([batch, heads, nb, b, d]);
        let local = qb.matmul(kt.swap_dims(3, 4)).mul_scalar(scale);
        // Query ρ of a block over key σ of its window: distance σ − side · b − ρ.
        let (mut far, mut labels) = (Vec::with_capacity(width * b), Vec::with_capacity(width * b));
        for rho in 0..b as i64 {
            for sigma in 0..width as i64 {
                let delta = sigma - (side * b) as i64 - rho;
                far.push(delta.unsigned_abs() as usize > self.radius);
                labels.push(self.label_distance(delta));
            }
        }
        let local = local
            + kernels::gather_shared(
                by_label.reshape([batch, heads, nb, b, 2 * self.max_distance + 3]),
                &labels,
                width,
            );
        let far = Tensor::<5, Bool>::from_data(TensorData::new(far, [1, 1, 1, b, width]), &device);
        // Keys outside the sequence or padded, per window.
        let framed_len = np + 2 * side * b;
        let outside: Vec<bool> = (0..framed_len)
            .map(|j| j < side * b || j - side * b >= n)
            .collect();
        let mut missing =
            Tensor::<2, Bool>::from_data(TensorData::new(outside, [1, framed_len]), &device)
                .expand([batch, framed_len]);
        if let Some(pad) = key_pad {
            missing = missing.bool_or(flags_framed(pad.clone(), side * b, np - n + side * b));
        }
        let missing = missing.reshape([batch, nb + 2 * side, b]);
        let missing = Tensor::cat(
            (0..blocks_seen)
                .map(|o| missing.clone().slice(s![.., o..o + nb]))
                .collect(),
            2,
        )
        .reshape([batch, 1, nb, 1, width]);
        let local = local
            .mask_fill(far, MASK_FILL)
            .mask_fill(missing, MASK_FILL);
        let scores = Tensor::cat(vec![to_global.reshape([batch, heads, nb, b, g]), local], 4);
        let weights = dropout(&self.dropout, kernels::softmax(scores));
        let from_global = weights
            .clone()
            .slice(s![.., .., .., .., 0..g])
            .reshape([batch, heads, np, g])
            .matmul(vg);
        let from_local = weights
            .slice(s![.., .., .., .., g..])
            .matmul(vt)
            .reshape([batch, heads, np, d]);
        self.proj
            .out((from_global + from_local).slice(s![.., .., 0..n]))
    }
}

impl AttentionModule for EtcAttention {
    variant_facts!(INFO);

    rotary_refused!("it scores relative positions itself (ETC's relative position labels)");

    fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        input.check_shapes(self.name(), self.d_model())?;
        let masks = input.head_masks();
        let n = input.key_len();
        check_capabilities(&INFO, input.query_len(), n, masks.causal)?;
        refuse_attention_mask(&INFO, &masks)?;
        let x = input.query().clone();
        let (global, global_pad) = self.global_input(&x, &masks.key_pad);
        let global = self.global_step(global, x.clone(), &masks.key_pad, &global_pad);
        Ok(self.long_step(x, global, &masks.key_pad, &global_pad))
    }
}
