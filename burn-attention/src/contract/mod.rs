//! The API floor: what every attention meets and what a user or a variant names. The
//! [`AttentionModule`] trait and the [`Capabilities`] it declares that the encoder blocks accept
//! (the registry's [`Attention`](crate::Attention) and any module of the user's), the state a
//! causal attention carries from token to token ([`DecodingState`]); the inputs and their masks
//! ([`input`]), the errors ([`error`]), and what a variant states about itself ([`variant`]).
//! It imports nothing else of the crate.

pub mod error;
pub mod input;
pub mod variant;

use burn::prelude::*;

use crate::contract::error::AttentionError;
use crate::contract::input::{AttentionInput, HeadMasks};

/// An attention layer: `[batch, n_q, d_model]` queries (and keys and values, see
/// [`AttentionInput`]) in, `[batch, n_q, d_model]` out.
///
/// Implement it for your own Burn module and it plugs into [`EncoderBlock`](crate::EncoderBlock)
/// and [`Encoder`](crate::Encoder) beside the registered variants. Only [`name`](Self::name),
/// [`capabilities`](Self::capabilities) and [`try_forward`](Self::try_forward) are required;
/// the per-head form, decoding, random-feature redraws and a loss penalty are optional.
pub trait AttentionModule: Module {
    /// The attention's name, for messages (the registered variants: their registry name).
    fn name(&self) -> &'static str;

    /// What the module supports.
    fn capabilities(&self) -> Capabilities;

    /// Applies attention, or says why this module cannot take this input. The registered
    /// variants refuse inputs whose shapes do not fit
    /// ([`AttentionInput::check_shapes`](crate::AttentionInput::check_shapes)) before any tensor
    /// work; a module of your own can call it first too.
    ///
    /// # Shapes
    /// - queries `[batch, n_q, d_model]`, keys and values `[batch, n_k, d_model]`
    /// - output: `[batch, n_q, d_model]`
    fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError>;

    /// Applies attention.
    ///
    /// # Panics
    /// Where [`try_forward`](Self::try_forward) returns an error; the message is the error's.
    fn forward(&self, input: AttentionInput) -> Tensor<3> {
        self.try_forward(input)
            .unwrap_or_else(|err| panic!("{err}"))
    }

    /// The attention on per-head tensors with this module's own parameters (random features,
    /// learned kernels, sequence projections, landmarks), without the input and output
    /// projections; or why it cannot take this input.
    ///
    /// # Shapes
    /// - `q`: `[batch, heads, n_q, d_head]`; `k`, `v`: `[batch, heads, n_k, d_head]`
    /// - output: `[batch, heads, n_q, d_head]`
    fn attend(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        masks: HeadMasks,
    ) -> Result<Tensor<4>, AttentionError> {
        let _ = (q, k, v, masks);
        Err(AttentionError::unsupported(
            self.name(),
            "attention on per-head tensors",
        ))
    }

    /// Applies attention and returns its weights too, for the variants that form them
    /// ([`Capabilities::returns_weights`]; the others return an error): the weights before
    /// dropout, each query's row summing to one over the keys the variant documents
    /// (`[batch, heads, n_q, n_k]` for softmax).
    ///
    /// # Shapes
    /// - as [`try_forward`](Self::try_forward); weights `[batch, heads, n_q, keys]`
    fn try_forward_with_weights(
        &self,
        input: AttentionInput,
    ) -> Result<(Tensor<3>, Tensor<4>), AttentionError> {
        let _ = input;
        Err(AttentionError::unsupported(
            self.name(),
            "returning its attention weights",
        ))
    }

    /// One step of autoregressive decoding: `x: [batch, 1, d_model]`, the token that follows
    /// those `state` has seen (start from [`DecodingState::default`]). Returns the token's
    /// output, equal to the causal forward pass over the whole prefix at its position, and the
    /// state that includes it.
    fn decode(
        &self,
        x: Tensor<3>,
        state: DecodingState,
    ) -> Result<(Tensor<3>, DecodingState), AttentionError> {
        let _ = (x, state);
        Err(AttentionError::unsupported(
            self.name(),
            "decoding token by token",
        ))
    }

