//! Nyströmformer: softmax attention through a Nyström approximation on landmarks.
//!
//! Xiong et al. 2021, "Nyströmformer: A Nyström-Based Algorithm for Approximating
//! Self-Attention", arXiv 2102.03902.
//! `O = softmax(Q K̃ᵀ) · pinv(softmax(Q̃ K̃ᵀ)) · (softmax(Q̃ Kᵀ + M) V)`, queries and keys scaled by
//! `d^{-1/4}`; the landmarks `Q̃, K̃: [m, d]` are the means of `m` consecutive segments of the
//! real (unpadded) positions; `pinv` is the iterative Moore-Penrose approximation
//! `Z ← ¼ Z (13I − AZ(15I − AZ(7I − AZ)))` from `Z₀ = Aᵀ / (max row-sum · max column-sum)`.
//! Optional depthwise convolution of `V` along the sequence (one kernel per head) added to the
//! output (the paper's skip connection, kernel 33 or 35).
//!
//! Choices made here, where the paper's code differs:
//! - Segments split each sequence's own real positions, in order, wherever padding sits (segment
//!   `s` covers the real positions of rank `⌊sL/m⌋ .. max(⌊(s+1)L/m⌋, ⌊sL/m⌋ + 1)` among the
//!   `L` real ones), so padding never moves a landmark, at the start, inside or at the end, and
//!   no length has to be a multiple of `m`. When `L` is a multiple of `m` these are exactly the paper's
//!   landmarks; when `L < m` some landmarks repeat a single position.
//! - The scale of `Z₀` is taken per matrix (per example and head), not over the whole batch, so
//!   one example cannot change another's output.
//!
//! The products are taken as `K₁ (pinv(K₂) (K₃ V))`: `K₃ V` and `K₁ Z` are softmax attentions
//! (over keys `K` and over the landmarks), so on `flex` they run on the fused kernel and the
//! `[n, m]` and `[m, n]` weights are never stored, in the forward or the backward pass.
//!
//! The implied weights of a query do not always sum to one: `softmax(Q̃ Kᵀ)` and
//! `softmax(Q K̃ᵀ)` have rows that do, but `pinv(softmax(Q̃ K̃ᵀ))` maps the vector of ones to
//! itself only where six iterations invert the landmark kernel. That kernel is near-singular
//! when one landmark key dominates every row, as larger queries and keys make common: in float64,
//! the paper's formula with 6 iterations gave row sums off by up to 1.5% at query and key norms
//! of √d and up to 31% at 3√d (m = 4, n = 40, d = 8, 20 draws; 6.4% with m = 64). A constant `v`
//! therefore does not come back unchanged, as it does for the other non-Linformer variants;
//! this is the method, which this module reproduces (checked against the float64 formula).
//!
//! Cost: O(n m d + m³) time, O(n m + m²) memory per head (O(n d + m²) on `flex`). Masks:
//! padding. Causal: not defined (landmarks average over the whole sequence), so asking for it is
//! an error. Cross-attention: query landmarks average the real queries, key landmarks the real
//! keys; the convolution skip, which adds values at the queries' positions, is refused there.

use crate::variants::prelude::*;
use burn::nn::PaddingConfig2d;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::tensor::activation::softmax;

use crate::contract::input::zero_padded;
use crate::engines::softmax::exact_softmax_attention;

use crate::contract::variant::check_iterations;

const NAME: &str = "nystrom";

/// The registry entry. Its weights do not always sum to one (see the module docs).
pub const INFO: VariantInfo = VariantInfo {
    name: NAME,
    paper: "Xiong et al. 2021, arXiv 2102.03902",
    time: "O(n m d + m³)",
    memory: "O(n m + m²); O(n d + m²) fused",
    capabilities: Capabilities {
        cross_attention: true,
        per_head_form: true,
        ..Capabilities::PADDING_ONLY
    },
};

