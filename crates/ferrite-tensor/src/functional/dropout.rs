//! Dropout: a Bernoulli mask drawn from an explicit [`Generator`], so a resumed run that restores
//! the generator's state draws the same masks (PyTorch's `F.dropout` draws from the global one).

use crate::Tensor;
use crate::autograd::no_grad;
use crate::error::{Result, TensorError};
use crate::random::Generator;

/// Zero elements with probability `p` and scale the rest by `1/(1-p)` (identity when not
/// training or `p == 0`). Draws from `generator`.
pub fn dropout(x: &Tensor, p: f64, training: bool, generator: &mut Generator) -> Result<Tensor> {
    if !(0.0..=1.0).contains(&p) {
        return Err(TensorError::invalid(
            "dropout",
            format!("dropout probability has to be between 0 and 1, but got {p}"),
        ));
    }
    if !training || p == 0.0 {
        return Ok(x.clone());
    }
    if p == 1.0 {
        return x.mul_scalar(0.0);
    }
    let mask = Tensor::bernoulli_with(x.shape(), 1.0 - p, x.dtype(), x.device(), generator)?;
    let mask = {
        let _g = no_grad();
        mask.mul_scalar(1.0 / (1.0 - p))?
    };
    x.mul(&mask)
}
