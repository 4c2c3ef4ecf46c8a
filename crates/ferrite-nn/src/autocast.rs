//! Mixed precision in one line: `let _ac = autocast(DType::BF16)?;`.
//!
//! While the guard lives (on this thread), ops pick their compute dtype the way PyTorch's
//! autocast does:
//!
//! | runs in the autocast dtype (bf16/f16) | runs in f32 |
//! |---|---|
//! | `matmul`, `linear` (so `Linear`, attention projections, the `q kᵀ` and `p v` products) | `softmax`, `log_softmax`, `layer_norm`, `cross_entropy`, `nll_loss`, `mse_loss`, the attention softmax / log-sum-exp |
//!
//! Other ops (add, relu, gelu, dropout, …) run in the dtype of their inputs, so activations
//! after a `Linear` stay in low precision and take half the memory. Parameters stay f32 (the
//! casts are recorded, so gradients arrive in f32). Run backward after the guard is dropped;
//! activation checkpointing replays the recorded autocast state by itself.

use ferrite_tensor::DType;

pub use ferrite_tensor::autocast::{AutocastGuard, autocast_dtype};

use crate::error::Result;

/// Turn on autocast to `dtype` (`DType::BF16` or `DType::F16`) until the guard drops.
pub fn autocast(dtype: DType) -> Result<AutocastGuard> {
    Ok(ferrite_tensor::autocast::set_autocast(Some(dtype))?)
}

/// Turn autocast off inside an autocast region until the guard drops (e.g. for a numerically
/// sensitive sub-computation).
pub fn autocast_disabled() -> Result<AutocastGuard> {
    Ok(ferrite_tensor::autocast::set_autocast(None)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_tensor::{Device, Tensor};

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
        assert!(autocast(DType::F64).is_err());
    }
}
