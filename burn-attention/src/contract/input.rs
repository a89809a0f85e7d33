//! What an attention takes: the sequences and their masks, in model space
//! ([`AttentionInput`]) and per head ([`HeadMasks`]), and mask helpers.
//!
//! Masks follow Burn's convention: `true` marks a position that must be ignored.

use burn::prelude::*;

use crate::contract::error::AttentionError;

/// The value written over masked scores before a softmax (Burn's own `min_float`): its
/// exponential underflows to 0 against any real score, yet a row with every key masked stays
/// finite.
pub const MASK_FILL: f32 = -1.0e4;

/// Input of an attention layer: queries, keys and values in model space and their masks.
///
/// Self-attention ([`new`](Self::new)) reads one sequence; cross-attention
/// ([`cross`](Self::cross), the shape of Burn's `MhaInput::new(query, key, value)`) reads queries
/// from one sequence and keys and values from another, of any length.
///
/// ```rust
/// # use burn::prelude::*;
/// # use burn_attention_zoo::AttentionInput;
/// # let device = Device::flex();
/// let x = Tensor::<3>::zeros([2, 5, 8], &device);
/// let pad = Tensor::<2, Int>::from_ints([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], &device).equal_elem(0);
/// let input = AttentionInput::new(x.clone()).mask_pad(pad).causal(true);
/// assert!(input.is_causal());
///
/// // Cross-attention: 5 queries read 7 keys and values.
/// let memory = Tensor::<3>::zeros([2, 7, 8], &device);
/// let input = AttentionInput::cross(x, memory.clone(), memory);
/// assert_eq!((input.query_len(), input.key_len()), (5, 7));
/// ```
///
/// # Shapes
/// - query `[batch, n_q, d_model]`; key and value `[batch, n_k, d_model]` (self-attention:
///   all three the same tensor, `n_q = n_k = n`)
/// - key padding mask `[batch, n_k]`, query padding mask `[batch, n_q]`, `true` = padding
#[derive(Debug, Clone)]
pub struct AttentionInput {
    query: Tensor<3>,
    /// Keys and values, for cross-attention; `None` = self-attention over `query`.
    memory: Option<(Tensor<3>, Tensor<3>)>,
    key_pad: Option<Tensor<2, Bool>>,
    query_pad: Option<Tensor<2, Bool>>,
    attn_mask: Option<Tensor<3, Bool>>,
    causal: bool,
    shared_projection: Option<Tensor<3>>,
}

impl AttentionInput {
    /// Self-attention over `x: [batch, n, d_model]`, no masks.
    pub fn new(x: Tensor<3>) -> Self {
        Self {
            query: x,
            memory: None,
            key_pad: None,
            query_pad: None,
            attn_mask: None,
            causal: false,
            shared_projection: None,
        }
    }

    /// Cross-attention: queries from `query: [batch, n_q, d_model]`, keys and values from `key`
    /// and `value: [batch, n_k, d_model]` (usually the same tensor, an encoder's output).
    pub fn cross(query: Tensor<3>, key: Tensor<3>, value: Tensor<3>) -> Self {
        Self {
            memory: Some((key, value)),
            ..Self::new(query)
        }
    }

    /// Registers the padding mask of the keys, `[batch, n_k]` (`true` = padding). In
    /// self-attention it is the sequence's mask, and masks the queries too.
    pub fn mask_pad(mut self, mask_pad: Tensor<2, Bool>) -> Self {
        self.key_pad = Some(mask_pad);
        self
    }

    /// Registers the padding mask of the queries in cross-attention, `[batch, n_q]`. Outputs at
    /// padded queries are unspecified; only variants that pool queries (Nyströmformer's
    /// landmarks) read it, so that padding never moves a real output.
    pub fn mask_pad_query(mut self, mask_pad: Tensor<2, Bool>) -> Self {
        self.query_pad = Some(mask_pad);
        self
    }

    /// Registers an arbitrary attention mask, `[batch, n_q, n_k]` (`true` = query `i` must not
    /// see key `j`), applied on top of the padding and causal masks, as Burn's
    /// `MhaInput::mask_attn`. Only the variants whose
    /// [`Capabilities::attention_mask`](crate::Capabilities::attention_mask) says so take it; the
    /// others return an error. A query whose every key is masked gets the mean of the values,
    /// as a fully padded row does.
    pub fn mask_attn(mut self, mask: Tensor<3, Bool>) -> Self {
        self.attn_mask = Some(mask);
        self
    }

    /// Sets causal masking: position `i` attends only to `j <= i` (self-attention only).
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

    /// Replaces the queries (and, in self-attention, the keys and values): how a block hands
    /// its normalised input on with the same masks.
    pub fn with_query(mut self, query: Tensor<3>) -> Self {
        self.query = query;
        self
    }

