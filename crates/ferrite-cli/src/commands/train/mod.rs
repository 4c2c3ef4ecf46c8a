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
mod hf;
mod hf_t5;
mod hf_trainer;
mod image;
mod image_data;
mod language;
mod plan_context;
mod run;
mod settings;

use std::path::PathBuf;

use ferrite_memory::Device;
use ferrite_parallel::distributed::CommDtype;
pub use ferrite_train::{During, Hint, TrainError};

pub use super::model_args::{Amp, ModelArgs, ModelKind};
pub use run::{run, train};

use crate::observe_args::ObserveArgs;

#[derive(clap::Args, Debug, Clone)]
pub struct TrainArgs {
    /// Model family: `mlp` and `cnn` classify images, `lstm` and `transformer` are
    /// character-level language models.
    #[arg(long, value_enum, default_value = "mlp")]
    pub model: ModelKind,
    /// Fine-tune a Hugging Face model folder instead (`config.json`, weights, `tokenizer.json`;
    /// GPT-2, Llama, Mistral, Qwen2) on --data (text, JSON Lines with a `text` field, or a folder
    /// of them), in blocks of --seq tokens; --out is the folder written back. A T5 folder trains
    /// on JSON Lines of input/target pairs (--input-field, --target-field), each cut to --seq.
    #[arg(long, conflicts_with = "dataset")]
    pub hf_model: Option<PathBuf>,
    /// With --hf-model: stop after this many optimizer steps, and the length of the learning-rate
    /// schedule (also when --epochs stops the run earlier; the epochs needed are derived when
    /// --epochs is not given).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Learning-rate schedule of --hf-model training: `constant`, or `cosine` decay to 0 after
    /// --warmup-steps of linear warm-up.
    #[arg(long, value_enum, default_value = "constant")]
    pub lr_schedule: LrSchedule,
    /// With a T5 --hf-model: the JSON Lines field of --data holding each example's input text.
    #[arg(long, default_value = "input")]
    pub input_field: String,
    /// With a T5 --hf-model: the JSON Lines field of --data holding each example's target text.
    #[arg(long, default_value = "target")]
    pub target_field: String,
    /// Linear warm-up steps before the cosine schedule.
    #[arg(long, default_value_t = 0)]
    pub warmup_steps: usize,
    /// With --hf-model: weights above this size are written as shards with an index, as
    /// transformers' `save_pretrained(max_shard_size=...)` (5GB, 500MB, 2GiB, or bytes).
    #[arg(long, default_value = "5GB")]
    pub max_shard_size: String,
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
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    pub device: Device,
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
    /// With --distributed: ZeRO stage 1 (AdamW's state sharded over the ranks), 2 (its
    /// gradients too, reduce-scattered) or 3 (the parameters too: each block gathered for its
    /// forward and backward, then freed; PyTorch FSDP's FULL_SHARD), instead of every rank
    /// holding a full copy (DDP). Same result as DDP; less memory per rank.
    #[arg(long, value_name = "STAGE")]
    pub zero: Option<u32>,
    /// With --zero and --amp bf16: `bf16` keeps the model's parameters (and so its gradients)
    /// in bf16 and sends bf16 over MPI (half the bytes; reduce-scatters sum in bf16), while each
    /// rank's optimizer updates f32 master copies of its shard (DeepSpeed's bf16 layout: 2 + 2
    /// bytes per parameter on every rank, 12 / ranks for the masters and AdamW's moments).
    /// `f32` (the default): f32 parameters and an exact f32 exchange.
    #[arg(long, value_name = "DTYPE", value_parser = parse_comm_dtype)]
    pub zero_comm_dtype: Option<CommDtype>,
    #[command(flatten)]
    pub observe: ObserveArgs,
    /// LoRA (--lora-rank, --lora-alpha, --lora-dropout, --lora-targets, --lora-rslora,
    /// --base-dtype, --merge-lora): see `commands/lora_args.rs`.
    #[command(flatten)]
    pub lora: crate::commands::lora_args::TrainLoraArgs,
    /// Train with DataParallel on these devices of the `--device` kind, renumbered from 0 like
    /// CUDA_VISIBLE_DEVICES (`--device sim:a100-40gb --devices 0,1,2,3`: four simulated A100s).
    /// Default: FERRITE_VISIBLE_DEVICES, else one device.
    #[arg(long)]
    pub devices: Option<String>,
    /// Train with DataParallel on every visible device (see --devices).
    #[arg(long)]
    pub data_parallel: bool,
}

