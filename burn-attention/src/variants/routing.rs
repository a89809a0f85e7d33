//! Routing Transformer attention: queries and keys routed to learned centroids by online
//! k-means, attention within each centroid's cluster, beside local attention.
//!
//! Roy, Saffar, Vaswani & Grangier 2021, "Efficient Content-Based Sparse Attention with Routing
//! Transformers", arXiv 2003.05997. Per routing head, the queries and keys are normalised
//! (LayerNorm without scale or bias) and scored against `k` centroids `μ`; each centroid gathers
//! its `w` highest-scoring queries and its `w` highest-scoring keys, `w = ⌈L/k⌉` for a sequence
//! of `L` real positions (the paper's balanced top-w routing, so that every cluster costs the
//! same), and the queries attend, `softmax(q kᵀ/√d) v` with the unnormalised projections, to
//! their cluster's keys. A query gathered by several centroids takes the mean of its clusters'
//! outputs; one gathered by none outputs zero in that head, as the paper's scatter leaves it.
//! The paper combines routing with local attention: the first
//! [`local_heads`](RoutingConfig::local_heads) heads (half, by default) attend to the `window`
//! positions on each side of the query instead.
//!
//! The centroids are not trained by gradient: a training forward pass (on an autodiff device)
//! moves each, by an exponential moving average with `decay` λ, towards the mean of the
//! normalised queries and keys (real positions, over the batch) whose nearest centroid it is,
//! `μ ← λ μ + (1 − λ) mean` (the paper's mini-batch k-means; a centroid nothing is assigned to
//! keeps its place). They live in a [`RunningState`], saved with the module's record like a
//! batch norm's statistics; evaluation and inference read them unchanged.
//!
//! Cost per head: O(n w d) for the routing heads (k clusters of w) and O(n window d) for the
//! local ones, plus the `n k` centroid scores and the top-w selection. Masks: padding (padded
//! positions are never routed and never attended). No causal form: which keys are a centroid's
//! `w` highest depends on every position, later ones included, so the paper's causal routing
//! (a position mask inside each cluster) still lets later positions decide what an earlier one
//! sees (Reformer's case too); no cross-attention, attention mask or weights.
//!
//! Rotary positions: the clusters are chosen from the queries and keys as they are (content,
//! not position, routes a query), and the scores within each cluster and window are those of
//! the rotated queries and keys, so that they depend on positions only through their
//! differences.

use crate::variants::prelude::*;
use burn::module::RunningState;
use burn::nn::{Dropout, DropoutConfig};
use burn::tensor::{Distribution, IndexingUpdateOp};

use crate::engines::rotary::rotate_queries_keys;

use crate::kernels;
use crate::kernels::key_slots::KeySlots;

use crate::engines::gathered_softmax::{gathered_attention, padding_flags};

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "routing",
    paper: "Roy et al. 2021, arXiv 2003.05997",
    time: "O(n (w + r) d)",
    memory: "O(n (w + r))",
    capabilities: Capabilities {
        per_head_form: true,
        rotary: true,
        ..Capabilities::PADDING_ONLY
    },
};

/// The variance floor of the routing's normalisation (LayerNorm's usual ε).
const NORM_EPS: f32 = 1e-5;

/// Configuration of [`RoutingAttention`].
#[derive(Config, Debug)]
pub struct RoutingConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Centroids `k` per routing head (32: the paper picks `k` near `√n`, for which its cost
    /// `O(n^1.5 d)` is least; 32 = √1024).
    #[config(default = 32)]
    pub n_clusters: usize,
    /// The centroids' moving-average decay λ (0.999).
    #[config(default = 0.999)]
    pub decay: f64,
    /// Local heads: positions seen on each side of the query (128).
    #[config(default = 128)]
    pub window: usize,
    /// Heads that attend locally, the first ones (`None`: half of them, rounded down); at
    /// least one head routes.
    #[config(default = "None")]
    pub local_heads: Option<usize>,
    /// Dropout on the attention weights (default 0: none).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases on the Q, K, V and output projections.
    #[config(default = false)]
    pub bias: bool,
}

impl RoutingConfig {
    /// The heads that attend locally.
    pub fn local_heads(&self) -> usize {
        self.local_heads.unwrap_or(self.n_heads / 2)
    }
}

impl VariantConfig for RoutingConfig {
    variant_glue!(RoutingAttention, &[INFO], new(d_model, n_heads), dropout);

    /// Three clusters (so that short sequences fill several) and windows of 2 for the local heads.
    fn small(self) -> Self {
        self.with_n_clusters(3).with_window(2)
    }