    /// The queries `[batch, n_q, d_model]` (in self-attention, the sequence).
    pub fn query(&self) -> &Tensor<3> {
        &self.query
    }

    /// The keys `[batch, n_k, d_model]`.
    pub fn key(&self) -> &Tensor<3> {
        self.memory.as_ref().map_or(&self.query, |(k, _)| k)
    }

    /// The values `[batch, n_k, d_model]`.
    pub fn value(&self) -> &Tensor<3> {
        self.memory.as_ref().map_or(&self.query, |(_, v)| v)
    }

    /// Whether queries and keys come from different sequences.
    pub fn is_cross(&self) -> bool {
        self.memory.is_some()
    }

    /// Number of queries.
    pub fn query_len(&self) -> usize {
        self.query.dims()[1]
    }

    /// Number of keys.
    pub fn key_len(&self) -> usize {
        self.key().dims()[1]
    }

    /// The padding mask of the keys, if any.
    pub fn padding(&self) -> Option<&Tensor<2, Bool>> {
        self.key_pad.as_ref()
    }

    /// The arbitrary attention mask, if any.
    pub fn attention_mask(&self) -> Option<&Tensor<3, Bool>> {
        self.attn_mask.as_ref()
    }

    /// Whether causal masking is on.
    pub fn is_causal(&self) -> bool {
        self.causal
    }

    /// The projection shared across layers, if supplied.
    pub fn shared(&self) -> Option<&Tensor<3>> {
        self.shared_projection.as_ref()
    }

    /// The queries and, in cross-attention, the keys and values, taking the input apart (so
    /// that no tensor of it outlives its use).
    pub fn into_sequences(self) -> (Tensor<3>, Option<(Tensor<3>, Tensor<3>)>) {
        (self.query, self.memory)
    }

    /// Checks that the sequences and masks fit one another and a model of width `d_model`:
    /// queries `[batch, n_q, d_model]`, keys and values `[batch, n_k, d_model]`, the key padding
    /// mask `[batch, n_k]`, the query padding mask `[batch, n_q]` and the attention mask
    /// `[batch, n_q, n_k]`. The error names `variant` and the tensor that does not fit. Every
    /// registered variant's module checks its inputs with it before any tensor work, used
    /// alone or through [`Attention`](crate::Attention); the encoder blocks check before their
    /// LayerNorm.
    pub fn check_shapes(
        &self,
        variant: &'static str,
        d_model: usize,
    ) -> Result<(), AttentionError> {
        let [batch, n_q, _] = self.query.dims();
        let n_k = self.key_len();
        let keys = self.memory.as_ref().map(|(k, _)| k.dims().to_vec());
        let values = self.memory.as_ref().map(|(_, v)| v.dims().to_vec());
        let mask = |m: &Option<Tensor<2, Bool>>| m.as_ref().map(|m| m.dims().to_vec());
        let attn_mask = self.attn_mask.as_ref().map(|m| m.dims().to_vec());
        let tensors = [
            (
                "queries",
                "[batch, n_q, d_model]",
                Some(self.query.dims().to_vec()),
                vec![batch, n_q, d_model],
            ),
            (
                "keys",
                "[batch, n_k, d_model]",
                keys,
                vec![batch, n_k, d_model],
            ),
            (
                "values",
                "[batch, n_k, d_model]",
                values,
                vec![batch, n_k, d_model],
            ),
            (
                "a padding mask",
                "[batch, n_k]",
                mask(&self.key_pad),
                vec![batch, n_k],
            ),
            (
                "a query padding mask",
                "[batch, n_q]",
                mask(&self.query_pad),
                vec![batch, n_q],
            ),
            (
                "an attention mask",
                "[batch, n_q, n_k]",
                attn_mask,
                vec![batch, n_q, n_k],
            ),
        ];
        for (what, names, got, want) in tensors {
            if let Some(got) = got {
                check_shape(variant, what, names, &got, &want)?;
            }
        }
        Ok(())
    }

    /// The masks per head: the key mask, the query mask (in self-attention the key mask) and the
    /// causal flag.
    pub fn head_masks(&self) -> HeadMasks {
        let query_pad = if self.is_cross() {
            self.query_pad.clone()
        } else {
            self.key_pad.clone()
        };
        HeadMasks {
            key_pad: self.key_pad.clone(),
            query_pad,
            attn: self.attn_mask.clone(),
            causal: self.causal,
            positions: None,
        }
    }
}