    /// Feeds a whole prompt `x: [batch, n, d_model]` (`n` at least 1) at once: the causal
    /// forward pass's output at every position, and the decoding state after the last one,
    /// equal (to f32 round-off) to decoding the prompt token by token from
    /// [`DecodingState::default`]. The default does exactly that, one [`decode`](Self::decode)
    /// per token; the registered variants override it with one parallel pass (the causal
    /// forward pass and the state read from the prompt's keys and values).
    fn prefill(&self, x: Tensor<3>) -> Result<(Tensor<3>, DecodingState), AttentionError> {
        variant::check_prompt(self.name(), &x)?;
        let n = x.dims()[1];
        let mut state = DecodingState::default();
        let mut outputs = Vec::with_capacity(n);
        for t in 0..n {
            let (y, next) = self.decode(x.clone().slice([0..x.dims()[0], t..t + 1]), state)?;
            outputs.push(y);
            state = next;
        }
        Ok((Tensor::cat(outputs, 1), state))
    }

    /// [`prefill`](Self::prefill) for a batch of prompts of different lengths: `x` holds them
    /// padded to the longest, `mask_pad: [batch, n]` marks the padding (`true`). Outputs at
    /// padded positions are unspecified; the state leaves the padding out, so that decoding goes
    /// on for every prompt from its own end, one new token per prompt a step. Every registered
    /// variant that decodes does this (the default returns an error): softmax's cache and the
    /// kernelized sums with padding anywhere; the position-dependent patterns (local, sparse,
    /// Synthesizer), which read each token's position from the padding, with padding after each
    /// prompt only (an error otherwise).
    fn prefill_padded(
        &self,
        x: Tensor<3>,
        mask_pad: Tensor<2, Bool>,
    ) -> Result<(Tensor<3>, DecodingState), AttentionError> {
        let _ = (x, mask_pad);
        Err(AttentionError::unsupported(
            self.name(),
            "prefilling prompts of different lengths",
        ))
    }

    /// Applies attention to a call's positions that follow those `memory` holds (the
    /// recurrent attentions: Transformer-XL), and returns the memory the next call takes:
    /// carrying it from call to call over consecutive stretches of one sequence gives the
    /// outputs one call over the whole sequence gives (where each call starts on a segment
    /// boundary). The memory is this attention's own input over the positions before the call,
    /// with the gradient stopped. The others return an error.
    ///
    /// # Shapes
    /// - as [`try_forward`](Self::try_forward); memory `[batch, m, d_model]`
    fn forward_with_memory(
        &self,
        input: AttentionInput,
        memory: Option<SegmentMemory>,
    ) -> Result<(Tensor<3>, SegmentMemory), AttentionError> {
        let _ = (input, memory);
        Err(AttentionError::unsupported(
            self.name(),
            "carrying memory from call to call",
        ))
    }

    /// Applies attention and returns the auxiliary loss the module asks the training loss to add
    /// for this input (the Compressive Transformer's attention reconstruction, which alone
    /// trains its compression); `None` for most. Unlike [`penalty`](Self::penalty) it depends
    /// on the input; evaluation and inference call [`try_forward`](Self::try_forward), which
    /// does not compute it. The default: `try_forward`, and `None`.
    fn try_forward_with_loss(
        &self,
        input: AttentionInput,
    ) -> Result<(Tensor<3>, Option<Tensor<1>>), AttentionError> {
        self.try_forward(input).map(|y| (y, None))
    }

    /// This module with rotary positions on (Su et al. 2021, RoFormer, arXiv 2104.09864): its
    /// queries and keys rotated by their positions inside attention, each position counted
    /// among its sequence's real ones (so padding anywhere leaves the outputs unchanged), and
    /// decoding rotating each token at its own position. For the variants whose capabilities
    /// say so ([`Capabilities::rotary`]); the others return an error that says why rotating has
    /// no meaning for them.
    fn with_rotary(self) -> Result<Self, AttentionError>
    where
        Self: Sized,
    {
        Err(AttentionError::unsupported(
            self.name(),
            "rotary positions (not implemented for it yet)",
        ))
    }

    /// Draws new random features where the module has them (Performer's FAVOR+); the others are
    /// returned unchanged. Training loops call this every N steps; `forward` never does.
    fn redraw(self) -> Self
    where
        Self: Sized,
    {
        self
    }

