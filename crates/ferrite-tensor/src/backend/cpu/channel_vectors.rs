//! Per-channel vectors (statistics, weights, running buffers) between the CPU kernels' f64
//! arithmetic and tensors of any floating dtype. They are `[C]`-sized, so a host copy costs
//! nothing next to the `[N, C, S]` pass it serves, and one kernel body serves every dtype pairing
//! (f16 input with f32 statistics, f32 input with f64 running buffers).

use crate::element::Element;
use crate::error::Result;
use crate::{Tensor, dispatch_float};

/// The values of a small floating-point tensor as f64 (`None` stays `None`).
pub(super) fn read(t: Option<&Tensor>) -> Result<Option<Vec<f64>>> {
    t.map(|t| t.to_vec_f64()).transpose()
}

/// Write `values` into the contiguous floating-point `t` (rounded to its dtype).
pub(super) fn write(t: &Tensor, values: &[f64], op: &'static str) -> Result<()> {
    dispatch_float!(t.dtype(), op, T => {
        let n = t.numel().min(values.len());
        if n == 0 {
            return Ok(());
        }
        let p = t.ptr::<T>(op)?;
        // SAFETY: `t` is a contiguous host tensor of at least `n` elements that this kernel
        // writes alone (the op layer handed it over as an output or an in-place buffer).
        let out = unsafe { std::slice::from_raw_parts_mut(p, n) };
        for (o, &v) in out.iter_mut().zip(values) {
            *o = T::from_f64(v);
        }
        Ok(())
    })
}

/// `v` rounded to `t`'s dtype and back (so a kernel uses exactly the statistic it stores).
pub(super) fn rounded(t: &Tensor, v: f64) -> f64 {
    match t.dtype() {
        crate::DType::F64 => v,
        crate::DType::F16 => half::f16::from_f64(v).to_f64(),
        crate::DType::BF16 => half::bf16::from_f64(v).to_f64(),
        _ => v as f32 as f64,
    }
}
