//! Run configurations: the presets in `configs/` and a user's own files.
//!
//! Files are TOML (or JSON, by extension). Every table rejects unknown keys, and every value is
//! checked before training starts, with a message that names the key.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use burn_attention_zoo::contract::variant::check_rotary;
use burn_attention_zoo::{
    AttentionConfig, EncoderBlockConfig, EncoderConfig, hybrid_pattern, repeat_pattern,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::limits::check_size;

mod tables;
pub use lra_runs::{Selection, Task};
pub use tables::{
    DataConfig, ModelConfig, Objective, OptimizerConfig, PairFeatures, Pooling, Positions,
    PretrainingConfig, Schedule, TokenizerKind, TrainingConfig, Validation, default_doc_bytes,
};

// `PRESET_FILES`: every `configs/<task>/<preset>.toml`, compiled in by `build.rs` so that the
// presets work from any directory.
include!(concat!(env!("OUT_DIR"), "/presets.rs"));

/// A complete run configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// The task.
    pub task: Task,
    /// What the model reads.
    pub data: DataConfig,
    /// The classifier around the attention.
    pub model: ModelConfig,
    /// The optimisation.
    pub training: TrainingConfig,
    /// What self-pretraining runs train with instead ([`RunConfig::for_objective`]); absent in
    /// most presets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pretraining: Option<PretrainingConfig>,
    /// Per-variant attention parameters, by registry name (`[attention.linformer] k = 64`).
    /// Variants not listed use their paper defaults. A name or a key given twice is refused
    /// (JSON parsers otherwise keep the last silently).
    #[serde(default, deserialize_with = "unique_keys::tables")]
    pub attention: BTreeMap<String, Map<String, Value>>,
}

/// The text of the shipped preset `configs/<task>/<name>.toml`, if there is one.
pub fn preset_text(task: &str, name: &str) -> Option<&'static str> {
    (PRESET_FILES.iter())
        .find(|(t, p, _)| *t == task && *p == name)
        .map(|(.., text)| *text)
}

impl RunConfig {
    /// A shipped preset of `task` (`configs/<task>/<name>.toml`).
    pub fn preset(task: &str, name: &str) -> Result<Self> {
        let (_, _, text) = PRESET_FILES
            .iter()
            .find(|(t, p, _)| *t == task && *p == name)
            .with_context(|| {
                let names: Vec<&str> = PRESET_FILES
                    .iter()
                    .filter(|(t, ..)| *t == task)
                    .map(|(_, p, _)| *p)
                    .collect();
                format!(
                    "unknown preset `{name}` for task {task} (known: {})",
                    names.join(", ")
                )
            })?;
        Self::parse_toml(text, &format!("configs/{task}/{name}.toml"))
    }

