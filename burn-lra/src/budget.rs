//! What a model costs before it exists: its parameters counted from shapes (all of them, and
//! those it trains), its budget beside the softmax baseline (LRA's rule: at most 10% more), and
//! whether training it fits in this machine's memory.

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::config::RunConfig;
use crate::memory::available_memory;
use crate::model::{ClassifierSpec, LraClassifier};
use crate::tasks::LraTask;

/// Scalars in a classifier's parameters, counted from shapes with checked arithmetic and without
/// allocating any; `None` where a count does not fit in a `usize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamCount {
    /// Every parameter, frozen ones included (what memory holds).
    pub all: Option<usize>,
    /// The trainable ones (what LRA's budget counts).
    pub trainable: Option<usize>,
}

impl ParamCount {
    /// Counts the classifier `spec` describes: the encoder from lazily built blocks, one for a
    /// plain stack, one per layer for a hybrid one
    /// ([`burn_attention_zoo::EncoderConfig::num_params`] and `num_trainable_params`), the
    /// rest (embeddings, positions, head: all trained) from a lazily built one-layer classifier.
    pub fn of(spec: &ClassifierSpec) -> Result<Self> {
        let device = crate::backend::any_device()?;
        let mut one_layer = spec.clone();
        one_layer.encoder.n_layers = 1;
        one_layer.encoder.layers.truncate(1);
        let model = LraClassifier::new(&one_layer, &device);
        let rest = burn_attention_zoo::num_params_checked(&model)
            .zip(burn_attention_zoo::num_params_checked(&model.encoder))
            .map(|(whole, encoder)| whole - encoder);
        let plus_rest = |encoder: Option<usize>| {
            rest.zip(encoder)
                .and_then(|(rest, encoder)| rest.checked_add(encoder))
        };
        Ok(Self {
            all: plus_rest(spec.encoder.num_params(&device)?),
            trainable: plus_rest(spec.encoder.num_trainable_params(&device)?),
        })
    }
}

/// A model's trainable parameters beside those of the softmax baseline built from the same
/// configuration (LRA's "apples to apples" rule: at most 10% more). Frozen tensors (Performer's
/// random features) are not counted.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ParamBudget {
    /// Trainable parameters of the model.
    pub n_params: usize,
    /// Trainable parameters of the softmax model of the same configuration.
    pub softmax_params: usize,
}

impl ParamBudget {
    /// The budget of a model counted `model` beside the softmax baseline counted `softmax`.
    pub fn new(model: &ParamCount, softmax: &ParamCount) -> Result<Self> {
        let trainable = |count: &ParamCount| {
            count
                .trainable
                .context("the model's parameters are more than can be counted")
        };
        Ok(Self {
            n_params: trainable(model)?,
            softmax_params: trainable(softmax)?,
        })
    }

    /// Relative increase over the softmax baseline (0.05 = 5% more).
    pub fn increase(&self) -> f64 {
        self.n_params as f64 / self.softmax_params as f64 - 1.0
    }
}

/// Bytes training holds per parameter, activations aside: the f32 weights, their gradients,
/// AdamW's two moments and the best-validation copy.
const TRAINING_BYTES_PER_PARAM: u64 = 5 * 4;

