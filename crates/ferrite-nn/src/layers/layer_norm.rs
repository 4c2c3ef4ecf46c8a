//! `LayerNorm` over the trailing dimensions, weight ones / bias zeros like PyTorch; computed in
//! f32 under autocast.

use ferrite_tensor::{Device, Tensor};

use crate::error::{NnError, Result};
use crate::init::{ones_, zeros_};
use crate::module::{Module, new_parameter, present, present_mut, training_flag};

/// Normalises over the last `normalized_shape.len()` dimensions. Parameters `weight` and `bias`
/// (shape `normalized_shape`) unless built without an affine transform.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    pub normalized_shape: Vec<usize>,
    pub eps: f64,
    pub weight: Option<Tensor>,
    pub bias: Option<Tensor>,
    training: bool,
}

impl LayerNorm {
    /// Affine layer norm (eps 1e-5) on the CPU.
    pub fn new(normalized_shape: &[usize]) -> Result<LayerNorm> {
        LayerNorm::new_with(normalized_shape, 1e-5, true, true, &Device::Cpu)
    }

    /// PyTorch's `LayerNorm(normalized_shape, eps, elementwise_affine, bias)`. Deterministic
    /// initialisation, so no generator is needed.
    pub fn new_with(
        normalized_shape: &[usize],
        eps: f64,
        elementwise_affine: bool,
        bias: bool,
        device: &Device,
    ) -> Result<LayerNorm> {
        if normalized_shape.is_empty() {
            return Err(NnError::config("LayerNorm", "normalized_shape must name at least one dimension"));
        }
        if eps.is_nan() || eps <= 0.0 {
            return Err(NnError::config("LayerNorm", format!("eps must be positive, got {eps}")));
        }
        let weight = if elementwise_affine { Some(new_parameter(normalized_shape, device, ones_)?) } else { None };
        let bias =
            if elementwise_affine && bias { Some(new_parameter(normalized_shape, device, zeros_)?) } else { None };
        Ok(LayerNorm { normalized_shape: normalized_shape.to_vec(), eps, weight, bias, training: true })
    }
}

impl Module for LayerNorm {
    fn type_name(&self) -> &'static str {
        "LayerNorm"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(ferrite_tensor::functional::layer_norm(
            x,
            &self.normalized_shape,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )?)
    }
    fn own_parameters(&self) -> Vec<(String, &Tensor)> {
        present([("weight", &self.weight), ("bias", &self.bias)])
    }
    fn own_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        present_mut([("weight", &mut self.weight), ("bias", &mut self.bias)])
    }
    training_flag!();
}