    /// The regularisation term the module asks the training loss to add (the orthogonality
    /// penalty of the orthogonal `ff-*` kernels); `None` for most.
    fn penalty(&self) -> Option<Tensor<1>> {
        None
    }
}

/// What a variant supports; asking for anything else is an error before training starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Honours a key padding mask.
    pub padding_mask: bool,
    /// Honours an arbitrary boolean attention mask `[batch, n_q, n_k]`
    /// ([`AttentionInput::mask_attn`](crate::AttentionInput::mask_attn)); the others refuse an
    /// input that carries one.
    pub attention_mask: bool,
    /// Returns its attention weights
    /// ([`AttentionModule::try_forward_with_weights`]).
    pub returns_weights: bool,
    /// Supports causal masking, and decoding token by token.
    pub causal: bool,
    /// Supports cross-attention: queries and keys from sequences of different lengths.
    pub cross_attention: bool,
    /// Needs a fixed maximum sequence length (`n_max`) at construction.
    pub fixed_max_len: bool,
    /// The implied weights of each query over the values sum to one, so a constant `v` comes
    /// back unchanged and a sequence of one position returns its own `v`, whatever the queries
    /// and keys.
    pub weights_sum_to_one: bool,
    /// Has a per-head form: [`AttentionModule::attend`] on per-head queries, keys and values.
    /// Without one, keys and values pass through layers over all heads (a set's inducing
    /// points, a compression, a normalisation or gate over every head), and `attend` refuses.
    pub per_head_form: bool,
    /// Takes rotary positions (RoFormer; [`AttentionModule::with_rotary`]): its queries and keys
    /// rotated by their positions inside attention, so that its scores depend on positions
    /// only through their differences. `false` where rotating has no meaning for the variant
    /// (its `with_rotary` says why).
    pub rotary: bool,
    /// A causal variant that reads a token's position from its index (windows, blocks, strides,
    /// segments, per-position weights): [`AttentionModule::prefill_padded`] takes padding only
    /// after each prompt's end, and refuses padding before it. `false` for the others.
    pub prefill_end_padding_only: bool,
}

impl Capabilities {
    /// A key padding mask and nothing else: the base a variant's capabilities extend, naming
    /// only what it adds (`Capabilities { causal: true, ..Capabilities::PADDING_ONLY }`), so
    /// that a variant's file says what it supports.
    pub const PADDING_ONLY: Capabilities = Capabilities {
        padding_mask: true,
        attention_mask: false,
        returns_weights: false,
        causal: false,
        cross_attention: false,
        fixed_max_len: false,
        weights_sum_to_one: false,
        per_head_form: false,
        rotary: false,
        prefill_end_padding_only: false,
    };
}

/// What a causal attention carries from one decoded token to the next, per layer.
#[derive(Debug, Clone, Default)]
#[allow(clippy::large_enum_variant)]
pub enum DecodingState {
    /// Nothing seen yet.
    #[default]
    Empty,
    /// Softmax attention: every key and value so far, `[batch, heads, t, d_head]`; a step costs
    /// O(t d).
    KeyValueCache {
        /// Keys so far.
        keys: Tensor<4>,
        /// Values so far.
        values: Tensor<4>,
        /// The cached positions that pad a prompt shorter than the batch's longest
        /// ([`AttentionModule::prefill_padded`]), `[batch, t]`, `true` = padding; `None`: none.
        padding: Option<Tensor<2, Bool>>,
    },
    /// Kernelized attention: the sums over the keys so far, so that a step costs O(m d)
    /// wherever it is in the sequence.
    Recurrent(RecurrentState),
    /// Memory-compressed attention: one compressed key and value per finished block of
    /// positions, and the keys and values of the block under way; a step at position t costs
    /// O((t / c + c) d) for blocks of c.
    Compressed {
        /// The finished blocks' compressed keys and values; `None` before the first block of
        /// any sequence completes. In a batch of prompts of different lengths its padding marks,
        /// per sequence, the blocks that are not its own.
        blocks: Option<CachedKeys>,
        /// The keys and values of the block under way; `None` at a block boundary. Its padding
        /// marks, per sequence, the positions outside its own block under way.
        current: Option<CachedKeys>,
    },
    /// Linear attention with a decaying state (RetNet's retention): the decayed sums over
    /// the tokens so far, so that a step costs O(d²) wherever it is in the sequence.
    Decayed(DecayedState),
    /// The Compressive Transformer, sequence by sequence: the inputs its next tokens read or
    /// will compress, and its compressed memory; bounded whatever the position.
    Compressive(Vec<CompressiveMemory>),
}

