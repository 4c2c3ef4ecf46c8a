//! A tensor's values read into, and written from, host f32 — in the tensor's own dtype on the
//! device, converted on the host.
//!
//! Why: MPI exchanges host vectors, and ZeRO's master values are f32. A bf16 parameter or
//! gradient converted on the device first (`to_dtype(F32)`) would allocate an f32 copy of it on
//! the device for nothing; reading its bf16 bytes and widening them on the host allocates nothing
//! there, so a rank's device memory holds exactly what the planner predicts.

use ferrite_tensor::{DType, Tensor, no_grad};
use half::{bf16, f16};

use super::error::Result;

/// `t`'s values in row-major order, as f32.
pub(crate) fn read_f32(t: &Tensor) -> Result<Vec<f32>> {
    Ok(match t.dtype() {
        DType::F32 => t.to_vec::<f32>()?,
        DType::BF16 => t.to_vec::<bf16>()?.into_iter().map(bf16::to_f32).collect(),
        DType::F16 => t.to_vec::<f16>()?.into_iter().map(f16::to_f32).collect(),
        _ => t.to_vec_f64()?.into_iter().map(|v| v as f32).collect(),
    })
}

/// Overwrite `t` with `values` (row-major), rounded to `t`'s dtype on the host.
pub(crate) fn write_f32(t: &Tensor, values: &[f32]) -> Result<()> {
    let _g = no_grad();
    if t.is_contiguous() {
        match t.dtype() {
            DType::F32 => return Ok(t.copy_from_slice(values)?),
            DType::BF16 => {
                let v: Vec<bf16> = values.iter().map(|x| bf16::from_f32(*x)).collect();
                return Ok(t.copy_from_slice(&v)?);
            }
            DType::F16 => {
                let v: Vec<f16> = values.iter().map(|x| f16::from_f32(*x)).collect();
                return Ok(t.copy_from_slice(&v)?);
            }
            _ => {}
        }
    }
    // Strided or another dtype: through a host tensor, which `copy_` converts on the host side.
    let host = Tensor::from_vec(values.to_vec(), t.shape(), &ferrite_tensor::Device::Cpu)?;
    Ok(t.copy_(&host)?)
}

/// A fresh tensor on `like`'s device in `like`'s dtype and shape holding `values` (rounded on
/// the host): one device allocation, of the tensor's own size.
pub(crate) fn fresh_like(like: &Tensor, values: Vec<f32>) -> Result<Tensor> {
    let host = Tensor::from_vec(values, like.shape(), &ferrite_tensor::Device::Cpu)?;
    let host = if like.dtype() == DType::F32 { host } else { host.to_dtype(like.dtype())? };
    Ok(host.to_device(like.device())?)
}
