//! The one error type of the nn layer. Tensor errors (shapes, OOM) pass through unchanged so a
//! trainer can still ask for the allocator's OOM diagnosis; what this crate adds are the errors a
//! user meets when building layers and loading checkpoints, worded the way PyTorch users know them.

use std::fmt;

use ferrite_tensor::TensorError;
use thiserror::Error;

#[derive(Debug, Error, Clone)]
pub enum NnError {
    /// Anything a tensor op refused (shapes, dtypes, devices, out of memory).
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// A layer configuration that cannot work (zero heads, p outside [0, 1], …).
    #[error("{layer}: {detail}")]
    InvalidConfig { layer: &'static str, detail: String },
    /// `load_state_dict` refused a state dict; nothing was copied.
    #[error("{0}")]
    LoadStateDict(Box<LoadStateDictError>),
    // ---- normalisation and convolution
    /// A size argument that must be a multiple of another (GroupNorm's `num_channels` of its
    /// `num_groups`; a grouped convolution's channels of its `groups`).
    #[error(
        "{layer}: {arg} ({value}) must be divisible by {divisor_arg} ({divisor}); choose {divisor_arg} among the divisors of {value}, or {arg} as a multiple of {divisor}"
    )]
    NotDivisible { layer: &'static str, arg: &'static str, value: usize, divisor_arg: &'static str, divisor: usize },
    // ---- recurrent layers and sequence packing: a bad input to `RNN`/`GRU`/`LSTM` or to
    // `pack_padded_sequence`, `pad_packed_sequence`, `pack_sequence` and `PackedSequence::new`, as
    // values (the layer, the argument and the numbers), so a data pipeline that produced a bad
    // batch can say which sequence was at fault. Messages follow PyTorch's where it has one, then
    // say what to do.
    /// The input of a layer has the wrong rank or feature size.
    #[error(
        "{layer}: input has shape {shape:?}, expected a 3-D tensor [{layout}, {input_size}] (or 2-D [seq, {input_size}] for one unbatched sequence); the last dimension must be input_size = {input_size}"
    )]
    InputShape { layer: &'static str, shape: Vec<usize>, layout: &'static str, input_size: usize },
    /// A packed input whose data does not hold `input_size` features per row.
    #[error(
        "{layer}: the PackedSequence's data has shape {shape:?}, expected [rows, {input_size}] (input_size = {input_size})"
    )]
    PackedShape { layer: &'static str, shape: Vec<usize>, input_size: usize },
    /// An initial state of the wrong shape.
    #[error(
        "{layer}: {arg} has shape {shape:?}, expected {expected:?} (num_layers * num_directions, batch, hidden_size); pass None to start from zeros"
    )]
    StateShape { layer: &'static str, arg: &'static str, shape: Vec<usize>, expected: Vec<usize> },
    /// A packed input packed from a tensor of the other layout than the layer's.
    #[error(
        "{layer}: the PackedSequence was packed from a {} tensor, but the layer has batch_first = {layer_batch_first}; pack with batch_first = {layer_batch_first} or build the layer with batch_first = {packed_batch_first}",
        if *packed_batch_first { "batch-first ([batch, seq, ..])" } else { "sequence-first ([seq, batch, ..])" }
    )]
    PackedLayout { layer: &'static str, packed_batch_first: bool, layer_batch_first: bool },
    /// A sequence of zero steps (time steps must be > 0 for an RNN).
    #[error(
        "{op}: {what} must have at least one step, but {what} {index} has length 0; drop empty sequences from the batch before packing"
    )]
    EmptySequence { op: &'static str, what: &'static str, index: usize },
    /// Nothing to pack or run.
    #[error("{op}: expected at least one sequence, got none")]
    NoSequences { op: &'static str },
    /// `lengths` has a different count than the batch.
    #[error(
        "{op}: `lengths` has {lengths} entries but the input holds {batch} sequences (input shape {shape:?}); pass one length per sequence"
    )]
    LengthsCount { op: &'static str, lengths: usize, batch: usize, shape: Vec<usize> },
    /// A length longer than the padded input.
    #[error(
        "{op}: sequence {index} has length {length}, but the padded input has only {steps} steps (input shape {shape:?})"
    )]
    LengthTooLong { op: &'static str, index: usize, length: usize, steps: usize, shape: Vec<usize> },
    /// `enforce_sorted` with lengths that are not in decreasing order.
    #[error(
        "{op}: `lengths` array must be sorted in decreasing order when `enforce_sorted` is true, got {lengths:?}; pass enforce_sorted = false to have them sorted (outputs and final states come back in your order)"
    )]
    UnsortedLengths { op: &'static str, lengths: Vec<usize> },
    /// `total_length` shorter than the longest sequence.
    #[error(
        "pad_packed_sequence: expected total_length to be at least the length of the longest sequence in input, but got total_length = {total_length} and max sequence length being {longest}"
    )]
    TotalLengthTooShort { total_length: usize, longest: usize },
    /// A `PackedSequence` built by hand whose batch sizes do not describe its data.
    #[error(
        "PackedSequence: batch_sizes {batch_sizes:?} must be positive, never increase and sum to the data's {rows} rows"
    )]
    InvalidBatchSizes { batch_sizes: Vec<usize>, rows: usize },
    // ---- LoRA (`lora.rs`)
    /// LoRA target patterns that choose no module (PEFT's `target_modules`, ferrite's
    /// `--lora-targets`); `available` lists the adaptable layers' short names.
    #[error(
        "LoRA target modules {unmatched:?}: {detail}; the model's adaptable layers are {available:?} (use those names, e.g. --lora-targets q_proj,v_proj, or all-linear)"
    )]
    LoraTargets { unmatched: Vec<String>, available: Vec<String>, detail: String },
    /// A LoRA target pattern that chose a layer LoRA cannot adapt (a norm, an embedding).
    #[error(
        "LoRA target module {module} is a {type_name}, which LoRA cannot adapt (ferrite adapts linear layers and GPT-2's Conv1D); choose among {available:?}"
    )]
    LoraUnsupportedTarget { module: String, type_name: &'static str, available: Vec<String> },
    /// A LoRA rank of 0, or above a chosen layer's smaller side (`module` empty when checked
    /// before any layer).
    #[error(
        "LoRA rank (--lora-rank, PEFT's `r`) {rank} does not fit{}: it must be at least 1 and at most min(in, out) of every adapted layer; typical ranks are 8 or 16",
        if module.is_empty() { String::new() } else { format!(" {module} ({in_features} -> {out_features})") }
    )]
    LoraRank { module: String, rank: usize, in_features: usize, out_features: usize },
    /// A `PackedSequence` built by hand whose `sorted_indices` is not a permutation of its batch.
    #[error("PackedSequence: sorted_indices {indices:?} is not a permutation of 0..{batch}")]
    InvalidIndices { indices: Vec<usize>, batch: usize },
}

