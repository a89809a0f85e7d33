//! Self-pretraining, end to end through the library: a pretraining run on ListOps' training
//! inputs, then a fine-tuning run from it (`--init-from`), and what each records; the checks
//! that refuse a pretraining run that does not fit.

mod common;

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn_lra::config::{Objective, RunConfig};
use burn_lra::data::Splits;
use burn_lra::model::LraClassifier;
use burn_lra::pretraining::{load_pretrained, pretraining_splits};
use burn_lra::train::RunResult;
use common::{load_splits, options, short_listops, temp_dir, train};

/// The pretraining splits of `config` (its task's vocabulary).
fn pretrain_splits(config: &RunConfig, cache: &std::path::Path, seed: u64) -> Splits {
    let splits = load_splits(config, None, cache).unwrap();
    let task = burn_lra::tasks::find(config.task.name()).unwrap();
    let vocab = burn_lra::tasks::vocab_size(task, config).unwrap();
    pretraining_splits(splits, config, vocab, seed).unwrap()
}

/// A finished masked-token pretraining run of `attention` (`steps` steps, seed 3) in
/// `<dir>/pretrain`, its data cached in `<dir>/data`: its directory and result.
fn pretrain(
    dir: &std::path::Path,
    attention: &str,
    steps: usize,
) -> (std::path::PathBuf, RunResult) {
    let mut config = short_listops(steps);
    config.training.objective = Objective::MaskedTokens;
    let run_dir = dir.join("pretrain");
    let splits = pretrain_splits(&config, &dir.join("data"), 3);
    let result = train(&config, &splits, &options(run_dir.clone(), attention)).unwrap();
    (run_dir, result)
}

/// Every float parameter of `module`, flattened, in module order.
fn values<M: Module>(module: &M) -> Vec<Vec<f32>> {
    struct Collect(Vec<Vec<f32>>);
    impl ModuleVisitor for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push(
                param
                    .val()
                    .into_data()
                    .convert::<f32>()
                    .try_to_vec()
                    .unwrap(),
            );
        }
    }
    let mut collect = Collect(Vec::new());
    module.visit(&mut collect);
    collect.0
}

#[test]
fn a_fine_tuned_run_starts_from_the_pretrained_encoder_and_says_so() {
    let dir = temp_dir("spt");
    let cache = dir.join("data");
    let (pre_dir, pre) = pretrain(&dir, "softmax", 20);
    // A token-level run over the task's vocabulary plus the mask token.
    assert_eq!(pre.causal, Some(false));
    assert!(pre.init_from.is_none());

    let config = short_listops(10);
    let splits = load_splits(&config, None, &cache).unwrap();
    let mut opts = options(dir.join("fine-tune"), "softmax");
    opts.init_from = Some(pre_dir.clone());
    let result = train(&config, &splits, &opts).unwrap();
    let record =
        burn_lra::run_dir::checkpoint::Record::read(&opts.run_dir.join("config.json")).unwrap();
    let init = record
        .init_from
        .expect("config.json names the pretraining run");
    assert_eq!(init.objective, "masked-tokens");
    assert_eq!(init.run_dir, std::fs::canonicalize(&pre_dir).unwrap());
    assert_eq!(
        init.weights_sha256, pre.weights_sha256["model-best.bpk"],
        "the weights read are the pretraining run's best, as its result.json recorded them"
    );
    assert_eq!(result.init_from.as_ref(), Some(&init));
    assert!(result.verify().is_ok());

    // The starting weights: the pretrained encoder and positions, the task's rows of the
    // pretrained embedding; a classifier of the fine-tuning run's own shape.
    let device = Device::flex();
    let (pretrained, _) = load_pretrained(&pre_dir, &config, &opts.attention, &device).unwrap();
    let task = burn_lra::tasks::find("listops").unwrap();
    let spec = burn_lra::model::ClassifierSpec::resolve(&config, task, "softmax").unwrap();
    let fresh = LraClassifier::new(&spec, &device);
    let started = burn_lra::pretraining::transplant(pretrained.clone(), fresh.clone()).unwrap();
    assert_eq!(values(&started.encoder), values(&pretrained.encoder));
    assert_eq!(values(&started.positions), values(&pretrained.positions));
    let vocab = spec.vocab_size;
    let rows = |m: &LraClassifier| {
        let [_, d] = m.embedding.weight.dims();
        (m.embedding.weight.val())
            .slice([0..vocab, 0..d])
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .unwrap()
    };
    assert_eq!(rows(&started), rows(&pretrained));
    assert_eq!(started.embedding.weight.dims()[0], vocab);
    assert_eq!(values(&started.head_out), values(&fresh.head_out));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_pretraining_run_that_does_not_fit_is_refused_naming_what_differs() {
    let dir = temp_dir("spt-refusals");
    let cache = dir.join("data");
    let (pre_dir, _) = pretrain(&dir, "linear", 10);
    let device = Device::flex();
    let config = short_listops(10);
    let softmax = lra_runs::AttentionName::new("softmax").unwrap();
    let err = load_pretrained(&pre_dir, &config, &softmax, &device)
        .expect_err("another attention is refused")
        .to_string();
    assert!(err.contains("attention linear"), "{err}");
    let linear = lra_runs::AttentionName::new("linear").unwrap();
    let mut wider = config.clone();
    wider.model.d_model = 32;
    let err = load_pretrained(&pre_dir, &wider, &linear, &device)
        .expect_err("another model is refused")
        .to_string();
    assert!(err.contains("[model]"), "{err}");
    // A run from scratch is not a pretraining run.
    let scratch_dir = dir.join("scratch");
    let splits = load_splits(&config, None, &cache).unwrap();
    train(&config, &splits, &options(scratch_dir.clone(), "linear")).unwrap();
    let err = load_pretrained(&scratch_dir, &config, &linear, &device)
        .expect_err("a run from scratch is refused")
        .to_string();
    assert!(err.contains("not a pretraining run"), "{err}");
    // The weights are checked against the pretraining run's record.
    let best = pre_dir.join("model-best.bpk");
    let mut bytes = std::fs::read(&best).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&best, bytes).unwrap();
    let err = load_pretrained(&pre_dir, &config, &linear, &device)
        .expect_err("damaged weights are refused")
        .to_string();
    assert!(err.contains("model-best.bpk"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
