//! The small configurations the shared test binaries run every registered variant at.
#![allow(dead_code)]

use burn_attention_zoo::AttentionConfig;

/// The registered variant `name` at width `d_model` with `n_heads` heads on sequences of up to
/// `n_max` positions, dropout off, cut down to small inputs by the variant's own
/// `VariantConfig::small` (Linformer k = 5, Performer 24 features, blocks and windows of a few
/// positions, and so on: each variant's file says what it cuts).
pub fn small_config(name: &str, d_model: usize, n_heads: usize, n_max: usize) -> AttentionConfig {
    AttentionConfig::from_name(name, d_model, n_heads, n_max)
        .unwrap()
        .with_weight_dropout(0.0)
        .small()
}