    /// Reads a configuration file (`.json` as JSON, anything else as TOML).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        // As people save text: a byte-order mark, and CRLF or lone-CR line endings.
        let text = text
            .strip_prefix('\u{feff}')
            .unwrap_or(&text)
            .replace("\r\n", "\n")
            .replace('\r', "\n");
        let origin = path.display().to_string();
        if path.extension().is_some_and(|e| e == "json") {
            // serde_json quotes a misspelt key as it decoded it, a `\n` escape included: the
            // message is kept on one line.
            let config: Self = serde_json::from_str(&text).map_err(|e| {
                anyhow::anyhow!("config file {origin}: {}", e.to_string().escape_debug())
            })?;
            config
                .validate()
                .with_context(|| format!("config file {origin}"))?;
            Ok(config)
        } else {
            Self::parse_toml(&text, &origin)
        }
    }

    fn parse_toml(text: &str, origin: &str) -> Result<Self> {
        let config: Self = toml::from_str(text)
            .map_err(|e| anyhow::anyhow!("config file {origin}: {}", toml_error_line(&e, text)))?;
        config
            .validate()
            .with_context(|| format!("config file {origin}"))?;
        Ok(config)
    }

    /// Checks every value; the error names the key.
    pub fn validate(&self) -> Result<()> {
        let m = &self.model;
        // Every size and count: at least 1, at most MAX_SIZE (an absent optional one passes).
        for (key, value) in [
            ("model.n_layers", m.n_layers),
            ("model.d_model", m.d_model),
            ("model.n_heads", m.n_heads),
            ("model.d_ff", m.d_ff),
            ("model.d_mlp", m.d_mlp),
            ("data.max_len", self.data.max_len),
            ("data.doc_max_bytes", self.data.doc_max_bytes),
            ("data.test_subset", self.data.test_subset.unwrap_or(1)),
            ("training.batch_size", self.training.batch_size),
            ("training.steps", self.training.steps),
            ("training.eval_every", self.training.eval_every),
            (
                "training.grad_accumulation",
                self.training.grad_accumulation,
            ),
            (
                "training.checkpoint_every",
                self.training.checkpoint_every.unwrap_or(1),
            ),
            (
                "training.redraw_every",
                self.training.redraw_every.unwrap_or(1),
            ),
        ] {
            check_size(key, value, true)?;
        }
        if !m.d_model.is_multiple_of(m.n_heads) {
            bail!(
                "`model.d_model` ({}) must be a multiple of `model.n_heads` ({})",
                m.d_model,
                m.n_heads
            );
        }
        for (key, p) in [
            ("model.dropout", m.dropout),
            ("model.attention_dropout", m.attention_dropout),
        ] {
            if !(0.0..1.0).contains(&p) {
                bail!("`{key}` must be in [0, 1), got {p}");
            }
        }
        if !(m.embedding_std.is_finite() && m.embedding_std > 0.0) {
            bail!(
                "`model.embedding_std` must be a positive number, got {}",
                m.embedding_std
            );
        }
        let o = &self.training.optimizer;
        for (key, b) in [
            ("training.optimizer.beta1", o.beta1),
            ("training.optimizer.beta2", o.beta2),
        ] {
            if !(0.0..1.0).contains(&b) {
                bail!("`{key}` must be in [0, 1), got {b}");
            }
        }
        positive_finite("training.optimizer.epsilon", o.epsilon.into())?;
        if !(o.weight_decay.is_finite() && o.weight_decay >= 0.0) {
            bail!(
                "`training.optimizer.weight_decay` must be finite and >= 0, got {}",
                o.weight_decay
            );
        }
        check_schedule("training", &self.training.schedule, self.training.steps)?;
        if let Some(pretraining) = &self.pretraining {
            for (key, value) in [
                ("pretraining.steps", pretraining.steps),
                ("pretraining.eval_every", pretraining.eval_every),
            ] {
                check_size(key, value.unwrap_or(1), true)?;
            }
            if let Some(rate) = pretraining.mask_rate
                && !(rate > 0.0 && rate < 1.0)
            {
                bail!("`pretraining.mask_rate` must lie strictly between 0 and 1, got {rate}");
            }
            let steps = pretraining.steps.unwrap_or(self.training.steps);
            let schedule = pretraining.schedule.as_ref();
            check_schedule(
                "pretraining",
                schedule.unwrap_or(&self.training.schedule),
                steps,
            )?;
        }
        if let Some(clip) = self.training.grad_clip {
            positive_finite("training.grad_clip", clip.into())?;
        }
        // What one task reads and another does not is checked against the task
        // (`tasks::check_config`); the rest is checked here.
        if let Some(generate) = &self.data.generate {
            generate.validate()?;
        }
        if let Some(pathfinder) = &self.data.pathfinder {
            pathfinder.validate()?;
        }
        match (self.data.tokenizer, self.data.bpe_vocab_size) {
            (TokenizerKind::Bpe, None) => {
                bail!("`data.bpe_vocab_size` is required with `data.tokenizer = \"bpe\"`")
            }
            (TokenizerKind::Bpe, Some(v)) if !(300..=65_000).contains(&v) => bail!(
                "`data.bpe_vocab_size` must be between 300 and 65000 (256 byte tokens plus \
                 merges; ids are 16-bit), got {v}"
            ),
            (TokenizerKind::Bytes, Some(_)) => {
                bail!("`data.bpe_vocab_size` applies to `data.tokenizer = \"bpe\"` only")
            }
            _ => {}
        }
        if self.data.max_archive_bytes == 0 {
            bail!("`data.max_archive_bytes` must be at least 1");
        }
        if self.data.validation == Validation::Holdout(0) {
            bail!("`data.validation.holdout` must be at least 1");
        }
        for name in self.attention.keys() {
            self.attention_config(name)
                .with_context(|| format!("`attention.{name}`"))?;
        }
        Ok(())
    }

    /// This configuration as its run trains: for a self-pretraining objective, the values of
    /// `[pretraining]` in place of those of `[training]` they name; unchanged otherwise.
    pub fn for_objective(mut self) -> Self {
        if !self.training.objective.is_pretraining() {
            return self;
        }
        if let Some(p) = self.pretraining.clone() {
            let t = &mut self.training;
            t.steps = p.steps.unwrap_or(t.steps);
            t.eval_every = p.eval_every.unwrap_or(t.eval_every);
            t.mask_rate = p.mask_rate.or(t.mask_rate);
            t.schedule = p.schedule.unwrap_or(t.schedule.clone());
        }
        self
    }

    /// Longest sequence the encoder sees: `max_len`, plus one with CLS pooling.
    pub fn encoder_len(&self) -> usize {
        self.data.max_len + usize::from(self.model.pooling == Pooling::Cls)
    }

    /// The attention called `name` with this configuration's sizes and parameters.
    pub fn attention_config(&self, name: &str) -> Result<AttentionConfig> {
        let m = &self.model;
        let mut config =
            AttentionConfig::from_name(name, m.d_model, m.n_heads, self.encoder_len())?
                .with_weight_dropout(m.attention_dropout);
        if let Some(params) = self.attention.get(name) {
            // Every size an attention's own table gives passes the one bound every size keeps
            // (a number too large for its field is then refused by the field's own type).
            for (key, value) in params {
                if let Some(size) = value.as_u64() {
                    let size = usize::try_from(size).unwrap_or(usize::MAX);
                    check_size(&format!("attention.{name}.{key}"), size, false)?;
                }
            }
            config = config.with_params(params)?;
        }
        config.validate()?;
        config.check_input(self.encoder_len(), self.encoder_len(), false)?;
        Ok(config)
    }

    /// The encoder around the attention called `name`; a hybrid stack where `name` joins
    /// several with `+` (`gla+local`: the pattern of layers, repeated to `model.n_layers`, each
    /// layer's attention with its own `[attention.<name>]` parameters).
    pub fn encoder_config(&self, name: &str) -> Result<EncoderConfig> {
        let m = &self.model;
        let pattern = hybrid_pattern(name)?
            .into_iter()
            .map(|part| self.attention_config(part))
            .collect::<Result<Vec<_>>>()?;
        // Rotary positions are asked of the layers built, not of every `[attention.*]` table
        // a configuration holds (a preset has one for attentions that take none).
        if m.positions == Positions::Rotary {
            for config in &pattern {
                check_rotary(
                    config.name(),
                    config.info().capabilities,
                    m.d_model / m.n_heads,
                )
                .context("`model.positions = \"rotary\"`")?;
            }
        }
        let block =
            EncoderBlockConfig::new(pattern[0].clone(), m.d_ff).with_residual_dropout(m.dropout);
        let encoder = EncoderConfig::new(block, m.n_layers);
        if pattern.len() == 1 {
            return Ok(encoder);
        }
        let layers = repeat_pattern(&pattern, m.n_layers).context("`model.n_layers`")?;
        Ok(encoder.with_layers(layers))
    }
}

