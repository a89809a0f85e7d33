//! Hybrid stacks: an encoder whose layers take different attentions, from a pattern of names
//! (`gla+local`) or a list of configurations. Each layer holds the attention its place in the
//! pattern gives; the parameter count from shapes equals the built stack's; decoding token by
//! token through a stack of recurrent and softmax layers equals its causal forward pass; a
//! pattern that does not fit is refused with the field named.

use burn::prelude::*;
use burn::tensor::{Distribution, Tolerance};
use burn_attention_zoo::{
    AttentionConfig, AttentionError, AttentionInput, AttentionModule, DecodingState, EncoderConfig,
    num_params_checked,
};

const D_MODEL: usize = 16;
const N_HEADS: usize = 2;

fn random(shape: [usize; 3], device: &Device) -> Tensor<3> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
}

#[test]
fn each_layer_takes_its_place_in_the_pattern() {
    let device = Device::flex();
    let config = EncoderConfig::named("gla+gla+local", D_MODEL, N_HEADS, 32, 6).unwrap();
    let names: Vec<&str> = config.layer_attentions().iter().map(|a| a.name()).collect();
    assert_eq!(names, ["gla", "gla", "local", "gla", "gla", "local"]);
    assert!(config.is_hybrid());
    let encoder = config.init(&device);
    let built: Vec<&str> = encoder.blocks.iter().map(|b| b.attention.name()).collect();
    assert_eq!(built, names);
    // Counted from shapes, as built.
    assert_eq!(
        config.num_params(&device).unwrap(),
        num_params_checked(&encoder)
    );
    // One name is a plain stack.
    let plain = EncoderConfig::named("gla", D_MODEL, N_HEADS, 32, 2).unwrap();
    assert!(plain.layers.is_empty() && !plain.is_hybrid());
}

/// The frozen parameters of the layers that have them (Performer's features) are left out of
/// the trainable count, layer by layer.
#[test]
fn trainable_parameters_leave_out_each_layers_frozen_ones() {
    let device = Device::flex();
    let hybrid = EncoderConfig::named("performer+softmax", D_MODEL, N_HEADS, 32, 2).unwrap();
    let all = hybrid.num_params(&device).unwrap().unwrap();
    let trainable = hybrid.num_trainable_params(&device).unwrap().unwrap();
    let performer = AttentionConfig::named("performer", D_MODEL, N_HEADS).unwrap();
    assert_eq!(all - trainable, performer.frozen_params().unwrap());
    assert!(performer.frozen_params().unwrap() > 0);
}

/// Decoding through a stack of GLA, softmax, RetNet and Mamba-2 layers, after a prompt
/// prefilled at once, equals the causal forward pass: every layer carries its own kind of
/// state (a decayed one, a key-value cache).
#[test]
fn decoding_through_a_hybrid_stack_equals_its_causal_forward() {
    let device = Device::flex();
    device.seed(3);
    let encoder = EncoderConfig::named("gla+softmax+retnet+mamba2", D_MODEL, N_HEADS, 32, 4)
        .unwrap()
        .init(&device);
    let x = random([2, 30, D_MODEL], &device);
    let full = encoder.forward(AttentionInput::new(x.clone()).causal(true));
    let (prefilled, mut states) = encoder.prefill(x.clone().slice(s![.., 0..20])).unwrap();
    assert!(matches!(states[0], DecodingState::Decayed(_)));
    assert!(!matches!(states[1], DecodingState::Decayed(_)));
    let mut decoded = Vec::new();
    for t in 20..30 {
        let (y, next) = encoder
            .decode(x.clone().slice(s![.., t..t + 1]), states)
            .unwrap();
        decoded.push(y);
        states = next;
    }
    let tolerance = Tolerance::absolute(1e-5).set_relative(2e-4);
    prefilled
        .into_data()
        .assert_approx_eq::<f32>(&full.clone().slice(s![.., 0..20]).into_data(), tolerance);
    Tensor::cat(decoded, 1)
        .into_data()
        .assert_approx_eq::<f32>(&full.slice(s![.., 20..]).into_data(), tolerance);
}

