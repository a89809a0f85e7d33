//! `burn-lra`: train and evaluate an attention on a Long Range Arena task.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use burn_lra::backend::{BackendDevice, BackendKind};
use burn_lra::budget::{ParamBudget, ParamCount, check_memory};
use burn_lra::config::{Setting, Task};
use burn_lra::data::pathfinder::Difficulty;
use burn_lra::model::ClassifierSpec;
use burn_lra::plan::{ResumeMode, RunPlan, TrainOptions, cache_dir, load_config};
use burn_lra::tasks::{self, TASKS, load_splits};
use burn_lra::train::train;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "burn-lra",
    version,
    about = "Long Range Arena on Burn: any attention, any backend"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train one model and report its test accuracy.
    Train(TrainArgs),
    /// Self-pretrain a model on the task's training inputs alone (no labels, no validation or
    /// test inputs): `train` with `training.objective` set (masked-token denoising by default),
    /// filed under `<preset>,training.objective=<objective>`; `train --init-from` fine-tunes
    /// from it.
    Pretrain {
        /// What the model learns to predict: `masked-tokens` (bidirectional models) or
        /// `next-token` (attentions with a causal form).
        #[arg(long, default_value = "masked-tokens", value_parser = ["masked-tokens", "next-token"])]
        objective: String,
        /// Everything `train` takes.
        #[command(flatten)]
        train: TrainArgs,
    },
    /// List the registered attentions and what each supports.
    List {
        /// Names only, one per line.
        #[arg(long)]
        names: bool,
        /// Only the attentions with a causal form (which decode token by token).
        #[arg(long)]
        causal: bool,
    },
    /// List the registered tasks.
    Tasks {
        /// Names only, one per line.
        #[arg(long)]
        names: bool,
    },
    /// List the backends and which are compiled in.
    Backends,
    /// Check that a backend trains as flex does: every attention (or those named) trained three
    /// steps from the same weights on both, logits compared after each step; exits with an
    /// error if any step lies outside the tolerance.
    CheckBackend {
        /// The backend checked against flex.
        #[arg(long, value_enum)]
        backend: burn_lra::backend::BackendKind,
        /// Registry names, comma-separated; all when left out.
        #[arg(long, value_delimiter = ',')]
        attention: Vec<String>,
    },
    /// Time one attention at one length (forward, forward + backward, peak memory) and print a
    /// JSON line; `cargo xtask bench attention` drives it.
    BenchAttention(burn_lra::bench::BenchArgs),
    /// Time the decoding of one token after a prompt of a given length (and the decoding
    /// state's size) and print a JSON line; `cargo xtask bench decode` drives it.
    BenchDecode(burn_lra::bench::DecodeBenchArgs),
    /// Time training steps of the Text model at one length (LRA's efficiency protocol: steps per
    /// second, peak memory) and print a JSON line; `cargo xtask bench lra` drives it.
    BenchTrain(burn_lra::bench::TrainBenchArgs),
    /// Time a square f32 matrix product on the backend and print a JSON line with its rate
    /// (GFLOP/s): the machine's floor for the products a training step is made of.
    BenchGemm(burn_lra::bench::GemmBenchArgs),
    /// Write a small synthetic matching dataset in LRA's AAN format
    /// (new_aan_pairs.{train,eval,test}.tsv) into a folder.
    GenerateMatching {
        /// Output folder.
        #[arg(long)]
        out: PathBuf,
        /// Training pairs.
        #[arg(long, default_value_t = 4000)]
        n_train: usize,
        /// Validation pairs.
        #[arg(long, default_value_t = 500)]
        n_val: usize,
        /// Test pairs.
        #[arg(long, default_value_t = 1000)]
        n_test: usize,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Generate Pathfinder images in LRA's released layout
    /// (`<out>/<difficulty folder>/{imgs,metadata}/`), and optionally a contact sheet of the
    /// first images (a PNG grid, labels alternating 0, 1, 0, ...).
    GeneratePathfinder {
        /// Output folder.
        #[arg(long)]
        out: PathBuf,
        /// Image side: 32, 64 or 128.
        #[arg(long, default_value_t = 32)]
        size: usize,
        /// Path length.
        #[arg(long, value_enum, default_value_t = Difficulty::Hard)]
        difficulty: Difficulty,
        /// Images.
        #[arg(long, default_value_t = 1000)]
        n: usize,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Also write a contact sheet of the first `--sheet-count` images to this PNG.
        #[arg(long)]
        sheet: Option<PathBuf>,
        /// Images on the contact sheet (4 per row).
        #[arg(long, default_value_t = 8)]
        sheet_count: usize,
    },
    /// Compare two run directories: configuration, metrics and results (times aside) and the
    /// values of their weights. Exits with 1 when they differ, naming the files.
    Compare {
        /// One run directory.
        a: PathBuf,
        /// The other.
        b: PathBuf,
    },
    /// Trainable parameters of every attention's model for a preset, and the increase over
    /// softmax (LRA's rule: at most 10%).
    Params {
        /// The task.
        #[arg(long, value_parser = task_parser())]
        task: Task,
        /// A preset from configs/<task>/ (tiny, small, lra).
        #[arg(long, default_value = "lra", conflicts_with = "config")]
        preset: String,
        /// A configuration file of your own (TOML, or JSON by extension).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Backend to build the models on.
        #[arg(long, value_enum, default_value_t = BackendKind::Flex)]
        backend: BackendKind,
    },
}

