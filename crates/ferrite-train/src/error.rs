//! The one error type of the trainer, and the two helpers that add what the trainer knows to an
//! error from below: the phase of training it happened in ([`During`]) and an explanation shown
//! only after the kind of error it explains ([`Hint`]).
//!
//! Why the phase: "CUDA out of memory" means one thing while building the model (the model does
//! not fit at all) and another in the forward pass (the batch is too large); the error says which.
use ferrite_tensor::Device;

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
    #[error(
        "{what} has {chars} characters, fewer than the {needed} that {why} need; use a longer text or a smaller --seq/--batch-size"
    )]
    TextTooShort { what: String, chars: usize, needed: usize, why: String },
    /// Early stopping or best-checkpoint keeping tracks a metric the evaluation does not report.
    #[error("the evaluation reports no metric `{metric}` (it reports: {found}); track one of those")]
    MissingMetric { metric: String, found: String },
    /// `checkpoint_activations(true)` for a model with nothing that can recompute its activations.
    #[error(
        "`{model}` does not support activation checkpointing (no part of it implements Module::set_activation_checkpointing): wrap the blocks to recompute in ferrite_nn::Checkpointed, or train without checkpoint_activations"
    )]
    CheckpointingUnsupported { model: &'static str },
    /// DataParallel scatters a batch along dim 0, so it must be made of tensors.
    #[error(
        "DataParallel cannot split a batch of type `{batch_type}`: it scatters batches of tensors ({supported}); collate into tensors (ferrite_data::StackCollate, Tensors(...))"
    )]
    NotScatterable { batch_type: &'static str, supported: &'static str },
    /// Under DataParallel the optimizer must update the owner replicas' tensors.
    #[error(
        "the optimizer holds a tensor of shape {shape:?} on {device} that none of the {devices} DataParallel replicas owns: build it with `Trainer::builder_with(model, |params| ...)`, which hands it the owners' tensors (or use OwnerPolicy::Primary with an optimizer over the model's parameters)"
    )]
    OptimizerNotOnReplicas { shape: Vec<usize>, device: String, devices: usize },
    #[error("{phase} on {device}: {source}{hint}")]
    During { phase: &'static str, device: String, source: Box<TrainError>, hint: String },
    /// A device ran out of memory. `fn run` puts the report here, whichever layer returned it,
    /// once its suggestions are the planner's ranked remedies for this model (or the fixed rules
    /// with the reason the planner could not model the run).
    #[error("{report}")]
    OutOfMemory { report: Box<ferrite_memory::OutOfMemoryReport> },
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
    #[error(transparent)]
    Plan(#[from] ferrite_plan::PlanError),
    #[error(transparent)]
    Model(#[from] ferrite_models::ModelError),
    #[error(transparent)]
    Parallel(Box<ferrite_parallel::ParallelError>),
}

/// DataParallel's and DistributedDataParallel's errors (one enum, boxed: it is large).
impl From<ferrite_parallel::ParallelError> for TrainError {
    fn from(e: ferrite_parallel::ParallelError) -> Self {
        TrainError::Parallel(Box::new(e))
    }
}

impl TrainError {
    pub(crate) fn corrupt(path: &std::path::Path, reason: &str) -> TrainError {
        TrainError::CorruptCheckpoint { entry: path.display().to_string(), reason: reason.to_string() }
    }

    pub(crate) fn corrupt_entry(entry: impl Into<String>, reason: impl Into<String>) -> TrainError {
        TrainError::CorruptCheckpoint { entry: entry.into(), reason: reason.into() }
    }

    /// Whether training stopped because of another MPI rank (it failed, died or hangs), not
    /// because of this rank's own work ([`ferrite_parallel::ParallelError::is_peer_failure`]).
    pub fn is_peer_failure(&self) -> bool {
        match self {
            TrainError::During { source, .. } => source.is_peer_failure(),
            TrainError::Parallel(e) => e.is_peer_failure(),
            _ => false,
        }
    }

    /// Whether this is a device running out of memory (whatever layer reported it).
    pub fn is_out_of_memory(&self) -> bool {
        self.oom_report().is_some()
    }

    /// The out-of-memory report, whatever layer returned it.
    pub fn oom_report(&self) -> Option<&ferrite_memory::OutOfMemoryReport> {
        match self {
            TrainError::During { source, .. } => source.oom_report(),
            TrainError::OutOfMemory { report } => Some(report),
            TrainError::Memory(e) => e.oom_report(),
            TrainError::Tensor(e) => e.oom_report(),
            TrainError::Nn(e) => e.oom_report(),
            TrainError::Optim(ferrite_optim::OptimError::Tensor(e)) => e.oom_report(),
            TrainError::Io(ferrite_io::IoError::Tensor(e)) => e.oom_report(),
            TrainError::Parallel(e) => e.oom_report(),
            TrainError::Model(e) => e.oom_report(),
            TrainError::Plan(e) => e.oom_report(),
            // A loader wraps what collation or staging to the device returned.
            TrainError::Data(e) => oom_in_sources(e),
            _ => None,
        }
    }

    /// This error with its out-of-memory report edited by `edit` (e.g. to attach the planner's
    /// remedies): the report becomes [`TrainError::OutOfMemory`] under the same phase and hint.
    /// Any other error is returned unchanged.
    pub fn map_oom_report(self, edit: impl FnOnce(&mut ferrite_memory::OutOfMemoryReport)) -> TrainError {
        match self {
            TrainError::During { phase, device, source, hint } => {
                TrainError::During { phase, device, source: Box::new(source.map_oom_report(edit)), hint }
            }
            TrainError::OutOfMemory { mut report } => {
                edit(&mut report);
                TrainError::OutOfMemory { report }
            }
            other => match other.oom_report().cloned() {
                Some(mut report) => {
                    edit(&mut report);
                    TrainError::OutOfMemory { report: Box::new(report) }
                }
                None => other,
            },
        }
    }
}

/// The out-of-memory report in `e`'s source chain, if any.
fn oom_in_sources<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a ferrite_memory::OutOfMemoryReport> {
    let mut cur = e.source();
    while let Some(s) = cur {
        let report = s
            .downcast_ref::<ferrite_memory::MemoryError>()
            .and_then(|m| m.oom_report())
            .or_else(|| s.downcast_ref::<ferrite_tensor::TensorError>().and_then(|t| t.oom_report()))
            .or_else(|| s.downcast_ref::<ferrite_nn::NnError>().and_then(|n| n.oom_report()));
        if report.is_some() {
            return report;
        }
        cur = s.source();
    }
    None
}

/// A trainer-level explanation added after an error — only after the kind of error it explains:
/// advice for one failure is false advice for another.
pub enum Hint {
    /// Shown only when the error is a device running out of memory.
    OutOfMemory(String),
}

impl Hint {
    /// The text to show after `error`: the hint if it is about this kind of error, else nothing.
    pub fn for_error(self, error: &TrainError) -> String {
        match self {
            Hint::OutOfMemory(text) if error.is_out_of_memory() => text,
            Hint::OutOfMemory(_) => String::new(),
        }
    }
}

/// Tags an error with the phase of training it happened in.
pub trait During<T> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_tensor::{DType, Tensor};

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
