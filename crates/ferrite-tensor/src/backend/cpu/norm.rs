//! CPU layer normalisation: one pass per row for the statistics (in f64), one for the output.

use crate::backend::{LayerNormArgs, rows_cols};
use crate::error::Result;
use crate::kernels::strided::{SendPtr, par_ranges};

pub(super) fn layer_norm(args: &LayerNormArgs<'_>) -> Result<()> {
    crate::dispatch_float!(args.x.dtype(), "layer_norm", T => k::<T>(args))
}

fn k<T: crate::element::Float>(args: &LayerNormArgs<'_>) -> Result<()> {
    let LayerNormArgs { y, mean, rstd, x, weight: w, bias: b, eps } = *args;
    let (rows, cols) = rows_cols(x);
    let xp = SendPtr(x.ptr::<T>("layer_norm")?);
    let yp = SendPtr(y.ptr::<T>("layer_norm")?);
    let mp = SendPtr(mean.ptr::<f32>("layer_norm")?);
    let rp = SendPtr(rstd.ptr::<f32>("layer_norm")?);
    let wv: Option<Vec<f64>> = w.map(|w| w.to_vec_f64()).transpose()?;
    let bv: Option<Vec<f64>> = b.map(|b| b.to_vec_f64()).transpose()?;
    par_ranges(rows, cols * 4, |s, e| {
        let (xp, yp, mp, rp) = (xp, yp, mp, rp);
        for r in s..e {
            // SAFETY: row r of contiguous [rows, cols] buffers, rows disjoint per task.
            let (xr, yr) = unsafe {
                (
                    std::slice::from_raw_parts(xp.0.add(r * cols), cols),
                    std::slice::from_raw_parts_mut(yp.0.add(r * cols), cols),
                )
            };
            let mut sum = 0f64;
            for &v in xr {
                sum += T::acc_to_f64(v.to_acc());
            }
            let mu = sum / cols as f64;
            let mut ss = 0f64;
            for &v in xr {
                let d = T::acc_to_f64(v.to_acc()) - mu;
                ss += d * d;
            }
            let var = ss / cols as f64;
            let rs = 1.0 / (var + eps).sqrt();
            // Round statistics to f32 first (as PyTorch stores them) so forward and
            // backward use the same values.
            let (muf, rsf) = (mu as f32 as f64, rs as f32 as f64);
            for (i, (o, &v)) in yr.iter_mut().zip(xr).enumerate() {
                let mut h = (T::acc_to_f64(v.to_acc()) - muf) * rsf;
                if let Some(w) = &wv {
                    h *= w[i];
                }
                if let Some(b) = &bv {
                    h += b[i];
                }
                *o = T::from_f64(h);
            }
            // SAFETY: element r of the [rows] statistics buffers belongs to this task.
            unsafe {
                *mp.0.add(r) = muf as f32;
                *rp.0.add(r) = rsf as f32;
            }
        }
    });
    Ok(())
}
