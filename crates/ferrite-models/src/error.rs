//! The one error type of the models crate: a configuration that cannot describe a model, or a
//! layer that could not be built (its own error, with the out-of-memory report when a device ran
//! out).
use thiserror::Error;

/// Every failure building or configuring a model; each says what to change.
#[derive(Debug, Error)]
pub enum ModelError {
    /// A `config.json` (or another model description) that cannot be read or lacks what the
    /// model needs; `path` names the file, `problem` the key and the value.
    #[error("{path}: {problem}")]
    Config { path: String, problem: String },
    /// A number in a model description beyond what ferrite builds (see `limits.rs`): `key`
    /// names it (or the keys a parameter count comes from), `figure` is what was asked for.
    #[error(
        "{path}: `{key}` asks for {figure}, beyond the limit of {limit}; no real model comes near it — check the number"
    )]
    ConfigLimit { path: String, key: String, figure: String, limit: String },
    /// A Hugging Face model folder that is not complete or not consistent (no `config.json`, no
    /// weights, an index naming a missing shard); `path` names the file or folder.
    #[error("{path}: {problem}")]
    HfFolder { path: String, problem: String },
    /// A weight file that cannot be read or written (truncated, corrupt, unsupported), named.
    #[error("{path}: {source}")]
    WeightFile {
        path: String,
        #[source]
        source: Box<ferrite_io::IoError>,
    },
    /// A model setting that cannot work (a sequence longer than the learned positions, heads that
    /// do not divide the width).
    #[error("invalid {what}: {reason}")]
    InvalidSetting { what: String, reason: String },
    /// A PEFT adapter folder that cannot be read or does not fit the base model (targets or
    /// shapes of another model); `path` names the file or folder.
    #[error("LoRA adapter {path}: {problem}")]
    LoraAdapter { path: String, problem: String },
    /// A PEFT adapter option ferrite does not implement, named with its value and what to do.
    #[error("LoRA adapter {path}: ferrite does not implement PEFT's `{option}` = {value}; {remedy}")]
    LoraUnsupported { path: String, option: String, value: String, remedy: String },
    #[error(transparent)]
    Nn(#[from] ferrite_nn::NnError),
    #[error(transparent)]
    Tensor(#[from] ferrite_tensor::TensorError),
    #[error(transparent)]
    Memory(#[from] ferrite_memory::MemoryError),
}

impl ModelError {
    /// The out-of-memory report inside this error, if building the model ran a device out.
    pub fn oom_report(&self) -> Option<&ferrite_memory::OutOfMemoryReport> {
        match self {
            ModelError::Nn(e) => e.oom_report(),
            ModelError::Tensor(e) => e.oom_report(),
            ModelError::Memory(e) => e.oom_report(),
            _ => None,
        }
    }
}