/// What the Compressive Transformer keeps of one sequence while decoding: its attention's
/// inputs, keys and values over the positions a later token reads (its memory and segment) or
/// will compress (the fewer than `c` before them), and the keys and values of its compressed
/// memory (`f_c` of the newest blocks of `c` positions, projected). The default: nothing seen.
#[derive(Debug, Clone, Default)]
pub struct CompressiveMemory {
    /// Positions seen: the next token's position.
    pub seen: usize,
    /// The inputs, keys and values of the last positions seen, `[len, d_model]` each, the
    /// newest last (`None`: none).
    pub recent: Option<[Tensor<2>; 3]>,
    /// The keys and values of the compressed blocks `compressed_end − m .. compressed_end`,
    /// `[m, d_model]` each, the newest last (`None`: none yet).
    pub compressed: Option<[Tensor<2>; 2]>,
    /// Blocks compressed so far: the index after the newest.
    pub compressed_end: usize,
}

/// What a recurrent attention carries from one call to the next
/// ([`AttentionModule::forward_with_memory`]): its input over the positions before the call.
#[derive(Debug, Clone)]
pub struct SegmentMemory {
    /// The attention's input over the last positions before the call, gradient stopped,
    /// `[batch, m, d_model]`.
    pub states: Tensor<3>,
    /// `[batch, m]`, `true` = padding; `None`: none.
    pub padding: Option<Tensor<2, Bool>>,
}

/// Keys and values a decoding state holds, per head, with the positions a sequence does not
/// see marked.
#[derive(Debug, Clone)]
pub struct CachedKeys {
    /// Keys, `[batch, heads, t, d_head]`.
    pub keys: Tensor<4>,
    /// Values, `[batch, heads, t, d_head]`.
    pub values: Tensor<4>,
    /// `[batch, t]`, `true` = not seen by that sequence; `None`: every sequence sees all `t`.
    pub padding: Option<Tensor<2, Bool>>,
}

impl DecodingState {
    /// How many numbers the state holds (padding flags not counted): what decoding keeps in
    /// memory between tokens, 4 bytes each in f32. Constant over the sequence for the recurrent
    /// states ([`Recurrent`](Self::Recurrent), [`Decayed`](Self::Decayed)); growing with the
    /// tokens seen for the caches.
    pub fn num_elements(&self) -> usize {
        let count = |t: &Tensor<4>| t.shape().num_elements();
        match self {
            Self::Empty => 0,
            Self::KeyValueCache { keys, values, .. } => count(keys) + count(values),
            Self::Recurrent(state) => {
                count(&state.s) + count(&state.z) + state.key_max.as_ref().map_or(0, count)
            }
            Self::Compressed { blocks, current } => [blocks, current]
                .into_iter()
                .flatten()
                .map(|c| count(&c.keys) + count(&c.values))
                .sum(),
            Self::Decayed(state) => count(&state.s) + state.seen.shape().num_elements(),
            Self::Compressive(memories) => memories
                .iter()
                .flat_map(|m| {
                    m.recent
                        .iter()
                        .flatten()
                        .chain(m.compressed.iter().flatten())
                })
                .map(|t| t.shape().num_elements())
                .sum(),
        }
    }

    /// The real tokens each sequence has seen, `[batch, 1]`: the next token's position, at
    /// which rotary positions rotate it. A key/value cache counts its positions that are not
    /// padding; a recurrent state with rotary positions keeps the count; nothing seen is 0. The
    /// other states (which do not keep every position) are an error naming `variant`.
    pub fn tokens_seen(
        &self,
        variant: &'static str,
        batch: usize,
        device: &Device,
    ) -> Result<Tensor<2>, AttentionError> {
        match self {
            Self::Empty => Ok(Tensor::zeros([batch, 1], device)),
            Self::KeyValueCache { keys, padding, .. } => Ok(match padding {
                Some(pad) => pad.clone().bool_not().float().sum_dim(1),
                None => Tensor::full([batch, 1], keys.dims()[2] as f32, device),
            }),
            Self::Recurrent(RecurrentState {
                seen: Some(seen), ..
            }) => Ok(seen.clone()),
            _ => Err(AttentionError::unsupported(
                variant,
                "rotary positions from a state that does not count its tokens",
            )),
        }
    }

