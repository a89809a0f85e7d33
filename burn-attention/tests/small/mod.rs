//! The small configurations the shared test binaries run every registered variant at.
#![allow(dead_code)]

use burn_attention_zoo::{AttentionConfig, BigBirdConfig, SinkhornConfig, SynthesizerConfig};

/// The small compressive configuration's sizes (see [`small_config`]).
pub struct CompressiveSizes {
    pub segment_len: usize,
    pub mem_len: usize,
    pub compression: usize,
    pub cmem_len: usize,
}

/// Segments of 4, 2 positions of memory, slots of 2 positions, 3 of them.
pub const COMPRESSIVE: CompressiveSizes = CompressiveSizes {
    segment_len: 4,
    mem_len: 2,
    compression: 2,
    cmem_len: 3,
};

/// The registered variant `name` at width `d_model` with `n_heads` heads on sequences of up to
/// `n_max` positions, dropout off, its large defaults cut down (Linformer k = 5, Performer 24
/// features, Nyströmformer 4 landmarks, local blocks of 4 and windows of 2,
/// sparse blocks of 4 with 1 summary, Longformer windows of 4, BigBird
/// blocks of 2 with 1 random block, Reformer chunks of 3 and 4 buckets, axial rows of 4, Transformer-XL segments of 8 with
/// 6 of memory, compressive segments of 4, memory 2, 3 compressed slots of 2, routing 3 clusters and
/// windows of 2). A new variant with large defaults gets its line here.
pub fn small_config(name: &str, d_model: usize, n_heads: usize, n_max: usize) -> AttentionConfig {
    let config = AttentionConfig::from_name(name, d_model, n_heads, n_max)
        .unwrap()
        .with_weight_dropout(0.0);
    match config {
        AttentionConfig::Linformer(c) => AttentionConfig::Linformer(c.with_k(5)),
        AttentionConfig::Performer(c) => AttentionConfig::Performer(c.with_n_features(24)),
        AttentionConfig::Nystrom(c) => AttentionConfig::Nystrom(c.with_n_landmarks(4)),
        AttentionConfig::Local(c) => AttentionConfig::Local(c.with_block_size(4).with_window(2)),
        AttentionConfig::Sparse(c) => AttentionConfig::Sparse(c.with_block_size(4).with_summary(1)),
        AttentionConfig::Longformer(c) => AttentionConfig::Longformer(c.with_window(4)),
        // A table for 96 positions: the shared checks run sequences of up to 70.
        AttentionConfig::BigBird(c) => AttentionConfig::BigBird(
            BigBirdConfig {
                n_max: n_max.max(96),
                ..c
            }
            .with_block_size(2)
            .with_random_blocks(1),
        ),
        // Synthesized rows for 96 positions, as BigBird's table.
        AttentionConfig::Synthesizer(c) => AttentionConfig::Synthesizer(
            SynthesizerConfig {
                n_max: n_max.max(96),
                ..c
            }
            .with_k(4),
        ),
        AttentionConfig::Sinkhorn(c) => AttentionConfig::Sinkhorn(
            SinkhornConfig {
                n_max: n_max.max(96),
                ..c
            }
            .with_block_size(3),
        ),
        // Rows of 4: the checks' sequences (1 to 70 positions) are grids with a partial last row.
        AttentionConfig::Axial(c) => AttentionConfig::Axial(c.with_width(Some(4))),
        // Segments of 8 with 6 positions of memory (less than a segment, so that the oldest
        // memory positions are masked): the checks' sequences cross several segments.
        AttentionConfig::TransformerXl(c) => {
            AttentionConfig::TransformerXl(c.with_segment_len(8).with_mem_len(6))
        }
        // Segments of 4, 2 positions of memory, slots of 2 positions, 3 of them: a sequence of
        // 7 already compresses a block, the checks' longer ones fill the compressed memory.
        AttentionConfig::Compressive(c) => AttentionConfig::Compressive(
            c.with_segment_len(COMPRESSIVE.segment_len)
                .with_mem_len(COMPRESSIVE.mem_len)
                .with_compression(COMPRESSIVE.compression)
                .with_cmem_len(COMPRESSIVE.cmem_len),
        ),
        // Three clusters (so that the checks' sequences fill several, each of ⌈n/3⌉) and
        // windows of 2 for the local heads.
        AttentionConfig::Routing(c) => {
            AttentionConfig::Routing(c.with_n_clusters(3).with_window(2))
        }
        AttentionConfig::Reformer(c) => {
            AttentionConfig::Reformer(c.with_chunk_len(3).with_n_buckets(4))
        }
        other => other,
    }
}