/// A hybrid stack from code: a list of configurations, one per layer; padding changes no real
/// position's output in the non-causal form (the sequence alone gives the same).
#[test]
fn a_stack_from_configurations_ignores_padding() {
    let device = Device::flex();
    device.seed(4);
    let gla = AttentionConfig::named("gla", D_MODEL, N_HEADS).unwrap();
    let local = AttentionConfig::named("local", D_MODEL, N_HEADS).unwrap();
    let block = burn_attention_zoo::EncoderBlockConfig::new(gla.clone(), 32);
    let encoder = EncoderConfig::new(block, 3)
        .with_layers(vec![gla.clone(), local, gla])
        .init(&device);
    let x = random([1, 24, D_MODEL], &device);
    let padded = Tensor::cat(
        vec![x.clone(), random([1, 9, D_MODEL], &device).mul_scalar(30.0)],
        1,
    );
    let mask = burn_attention_zoo::padding_mask_from_lengths(&[24], 33, &device);
    let alone = encoder.forward(AttentionInput::new(x));
    let with_padding = encoder.forward(AttentionInput::new(padded).mask_pad(mask));
    with_padding
        .slice(s![.., 0..24])
        .into_data()
        .assert_approx_eq::<f32>(
            &alone.into_data(),
            Tolerance::absolute(1e-5).set_relative(1e-4),
        );
}

#[test]
fn patterns_that_do_not_fit_are_refused() {
    let err = |r: Result<EncoderConfig, AttentionError>| r.unwrap_err().to_string();
    let e = err(EncoderConfig::named(
        "gla+gla+local",
        D_MODEL,
        N_HEADS,
        32,
        4,
    ));
    assert!(e.contains("n_layers") && e.contains("pattern of 3"), "{e}");
    // More layers than memory can list: an error, not an abort.
    let e = err(EncoderConfig::named(
        "gla+local",
        D_MODEL,
        N_HEADS,
        32,
        usize::MAX - 1,
    ));
    assert!(
        e.contains("n_layers") && e.contains("more than memory"),
        "{e}"
    );
    let e = err(EncoderConfig::named("gla+nope", D_MODEL, N_HEADS, 32, 2));
    assert!(e.contains("nope"), "{e}");
    let gla = AttentionConfig::named("gla", D_MODEL, N_HEADS).unwrap();
    let block = burn_attention_zoo::EncoderBlockConfig::new(gla.clone(), 32);
    let three = EncoderConfig::new(block.clone(), 3).with_layers(vec![gla.clone(), gla.clone()]);
    let e = three.validate().unwrap_err().to_string();
    assert!(
        e.contains("layers") && e.contains("2 attentions for 3 layers"),
        "{e}"
    );
    let wide = AttentionConfig::named("local", 2 * D_MODEL, N_HEADS).unwrap();
    let e = EncoderConfig::new(block.clone(), 2)
        .with_layers(vec![gla.clone(), wide])
        .validate()
        .unwrap_err()
        .to_string();
    assert!(e.contains("layer 1 (local) is 32 wide"), "{e}");
    let shared = AttentionConfig::from_name("linformer", D_MODEL, N_HEADS, 64)
        .unwrap()
        .with_params(
            &serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(
                r#"{"sharing": "layerwise"}"#,
            )
            .unwrap(),
        )
        .unwrap();
    let e = EncoderConfig::new(block, 2)
        .with_layers(vec![gla, shared])
        .validate()
        .unwrap_err()
        .to_string();
    assert!(e.contains("layerwise"), "{e}");
}

/// The attention-weight dropout reaches every layer of a hybrid stack.
#[test]
fn weight_dropout_reaches_every_layer() {
    let config = EncoderConfig::named("softmax+local", D_MODEL, N_HEADS, 32, 2)
        .unwrap()
        .with_weight_dropout(0.25);
    for attention in config.layer_attentions() {
        let json = serde_json::to_string(attention).unwrap();
        assert!(
            json.contains("0.25"),
            "{} keeps no dropout: {json}",
            attention.name()
        );
    }
}

/// A pattern with an empty or unknown part is refused naming the pattern and the layer; an
/// empty name says it is empty.
#[test]
fn bad_patterns_name_the_pattern_and_the_part() {
    for (pattern, says) in [
        ("+", "attention pattern `+`: layer 1 of 2 is empty"),
        (
            "gla++local",
            "attention pattern `gla++local`: layer 2 of 3 is empty",
        ),
        ("gla+", "attention pattern `gla+`: layer 2 of 2 is empty"),
        (
            "gla+nope",
            "attention pattern `gla+nope`: layer 2 of 2: unknown attention `nope`",
        ),
        ("", "the attention's name is empty"),
    ] {
        let err = EncoderConfig::named(pattern, D_MODEL, N_HEADS, 32, 2)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(says), "{pattern:?}: {err}");
    }
}
