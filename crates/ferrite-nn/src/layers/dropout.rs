//! `Dropout`, drawing its masks from a generator the layer holds, so runs are reproducible,
//! replicas do not race on one global stream, and activation checkpointing can replay the masks.

use ferrite_tensor::random::with_default_generator;
use ferrite_tensor::{Generator, Tensor};

use crate::error::{NnError, Result};
use crate::module::{Module, training_flag};
use crate::rng::RngHandle;

/// Zeroes each element with probability `p` in training mode and scales the rest by 1/(1−p);
/// the identity in eval mode.
#[derive(Clone, Debug)]
pub struct Dropout {
    pub p: f64,
    rng: RngHandle,
    training: bool,
}

impl Dropout {
    /// A dropout layer with its own generator, seeded by one draw from the process default
    /// generator (so `manual_seed` before building the model makes the masks reproducible).
    pub fn new(p: f64) -> Result<Dropout> {
        with_default_generator(|g| Dropout::new_with(p, g))
    }

    /// A dropout layer with its own generator seeded by one draw from `g`.
    pub fn new_with(p: f64, g: &mut Generator) -> Result<Dropout> {
        Dropout::with_rng(p, RngHandle::derived_from(g))
    }

    /// Draw from `rng` (share one handle between layers, or use
    /// [`RngHandle::default_generator`] for PyTorch's single global stream).
    pub fn with_rng(p: f64, rng: RngHandle) -> Result<Dropout> {
        if !(0.0..=1.0).contains(&p) {
            return Err(NnError::config(
                "Dropout",
                format!("dropout probability has to be between 0 and 1, but got {p}"),
            ));
        }
        Ok(Dropout { p, rng, training: true })
    }

    /// The generator this layer draws from.
    pub fn rng(&self) -> &RngHandle {
        &self.rng
    }
}

impl Module for Dropout {
    fn type_name(&self) -> &'static str {
        "Dropout"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.training || self.p == 0.0 {
            return Ok(x.clone());
        }
        Ok(self.rng.with(|g| ferrite_tensor::functional::dropout(x, self.p, true, g))?)
    }
    training_flag!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_tensor::{DType, Device};

    #[test]
    fn train_drops_and_scales_eval_is_identity() {
        let mut g = Generator::new(0);
        let mut d = Dropout::new_with(0.25, &mut g).unwrap();
        let x = Tensor::ones(&[4000], DType::F32, &Device::Cpu).unwrap();
        let y = d.forward(&x).unwrap().to_vec::<f32>().unwrap();
        let zeros = y.iter().filter(|&&v| v == 0.0).count();
        assert!(y.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
        assert!((800..1200).contains(&zeros), "{zeros} zeros");
        d.eval();
        assert!(!d.is_training());
        assert!(d.forward(&x).unwrap().shares_storage(&x));
        assert!(Dropout::new_with(1.5, &mut g).is_err());
    }

    #[test]
    fn same_seed_same_mask() {
        let x = Tensor::ones(&[64], DType::F32, &Device::Cpu).unwrap();
        let a = Dropout::new_with(0.5, &mut Generator::new(7)).unwrap();
        let b = Dropout::new_with(0.5, &mut Generator::new(7)).unwrap();
        assert_eq!(a.forward(&x).unwrap().to_vec::<f32>().unwrap(), b.forward(&x).unwrap().to_vec::<f32>().unwrap());
    }
}
