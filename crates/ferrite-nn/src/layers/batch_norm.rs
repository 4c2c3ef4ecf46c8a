//! `BatchNorm1d` and `BatchNorm2d`: PyTorch's batch normalisation layers, with its parameter and
//! buffer names (`weight`, `bias`, `running_mean`, `running_var`, `num_batches_tracked`), its
//! initialisation (weight ones, bias zeros, running statistics zeros/ones, counter 0) and its
//! train/eval rules, so state dicts move between the two frameworks key for key.
//!
//! One generic type serves both, since they differ only in the input ranks they accept
//! ([`BatchNormRank`]). The arithmetic is `ferrite_tensor::functional::batch_norm` (one kernel
//! pass for the statistics and one for the output, the running statistics updated by the same
//! kernel in place); the layer adds what PyTorch's `_BatchNorm.forward` adds: counting batches in
//! `num_batches_tracked`, the cumulative average when `momentum` is `None`, and batch statistics
//! in eval mode when running statistics are not tracked.

use std::marker::PhantomData;

use ferrite_tensor::functional::{BatchNormOptions, batch_norm};
use ferrite_tensor::{DType, Device, ExpectedShape, Tensor, TensorError, no_grad};

use crate::error::{NnError, Result, in_layer};
use crate::init::{ones_, zeros_};
use crate::module::{Module, new_parameter, present, present_mut};

/// The input ranks a batch norm accepts, and its class name.
pub trait BatchNormRank: Clone + std::fmt::Debug + Send + Sync + 'static {
    const NAME: &'static str;
    /// The accepted input shapes, as an error would state them.
    fn expected() -> ExpectedShape;
}

/// `(N, C)` or `(N, C, L)` input.
#[derive(Clone, Copy, Debug)]
pub struct Rank1d;

/// `(N, C, H, W)` input.
#[derive(Clone, Copy, Debug)]
pub struct Rank2d;

impl BatchNormRank for Rank1d {
    const NAME: &'static str = "BatchNorm1d";
    fn expected() -> ExpectedShape {
        ExpectedShape::AnyOf(vec![ExpectedShape::Named(&["N", "C"]), ExpectedShape::Named(&["N", "C", "L"])])
    }
}

impl BatchNormRank for Rank2d {
    const NAME: &'static str = "BatchNorm2d";
    fn expected() -> ExpectedShape {
        ExpectedShape::Named(&["N", "C", "H", "W"])
    }
}

/// Configuration of a batch norm (PyTorch's constructor arguments and defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNormConfig {
    /// Added to the variance before the square root (default 1e-5).
    pub eps: f64,
    /// Weight of each batch in the running statistics (default `Some(0.1)`); `None` keeps a
    /// cumulative moving average (each batch weighted `1/num_batches_tracked`).
    pub momentum: Option<f64>,
    /// Learnable per-channel `weight` and `bias` (default true).
    pub affine: bool,
    /// Keep running statistics for eval mode (default true); without them every forward uses
    /// the batch's statistics.
    pub track_running_stats: bool,
}

impl Default for BatchNormConfig {
    fn default() -> Self {
        BatchNormConfig { eps: 1e-5, momentum: Some(0.1), affine: true, track_running_stats: true }
    }
}

impl BatchNormConfig {
    pub fn eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }
    pub fn momentum(mut self, momentum: Option<f64>) -> Self {
        self.momentum = momentum;
        self
    }
    pub fn affine(mut self, affine: bool) -> Self {
        self.affine = affine;
        self
    }
    pub fn track_running_stats(mut self, track: bool) -> Self {
        self.track_running_stats = track;
        self
    }
}

/// Batch normalisation over the channel dimension 1 (see the module docs); use the aliases
/// [`BatchNorm1d`] and [`BatchNorm2d`].
#[derive(Clone, Debug)]
pub struct BatchNorm<R: BatchNormRank> {
    pub num_features: usize,
    pub eps: f64,
    pub momentum: Option<f64>,
    /// `[C]`, ones at construction (absent without `affine`).
    pub weight: Option<Tensor>,
    /// `[C]`, zeros at construction (absent without `affine`).
    pub bias: Option<Tensor>,
    /// `[C]` f32 buffers (absent without `track_running_stats`).
    pub running_mean: Option<Tensor>,
    pub running_var: Option<Tensor>,
    /// int64 scalar buffer: training-mode forwards so far.
    pub num_batches_tracked: Option<Tensor>,
    training: bool,
    rank: PhantomData<R>,
}

