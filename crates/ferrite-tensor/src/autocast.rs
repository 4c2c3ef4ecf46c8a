//! Autocast (mixed precision) in one line: `let _ac = autocast(DType::BF16)?;`. The state, the
//! guard and the user-facing functions all live here, because the ops that read the state
//! (matmul, softmax, layer_norm, the losses) live in this crate; `ferrite-nn` re-exports
//! [`autocast`], [`autocast_disabled`] and [`AutocastGuard`] for model code.
//!
//! While the guard lives (on this thread), ops pick their compute dtype the way PyTorch's
//! CPU/CUDA autocast lists do:
//!
//! | runs in the autocast dtype (bf16/f16) | runs in f32 |
//! |---|---|
//! | `matmul`, `linear` (so `Linear`, attention projections, the `q kᵀ` and `p v` products) | `softmax`, `log_softmax`, `layer_norm`, `cross_entropy`, `nll_loss`, `mse_loss`, the attention softmax / log-sum-exp |
//!
//! In the low-precision ops inputs are cast, and the f16/bf16 kernel computes in f32 internally
//! and rounds its output. Other ops (add, relu, gelu, dropout, …) run in the dtype of their
//! inputs, so activations after a `Linear` stay in low precision and take half the memory.
//! Parameters stay f32 and the casts are recorded, so gradients of f32 parameters come back as
//! f32 (the cast's backward converts them). Run backward after the guard is dropped; activation
//! checkpointing (`ferrite-nn`) replays the recorded autocast state by itself.

use std::cell::Cell;

use crate::{DType, TensorError};

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

/// Turn on autocast to `dtype` (`DType::BF16` or `DType::F16`) until the guard drops.
pub fn autocast(dtype: DType) -> Result<AutocastGuard, TensorError> {
    set_autocast(Some(dtype))
}

/// Turn autocast off inside an autocast region until the guard drops (e.g. for a numerically
/// sensitive sub-computation).
pub fn autocast_disabled() -> Result<AutocastGuard, TensorError> {
    set_autocast(None)
}

/// Turn autocast on (`Some(F16 | BF16)`) or off (`None`) until the guard drops: the form that
/// restores a recorded state (activation checkpointing replays the forward's). Other dtypes are
/// rejected.
pub fn set_autocast(dtype: Option<DType>) -> Result<AutocastGuard, TensorError> {
    if let Some(d) = dtype
        && !matches!(d, DType::F16 | DType::BF16)
    {
        return Err(TensorError::InvalidDType {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, Tensor};

    #[test]
    fn linear_runs_low_softmax_runs_f32_and_guard_restores() {
        let x = Tensor::ones(&[2, 3], DType::F32, &Device::Cpu).unwrap();
        let w = Tensor::ones(&[4, 3], DType::F32, &Device::Cpu).unwrap();
        {
            let _ac = autocast(DType::BF16).unwrap();
            assert_eq!(autocast_dtype(), Some(DType::BF16));
            let y = x.linear(&w, None).unwrap();
            assert_eq!(y.dtype(), DType::BF16);
            assert_eq!(y.softmax(-1).unwrap().dtype(), DType::F32);
            {
                let _off = autocast_disabled().unwrap();
                assert_eq!(x.linear(&w, None).unwrap().dtype(), DType::F32);
            }
            assert_eq!(autocast_dtype(), Some(DType::BF16));
        }
        assert_eq!(autocast_dtype(), None);
        assert!(matches!(autocast(DType::F64), Err(TensorError::InvalidDType { dtype: DType::F64, .. })));
    }
}