#[derive(clap::Args)]
struct TrainArgs {
    /// The task (`burn-lra tasks`).
    #[arg(long, value_parser = task_parser())]
    task: Task,
    /// Attention, by registry name (`burn-lra list`), or a hybrid stack's pattern (`gla+local`).
    #[arg(long)]
    attention: String,
    /// A preset from configs/<task>/ (tiny, small, lra).
    #[arg(long, default_value = "tiny", conflicts_with = "config")]
    preset: String,
    /// A configuration file of your own (TOML, or JSON by extension).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Replace one value of the configuration, by dotted key (repeatable):
    /// `--set training.schedule.peak=3e-4 --set data.max_len=128`. The run is filed under the
    /// preset's name followed by its settings (`tiny,training.schedule.peak=3e-4`), and its
    /// config.json holds the configuration they make.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<Setting>,
    /// Training seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Backend (must be compiled in: `--features <name>`).
    #[arg(long, value_enum, default_value_t = BackendKind::Flex)]
    backend: BackendKind,
    /// The backend's device number: the CUDA device (`cuda`, `tch-cuda`) or the discrete GPU
    /// (`wgpu`); default: the backend's default device.
    #[arg(long)]
    device: Option<usize>,
    /// Directory holding the task's data files; generated ListOps is used when absent.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Root of the run directories (and of the generated-data cache).
    #[arg(long, default_value = "runs")]
    out: PathBuf,
    /// Exact run directory (default: <out>/<task>/<preset>/<attention>/seed-<seed>).
    #[arg(long)]
    run_dir: Option<PathBuf>,
    /// No progress bar; print a line per validation instead.
    #[arg(long)]
    no_progress: bool,
    /// Continue the unfinished run in the run directory from its last checkpoint (every file of
    /// which is checked first; a damaged checkpoint is refused, naming the file).
    #[arg(long)]
    resume: bool,
    /// Start the unfinished run in the run directory over: its checkpoints (damaged or not),
    /// weights and metrics are removed first, and nothing else. A finished run is refused.
    #[arg(long, conflicts_with_all = ["resume", "continue_"])]
    restart: bool,
    /// Whatever the run directory holds: start the run, continue it from its checkpoint, or,
    /// when it is finished, print so and exit 0 (what sweeps and Slurm array tasks run). Exits
    /// with 75 when another process is training in the directory.
    #[arg(long = "continue", conflicts_with = "resume")]
    continue_: bool,
    /// With --resume or --continue: go on with a run whose checkpoint another backend trained,
    /// on this --backend (say, started on a GPU, finished on a CPU). The change is recorded in
    /// config.json and result.json (`config_changes`, field `backend`, from the checkpoint's
    /// step); without this flag such a resume is refused.
    #[arg(long)]
    change_backend: bool,
    /// Stop after this step as if killed, leaving the checkpoint (for testing --resume).
    #[arg(long, hide = true)]
    stop_after: Option<usize>,
    /// Fine-tune from a finished self-pretraining run (`burn-lra pretrain`) of the same task,
    /// attention and model: its best-validation embedding, positions and encoder, checked
    /// against the SHA-256 its result.json recorded; the head starts fresh. The run is filed
    /// under the preset's name followed by `,spt`, and its config.json and result.json name the
    /// pretraining run (`init_from`).
    #[arg(long)]
    init_from: Option<PathBuf>,
}

