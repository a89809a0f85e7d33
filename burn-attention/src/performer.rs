//! Performer: softmax attention approximated with positive orthogonal random features
//! (FAVOR+), and the generalized ReLU kernel.
//!
//! Choromanski et al. 2021, "Rethinking Attention with Performers", arXiv 2009.14794.
//! `φ(x) = m^{-1/2} exp(W x̂ − ‖x̂‖²/2 − stab)`, `x̂ = x · d^{-1/4}`, `W: [m, d]` stacked d×d
//! orthogonal blocks (Gram-Schmidt of Gaussian blocks) with rows rescaled to χ(d)-distributed
//! norms; `stab` is the maximum per query row, and over all rows and features for keys (it cancels
//! in the normalisation; padded keys are left out of it). Then the linear-attention form ([`kernelized_attention`]).
//! The generalized kernel (LRA's default "performer") uses `φ(x) = ReLU(x) + 1e-3`, no features.
//! Cost: O(n m d) time, O(n m + m d) memory per head. Masks: padding; causal through prefix sums.
//!
//! `W` is saved with the module but not trained. Redrawing it is an explicit call
//! ([`PerformerAttention::redraw`]) that a training loop makes every N steps, never a side effect
//! of `forward`.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::relu;
use serde::{Deserialize, Serialize};

use crate::error::{AttentionError, check_heads};
use crate::flash;
use crate::heads::QkvoProjection;
use crate::input::AttentionInput;
use crate::linear::kernelized_attention;

/// The kernel a Performer approximates or uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PerformerKernel {
    /// FAVOR+: positive orthogonal random features for the softmax kernel.
    Softmax,
    /// `ReLU(x) + 1e-3` on queries and keys, no random features.
    Relu,
}

/// Configuration of [`PerformerAttention`].
#[derive(Config, Debug)]
pub struct PerformerConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Random features `m` (LRA: 256).
    #[config(default = 256)]
    pub n_features: usize,
    /// Kernel.
    #[config(default = "PerformerKernel::Softmax")]
    pub kernel: PerformerKernel,
    /// Biases on the Q, K, V and output projections.
    #[config(default = false)]
    pub bias: bool,
}

