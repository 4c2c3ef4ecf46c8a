//! The one error type of the planner.
use ferrite_memory::format_size;
use thiserror::Error;

/// Every failure the planner can report; each says what to change.
#[derive(Debug, Error)]
pub enum PlanError {
    /// A `--device` that does not name a simulated GPU of the catalogue (or a capacity).
    #[error(
        "unknown GPU `{name}`: plan for one of {known} (`ferrite memory gpus` lists them), or a capacity such as `sim:24GiB`"
    )]
    UnknownGpu { name: String, known: String },
    /// A setting of the step that cannot work (a batch of 0, heads that do not divide the width).
    #[error("invalid {what}: {reason}")]
    InvalidSetting { what: String, reason: String },
    /// A Hugging Face `config.json` that cannot be read or lacks what the model needs.
    #[error("{path}: {problem}")]
    HfConfig { path: String, problem: String },
    /// A batch-size search where not even one sample per step fits.
    #[error(
        "even --batch 1 does not fit on {device}: it needs {} of the {} the allocator may use ({details}). Use a larger GPU, --amp bf16, --checkpoint-activations, or a smaller model (`ferrite plan` without --find-batch-size lists every way ferrite can make it fit)",
        format_size(*needed),
        format_size(*usable)
    )]
    NothingFits { device: String, needed: u64, usable: u64, details: String },
    /// `--measure` on a model too large to run on this machine's memory.
    #[error(
        "--measure would run the step for real on the simulated GPU: it needs about {} of host memory and this machine allows {}; plan without --measure, or measure a smaller batch",
        format_size(*needed),
        format_size(*allowed)
    )]
    TooLargeToMeasure { needed: u64, allowed: u64 },
    /// A model that cannot be configured or built (its own error names the key or layer).
    #[error(transparent)]
    Model(#[from] ferrite_models::ModelError),
    #[error(transparent)]
    Memory(#[from] ferrite_memory::MemoryError),
    #[error(transparent)]
    Tensor(#[from] ferrite_tensor::TensorError),
    #[error(transparent)]
    Nn(#[from] ferrite_nn::NnError),
    #[error(transparent)]
    Optim(#[from] ferrite_optim::OptimError),
}

impl PlanError {
    pub(crate) fn setting(what: impl Into<String>, reason: impl Into<String>) -> PlanError {
        PlanError::InvalidSetting { what: what.into(), reason: reason.into() }
    }

    /// The out-of-memory report inside this error, if a real (`--measure`) step ran out.
    pub fn oom_report(&self) -> Option<&ferrite_memory::OutOfMemoryReport> {
        match self {
            PlanError::Memory(e) => e.oom_report(),
            PlanError::Model(e) => e.oom_report(),
            PlanError::Tensor(e) => e.oom_report(),
            PlanError::Nn(e) => e.oom_report(),
            PlanError::Optim(ferrite_optim::OptimError::Tensor(e)) => e.oom_report(),
            _ => None,
        }
    }
}