    /// The variant's input check, and more clusters than the longest sequence has positions
    /// refused: k-means cannot give each centroid a position to gather, and the centroids
    /// (`routing heads × n_clusters × d_head`, allocated when the module is built) would be
    /// sized by the count asked for, not by the data. (The forward pass still takes a batch
    /// shorter than `n_clusters`.)
    fn check_input(&self, n_q: usize, n_k: usize, causal: bool) -> Result<(), AttentionError> {
        let longest = n_q.max(n_k);
        if self.n_clusters > longest {
            return Err(INFO.field_error(
                "n_clusters",
                format!(
                    "is {}, more clusters than the {longest} positions of the sequence",
                    self.n_clusters
                ),
            ));
        }
        check_capabilities(&INFO, n_q, n_k, causal)
    }

    /// The centroids: moved by moving averages, never by the optimiser.
    fn frozen_params(&self) -> Option<usize> {
        (self.n_heads.checked_sub(self.local_heads())?)
            .checked_mul(self.n_clusters)?
            .checked_mul(self.d_model / self.n_heads)
    }

    fn check_fields(&self) -> Result<(), AttentionError> {
        let field = |name, message: String| Err(INFO.field_error(name, message));
        check_at_least_one(INFO.name, "n_clusters", self.n_clusters)?;
        if !(self.decay.is_finite() && (0.0..=1.0).contains(&self.decay)) {
            return field(
                "decay",
                format!("must be between 0 and 1, got {}", self.decay),
            );
        }
        if self.local_heads() >= self.n_heads {
            return field(
                "local_heads",
                format!(
                    "must leave a routing head: {} of {} heads",
                    self.local_heads(),
                    self.n_heads
                ),
            );
        }
        if self.window.checked_mul(2).is_none() {
            return field("window", "is too large".into());
        }
        Ok(())
    }

    fn build(&self, device: &Device) -> RoutingAttention {
        let routing_heads = self.n_heads - self.local_heads();
        let d = self.d_model / self.n_heads;
        // Normalised queries and keys have norm about √d, as standard normal vectors of d
        // entries have.
        let centroids = Tensor::random(
            [routing_heads, self.n_clusters, d],
            Distribution::Normal(0.0, 1.0),
            device,
        );
        RoutingAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            centroids: RunningState::new(centroids),
            dropout: DropoutConfig::new(self.dropout).init(),
            decay: self.decay,
            window: self.window,
            local_heads: self.local_heads(),
        }
    }
}

inherent_config_methods!(RoutingConfig);

/// Multi-head routing attention. Create with [`RoutingConfig`].
#[derive(Module, Debug)]
pub struct RoutingAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
    /// The centroids, `[routing heads, k, d_head]`, moved by the training forward passes.
    pub centroids: RunningState<Tensor<3>>,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// The centroids' moving-average decay.
    #[module(skip)]
    pub decay: f64,
    /// Local heads: positions seen on each side.
    #[module(skip)]
    pub window: usize,
    /// Heads that attend locally (the first ones).
    #[module(skip)]
    pub local_heads: usize,
}

projection_shape!(RoutingAttention);

/// `x` normalised over its last dimension, without scale or bias.
fn normalized(x: Tensor<4>) -> Tensor<4> {
    let mean = x.clone().mean_dim(3);
    let centred = x - mean;
    let var = centred.clone().powi_scalar(2).mean_dim(3);
    centred.div(var.add_scalar(NORM_EPS).sqrt())
}

/// The `w` positions of highest score in each row of `scores` (rows of `n`, row-major), best
/// first, ties to the earlier position (a stable descending sort's first `w`), padded positions
/// (`padding`, one row of flags per `rows_per_sequence` rows) never taken: `w` positions a row,
/// the slots past a row's real positions holding position 0. One pass a row over a sorted buffer
/// of `w`, which a position enters only when it beats the buffer's last: about `w ln(n / w)`
/// insertions in a row of random order, where a full sort would cost `n log n` comparisons.
fn top_positions(
    scores: &[f32],
    n: usize,
    w: usize,
    padding: &[Vec<bool>],
    rows_per_sequence: usize,
) -> Vec<usize> {
    let mut out = Vec::with_capacity(scores.len() / n.max(1) * w);
    let mut best: Vec<(f32, usize)> = Vec::with_capacity(w + 1);
    for (row, values) in scores.chunks_exact(n).enumerate() {
        let pad = &padding[row / rows_per_sequence];
        best.clear();
        for (j, &value) in values.iter().enumerate() {
            if pad[j] || (best.len() == w && value.total_cmp(&best[w - 1].0).is_le()) {
                continue;
            }
            // After every entry at least as high: ties keep the earlier position ahead.
            let at = best.partition_point(|&(kept, _)| kept.total_cmp(&value).is_ge());
            best.insert(at, (value, j));
            best.truncate(w);
        }
        out.extend(best.iter().map(|&(_, j)| j));
        out.extend(std::iter::repeat_n(0, w - best.len()));
    }
    out
}

