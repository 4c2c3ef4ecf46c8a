//! Tensor creation: constants, ranges and random values.

use std::sync::Arc;

use ferrite_memory::{CachingAllocator, Device, allocator};

use crate::backend::Distribution;
use crate::error::{Result, TensorError};
use crate::random::{Generator, with_default_generator};
use crate::{DType, Tensor};

/// Fill a fresh contiguous tensor with `value` (converted to its dtype).
pub(crate) fn fill(t: &Tensor, value: f64) -> Result<()> {
    if t.numel() == 0 {
        return Ok(());
    }
    t.kernels().fill(t, value)
}

#[track_caller]
pub(crate) fn full_on(alloc: &Arc<CachingAllocator>, shape: &[usize], dtype: DType, value: f64) -> Result<Tensor> {
    let t = Tensor::empty_with(alloc, shape, dtype)?;
    fill(&t, value)?;
    Ok(t)
}

impl Tensor {
    #[track_caller]
    pub fn full(shape: &[usize], value: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        full_on(&allocator(device), shape, dtype, value)
    }

    #[track_caller]
    pub fn zeros(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 0.0, dtype, device)
    }

    #[track_caller]
    pub fn ones(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype, device)
    }

    #[track_caller]
    pub fn zeros_like(&self) -> Result<Tensor> {
        full_on(self.storage().allocator(), self.shape(), self.dtype(), 0.0)
    }

    #[track_caller]
    pub fn ones_like(&self) -> Result<Tensor> {
        full_on(self.storage().allocator(), self.shape(), self.dtype(), 1.0)
    }

    #[track_caller]
    pub fn full_like(&self, value: f64) -> Result<Tensor> {
        full_on(self.storage().allocator(), self.shape(), self.dtype(), value)
    }

    /// `[start, end)` with `step`, like `torch.arange` (dtype given explicitly).
    #[track_caller]
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            return Err(TensorError::invalid("arange", format!("invalid range start={start}, end={end}, step={step}")));
        }
        if (end - start) * step < 0.0 {
            return Err(TensorError::invalid(
                "arange",
                format!(
                    "upper bound and larger bound inconsistent with step sign (start={start}, end={end}, step={step})"
                ),
            ));
        }
        let n = ((end - start) / step).ceil().max(0.0);
        if n > 1e12 {
            return Err(TensorError::invalid("arange", format!("{n} elements is too many")));
        }
        let n = n as usize;
        let t = Tensor::empty(&[n], dtype, device)?;
        t.kernels().arange(&t, start, step)?;
        Ok(t)
    }

    /// Uniform `[0, 1)` from the default generator.
    #[track_caller]
    pub fn rand(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        with_default_generator(|g| Tensor::rand_with(shape, dtype, device, g))
    }

    /// Standard normal from the default generator.
    #[track_caller]
    pub fn randn(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        with_default_generator(|g| Tensor::randn_with(shape, dtype, device, g))
    }

    /// Uniform `[0, 1)` from `generator`. Values do not depend on the number of threads: element `i`
    /// always uses generator words `[2i, 2i+2)` past the generator's position.
    #[track_caller]
    pub fn rand_with(shape: &[usize], dtype: DType, device: &Device, generator: &mut Generator) -> Result<Tensor> {
        Tensor::uniform_with(shape, 0.0, 1.0, dtype, device, generator)
    }

    /// Uniform `[low, high)` from `generator` (used by initialisers).
    #[track_caller]
    pub fn uniform_with(
        shape: &[usize],
        low: f64,
        high: f64,
        dtype: DType,
        device: &Device,
        generator: &mut Generator,
    ) -> Result<Tensor> {
        if !dtype.is_floating_point() {
            return Err(TensorError::UnsupportedDType { op: "rand", dtype });
        }
        random_with(shape, Distribution::Uniform { low, high }, dtype, device, generator)
    }

    /// Standard normal from `generator` (4 generator words per element, thread-count independent).
    #[track_caller]
    pub fn randn_with(shape: &[usize], dtype: DType, device: &Device, generator: &mut Generator) -> Result<Tensor> {
        Tensor::normal_with(shape, 0.0, 1.0, dtype, device, generator)
    }

    /// Normal(mean, std) from `generator`.
    #[track_caller]
    pub fn normal_with(
        shape: &[usize],
        mean: f64,
        std: f64,
        dtype: DType,
        device: &Device,
        generator: &mut Generator,
    ) -> Result<Tensor> {
        if !dtype.is_floating_point() {
            return Err(TensorError::UnsupportedDType { op: "randn", dtype });
        }
        random_with(shape, Distribution::Normal { mean, std }, dtype, device, generator)
    }

    /// Bernoulli(p) mask as 0/1 values of `dtype` (dropout), from `generator`.
    #[track_caller]
    pub fn bernoulli_with(
        shape: &[usize],
        p: f64,
        dtype: DType,
        device: &Device,
        generator: &mut Generator,
    ) -> Result<Tensor> {
        random_with(shape, Distribution::Bernoulli { p }, dtype, device, generator)
    }
}

/// A fresh tensor from `dist`, advancing `generator` past the words it consumed (on every
/// device, meta included, so a planning run leaves the generator where a real run would).
#[track_caller]
fn random_with(
    shape: &[usize],
    dist: Distribution,
    dtype: DType,
    device: &Device,
    generator: &mut Generator,
) -> Result<Tensor> {
    let t = Tensor::empty(shape, dtype, device)?;
    if t.numel() > 0 {
        t.kernels().random(&t, dist, generator)?;
    }
    generator.skip(dist.words_per_element() * t.numel() as u128);
    Ok(t)
}