impl NnError {
    /// The allocator's out-of-memory report, if this error is an OOM.
    pub fn oom_report(&self) -> Option<&ferrite_memory::OutOfMemoryReport> {
        match self {
            NnError::Tensor(t) => t.oom_report(),
            _ => None,
        }
    }

    pub(crate) fn config(layer: &'static str, detail: impl Into<String>) -> NnError {
        NnError::InvalidConfig { layer, detail: detail.into() }
    }

    /// Convert into a tensor error (autograd backward functions must return one).
    pub(crate) fn into_tensor_error(self) -> TensorError {
        match self {
            NnError::Tensor(t) => t,
            other => TensorError::Autograd { detail: other.to_string() },
        }
    }
}

impl From<ferrite_memory::MemoryError> for NnError {
    /// Device parsing and allocator errors arrive as tensor errors, so `oom_report()` finds them.
    fn from(e: ferrite_memory::MemoryError) -> Self {
        NnError::Tensor(TensorError::Memory(e))
    }
}

pub type Result<T, E = NnError> = std::result::Result<T, E>;

/// A parameter whose shape in the checkpoint differs from the model's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeMismatch {
    pub key: String,
    pub checkpoint_shape: Vec<usize>,
    pub model_shape: Vec<usize>,
}

/// Why `load_state_dict` failed, worded like PyTorch's `RuntimeError` (missing keys first, then
/// unexpected keys, then size mismatches), plus a hint when the unexpected keys are only a
/// `module.` prefix away from matching.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadStateDictError {
    /// Class name of the module `load_state_dict` was called on (`Linear`, `Sequential`, …).
    pub module: String,
    /// Reported only in strict mode.
    pub missing: Vec<String>,
    /// Reported only in strict mode.
    pub unexpected: Vec<String>,
    /// Always an error, as in PyTorch.
    pub size_mismatches: Vec<SizeMismatch>,
}

