//! `GroupNorm`: PyTorch's group normalisation layer (`num_groups`, `num_channels`, `eps`,
//! `affine`), parameters `weight` (ones) and `bias` (zeros) of shape `[num_channels]`. The
//! channels of `(N, C, *)` input split into `num_groups` consecutive groups, each sample's group
//! normalised over its channels and positions; the math is
//! `ferrite_tensor::functional::group_norm` (one kernel forward, one backward), computed in f32
//! under autocast. Unlike batch norm it has no running statistics, so train and eval agree.

use ferrite_tensor::functional::group_norm;
use ferrite_tensor::{Device, ExpectedShape, Tensor, TensorError};

use crate::error::{NnError, Result, in_layer};
use crate::init::{ones_, zeros_};
use crate::module::{Module, new_parameter, present, present_mut, training_flag};

/// Group normalisation (see the module docs).
#[derive(Clone, Debug)]
pub struct GroupNorm {
    pub num_groups: usize,
    pub num_channels: usize,
    pub eps: f64,
    pub weight: Option<Tensor>,
    pub bias: Option<Tensor>,
    training: bool,
}

impl GroupNorm {
    /// PyTorch's defaults (eps 1e-5, affine) on the CPU.
    pub fn new(num_groups: usize, num_channels: usize) -> Result<GroupNorm> {
        GroupNorm::with_config(num_groups, num_channels, 1e-5, true, &Device::Cpu)
    }

    /// PyTorch's `GroupNorm(num_groups, num_channels, eps, affine)` on `device`.
    pub fn with_config(
        num_groups: usize,
        num_channels: usize,
        eps: f64,
        affine: bool,
        device: &Device,
    ) -> Result<GroupNorm> {
        const LAYER: &str = "GroupNorm";
        if num_groups == 0 {
            return Err(NnError::config(LAYER, "num_groups must be positive"));
        }
        if !num_channels.is_multiple_of(num_groups) {
            return Err(NnError::NotDivisible {
                layer: LAYER,
                arg: "num_channels",
                value: num_channels,
                divisor_arg: "num_groups",
                divisor: num_groups,
            });
        }
        if !(eps > 0.0 && eps.is_finite()) {
            return Err(NnError::config(LAYER, format!("eps must be positive and finite, got {eps}")));
        }
        let (weight, bias) = if affine {
            (
                Some(new_parameter(&[num_channels], device, ones_)?),
                Some(new_parameter(&[num_channels], device, zeros_)?),
            )
        } else {
            (None, None)
        };
        Ok(GroupNorm { num_groups, num_channels, eps, weight, bias, training: true })
    }
}

impl Module for GroupNorm {
    fn type_name(&self) -> &'static str {
        "GroupNorm"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() < 2 || x.shape()[1] != self.num_channels {
            let expected = if x.rank() < 2 {
                ExpectedShape::MinRank(2)
            } else {
                ExpectedShape::SizeAt { dim: 1, size: self.num_channels }
            };
            return Err(TensorError::InvalidShape {
                op: "GroupNorm",
                arg: "input",
                shape: x.shape().to_vec(),
                expected,
            }
            .into());
        }
        group_norm(x, self.num_groups, self.weight.as_ref(), self.bias.as_ref(), self.eps)
            .map_err(in_layer("GroupNorm"))
    }
    fn own_parameters(&self) -> Vec<(String, &Tensor)> {
        present([("weight", &self.weight), ("bias", &self.bias)])
    }
    fn own_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        present_mut([("weight", &mut self.weight), ("bias", &mut self.bias)])
    }
    training_flag!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_tensor::DType;

    #[test]
    fn channels_must_divide_into_groups() {
        let e = GroupNorm::new(4, 6).unwrap_err();
        assert_eq!(
            e.to_string(),
            "GroupNorm: num_channels (6) must be divisible by num_groups (4); choose num_groups among the divisors of 6, or num_channels as a multiple of 4"
        );
        assert!(matches!(e, NnError::NotDivisible { value: 6, divisor: 4, .. }));
        let gn = GroupNorm::new(3, 6).unwrap();
        let e = gn.forward(&Tensor::zeros(&[2, 4, 5], DType::F32, &Device::Cpu).unwrap()).unwrap_err();
        assert_eq!(e.to_string(), "GroupNorm: input has shape [2, 4, 5], expected size 6 in dimension 1");
        let keys: Vec<String> = gn.state_dict().keys().map(String::from).collect();
        assert_eq!(keys, ["weight", "bias"]);
    }
}
