//! Memory-compressed attention: softmax attention over keys and values shortened by a strided
//! convolution.
//!
//! Liu et al. 2018, "Generating Wikipedia by Summarizing Long Sequences", arXiv 1801.10198,
//! section 4.2.2: after the key and value projections, a strided convolution (kernel and stride
//! 3 in the paper) turns each block of `c` consecutive positions into one key and one value, over
//! all `d_model` channels; the queries keep their length, so each query attends to `⌈n/c⌉`
//! compressed positions: O(n² d / c) time and O(n² / c) memory per head. Kernel = stride, so the
//! convolution is one linear map of each block's `c · d_model` values
//! ([`compress_keys`](MemoryCompressedAttention::compress_keys),
//! [`compress_values`](MemoryCompressedAttention::compress_values)); a sequence whose length is
//! not a multiple of `c` ends in a block zero-filled past its end.
//!
//! Causal (the paper trains a decoder with it): query `i`, in block `b = ⌊i/c⌋`, attends to the
//! compressed blocks wholly in its past (`g < b`) and to its own block's uncompressed keys up to
//! itself (`b c <= j <= i`), one softmax over both. The paper does not spell the rule out; the
//! code released with it (tensor2tensor's `multihead_self_attention_reduced`) lets a query see
//! the compressed blocks that end before it plus the first position's uncompressed key, which
//! leaves a query blind to itself and its own block: this module keeps the compressed past and
//! completes it with the own block, so nothing in the past of a query is hidden from it.
//!
//! Masks: padding (a padded position is zeroed before the compression and a block wholly of
//! padding is masked, so padding after a sequence changes nothing); cross-attention (the memory
//! is compressed); decoding token by token with the finished blocks compressed and the block
//! under way uncompressed. No arbitrary attention mask (compressed keys mix positions), no
//! weights, and no per-head form: the compression mixes the heads' channels.

use crate::variants::prelude::*;
use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig};

use crate::contract::CachedKeys;
use crate::engines::dropout::dropout;

use crate::contract::input::{MASK_FILL, causal_mask, flags_framed, zero_padded, zeros_after};
use crate::engines::heads::{merge_heads, split_heads};
use crate::engines::softmax::exact_softmax_attention;
use crate::kernels;

use crate::engines::gathered_softmax::{flags_tensor, padding_flags, suffix_lengths};

/// The registry entry.
pub const INFO: VariantInfo = VariantInfo {
    name: "memory-compressed",
    paper: "Liu et al. 2018, arXiv 1801.10198",
    time: "O(n² d / c)",
    memory: "O(n² / c)",
    capabilities: Capabilities {
        causal: true,
        cross_attention: true,
        prefill_end_padding_only: true,
        ..Capabilities::PADDING_ONLY
    },
};

/// Configuration of [`MemoryCompressedAttention`].
#[derive(Config, Debug)]
pub struct MemoryCompressedConfig {
    /// Model width; split evenly across heads.
    pub d_model: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// Positions per compressed key and value: the convolution's kernel and stride `c` (the
    /// paper: 3).
    #[config(default = 3)]
    pub compression: usize,
    /// Dropout on the attention weights (default 0: none).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases on the Q, K, V and output projections (the compression has its own).
    #[config(default = false)]
    pub bias: bool,
}

impl VariantConfig for MemoryCompressedConfig {
    variant_glue!(
        MemoryCompressedAttention,
        &[INFO],
        new(d_model, n_heads),
        dropout
    );

    fn check_fields(&self) -> Result<(), AttentionError> {
        check_at_least_one(INFO.name, "compression", self.compression)?;
        if self.d_model.checked_mul(self.compression).is_none() {
            return Err(INFO.field_error(
                "compression",
                format!("times d_model ({}) overflows", self.d_model),
            ));
        }
        Ok(())
    }

