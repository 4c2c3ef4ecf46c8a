//! CPU layer normalisation: one pass per row for the mean, one for the variance, one for the
//! output, in the element type's accumulation type (f32 for f32/f16/bf16, as PyTorch's CPU
//! kernel uses `opmath_t`; f64 for f64). The passes run in independent lanes inside
//! [`vectorize`], so they compile to AVX2 / AVX-512 code where the CPU has it. (The passes used
//! to run in f64: half the lanes per vector and a conversion per element, 2.3x PyTorch's time on
//! AVX2.)

use num_traits::{Float as _, One, Zero};

use crate::backend::{LayerNormArgs, LayerNormParams, rows_cols};
use crate::element::Float;
use crate::error::Result;
use crate::kernels::simd::vectorize;
use crate::kernels::strided::{SendPtr, par_ranges};

pub(super) fn layer_norm(args: &LayerNormArgs<'_>) -> Result<()> {
    crate::dispatch_float!(args.x.dtype(), "layer_norm", T => k::<T>(args))
}

/// Independent accumulators per pass (the order is fixed, so results do not depend on threads).
const LANES: usize = 16;

/// Σ f(x) over a row in lanes of the accumulation type.
#[inline(always)]
fn lane_sum<T: Float>(x: &[T], f: impl Fn(T::Acc) -> T::Acc) -> T::Acc {
    let mut lanes = [T::Acc::zero(); LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for ch in chunks {
        for k in 0..LANES {
            lanes[k] += f(ch[k].to_acc());
        }
    }
    // Pairwise combination of the lanes, then the tail.
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for k in 0..width {
            let v = lanes[k + width];
            lanes[k] += v;
        }
    }
    let mut t = lanes[0];
    for &v in rest {
        t += f(v.to_acc());
    }
    t
}

fn k<T: Float>(args: &LayerNormArgs<'_>) -> Result<()> {
    let LayerNormArgs { y, mean, rstd, x, weight: w, bias: b, params: LayerNormParams { eps } } = *args;
    let (rows, cols) = rows_cols(x);
    let xp = SendPtr(x.ptr::<T>("layer_norm")?);
    let yp = SendPtr(y.ptr::<T>("layer_norm")?);
    let mp = SendPtr(mean.ptr::<f32>("layer_norm")?);
    let rp = SendPtr(rstd.ptr::<f32>("layer_norm")?);
    let wv: Vec<T::Acc> = match w {
        Some(w) => w.to_vec_f64()?.into_iter().map(T::acc_from_f64).collect(),
        None => vec![T::Acc::one(); cols],
    };
    let bv: Vec<T::Acc> = match b {
        Some(b) => b.to_vec_f64()?.into_iter().map(T::acc_from_f64).collect(),
        None => vec![T::Acc::zero(); cols],
    };
    let n = T::acc_from_f64(cols as f64);
    let eps = T::acc_from_f64(eps);
    par_ranges(rows, cols * 4, |s, e| {
        let (xp, yp, mp, rp) = (xp, yp, mp, rp);
        let (wv, bv) = (&wv[..cols], &bv[..cols]);
        vectorize(
            #[inline(always)]
            || {
                for r in s..e {
                    // SAFETY: row r of contiguous [rows, cols] buffers, rows disjoint per task.
                    let (xr, yr) = unsafe {
                        (
                            std::slice::from_raw_parts(xp.0.add(r * cols), cols),
                            std::slice::from_raw_parts_mut(yp.0.add(r * cols), cols),
                        )
                    };
                    let mu = lane_sum(xr, |v| v) / n;
                    let var = lane_sum(xr, |v| (v - mu) * (v - mu)) / n;
                    let rs = T::Acc::one() / (var + eps).sqrt();
                    // Statistics are stored as f32 (as PyTorch stores them) and the output uses
                    // the stored values, so forward and backward agree.
                    let (mu32, rs32) = (T::acc_to_f64(mu) as f32, T::acc_to_f64(rs) as f32);
                    let (muf, rsf) = (T::acc_from_f64(mu32 as f64), T::acc_from_f64(rs32 as f64));
                    for (((o, &v), &w), &b) in yr.iter_mut().zip(xr).zip(wv).zip(bv) {
                        *o = T::from_acc((v.to_acc() - muf) * rsf * w + b);
                    }
                    // SAFETY: element r of the [rows] statistics buffers belongs to this task.
                    unsafe {
                        *mp.0.add(r) = mu32;
                        *rp.0.add(r) = rs32;
                    }
                }
            },
        );
    });
    Ok(())
}