/// Refuses a classifier whose parameters cannot be trained in the memory this machine has
/// available (or cannot even be counted), naming the field of `config` that makes them too
/// large, before anything is allocated: parameters are counted from shapes ([`ParamCount`]).
/// `count` is that of the classifier of `task` with `attention` for `config`; the variations
/// that name the field are resolved and counted only when it does not fit.
///
/// Activations are bounded from below only ([`check_activations`]: a batch of `data.max_len`
/// tokens, the longest a batch can be; batches are padded to their longest example, so what a
/// step holds grows with the data). Where the available memory is unknown (not Linux), only
/// the count itself is checked.
pub fn check_memory(
    count: &ParamCount,
    config: &RunConfig,
    task: &dyn LraTask,
    attention: &str,
) -> Result<()> {
    let available = available_memory().unwrap_or(u64::MAX);
    let needs = |count: &ParamCount| {
        (count.all).and_then(|n| (n as u64).checked_mul(TRAINING_BYTES_PER_PARAM))
    };
    let fits = |bytes: Option<u64>| bytes.is_some_and(|b| b <= available);
    let bytes = needs(count);
    if fits(bytes) {
        return check_activations(config, available, ["training.batch_size", "data.max_len"]);
    }
    let fits_as = |config: &RunConfig| -> Result<bool> {
        let spec = ClassifierSpec::resolve(config, task, attention)?;
        Ok(fits(needs(&ParamCount::of(&spec)?)))
    };
    let mut shorter = config.clone();
    shorter.data.max_len = config.data.max_len.min(512);
    // Every layer's attention with its paper defaults (a hybrid stack's parts each have their
    // own table).
    let parts = burn_attention_zoo::hybrid_pattern(attention)?;
    let mut defaults = config.clone();
    let tables: Vec<&str> = (parts.iter().copied())
        .filter(|part| config.attention.contains_key(*part))
        .collect();
    for part in &tables {
        defaults.attention.remove(*part);
    }
    // The fewest layers the attention takes: one, or a hybrid stack's pattern once.
    let mut one_layer = config.clone();
    one_layer.model.n_layers = parts.len();
    let field = if fits_as(&shorter)? {
        format!("`data.max_len` = {}", config.data.max_len)
    } else if !tables.is_empty() && fits_as(&defaults)? {
        // The table that makes it too large: the first whose defaults alone would fit.
        let culprit = tables
            .iter()
            .find(|part| {
                let mut without = config.clone();
                without.attention.remove(**part);
                fits_as(&without).unwrap_or(false)
            })
            .unwrap_or(&tables[0]);
        format!("`attention.{culprit}`")
    } else if config.model.n_layers > one_layer.model.n_layers && fits_as(&one_layer)? {
        format!("`model.n_layers` = {}", config.model.n_layers)
    } else {
        "the `model` sizes (`d_model`, `d_ff`, `d_mlp`, `n_layers`)".to_string()
    };
    let gb = |b: u64| b as f64 / 1e9;
    match bytes {
        None => bail!(
            "{field} is too large: the model's parameters are more than can be counted (over \
             2^64 bytes to train)"
        ),
        Some(bytes) => bail!(
            "{field} is too large: training the model's {} parameters needs {:.1} GB (weights, \
             gradients, AdamW's two moments and the best-validation copy), more than the {:.1} GB \
             of memory available",
            bytes / TRAINING_BYTES_PER_PARAM,
            gb(bytes),
            gb(available)
        ),
    }
}