    fn build(&self, device: &Device) -> MemoryCompressedAttention {
        // A convolution's default initialisation: uniform over ±1/√fan_in, fan_in = c · d_model.
        let compress = LinearConfig::new(self.compression * self.d_model, self.d_model);
        MemoryCompressedAttention {
            proj: QkvoProjection::new(self.d_model, self.n_heads, self.bias, device),
            compress_keys: compress.init(device),
            compress_values: compress.init(device),
            dropout: DropoutConfig::new(self.dropout).init(),
            compression: self.compression,
        }
    }
}

inherent_config_methods!(MemoryCompressedConfig);

/// Multi-head memory-compressed attention. Create with [`MemoryCompressedConfig`].
#[derive(Module, Debug)]
pub struct MemoryCompressedAttention {
    /// Q, K, V and output projections.
    pub proj: QkvoProjection,
    /// The keys' strided convolution as a linear map, `c · d_model -> d_model` (its input a
    /// block's keys position after position).
    pub compress_keys: Linear,
    /// The values' strided convolution, as [`compress_keys`](Self::compress_keys).
    pub compress_values: Linear,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// Positions per compressed key and value.
    #[module(skip)]
    pub compression: usize,
}

projection_shape!(MemoryCompressedAttention);

/// Per-head keys or values cut into blocks: `[batch, heads, n, d]`, `n` a multiple of `c`.
fn blocks_of(x: Tensor<4>, c: usize) -> Tensor<4> {
    let [batch, heads, n, d] = x.dims();
    x.reshape([batch, heads * (n / c), c, d])
}

/// `x: [batch, heads, n, d]` followed by zeros up to a multiple of `c` positions.
fn padded_to_blocks(x: Tensor<4>, c: usize) -> Tensor<4> {
    let n = x.dims()[2];
    zeros_after(x, 2, n.next_multiple_of(c) - n)
}

impl MemoryCompressedAttention {
    /// One key or value per block of `c` positions: `x: [batch, heads, n, d]` (`n` a multiple
    /// of `c`) through `layer`, `[batch, heads, n / c, d]`.
    fn compress(&self, layer: &Linear, x: Tensor<4>) -> Tensor<4> {
        let heads = x.dims()[1];
        let merged = merge_heads(x);
        let [batch, n, d_model] = merged.dims();
        let c = self.compression;
        let blocks = merged.reshape([batch, n / c, c * d_model]);
        split_heads(layer.forward(blocks), heads)
    }

    /// The compressed keys and values of `k`, `v` (`[batch, heads, n, d]`, padded positions
    /// zeroed first), and the blocks wholly of padding (`[batch, ⌈n/c⌉]`), if any padding.
    fn compressed(
        &self,
        k: Tensor<4>,
        v: Tensor<4>,
        key_pad: &Option<Tensor<2, Bool>>,
    ) -> (Tensor<4>, Tensor<4>, Option<Tensor<2, Bool>>) {
        let c = self.compression;
        let [k, v] = [k, v].map(|x| padded_to_blocks(zero_padded(x, key_pad), c));
        let block_pad = key_pad.as_ref().map(|mask| {
            let [batch, n] = mask.dims();
            let m = n.div_ceil(c);
            flags_framed(mask.clone(), 0, m * c - n)
                .reshape([batch, m, c])
                .all_dim(2)
                .reshape([batch, m])
        });
        (
            self.compress(&self.compress_keys, k),
            self.compress(&self.compress_values, v),
            block_pad,
        )
    }