/// `--lr-schedule`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LrSchedule {
    Constant,
    Cosine,
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

/// `--device`: parsed once, here, into the device every part of the run uses (an unknown device
/// is the parser's error, with the device's own message saying what exists).
pub(crate) fn parse_device(s: &str) -> Result<Device, String> {
    Device::parse(s).map_err(|e| e.to_string())
}

impl TrainArgs {
    /// The configuration `ferrite` with no arguments runs.
    pub fn default_demo() -> Self {
        TrainArgs {
            model: ModelKind::Mlp,
            hf_model: None,
            steps: None,
            lr_schedule: LrSchedule::Constant,
            input_field: "input".into(),
            target_field: "target".into(),
            warmup_steps: 0,
            max_shard_size: "5GB".into(),
            dataset: None,
            data: None,
            target: None,
            image_size: None,
            val_split: 0.1,
            augment: false,
            skip_bad_files: false,
            device: Device::Cpu,
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
            zero: None,
            zero_comm_dtype: None,
            observe: ObserveArgs::default(),
            lora: Default::default(),
            devices: None,
            data_parallel: false,
        }
    }

    /// `--hidden`, or the model's default width.
    pub(crate) fn hidden(&self) -> usize {
        self.shape.hidden(self.model)
    }

    /// `--layers`, or the model's default depth.
    pub(crate) fn layers(&self) -> usize {
        self.shape.layers(self.model)
    }
}

/// `--zero-comm-dtype`: `bf16` or `f32`.
pub(crate) fn parse_comm_dtype(s: &str) -> Result<CommDtype, String> {
    CommDtype::parse(&s.to_ascii_lowercase())
        .ok_or_else(|| format!("'{s}' is not a communication dtype: use bf16 (half the bytes) or f32 (exact)"))
}

/// The dtype the built-in models are built in: bf16 under `--zero-comm-dtype bf16` (no f32 copy
/// exists first, as the planner builds them), else f32.
pub(crate) fn params_dtype(args: &TrainArgs) -> ferrite_tensor::DType {
    match args.zero_comm_dtype {
        Some(CommDtype::Bf16) => ferrite_tensor::DType::BF16,
        _ => ferrite_tensor::DType::F32,
    }
}

/// `--zero-comm-dtype bf16`: the model's floating-point parameters and buffers in bf16 (as
/// DeepSpeed's engine casts the module), before ZeRO cuts its f32 master shards from them: the
/// buffers, and any parameter a layer made outside [`params_dtype`]'s scope. The Hugging Face
/// paths read the weights in bf16 instead (no f32 copy first).
pub(crate) fn zero_params_dtype(args: &TrainArgs, model: &mut dyn ferrite_nn::Module) -> Result<(), TrainError> {
    if args.zero_comm_dtype == Some(CommDtype::Bf16) {
        model.to_dtype(ferrite_tensor::DType::BF16).map_err(ferrite_train::TrainError::from)?;
    }
    Ok(())
}

/// The dtype the Hugging Face paths read the weights in: `--base-dtype`, else bf16 under
/// `--zero-comm-dtype bf16`, else f32.
pub(crate) fn hf_weights_dtype(args: &TrainArgs) -> ferrite_tensor::DType {
    match (args.lora.lora.base_dtype, args.zero_comm_dtype) {
        (Some(d), _) => d,
        (None, Some(CommDtype::Bf16)) => ferrite_tensor::DType::BF16,
        _ => ferrite_tensor::DType::F32,
    }
}