/// Refuses a batch whose activations surely exceed `available` bytes, naming the batch size
/// and the length as `names` gives them (the configuration's fields, or a benchmark's flags):
/// at least `4 + 4 n_layers` tensors of `[batch_size, max_len, d_model]` f32 (the embeddings,
/// each block's input, attention output and feed-forward input and output, kept for the
/// backward pass, and their gradients), a lower bound of what a training step holds.
pub fn check_activations(
    config: &RunConfig,
    available: u64,
    [batch, len]: [&str; 2],
) -> Result<()> {
    let m = &config.model;
    let bytes = [4 * m.n_layers as u64 + 4, 4]
        .into_iter()
        .chain([config.training.batch_size, config.encoder_len(), m.d_model].map(|d| d as u64))
        .try_fold(1u64, |total, d| total.checked_mul(d));
    if bytes.is_none_or(|b| b > available) {
        bail!(
            "`{batch}` x `{len}` ({} x {}) is too large: the activations of a training step \
             (d_model {}, {} layers) alone exceed the {:.1} GB of memory available",
            config.training.batch_size,
            config.data.max_len,
            m.d_model,
            m.n_layers,
            available as f64 / 1e9
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PairFeatures;
    use crate::tasks::TASKS;
    use burn::module::Module;
    use burn::prelude::*;

    /// The classifier of `task` for `config` with `attention`.
    fn spec(config: &RunConfig, task: &dyn LraTask, attention: &str) -> ClassifierSpec {
        ClassifierSpec::resolve(config, task, attention).unwrap()
    }

    /// The budget of `attention` beside softmax, for `config` of `task`.
    fn budget(config: &RunConfig, task: &dyn LraTask, attention: &str) -> ParamBudget {
        let count = |name| ParamCount::of(&spec(config, task, name)).unwrap();
        ParamBudget::new(&count(attention), &count("softmax")).unwrap()
    }

    /// The Yorsh & Kovalenko budget: every trainable kernel adds less than 10% parameters over
    /// the softmax model on each task's `lra` preset. The expected increase is also counted by
    /// hand: `n_layers · units · d_head²` per full matrix (shared by a layer's heads).
    #[test]
    fn trainable_kernels_stay_within_ten_percent_on_lra_presets() {
        for task in TASKS.iter().filter(|task| task.in_lra()) {
            let config = RunConfig::preset(task.name(), "lra").unwrap();
            let m = &config.model;
            let d = m.d_model / m.n_heads;
            for (name, matrices) in [
                ("ff-linear", d * d),
                ("ff-orth-linear", d * d),
                ("ff-glu", 2 * d * d),
                ("ff-oglu", 2 * d * d),
                ("ff-aoglu", 3 * (d * d + 2 * d * (d / 4))),
            ] {
                let budget = budget(&config, *task, name);
                assert_eq!(
                    budget.n_params - budget.softmax_params,
                    m.n_layers * matrices,
                    "{} {name}",
                    task.name()
                );
                assert!(
                    budget.increase() < 0.10,
                    "{} {name}: {:.2}% over softmax",
                    task.name(),
                    100.0 * budget.increase()
                );
            }
        }
    }

    /// The counts from shapes (one block built, lazily; nothing allocated) equal Burn's counts
    /// over the whole built model, all parameters and the trainable ones, for every attention
    /// and every task's `tiny` preset at 2 and 3 layers; sizes whose product overflows give no
    /// count, and the memory check refuses them naming the field, without building anything.
    #[test]
    fn parameters_are_counted_from_shapes() {
        let device = Device::flex();
        for task in TASKS {
            let mut config = RunConfig::preset(task.name(), "tiny").unwrap();
            for n_layers in [2, 3] {
                config.model.n_layers = n_layers;
                for variant in burn_attention_zoo::VARIANTS {
                    let spec = spec(&config, *task, variant.name);
                    let built = LraClassifier::new(&spec, &device);
                    assert_eq!(
                        ParamCount::of(&spec).unwrap(),
                        ParamCount {
                            all: Some(built.num_params()),
                            trainable: Some(burn_attention_zoo::num_trainable_params(&built)),
                        },
                        "{} {}",
                        task.name(),
                        variant.name
                    );
                }
            }
        }
        let listops = crate::tasks::find("listops").unwrap();
        let mut config = RunConfig::preset("listops", "tiny").unwrap();
        config.model.d_model = 4_000_000_000;
        config.model.n_heads = 1;
        config.model.d_ff = 4_000_000_000;
        config.model.n_layers = 4_000_000_000;
        let huge = spec(&config, listops, "softmax");
        assert_eq!(ParamCount::of(&huge).unwrap().all, None);
        let err = format!(
            "{:#}",
            check_memory(&ParamCount::of(&huge).unwrap(), &config, listops, "softmax").unwrap_err()
        );
        assert!(err.contains("more than can be counted"), "{err}");
        let mut config = RunConfig::preset("listops", "tiny").unwrap();
        config.model.n_layers = 4_000_000_000;
        let deep = spec(&config, listops, "softmax");
        let err = format!(
            "{:#}",
            check_memory(&ParamCount::of(&deep).unwrap(), &config, listops, "softmax").unwrap_err()
        );
        assert!(
            err.starts_with("`model.n_layers` = 4000000000 is too large"),
            "{err}"
        );
    }

    /// Every registered attention's own numeric parameters (each integer field of its resolved
    /// configuration, and each optional one) at 0, 1, the largest size the harness accepts
    /// ([`crate::limits::MAX_SIZE`]) and one past it, set in its `[attention.<name>]` table of
    /// the ListOps `tiny` preset: each value is refused with a one-line error naming the field
    /// or the table, or passes every check made before anything is allocated (the
    /// configuration's, the parameter count's and the memory check's), and then the model
    /// builds and runs one batch, so that no accepted size aborts on an allocation. One past the
    /// largest is always refused, naming the field.
    #[test]
    fn attention_sizes_are_checked_before_anything_is_allocated() {
        use crate::limits::MAX_SIZE;
        let listops = crate::tasks::find("listops").unwrap();
        let base = RunConfig::preset("listops", "tiny").unwrap();
        let device = Device::flex();
        let mut walked = 0;
        for variant in burn_attention_zoo::VARIANTS {
            let name = variant.name;
            let resolved = serde_json::to_value(base.attention_config(name).unwrap()).unwrap();
            let fields = (resolved.as_object().unwrap().values().next().unwrap())
                .as_object()
                .unwrap()
                .clone();
            for (key, value) in fields {
                let shape = ["d_model", "n_heads", "n_max"].contains(&key.as_str());
                if shape || !(value.is_u64() || value.is_null()) {
                    continue;
                }
                walked += 1;
                for size in [0, 1, MAX_SIZE as u64, MAX_SIZE as u64 + 1] {
                    let mut config = base.clone();
                    (config.attention.entry(name.to_string()).or_default())
                        .insert(key.clone(), size.into());
                    let outcome = config.validate().and_then(|()| {
                        let spec = ClassifierSpec::resolve(&config, listops, name)?;
                        check_memory(&ParamCount::of(&spec)?, &config, listops, name)?;
                        Ok(spec)
                    });
                    match outcome {
                        Ok(spec) => {
                            assert!(
                                size <= MAX_SIZE as u64,
                                "{name}.{key} = {size} was accepted"
                            );
                            let model = LraClassifier::new(&spec, &device);
                            let ids = Tensor::<2, Int>::ones([1, 9], &device);
                            let mask_pad = ids.clone().equal_elem(0);
                            let tokens = crate::data::Tokens { ids, mask_pad };
                            let _ = model.forward_with_loss(tokens, None, None);
                        }
                        Err(err) => {
                            let err = format!("{err:#}");
                            assert_eq!(err.lines().count(), 1, "{name}.{key} = {size}: {err}");
                            assert!(
                                err.contains(&format!("`{key}`"))
                                    || err.contains(&format!("attention.{name}")),
                                "{name}.{key} = {size}: {err}"
                            );
                        }
                    }
                }
            }
        }
        assert!(walked >= 40, "only {walked} numeric parameters walked");
    }

    /// Frozen tensors are not trainable: Performer's random features leave its count equal to
    /// softmax's, while Burn's `num_params` includes them.
    #[test]
    fn budget_counts_trainable_parameters_only() {
        let device = Device::flex();
        let listops = crate::tasks::find("listops").unwrap();
        let config = RunConfig::preset("listops", "tiny").unwrap();
        let performer = budget(&config, listops, "performer");
        assert_eq!(performer.n_params, performer.softmax_params);
        let model = LraClassifier::new(&spec(&config, listops, "performer"), &device);
        assert!(model.num_params() > performer.n_params);
        assert_eq!(
            budget(&config, listops, "softmax").n_params,
            LraClassifier::new(&spec(&config, listops, "softmax"), &device).num_params()
        );
    }

    /// The `lra` presets build the LRA reference models: parameter counts derived in docs/lra.md
    /// (ListOps 8.95M, Text 3.49M, Matching 1.09M with the concat head).
    #[test]
    fn lra_presets_have_the_reference_sizes() {
        for (task, expected, concat) in [
            ("listops", 8.95e6, false),
            ("text", 3.49e6, false),
            ("matching", 1.09e6, true),
        ] {
            let mut config = RunConfig::preset(task, "lra").unwrap();
            if concat {
                config.model.pair_features = PairFeatures::Concat;
            }
            let n = budget(&config, crate::tasks::find(task).unwrap(), "softmax").n_params as f64;
            assert!(
                (n - expected).abs() < 0.005e6,
                "{task}: {n} parameters, docs/lra.md: {expected}"
            );
        }
    }
}
