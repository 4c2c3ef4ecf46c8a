//! From device tensors to file tensors: the elements of a ferrite `Tensor` as little-endian bytes.
//!
//! Saving reads a tensor's elements back to the host (a copy, as `torch.save` does for GPU
//! tensors). The safetensors writer pulls them one tensor at a time while it streams the file, so
//! saving a model costs at most one extra tensor of host memory; a checkpoint tree holds its
//! tensors as host copies ([`RawTensor::from_tensor`]).

use std::io::Write;

use bytes::Bytes;
use ferrite_tensor::{Bool8, DType, Tensor};
use half::{bf16, f16};

use crate::error::{IoError, Result};
use crate::raw_tensor::RawTensor;
use crate::safetensors_format::TensorData;

impl RawTensor {
    /// A host copy of `t`'s elements (contiguous), remembering its device as the saved location
    /// and its `requires_grad` flag. Meta tensors have no data and are refused.
    pub fn from_tensor(t: &Tensor) -> Result<RawTensor> {
        check_has_data(t)?;
        let bytes = tensor_bytes(t)?;
        let mut raw = RawTensor::from_contiguous_bytes(t.dtype(), t.shape().to_vec(), bytes)?;
        raw.set_location(t.device().to_string());
        raw.set_requires_grad(t.requires_grad());
        Ok(raw)
    }
}

/// Meta tensors carry shapes only; saving one would write zeros that were never computed.
pub(crate) fn check_has_data(t: &Tensor) -> Result<()> {
    if t.is_meta() && t.numel() > 0 {
        return Err(IoError::Device {
            device: "meta".to_string(),
            reason: format!(
                "a {} tensor of shape {:?} on `meta` has no values to save; run on `cpu` or `sim:…` to save weights",
                t.dtype(),
                t.shape()
            ),
        });
    }
    Ok(())
}

/// Owns a `Vec<T>` and shows it as bytes, so element data moves into `Bytes` without a copy.
struct PodVec<T>(Vec<T>);

impl<T: bytemuck::Pod> AsRef<[u8]> for PodVec<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

fn tensor_bytes(t: &Tensor) -> Result<Bytes> {
    if t.numel() == 0 {
        return Ok(Bytes::new());
    }
    fn owned<T: ferrite_tensor::Element>(t: &Tensor) -> Result<Bytes> {
        Ok(Bytes::from_owner(PodVec(t.to_vec::<T>()?)))
    }
    if cfg!(target_endian = "big") {
        return Err(IoError::ByteOrder { byteorder: "little (the machine is big)".to_string() });
    }
    match t.dtype() {
        DType::F32 => owned::<f32>(t),
        DType::F64 => owned::<f64>(t),
        DType::F16 => owned::<f16>(t),
        DType::BF16 => owned::<bf16>(t),
        DType::I64 => owned::<i64>(t),
        DType::I32 => owned::<i32>(t),
        DType::U8 => owned::<u8>(t),
        DType::Bool => owned::<Bool8>(t),
    }
}

impl TensorData for Tensor {
    fn dtype(&self) -> DType {
        Tensor::dtype(self)
    }
    fn shape(&self) -> &[usize] {
        Tensor::shape(self)
    }
    fn write_elements<W: Write>(&self, out: &mut W) -> Result<()> {
        out.write_all(&tensor_bytes(self)?).map_err(|e| IoError::os("write", "<safetensors output>", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_memory::Device;

    #[test]
    fn views_are_saved_as_their_elements() {
        let t = Tensor::from_vec((0..6).map(|i| i as f32).collect(), &[2, 3], &Device::Cpu)
            .unwrap()
            .requires_grad_(true)
            .unwrap();
        let raw = RawTensor::from_tensor(&t.detach().t().unwrap()).unwrap();
        assert_eq!((raw.shape(), raw.to_vec::<f32>().unwrap()), (&[3usize, 2][..], vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]));
        assert!(RawTensor::from_tensor(&t).unwrap().requires_grad());
        let sim = Device::parse("sim:1GiB").unwrap();
        let on_sim = RawTensor::from_tensor(&t.detach().to_device(&sim).unwrap()).unwrap();
        assert_eq!(on_sim.location(), sim.to_string());
        let b = Tensor::from_bools(&[true, false], &[2], &Device::Cpu).unwrap();
        assert_eq!(RawTensor::from_tensor(&b).unwrap().to_vec::<bool>().unwrap(), vec![true, false]);
    }

    #[test]
    fn meta_tensors_are_refused() {
        let m = Tensor::zeros(&[4], DType::F32, &Device::Meta).unwrap();
        let err = RawTensor::from_tensor(&m).unwrap_err().to_string();
        assert!(err.contains("meta") && err.contains("no values"), "{err}");
    }
}
