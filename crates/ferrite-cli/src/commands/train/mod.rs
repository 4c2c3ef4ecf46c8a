//! `ferrite train`: the built-in models on built-in data, with every memory-saving technique one
//! flag away and the allocator's figures printed every epoch.
//!
//! Why a built-in trainer: it is the README's main job (`cargo run --release` with no arguments
//! runs [`TrainArgs::default_demo`]) and the shortest path from "will this fit on a T4?" to an
//! answer: the same command runs on `cpu` or on a simulated GPU (`--device sim:t4-16gb`) whose
//! allocator refuses memory exactly where the real card would, and an out-of-memory error comes
//! back diagnosed (exhausted or fragmented) with ranked suggestions instead of a panic.
//!
//! Four model families (`--model`), two tasks:
//! - image classification ([`image`]): `mlp` and `cnn` (conv-bn-relu-pool blocks) on digits
//!   (8×8), Fashion-MNIST (28×28), or the user's own `--data` ([`image_data`]: an image folder,
//!   or a CSV table for the MLP);
//! - character-level language modelling ([`language`]): `lstm` (truncated backpropagation through
//!   time, the hidden state carried across chunks and detached at each boundary) and
//!   `transformer` (decoder-only, causal attention) on the Jargon File, so the two can be
//!   compared on one corpus, or on the user's own `--data` (a text file or a folder of .txt).
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

mod data_parallel;
mod image;
mod image_data;
mod language;
mod plan_context;
mod settings;

use std::path::PathBuf;

use ferrite_memory::allocator;
use ferrite_tensor::Device;

use ferrite_train::distributed;
pub use ferrite_train::{During, Hint, TrainError};

pub use super::model_args::{Amp, ModelArgs, ModelKind};

use super::CliResult;
use crate::observe_args::ObserveArgs;

/// More hidden layers than any MLP worth training; bounds the work done before the first
/// allocation.
const MAX_LAYERS: usize = 10_000;

