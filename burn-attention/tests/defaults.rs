//! What the library's constructors give a user who sets nothing: no dropout on the attention
//! weights (a non-zero value costs speed on some backends, so it is asked for, never implied).

use burn_attention_zoo::{AttentionConfig, VARIANTS};

/// Every `dropout` field of a configuration, as JSON.
fn dropouts(value: &serde_json::Value, out: &mut Vec<f64>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match value.as_f64() {
                    Some(x) if key == "dropout" => out.push(x),
                    _ => dropouts(value, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| dropouts(v, out)),
        _ => {}
    }
}

#[test]
fn constructors_by_name_drop_no_attention_weights() {
    let mut with_dropout = 0;
    for v in VARIANTS {
        let config = AttentionConfig::from_name(v.name, 64, 4, 512).unwrap();
        let mut found = Vec::new();
        dropouts(&serde_json::to_value(&config).unwrap(), &mut found);
        assert!(found.iter().all(|&x| x == 0.0), "{}: {found:?}", v.name);
        with_dropout += usize::from(!found.is_empty());
        // And where one is asked for, it is set.
        let mut set = Vec::new();
        dropouts(
            &serde_json::to_value(config.with_weight_dropout(0.25)).unwrap(),
            &mut set,
        );
        assert_eq!(
            set,
            found.iter().map(|_| 0.25).collect::<Vec<_>>(),
            "{}",
            v.name
        );
    }
    // The variants with a weight matrix to drop from (softmax, Linformer, the sparse patterns,
    // ...) were found, not none.
    assert!(with_dropout >= 10, "{with_dropout}");
}

/// `AttentionConfig::named` is `from_name` without `n_max` for every variant that does not read
/// one, and an error naming `n_max` for those that do; `EncoderConfig::named` builds in one call
/// what the nested configurations build, and the widths are read back from config and module.
#[test]
fn named_constructors_ask_for_n_max_only_where_it_matters() {
    use burn::prelude::*;
    use burn_attention_zoo::{EncoderBlockConfig, EncoderConfig};
    let mut fixed = 0;
    for v in VARIANTS {
        match AttentionConfig::named(v.name, 64, 4) {
            Ok(config) => {
                assert!(!v.capabilities.fixed_max_len, "{}", v.name);
                let nested = AttentionConfig::from_name(v.name, 64, 4, 512).unwrap();
                assert_eq!(
                    serde_json::to_value(&config).unwrap(),
                    serde_json::to_value(&nested).unwrap(),
                    "{}",
                    v.name
                );
                assert_eq!((config.d_model(), config.n_heads()), (64, 4), "{}", v.name);
            }
            Err(err) => {
                assert!(v.capabilities.fixed_max_len, "{}: {err}", v.name);
                assert!(err.to_string().contains("n_max"), "{err}");
                fixed += 1;
            }
        }
    }
    // linformer, linformer-linear, bigbird, synthesizer, synthesizer-dense, sinkhorn.
    assert_eq!(fixed, 6);
    let flat = EncoderConfig::named("performer", 32, 4, 64, 2).unwrap();
    let nested = EncoderConfig::new(
        EncoderBlockConfig::new(
            AttentionConfig::from_name("performer", 32, 4, 100).unwrap(),
            64,
        ),
        2,
    );
    assert_eq!(
        serde_json::to_value(&flat).unwrap(),
        serde_json::to_value(&nested).unwrap()
    );
    assert_eq!((flat.d_model(), flat.n_heads()), (32, 4));
    let encoder = flat.init(&Device::flex());
    assert_eq!(encoder.d_model(), 32);
    assert!(EncoderConfig::named("performer", 32, 4, 64, 0).is_err());
}

/// Every registered module answers its width and head count (read from its parameters' shapes,
/// not from its configuration), and so do a block and an encoder built around it; the two
/// dropouts are set by their names.
#[test]
fn modules_report_their_shape_and_dropouts_are_named() {
    use burn::prelude::*;
    use burn_attention_zoo::EncoderConfig;
    let device = Device::flex();
    for v in VARIANTS {
        // Widths and head counts that no default shares, so a value read from the wrong place
        // shows.
        let config = AttentionConfig::from_name(v.name, 48, 3, 96).unwrap();
        let attention = config.init(&device);
        assert_eq!(
            (attention.d_model(), attention.n_heads()),
            (48, 3),
            "{}",
            v.name
        );
    }
    let encoder = EncoderConfig::named("softmax", 40, 5, 64, 2)
        .unwrap()
        .with_residual_dropout(0.3)
        .with_weight_dropout(0.2);
    assert_eq!(encoder.block.residual_dropout, 0.3);
    let weight_dropout = serde_json::to_value(&encoder.block.attention).unwrap();
    assert_eq!(
        weight_dropout["Softmax"]["dropout"], 0.2,
        "{weight_dropout}"
    );
    let encoder = encoder.init(&device);
    assert_eq!((encoder.d_model(), encoder.n_heads()), (40, 5));
    assert_eq!(encoder.blocks[1].d_model(), 40);
    assert_eq!(encoder.blocks[0].dropout.prob, 0.3);
}
