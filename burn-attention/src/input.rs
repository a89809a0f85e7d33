//! The input every attention variant takes, and mask helpers.

use burn::prelude::*;

/// Input of a self-attention layer: the sequence and its masks.
///
/// Masks follow Burn's convention: `true` marks a position that must be ignored.
///
/// ```rust
/// # use burn::prelude::*;
/// # use burn_attention::AttentionInput;
/// # let device = Device::flex();
/// let x = Tensor::<3>::zeros([2, 5, 8], &device);
/// let pad = Tensor::<2, Int>::from_ints([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], &device).equal_elem(0);
/// let input = AttentionInput::new(x).mask_pad(pad).causal(true);
/// assert!(input.is_causal());
/// ```
///
/// # Shapes
/// - `x`: `[batch, n, d_model]`
/// - `mask_pad`: `[batch, n]`, `true` = padding
#[derive(Debug, Clone)]
pub struct AttentionInput {
    pub(crate) x: Tensor<3>,
    pub(crate) mask_pad: Option<Tensor<2, Bool>>,
    pub(crate) causal: bool,
    pub(crate) shared_projection: Option<Tensor<3>>,
}

impl AttentionInput {
    /// Self-attention over `x: [batch, n, d_model]`, no masks.
    pub fn new(x: Tensor<3>) -> Self {
        Self {
            x,
            mask_pad: None,
            causal: false,
            shared_projection: None,
        }
    }

    /// Registers the padding mask `[batch, n]` (`true` = padding).
    pub fn mask_pad(mut self, mask_pad: Tensor<2, Bool>) -> Self {
        self.mask_pad = Some(mask_pad);
        self
    }

    /// Sets causal masking: position `i` attends only to `j <= i`.
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// Supplies a projection shared across layers (Linformer's `layerwise` sharing,
    /// `[1, k, n_max]`). [`Encoder`](crate::Encoder) does this for its blocks.
    pub fn shared_projection(mut self, projection: Tensor<3>) -> Self {
        self.shared_projection = Some(projection);
        self
    }

    /// The sequence `[batch, n, d_model]`.
    pub fn x(&self) -> &Tensor<3> {
        &self.x
    }

    /// The padding mask, if any.
    pub fn padding(&self) -> Option<&Tensor<2, Bool>> {
        self.mask_pad.as_ref()
    }

    /// Whether causal masking is on.
    pub fn is_causal(&self) -> bool {
        self.causal
    }
}

/// The causal mask `[n, n]`: `true` where key `j` lies in the future of query `i` (`j > i`).
pub fn causal_mask(n: usize, device: &Device) -> Tensor<2, Bool> {
    let rows = Tensor::<1, Int>::arange(0..n as i64, device).reshape([n, 1]);
    let cols = Tensor::<1, Int>::arange(0..n as i64, device).reshape([1, n]);
    cols.greater(rows)
}

/// A padding mask `[batch, n_max]` (`true` = padding) from per-example lengths.
pub fn padding_mask_from_lengths(
    lengths: &[usize],
    n_max: usize,
    device: &Device,
) -> Tensor<2, Bool> {
    let batch = lengths.len();
    let mut data = Vec::with_capacity(batch * n_max);
    for &len in lengths {
        data.extend((0..n_max).map(|j| j >= len));
    }
    Tensor::<2, Bool>::from_data(TensorData::new(data, [batch, n_max]), device)
}

/// Zeroes the padded rows of a per-head tensor `x: [batch, heads, n, d]` (`mask_pad`:
/// `[batch, n]`, `true` = padding).
pub(crate) fn zero_padded(x: Tensor<4>, mask_pad: &Option<Tensor<2, Bool>>) -> Tensor<4> {
    match mask_pad {
        Some(mask) => {
            let [batch, n] = mask.dims();
            x.mask_fill(mask.clone().reshape([batch, 1, n, 1]), 0.0)
        }
        None => x,
    }
}
