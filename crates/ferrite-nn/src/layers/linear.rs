//! `Linear`: y = x Wᵀ + b, with PyTorch's weight layout `[out, in]` and default initialisation
//! (so checkpoints and init statistics carry over).

use ferrite_tensor::random::with_default_generator;
use ferrite_tensor::{Device, Generator, Tensor, no_grad};

use crate::error::Result;
use crate::init::{FanMode, Nonlinearity, kaiming_uniform_, uniform_};
use crate::module::{Module, new_parameter, training_flag, weight_and_bias, weight_and_bias_mut};

/// Fully connected layer. Parameters `weight [out_features, in_features]` and optional
/// `bias [out_features]`. Under autocast the product runs in the low-precision dtype.
#[derive(Clone, Debug)]
pub struct Linear {
    pub in_features: usize,
    pub out_features: usize,
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    training: bool,
}

impl Linear {
    /// On the CPU, initialised from the process default generator.
    pub fn new(in_features: usize, out_features: usize) -> Result<Linear> {
        with_default_generator(|g| Linear::new_with(in_features, out_features, true, &Device::Cpu, g))
    }

    /// PyTorch's initialisation drawn from `g`, allocated directly on `device`: weight
    /// `kaiming_uniform_(a=√5)` = U(±1/√in), bias U(±1/√in).
    pub fn new_with(
        in_features: usize,
        out_features: usize,
        bias: bool,
        device: &Device,
        g: &mut Generator,
    ) -> Result<Linear> {
        let weight = new_parameter(&[out_features, in_features], device, |w| {
            if in_features == 0 {
                Ok(())
            } else {
                kaiming_uniform_(w, 5f64.sqrt(), FanMode::FanIn, Nonlinearity::LeakyRelu, g)
            }
        })?;
        let bias = if bias {
            let bound = if in_features > 0 { 1.0 / (in_features as f64).sqrt() } else { 0.0 };
            Some(new_parameter(&[out_features], device, |b| uniform_(b, -bound, bound, g))?)
        } else {
            None
        };
        Ok(Linear { in_features, out_features, weight, bias, training: true })
    }

    /// A layer around given tensors (`weight [out, in]`, `bias [out]`), used as they are.
    pub fn from_tensors(weight: Tensor, bias: Option<Tensor>) -> Result<Linear> {
        let s = weight.shape().to_vec();
        if s.len() != 2 {
            return Err(crate::NnError::config(
                "Linear",
                format!("weight must be [out_features, in_features], got {s:?}"),
            ));
        }
        if let Some(b) = &bias
            && b.shape() != [s[0]]
        {
            return Err(crate::NnError::config("Linear", format!("bias must be [{}], got {:?}", s[0], b.shape())));
        }
        Ok(Linear { in_features: s[1], out_features: s[0], weight, bias, training: true })
    }
}

impl Module for Linear {
    fn type_name(&self) -> &'static str {
        "Linear"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.bias {
            // Without a graph (inference), add the bias in place into the fresh product instead
            // of allocating a second output: the peak of an inference forward is one activation
            // lower.
            Some(b) if !Tensor::needs_graph(&[x, &self.weight, b]) => {
                let y = x.matmul(&self.weight.t()?)?;
                let _g = no_grad();
                y.add_(&b.to_dtype(y.dtype())?)?;
                Ok(y)
            }
            _ => Ok(x.linear(&self.weight, self.bias.as_ref())?),
        }
    }
    fn own_parameters(&self) -> Vec<(String, &Tensor)> {
        weight_and_bias(&self.weight, &self.bias)
    }
    fn own_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        weight_and_bias_mut(&mut self.weight, &mut self.bias)
    }
    training_flag!();
}

#[cfg(test)]
mod skip_init_tests {
    use super::*;
    use crate::module::skip_init;

    #[test]
    fn skip_init_leaves_zeros_and_restores_itself() {
        let mut g = ferrite_tensor::Generator::new(0);
        let zero = skip_init(|| Linear::new_with(4, 3, true, &Device::Cpu, &mut g)).unwrap();
        assert!(zero.weight.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
        let drawn = Linear::new_with(4, 3, true, &Device::Cpu, &mut g).unwrap();
        assert!(drawn.weight.to_vec::<f32>().unwrap().iter().any(|&v| v != 0.0), "initialisation is back");
    }
}
