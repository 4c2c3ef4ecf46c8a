//! Gradient accumulation: k micro-batches, one optimizer step — a k-times larger effective
//! batch for the activation memory of one micro-batch.
//!
//! Nothing special happens to gradients: `backward()` adds into `.grad` until `zero_grad`.
//! What makes it equivalent to the large batch is dividing each micro-batch's mean loss by k
//! and stepping once every k micro-batches; [`Accumulator`] does that bookkeeping. With a
//! [`GradScaler`](crate::GradScaler), keep the scale fixed during the k backward passes and
//! call `step`/`update` only when [`Accumulator::micro_step`] says so (PyTorch's guidance).
//!
//! ```
//! use ferrite_optim::{Accumulator, Optimizer, Sgd, SgdConfig};
//! use ferrite_tensor::{Device, Tensor};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let w = Tensor::from_vec(vec![1.0f32], &[1], &Device::Cpu)?.requires_grad_(true)?;
//! let mut opt = Sgd::new(vec![w.clone()], SgdConfig::new(0.1))?;
//! let mut acc = Accumulator::new(4)?;
//! let mut steps = 0;
//! for _micro_batch in 0..8 {
//!     let loss = w.square()?.sum()?;        // the micro-batch's mean loss
//!     acc.scale_loss(&loss)?.backward()?;   // loss / 4
//!     if acc.micro_step() {                 // true on every 4th call
//!         opt.step()?;
//!         opt.zero_grad()?;
//!         steps += 1;
//!     }
//! }
//! assert_eq!(steps, 2);
//! # Ok(()) }
//! ```

use ferrite_tensor::Tensor;

use crate::error::{OptimError, Result};

/// Counts micro-batches and tells when to step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accumulator {
    steps: usize,
    pending: usize,
}

impl Accumulator {
    /// Accumulate over `steps` micro-batches (1 = no accumulation).
    pub fn new(steps: usize) -> Result<Accumulator> {
        if steps == 0 {
            return Err(OptimError::InvalidHyperparameter {
                name: "accumulation steps",
                value: 0.0,
                expected: "at least 1",
            });
        }
        Ok(Accumulator { steps, pending: 0 })
    }

    /// Micro-batches per optimizer step.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// What each micro-batch loss is divided by.
    pub fn loss_divisor(&self) -> f64 {
        self.steps as f64
    }

    /// `loss / steps` (PyTorch's `loss / iters_to_accumulate`); call `backward()` on it.
    pub fn scale_loss(&self, loss: &Tensor) -> Result<Tensor> {
        if self.steps == 1 {
            return Ok(loss.clone());
        }
        Ok(loss.div_scalar(self.steps as f64)?)
    }

    /// Record one micro-batch's backward; true when the optimizer should step now (the
    /// counter then starts over).
    pub fn micro_step(&mut self) -> bool {
        self.pending += 1;
        if self.pending == self.steps {
            self.pending = 0;
            true
        } else {
            false
        }
    }

    /// Micro-batches accumulated since the last step (non-zero at the end of an epoch whose
    /// length is not a multiple of `steps`: step once more or drop them).
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Forget pending micro-batches (e.g. after stepping on a partial accumulation).
    pub fn reset(&mut self) {
        self.pending = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_every_k_and_counts_pending() {
        let mut a = Accumulator::new(3).unwrap();
        let pattern: Vec<bool> = (0..7).map(|_| a.micro_step()).collect();
        assert_eq!(pattern, vec![false, false, true, false, false, true, false]);
        assert_eq!(a.pending(), 1);
        a.reset();
        assert_eq!(a.pending(), 0);
        assert!(Accumulator::new(0).is_err());
        let mut one = Accumulator::new(1).unwrap();
        assert!(one.micro_step() && one.micro_step());
    }
}