/// `--set KEY=VALUE`: one value of a configuration replaced, by its dotted key
/// (`training.schedule.peak=3e-4`, `data.max_len=128`, `attention.linformer.k=64`). The value
/// is read as TOML (`3e-4`, `128`, `true`, `"mean"`), a bare word as a string (`mean`).
#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    /// The dotted key.
    pub key: String,
    /// The value, as TOML reads it.
    pub value: toml::Value,
    /// `KEY=VALUE` as given.
    pub text: String,
}

impl std::str::FromStr for Setting {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let Some((key, value)) = text.split_once('=') else {
            return Err(format!("`{text}` is not KEY=VALUE"));
        };
        let (key, value) = (key.trim(), value.trim());
        let well_formed = |part: &str| {
            !part.is_empty()
                && (part.bytes())
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-".contains(&b))
        };
        if !key.split('.').all(well_formed) {
            return Err(format!(
                "`{key}` is not a configuration key (dotted names of lowercase letters, digits,                  `_` and `-`)"
            ));
        }
        if value.is_empty() {
            return Err(format!("`{text}` gives no value"));
        }
        // Runs with settings are filed under a folder named after them.
        if value.contains('/') || value.contains(',') || value.chars().any(char::is_control) {
            return Err(format!(
                "`{text}`: a value may not hold `/`, `,` or control characters (settings name \
                 the folder their runs are filed under)"
            ));
        }
        let value = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|mut table| table.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.to_string()));
        Ok(Self {
            key: key.to_string(),
            value,
            text: text.to_string(),
        })
    }
}

