//! `RMSNorm`: PyTorch's root-mean-square normalisation layer (`normalized_shape`, `eps`,
//! `elementwise_affine`), parameter `weight` (ones) of shape `normalized_shape`.
//! `x / √(mean(x²) + eps) · weight` over the trailing dims, through
//! `ferrite_tensor::functional::rms_norm` (one kernel forward, one backward). `eps = None` uses
//! the machine epsilon of the input's dtype at each forward, as PyTorch.

use ferrite_tensor::functional::rms_norm;
use ferrite_tensor::{Device, ExpectedShape, Tensor, TensorError};

use crate::error::{NnError, Result, in_layer};
use crate::init::ones_;
use crate::module::{Module, new_parameter, training_flag};

/// RMS normalisation over the last `normalized_shape.len()` dimensions.
#[derive(Clone, Debug)]
pub struct RMSNorm {
    pub normalized_shape: Vec<usize>,
    /// `None`: `torch.finfo(input.dtype).eps`.
    pub eps: Option<f64>,
    pub weight: Option<Tensor>,
    training: bool,
}

impl RMSNorm {
    /// PyTorch's defaults (eps from the dtype, elementwise affine) on the CPU.
    pub fn new(normalized_shape: &[usize]) -> Result<RMSNorm> {
        RMSNorm::with_config(normalized_shape, None, true, &Device::Cpu)
    }

    /// PyTorch's `RMSNorm(normalized_shape, eps, elementwise_affine)` on `device`.
    pub fn with_config(
        normalized_shape: &[usize],
        eps: Option<f64>,
        elementwise_affine: bool,
        device: &Device,
    ) -> Result<RMSNorm> {
        if normalized_shape.is_empty() {
            return Err(NnError::config("RMSNorm", "normalized_shape must name at least one dimension"));
        }
        if let Some(e) = eps
            && !(e > 0.0 && e.is_finite())
        {
            return Err(NnError::config("RMSNorm", format!("eps must be positive and finite (or None), got {e}")));
        }
        let weight = if elementwise_affine { Some(new_parameter(normalized_shape, device, ones_)?) } else { None };
        Ok(RMSNorm { normalized_shape: normalized_shape.to_vec(), eps, weight, training: true })
    }
}

impl Module for RMSNorm {
    fn type_name(&self) -> &'static str {
        "RMSNorm"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let expected = ExpectedShape::Trailing(self.normalized_shape.clone());
        if !expected.admits(x.shape()) {
            return Err(
                TensorError::InvalidShape { op: "RMSNorm", arg: "input", shape: x.shape().to_vec(), expected }.into()
            );
        }
        rms_norm(x, &self.normalized_shape, self.weight.as_ref(), self.eps).map_err(in_layer("RMSNorm"))
    }
    fn own_parameters(&self) -> Vec<(String, &Tensor)> {
        self.weight.iter().map(|w| ("weight".to_string(), w)).collect()
    }
    fn own_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        self.weight.iter_mut().map(|w| ("weight".to_string(), w)).collect()
    }
    training_flag!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_tensor::DType;

    #[test]
    fn trailing_shape_is_checked_by_the_layer() {
        let n = RMSNorm::new(&[4]).unwrap();
        let e = n.forward(&Tensor::zeros(&[2, 3], DType::F32, &Device::Cpu).unwrap()).unwrap_err();
        assert_eq!(e.to_string(), "RMSNorm: input has shape [2, 3], expected shape [*, 4]");
        assert!(RMSNorm::with_config(&[4], Some(-1.0), true, &Device::Cpu).is_err());
        assert!(RMSNorm::new(&[]).is_err());
    }
}
