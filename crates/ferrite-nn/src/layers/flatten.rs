//! `Flatten`: PyTorch's `nn.Flatten(start_dim=1, end_dim=-1)`, the bridge from convolution and
//! pooling features `(N, C, H, W)` to a `Linear`. A view when the input's strides allow (no
//! copy, no new memory), as `Tensor::flatten`; gradients flow through unchanged.

use ferrite_tensor::Tensor;

use crate::error::{Result, in_layer};
use crate::module::{Module, training_flag};

/// Merges dimensions `start_dim..=end_dim` (negative counts from the end) into one.
#[derive(Clone, Debug)]
pub struct Flatten {
    pub start_dim: i64,
    pub end_dim: i64,
    training: bool,
}

impl Flatten {
    /// PyTorch's default: keep the batch dimension, flatten the rest.
    pub fn new() -> Flatten {
        Flatten::with_dims(1, -1)
    }

    /// Flatten `start_dim..=end_dim`.
    pub fn with_dims(start_dim: i64, end_dim: i64) -> Flatten {
        Flatten { start_dim, end_dim, training: true }
    }
}

impl Default for Flatten {
    fn default() -> Self {
        Flatten::new()
    }
}

impl Module for Flatten {
    fn type_name(&self) -> &'static str {
        "Flatten"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.flatten(self.start_dim, self.end_dim).map_err(in_layer("Flatten"))
    }
    training_flag!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_tensor::{DType, Device};

    #[test]
    fn flattens_all_but_the_batch_and_checks_dims() {
        let x = Tensor::zeros(&[2, 3, 4, 5], DType::F32, &Device::Cpu).unwrap();
        let y = Flatten::new().forward(&x).unwrap();
        assert_eq!(y.shape(), &[2, 60]);
        assert!(y.shares_storage(&x), "a view, not a copy");
        assert_eq!(Flatten::with_dims(0, 1).forward(&x).unwrap().shape(), &[6, 4, 5]);
        let e = Flatten::with_dims(1, 7).forward(&x).unwrap_err();
        assert!(e.to_string().starts_with("Flatten: dimension 7 is out of range"), "{e}");
        assert!(Flatten::with_dims(2, 1).forward(&x).is_err());
    }
}