/// Configuration of [`NystromAttention`].
#[derive(Config, Debug)]
pub struct NystromConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Landmarks `m`.
    #[config(default = 64)]
    pub n_landmarks: usize,
    /// Iterations of the pseudo-inverse (the paper: 6).
    #[config(default = 6)]
    pub pinv_iterations: usize,
    /// Kernel size of the depthwise convolution skip on `V` (odd; the paper's LRA runs use 35,
    /// lucidrains' package 33); `None` turns it off.
    #[config(default = "None")]
    pub conv_kernel: Option<usize>,
    /// Biases on the Q, K, V and output projections.
    #[config(default = false)]
    pub bias: bool,
}

impl VariantConfig for NystromConfig {
    variant_glue!(NystromAttention, &[INFO], new(d_model, n_heads));

    /// 4 landmarks.
    fn small(self) -> Self {
        self.with_n_landmarks(4)
    }

    /// The variant's input check, and more landmarks than the longest sequence has positions
    /// refused: a configuration checked against its longest input (as the LRA harness checks
    /// it) cannot ask for segment means of nothing, sized by the count asked for. (The forward
    /// pass still takes a batch shorter than `n_landmarks`.)
    fn check_input(&self, n_q: usize, n_k: usize, causal: bool) -> Result<(), AttentionError> {
        let longest = n_q.max(n_k);
        if self.n_landmarks > longest {
            return Err(AttentionError::field(
                NAME,
                "n_landmarks",
                format!(
                    "is {}, more landmarks than the {longest} positions of the sequence",
                    self.n_landmarks
                ),
            ));
        }
        check_input(n_q, n_k, causal, self.conv_kernel.is_some())
    }

    fn check_fields(&self) -> Result<(), AttentionError> {
        check_at_least_one(NAME, "n_landmarks", self.n_landmarks)?;
        check_iterations(NAME, "pinv_iterations", self.pinv_iterations)?;
        if let Some(kernel) = self.conv_kernel
            && kernel % 2 == 0
        {
            return Err(AttentionError::field(
                NAME,
                "conv_kernel",
                format!("must be odd (the output keeps the input's length), got {kernel}"),
            ));
        }
        Ok(())
    }

    fn build(&self, device: &Device) -> NystromAttention {
        let h = self.n_heads;
        let conv = self.conv_kernel.map(|kernel| {
            Conv2dConfig::new([h, h], [kernel, 1])
                .with_groups(h)
                .with_padding(PaddingConfig2d::Explicit(kernel / 2, 0, kernel / 2, 0))
                .with_bias(false)
                .init(device)
        });
        NystromAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            conv,
            n_landmarks: self.n_landmarks,
            pinv_iterations: self.pinv_iterations,
        }
    }
}

inherent_config_methods!(NystromConfig);

/// Multi-head Nyström attention. Create with [`NystromConfig`].
#[derive(Module, Debug)]
pub struct NystromAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
    /// Depthwise convolution skip on `V`: `[heads, 1, kernel, 1]`, if configured.
    pub conv: Option<Conv2d>,
    /// Landmarks `m`.
    pub n_landmarks: usize,
    /// Iterations of the pseudo-inverse.
    pub pinv_iterations: usize,
}

projection_shape!(NystromAttention);

impl AttentionModule for NystromAttention {
    variant_facts!(INFO);

    rotary_refused!(
        "its landmarks are means of segments of queries and keys, which have no single position"
    );

    fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        input.check_shapes(self.name(), self.d_model())?;
        if input.is_cross() && self.conv.is_some() {
            return Err(conv_refusal());
        }
        self.proj
            .apply(input, |q, k, v, masks| self.attend(q, k, v, masks))
    }

    /// The attention on per-head tensors, with the convolution skip if configured.
    fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, masks: HeadMasks) -> PerHeadResult {
        check_input(q.dims()[2], k.dims()[2], masks.causal, self.conv.is_some())?;
        check_attention_mask(&INFO, &masks, &q, k.dims()[2])?;
        let mut o = nystrom_cross_attention(
            q,
            k,
            v.clone(),
            masks.clone(),
            self.n_landmarks,
            self.pinv_iterations,
        );
        if let Some(conv) = &self.conv {
            // Padded values are zeroed first: the convolution's own zero padding then makes the
            // output at real positions independent of how much padding follows.
            o = o + conv.forward(zero_padded(v, &masks.key_pad));
        }
        Ok(o)
    }
}