/// Batch norm over `(N, C)` or `(N, C, L)` input (PyTorch's `nn.BatchNorm1d`).
pub type BatchNorm1d = BatchNorm<Rank1d>;
/// Batch norm over `(N, C, H, W)` input (PyTorch's `nn.BatchNorm2d`).
pub type BatchNorm2d = BatchNorm<Rank2d>;

impl<R: BatchNormRank> BatchNorm<R> {
    /// PyTorch's defaults (eps 1e-5, momentum 0.1, affine, tracking running statistics) on the
    /// CPU.
    pub fn new(num_features: usize) -> Result<BatchNorm<R>> {
        BatchNorm::with_config(num_features, &BatchNormConfig::default(), &Device::Cpu)
    }

    /// A batch norm with `config`, its tensors allocated on `device`.
    pub fn with_config(num_features: usize, config: &BatchNormConfig, device: &Device) -> Result<BatchNorm<R>> {
        if !(config.eps > 0.0 && config.eps.is_finite()) {
            return Err(NnError::config(R::NAME, format!("eps must be positive and finite, got {}", config.eps)));
        }
        if let Some(m) = config.momentum
            && !(0.0..=1.0).contains(&m)
        {
            return Err(NnError::config(R::NAME, format!("momentum must be between 0 and 1 (or None), got {m}")));
        }
        let (weight, bias) = if config.affine {
            (
                Some(new_parameter(&[num_features], device, ones_)?),
                Some(new_parameter(&[num_features], device, zeros_)?),
            )
        } else {
            (None, None)
        };
        let (running_mean, running_var, num_batches_tracked) = if config.track_running_stats {
            (
                Some(Tensor::zeros(&[num_features], DType::F32, device)?),
                Some(Tensor::ones(&[num_features], DType::F32, device)?),
                Some(Tensor::zeros(&[], DType::I64, device)?),
            )
        } else {
            (None, None, None)
        };
        Ok(BatchNorm {
            num_features,
            eps: config.eps,
            momentum: config.momentum,
            weight,
            bias,
            running_mean,
            running_var,
            num_batches_tracked,
            training: true,
            rank: PhantomData,
        })
    }

    /// Running statistics back to zeros/ones and the batch counter to 0 (PyTorch's
    /// `reset_running_stats`).
    pub fn reset_running_stats(&self) -> Result<()> {
        let _g = no_grad();
        for (t, v) in [(&self.running_mean, 0.0), (&self.running_var, 1.0), (&self.num_batches_tracked, 0.0)] {
            if let Some(t) = t {
                t.fill_(v)?;
            }
        }
        Ok(())
    }

    /// Error unless `x` has an accepted rank and `num_features` channels.
    fn check_input(&self, x: &Tensor) -> Result<()> {
        let expected = R::expected();
        if !expected.admits(x.shape()) {
            return Err(
                TensorError::InvalidShape { op: R::NAME, arg: "input", shape: x.shape().to_vec(), expected }.into()
            );
        }
        if x.shape()[1] != self.num_features {
            return Err(TensorError::InvalidShape {
                op: R::NAME,
                arg: "input",
                shape: x.shape().to_vec(),
                expected: ExpectedShape::SizeAt { dim: 1, size: self.num_features },
            }
            .into());
        }
        Ok(())
    }
}