impl RoutingAttention {
    /// The routing heads: `q`, `k`, `v` `[batch, heads, n, d]`, `padding` each sequence's
    /// padding flags, `positions` the rotary positions (the clusters chosen before rotating, the
    /// scores rotated). Moves the centroids when `train`.
    ///
    /// The clusters are chosen on the host from the centroid scores; each cluster's `w` queries
    /// are gathered into a block that attends, through
    /// [`gathered_attention`](crate::engines::gathered_softmax::gathered_attention) (a fused
    /// kernel on `flex`), to its `w` keys read in place; the blocks' outputs are added back at
    /// their queries' positions and divided by the number of clusters that gathered each.
    fn routed(
        &self,
        (q, k, v): (Tensor<4>, Tensor<4>, Tensor<4>),
        pad: &Option<Tensor<2, Bool>>,
        positions: &Option<Tensor<2>>,
        padding: &[Vec<bool>],
        train: bool,
    ) -> Tensor<4> {
        let [batch, heads, n, d] = q.dims();
        let device = q.device();
        // Synchronised: the last training pass's update applied (`value` may lag one behind).
        let centroids = self.centroids.value_sync().to_device(&device);
        let clusters = centroids.dims()[1];
        let (qn, kn) = (normalized(q.clone()), normalized(k.clone()));
        // Each centroid's scores against the positions, `[batch, heads, clusters, n]`.
        let per_centroid = |x: &Tensor<4>| {
            centroids
                .clone()
                .unsqueeze_dim::<4>(0)
                .matmul(x.clone().detach().swap_dims(2, 3))
        };
        let (q_by_centroid, k_by_centroid) = (per_centroid(&qn), per_centroid(&kn));
        if train {
            self.move_centroids(centroids, [qn, kn], [&q_by_centroid, &k_by_centroid], pad);
        }
        // w per sequence, the widest for the tensors; slots past a sequence's own w are off.
        let widths: Vec<usize> = padding
            .iter()
            .map(|row| {
                row.iter()
                    .filter(|&&p| !p)
                    .count()
                    .div_ceil(clusters)
                    .max(1)
            })
            .collect();
        let w = widths.iter().copied().max().unwrap_or(1).min(n);
        let chosen = |by_centroid: Tensor<4>| {
            let scores: Vec<f32> = by_centroid.into_data().iter::<f32>().collect();
            top_positions(&scores, n, w, padding, heads * clusters)
        };
        let (q_index, k_index) = (chosen(q_by_centroid), chosen(k_by_centroid));

        // Block `c` of group `(b, h)` holds cluster c's queries and scores its keys.
        let mut slots = KeySlots::masked([batch, heads], clusters, w, w);
        // Where each block row's output goes in `[batch · heads · n]`, and how many clusters
        // gathered each position.
        let mut rows = Vec::with_capacity(q_index.len());
        let mut counts = vec![0.0f32; batch * heads * n];
        for (group, (queries, keys)) in q_index
            .chunks_exact(clusters * w)
            .zip(k_index.chunks_exact(clusters * w))
            .enumerate()
        {
            let wb = widths[group / heads];
            for c in 0..clusters {
                for slot in 0..wb {
                    slots.set(group, c, slot, keys[c * w + slot], |_| true);
                    counts[group * n + queries[c * w + slot]] += 1.0;
                }
            }
            rows.extend(queries.iter().map(|&i| group * n + i));
        }
        let (q, k) = rotate_queries_keys(q, k, positions);
        let q_blocks = kernels::select_rows(q.reshape([batch * heads * n, d]), 0, &rows).reshape([
            batch,
            heads,
            clusters * w,
            d,
        ]);
        let out = gathered_attention(
            q_blocks,
            k,
            v,
            slots,
            1.0 / (d as f32).sqrt(),
            Some(&self.dropout),
        )
        .out;
        // Rows past a sequence's own w carry no query: their outputs are dropped.
        let keep: Vec<f32> = widths
            .iter()
            .flat_map(|&wb| (0..w).map(move |slot| if slot < wb { 1.0 } else { 0.0 }))
            .collect();
        let keep = Tensor::<1>::from_data(TensorData::new(keep, [batch * w]), &device)
            .reshape([batch, 1, 1, w, 1]);
        let out = (out.reshape([batch, heads, clusters, w, d]) * keep).reshape([
            batch,
            heads,
            clusters * w,
            d,
        ]);
        let index: Vec<i64> = q_index.iter().map(|&i| i as i64).collect();
        let index = Tensor::<1, Int>::from_data(TensorData::new(index, [rows.len()]), &device)
            .reshape([batch, heads, clusters * w, 1])
            .expand([batch, heads, clusters * w, d]);
        let sums = Tensor::<4>::zeros([batch, heads, n, d], &device).scatter(
            2,
            index,
            out,
            IndexingUpdateOp::Add,
        );
        let scale: Vec<f32> = counts.iter().map(|&c| 1.0 / c.max(1.0)).collect();
        sums * Tensor::<1>::from_data(TensorData::new(scale, [batch * heads * n]), &device)
            .reshape([batch, heads, n, 1])
    }

