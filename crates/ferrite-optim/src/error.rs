//! The one error type of ferrite-optim. Texts follow PyTorch's where PyTorch users will search
//! for them (GradScaler's state machine, hyperparameter validation), and say what to do next.

use ferrite_tensor::TensorError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum OptimError {
    /// A tensor op failed (shape, dtype, device, out of memory …).
    #[error(transparent)]
    Tensor(#[from] TensorError),

    /// A hyperparameter outside its valid range (PyTorch: `Invalid learning rate: -1`).
    #[error("Invalid {name}: {value} (expected {expected})")]
    InvalidHyperparameter { name: &'static str, value: f64, expected: &'static str },

    /// A combination of settings that cannot work together.
    #[error("{0}")]
    InvalidConfig(String),

    /// An optimizer (or a new parameter group) with no parameters.
    #[error("optimizer got an empty parameter list; pass at least one tensor to optimize")]
    EmptyParameterList,

    /// A parameter that is not a leaf of the autograd graph.
    #[error(
        "can't optimize a non-leaf tensor (parameter {index} of group {group} was computed by {grad_fn}); optimize the leaf it was computed from, or use detach().requires_grad_(true) to make a new leaf"
    )]
    NonLeafParameter { group: usize, index: usize, grad_fn: String },

    /// The same tensor listed twice (in one group or in two).
    #[error(
        "some parameters appear more than once (parameter {index} of group {group} is already in group {first_group}); each tensor may be optimized once (tied weights are listed once)"
    )]
    DuplicateParameter { group: usize, index: usize, first_group: usize },

    /// Parameter names that do not match the parameters.
    #[error("parameter group {group} has {names} names for {params} parameters; give one name per parameter")]
    ParamNamesLength { group: usize, names: usize, params: usize },

    /// A parameter-group index out of range.
    #[error("parameter group {group} does not exist (the optimizer has {count} groups)")]
    NoSuchGroup { group: usize, count: usize },

    /// An optimizer state that does not fit this optimizer's parameters.
    #[error("cannot load optimizer state: {0}")]
    StateDict(String),

    /// Gradient clipping found an infinite or NaN total norm with `error_if_nonfinite`.
    #[error(
        "The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it cannot be clipped. To disable this error and scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=False`"
    )]
    NonFiniteNorm { norm_type: f64 },

    /// A GradScaler call out of order (PyTorch's texts), or on unsupported gradients.
    #[error("{0}")]
    GradScaler(String),

    /// A learning-rate schedule that cannot be built or resumed.
    #[error("{0}")]
    Scheduler(String),

    /// A schedule with a fixed length (OneCycleLR) stepped past its end; nothing was changed.
    #[error(
        "Tried to step {steps} times. The specified number of total steps is {total_steps}; build the schedule with total_steps (or epochs × steps_per_epoch) covering every optimizer step of the run"
    )]
    ScheduleFinished { steps: i64, total_steps: i64 },
}

pub type Result<T, E = OptimError> = std::result::Result<T, E>;

/// Shorthand for hyperparameter range errors.
pub(crate) fn bad_hyper(name: &'static str, value: f64, expected: &'static str) -> OptimError {
    OptimError::InvalidHyperparameter { name, value, expected }
}

/// The first of `checks` (PyTorch's name for the value, the value) that is not a number >= 0
/// (NaN included) as [`bad_hyper`]'s error, in the order given (PyTorch's order of checks).
pub(crate) fn non_negative(checks: &[(&'static str, f64)]) -> Result<()> {
    match checks.iter().find(|(_, v)| !(*v >= 0.0)) {
        Some(&(name, value)) => Err(bad_hyper(name, value, "a number >= 0")),
        None => Ok(()),
    }
}