    /// The causal form on per-head tensors `[batch, heads, n, d]`: query `i` over the compressed
    /// blocks before its own (`kc`, `vc`: `[batch, heads, ⌈n/c⌉, d]`, `block_pad` masking the
    /// ones wholly of padding) and its own block's keys up to itself, one softmax over both.
    #[allow(clippy::too_many_arguments)]
    fn causal_attend(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        (kc, vc): (Tensor<4>, Tensor<4>),
        key_pad: &Option<Tensor<2, Bool>>,
        block_pad: &Option<Tensor<2, Bool>>,
    ) -> Tensor<4> {
        let c = self.compression;
        let [batch, heads, n, d] = q.dims();
        let m = n.div_ceil(c);
        let np = m * c;
        let device = q.device();
        let scale = 1.0 / (d as f32).sqrt();
        let [q, k, v] = [q, k, v].map(|x| padded_to_blocks(x, c));
        // Scores over the compressed blocks: block g is masked for query i unless g < ⌊i/c⌋,
        // i.e. where g c + c − 1 >= i.
        let block_ends =
            Tensor::<1, Int>::arange_step(c as i64 - 1..(np + c) as i64 - 1, c, &device)
                .reshape([1, m]);
        let rows = Tensor::<1, Int>::arange(0..np as i64, &device).reshape([np, 1]);
        let future_blocks = block_ends.greater_equal(rows).reshape([1, 1, np, m]);
        let mut over_blocks = q
            .clone()
            .matmul(kc.swap_dims(2, 3))
            .mul_scalar(scale)
            .mask_fill(future_blocks, MASK_FILL);
        if let Some(pad) = block_pad {
            over_blocks = over_blocks.mask_fill(pad.clone().reshape([batch, 1, 1, m]), MASK_FILL);
        }
        // Scores over the own block's keys: `[batch, heads · m, c, c]`, causal within the block.
        let (qb, kb, vb) = (blocks_of(q, c), blocks_of(k, c), blocks_of(v, c));
        let mut within = qb
            .matmul(kb.swap_dims(2, 3))
            .mul_scalar(scale)
            .mask_fill(causal_mask(c, &device).reshape([1, 1, c, c]), MASK_FILL)
            .reshape([batch, heads, np, c]);
        let tail = np - n;
        let raw_pad = match key_pad {
            Some(mask) => Some(flags_framed(mask.clone(), 0, tail)),
            None if tail > 0 => {
                let mut flags = vec![false; np];
                flags[n..].fill(true);
                Some(flags_tensor(&vec![flags; batch], &device))
            }
            None => None,
        };
        if let Some(pad) = raw_pad {
            // Row i of a block sees the block's keys: the block's flags repeated over its rows.
            let per_row = pad
                .reshape([batch, m, 1, c])
                .expand([batch, m, c, c])
                .reshape([batch, 1, np, c]);
            within = within.mask_fill(per_row, MASK_FILL);
        }
        let weights = dropout(
            &self.dropout,
            kernels::softmax(Tensor::cat(vec![over_blocks, within], 3)),
        );
        let from_blocks = weights.clone().slice(s![.., .., .., 0..m]).matmul(vc);
        let from_own = weights
            .slice(s![.., .., .., m..])
            .reshape([batch, heads * m, c, c])
            .matmul(vb)
            .reshape([batch, heads, np, d]);
        (from_blocks + from_own).slice(s![.., .., 0..n])
    }
}

impl AttentionModule for MemoryCompressedAttention {
    variant_facts!(INFO);

    rotary_refused!("its keys and values are compressed by a strided convolution over positions");

    fn try_forward(&self, input: AttentionInput) -> Result<Tensor<3>, AttentionError> {
        input.check_shapes(self.name(), self.d_model())?;
        let masks = input.head_masks();
        let n_k = input.key_len();
        check_capabilities(&INFO, input.query_len(), n_k, masks.causal)?;
        let (q, k, v) = self.proj.project(input);
        check_attention_mask(&INFO, &masks, &q, n_k)?;
        let (kc, vc, block_pad) = self.compressed(k.clone(), v.clone(), &masks.key_pad);
        let o = if masks.causal {
            self.causal_attend(q, k, v, (kc, vc), &masks.key_pad, &block_pad)
        } else {
            exact_softmax_attention(q, kc, vc, block_pad, false, Some(&self.dropout))
        };
        Ok(self.proj.out(o))
    }

    fn prefill(&self, x: Tensor<3>) -> DecodeResult {
        // `prefill_padded` checks the prompt.
        let [batch, n, _] = x.dims();
        let mask = flags_tensor(&vec![vec![false; n]; batch], &x.device());
        let (out, state) = self.prefill_padded(x, mask)?;
        // Every sequence at the same position: nothing for the state to mask.
        let unmasked = |cached: Option<CachedKeys>| {
            cached.map(|cached| CachedKeys {
                padding: None,
                ..cached
            })
        };
        Ok(match state {
            DecodingState::Compressed { blocks, current } => (
                out,
                DecodingState::Compressed {
                    blocks: unmasked(blocks),
                    current: unmasked(current),
                },
            ),
            other => (out, other),
        })
    }

