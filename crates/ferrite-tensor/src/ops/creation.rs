//! Tensor creation: constants, ranges and random values.

use std::sync::Arc;

use ferrite_memory::{allocator, CachingAllocator, Device};

use crate::error::{Result, TensorError};
use crate::kernels::strided::{par_ranges, SendPtr};
use crate::random::{with_default_generator, Generator};
use crate::{dispatch_all, DType, Tensor};
use crate::element::Element;

/// Fill a fresh contiguous tensor with `value` (converted to its dtype).
pub(crate) fn fill(t: &Tensor, value: f64) -> Result<()> {
    if t.is_meta() || t.numel() == 0 {
        return Ok(());
    }
    dispatch_all!(t.dtype(), T => {
        let v = T::from_f64(value);
        let p = SendPtr(t.ptr::<T>("fill")?);
        let n = t.numel();
        par_ranges(n, 1, |s, e| {
            let p = p;
            // SAFETY: contiguous fresh tensor of n elements; disjoint ranges per task.
            unsafe { std::slice::from_raw_parts_mut(p.0.add(s), e - s).fill(v) };
        });
    });
    Ok(())
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
            return Err(TensorError::invalid("arange", format!("upper bound and larger bound inconsistent with step sign (start={start}, end={end}, step={step})")));
        }
        let n = ((end - start) / step).ceil().max(0.0);
        if n > 1e12 {
            return Err(TensorError::invalid("arange", format!("{n} elements is too many")));
        }
        let n = n as usize;
        let t = Tensor::empty(&[n], dtype, device)?;
        if !t.is_meta() {
            dispatch_all!(dtype, T => {
                let p = t.ptr::<T>("arange")?;
                // SAFETY: fresh contiguous tensor of n elements.
                let s = unsafe { std::slice::from_raw_parts_mut(p, n) };
                for (i, v) in s.iter_mut().enumerate() {
                    *v = T::from_f64(start + i as f64 * step);
                }
            });
        }
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
    pub fn uniform_with(shape: &[usize], low: f64, high: f64, dtype: DType, device: &Device, generator: &mut Generator) -> Result<Tensor> {
        if !dtype.is_floating_point() {
            return Err(TensorError::UnsupportedDType { op: "rand", dtype });
        }
        let t = Tensor::empty(shape, dtype, device)?;
        let n = t.numel();
        if !t.is_meta() {
            generate(&t, generator, 2, |g| low + (high - low) * g.uniform_f64())?;
        }
        generator.skip(2 * n as u128);
        Ok(t)
    }

    /// Standard normal from `generator` (4 generator words per element, thread-count independent).
    #[track_caller]
    pub fn randn_with(shape: &[usize], dtype: DType, device: &Device, generator: &mut Generator) -> Result<Tensor> {
        Tensor::normal_with(shape, 0.0, 1.0, dtype, device, generator)
    }

    /// Normal(mean, std) from `generator`.
    #[track_caller]
    pub fn normal_with(shape: &[usize], mean: f64, std: f64, dtype: DType, device: &Device, generator: &mut Generator) -> Result<Tensor> {
        if !dtype.is_floating_point() {
            return Err(TensorError::UnsupportedDType { op: "randn", dtype });
        }
        let t = Tensor::empty(shape, dtype, device)?;
        let n = t.numel();
        if !t.is_meta() {
            generate(&t, generator, 4, |g| mean + std * g.normal_f64())?;
        }
        generator.skip(4 * n as u128);
        Ok(t)
    }

    /// Bernoulli(p) mask as 0/1 values of `dtype` (dropout), from `generator`.
    #[track_caller]
    pub fn bernoulli_with(shape: &[usize], p: f64, dtype: DType, device: &Device, generator: &mut Generator) -> Result<Tensor> {
        let t = Tensor::empty(shape, dtype, device)?;
        let n = t.numel();
        if !t.is_meta() {
            generate(&t, generator, 2, |g| if g.uniform_f64() < p { 1.0 } else { 0.0 })?;
        }
        generator.skip(2 * n as u128);
        Ok(t)
    }
}

/// Fill `t` with `f(generator positioned at words_per_elem * i)`, in parallel chunks. Every
/// `f` consumes exactly `words_per_elem` words, so a chunk can start at its own offset and the
/// values never depend on how the range was split.
fn generate(t: &Tensor, generator: &Generator, words_per_elem: u128, f: impl Fn(&mut Generator) -> f64 + Sync + Send) -> Result<()> {
    let n = t.numel();
    dispatch_all!(t.dtype(), T => {
        let p = SendPtr(t.ptr::<T>("rand")?);
        par_ranges(n, 8, |s, e| {
            let p = p;
            let mut g = generator.at_offset(words_per_elem * s as u128);
            for i in s..e {
                let v = f(&mut g);
                // SAFETY: each task writes its own range of a fresh contiguous tensor.
                unsafe { *p.0.add(i) = T::from_f64(v) };
            }
        });
    });
    Ok(())
}