/// Refuses causal masking (landmarks average over the whole sequence), and the convolution skip
/// between sequences of different lengths.
fn check_input(n_q: usize, n_k: usize, causal: bool, conv: bool) -> Result<(), AttentionError> {
    if causal {
        return Err(AttentionError::unsupported(
            NAME,
            "causal masking: landmarks average over the whole sequence",
        ));
    }
    if conv && n_q != n_k {
        return Err(conv_refusal());
    }
    check_capabilities(&INFO, n_q, n_k, causal)
}

fn conv_refusal() -> AttentionError {
    AttentionError::unsupported(
        NAME,
        "cross-attention with the convolution skip (`conv_kernel`): the skip adds the values \
         at the queries' positions; set `conv_kernel` to none",
    )
}

/// The `[batch, m, n]` matrix whose row `s` averages segment `s` of each sequence's real
/// positions (see the module docs). Segments are taken over the real positions in order, wherever
/// the padding sits (at the start, inside or at the end): a real position's place is its rank
/// among the real positions, so padding never moves a landmark.
pub fn landmark_segments(
    mask_pad: Option<Tensor<2, Bool>>,
    batch: usize,
    n: usize,
    m: usize,
    device: &Device,
) -> Tensor<3> {
    // `rank`: how many real positions come before each position; `real`: 1 at a real position.
    let (lengths, rank, real): (Tensor<3>, Tensor<3>, Option<Tensor<3>>) = match mask_pad {
        Some(mask) => {
            let real = mask.bool_not().float(); // [batch, n]
            let lengths = real.clone().sum_dim(1).reshape([batch, 1, 1]);
            let rank = (real.clone().cumsum(1) - real.clone()).reshape([batch, 1, n]);
            (lengths, rank, Some(real.reshape([batch, 1, n])))
        }
        None => (
            Tensor::full([batch, 1, 1], n as f32, device),
            Tensor::<1, Int>::arange(0..n as i64, device)
                .float()
                .reshape([1, 1, n])
                .expand([batch, 1, n]),
            None,
        ),
    };
    let s = Tensor::<1, Int>::arange(0..m as i64, device)
        .float()
        .reshape([1, m, 1]);
    // s·L and (s+1)·L are integers below 2²⁴, exact in f32 (as are the ranks, counts of ones);
    // the division is correctly rounded, so the floor is exact.
    let start = s.clone().mul(lengths.clone()).div_scalar(m as f32).floor();
    let end = s
        .add_scalar(1.0)
        .mul(lengths)
        .div_scalar(m as f32)
        .floor()
        .max_pair(start.clone().add_scalar(1.0));
    let count = end.clone() - start.clone();
    let rank = rank.expand([batch, m, n]);
    let inside = rank
        .clone()
        .greater_equal(start.expand([batch, m, n]))
        .bool_and(rank.lower(end.expand([batch, m, n])));
    let weights = inside.float().div(count);
    match real {
        // A padded position shares its rank with the next real one: it takes no part.
        Some(real) => weights.mul(real.expand([batch, m, n])),
        None => weights,
    }
}

/// The iterative Moore-Penrose pseudo-inverse of each `[m, m]` matrix of `a: [.., .., m, m]`
/// (Razavi et al. 2014, as the Nyströmformer paper), with `Z₀` scaled per matrix.
pub fn iterative_pinv(a: Tensor<4>, iterations: usize) -> Tensor<4> {
    let [b, h, m, _] = a.dims();
    let device = a.device();
    let eye = Tensor::<2>::eye(m, &device)
        .reshape([1, 1, m, m])
        .expand([b, h, m, m]);
    let max_col = a.clone().abs().sum_dim(2).max_dim(3); // [b, h, 1, 1]
    let max_row = a.clone().abs().sum_dim(3).max_dim(2); // [b, h, 1, 1]
    let mut z = a.clone().swap_dims(2, 3).div(max_col.mul(max_row));
    for _ in 0..iterations {
        let az = a.clone().matmul(z.clone());
        let inner = eye.clone().mul_scalar(7.0) - az.clone();
        let inner = eye.clone().mul_scalar(15.0) - az.clone().matmul(inner);
        let inner = eye.clone().mul_scalar(13.0) - az.matmul(inner);
        z = z.matmul(inner).mul_scalar(0.25);
    }
    z
}

