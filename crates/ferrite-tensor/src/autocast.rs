//! Autocast state: which low-precision dtype matmul-like ops compute in.
//!
//! `ferrite-nn` exposes the user-facing guard; the state lives here because matmul lives here.
//! Semantics follow PyTorch's CPU/CUDA autocast lists: matmul, linear and batched matmul run in
//! the autocast dtype (inputs are cast, the f16/bf16 kernel computes in f32 internally and rounds
//! its output); softmax, log_softmax, layer_norm, reductions feeding losses and the losses
//! themselves run in f32. Backward runs with whatever dtypes forward recorded, so gradients of
//! f32 parameters come back as f32 (the cast's backward converts them).

use std::cell::Cell;

use crate::DType;

thread_local! {
    static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
}

/// The autocast dtype on this thread, if autocast is on.
#[inline]
pub fn autocast_dtype() -> Option<DType> {
    AUTOCAST.with(|a| a.get())
}

/// Restores the previous autocast state when dropped.
#[must_use = "autocast is turned off again when the guard is dropped"]
pub struct AutocastGuard {
    prev: Option<DType>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        let p = self.prev;
        AUTOCAST.with(|a| a.set(p));
    }
}

/// Turn autocast on (`Some(F16 | BF16)`) or off (`None`) until the guard drops. Other dtypes
/// are rejected.
pub fn set_autocast(dtype: Option<DType>) -> Result<AutocastGuard, crate::TensorError> {
    if let Some(d) = dtype
        && !matches!(d, DType::F16 | DType::BF16)
    {
        return Err(crate::TensorError::InvalidDType {
            op: "autocast",
            arg: "dtype",
            dtype: d,
            expected: &[DType::F16, DType::BF16],
        });
    }
    let prev = AUTOCAST.with(|a| a.replace(dtype));
    Ok(AutocastGuard { prev, _not_send: std::marker::PhantomData })
}

/// Dtype a low-precision-eligible op (matmul, linear) should compute in for an input of `d`.
#[inline]
pub(crate) fn lower(d: DType) -> DType {
    match autocast_dtype() {
        Some(a) if d.is_floating_point() && d != DType::F64 => a,
        _ => d,
    }
}

/// Dtype an f32-required op (softmax, norms, losses) should compute in for an input of `d`.
#[inline]
pub fn upper(d: DType) -> DType {
    match autocast_dtype() {
        Some(_) if matches!(d, DType::F16 | DType::BF16) => DType::F32,
        _ => d,
    }
}