impl PerformerConfig {
    fn name(&self) -> &'static str {
        match self.kernel {
            PerformerKernel::Softmax => "performer",
            PerformerKernel::Relu => "performer-relu",
        }
    }

    /// Checks the configuration; the error names the offending field.
    pub fn validate(&self) -> Result<(), AttentionError> {
        check_heads(self.name(), self.d_model, self.n_heads, 0.0)?;
        if self.kernel == PerformerKernel::Softmax && self.n_features == 0 {
            return Err(AttentionError::field(
                self.name(),
                "n_features",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// Creates the module, drawing the random features from `device`'s generator.
    ///
    /// # Panics
    /// If [`validate`](Self::validate) fails; its message is the panic message.
    pub fn init(&self, device: &Device) -> PerformerAttention {
        if let Err(err) = self.validate() {
            panic!("{err}");
        }
        let d_head = self.d_model / self.n_heads;
        let features = match self.kernel {
            PerformerKernel::Softmax => {
                Some(frozen(orthogonal_features(self.n_features, d_head, device)))
            }
            PerformerKernel::Relu => None,
        };
        PerformerAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            features,
            kernel: self.kernel,
        }
    }
}

fn frozen(t: Tensor<2>) -> Param<Tensor<2>> {
    Param::from_tensor(t).set_require_grad(false)
}

/// `m` random features of width `d`: stacked orthogonal `d × d` blocks (modified Gram-Schmidt
/// of Gaussian blocks, in f64 on the host), rows rescaled to the norms of independent Gaussian
/// vectors (χ(d)). Random numbers come from `device`'s generator.
pub fn orthogonal_features(m: usize, d: usize, device: &Device) -> Tensor<2> {
    let blocks = m.div_ceil(d);
    let gauss = gaussian_host(blocks * d + m, d, device);
    let mut rows = orthonormal_rows(&gauss[..blocks * d * d], blocks, d);
    rows.truncate(m);
    let norms = &gauss[blocks * d * d..];
    let mut data = Vec::with_capacity(m * d);
    for (i, row) in rows.iter().enumerate() {
        let chi = norms[i * d..(i + 1) * d]
            .iter()
            .map(|a| a * a)
            .sum::<f64>()
            .sqrt();
        data.extend(row.iter().map(|a| (a * chi) as f32));
    }
    Tensor::from_data(TensorData::new(data, [m, d]), device)
}

/// A random `d × d` orthogonal matrix (Gram-Schmidt of a Gaussian matrix, in f64 on the host),
/// from `device`'s generator.
pub fn random_orthogonal(d: usize, device: &Device) -> Tensor<2> {
    let gauss = gaussian_host(d, d, device);
    let data: Vec<f32> = orthonormal_rows(&gauss, 1, d)
        .iter()
        .flatten()
        .map(|&a| a as f32)
        .collect();
    Tensor::from_data(TensorData::new(data, [d, d]), device)
}

/// `rows × d` standard Gaussian numbers from `device`'s generator, on the host in f64.
fn gaussian_host(rows: usize, d: usize, device: &Device) -> Vec<f64> {
    Tensor::<2>::random([rows, d], Distribution::Normal(0.0, 1.0), device)
        .into_data()
        .convert::<f64>()
        .try_to_vec::<f64>()
        .expect("f64 data")
}

/// Modified Gram-Schmidt of `blocks` consecutive `d × d` blocks of `gauss`, block by block.
fn orthonormal_rows(gauss: &[f64], blocks: usize, d: usize) -> Vec<Vec<f64>> {
    let mut rows: Vec<Vec<f64>> = Vec::with_capacity(blocks * d);
    for b in 0..blocks {
        let mut block: Vec<Vec<f64>> = Vec::with_capacity(d);
        for r in 0..d {
            let mut v: Vec<f64> = gauss[(b * d + r) * d..(b * d + r + 1) * d].to_vec();
            for u in &block {
                let dot: f64 = v.iter().zip(u).map(|(a, c)| a * c).sum();
                v.iter_mut().zip(u).for_each(|(a, c)| *a -= dot * c);
            }
            let norm = v.iter().map(|a| a * a).sum::<f64>().sqrt();
            v.iter_mut().for_each(|a| *a /= norm);
            block.push(v);
        }
        rows.extend(block);
    }
    rows
}

/// Multi-head Performer attention. Create with [`PerformerConfig`].
#[derive(Module, Debug)]
pub struct PerformerAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
    /// Random features `W: [m, d_head]`, saved but not trained (FAVOR+ only).
    pub features: Option<Param<Tensor<2>>>,
    /// Kernel.
    #[module(skip)]
    pub kernel: PerformerKernel,
}

impl PerformerAttention {
    /// Applies attention.
    ///
    /// # Shapes
    /// - input `x`: `[batch, n, d_model]`; output: the same.
    pub fn forward(&self, input: AttentionInput) -> Tensor<3> {
        let (q, k, v) = self.proj.qkv(input.x);
        let o = match &self.features {
            Some(w) => favor_attention(q, k, v, w.val(), input.mask_pad, input.causal),
            None => kernelized_attention(
                relu(q).add_scalar(1e-3),
                relu(k).add_scalar(1e-3),
                v,
                input.mask_pad,
                input.causal,
            ),
        };
        self.proj.out(o)
    }

    /// Draws new random features from `device`'s generator (a no-op for the ReLU kernel).
    pub fn redraw(mut self) -> Self {
        if let Some(w) = self.features.take() {
            let [m, d] = w.val().dims();
            let device = w.val().device();
            self.features = Some(frozen(orthogonal_features(m, d, &device)));
        }
        self
    }
}

/// FAVOR+ attention on per-head tensors with random features `w: [m, d]`.
///
/// # Shapes
/// - `q`, `k`, `v`: `[batch, heads, n, d]`
/// - `mask_pad`: `[batch, n]`, `true` = padding
/// - output: `[batch, heads, n, d]`
pub fn favor_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    w: Tensor<2>,
    mask_pad: Option<Tensor<2, Bool>>,
    causal: bool,
) -> Tensor<4> {
    let [batch, heads, n, d] = q.dims();
    let m = w.dims()[0];
    let scale = (d as f32).powf(-0.25);
    // (x s) Wᵀ = x (s Wᵀ) and |x s|²/2 = |x|² s²/2: the scale goes onto the small [d, m]
    // matrix and the [b, h, n, 1] norms, not onto the per-head views of q and k.
    let wt = w
        .transpose()
        .mul_scalar(scale)
        .unsqueeze::<4>()
        .expand([batch, heads, d, m]);
    let project = |x: Tensor<4>| {
        let sq = x
            .clone()
            .powi_scalar(2)
            .sum_dim(3)
            .mul_scalar(0.5 * scale * scale); // [b, h, n, 1]
        (x.matmul(wt.clone()), sq)
    };
    let (qw, qsq) = project(q);
    let (kw, ksq) = project(k);
    let norm = (m as f32).sqrt().recip();
    let q_stab = qw.clone().max_dim(3); // per query row
    // exp(a) / √m = exp(a - ln √m): the normaliser rides on the small stabiliser tensors.
    let phi_q = flash::exp(qw - qsq - q_stab.sub_scalar(norm.ln()));
    // Over real rows and features: padded keys must not move the shared scale.
    let k_stab = match &mask_pad {
        Some(mask) => kw
            .clone()
            .mask_fill(mask.clone().reshape([batch, 1, n, 1]), -1.0e30),
        None => kw.clone(),
    }
    .max_dim(3)
    .max_dim(2)
    .sub_scalar(norm.ln());
    let phi_k = flash::exp(kw - ksq - k_stab);
    kernelized_attention(phi_q, phi_k, v, mask_pad, causal)
}
