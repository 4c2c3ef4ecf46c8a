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
    /// A bad input to a recurrent layer or to sequence packing (lengths, layout, state shapes).
    #[error(transparent)]
    Recurrent(#[from] crate::recurrent_error::RecurrentError),
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
