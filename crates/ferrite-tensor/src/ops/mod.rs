//! Op definitions: shape rule, dtype rule, output allocation, and backward.
//!
//! The seam with kernels (`crate::backend`): an op validates its operands, allocates its output
//! through the device's caching allocator on every device (meta included), and hands the
//! arithmetic to the kernel backend of the output's device (`Tensor::kernels()`: CPU kernels for
//! `cpu` and `sim`, nothing for `meta`, WGSL for `gpu`). Autograd sees only tensors, never which
//! backend ran.
//!
//! Names follow PyTorch, in one pattern a new op keeps: a tensor operand takes PyTorch's name
//! (`add`, `eq`, `pow`), a number the `_scalar` suffix (`add_scalar`, `eq_scalar`, `pow_scalar`);
//! a trailing `_` means in place (`add_`, `fill_`); a reduction over every element takes the plain
//! name (`sum`, `max`), one over chosen dimensions `_dims` (`sum_dims`) or, when it also returns
//! indices, `_dim` (`max_dim`). Where PyTorch's name is a Rust keyword the op says what it does
//! (`where_cond` for `torch.where`).

pub mod binary;
pub mod copy;
pub mod creation;
pub mod fused;
pub mod index;
pub mod matmul;
pub mod reduce;
pub mod softmax;
pub mod unary;
pub mod view;

use crate::error::{Result, TensorError};
use crate::storage::same_device;
use crate::{DType, Tensor};

/// Error unless `a` and `b` live on the same device.
#[inline]
pub(crate) fn check_same_device(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if same_device(a.storage(), b.storage()) {
        Ok(())
    } else {
        Err(TensorError::DeviceMismatch { op, lhs: Box::new(a.device().clone()), rhs: Box::new(b.device().clone()) })
    }
}

fn category(d: DType) -> u8 {
    match d {
        DType::Bool => 0,
        DType::U8 | DType::I32 | DType::I64 => 1,
        _ => 2,
    }
}

/// PyTorch's type promotion for two tensors of equal standing.
pub fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    let (ca, cb) = (category(a), category(b));
    if ca != cb {
        return if ca > cb { a } else { b };
    }
    match (a, b) {
        (F64, _) | (_, F64) => F64,
        (F32, _) | (_, F32) => F32,
        (F16, BF16) | (BF16, F16) => F32,
        (I64, _) | (_, I64) => I64,
        (I32, _) | (_, I32) => I32,
        _ => a.max(b),
    }
}

/// Result dtype of `tensor op scalar`: a float scalar makes an integer tensor float32, otherwise
/// the tensor's dtype wins (PyTorch's "scalars don't promote within a category").
pub fn promote_with_scalar(t: DType, scalar_is_float: bool) -> DType {
    if scalar_is_float && !t.is_floating_point() { DType::F32 } else { t }
}
