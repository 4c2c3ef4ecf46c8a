//! The one error type of the tensor layer. Every variant names the op and carries the shapes,
//! dtypes or devices involved as values (never pre-formatted into prose), because "shape
//! mismatch" alone is useless at 2 a.m. and a caller that recovers from an error should match on
//! numbers, not parse sentences. Messages are built from the fields when displayed.
//!
//! Which variant to use in a new op:
//! - two shapes that must be equal: [`TensorError::ShapeMismatch`]; broadcast together:
//!   [`TensorError::BroadcastMismatch`]; one expanded to another: [`TensorError::ExpandMismatch`];
//! - one argument whose shape is wrong on its own (rank, trailing dims, a size):
//!   [`TensorError::InvalidShape`] with an [`ExpectedShape`];
//! - a window (kernel) larger than its padded input: [`TensorError::InputTooSmall`]; padding
//!   larger than half the window: [`TensorError::PaddingTooLarge`];
//! - operands of different dtypes: [`TensorError::DTypeMismatch`]; an argument of a dtype the op
//!   does not take: [`TensorError::InvalidDType`] (or [`TensorError::UnsupportedDType`] when the
//!   op has no kernel for it);
//! - [`TensorError::InvalidArgument`] only for arguments that are not shapes, dtypes or devices
//!   (a probability outside [0, 1], a zero step).

mod expected_shape;
mod shape_messages;

use ferrite_memory::{Device, MemoryError};
use thiserror::Error;

use crate::DType;

pub use expected_shape::ExpectedShape;