#[derive(clap::Args, Debug, Clone)]
pub struct TrainArgs {
    /// Model family: `mlp` and `cnn` classify images, `lstm` and `transformer` are
    /// character-level language models.
    #[arg(long, value_enum, default_value = "mlp")]
    pub model: ModelKind,
    /// Dataset: `digits` (embedded, 1,442 train / 355 test 8×8 images) or `fashion-mnist`
    /// (60k/10k from Debian's dataset-fashion-mnist package) for the image models; `jargon` (the
    /// Jargon File, Debian's jargon-text package) or the path of any UTF-8 text file (gzipped or
    /// not) for the language models. Default: digits, or jargon for a language model.
    #[arg(long)]
    pub dataset: Option<String>,
    /// Your own data instead of a built-in dataset. For `mlp` and `cnn`: a folder of images in
    /// torchvision's ImageFolder layout (one subfolder per class; PNG, JPEG or BMP), its
    /// `train/` and `val/` (or `test/`) subfolders as the splits if it has them; for `mlp`, a CSV
    /// file with a header row and --target. For `lstm` and `transformer`: a UTF-8 text file, or a
    /// folder whose .txt files are joined in name order.
    #[arg(long, conflicts_with = "dataset")]
    pub data: Option<PathBuf>,
    /// The column of the --data CSV file holding each row's class (integers or text); every other
    /// column is a numeric feature, standardised with the training split's mean and std.
    #[arg(long, requires = "data")]
    pub target: Option<String>,
    /// Resize every image of --data to N×N pixels. Without it all images must share one size.
    #[arg(long, requires = "data")]
    pub image_size: Option<u32>,
    /// Share of each class of --data held out (seeded by --seed) to measure the test accuracy,
    /// when the folder has no train/ and val/ (or test/) subfolders, and for a CSV file.
    #[arg(long, default_value_t = 0.1)]
    pub val_split: f64,
    /// Augment the training images: a random crop with zero padding (an eighth of the side, 4 px
    /// for 28×28) and a random horizontal flip, drawn per sample so the run is the same for any
    /// --workers.
    #[arg(long)]
    pub augment: bool,
    /// Skip unreadable or corrupt images in --data (their number is printed) instead of stopping
    /// at the first.
    #[arg(long, requires = "data")]
    pub skip_bad_files: bool,
    /// Device to train on: `cpu`, a simulated GPU such as `sim:t4-16gb`, `sim:a100-40gb`,
    /// `sim:1GiB` (see `ferrite memory gpus`), or a real GPU `gpu:0` (see `ferrite devices`).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Micro-batch size (samples in memory at once; for a language model, the number of
    /// parallel text streams), or `auto`: the largest that `ferrite plan` finds fits on the
    /// (simulated) GPU, printed with its plan.
    #[arg(long, default_value = "64", value_parser = parse_batch_size)]
    pub batch_size: usize,
    /// Micro-batches per optimizer step (effective batch = batch-size × accum-steps).
    #[arg(long, default_value_t = 1)]
    pub accum_steps: usize,
    /// Mixed precision: linears in bf16 or f16 under autocast (f16 adds loss scaling).
    #[arg(long, value_enum)]
    pub amp: Option<Amp>,
    /// Recompute activations in backward instead of keeping them (MLP: runs of ⌈√layers⌉
    /// blocks; CNN: each conv block; LSTM: each chunk's recurrence; transformer: each block).
    #[arg(long)]
    pub checkpoint_activations: bool,
    /// Epochs to train (default: 20 for digits, 5 for fashion-mnist, 1 for text). With --resume,
    /// the total including the epochs already done.
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Seed for initialisation, shuffling and dropout; the same seed gives the same run.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub shape: ModelArgs,
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
    /// Train on the first N training samples only (quick runs); for a language model, the first
    /// N characters of the training text.
    #[arg(long)]
    pub train_subset: Option<usize>,
    /// Where to write the trained weights (safetensors, PyTorch parameter names).
    /// Default: ferrite-<dataset>-<model>.safetensors in the current directory.
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
    /// Record the allocator's history (the last 100,000 events) and write it with the segments
    /// as a PyTorch memory snapshot pickle here when the run ends, also when it fails (open it at
    /// pytorch.org/memory_viz, or `ferrite memory replay|plot FILE`).
    #[arg(long)]
    pub snapshot: Option<PathBuf>,
    /// One rank of an MPI job: `mpirun -np 2 ferrite train --distributed ...` averages gradients
    /// over the ranks (DistributedDataParallel); each rank reads its own share of the data (images,
    /// or text streams). Every model. Rank 0 prints and writes weights, checkpoints and
    /// `--snapshot` (its own allocator's). Needs a build with `--features mpi`.
    #[arg(long)]
    pub distributed: bool,
    #[command(flatten)]
    pub observe: ObserveArgs,
    /// Train with DataParallel on these devices of the `--device` kind, renumbered from 0 like
    /// CUDA_VISIBLE_DEVICES (`--device sim:a100-40gb --devices 0,1,2,3`: four simulated A100s).
    /// Default: FERRITE_VISIBLE_DEVICES, else one device.
    #[arg(long)]
    pub devices: Option<String>,
    /// Train with DataParallel on every visible device (see --devices).
    #[arg(long)]
    pub data_parallel: bool,
}

/// `--batch-size auto` is held as this value until the planner resolves it.
pub const BATCH_SIZE_AUTO: usize = usize::MAX;

/// `--batch-size N` or `auto` (0 is refused later with the other settings' checks).
fn parse_batch_size(s: &str) -> Result<usize, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(BATCH_SIZE_AUTO);
    }
    match s.parse::<usize>() {
        Ok(n) if n != BATCH_SIZE_AUTO => Ok(n),
        _ => Err(format!("`{s}` is not a batch size: a whole number of at least 1, or `auto`")),
    }
}

/// `args` with `--batch-size auto` replaced by the planner's answer.
fn resolve_batch_size(args: &TrainArgs) -> Result<Option<TrainArgs>, TrainError> {
    if args.batch_size != BATCH_SIZE_AUTO {
        return Ok(None);
    }
    let mut a = args.clone();
    a.batch_size = plan_context::auto_batch_size(args)?;
    Ok(Some(a))
}