impl RunConfig {
    /// This configuration with `settings` applied in order, then checked as a whole; the error
    /// names the setting (an unknown key, a value of the wrong type, a value out of range).
    pub fn with_settings(self, settings: &[Setting]) -> Result<Self> {
        if settings.is_empty() {
            return Ok(self);
        }
        let mut tree = serde_json::to_value(&self).context("the configuration as JSON")?;
        for setting in settings {
            let at = || format!("`--set {}`", setting.text);
            let value = serde_json::to_value(&setting.value).with_context(at)?;
            let (parents, last) = match setting.key.rsplit_once('.') {
                Some((parents, last)) => (parents.split('.').collect::<Vec<_>>(), last),
                None => (Vec::new(), setting.key.as_str()),
            };
            let mut table = &mut tree;
            for part in parents {
                let Value::Object(map) = table else {
                    bail!("{}: `{part}` is inside a value, not a table", at());
                };
                // A table a configuration may leave out (`[attention.<name>]`) is made.
                table = map
                    .entry(part.to_string())
                    .or_insert_with(|| Value::Object(Map::new()));
                if table.is_null() {
                    *table = Value::Object(Map::new());
                }
            }
            let Value::Object(map) = table else {
                bail!("{}: its table is a value", at());
            };
            map.insert(last.to_string(), value);
            // Each setting is read on its own, so that the error names the one at fault.
            serde_json::from_value::<RunConfig>(tree.clone())
                .map_err(|e| anyhow::anyhow!("{}: {e}", at()))?;
        }
        let config: RunConfig = serde_json::from_value(tree)?;
        let given: Vec<&str> = settings.iter().map(|s| s.text.as_str()).collect();
        config
            .validate()
            .with_context(|| format!("with --set {}", given.join(" --set ")))?;
        Ok(config)
    }
}

/// Deserialising the attention tables with every key given once.
mod unique_keys {
    use std::collections::BTreeMap;
    use std::fmt;

    use serde::Deserializer;
    use serde::de::{Error, MapAccess, Visitor};
    use serde_json::{Map, Value};

    /// The `[attention.<name>]` tables: names and, inside each, keys given once.
    pub fn tables<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<String, Map<String, Value>>, D::Error> {
        deserializer.deserialize_map(Tables)
    }

