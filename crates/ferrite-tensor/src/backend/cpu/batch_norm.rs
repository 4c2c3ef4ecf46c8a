//! CPU batch norm: two passes over `x [N, C, S]`, both parallel over the `N·C` planes.
//!
//! Forward: pass 1 sums each plane (Σx, Σx² in f64; a channel's statistics combine its `N` plane
//! partials in a fixed order, so results do not depend on the thread count); pass 2 writes
//! `y = x·a[c] + b[c]` with `a = invstd·w`, `b = bias - mean·a` folded per channel. Backward has
//! the same shape: plane partials of Σdy and Σdy·(x - mean), then `dx = dy·p[c] + x·q[c] + r[c]`
//! in one pass. The statistics used are the ones stored (rounded to the statistics dtype), so
//! forward and backward agree.

use super::channel_vectors::{read, rounded, write};
use crate::backend::{BatchNormArgs, BatchNormBackwardArgs, BatchNormBackwardParams, BatchNormStats, ncs};
use crate::element::Float;
use crate::error::Result;
use crate::kernels::strided::{SendPtr, par_ranges};
use crate::{Tensor, dispatch_float};

pub(super) fn batch_norm(args: &BatchNormArgs<'_>) -> Result<()> {
    dispatch_float!(args.x.dtype(), "batch_norm", T => forward::<T>(args))
}

pub(super) fn batch_norm_backward(args: &BatchNormBackwardArgs<'_>) -> Result<()> {
    dispatch_float!(args.x.dtype(), "batch_norm_backward", T => backward::<T>(args))
}

/// `f(plane) -> [f64; 2]` for every plane of `[planes, s]`, in parallel.
fn plane_partials(planes: usize, s: usize, f: impl Fn(usize) -> [f64; 2] + Sync) -> Vec<[f64; 2]> {
    let mut out = vec![[0.0; 2]; planes];
    let op = SendPtr(out.as_mut_ptr());
    par_ranges(planes, s.max(1) * 2, |start, end| {
        let op = op;
        for p in start..end {
            // SAFETY: element p of `out` (length `planes`) is written by this task only; `out`
            // outlives the parallel section.
            unsafe { *op.0.add(p) = f(p) };
        }
    });
    out
}

/// Sum the plane partials of each channel over the batch (`n` then channel order is fixed).
fn per_channel(partials: &[[f64; 2]], n: usize, c: usize) -> Vec<[f64; 2]> {
    let mut out = vec![[0.0; 2]; c];
    for ni in 0..n {
        for (ci, o) in out.iter_mut().enumerate() {
            let p = partials[ni * c + ci];
            o[0] += p[0];
            o[1] += p[1];
        }
    }
    out
}

/// The plane `p` of a contiguous `[planes, s]` buffer.
///
/// # Safety
/// `base` points to at least `(p + 1)·s` initialised elements that live for `'a`.
unsafe fn plane<'a, T>(base: SendPtr<T>, p: usize, s: usize) -> &'a [T] {
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts(base.0.add(p * s), s) }
}

/// One parallel pass over the planes of the contiguous `out [planes, s]`: `f(p, out_plane)`.
fn write_planes<T: Float>(
    out: &Tensor,
    planes: usize,
    s: usize,
    op: &'static str,
    f: impl Fn(usize, &mut [T]) + Sync,
) -> Result<()> {
    let yp = SendPtr(out.ptr::<T>(op)?);
    par_ranges(planes, s.max(1), |start, end| {
        let yp = yp;
        for p in start..end {
            // SAFETY: plane p of the contiguous output `[planes, s]` belongs to this task only.
            let yr = unsafe { std::slice::from_raw_parts_mut(yp.0.add(p * s), s) };
            f(p, yr);
        }
    });
    Ok(())
}