impl<R: BatchNormRank> Module for BatchNorm<R> {
    fn type_name(&self) -> &'static str {
        R::NAME
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.check_input(x)?;
        let tracking = self.running_mean.is_some() && self.running_var.is_some();
        // Re-run inside a checkpointed region's backward: same batch statistics, but the running
        // ones were already updated by the first run.
        let replay = self.training && crate::activation_checkpoint::is_recomputing();
        let counting = if self.training && tracking && !replay { self.num_batches_tracked.as_ref() } else { None };
        let factor = match (self.momentum, counting) {
            (Some(m), _) => m,
            // `meta` holds no count (and computes nothing, so the factor is irrelevant there).
            (None, Some(nbt)) if nbt.is_meta() => 0.0,
            // The cumulative average weighs this batch 1/(batches so far, this one included).
            (None, Some(nbt)) => 1.0 / (nbt.item()? + 1.0),
            (None, None) => 0.0,
        };
        // Batch statistics in training mode, and always when none are tracked (PyTorch's
        // `bn_training`); the running ones are updated only when tracked.
        let training = self.training || !tracking;
        let (rm, rv) =
            if tracking && !replay { (self.running_mean.as_ref(), self.running_var.as_ref()) } else { (None, None) };
        let opts = BatchNormOptions { training, momentum: factor, eps: self.eps };
        let y = batch_norm(x, rm, rv, self.weight.as_ref(), self.bias.as_ref(), &opts).map_err(in_layer(R::NAME))?;
        if let Some(nbt) = counting {
            // Counted once the forward succeeded, so a refused batch leaves the state as it was.
            let _g = no_grad();
            nbt.add_scalar_(1.0)?;
        }
        Ok(y)
    }

    fn own_parameters(&self) -> Vec<(String, &Tensor)> {
        present([("weight", &self.weight), ("bias", &self.bias)])
    }

    fn own_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        present_mut([("weight", &mut self.weight), ("bias", &mut self.bias)])
    }

    fn own_buffers(&self) -> Vec<(String, &Tensor)> {
        present([
            ("running_mean", &self.running_mean),
            ("running_var", &self.running_var),
            ("num_batches_tracked", &self.num_batches_tracked),
        ])
    }

    fn own_buffers_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        present_mut([
            ("running_mean", &mut self.running_mean),
            ("running_var", &mut self.running_var),
            ("num_batches_tracked", &mut self.num_batches_tracked),
        ])
    }

    fn is_training(&self) -> bool {
        self.training
    }

    fn set_own_training(&mut self, training: bool) {
        self.training = training;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_dict_keys_and_buffers_follow_pytorch() {
        let bn = BatchNorm2d::new(3).unwrap();
        let keys: Vec<String> = bn.state_dict().keys().map(String::from).collect();
        assert_eq!(keys, ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]);
        assert_eq!(bn.num_batches_tracked.as_ref().unwrap().dtype(), DType::I64);
        assert_eq!(bn.num_batches_tracked.as_ref().unwrap().shape(), &[] as &[usize]);
        let plain = BatchNorm1d::with_config(
            3,
            &BatchNormConfig::default().affine(false).track_running_stats(false),
            &Device::Cpu,
        )
        .unwrap();
        assert!(plain.state_dict().is_empty());
    }

    #[test]
    fn bad_configs_and_inputs_are_typed_errors() {
        assert!(BatchNorm2d::with_config(3, &BatchNormConfig::default().eps(0.0), &Device::Cpu).is_err());
        assert!(BatchNorm2d::with_config(3, &BatchNormConfig::default().momentum(Some(1.5)), &Device::Cpu).is_err());
        let bn = BatchNorm2d::new(3).unwrap();
        let e = bn.forward(&Tensor::zeros(&[2, 3, 4], DType::F32, &Device::Cpu).unwrap()).unwrap_err();
        assert_eq!(e.to_string(), "BatchNorm2d: input has shape [2, 3, 4], expected a 4-D tensor [N, C, H, W]");
        let e = bn.forward(&Tensor::zeros(&[2, 5, 4, 4], DType::F32, &Device::Cpu).unwrap()).unwrap_err();
        assert_eq!(e.to_string(), "BatchNorm2d: input has shape [2, 5, 4, 4], expected size 3 in dimension 1");
        let bn1 = BatchNorm1d::new(4).unwrap();
        let e = bn1.forward(&Tensor::zeros(&[1, 4], DType::F32, &Device::Cpu).unwrap()).unwrap_err();
        assert!(e.to_string().starts_with("BatchNorm1d: expected more than 1 value per channel when training"), "{e}");
    }
}
