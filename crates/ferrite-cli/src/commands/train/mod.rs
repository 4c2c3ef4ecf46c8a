//! `ferrite train`: an MLP on a built-in dataset, with every memory-saving technique one flag
//! away and the allocator's figures printed every epoch.
//!
//! Why a built-in trainer: it is the README's main job (`cargo run --release` with no arguments
//! runs [`TrainArgs::default_demo`]) and the shortest path from "will this fit on a T4?" to an
//! answer: the same command runs on `cpu` or on a simulated GPU (`--device sim:t4-16gb`) whose
//! allocator refuses memory exactly where the real card would, and an out-of-memory error comes
//! back diagnosed (exhausted or fragmented) with ranked suggestions instead of a panic.
//!
//! Semantics a user should know:
//! - `--batch-size` is the micro-batch (what is in memory at once); with `--accum-steps k` the
//!   optimizer steps once per k micro-batches, an effective batch of `k × batch-size`. When an
//!   epoch's micro-batch count is not a multiple of k, the last partial group still steps (its
//!   gradient carries the 1/k scaling of the full group).
//! - `--amp bf16|f16` runs linears in low precision under autocast (losses stay f32); `f16`
//!   also enables dynamic loss scaling (GradScaler), `bf16` does not need it.
//! - `--save-checkpoint PATH` writes a training checkpoint after every epoch (atomically);
//!   `--resume PATH` continues from one bit-identically — same weights as an uninterrupted run.

mod model;
pub mod resume;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use ferrite_data::{DataLoader, Dataset, DatasetKind, ImageClassification, ImageCollate, Tensors, builtin_dataset};
use ferrite_memory::{MemoryScope, allocator, format_size};
use ferrite_nn::{CrossEntropyLoss, Module, RngHandle, StateDict, autocast, inference};
use ferrite_optim::{Accumulator, Adam, AdamConfig, GradScaler, GradScalerConfig, Optimizer, clip_grad_norm_};
use ferrite_tensor::{DType, Device, Generator, Tensor};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use self::model::{Mlp, MlpSpec, build_mlp};
use self::resume::TrainingState;
use super::CliResult;
use crate::observe::{BatchReport, ObserveArgs, RunInfo, RunObserver, StepReport};

/// More hidden layers than any MLP worth training; bounds the work done before the first
/// allocation.
const MAX_LAYERS: usize = 10_000;

/// Low-precision autocast for `--amp`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amp {
    Bf16,
    F16,
}