impl TrainArgs {
    /// The configuration `ferrite` with no arguments runs.
    pub fn default_demo() -> Self {
        TrainArgs {
            model: ModelKind::Mlp,
            dataset: None,
            data: None,
            target: None,
            image_size: None,
            val_split: 0.1,
            augment: false,
            skip_bad_files: false,
            device: "cpu".into(),
            batch_size: 64,
            accum_steps: 1,
            amp: None,
            checkpoint_activations: false,
            epochs: None,
            seed: 0,
            shape: ModelArgs::default(),
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
            snapshot: None,
            distributed: false,
            observe: ObserveArgs::default(),
            devices: None,
            data_parallel: false,
        }
    }

    /// `--hidden`, or the model's default width.
    fn hidden(&self) -> usize {
        self.shape.hidden(self.model)
    }

    /// `--layers`, or the model's default depth.
    fn layers(&self) -> usize {
        self.shape.layers(self.model)
    }
}

pub fn run(args: TrainArgs) -> CliResult {
    check_own_data(&args)?;
    let args = resolve_batch_size(&args)?.unwrap_or(args);
    // Out of memory: the report's ranked suggestions become the planner's, with the bytes each
    // saves for this model (the fixed rules stay, saying why, where the planner cannot model it).
    train(&args).map_err(|e| {
        if own_images(&args) {
            ferrite_train::planned::with_planned_remedies(e, Err(OWN_IMAGES_UNPLANNED.to_string())).into()
        } else {
            plan_context::with_planned_remedies(e, &args).into()
        }
    })
}

/// Why the planner is not asked about a run on `--data` images or tables.
const OWN_IMAGES_UNPLANNED: &str = "it trains on --data, whose sample shape the planner does not know";

/// Whether an image model trains on the user's own data (`--data`).
fn own_images(args: &TrainArgs) -> bool {
    args.data.is_some() && !args.model.is_language_model()
}

/// The `--data` flags that cannot work together with the rest, refused before anything runs.
fn check_own_data(args: &TrainArgs) -> Result<(), TrainError> {
    check(
        "val-split",
        args.val_split > 0.0 && args.val_split < 1.0,
        args.val_split,
        "must be between 0 and 1 (exclusive), e.g. 0.1",
    )?;
    if let Some(n) = args.image_size {
        check("image-size", n >= 1, n, "must be at least 1")?;
    }
    if args.model.is_language_model() {
        let image_only = [
            ("target", args.target.is_some()),
            ("image-size", args.image_size.is_some()),
            ("augment", args.augment),
            ("skip-bad-files", args.skip_bad_files),
        ];
        if let Some((flag, _)) = image_only.into_iter().find(|(_, given)| *given) {
            return Err(TrainError::InvalidArgument {
                flag,
                value: args.model.name().to_string(),
                expected: "an image model (mlp, cnn); a language model reads a text file or a folder of .txt files",
            });
        }
        return Ok(());
    }
    if own_images(args) {
        if data_parallel::requested(args) {
            return Err(TrainError::InvalidArgument {
                flag: "data",
                value: args.data.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                expected: "a built-in --dataset with --devices/--data-parallel (DataParallel reads those only); train on one device or with --distributed",
            });
        }
        if args.batch_size == BATCH_SIZE_AUTO {
            return Err(TrainError::InvalidArgument {
                flag: "batch-size",
                value: "auto".to_string(),
                expected: "a number with --data: the planner knows the built-in datasets' shapes only",
            });
        }
    } else if args.augment && data_parallel::requested(args) {
        return Err(TrainError::InvalidArgument {
            flag: "augment",
            value: "true".to_string(),
            expected: "one device or --distributed; DataParallel does not augment",
        });
    }
    Ok(())
}

/// Whether the run trains with DataParallel on several devices (`--devices`, `--data-parallel`).
pub(crate) fn data_parallel_requested(args: &TrainArgs) -> bool {
    data_parallel::requested(args)
}

fn check(flag: &'static str, ok: bool, value: impl ToString, expected: &'static str) -> Result<(), TrainError> {
    if ok { Ok(()) } else { Err(TrainError::InvalidArgument { flag, value: value.to_string(), expected }) }
}