/// The masks of attention on per-head tensors (`true` = masked).
///
/// Keys are masked by `key_pad`; `query_pad` only tells variants that pool queries which ones
/// are real. `causal` means query `i` sees keys `j <= i`, which needs as many queries as keys.
#[derive(Debug, Clone, Default)]
pub struct HeadMasks {
    /// Key padding `[batch, n_k]`.
    pub key_pad: Option<Tensor<2, Bool>>,
    /// Query padding `[batch, n_q]`.
    pub query_pad: Option<Tensor<2, Bool>>,
    /// An arbitrary attention mask `[batch, n_q, n_k]`.
    pub attn: Option<Tensor<3, Bool>>,
    /// Causal masking.
    pub causal: bool,
    /// Rotary positions (RoFormer): each position's index among its sequence's real ones,
    /// `[batch, n]` (self-attention), at which a variant that takes them
    /// ([`Capabilities::rotary`](crate::Capabilities::rotary)) rotates its queries and keys;
    /// `None`: no rotation. The projections fill it for a module with rotary positions on
    /// ([`AttentionModule::with_rotary`](crate::AttentionModule::with_rotary)).
    pub positions: Option<Tensor<2>>,
}

impl HeadMasks {
    /// The masks of self-attention: `mask_pad` (`[batch, n]`) on queries and keys alike.
    pub fn new(mask_pad: Option<Tensor<2, Bool>>, causal: bool) -> Self {
        Self {
            key_pad: mask_pad.clone(),
            query_pad: mask_pad,
            attn: None,
            causal,
            positions: None,
        }
    }

    /// The masks of cross-attention: `key_pad` `[batch, n_k]`, `query_pad` `[batch, n_q]`.
    pub fn cross(key_pad: Option<Tensor<2, Bool>>, query_pad: Option<Tensor<2, Bool>>) -> Self {
        Self {
            key_pad,
            query_pad,
            attn: None,
            causal: false,
            positions: None,
        }
    }

    /// The attention mask's flags on the host, `[batch, n_q, n_k]` flattened, with its shape.
    pub fn attention_flags(&self) -> Option<(Vec<bool>, [usize; 3])> {
        self.attn.as_ref().map(|mask| {
            let flags = mask.clone().into_data().iter::<bool>().collect();
            (flags, mask.dims())
        })
    }
}

/// Refuses `what`, of shape `got`, where the shape `names` (`[batch, n, d_model]`) is `want`:
/// an error naming `variant`, the tensor and both shapes.
pub fn check_shape(
    variant: &'static str,
    what: &str,
    names: &str,
    got: &[usize],
    want: &[usize],
) -> Result<(), AttentionError> {
    if got == want {
        return Ok(());
    }
    Err(AttentionError::unsupported(
        variant,
        format!("{what} of shape {got:?} (it takes {names}, here {want:?})"),
    ))
}

/// Refuses a sequence `what`, `x: [batch, n, d]`, whose width `d` is not `d_model`.
pub fn check_width(
    variant: &'static str,
    what: &str,
    x: &Tensor<3>,
    d_model: usize,
) -> Result<(), AttentionError> {
    let [batch, n, _] = x.dims();
    check_shape(
        variant,
        what,
        "[batch, n, d_model]",
        &x.dims(),
        &[batch, n, d_model],
    )
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
pub fn zero_padded(x: Tensor<4>, mask_pad: &Option<Tensor<2, Bool>>) -> Tensor<4> {
    match mask_pad {
        Some(mask) => {
            let [batch, n] = mask.dims();
            x.mask_fill(mask.clone().reshape([batch, 1, n, 1]), 0.0)
        }
        None => x,
    }
}

/// `x` followed along `dim` by `extra` zeros (`x` itself when `extra` is 0: no zero-length
/// tensor is made, which not every Burn backend takes).
pub fn zeros_after<const D: usize>(x: Tensor<D>, dim: usize, extra: usize) -> Tensor<D> {
    if extra == 0 {
        return x;
    }
    let mut shape = x.dims();
    shape[dim] = extra;
    let zeros = Tensor::zeros(shape, &x.device());
    Tensor::cat(vec![x, zeros], dim)
}

/// `x` preceded along `dim` by `extra` zeros (`x` itself when `extra` is 0).
pub fn zeros_before<const D: usize>(x: Tensor<D>, dim: usize, extra: usize) -> Tensor<D> {
    if extra == 0 {
        return x;
    }
    let mut shape = x.dims();
    shape[dim] = extra;
    let zeros = Tensor::zeros(shape, &x.device());
    Tensor::cat(vec![zeros, x], dim)
}

/// Flags `[batch, n]` with `before` and `after` columns of `true` around them (none made where
/// a count is 0).
pub fn flags_framed(flags: Tensor<2, Bool>, before: usize, after: usize) -> Tensor<2, Bool> {
    let [batch, _] = flags.dims();
    let device = flags.device();
    let mut parts = vec![flags];
    if before > 0 {
        parts.insert(0, Tensor::full([batch, before], true, &device));
    }
    if after > 0 {
        parts.push(Tensor::full([batch, after], true, &device));
    }
    Tensor::cat(parts, 1)
}