    struct Tables;
    struct Table<'a>(&'a str);
    struct TableSeed<'a>(&'a str);

    impl<'de> Visitor<'de> for Tables {
        type Value = BTreeMap<String, Map<String, Value>>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a table of attention parameters by attention name")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut tables = BTreeMap::new();
            while let Some(name) = map.next_key::<String>()? {
                let table = map.next_value_seed(TableSeed(&name))?;
                if tables.insert(name.clone(), table).is_some() {
                    return Err(A::Error::custom(format!(
                        "`attention.{name}` is given twice"
                    )));
                }
            }
            Ok(tables)
        }
    }

    impl<'de> serde::de::DeserializeSeed<'de> for TableSeed<'_> {
        type Value = Map<String, Value>;

        fn deserialize<D: Deserializer<'de>>(
            self,
            deserializer: D,
        ) -> Result<Self::Value, D::Error> {
            deserializer.deserialize_map(Table(self.0))
        }
    }

    impl<'de> Visitor<'de> for Table<'_> {
        type Value = Map<String, Value>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "a table of parameters for `attention.{}`", self.0)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut table = Map::new();
            while let Some(key) = map.next_key::<String>()? {
                let value: Value = map.next_value()?;
                if table.insert(key.clone(), value).is_some() {
                    return Err(A::Error::custom(format!(
                        "`attention.{}.{key}` is given twice",
                        self.0
                    )));
                }
            }
            Ok(table)
        }
    }
}

/// Refuses a value that is not a finite number above 0 (NaN and infinity included), naming `key`.
/// Checks a learning-rate schedule of the table `table` (`training`, `pretraining`) for runs of
/// `steps` steps: a positive finite rate, and warm-up (for the schedules that decay after it)
/// below the last step.
fn check_schedule(table: &str, schedule: &Schedule, steps: usize) -> Result<()> {
    let peak = match *schedule {
        Schedule::Rsqrt { base, .. } => {
            return positive_finite(&format!("{table}.schedule.base"), base);
        }
        Schedule::OneCycle { peak, .. }
        | Schedule::Constant { peak, .. }
        | Schedule::Cosine { peak, .. } => peak,
    };
    positive_finite(&format!("{table}.schedule.peak"), peak)?;
    let warmup = schedule.warmup();
    if warmup >= steps {
        bail!("`{table}.schedule.warmup` ({warmup}) must be below the run's {steps} steps");
    }
    Ok(())
}

fn positive_finite(key: &str, value: f64) -> Result<()> {
    if !(value.is_finite() && value > 0.0) {
        bail!("`{key}` must be finite and > 0, got {value}");
    }
    Ok(())
}