    /// Prompts padded at their end: the causal forward pass; the state holds, per sequence, its
    /// finished blocks compressed and its block under way, the rest masked.
    fn prefill_padded(&self, x: Tensor<3>, mask_pad: Tensor<2, Bool>) -> DecodeResult {
        check_prompt_shapes(self.name(), self.d_model(), &x, Some(&mask_pad))?;
        let lengths = suffix_lengths(INFO.name, &mask_pad)?;
        let c = self.compression;
        let device = x.device();
        let (q, k, v) = self.proj.qkv(x);
        let key_pad = Some(mask_pad);
        let (kc, vc, block_pad) = self.compressed(k.clone(), v.clone(), &key_pad);
        let o = self.causal_attend(
            q,
            k.clone(),
            v.clone(),
            (kc.clone(), vc.clone()),
            &key_pad,
            &block_pad,
        );
        // Sequence b has finished ⌊L_b / c⌋ blocks; its block under way starts there.
        let finished: Vec<usize> = lengths.iter().map(|&len| len / c).collect();
        let most = finished.iter().copied().max().unwrap_or(0);
        let blocks = (most > 0).then(|| CachedKeys {
            keys: kc.slice(s![.., .., 0..most]),
            values: vc.slice(s![.., .., 0..most]),
            padding: Some(flags_tensor(
                &finished
                    .iter()
                    .map(|&f| (0..most).map(|g| g >= f).collect())
                    .collect::<Vec<Vec<bool>>>(),
                &device,
            )),
        });
        let from = finished.iter().map(|&f| f * c).min().unwrap_or(0);
        let to = lengths.iter().copied().max().unwrap_or(0);
        let current = (to > from).then(|| CachedKeys {
            keys: k.slice(s![.., .., from..to]),
            values: v.slice(s![.., .., from..to]),
            padding: Some(flags_tensor(
                &lengths
                    .iter()
                    .zip(&finished)
                    .map(|(&len, &f)| (from..to).map(|j| j < f * c || j >= len).collect())
                    .collect::<Vec<Vec<bool>>>(),
                &device,
            )),
        });
        Ok((
            self.proj.out(o),
            DecodingState::Compressed { blocks, current },
        ))
    }

    /// Attends over the finished blocks' compressed keys and the block under way's keys (this
    /// token's included); a sequence whose block fills up compresses it into one more block.
    fn decode(&self, x: Tensor<3>, state: DecodingState) -> DecodeResult {
        check_token(self.name(), self.d_model(), &x)?;
        let (blocks, current) = match state {
            DecodingState::Empty => (None, None),
            DecodingState::Compressed { blocks, current } => (blocks, current),
            _ => {
                return Err(AttentionError::unsupported(
                    INFO.name,
                    "another variant's decoding state (it carries compressed blocks)",
                ));
            }
        };
        let (q, k, v) = self.proj.qkv(x);
        let current = append(current, k, v);
        let seen = match &blocks {
            Some(blocks) => concat(blocks, &current),
            None => current.clone(),
        };
        let o = exact_softmax_attention(q, seen.keys, seen.values, seen.padding, false, None);
        let (blocks, current) = self.close_full_blocks(blocks, current);
        Ok((
            self.proj.out(o),
            DecodingState::Compressed { blocks, current },
        ))
    }
}

