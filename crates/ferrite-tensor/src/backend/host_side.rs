//! Kernels that run on the host for every backend: `arange`, random fills and the validation of
//! index values.
//!
//! Why they live here and not in one backend: their results must be the same bits on every
//! device (a seeded run gives the same dropout masks on `cpu` and `gpu:<i>`; `arange` is f64
//! arithmetic converted once), and index validation reports the same error everywhere. So they
//! are computed on host memory by these functions, which the CPU backend calls on its own
//! tensors and the GPU backend calls on a host staging tensor that it then uploads (or that it
//! filled by reading the device tensor back). Before this module existed the GPU backend called
//! the CPU backend for them, one backend depending on another; now both depend on this file.
//!
//! Every function takes a *contiguous tensor in host memory* (`cpu` or `sim`).

use crate::backend::Distribution;
use crate::element::Element;
use crate::error::{Result, TensorError};
use crate::kernels::strided::{SendPtr, par_ranges};
use crate::random::Generator;
use crate::{Tensor, dispatch_all};

/// `t[i] = start + i * step`, computed in f64 and converted to `t`'s dtype.
pub(crate) fn arange(t: &Tensor, start: f64, step: f64) -> Result<()> {
    let n = t.numel();
    dispatch_all!(t.dtype(), T => {
        let p = t.ptr::<T>("arange")?;
        // SAFETY: contiguous tensor of n elements.
        let s = unsafe { std::slice::from_raw_parts_mut(p, n) };
        for (i, v) in s.iter_mut().enumerate() {
            *v = T::from_f64(start + i as f64 * step);
        }
    });
    Ok(())
}

/// Fill `t` from `dist`, element `i` drawn from `generator` positioned at
/// `dist.words_per_element() * i`, so values never depend on how the work is split.
pub(crate) fn random(t: &Tensor, dist: Distribution, generator: &Generator) -> Result<()> {
    let words = dist.words_per_element();
    match dist {
        Distribution::Uniform { low, high } => {
            generate(t, generator, words, move |g| low + (high - low) * g.uniform_f64())
        }
        Distribution::Normal { mean, std } => generate(t, generator, words, move |g| mean + std * g.normal_f64()),
        Distribution::Bernoulli { p } => {
            generate(t, generator, words, move |g| if g.uniform_f64() < p { 1.0 } else { 0.0 })
        }
    }
}

/// Fill `t` with `f(generator positioned at words_per_elem * i)`, in parallel chunks. Every `f`
/// consumes exactly `words_per_elem` words, so a chunk can start at its own offset and the values
/// never depend on how the range was split.
fn generate(
    t: &Tensor,
    generator: &Generator,
    words_per_elem: u128,
    f: impl Fn(&mut Generator) -> f64 + Sync + Send,
) -> Result<()> {
    let n = t.numel();
    dispatch_all!(t.dtype(), T => {
        let p = SendPtr(t.ptr::<T>("rand")?);
        par_ranges(n, 8, |s, e| {
            let p = p;
            let mut g = generator.at_offset(words_per_elem * s as u128);
            for i in s..e {
                let v = f(&mut g);
                // SAFETY: each task writes its own range of a contiguous tensor of n elements.
                unsafe { *p.0.add(i) = T::from_f64(v) };
            }
        });
    });
    Ok(())
}

/// Error unless every index in `idx` is in `[0, size)` or equals `ignore`.
pub(crate) fn check_indices(
    idx: &Tensor,
    size: usize,
    ignore: Option<i64>,
    dim: usize,
    op: &'static str,
) -> Result<()> {
    let v: Vec<i64> =
        dispatch_all!(idx.dtype(), T => idx.to_vec::<T>()?.into_iter().map(|x| x.to_f64() as i64).collect());
    match v.into_iter().find(|&i| Some(i) != ignore && (i < 0 || i as usize >= size)) {
        Some(bad) => Err(TensorError::IndexOutOfRange { op, index: bad, dim, size }),
        None => Ok(()),
    }
}