/// A TOML error on one line: the field, the reason, then the position, e.g.
/// ``"`training.steps`: invalid type: string "ten", expected usize (line 2, column 9)"``. The
/// field is read from the text: the key on the error's line under the table header above it.
fn toml_error_line(err: &toml::de::Error, text: &str) -> String {
    let reason = err.message().trim().replace('\n', " ");
    let Some(span) = err.span() else {
        return reason;
    };
    let before = &text[..span.start.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    let mut table = String::new();
    for header in before.lines() {
        let header = header.trim();
        if header.starts_with('[') {
            table = header
                .trim_matches(|c| c == '[' || c == ']')
                .trim()
                .to_string();
        }
    }
    let this_line = text.lines().nth(line - 1).unwrap_or("");
    let field = match this_line.split_once('=') {
        Some((key, _)) if !this_line.trim_start().starts_with('[') => {
            let key = key.trim();
            if table.is_empty() {
                key.to_string()
            } else {
                format!("{table}.{key}")
            }
        }
        // An error at a table header (a field missing from it or from a table above it): the
        // reason names the field, the position the header.
        _ => String::new(),
    };
    if field.is_empty() || reason.contains(&format!("`{field}`")) {
        format!("{reason} (line {line}, column {column})")
    } else {
        format!("`{field}`: {reason} (line {line}, column {column})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ListOps tiny preset's text, which the tests below edit.
    fn listops_tiny() -> &'static str {
        (PRESET_FILES.iter())
            .find(|(task, preset, _)| (*task, *preset) == ("listops", "tiny"))
            .expect("configs/listops/tiny.toml")
            .2
    }

    /// Every preset builds every attention, except that a preset with rotary positions (the
    /// self-pretraining protocol's `spt`) builds those that take them and refuses the others
    /// with an error that says so.
    #[test]
    fn every_preset_parses_and_builds_every_attention() {
        for (task, preset, _) in PRESET_FILES {
            let config = RunConfig::preset(task, preset).unwrap();
            assert_eq!(config.task, *task, "configs/{task}/{preset}.toml");
            let rotary = config.model.positions == Positions::Rotary;
            for variant in burn_attention_zoo::VARIANTS {
                let built = config.encoder_config(variant.name);
                if rotary && !variant.capabilities.rotary {
                    let err = format!("{:#}", built.unwrap_err());
                    assert!(err.contains("rotary"), "{preset}, {}: {err}", variant.name);
                } else {
                    built.unwrap();
                }
            }
        }
    }

    /// docs/lra.md names the attentions that take rotary positions as the registry's
    /// capabilities say (the five trainable kernels as `ff-*`), and no other.
    #[test]
    fn the_lra_docs_name_the_attentions_that_take_rotary_positions() {
        let docs = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/lra.md"));
        let start = docs
            .find("positions are taken by")
            .expect("the rotary paragraph");
        let end = start
            + docs[start..]
                .find("A configuration that asks them")
                .unwrap();
        let taken = &docs[start..end];
        for variant in burn_attention_zoo::VARIANTS {
            let name = match variant.name.starts_with("ff-") {
                true => "ff-*",
                false => variant.name,
            };
            let named = taken.contains(&format!("`{name}`"));
            assert_eq!(
                named, variant.capabilities.rotary,
                "docs/lra.md, {}",
                variant.name
            );
        }
    }

    /// A hybrid stack's layers each take their own `[attention.<name>]` parameters.
    #[test]
    fn hybrid_layers_take_their_own_parameters() {
        let text = format!("{}\n[attention.local]\nwindow = 5\n", listops_tiny());
        let config = RunConfig::parse_toml(&text, "x").unwrap();
        let encoder = config.encoder_config("performer+local").unwrap();
        let layers = serde_json::to_value(encoder.layer_attentions()).unwrap();
        assert_eq!(layers[0]["Performer"]["n_features"], 64);
        assert_eq!(layers[1]["Local"]["window"], 5);
        let err = config.encoder_config("local+local+local").unwrap_err();
        assert!(format!("{err:#}").contains("`model.n_layers`"), "{err:#}");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let base = listops_tiny();
        let err = RunConfig::parse_toml(&base.replace("[model]", "[model]\nd_modle = 3"), "x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("d_modle"), "{err}");
        let err = RunConfig::parse_toml(&base.replace("k = 32", "kk = 3"), "x").unwrap_err();
        assert!(format!("{err:#}").contains("`kk`"), "{err:#}");
        let err = RunConfig::parse_toml(&base.replace("k = 32", "k = 0"), "x").unwrap_err();
        assert!(format!("{err:#}").contains("`k`"), "{err:#}");
        let err = RunConfig::parse_toml(&format!("{base}\n[attention.nope]\n"), "x").unwrap_err();
        assert!(
            format!("{err:#}").contains("unknown attention `nope`"),
            "{err:#}"
        );
    }

    /// A name or a key given twice in the attention tables is refused, naming it, in JSON (whose
    /// parser would keep the last) and in TOML.
    #[test]
    fn attention_keys_given_twice_are_refused() {
        let base = RunConfig::parse_toml(listops_tiny(), "x").unwrap();
        let json = serde_json::to_string(&base).unwrap();
        let twice = json.replacen("\"k\":32", "\"k\":32,\"k\":8", 1);
        assert_ne!(
            json, twice,
            "the ListOps tiny preset sets linformer's k = 32"
        );
        let err = serde_json::from_str::<RunConfig>(&twice)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`attention.linformer.k` is given twice"),
            "{err}"
        );
        let text = listops_tiny().replace("k = 32", "k = 32\nk = 8");
        let err = format!("{:#}", RunConfig::parse_toml(&text, "x").unwrap_err());
        assert!(err.contains("k"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }

    /// A configuration saved with a byte-order mark and CRLF or lone-CR line endings reads as
    /// the same configuration, TOML and JSON alike.
    #[test]
    fn config_files_read_as_people_save_them() {
        let dir = std::env::temp_dir().join(format!("burn-lra-config-eol-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let base = listops_tiny();
        let expected = RunConfig::parse_toml(base, "x").unwrap();
        let json = serde_json::to_string_pretty(&expected).unwrap();
        for (name, text) in [
            (
                "crlf.toml",
                format!("\u{feff}{}", base.replace('\n', "\r\n")),
            ),
            ("cr.toml", base.replace('\n', "\r")),
            ("cr.json", format!("\u{feff}{}", json.replace('\n', "\r"))),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            assert_eq!(RunConfig::from_file(&path).unwrap(), expected, "{name}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn parse_errors_are_one_line_naming_the_field() {
        let err = RunConfig::parse_toml("[training]\nsteps = \"ten\"\n", "f.toml").unwrap_err();
        let err = format!("{err:#}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("config file f.toml: `training.steps`: invalid type"),
            "{err}"
        );
        assert!(err.ends_with("(line 2, column 9)"), "{err}");
    }

    #[test]
    fn floats_must_be_finite() {
        let base = listops_tiny();
        assert!(
            base.contains("peak = "),
            "the ListOps tiny preset has a one-cycle peak"
        );
        for (key, bad) in [
            ("peak", "nan"),
            ("peak", "inf"),
            ("epsilon", "nan"),
            ("weight_decay", "nan"),
            ("weight_decay", "inf"),
            ("grad_clip", "nan"),
        ] {
            let text = if base.contains(&format!("\n{key} = ")) {
                base.lines()
                    .map(|l| {
                        if l.starts_with(&format!("{key} = ")) {
                            format!("{key} = {bad}")
                        } else {
                            l.to_string()
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            } else {
                let table = if key == "grad_clip" {
                    "[training]"
                } else {
                    "[training.optimizer]"
                };
                base.replacen(table, &format!("{table}\n{key} = {bad}"), 1)
            };
            let err = RunConfig::parse_toml(&text, "x").expect_err(&format!("{key} = {bad}"));
            let err = format!("{err:#}");
            assert!(
                err.contains(key) && err.contains("finite"),
                "{key} = {bad}: {err}"
            );
        }
    }

    #[test]
    fn schedules_match_their_formulas() {
        // LRA: 0.05 * min(1, s/w) / sqrt(max(s, w)); at s = w = 1000: 0.05 / sqrt(1000).
        let rsqrt = Schedule::Rsqrt {
            base: 0.05,
            warmup: 1000,
        };
        assert!((rsqrt.lr(1000, 5000) - 0.05 / 1000f64.sqrt()).abs() < 1e-12);
        assert!((rsqrt.lr(4000, 5000) - 0.05 / 4000f64.sqrt()).abs() < 1e-12);
        assert!((rsqrt.lr(500, 5000) - 0.5 * 0.05 / 1000f64.sqrt()).abs() < 1e-12);
        let cycle = Schedule::OneCycle {
            peak: 1e-3,
            warmup: 100,
        };
        assert!((cycle.lr(50, 1100) - 5e-4).abs() < 1e-12);
        assert!((cycle.lr(600, 1100) - 5e-4).abs() < 1e-12);
        assert_eq!(cycle.lr(1100, 1100), 0.0);
        let constant = Schedule::Constant {
            peak: 1e-3,
            warmup: 100,
        };
        assert!((constant.lr(25, 1100) - 2.5e-4).abs() < 1e-12);
        assert_eq!(constant.lr(100, 1100), 1e-3);
        assert_eq!(constant.lr(1100, 1100), 1e-3);
        // Half-way through the decay: cos(π/2) = 0, so half the peak; a quarter: (1 + cos(π/4)) / 2.
        let cosine = Schedule::Cosine {
            peak: 1e-3,
            warmup: 100,
        };
        assert!((cosine.lr(50, 1100) - 5e-4).abs() < 1e-12);
        assert!((cosine.lr(600, 1100) - 5e-4).abs() < 1e-12);
        let quarter = 1e-3 * (1.0 + std::f64::consts::FRAC_1_SQRT_2) / 2.0;
        assert!((cosine.lr(350, 1100) - quarter).abs() < 1e-12);
        assert!(cosine.lr(1100, 1100).abs() < 1e-18);
    }

    /// A preset's `[pretraining]` values replace `[training]`'s in self-pretraining runs only,
    /// are checked when the preset is read (the error naming the key), and `--set` reaches them.
    #[test]
    fn the_pretraining_table_applies_to_pretraining_runs_only() {
        let text = format!(
            "{}\n[pretraining]\nsteps = 900\nmask_rate = 0.5\n\
             schedule = {{ kind = \"constant\", peak = 5e-4, warmup = 90 }}\n",
            listops_tiny()
        );
        let config = RunConfig::parse_toml(&text, "spt.toml").unwrap();
        let task_run = config.clone().for_objective();
        assert_eq!(task_run.training, config.training);
        let settings: Vec<Setting> = ["training.objective=masked-tokens", "pretraining.steps=800"]
            .iter()
            .map(|t| t.parse().unwrap())
            .collect();
        let pretraining = config.with_settings(&settings).unwrap().for_objective();
        assert_eq!(pretraining.training.steps, 800);
        assert_eq!(pretraining.training.mask_rate, Some(0.5));
        assert_eq!(
            pretraining.training.schedule,
            Schedule::Constant {
                peak: 5e-4,
                warmup: 90
            }
        );
        // The batch and what [pretraining] does not name stay the preset's.
        assert_eq!(
            pretraining.training.batch_size,
            task_run.training.batch_size
        );
        for (bad, key) in [
            ("steps = 0", "pretraining.steps"),
            ("mask_rate = 1.0", "pretraining.mask_rate"),
            (
                "steps = 50\nschedule = { kind = \"cosine\", peak = 1e-3, warmup = 60 }",
                "pretraining.schedule.warmup",
            ),
            ("epochs = 3", "epochs"),
        ] {
            let text = format!("{}\n[pretraining]\n{bad}\n", listops_tiny());
            let err = format!(
                "{:#}",
                RunConfig::parse_toml(&text, "spt.toml").unwrap_err()
            );
            assert!(err.contains(key), "{bad}: {err}");
        }
    }

    /// `--set` replaces values by dotted key (a table the configuration left out is made),
    /// checks the result, and names the setting at fault.
    #[test]
    fn settings_replace_values_by_key() {
        let set = |texts: &[&str]| {
            let settings: Vec<Setting> = texts.iter().map(|t| t.parse().unwrap()).collect();
            RunConfig::preset("listops", "tiny")
                .unwrap()
                .with_settings(&settings)
        };
        let config = set(&[
            "training.schedule.peak=3e-4",
            "data.max_len=48",
            "model.pooling=cls",
            "attention.efficient.n_heads_unused=1",
        ]);
        let err = format!("{:#}", config.unwrap_err());
        assert!(
            err.contains("--set attention.efficient.n_heads_unused=1"),
            "{err}"
        );
        let config = set(&[
            "training.schedule.peak=3e-4",
            "data.max_len=48",
            "model.pooling=cls",
            "attention.linformer.k=16",
        ])
        .unwrap();
        assert_eq!(
            config.training.schedule,
            Schedule::OneCycle {
                peak: 3e-4,
                warmup: 150
            }
        );
        assert_eq!(config.data.max_len, 48);
        assert_eq!(config.model.pooling, Pooling::Cls);
        assert_eq!(config.attention["linformer"]["k"], 16);
        let err = |texts: &[&str]| format!("{:#}", set(texts).unwrap_err());
        let unknown = err(&["training.lr=1e-3"]);
        assert!(
            unknown.starts_with("`--set training.lr=1e-3`: unknown field `lr`"),
            "{unknown}"
        );
        let wrong = err(&["training.steps=many"]);
        assert!(
            wrong.starts_with("`--set training.steps=many`: invalid type"),
            "{wrong}"
        );
        let range = err(&["model.dropout=1.5"]);
        assert!(
            range.contains("--set model.dropout=1.5") && range.contains("`model.dropout`"),
            "{range}"
        );
        for bad in [
            "peak",
            "Training.steps=1",
            "training..steps=1",
            "data.max_len=",
        ] {
            assert!(bad.parse::<Setting>().is_err(), "{bad}");
        }
    }
}