#[derive(Debug, Error, Clone)]
pub enum TensorError {
    /// Two shapes that the op needs to be equal (it does not broadcast them).
    #[error(
        "{op}: shape mismatch: expected equal shapes, got {lhs:?} and {rhs:?}; the op does not broadcast, so reshape or expand one of them"
    )]
    ShapeMismatch { op: &'static str, lhs: Vec<usize>, rhs: Vec<usize> },
    /// Two shapes that do not broadcast together (NumPy/PyTorch rules).
    #[error("{op}: {}", shape_messages::broadcast(.lhs, .rhs))]
    BroadcastMismatch { op: &'static str, lhs: Vec<usize>, rhs: Vec<usize> },
    /// `shape` cannot be expanded (broadcast one way) to `target`: expand, an in-place op's
    /// operand against its output, a mask against its tensor, a gradient summed to a shape.
    #[error("{op}: {}", shape_messages::expand(.shape, .target))]
    ExpandMismatch { op: &'static str, shape: Vec<usize>, target: Vec<usize> },
    /// Matrix operands whose inner dimensions differ (`lhs [.., m, k]`, `rhs [.., k2, n]`).
    #[error("{op}: {}", shape_messages::matmul(.lhs, .rhs))]
    MatmulShapeMismatch { op: &'static str, lhs: Vec<usize>, rhs: Vec<usize> },
    /// Tensor `index` of a list disagrees with tensor 0: `cat` along `dim` (`Some`), or `stack`
    /// (`None`, every shape equal).
    #[error("{op}: {}", shape_messages::cat(*.dim, .first, *.index, .shape))]
    CatShapeMismatch { op: &'static str, dim: Option<usize>, first: Vec<usize>, index: usize, shape: Vec<usize> },
    /// One argument's shape is wrong on its own (rank, trailing dims, a size).
    #[error("{op}: {arg} has shape {shape:?}, expected {expected}")]
    InvalidShape { op: &'static str, arg: &'static str, shape: Vec<usize>, expected: ExpectedShape },
    /// A convolution- or pooling-style window larger than its (padded) input.
    #[error(
        "{op}: input size {input:?} (per spatial dimension, after padding) is smaller than the kernel size {kernel:?}; use a smaller kernel, more padding or a larger input"
    )]
    InputTooSmall { op: &'static str, input: Vec<usize>, kernel: Vec<usize> },
    /// A reshape/view spec (sizes, at most one `-1`) that cannot describe `numel` elements.
    #[error("{op}: {}", shape_messages::reshape(.spec, *.numel))]
    InvalidReshape { op: &'static str, spec: Vec<i64>, numel: usize },
    /// A view whose shape the input's strides cannot express without a copy.
    #[error(
        "{op}: view size {shape:?} is not compatible with input tensor's size {input:?} and stride {strides:?} (at least one dimension spans across two contiguous subspaces); use reshape(...) instead"
    )]
    NotViewable { op: &'static str, shape: Vec<usize>, input: Vec<usize>, strides: Vec<usize> },
    /// An explicit layout (`as_strided`) that does not fit its storage.
    #[error("{op}: {}", shape_messages::strides(.shape, .strides, *.offset, *.storage_elems))]
    InvalidStrides { op: &'static str, shape: Vec<usize>, strides: Vec<usize>, offset: usize, storage_elems: usize },
    /// An operand that must be contiguous and is not.
    #[error(
        "{op}: operands must be contiguous (a tensor of shape {shape:?} has strides {strides:?}); call .contiguous() first"
    )]
    NotContiguous { op: &'static str, shape: Vec<usize>, strides: Vec<usize> },
    /// A written-to tensor in which several elements share one memory location.
    #[error(
        "{op}: unsupported operation: more than one element of the written-to tensor (shape {shape:?}, strides {strides:?}) refers to a single memory location; call .contiguous() before the in-place operation"
    )]
    OverlappingWrite { op: &'static str, shape: Vec<usize>, strides: Vec<usize> },
    /// A shape whose element or byte count does not fit in `usize`.
    #[error("{op}: shape {shape:?} has more elements or bytes than this machine can address; use a smaller shape")]
    ShapeTooLarge { op: &'static str, shape: Vec<usize> },
    /// A reduction without identity (max, argmax …) over an empty dimension.
    #[error(
        "{op}: cannot reduce over dimension {dim} of size 0 (shape {shape:?}): the reduction has no identity; reduce over a non-empty dimension"
    )]
    EmptyReduction { op: &'static str, dim: usize, shape: Vec<usize> },
    /// A dimension order that is not a permutation of `0..rank`.
    #[error("{op}: {}", shape_messages::permutation(.dims, *.rank))]
    InvalidPermutation { op: &'static str, dims: Vec<usize>, rank: usize },
    /// Elements `start, start + step, …` (`len` of them) of dimension `dim` leave its `size`.
    #[error("{op}: {}", shape_messages::range(*.dim, *.start, *.len, *.step, *.size))]
    RangeOutOfBounds { op: &'static str, dim: usize, start: usize, len: usize, step: usize, size: usize },
    /// A dimension index out of range for the tensor's rank.
    #[error("{op}: dimension {dim} is out of range for a tensor of rank {rank} (expected to be in range [{}, {}])", -(*rank as i64).max(1), (*rank as i64).max(1) - 1)]
    DimOutOfRange { op: &'static str, dim: i64, rank: usize },
    /// An index (into a dimension or a tensor) out of range.
    #[error("{op}: index {index} is out of bounds for dimension {dim} with size {size}")]
    IndexOutOfRange { op: &'static str, index: i64, dim: usize, size: usize },
    /// Operands whose dtypes the op needs to be equal (`lhs` is the first operand, or the
    /// tensor's own dtype; `rhs` the other, or the one requested).
    #[error("{op}: dtype mismatch: expected equal dtypes, got {lhs} and {rhs}; convert one with to_dtype")]
    DTypeMismatch { op: &'static str, lhs: DType, rhs: DType },
    /// An argument of a dtype the op does not take (e.g. float indices).
    #[error("{op}: {arg} must have dtype {}, got {dtype}", dtype_list(.expected))]
    InvalidDType { op: &'static str, arg: &'static str, dtype: DType, expected: &'static [DType] },
    /// An op that does not support a dtype at all.
    #[error("{op}: not implemented for dtype {dtype}")]
    UnsupportedDType { op: &'static str, dtype: DType },
    /// Operands on different devices (boxed: a simulated device carries its GPU profile, and
    /// two of them inline would double the size of every `Result` in the crate).
    #[error(
        "{op}: expected all tensors to be on the same device, but found at least two devices, {lhs} and {rhs}; move one with to_device"
    )]
    DeviceMismatch { op: &'static str, lhs: Box<Device>, rhs: Box<Device> },
    /// Data was requested from a `meta` tensor, which has none.
    #[error(
        "{op}: tensor on device meta has no data (meta tensors carry shapes only); move real data with to_device or run on cpu/sim"
    )]
    MetaHasNoData { op: &'static str },
    /// A tensor whose storage was released (a ZeRO-3 / FSDP parameter outside its unit's gather).
    #[error(
        "{op}: the tensor's storage was released (a fully sharded parameter used outside its unit's gather); gather the unit first, or mark the layer that uses it with ferrite_nn::mark_layer"
    )]
    StorageReleased { op: &'static str },
    /// `refill_storage_from` with a source that cannot hand its bytes over.
    #[error("refill_storage_from: {detail}")]
    StorageRefill { detail: String },
    /// A host buffer whose length does not match the requested shape.
    #[error("{op}: {len} elements cannot fill shape {shape:?} ({numel} elements)")]
    DataLength { op: &'static str, len: usize, shape: Vec<usize>, numel: usize },
    /// A byte buffer whose length does not match the tensor it is read into or written from.
    #[error("{op}: a buffer of {len} bytes given for a tensor of {nbytes} bytes; pass exactly {nbytes} bytes")]
    ByteLength { op: &'static str, len: usize, nbytes: usize },
    /// Any invalid argument that is not a shape, dtype or device (a probability outside [0, 1],
    /// a zero step, …).
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
    /// A failure of the CUDA runtime (driver, NVRTC, cuBLAS or the host emulator); `detail` says
    /// what to do.
    #[error("{op} on {device}: {detail}")]
    Cuda { op: &'static str, device: String, detail: String },

    // ------------------------------------------------------------------ pooling (normpool)
    /// A pooling window's padding larger than half its kernel (PyTorch's limit: a window may
    /// never lie entirely in the padding). Sizes are per spatial dimension.
    #[error(
        "{op}: pad should be at most half of kernel size, but got padding {padding:?} for kernel size {kernel:?}; use padding <= kernel_size / 2"
    )]
    PaddingTooLarge { op: &'static str, padding: Vec<usize>, kernel: Vec<usize> },
}

impl TensorError {
    /// The allocator's out-of-memory report, if this error is an OOM.
    pub fn oom_report(&self) -> Option<&ferrite_memory::OutOfMemoryReport> {
        match self {
            TensorError::Memory(m) => m.oom_report(),
            _ => None,
        }
    }

    pub(crate) fn invalid(op: &'static str, detail: impl Into<String>) -> TensorError {
        TensorError::InvalidArgument { op, detail: detail.into() }
    }
}

pub type Result<T, E = TensorError> = std::result::Result<T, E>;

fn dtype_list(d: &[DType]) -> String {
    match d {
        [] => String::from("(none)"),
        [one] => one.to_string(),
        [init @ .., last] => {
            format!("{} or {last}", init.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_built_from_the_fields() {
        let e = TensorError::ShapeMismatch { op: "mse_loss", lhs: vec![2, 3], rhs: vec![3, 2] };
        assert_eq!(
            e.to_string(),
            "mse_loss: shape mismatch: expected equal shapes, got [2, 3] and [3, 2]; the op does not broadcast, so reshape or expand one of them"
        );
        let e = TensorError::InvalidShape {
            op: "linear",
            arg: "weight",
            shape: vec![4],
            expected: ExpectedShape::Named(&["out_features", "in_features"]),
        };
        assert_eq!(e.to_string(), "linear: weight has shape [4], expected a 2-D tensor [out_features, in_features]");
        let e = TensorError::InputTooSmall { op: "conv2d", input: vec![2, 2], kernel: vec![3, 3] };
        assert!(e.to_string().starts_with("conv2d: input size [2, 2] (per spatial dimension, after padding) is smaller than the kernel size [3, 3]"), "{e}");
        let e = TensorError::DTypeMismatch { op: "matmul", lhs: DType::F32, rhs: DType::F64 };
        assert!(e.to_string().contains("got float32 and float64"), "{e}");
        let e = TensorError::InvalidDType {
            op: "gather",
            arg: "index",
            dtype: DType::F32,
            expected: &[DType::I64, DType::I32, DType::U8],
        };
        assert_eq!(e.to_string(), "gather: index must have dtype int64, int32 or uint8, got float32");
        let e = TensorError::DeviceMismatch { op: "add", lhs: Box::new(Device::Cpu), rhs: Box::new(Device::Meta) };
        assert!(e.to_string().contains("two devices, cpu and meta"), "{e}");
        let e = TensorError::ByteLength { op: "write", len: 3, nbytes: 8 };
        assert!(e.to_string().contains("3 bytes given for a tensor of 8 bytes"), "{e}");
    }

    #[test]
    fn errors_stay_small_enough_to_return_by_value() {
        // clippy's result_large_err threshold: a Result<Tensor> must not grow past it.
        assert!(std::mem::size_of::<TensorError>() <= 128, "{}", std::mem::size_of::<TensorError>());
    }
}
