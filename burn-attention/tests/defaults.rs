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
            &serde_json::to_value(config.with_dropout(0.25)).unwrap(),
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