/// `--distributed`: join the MPI job and train; a failure is reported to the other ranks, which
/// then stop with an error naming this rank.
fn train_distributed(args: &TrainArgs, device: &Device) -> Result<(), TrainError> {
    let dist = distributed::Distributed::init()?;
    let quiet;
    let args = if dist.rank() == 0 {
        args
    } else {
        quiet = TrainArgs { no_progress: true, ..args.clone() };
        &quiet
    };
    let result = if args.model.is_language_model() {
        language::train(args, device, Some(&dist))
    } else {
        image::train(args, device, Some(&dist))
    };
    // Rank 0 writes the memory snapshot; the others only stop recording.
    let result = if dist.rank() == 0 {
        write_snapshot(args, device, result)
    } else {
        allocator(device).record_memory_history(None);
        result
    };
    if result.is_err() {
        // Let the other ranks print their report before mpirun ends the job on this exit.
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    result
}

/// Runs training as configured; prints progress to stdout/stderr.
pub fn train(args: &TrainArgs) -> Result<(), TrainError> {
    check_own_data(args)?;
    let device = Device::parse(&args.device)?;
    if matches!(device, Device::Meta) {
        return Err(TrainError::MetaDevice);
    }
    let resolved = resolve_batch_size(args)?;
    let args = resolved.as_ref().unwrap_or(args);
    check("batch-size", args.batch_size >= 1, args.batch_size, "must be at least 1")?;
    check("accum-steps", args.accum_steps >= 1, args.accum_steps, "must be at least 1")?;
    check("hidden", args.hidden() >= 1, args.hidden(), "must be at least 1")?;
    check("layers", (1..=MAX_LAYERS).contains(&args.layers()), args.layers(), "must be between 1 and 10000")?;
    check("dropout", (0.0..1.0).contains(&args.shape.dropout), args.shape.dropout, "must be in [0, 1)")?;
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
    check("seq", args.shape.seq >= 1, args.shape.seq, "must be at least 1")?;
    check("d-model", args.shape.d_model >= 1, args.shape.d_model, "must be at least 1")?;
    if let Some(e) = args.epochs {
        check("epochs", e >= 1, e, "must be at least 1")?;
    }
    let alloc = allocator(&device);
    match &args.alloc_conf {
        Some(spec) => alloc.set_alloc_conf(spec)?,
        // A bad FERRITE_ALLOC_CONF is reported now, not as the failure of the first allocation.
        None => {
            ferrite_memory::env_alloc_config()?;
        }
    }
    if let Some(path) = &args.snapshot {
        // Refused now rather than after the run it was meant to record.
        if path.is_dir() {
            return Err(ferrite_io::IoError::NotAFile { path: path.clone(), found: "directory" }.into());
        }
        alloc.record_memory_history(Some(SNAPSHOT_MAX_ENTRIES));
    }
    if args.distributed {
        return train_distributed(args, &device);
    }
    if data_parallel::requested(args) {
        return data_parallel::train(args, &device);
    }
    let result = if args.model.is_language_model() {
        language::train(args, &device, None)
    } else {
        image::train(args, &device, None)
    };
    write_snapshot(args, &device, result)
}

/// With `--snapshot`: writes the allocator's history and segments after the run, also after a
/// failed one (the snapshot of an out-of-memory run is the one wanted); returns the run's result.
fn write_snapshot(args: &TrainArgs, device: &Device, result: Result<(), TrainError>) -> Result<(), TrainError> {
    let alloc = allocator(device);
    if let Some(path) = &args.snapshot {
        // Written after a failure too: the snapshot of an out-of-memory run is the one wanted.
        let written = ferrite_io::write_torch_snapshot(path, &alloc.snapshot());
        alloc.record_memory_history(None);
        match (&result, written) {
            (_, Ok(())) => eprintln!(
                "wrote memory snapshot {} (ferrite memory replay|plot, or pytorch.org/memory_viz)",
                path.display()
            ),
            (Ok(()), Err(e)) => return Err(e.into()),
            (Err(_), Err(e)) => eprintln!("could not write memory snapshot {}: {e}", path.display()),
        }
    }
    result
}

/// History entries `--snapshot` keeps (the newest; PyTorch's docs suggest 100,000).
const SNAPSHOT_MAX_ENTRIES: usize = 100_000;