fn forward<T: Float>(args: &BatchNormArgs<'_>) -> Result<()> {
    let BatchNormArgs { y, x, mean, rstd: invstd, weight, bias, params: stats } = *args;
    let (n, c, s) = ncs(x);
    let planes = n * c;
    if planes == 0 && !matches!(stats, BatchNormStats::Batch { .. }) {
        return Ok(());
    }
    let xp = SendPtr(x.ptr::<T>("batch_norm")?);
    let (mu, is): (Vec<f64>, Vec<f64>) = match stats {
        BatchNormStats::Given => (read(Some(mean))?.unwrap_or_default(), read(Some(invstd))?.unwrap_or_default()),
        BatchNormStats::Batch { eps, running } => {
            let partials = plane_partials(planes, s, |p| {
                // SAFETY: plane p of the contiguous input [planes, s].
                let xr = unsafe { plane(xp, p, s) };
                let (mut sum, mut sq) = (0f64, 0f64);
                for &v in xr {
                    let v = T::acc_to_f64(v.to_acc());
                    sum += v;
                    sq += v * v;
                }
                [sum, sq]
            });
            let count = (n * s) as f64;
            let mut mu = Vec::with_capacity(c);
            let mut is = Vec::with_capacity(c);
            let mut var_unbiased = Vec::with_capacity(c);
            for [sum, sq] in per_channel(&partials, n, c) {
                let m = sum / count;
                let var = (sq / count - m * m).max(0.0);
                mu.push(rounded(mean, m));
                is.push(rounded(invstd, 1.0 / (var + eps).sqrt()));
                var_unbiased.push(if count > 1.0 { var * count / (count - 1.0) } else { f64::NAN });
            }
            write(mean, &mu, "batch_norm")?;
            write(invstd, &is, "batch_norm")?;
            if let Some(r) = running {
                let f = r.factor;
                let rm: Vec<f64> = read(Some(r.mean))?.unwrap_or_default();
                let rv: Vec<f64> = read(Some(r.var))?.unwrap_or_default();
                let new_m: Vec<f64> = rm.iter().zip(&mu).map(|(&old, &b)| (1.0 - f) * old + f * b).collect();
                let new_v: Vec<f64> = rv.iter().zip(&var_unbiased).map(|(&old, &b)| (1.0 - f) * old + f * b).collect();
                write(r.mean, &new_m, "batch_norm")?;
                write(r.var, &new_v, "batch_norm")?;
            }
            (mu, is)
        }
    };
    if planes == 0 || s == 0 {
        return Ok(());
    }
    let w = read(weight)?;
    let b = read(bias)?;
    // y = x·a + b folded per channel.
    let scale: Vec<f64> = (0..c).map(|ci| is[ci] * w.as_ref().map_or(1.0, |w| w[ci])).collect();
    let shift: Vec<f64> = (0..c).map(|ci| b.as_ref().map_or(0.0, |b| b[ci]) - mu[ci] * scale[ci]).collect();
    write_planes::<T>(y, planes, s, "batch_norm", |p, yr| {
        let ci = p % c;
        let (a, sh) = (T::acc_from_f64(scale[ci]), T::acc_from_f64(shift[ci]));
        // SAFETY: plane p of the contiguous input [planes, s].
        let xr = unsafe { plane(xp, p, s) };
        for (o, &v) in yr.iter_mut().zip(xr) {
            *o = T::from_acc(v.to_acc() * a + sh);
        }
    })
}

fn backward<T: Float>(args: &BatchNormBackwardArgs<'_>) -> Result<()> {
    let BatchNormBackwardArgs {
        grad_input,
        grad_weight,
        grad_bias,
        grad_output,
        x,
        mean,
        rstd: invstd,
        weight,
        params: BatchNormBackwardParams { batch_stats },
    } = *args;
    let (n, c, s) = ncs(x);
    let planes = n * c;
    let mu = read(Some(mean))?.unwrap_or_default();
    let is = read(Some(invstd))?.unwrap_or_default();
    let w = read(weight)?;
    let xp = SendPtr(x.ptr::<T>("batch_norm_backward")?);
    let gp = SendPtr(grad_output.ptr::<T>("batch_norm_backward")?);
    let need_sums = grad_weight.is_some() || grad_bias.is_some() || (batch_stats && grad_input.is_some());
    let sums = if need_sums {
        let partials = plane_partials(planes, s, |p| {
            let m = mu[p % c];
            // SAFETY: plane p of the contiguous [planes, s] input and gradient.
            let (xr, gr) = unsafe { (plane(xp, p, s), plane(gp, p, s)) };
            let (mut sdy, mut sdx) = (0f64, 0f64);
            for (&g, &v) in gr.iter().zip(xr) {
                let g = T::acc_to_f64(g.to_acc());
                sdy += g;
                sdx += g * (T::acc_to_f64(v.to_acc()) - m);
            }
            [sdy, sdx]
        });
        per_channel(&partials, n, c)
    } else {
        vec![[0.0; 2]; c]
    };
    if let Some(gw) = grad_weight {
        let v: Vec<f64> = (0..c).map(|ci| sums[ci][1] * is[ci]).collect();
        write(gw, &v, "batch_norm_backward")?;
    }
    if let Some(gb) = grad_bias {
        let v: Vec<f64> = sums.iter().map(|s| s[0]).collect();
        write(gb, &v, "batch_norm_backward")?;
    }
    let Some(gi) = grad_input else { return Ok(()) };
    if planes == 0 || s == 0 {
        return Ok(());
    }
    let count = (n * s) as f64;
    // dx = (dy - mean_dy - (x - mean)·k)·invstd·w = dy·p + (x - mean)·q + r per channel.
    let coef: Vec<[f64; 4]> = (0..c)
        .map(|ci| {
            let p = is[ci] * w.as_ref().map_or(1.0, |w| w[ci]);
            if !batch_stats {
                return [p, 0.0, 0.0, mu[ci]];
            }
            let mean_dy = sums[ci][0] / count;
            let k = sums[ci][1] * is[ci] * is[ci] / count;
            [p, -k * p, -mean_dy * p, mu[ci]]
        })
        .collect();
    write_planes::<T>(gi, planes, s, "batch_norm_backward", |pl, out| {
        let [p, q, r, m] = coef[pl % c].map(T::acc_from_f64);
        // SAFETY: plane pl of the contiguous [planes, s] input and gradient.
        let (xr, gr) = unsafe { (plane(xp, pl, s), plane(gp, pl, s)) };
        for ((o, &g), &v) in out.iter_mut().zip(gr).zip(xr) {
            *o = T::from_acc(g.to_acc() * p + (v.to_acc() - m) * q + r);
        }
    })
}