/// Nyström attention on per-head tensors, the functional form of [`NystromAttention`] (without
/// its convolution skip), for self-attention: `mask_pad` masks queries and keys alike.
///
/// # Shapes
/// - `q`, `k`, `v`: `[batch, heads, n, d]`
/// - `mask_pad`: `[batch, n]`, `true` = padding
/// - output: `[batch, heads, n, d]`
pub fn nystrom_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask_pad: Option<Tensor<2, Bool>>,
    n_landmarks: usize,
    pinv_iterations: usize,
) -> Tensor<4> {
    let masks = HeadMasks::new(mask_pad, false);
    nystrom_cross_attention(q, k, v, masks, n_landmarks, pinv_iterations)
}

/// Nyström attention with queries and keys of their own lengths and padding: query landmarks
/// average segments of each query sequence's real positions, key landmarks of each key
/// sequence's.
///
/// # Shapes
/// - `q`: `[batch, heads, n_q, d]`; `k`, `v`: `[batch, heads, n_k, d]`
/// - `masks`: `query_pad` `[batch, n_q]`, `key_pad` `[batch, n_k]` (`causal` is ignored)
/// - output: `[batch, heads, n_q, d]`
pub fn nystrom_cross_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    masks: HeadMasks,
    n_landmarks: usize,
    pinv_iterations: usize,
) -> Tensor<4> {
    let d = q.dims()[3];
    // The paper scales q and k by d^{-1/4} each; landmarks are means, so the scale commutes
    // with them and is applied once, as 1/√d, to each product of scores (this also spares two
    // element-wise passes over the per-head views of q and k, forward and backward).
    let scale = 1.0 / (d as f32).sqrt();
    let q_land = landmarks(q.clone(), masks.query_pad, n_landmarks);
    let k_land = landmarks(k.clone(), masks.key_pad.clone(), n_landmarks);
    // out = K₁ pinv(K₂) K₃ V with K₁ = softmax(Q K̃ᵀ), K₃ = softmax(Q̃ Kᵀ): K₃ V and K₁ Z are
    // softmax attentions (keys K, values V; keys K̃, values Z = pinv(K₂) K₃ V), so they take the
    // fused kernel where there is one and neither the [n, m] nor the [m, n] weights are stored.
    let scores_2 = q_land.clone().matmul(k_land.clone().swap_dims(2, 3)); // [b, h, m, m]
    let kernel_2 = softmax(scores_2.mul_scalar(scale), 3);
    let context = exact_softmax_attention(q_land, k, v, masks.key_pad, false, None); // [b, h, m, d]
    let z = iterative_pinv(kernel_2, pinv_iterations).matmul(context);
    exact_softmax_attention(q, k_land, z, None, false, None)
}

/// The `m` landmarks of `x: [batch, heads, n, d]`: the means of `m` segments of each sequence's
/// real positions, `[batch, heads, m, d]`.
fn landmarks(x: Tensor<4>, mask_pad: Option<Tensor<2, Bool>>, m: usize) -> Tensor<4> {
    let [batch, heads, n, d] = x.dims();
    if mask_pad.is_none() && n >= m && n % m == 0 {
        // Without padding and with m dividing n the segments are equal consecutive blocks:
        // their means come from a reshape, not from an `[m, n]` averaging product per head
        // (which would cost as much as the attention products themselves).
        return x
            .reshape([batch, heads, m, n / m, d])
            .mean_dim(3)
            .reshape([batch, heads, m, d]);
    }
    let segments = landmark_segments(mask_pad, batch, n, m, &x.device())
        .unsqueeze_dim::<4>(1)
        .expand([batch, heads, m, n]);
    segments.matmul(x)
}