impl Amp {
    fn dtype(self) -> DType {
        match self {
            Amp::Bf16 => DType::BF16,
            Amp::F16 => DType::F16,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Amp::Bf16 => "bf16",
            Amp::F16 => "f16",
        }
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct TrainArgs {
    /// Built-in dataset: `digits` (embedded, 1,442 train / 355 test 8×8 images) or
    /// `fashion-mnist` (60k/10k from Debian's dataset-fashion-mnist package).
    #[arg(long, default_value = "digits")]
    pub dataset: String,
    /// Device to train on: `cpu`, or a simulated GPU such as `sim:t4-16gb`, `sim:a100-40gb`,
    /// `sim:1GiB` (see `ferrite memory gpus`).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Micro-batch size (samples in memory at once).
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Micro-batches per optimizer step (effective batch = batch-size × accum-steps).
    #[arg(long, default_value_t = 1)]
    pub accum_steps: usize,
    /// Mixed precision: linears in bf16 or f16 under autocast (f16 adds loss scaling).
    #[arg(long, value_enum)]
    pub amp: Option<Amp>,
    /// Recompute each hidden block's activations in backward instead of keeping them.
    #[arg(long)]
    pub checkpoint_activations: bool,
    /// Epochs to train (default: 20 for digits, 5 for fashion-mnist). With --resume, the total
    /// including the epochs already done.
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Seed for initialisation, shuffling and dropout; the same seed gives the same run.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Width of each hidden layer.
    #[arg(long, default_value_t = 128)]
    pub hidden: usize,
    /// Number of hidden layers.
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Dropout probability after each hidden activation (0 = none).
    #[arg(long, default_value_t = 0.0)]
    pub dropout: f64,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// AdamW decoupled weight decay.
    #[arg(long, default_value_t = 0.01)]
    pub weight_decay: f64,
    /// Clip the gradient norm to this value before each step.
    #[arg(long)]
    pub clip_grad_norm: Option<f64>,
    /// Background data-loading workers (0 = load in the training thread). Results do not depend
    /// on it.
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// Train on the first N training samples only (quick runs).
    #[arg(long)]
    pub train_subset: Option<usize>,
    /// Where to write the trained weights (safetensors, PyTorch parameter names).
    /// Default: ferrite-<dataset>-mlp.safetensors in the current directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write a training checkpoint here after every epoch (atomic replace).
    #[arg(long)]
    pub save_checkpoint: Option<PathBuf>,
    /// Continue from a training checkpoint written by --save-checkpoint.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax (overrides FERRITE_ALLOC_CONF).
    #[arg(long)]
    pub alloc_conf: Option<String>,
    /// No progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long)]
    pub no_progress: bool,
    #[command(flatten)]
    pub observe: ObserveArgs,
}

impl TrainArgs {
    /// The configuration `ferrite` with no arguments runs.
    pub fn default_demo() -> Self {
        TrainArgs {
            dataset: "digits".into(),
            device: "cpu".into(),
            batch_size: 64,
            accum_steps: 1,
            amp: None,
            checkpoint_activations: false,
            epochs: None,
            seed: 0,
            hidden: 128,
            layers: 2,
            dropout: 0.0,
            lr: 1e-3,
            weight_decay: 0.01,
            clip_grad_norm: None,
            workers: 0,
            train_subset: None,
            out: None,
            save_checkpoint: None,
            resume: None,
            alloc_conf: None,
            no_progress: false,
            observe: ObserveArgs::default(),
        }
    }
}

/// What can stop a training run. Library errors keep their own (diagnosed) messages; the
/// variants here add what the trainer knows.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("invalid --{flag} {value}: {expected}")]
    InvalidArgument { flag: &'static str, value: String, expected: &'static str },
    #[error(
        "cannot train on `meta`: it has shapes but no data, so there is no loss to compute. Use a simulated GPU (`--device sim:t4-16gb`) to see memory use with real values"
    )]
    MetaDevice,
    #[error(
        "cannot resume: the checkpoint was written with --{setting} {saved}, this run has --{setting} {given}. Resume with the same setting, or start a new run without --resume"
    )]
    ResumeMismatch { setting: String, saved: String, given: String },
    #[error("{path} is not a `ferrite train` checkpoint ({found}); write one with --save-checkpoint")]
    NotATrainingCheckpoint { path: String, found: String },
    #[error("corrupt training checkpoint: `{entry}` {reason}")]
    CorruptCheckpoint { entry: String, reason: String },
    #[error("{phase} on {device}: {source}{hint}")]
    During { phase: &'static str, device: String, source: Box<TrainError>, hint: String },
    #[error(transparent)]
    Data(#[from] ferrite_data::DataError),
    #[error(transparent)]
    Nn(#[from] ferrite_nn::NnError),
    #[error(transparent)]
    Optim(#[from] ferrite_optim::OptimError),
    #[error(transparent)]
    Tensor(#[from] ferrite_tensor::TensorError),
    #[error(transparent)]
    Memory(#[from] ferrite_memory::MemoryError),
    #[error(transparent)]
    Io(#[from] ferrite_io::IoError),
    #[error(transparent)]
    Observe(#[from] crate::observe::ObserveError),
}

impl TrainError {
    fn corrupt(path: &std::path::Path, reason: &str) -> TrainError {
        TrainError::CorruptCheckpoint { entry: path.display().to_string(), reason: reason.to_string() }
    }

    fn corrupt_entry(entry: impl Into<String>, reason: impl Into<String>) -> TrainError {
        TrainError::CorruptCheckpoint { entry: entry.into(), reason: reason.into() }
    }

    /// Whether this is a device running out of memory (whatever layer reported it).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            TrainError::During { source, .. } => source.is_out_of_memory(),
            TrainError::Memory(e) => e.oom_report().is_some(),
            TrainError::Tensor(e) => e.oom_report().is_some(),
            TrainError::Nn(e) => e.oom_report().is_some(),
            TrainError::Optim(ferrite_optim::OptimError::Tensor(e)) => e.oom_report().is_some(),
            TrainError::Io(ferrite_io::IoError::Tensor(e)) => e.oom_report().is_some(),
            // A loader wraps what collation or staging to the device returned.
            TrainError::Data(e) => oom_in_sources(e),
            _ => false,
        }
    }
}

/// Whether an error in `e`'s source chain is an out-of-memory error.
fn oom_in_sources(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = e.source();
    while let Some(s) = cur {
        let oom = s.downcast_ref::<ferrite_memory::MemoryError>().is_some_and(|m| m.oom_report().is_some())
            || s.downcast_ref::<ferrite_tensor::TensorError>().is_some_and(|t| t.oom_report().is_some())
            || s.downcast_ref::<ferrite_nn::NnError>().is_some_and(|n| n.oom_report().is_some());
        if oom {
            return true;
        }
        cur = s.source();
    }
    false
}

/// A trainer-level explanation added after an error — only after the kind of error it explains:
/// advice for one failure is false advice for another.
pub enum Hint {
    /// Shown only when the error is a device running out of memory.
    OutOfMemory(String),
}

impl Hint {
    /// The text to show after `error`: the hint if it is about this kind of error, else nothing.
    fn for_error(self, error: &TrainError) -> String {
        match self {
            Hint::OutOfMemory(text) if error.is_out_of_memory() => text,
            Hint::OutOfMemory(_) => String::new(),
        }
    }
}

/// Tags an error with the phase of training it happened in.
trait During<T> {
    fn during(self, phase: &'static str, device: &Device) -> Result<T, TrainError>;
    /// As `during`, adding `hint` after the error when the error is the kind the hint explains.
    fn during_hint(self, phase: &'static str, device: &Device, hint: Hint) -> Result<T, TrainError>;
}

impl<T, E: Into<TrainError>> During<T> for Result<T, E> {
    fn during(self, phase: &'static str, device: &Device) -> Result<T, TrainError> {
        self.map_err(|e| TrainError::During {
            phase,
            device: device.to_string(),
            source: Box::new(e.into()),
            hint: String::new(),
        })
    }

    fn during_hint(self, phase: &'static str, device: &Device, hint: Hint) -> Result<T, TrainError> {
        self.map_err(|e| {
            let source: TrainError = e.into();
            let hint = hint.for_error(&source);
            TrainError::During { phase, device: device.to_string(), source: Box::new(source), hint }
        })
    }
}

pub fn run(args: TrainArgs) -> CliResult {
    train(&args)?;
    Ok(())
}

fn check(flag: &'static str, ok: bool, value: impl ToString, expected: &'static str) -> Result<(), TrainError> {
    if ok { Ok(()) } else { Err(TrainError::InvalidArgument { flag, value: value.to_string(), expected }) }
}

/// Runs training as configured; prints progress to stdout/stderr.
pub fn train(args: &TrainArgs) -> Result<(), TrainError> {
    let kind: DatasetKind = args.dataset.parse()?;
    let device = Device::parse(&args.device)?;
    if matches!(device, Device::Meta) {
        return Err(TrainError::MetaDevice);
    }
    check("batch-size", args.batch_size >= 1, args.batch_size, "must be at least 1")?;
    check("accum-steps", args.accum_steps >= 1, args.accum_steps, "must be at least 1")?;
    check("hidden", args.hidden >= 1, args.hidden, "must be at least 1")?;
    check("layers", (1..=MAX_LAYERS).contains(&args.layers), args.layers, "must be between 1 and 10000")?;
    check("dropout", (0.0..1.0).contains(&args.dropout), args.dropout, "must be in [0, 1)")?;
    check("lr", args.lr.is_finite() && args.lr > 0.0, args.lr, "must be a positive number")?;
    check(
        "weight-decay",
        args.weight_decay.is_finite() && args.weight_decay >= 0.0,
        args.weight_decay,
        "must be a non-negative number",
    )?;
    if let Some(c) = args.clip_grad_norm {
        check("clip-grad-norm", c.is_finite() && c > 0.0, c, "must be a positive number")?;
    }
    if let Some(n) = args.train_subset {
        check("train-subset", n >= 1, n, "must be at least 1")?;
    }
    let epochs = args.epochs.unwrap_or(match kind {
        DatasetKind::Digits => 20,
        DatasetKind::FashionMnist => 5,
    });
    check("epochs", epochs >= 1, epochs, "must be at least 1")?;
    let alloc = allocator(&device);
    match &args.alloc_conf {
        Some(spec) => alloc.set_alloc_conf(spec)?,
        // A bad FERRITE_ALLOC_CONF is reported now, not as the failure of the first allocation.
        None => {
            ferrite_memory::env_alloc_config()?;
        }
    }

    // ---- data
    let splits = builtin_dataset(kind)?;
    let train_set = match args.train_subset {
        Some(n) => splits.train.take(n),
        None => splits.train,
    };
    let (inputs, classes) = (train_set.num_features(), train_set.num_classes());
    let (train_len, test_len) = (Dataset::len(&train_set), Dataset::len(&splits.test));
    let mut seeds = Generator::new(args.seed);
    let loader_seed = seeds.next_u64();
    let mut train_loader = {
        let b = train_set.tensor_loader(args.batch_size).shuffle(true).seed(loader_seed).num_workers(args.workers);
        if device == Device::Cpu { b.build()? } else { b.stage_to(device.clone()).build()? }
    };
    let mut test_loader = {
        let b = splits.test.tensor_loader(500).num_workers(args.workers);
        if device == Device::Cpu { b.build()? } else { b.stage_to(device.clone()).build()? }
    };

    // ---- model, optimizer, scaler
    let spec = MlpSpec {
        inputs,
        hidden: args.hidden,
        layers: args.layers,
        classes,
        dropout: args.dropout,
        checkpoint_activations: args.checkpoint_activations,
    };
    let Some(num_parameters) = spec.num_parameters().filter(|n| n.checked_mul(16).is_some()) else {
        return Err(TrainError::InvalidArgument {
            flag: "hidden",
            value: args.hidden.to_string(),
            expected: "too large: the model's size does not fit in 64 bits",
        });
    };
    let param_bytes = num_parameters * 4;
    // Weights, their gradients and AdamW's two moments, all f32 (autocast keeps master weights
    // in f32): the floor of training memory before any activation.
    let state_bytes = 4 * param_bytes;
    println!(
        "ferrite train: {kind} ({train_len} train / {test_len} test), MLP {inputs}-{}-{classes} on {device}",
        vec![args.hidden.to_string(); args.layers].join("-"),
    );
    println!(
        "  {} parameters: weights {}, with gradients and AdamW moments {} before activations",
        num_parameters,
        format_size(param_bytes),
        format_size(state_bytes),
    );
    println!(
        "  batch {} x {} accumulation = {} per step, {}, {}, AdamW lr {} wd {}, seed {}, {} workers",
        args.batch_size,
        args.accum_steps,
        args.batch_size.saturating_mul(args.accum_steps),
        args.amp.map_or("f32".to_string(), |a| format!("autocast {}", a.name())),
        if args.checkpoint_activations { "activation checkpointing" } else { "activations kept" },
        args.lr,
        args.weight_decay,
        args.seed,
        args.workers,
    );
    // Outputs for watching the run (metrics endpoint, JSON lines) start before the model is
    // built, so a port in use or an unwritable file fails the run before any real work.
    let run = start_observer(args, kind, &spec, &device)?;
    let dropout_rng = RngHandle::new(seeds.next_u64());
    let mut init = Generator::new(seeds.next_u64());
    let too_big = Hint::OutOfMemory(format!(
        "\nThe model alone does not fit: its weights need {}, and training them needs about {} (weights, gradients, AdamW moments) before any activation. Batch size, accumulation and checkpointing cannot help with that; use a smaller --hidden/--layers or a device with more memory (`ferrite memory gpus`).",
        format_size(param_bytes),
        format_size(state_bytes)
    ));
    let mut model =
        build_mlp(&spec, &device, &mut init, &dropout_rng).during_hint("building the model", &device, too_big)?;
    let mut opt = Adam::named(model.named_parameters(), AdamConfig::adamw(args.lr).weight_decay(args.weight_decay))?;
    let mut scaler =
        GradScaler::new(GradScalerConfig { enabled: args.amp == Some(Amp::F16), ..GradScalerConfig::default() })?;
    let mut acc = Accumulator::new(args.accum_steps)?;
    let loss_fn = CrossEntropyLoss::new();

    let settings = run_settings(args, kind);
    let mut first_epoch = 0;
    let mut steps: u64 = 0;
    if let Some(path) = &args.resume {
        let state = resume::load(path, &device, &settings)?;
        let sd: StateDict = state.model.into_iter().collect();
        model.load_state_dict(&sd, true)?;
        opt.load_state_dict(&state.optimizer)?;
        if scaler.is_enabled() {
            scaler.load_state_dict(state.scaler.as_ref())?;
        }
        train_loader.set_generator_state(state.loader_rng);
        dropout_rng.set_state(state.dropout_rng);
        first_epoch = state.epoch;
        steps = state.step;
        println!("  resumed from {} after epoch {first_epoch} ({steps} steps)", path.display());
        if first_epoch >= epochs {
            println!("  nothing to do: the checkpoint already has {first_epoch} of {epochs} epochs");
        }
    }

    run.set_steps(steps);

    // ---- training
    let show_progress = !args.no_progress && std::io::stderr().is_terminal();
    let start = Instant::now();
    let mut test_accuracy = f64::NAN;
    for epoch in first_epoch..epochs {
        let epoch_start = Instant::now();
        let scope = MemoryScope::new(format!("epoch {}", epoch + 1), &device).quiet();
        let bar = progress_bar(show_progress, train_loader.len() as u64, epoch + 1, epochs);
        let (mut loss_sum, mut batches, mut correct, mut seen) = (0.0f64, 0usize, 0usize, 0usize);
        let mut pass_peak = 0u64;
        run.epoch_started(epoch + 1, epochs);
        for batch in run.time_loader(train_loader.epoch()) {
            let (x, y) = batch?;
            let x = x.flatten(1, -1)?;
            let pass = MemoryScope::new("forward+backward", &device).quiet();
            let (loss, logits) = {
                let _amp = args.amp.map(|a| autocast(a.dtype())).transpose()?;
                let logits = model.forward(&x).during("forward pass", &device)?;
                (loss_fn.forward(&logits, &y)?, logits)
            };
            scaler.scale(&acc.scale_loss(&loss)?)?.backward().during("backward pass", &device)?;
            pass_peak = pass_peak.max(pass.finish().peak_allocated);
            if acc.micro_step() {
                let applied =
                    optimizer_step(&mut opt, &mut scaler, args.clip_grad_norm).during("optimizer step", &device)?;
                run.step(step_report(applied, &opt, &scaler));
                steps += 1;
            }
            let l = loss.item()?;
            loss_sum += l;
            batches += 1;
            correct += count_correct(&logits, &y)?;
            seen += y.numel();
            bar.inc(1);
            bar.set_message(format!("loss {l:.4}"));
            run.batch(BatchReport { samples: y.numel(), loss: l });
        }
        if acc.pending() > 0 {
            let applied =
                optimizer_step(&mut opt, &mut scaler, args.clip_grad_norm).during("optimizer step", &device)?;
            run.step(step_report(applied, &opt, &scaler));
            acc.reset();
            steps += 1;
        }
        run.epoch_finished();
        bar.finish_and_clear();
        // The memory figures are the training pass's; evaluation (no graph, batch 500) follows.
        let mem = scope.finish();
        test_accuracy = evaluate(&mut model, &mut test_loader).during("evaluation", &device)?;
        println!(
            "epoch {:>3}/{epochs}  loss {:.4}  train acc {:5.2}%  test acc {:5.2}%  | memory: allocated {}, reserved {}, peak {} (forward+backward {})  | {}",
            epoch + 1,
            loss_sum / batches.max(1) as f64,
            100.0 * correct as f64 / seen.max(1) as f64,
            100.0 * test_accuracy,
            format_size(mem.allocated_after),
            format_size(mem.reserved_after),
            format_size(mem.peak_allocated),
            format_size(pass_peak),
            seconds(epoch_start.elapsed().as_secs_f64()),
        );
        if let Some(path) = &args.save_checkpoint {
            let state = TrainingState {
                epoch: epoch + 1,
                step: steps,
                model: model.named_parameters(),
                optimizer: opt.state_dict()?,
                scaler: scaler.state_dict(),
                loader_rng: train_loader.generator_state(),
                dropout_rng: dropout_rng.state(),
                settings: settings.clone(),
            };
            resume::save(path, &state)?;
        }
    }
    if first_epoch >= epochs {
        test_accuracy = evaluate(&mut model, &mut test_loader).during("evaluation", &device)?;
    }

    // ---- results
    let weights = args.out.clone().unwrap_or_else(|| PathBuf::from(format!("ferrite-{kind}-mlp.safetensors")));
    let sd = model.state_dict();
    ferrite_io::save_state_dict(&weights, sd.iter())?;
    let run_epochs = epochs.saturating_sub(first_epoch);
    println!(
        "test accuracy {:.2}% after {epochs} epochs ({run_epochs} run here, {:.1}s); weights written to {}",
        100.0 * test_accuracy,
        start.elapsed().as_secs_f64(),
        weights.display()
    );
    println!("{}", alloc.memory_summary(true));
    run.finish();
    Ok(())
}

/// The run's metrics outputs (`--metrics-addr`, `--metrics-file`), announced on stdout.
fn start_observer(
    args: &TrainArgs,
    kind: DatasetKind,
    spec: &MlpSpec,
    device: &Device,
) -> Result<RunObserver, TrainError> {
    let model =
        format!("mlp {}-{}-{}", spec.inputs, vec![spec.hidden.to_string(); spec.layers].join("-"), spec.classes);
    let info = RunInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        model,
        dataset: kind.name().to_string(),
        device: device.to_string(),
    };
    // Batches are collated on the host before they are staged to the device: report both.
    let mut devices = vec![device.clone()];
    if *device != Device::Cpu {
        devices.push(Device::Cpu);
    }
    let run = RunObserver::start(&args.observe, info, devices)?;
    if let Some(url) = run.metrics_url() {
        println!("  metrics: serving {url}");
    }
    if let Some(path) = &args.observe.metrics_file {
        println!("  metrics: appending JSON lines to {}", path.display());
    }
    Ok(run)
}

/// What the optimizer step just did, for the run's metrics.
fn step_report(applied: bool, opt: &Adam, scaler: &GradScaler) -> StepReport {
    StepReport {
        applied,
        learning_rate: opt.lrs().first().copied().unwrap_or(f64::NAN),
        grad_scale: scaler.is_enabled().then(|| scaler.get_scale()),
    }
}

/// The settings a resume must not change.
fn run_settings(args: &TrainArgs, kind: DatasetKind) -> Vec<(String, String)> {
    vec![
        ("dataset".into(), kind.name().into()),
        ("hidden".into(), args.hidden.to_string()),
        ("layers".into(), args.layers.to_string()),
        ("dropout".into(), args.dropout.to_string()),
        ("batch-size".into(), args.batch_size.to_string()),
        ("accum-steps".into(), args.accum_steps.to_string()),
        ("amp".into(), args.amp.map_or("none", Amp::name).into()),
        ("seed".into(), args.seed.to_string()),
        ("lr".into(), args.lr.to_string()),
        ("weight-decay".into(), args.weight_decay.to_string()),
        ("train-subset".into(), args.train_subset.map_or("all".into(), |n| n.to_string())),
    ]
}

/// One optimizer step; false when the GradScaler skipped it (inf/NaN gradients).
fn optimizer_step(opt: &mut Adam, scaler: &mut GradScaler, clip: Option<f64>) -> Result<bool, TrainError> {
    if let Some(max_norm) = clip {
        scaler.unscale_(opt)?;
        clip_grad_norm_(&opt.params(), max_norm)?;
    }
    let applied = scaler.step(opt)?;
    scaler.update()?;
    opt.zero_grad()?;
    Ok(applied)
}

fn count_correct(logits: &Tensor, y: &Tensor) -> Result<usize, TrainError> {
    let hits = logits.argmax(1, false)?.eq(y)?.to_vec_bool()?;
    Ok(hits.into_iter().filter(|h| *h).count())
}

fn evaluate(
    model: &mut Mlp,
    loader: &mut DataLoader<ImageClassification, Tensors<ImageCollate>>,
) -> Result<f64, TrainError> {
    let (mut correct, mut seen) = (0usize, 0usize);
    for batch in loader {
        let (x, y) = batch?;
        let logits = inference(model, |m| m.forward(&x.flatten(1, -1)?))?;
        correct += count_correct(&logits, &y)?;
        seen += y.numel();
    }
    Ok(correct as f64 / seen.max(1) as f64)
}

/// `12.3 ms` below a second, `1.23 s` above.
fn seconds(s: f64) -> String {
    if s < 1.0 { format!("{:.1} ms", s * 1e3) } else { format!("{s:.2} s") }
}

fn progress_bar(show: bool, len: u64, epoch: usize, epochs: usize) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(format!("epoch {epoch}/{epochs}"));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hinted(e: impl Into<TrainError>) -> String {
        Err::<(), _>(e)
            .during_hint("building the model", &Device::Cpu, Hint::OutOfMemory("\nTHE HINT".into()))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn out_of_memory_hints_follow_only_out_of_memory_errors() {
        let sim = Device::parse("sim:1GiB").unwrap();
        let oom = Tensor::zeros(&[1 << 30], DType::F32, &sim).unwrap_err();
        assert!(oom.oom_report().is_some());
        assert!(hinted(oom).ends_with("THE HINT"));
        let config = ferrite_memory::AllocatorConfig::parse("max_split_size_mb:abc").unwrap_err();
        let msg = hinted(config.clone());
        assert!(msg.contains("max_split_size_mb") && !msg.contains("THE HINT"), "{msg}");
        assert!(!hinted(ferrite_tensor::TensorError::Memory(config)).contains("THE HINT"));
        assert!(!hinted(TrainError::MetaDevice).contains("THE HINT"));
    }
}