    /// Whether this is the cache of prompts of different lengths (its padding marked), which
    /// the position-dependent patterns decode on from row by row.
    pub(crate) fn is_padded_cache(&self) -> bool {
        matches!(
            self,
            Self::KeyValueCache {
                padding: Some(_),
                ..
            }
        )
    }

    /// The key/value cache with this token's `k` and `v` (`[batch, heads, 1, d]`) appended,
    /// starting one from [`Empty`](Self::Empty): the state of the attentions that decode over
    /// cached keys. A recurrent state, or a cache of prompts of different lengths, is an error
    /// naming `variant`.
    pub fn append_to_cache(
        self,
        variant: &'static str,
        k: Tensor<4>,
        v: Tensor<4>,
    ) -> Result<(Tensor<4>, Tensor<4>), AttentionError> {
        match self.append_to_padded_cache(variant, k, v)? {
            (keys, values, None) => Ok((keys, values)),
            (_, _, Some(_)) => Err(AttentionError::unsupported(
                variant,
                "decoding prompts of different lengths",
            )),
        }
    }

    /// [`append_to_cache`](Self::append_to_cache) for a cache that may hold padding: also its
    /// padding flags, the new token's `false`.
    pub fn append_to_padded_cache(
        self,
        variant: &'static str,
        k: Tensor<4>,
        v: Tensor<4>,
    ) -> Result<(Tensor<4>, Tensor<4>, Option<Tensor<2, Bool>>), AttentionError> {
        match self {
            Self::Empty => Ok((k, v, None)),
            Self::KeyValueCache {
                keys,
                values,
                padding,
            } => {
                let padding = padding.map(|pad| {
                    let batch = pad.dims()[0];
                    let real = TensorData::new(vec![false; batch], [batch, 1]);
                    let real = Tensor::<2, Bool>::from_data(real, &pad.device());
                    Tensor::cat(vec![pad, real], 1)
                });
                Ok((
                    Tensor::cat(vec![keys, k], 2),
                    Tensor::cat(vec![values, v], 2),
                    padding,
                ))
            }
            Self::Recurrent(_)
            | Self::Decayed(_)
            | Self::Compressed { .. }
            | Self::Compressive(_) => Err(AttentionError::unsupported(
                variant,
                "another variant's decoding state (it carries a key/value cache)",
            )),
        }
    }
}

/// The state of linear attention with a decaying state after the tokens so far
/// ([`crate::engines::decay`]): `S = Σ_j exp(G_t − G_j) k_j v_jᵀ` and how many real tokens each
/// sequence has seen (which gives the next token's position).
#[derive(Debug, Clone)]
pub struct DecayedState {
    /// `S`: `[batch, heads, d_k, d_v]`.
    pub s: Tensor<4>,
    /// Real tokens seen, per sequence: `[batch, 1]`.
    pub seen: Tensor<2>,
}

/// The recurrent state of causal kernelized attention after `t` tokens:
/// `S = Σ_{j<t} φ(k_j) v_jᵀ`, `z = Σ_{j<t} φ(k_j)`.
#[derive(Debug, Clone)]
pub struct RecurrentState {
    /// `S`: `[batch, heads, m, d_head]`.
    pub s: Tensor<4>,
    /// `z`: `[batch, heads, m, 1]`.
    pub z: Tensor<4>,
    /// For features computed in log space (FAVOR+): the largest log-feature of each feature
    /// over the keys so far, `[batch, heads, 1, m]`, taken out of `S` and `z` (see
    /// [`favor_features`](crate::favor_features)).
    pub key_max: Option<Tensor<4>>,
    /// With rotary positions: the real tokens seen per sequence, `[batch, 1]` (the next token's
    /// position), `S` summed from rotated key features; `None` without.
    pub seen: Option<Tensor<2>>,
}
