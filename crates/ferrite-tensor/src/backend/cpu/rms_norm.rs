//! CPU RMS norm: one task per block of rows — Σx² in f64, `rstd` rounded to its dtype, then the
//! scaled row — and for backward one pass per row for `dx` plus one pass per block of columns
//! for `grad_weight` (each column's sum over rows in a fixed order, so no partials to combine).

use super::channel_vectors::{read, rounded, write};
use crate::backend::{RmsNormArgs, RmsNormBackwardArgs, rows_cols};
use crate::dispatch_float;
use crate::element::Float;
use crate::error::Result;
use crate::kernels::strided::{SendPtr, par_ranges};

pub(super) fn rms_norm(args: &RmsNormArgs<'_>) -> Result<()> {
    dispatch_float!(args.x.dtype(), "rms_norm", T => forward::<T>(args))
}

pub(super) fn rms_norm_backward(args: &RmsNormBackwardArgs<'_>) -> Result<()> {
    dispatch_float!(args.x.dtype(), "rms_norm_backward", T => backward::<T>(args))
}

fn forward<T: Float>(args: &RmsNormArgs<'_>) -> Result<()> {
    let RmsNormArgs { y, rstd, x, weight, eps } = *args;
    let (rows, cols) = rows_cols(x);
    if rows == 0 {
        return Ok(());
    }
    let w = read(weight)?;
    let xp = SendPtr(x.ptr::<T>("rms_norm")?);
    let yp = SendPtr(y.ptr::<T>("rms_norm")?);
    let mut rs = vec![0f64; rows];
    let rp = SendPtr(rs.as_mut_ptr());
    par_ranges(rows, cols.max(1) * 3, |start, end| {
        let (xp, yp, rp) = (xp, yp, rp);
        for r in start..end {
            // SAFETY: row r of the contiguous [rows, cols] x and y, element r of `rs`; the
            // written ones belong to this task only.
            let (xr, yr) = unsafe {
                (
                    std::slice::from_raw_parts(xp.0.add(r * cols), cols),
                    std::slice::from_raw_parts_mut(yp.0.add(r * cols), cols),
                )
            };
            let sq: f64 = xr.iter().map(|&v| T::acc_to_f64(v.to_acc()).powi(2)).sum();
            let inv = rounded(rstd, 1.0 / (sq / cols.max(1) as f64 + eps).sqrt());
            // SAFETY: see above.
            unsafe { *rp.0.add(r) = inv };
            let a = T::acc_from_f64(inv);
            for (i, (o, &v)) in yr.iter_mut().zip(xr).enumerate() {
                // PyTorch rounds the normalised value to the input dtype before the weight.
                let h = T::from_acc(v.to_acc() * a);
                *o = match &w {
                    Some(w) => T::from_acc(h.to_acc() * T::acc_from_f64(w[i])),
                    None => h,
                };
            }
        }
    });
    write(rstd, &rs, "rms_norm")
}

fn backward<T: Float>(args: &RmsNormBackwardArgs<'_>) -> Result<()> {
    let RmsNormBackwardArgs { grad_input, grad_weight, grad_output, x, rstd, weight } = *args;
    let (rows, cols) = rows_cols(x);
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let rs = read(Some(rstd))?.unwrap_or_default();
    let w = read(weight)?;
    let xp = SendPtr(x.ptr::<T>("rms_norm_backward")?);
    let gp = SendPtr(grad_output.ptr::<T>("rms_norm_backward")?);
    if let Some(gi) = grad_input {
        let op = SendPtr(gi.ptr::<T>("rms_norm_backward")?);
        par_ranges(rows, cols * 3, |start, end| {
            let (xp, gp, op) = (xp, gp, op);
            for r in start..end {
                // SAFETY: row r of the contiguous [rows, cols] x, dy and dx; the dx row belongs
                // to this task only.
                let (xr, gr, or) = unsafe {
                    (
                        std::slice::from_raw_parts(xp.0.add(r * cols), cols),
                        std::slice::from_raw_parts(gp.0.add(r * cols), cols),
                        std::slice::from_raw_parts_mut(op.0.add(r * cols), cols),
                    )
                };
                let wi = |i: usize| w.as_ref().map_or(1.0, |w| w[i]);
                let mut dot = 0f64;
                for (i, (&g, &v)) in gr.iter().zip(xr).enumerate() {
                    dot += T::acc_to_f64(g.to_acc()) * wi(i) * T::acc_to_f64(v.to_acc());
                }
                let inv = rs[r];
                let k = T::acc_from_f64(inv * inv * inv * dot / cols as f64);
                let a = T::acc_from_f64(inv);
                for (i, ((o, &g), &v)) in or.iter_mut().zip(gr).zip(xr).enumerate() {
                    let gw = g.to_acc() * T::acc_from_f64(wi(i));
                    *o = T::from_acc(a * gw - v.to_acc() * k);
                }
            }
        });
    }
    if let Some(gw) = grad_weight {
        let mut acc = vec![0f64; cols];
        let ap = SendPtr(acc.as_mut_ptr());
        par_ranges(cols, rows * 2, |c0, c1| {
            let (xp, gp, ap) = (xp, gp, ap);
            for (r, &inv) in rs.iter().enumerate().take(rows) {
                // SAFETY: columns [c0, c1) of row r of the contiguous [rows, cols] x and dy, and
                // of `acc`, which this task alone writes.
                let (xr, gr, ar) = unsafe {
                    (
                        std::slice::from_raw_parts(xp.0.add(r * cols + c0), c1 - c0),
                        std::slice::from_raw_parts(gp.0.add(r * cols + c0), c1 - c0),
                        std::slice::from_raw_parts_mut(ap.0.add(c0), c1 - c0),
                    )
                };
                for ((a, &g), &v) in ar.iter_mut().zip(gr).zip(xr) {
                    *a += T::acc_to_f64(g.to_acc()) * T::acc_to_f64(v.to_acc()) * inv;
                }
            }
        });
        write(gw, &acc, "rms_norm_backward")?;
    }
    Ok(())
}
