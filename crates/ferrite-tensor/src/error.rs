//! The one error type of the tensor layer. Every variant names the op and carries the shapes,
//! dtypes or devices involved, because "shape mismatch" alone is useless at 2 a.m.

use ferrite_memory::MemoryError;
use thiserror::Error;

use crate::DType;

#[derive(Debug, Error, Clone)]
pub enum TensorError {
    /// Shapes that the op cannot combine (broadcasting, matmul inner dims, cat, view …).
    #[error("{op}: shape mismatch: {detail}")]
    ShapeMismatch { op: &'static str, detail: String },
    /// A dimension index out of range for the tensor's rank.
    #[error("{op}: dimension {dim} is out of range for a tensor of rank {rank} (expected to be in range [{}, {}])", -(*rank as i64).max(1), (*rank as i64).max(1) - 1)]
    DimOutOfRange { op: &'static str, dim: i64, rank: usize },
    /// An index (into a dimension or a tensor) out of range.
    #[error("{op}: index {index} is out of bounds for dimension {dim} with size {size}")]
    IndexOutOfRange { op: &'static str, index: i64, dim: usize, size: usize },
    /// Operands whose dtypes the op does not accept together.
    #[error("{op}: dtype mismatch: {detail}")]
    DTypeMismatch { op: &'static str, detail: String },
    /// An op that does not support a dtype at all.
    #[error("{op}: not implemented for dtype {dtype}")]
    UnsupportedDType { op: &'static str, dtype: DType },
    /// Operands on different devices.
    #[error("{op}: expected all tensors to be on the same device, but found at least two devices, {a} and {b}")]
    DeviceMismatch { op: &'static str, a: String, b: String },
    /// Data was requested from a `meta` tensor, which has none.
    #[error(
        "{op}: tensor on device meta has no data (meta tensors carry shapes only); move real data with to_device or run on cpu/sim"
    )]
    MetaHasNoData { op: &'static str },
    /// A host buffer whose length does not match the requested shape.
    #[error("{op}: {len} elements cannot fill shape {shape:?} ({numel} elements)")]
    DataLength { op: &'static str, len: usize, shape: Vec<usize>, numel: usize },
    /// Any invalid argument (negative size, bad step, …).
    #[error("{op}: {detail}")]
    InvalidArgument { op: &'static str, detail: String },
    /// A tensor saved for backward was modified in place afterwards.
    #[error(
        "one of the variables needed for gradient computation has been modified by an inplace operation: [{dtype}{shape:?}], which is output {output_nr} of {op}, is at version {current}; expected version {saved} instead. Hint: compute the in-place op on a clone, or call it after backward()"
    )]
    ModifiedByInplace { op: String, dtype: DType, shape: Vec<usize>, output_nr: usize, current: u64, saved: u64 },
    /// Backward through a graph whose saved tensors were already released.
    #[error(
        "trying to backward through the graph a second time (or directly access saved tensors after they have already been freed) at {op}. Saved intermediate values of the graph are freed when you call backward(); pass retain_graph = true if you need to backward through the graph a second time"
    )]
    GraphReleased { op: String },
    /// A backward request that cannot be satisfied.
    #[error("backward: {detail}")]
    Autograd { detail: String },
    /// In-place operation on a leaf that requires grad, outside no_grad.
    #[error(
        "{op}: a leaf tensor that requires grad is being used in an in-place operation; wrap parameter updates in no_grad()"
    )]
    InplaceOnLeaf { op: &'static str },
    /// A GPU reported an error: a shader that did not compile, a validation failure, a device
    /// lost mid-run. `detail` carries the driver's words.
    #[error("{op} on {device}: {detail}")]
    Gpu { op: &'static str, device: String, detail: String },
    /// A tensor too large for one GPU storage binding (the adapter's
    /// `max_storage_buffer_binding_size`).
    #[error(
        "{op} on {device}: an operand spans {bytes} bytes, more than this GPU can bind at once ({max} bytes, max_storage_buffer_binding_size); split the tensor (e.g. a smaller batch) or use a GPU with larger bindings"
    )]
    BindingTooLarge { op: &'static str, device: String, bytes: u64, max: u64 },
    /// An allocation failed; carries the allocator's diagnosis.
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

impl TensorError {
    /// The allocator's out-of-memory report, if this error is an OOM.
    pub fn oom_report(&self) -> Option<&ferrite_memory::OutOfMemoryReport> {
        match self {
            TensorError::Memory(m) => m.oom_report(),
            _ => None,
        }
    }

    pub(crate) fn shape(op: &'static str, detail: impl Into<String>) -> TensorError {
        TensorError::ShapeMismatch { op, detail: detail.into() }
    }

    pub(crate) fn invalid(op: &'static str, detail: impl Into<String>) -> TensorError {
        TensorError::InvalidArgument { op, detail: detail.into() }
    }
}

pub type Result<T, E = TensorError> = std::result::Result<T, E>;