impl MemoryCompressedAttention {
    /// After a step: every sequence whose block under way holds `c` keys compresses them into
    /// one more finished block, and the block under way drops the columns no sequence needs.
    fn close_full_blocks(
        &self,
        blocks: Option<CachedKeys>,
        current: CachedKeys,
    ) -> (Option<CachedKeys>, Option<CachedKeys>) {
        let c = self.compression;
        let [batch, heads, columns, d] = current.keys.dims();
        let Some(padding) = &current.padding else {
            // Every sequence at the same position.
            if columns < c {
                return (blocks, Some(current));
            }
            let block = CachedKeys {
                keys: self.compress(&self.compress_keys, current.keys),
                values: self.compress(&self.compress_values, current.values),
                padding: None,
            };
            let blocks = match blocks {
                Some(blocks) => concat(&blocks, &block),
                None => block,
            };
            return (Some(blocks), None);
        };
        let mut unseen = padding_flags(&Some(padding.clone()), batch, columns);
        let own: Vec<Vec<usize>> = unseen
            .iter()
            .map(|row| (0..columns).filter(|&j| !row[j]).collect())
            .collect();
        let full: Vec<bool> = own.iter().map(|cols| cols.len() == c).collect();
        let mut blocks = blocks;
        if full.contains(&true) {
            // Each full sequence's c keys, gathered in order (others: any columns, masked).
            let index: Vec<i64> = own
                .iter()
                .flat_map(|cols| (0..c).map(|s| cols.get(s).map_or(0, |&j| j as i64)))
                .collect();
            let device = current.keys.device();
            let index = Tensor::<1, Int>::from_data(TensorData::new(index, [batch * c]), &device)
                .reshape([batch, 1, c, 1])
                .expand([batch, heads, c, d]);
            let block = CachedKeys {
                keys: self.compress(
                    &self.compress_keys,
                    current.keys.clone().gather(2, index.clone()),
                ),
                values: self.compress(
                    &self.compress_values,
                    current.values.clone().gather(2, index),
                ),
                padding: Some(flags_tensor(
                    &full.iter().map(|&f| vec![!f]).collect::<Vec<_>>(),
                    &device,
                )),
            };
            blocks = Some(match blocks {
                Some(blocks) => concat(&blocks, &block),
                None => block,
            });
            for (row, &f) in unseen.iter_mut().zip(&full) {
                if f {
                    row.fill(true);
                }
            }
        }
        // Columns masked in every sequence, from the front, are no one's any more.
        let drop = (0..columns)
            .find(|&j| unseen.iter().any(|row| !row[j]))
            .unwrap_or(columns);
        if drop == columns {
            return (blocks, None);
        }
        let unseen: Vec<Vec<bool>> = unseen.into_iter().map(|row| row[drop..].to_vec()).collect();
        let current = CachedKeys {
            padding: Some(flags_tensor(&unseen, &current.keys.device())),
            keys: current.keys.slice(s![.., .., drop..]),
            values: current.values.slice(s![.., .., drop..]),
        };
        (blocks, Some(current))
    }
}

/// `cached` with this token's key and value (`[batch, heads, 1, d]`) appended, seen by every
/// sequence.
fn append(cached: Option<CachedKeys>, k: Tensor<4>, v: Tensor<4>) -> CachedKeys {
    let token = CachedKeys {
        padding: None,
        keys: k,
        values: v,
    };
    match cached {
        Some(cached) => concat(&cached, &token),
        None => token,
    }
}

/// `a`'s keys and values followed by `b`'s, with their padding (unmasked where one has none).
fn concat(a: &CachedKeys, b: &CachedKeys) -> CachedKeys {
    let padding = match (&a.padding, &b.padding) {
        (None, None) => None,
        (pa, pb) => {
            let [batch, _, ta, _] = a.keys.dims();
            let tb = b.keys.dims()[2];
            let device = a.keys.device();
            let or_none = |pad: &Option<Tensor<2, Bool>>, t: usize| {
                pad.clone()
                    .unwrap_or_else(|| Tensor::<2, Bool>::full([batch, t], false, &device))
            };
            Some(Tensor::cat(vec![or_none(pa, ta), or_none(pb, tb)], 1))
        }
    };
    CachedKeys {
        keys: Tensor::cat(vec![a.keys.clone(), b.keys.clone()], 2),
        values: Tensor::cat(vec![a.values.clone(), b.values.clone()], 2),
        padding,
    }
}