/// `--task`: one of the registered tasks' names (a usage error lists them).
fn task_parser() -> impl TypedValueParser<Value = Task> {
    PossibleValuesParser::new(TASKS.iter().map(|task| task.name()))
        .map(|name| Task::new(&name).expect("registered tasks have well-formed names"))
}

fn main() -> ExitCode {
    // Output piped into a program that stops reading (`| head`) ends the process quietly, as
    // other command-line tools do, instead of panicking on the closed pipe.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread is started.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    burn_lra::memory::keep_freed_memory();
    match run(lra_runs::cli::parse_or_exit::<Cli>()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            if err.downcast_ref::<lra_runs::RunDirInUse>().is_some() {
                ExitCode::from(lra_runs::EXIT_IN_USE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// The registered attentions `burn-lra list` shows: all, or with `causal` those with a causal
/// form.
fn listed(causal: bool) -> Vec<&'static burn_attention_zoo::VariantInfo> {
    burn_attention_zoo::VARIANTS
        .iter()
        .filter(|v| !causal || v.capabilities.causal)
        .collect()
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::List {
            names: true,
            causal,
        } => {
            for v in listed(causal) {
                println!("{}", v.name);
            }
            Ok(())
        }
        Command::List {
            names: false,
            causal,
        } => {
            let variants = listed(causal);
            // Columns as wide as their longest entry (names and costs grow with the registry).
            let name_width = variants
                .iter()
                .map(|v| v.name.len())
                .max()
                .unwrap_or(0)
                .max(4);
            let time_width = variants
                .iter()
                .map(|v| v.time.chars().count())
                .max()
                .unwrap_or(0)
                .max(4);
            println!(
                "{:<name_width$} {:<time_width$} {:<8} {:<8} {:<6} {:<7} {:<10} paper",
                "name", "time", "padding", "causal", "cross", "rotary", "fixed n"
            );
            for v in variants {
                let c = v.capabilities;
                let yes = |b: bool| if b { "yes" } else { "no" };
                println!(
                    "{:<name_width$} {:<time_width$} {:<8} {:<8} {:<6} {:<7} {:<10} {}",
                    v.name,
                    v.time,
                    yes(c.padding_mask),
                    yes(c.causal),
                    yes(c.cross_attention),
                    yes(c.rotary),
                    yes(c.fixed_max_len),
                    v.paper
                );
            }
            Ok(())
        }
        Command::Tasks { names } => {
            let width = TASKS.iter().map(|t| t.name().len()).max().unwrap_or(0);
            for task in TASKS {
                if names {
                    println!("{}", task.name());
                } else {
                    println!("{:<width$}  {}", task.name(), task.summary());
                }
            }
            Ok(())
        }
        Command::Backends => {
            for b in BackendKind::ALL {
                let state = if b.is_compiled() {
                    "compiled in"
                } else {
                    "not compiled (feature off)"
                };
                println!("{:<10} feature `{}`: {state}", b.name(), b.feature());
            }
            Ok(())
        }
        Command::Train(args) => train_command(args),
        Command::Pretrain {
            objective,
            mut train,
        } => {
            if train.init_from.is_some() {
                anyhow::bail!("pretrain: --init-from is for fine-tuning (`train`)");
            }
            train.set.push(
                format!("training.objective={objective}")
                    .parse()
                    .map_err(anyhow::Error::msg)?,
            );
            train_command(train)
        }
        Command::CheckBackend { backend, attention } => check_backend(backend, &attention),
        Command::BenchAttention(args) => {
            println!("{}", serde_json::to_string(&burn_lra::bench::run(&args)?)?);
            Ok(())
        }
        Command::BenchDecode(args) => {
            println!(
                "{}",
                serde_json::to_string(&burn_lra::bench::run_decode(&args)?)?
            );
            Ok(())
        }
        Command::BenchTrain(args) if args.describe => {
            println!("{}", burn_lra::bench::describe_train(&args)?);
            Ok(())
        }
        Command::BenchGemm(args) => {
            println!(
                "{}",
                serde_json::to_string(&burn_lra::bench::run_gemm(&args)?)?
            );
            Ok(())
        }
        Command::BenchTrain(args) => {
            println!(
                "{}",
                serde_json::to_string(&burn_lra::bench::run_train(&args)?)?
            );
            Ok(())
        }
        Command::GeneratePathfinder {
            out,
            size,
            difficulty,
            n,
            seed,
            sheet,
            sheet_count,
        } => {
            use burn_lra::data::pathfinder::{self, PathfinderConfig};
            let config = PathfinderConfig {
                size,
                difficulty,
                n_images: n,
                seed,
            };
            // Refused before any image is drawn: an existing sheet is never replaced.
            if let Some(sheet) = &sheet {
                if sheet_count == 0 {
                    anyhow::bail!("`--sheet-count` must be at least 1");
                }
                lra_runs::refuse_existing(sheet, "--sheet path")?;
            }
            let folder = pathfinder::write_dataset(&out, &config)?;
            println!("wrote {n} images to {}", folder.display());
            if let Some(sheet) = sheet {
                let images = (0..sheet_count.min(n))
                    .map(|i| {
                        pathfinder::read_png(
                            &folder.join("imgs/0").join(format!("sample_{i}.png")),
                            size,
                        )
                    })
                    .collect::<Result<Vec<_>>>()?;
                let scale = (256 / size).max(2);
                let (w, h, pixels) = pathfinder::contact_sheet(&images, size, 4, scale);
                lra_runs::write_new(&sheet, &pathfinder::png_bytes(&pixels, w, h)?)?;
                println!("wrote {}", sheet.display());
            }
            Ok(())
        }
        Command::GenerateMatching {
            out,
            n_train,
            n_val,
            n_test,
            seed,
        } => {
            burn_lra::data::matching::generate(
                &out,
                &burn_lra::data::matching::PairGeneratorConfig {
                    n_train,
                    n_val,
                    n_test,
                    seed,
                },
            )?;
            println!(
                "wrote {n_train} / {n_val} / {n_test} pairs to {}",
                out.display()
            );
            Ok(())
        }
        Command::Compare { a, b } => {
            let differences = burn_lra::run_dir::compare_run_dirs(&a, &b)?;
            if differences.is_empty() {
                println!(
                    "{} and {} are the same run (configuration, metrics, results, weights)",
                    a.display(),
                    b.display()
                );
                Ok(())
            } else {
                anyhow::bail!(
                    "{} and {} differ in {}",
                    a.display(),
                    b.display(),
                    differences.join(", ")
                )
            }
        }
        Command::Params {
            task,
            preset,
            config,
            backend,
        } => {
            let (config, preset) = load_config(&task, &preset, config.as_deref())?;
            let task = tasks::find(task.name())?;
            tasks::check_config(task, &config)?;
            // Counted from shapes: a model too large to train is refused, not built.
            // Each model resolved and counted once; one that cannot be trained here is named.
            let fits = |name: &str| -> Result<ParamCount> {
                let count = ParamCount::of(&ClassifierSpec::resolve(&config, task, name)?)?;
                check_memory(&count, &config, task, name)?;
                Ok(count)
            };
            let softmax = fits("softmax").context("the softmax baseline")?;
            // Models are built on the backend only to say it is compiled in.
            backend.device()?;
            println!("{} / {preset}: trainable parameters", task.name());
            println!("{:<16} {:>12} {:>12}", "attention", "params", "vs softmax");
            for v in burn_attention_zoo::VARIANTS {
                let count = match fits(v.name) {
                    Ok(count) => count,
                    Err(err) => {
                        println!("{:<16} {err:#}", v.name);
                        continue;
                    }
                };
                let budget = ParamBudget::new(&count, &softmax)
                    .with_context(|| format!("attention `{}`", v.name))?;
                let flag = if budget.increase() > 0.10 {
                    "  (over 10%)"
                } else {
                    ""
                };
                println!(
                    "{:<16} {:>12} {:>+11.2}%{flag}",
                    v.name,
                    budget.n_params,
                    100.0 * budget.increase()
                );
            }
            Ok(())
        }
    }
}

fn train_command(mut args: TrainArgs) -> Result<()> {
    // The library names what is wrong with a pattern; a name it accepts is well-formed.
    burn_attention_zoo::hybrid_pattern(&args.attention)?;
    let attention = lra_runs::AttentionName::new(&args.attention).map_err(anyhow::Error::msg)?;
    // Paths as the file system names them, so that a run records the same paths however the
    // command spelt them (`runs` or `/home/me/runs`).
    args.out = lra_runs::absolute(&args.out)?;
    args.run_dir = args
        .run_dir
        .as_deref()
        .map(lra_runs::absolute)
        .transpose()?;
    args.data_dir = args
        .data_dir
        .as_deref()
        .map(lra_runs::absolute)
        .transpose()?;
    let (config, preset) = load_config(&args.task, &args.preset, args.config.as_deref())?;
    let config = config.with_settings(&args.set)?.for_objective();
    let settings: Vec<&str> = args.set.iter().map(|s| s.text.as_str()).collect();
    let preset = match settings.as_slice() {
        [] => preset,
        given => lra_runs::point_name(&preset, given),
    };
    // Fine-tuned runs are filed apart from runs from scratch.
    let preset = match &args.init_from {
        Some(_) => format!("{preset},spt"),
        None => preset,
    };
    args.init_from = args
        .init_from
        .as_deref()
        .map(lra_runs::absolute)
        .transpose()?;
    let run_dir = args.run_dir.clone().unwrap_or_else(|| {
        lra_runs::run_dir(
            &lra_runs::sweep_dir(&args.out, &args.task, &preset),
            &args.attention,
            args.seed,
        )
    });
    // Everything the configuration and the attention decide is checked before any data is
    // loaded.
    let plan = RunPlan::new(
        config,
        TrainOptions {
            attention,
            seed: args.seed,
            backend: args.backend,
            device: args.device,
            run_dir: run_dir.clone(),
            preset: preset.clone(),
            progress: !args.no_progress && std::io::IsTerminal::is_terminal(&std::io::stderr()),
            resume: match (args.resume, args.continue_, args.restart) {
                (true, _, _) => ResumeMode::Resume,
                (_, true, _) => ResumeMode::Continue,
                (_, _, true) => ResumeMode::Restart,
                _ => ResumeMode::Start,
            },
            change_backend: args.change_backend,
            stop_after: args.stop_after,
            init_from: args.init_from.clone(),
        },
    )?;
    // A folder that is not a run directory is refused before any data is loaded (`train` checks
    // again under the lock).
    burn_lra::run_dir::check_run_dir(&run_dir)?;
    // A finished run is told before its data is loaded; `train` still returns the result of one
    // finished by another process meanwhile.
    if args.continue_
        && let lra_runs::RunState::Finished(result) = lra_runs::run_state(&run_dir)?
    {
        println!(
            "{}: finished before ({:.2}% test accuracy), nothing to do",
            run_dir.display(),
            100.0 * result.test_accuracy
        );
        return Ok(());
    }
    let device = args.backend.device_at(args.device)?;
    eprintln!(
        "burn-lra: {} / {} / preset {preset} / seed {} on {} ({device:?})",
        args.task.name(),
        args.attention,
        args.seed,
        args.backend
    );
    let mut splits = load_splits(
        plan.task,
        &plan.config,
        args.data_dir.as_deref(),
        &cache_dir(&args.out),
    )?;
    if plan.config.training.objective.is_pretraining() {
        let vocab = burn_lra::tasks::vocab_size(plan.task, &plan.config)?;
        splits = burn_lra::pretraining::pretraining_splits(splits, &plan.config, vocab, args.seed)?;
    }
    let [n_train, n_val, n_test] = splits.sizes();
    eprintln!(
        "data: {n_train} train / {n_val} val / {n_test} test examples, longest {} tokens; \
         test majority class {:.1}%; validation: {}",
        splits.train.max_tokens(),
        100.0 * splits.test.majority_rate(),
        splits.validation().source
    );
    let result = train(&plan, &splits)?;
    println!(
        "{} {} seed {}: test accuracy {:.2}% ({}; last {:.2}%, best-val {:.2}% at step {}), \
         majority class {:.2}%, {} parameters ({:+.2}% over softmax), {:.0} s -> {}",
        result.task,
        result.attention,
        result.seed,
        100.0 * result.test_accuracy,
        result.selection.as_str(),
        100.0 * result.test_accuracy_last,
        100.0 * result.test_accuracy_best_val,
        result.best_val_step,
        100.0 * result.test_majority_rate,
        result.n_params,
        100.0 * result.param_increase,
        result.train_seconds,
        run_dir.display()
    );
    for change in &result.config_changes {
        let fields: Vec<&str> = change.fields.keys().map(String::as_str).collect();
        println!(
            "  resumed from step {} with a changed configuration: {}",
            change.from_step,
            fields.join(", ")
        );
    }
    for warning in &result.warnings {
        println!("  warning: {warning}");
    }
    Ok(())
}

/// `check-backend`: one line per attention (the largest gap to flex over its steps), then a
/// verdict; an error naming the attentions outside the tolerance.
fn check_backend(backend: burn_lra::backend::BackendKind, names: &[String]) -> anyhow::Result<()> {
    use burn_lra::agreement::{ABSOLUTE, RELATIVE, check};
    let names: Vec<String> = if names.is_empty() {
        burn_attention_zoo::VARIANTS
            .iter()
            .map(|v| v.name.to_string())
            .collect()
    } else {
        names.to_vec()
    };
    println!(
        "{backend} against flex: logits after 3 AdamW steps and in evaluation \
         (tolerance {ABSOLUTE:e} + {RELATIVE:e} relative)"
    );
    let mut failed = Vec::new();
    for name in &names {
        let gaps = check(backend, name)?;
        let largest = gaps.iter().map(|g| g.max_abs).fold(0.0f32, f32::max);
        let agrees = gaps.iter().all(|g| g.agrees());
        println!(
            "{name:<22} max |Δ| {largest:.2e} {}",
            if agrees { "agrees" } else { "DIFFERS" }
        );
        if !agrees {
            failed.push(name.as_str());
        }
    }
    if !failed.is_empty() {
        anyhow::bail!(
            "{backend} differs from flex beyond the tolerance for: {}",
            failed.join(", ")
        );
    }
    println!("{backend}: all {} attentions agree with flex", names.len());
    Ok(())
}