fn quoted(keys: &[String]) -> String {
    keys.iter().map(|k| format!("\"{k}\"")).collect::<Vec<_>>().join(", ")
}

fn shape(s: &[usize]) -> String {
    format!("[{}]", s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
}

impl LoadStateDictError {
    /// True when every unexpected key starts with `module.` (a checkpoint written from a
    /// DataParallel / DistributedDataParallel wrapper).
    pub fn looks_like_module_prefix(&self) -> bool {
        !self.unexpected.is_empty() && self.unexpected.iter().all(|k| k.starts_with("module."))
    }
}

impl fmt::Display for LoadStateDictError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error(s) in loading state_dict for {}:", self.module)?;
        if !self.missing.is_empty() {
            write!(f, "\n\tMissing key(s) in state_dict: {}. ", quoted(&self.missing))?;
        }
        if !self.unexpected.is_empty() {
            write!(f, "\n\tUnexpected key(s) in state_dict: {}. ", quoted(&self.unexpected))?;
        }
        for m in &self.size_mismatches {
            write!(
                f,
                "\n\tsize mismatch for {}: copying a param with shape {} from checkpoint, the shape in current model is {}.",
                m.key,
                shape(&m.checkpoint_shape),
                shape(&m.model_shape)
            )?;
        }
        if self.looks_like_module_prefix() {
            write!(
                f,
                "\n\tAll unexpected keys start with \"module.\": the checkpoint was saved from a DataParallel/DistributedDataParallel wrapper. \
                 Load it with `LoadOptions {{ strip_prefix: Some(\"module.\".into()), ..Default::default() }}` \
                 (or call `state_dict.strip_prefix(\"module.\")` first)."
            )?;
        }
        Ok(())
    }
}

/// A tensor op's error raised inside a layer's forward, renamed to the layer (`max_pool2d: …`
/// becomes `MaxPool2d: …`) where it concerns the layer's arguments or input, so the message
/// names what the user built; other errors (out of memory, devices) pass through unchanged.
pub(crate) fn in_layer(layer: &'static str) -> impl Fn(TensorError) -> NnError {
    move |e| {
        NnError::Tensor(match e {
            TensorError::InvalidShape { arg, shape, expected, .. } => {
                TensorError::InvalidShape { op: layer, arg, shape, expected }
            }
            TensorError::InputTooSmall { input, kernel, .. } => TensorError::InputTooSmall { op: layer, input, kernel },
            TensorError::PaddingTooLarge { padding, kernel, .. } => {
                TensorError::PaddingTooLarge { op: layer, padding, kernel }
            }
            TensorError::InvalidArgument { detail, .. } => TensorError::InvalidArgument { op: layer, detail },
            TensorError::DimOutOfRange { dim, rank, .. } => TensorError::DimOutOfRange { op: layer, dim, rank },
            TensorError::UnsupportedDType { dtype, .. } => TensorError::UnsupportedDType { op: layer, dtype },
            other => other,
        })
    }
}
