//! CPU layer normalisation: one pass per row for the mean, one for the variance (both in f64),
//! one for the output. The passes run in independent f64 lanes inside [`vectorize`], so they
//! compile to AVX2 / AVX-512 code where the CPU has it (scalar f64 took 4 passes' worth of
//! time per element on both families).

use crate::backend::{LayerNormArgs, rows_cols};
use crate::element::Float;
use crate::error::Result;
use crate::kernels::simd::vectorize;
use crate::kernels::strided::{SendPtr, par_ranges};

pub(super) fn layer_norm(args: &LayerNormArgs<'_>) -> Result<()> {
    crate::dispatch_float!(args.x.dtype(), "layer_norm", T => k::<T>(args))
}

/// Independent accumulators per pass (the order is fixed, so results do not depend on threads).
const LANES: usize = 8;

/// Σ f(x) over a row in f64 lanes.
#[inline(always)]
fn lane_sum<T: Float>(x: &[T], f: impl Fn(f64) -> f64) -> f64 {
    let mut lanes = [0f64; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for ch in chunks {
        for k in 0..LANES {
            lanes[k] += f(T::acc_to_f64(ch[k].to_acc()));
        }
    }
    let mut t: f64 = lanes.iter().sum();
    for &v in rest {
        t += f(T::acc_to_f64(v.to_acc()));
    }
    t
}

fn k<T: Float>(args: &LayerNormArgs<'_>) -> Result<()> {
    let LayerNormArgs { y, mean, rstd, x, weight: w, bias: b, eps } = *args;
    let (rows, cols) = rows_cols(x);
    let xp = SendPtr(x.ptr::<T>("layer_norm")?);
    let yp = SendPtr(y.ptr::<T>("layer_norm")?);
    let mp = SendPtr(mean.ptr::<f32>("layer_norm")?);
    let rp = SendPtr(rstd.ptr::<f32>("layer_norm")?);
    let wv: Vec<f64> = match w {
        Some(w) => w.to_vec_f64()?,
        None => vec![1.0; cols],
    };
    let bv: Vec<f64> = match b {
        Some(b) => b.to_vec_f64()?,
        None => vec![0.0; cols],
    };
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
                    let mu = lane_sum(xr, |v| v) / cols as f64;
                    let var = lane_sum(xr, |v| (v - mu) * (v - mu)) / cols as f64;
                    let rs = 1.0 / (var + eps).sqrt();
                    // Round statistics to f32 first (as PyTorch stores them) so forward and
                    // backward use the same values.
                    let (muf, rsf) = (mu as f32 as f64, rs as f32 as f64);
                    for (((o, &v), &w), &b) in yr.iter_mut().zip(xr).zip(wv).zip(bv) {
                        *o = T::from_f64((T::acc_to_f64(v.to_acc()) - muf) * rsf * w + b);
                    }
                    // SAFETY: element r of the [rows] statistics buffers belongs to this task.
                    unsafe {
                        *mp.0.add(r) = muf as f32;
                        *rp.0.add(r) = rsf as f32;
                    }
                }
            },
        );
    });
    Ok(())
}