    /// The k-means step: each centroid moves towards the mean of the normalised queries and
    /// keys (`xs`, real positions) whose best score (`scores`, `[batch, heads, clusters, n]`)
    /// is its own.
    fn move_centroids(
        &self,
        centroids: Tensor<3>,
        xs: [Tensor<4>; 2],
        scores: [&Tensor<4>; 2],
        pad: &Option<Tensor<2, Bool>>,
    ) {
        let [heads, clusters, d] = centroids.dims();
        let device = centroids.device();
        let ids =
            Tensor::<1, Int>::arange(0..clusters as i64, &device).reshape([1, 1, clusters, 1]);
        let mut sums = Tensor::<3>::zeros([heads, clusters, d], &device);
        let mut counts = Tensor::<3>::zeros([heads, clusters, 1], &device);
        for (x, score) in xs.into_iter().zip(scores) {
            let [batch, _, n, _] = x.dims();
            // `[batch, heads, clusters, n]`: 1 where the position's best centroid is this one.
            let mut assigned = score
                .clone()
                .argmax(2)
                .equal(ids.clone().expand([batch, heads, clusters, n]))
                .float();
            if let Some(pad) = pad {
                assigned = assigned.mask_fill(pad.clone().reshape([batch, 1, 1, n]), 0.0);
            }
            let assigned = assigned.detach();
            sums = sums
                + assigned
                    .clone()
                    .matmul(x.detach())
                    .sum_dim(0)
                    .reshape([heads, clusters, d]);
            counts = counts + assigned.sum_dim(3).sum_dim(0).reshape([heads, clusters, 1]);
        }
        let means = sums.div(counts.clone().clamp_min(1.0));
        let moved = centroids
            .clone()
            .mul_scalar(self.decay)
            .add(means.mul_scalar(1.0 - self.decay));
        let untouched = counts.equal_elem(0.0).expand([heads, clusters, d]);
        self.centroids
            .update(moved.mask_where(untouched, centroids).detach());
    }
}

impl AttentionModule for RoutingAttention {
    variant_facts!(INFO);

    forward_through_projections!();

    rotary_on_projections!();

    /// The first `local_heads` heads attend to their window, the others to their clusters
    /// (moving the centroids on an autodiff device). With rotary positions in `masks`, the
    /// scores are those of the rotated queries and keys, the clusters chosen before rotating.
    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        let [batch, heads, n, d] = q.dims();
        check_head_input(&INFO, &q, &k, &masks)?;
        let padding = padding_flags(&masks.key_pad, batch, n);
        let train = q.device().is_autodiff();
        let (hl, hr) = (self.local_heads, heads - self.local_heads);
        let split =
            |x: &Tensor<4>, from: usize, count: usize| x.clone().slice(s![.., from..from + count]);
        let routed = self.routed(
            (split(&q, hl, hr), split(&k, hl, hr), split(&v, hl, hr)),
            &masks.key_pad,
            &masks.positions,
            &padding,
            train,
        );
        if hl == 0 {
            return Ok(routed);
        }
        let slots = KeySlots::band(n, self.window, [self.window, self.window], &[], &padding);
        let (q_local, k_local) =
            rotate_queries_keys(split(&q, 0, hl), split(&k, 0, hl), &masks.positions);
        let local = gathered_attention(
            q_local,
            k_local,
            split(&v, 0, hl),
            slots,
            1.0 / (d as f32).sqrt(),
            Some(&self.dropout),
        )
        .out;
        Ok(Tensor::cat(vec![local, routed], 1))
    }
}
