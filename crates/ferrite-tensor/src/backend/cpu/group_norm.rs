//! CPU group norm (PyTorch's `native_group_norm` and its backward): a group `(n, g)` is the
//! contiguous run of `C/G · S` values of `x [N, C, S]`, so forward is one task per group — its
//! statistics (f64) and then its output, channel by channel with the channel's weight and bias.
//!
//! Backward (PyTorch's formulas): per plane `(n, c)` the sums `ds = Σdy·x` and `db = Σdy`
//! (parallel over the `N·C` planes); per group the coefficients
//! `c2 = (Σ_c db·w · mean - Σ_c ds·w)·rstd³/(D·S)`, `c3 = -c2·mean - Σ_c db·w · rstd/(D·S)` and
//! `dx = rstd·w[c]·dy + c2·x + c3` (parallel over groups); `dw[c] = Σ_n (ds - db·mean)·rstd`,
//! `db[c] = Σ_n db` from the plane sums.

use super::channel_vectors::{read, rounded, write};
use crate::backend::{GroupNormArgs, GroupNormBackwardArgs, GroupNormParams, ncs};
use crate::dispatch_float;
use crate::element::Float;
use crate::error::Result;
use crate::kernels::strided::{SendPtr, par_ranges};

pub(super) fn group_norm(args: &GroupNormArgs<'_>) -> Result<()> {
    dispatch_float!(args.x.dtype(), "group_norm", T => forward::<T>(args))
}

pub(super) fn group_norm_backward(args: &GroupNormBackwardArgs<'_>) -> Result<()> {
    dispatch_float!(args.x.dtype(), "group_norm_backward", T => backward::<T>(args))
}

fn forward<T: Float>(args: &GroupNormArgs<'_>) -> Result<()> {
    let GroupNormArgs { y, mean, rstd, x, weight, bias, params: GroupNormParams { groups, eps } } = *args;
    let (n, c, s) = ncs(x);
    let g = groups.max(1);
    let d = c / g;
    let len = d * s;
    let n_groups = n * g;
    if n_groups == 0 {
        return Ok(());
    }
    let w = read(weight)?;
    let b = read(bias)?;
    let xp = SendPtr(x.ptr::<T>("group_norm")?);
    let yp = SendPtr(y.ptr::<T>("group_norm")?);
    let mut stats = vec![[0f64; 2]; n_groups];
    let sp = SendPtr(stats.as_mut_ptr());
    par_ranges(n_groups, len.max(1) * 3, |start, end| {
        let (xp, yp, sp) = (xp, yp, sp);
        for grp in start..end {
            // SAFETY: group `grp` is the contiguous run [grp·len, (grp+1)·len) of x and y, and
            // element `grp` of `stats`; each belongs to this task only.
            let (xr, yr) = unsafe {
                (
                    std::slice::from_raw_parts(xp.0.add(grp * len), len),
                    std::slice::from_raw_parts_mut(yp.0.add(grp * len), len),
                )
            };
            let (mut sum, mut sq) = (0f64, 0f64);
            for &v in xr {
                let v = T::acc_to_f64(v.to_acc());
                sum += v;
                sq += v * v;
            }
            let cnt = len.max(1) as f64;
            let m = sum / cnt;
            let var = (sq / cnt - m * m).max(0.0);
            let (m, r) = (rounded(mean, m), rounded(rstd, 1.0 / (var + eps).sqrt()));
            // SAFETY: see above.
            unsafe { *sp.0.add(grp) = [m, r] };
            let first = (grp % g) * d;
            for k in 0..d {
                let ch = first + k;
                let a = r * w.as_ref().map_or(1.0, |w| w[ch]);
                let sh = b.as_ref().map_or(0.0, |b| b[ch]) - m * a;
                let (a, sh) = (T::acc_from_f64(a), T::acc_from_f64(sh));
                for (o, &v) in yr[k * s..(k + 1) * s].iter_mut().zip(&xr[k * s..(k + 1) * s]) {
                    *o = T::from_acc(v.to_acc() * a + sh);
                }
            }
        }
    });
    let (mu, rs): (Vec<f64>, Vec<f64>) = stats.iter().map(|&[m, r]| (m, r)).unzip();
    write(mean, &mu, "group_norm")?;
    write(rstd, &rs, "group_norm")
}

fn backward<T: Float>(args: &GroupNormBackwardArgs<'_>) -> Result<()> {
    let GroupNormBackwardArgs {
        grad_input,
        grad_weight,
        grad_bias,
        grad_output,
        x,
        mean,
        rstd,
        weight,
        params: GroupNormParams { groups, .. },
    } = *args;
    let (n, c, s) = ncs(x);
    let g = groups.max(1);
    let d = c / g;
    let planes = n * c;
    let mu = read(Some(mean))?.unwrap_or_default();
    let rs = read(Some(rstd))?.unwrap_or_default();
    let w = read(weight)?;
    let xp = SendPtr(x.ptr::<T>("group_norm_backward")?);
    let gp = SendPtr(grad_output.ptr::<T>("group_norm_backward")?);
    // Plane sums ds = Σ dy·x, db = Σ dy.
    let mut sums = vec![[0f64; 2]; planes];
    let sp = SendPtr(sums.as_mut_ptr());
    par_ranges(planes, s.max(1) * 2, |start, end| {
        let (xp, gp, sp) = (xp, gp, sp);
        for p in start..end {
            // SAFETY: plane p of the contiguous [planes, s] x and dy; element p of `sums` is
            // written by this task only.
            let (xr, gr) = unsafe {
                (std::slice::from_raw_parts(xp.0.add(p * s), s), std::slice::from_raw_parts(gp.0.add(p * s), s))
            };
            let (mut ds, mut db) = (0f64, 0f64);
            for (&gv, &xv) in gr.iter().zip(xr) {
                let gv = T::acc_to_f64(gv.to_acc());
                ds += gv * T::acc_to_f64(xv.to_acc());
                db += gv;
            }
            // SAFETY: see above.
            unsafe { *sp.0.add(p) = [ds, db] };
        }
    });
    let wc = |ch: usize| w.as_ref().map_or(1.0, |w| w[ch]);
    if let Some(gw) = grad_weight {
        let v: Vec<f64> = (0..c)
            .map(|ch| {
                (0..n)
                    .map(|ni| (sums[ni * c + ch][0] - sums[ni * c + ch][1] * mu[ni * g + ch / d]) * rs[ni * g + ch / d])
                    .sum()
            })
            .collect();
        write(gw, &v, "group_norm_backward")?;
    }
    if let Some(gb) = grad_bias {
        let v: Vec<f64> = (0..c).map(|ch| (0..n).map(|ni| sums[ni * c + ch][1]).sum()).collect();
        write(gb, &v, "group_norm_backward")?;
    }
    let Some(gi) = grad_input else { return Ok(()) };
    let len = d * s;
    let n_groups = n * g;
    if n_groups == 0 || len == 0 {
        return Ok(());
    }
    let scale = 1.0 / len as f64;
    let op = SendPtr(gi.ptr::<T>("group_norm_backward")?);
    par_ranges(n_groups, len * 2, |start, end| {
        let (xp, gp, op) = (xp, gp, op);
        for grp in start..end {
            let ni = grp / g;
            let first = (grp % g) * d;
            let (mut ds_w, mut db_w) = (0f64, 0f64);
            for ch in first..first + d {
                ds_w += sums[ni * c + ch][0] * wc(ch);
                db_w += sums[ni * c + ch][1] * wc(ch);
            }
            let (m, r) = (mu[grp], rs[grp]);
            let c2 = (db_w * m - ds_w) * r * r * r * scale;
            let c3 = -c2 * m - db_w * r * scale;
            // SAFETY: group `grp` is the contiguous run [grp·len, (grp+1)·len) of x, dy and dx;
            // the dx run belongs to this task only.
            let (xr, gr, or) = unsafe {
                (
                    std::slice::from_raw_parts(xp.0.add(grp * len), len),
                    std::slice::from_raw_parts(gp.0.add(grp * len), len),
                    std::slice::from_raw_parts_mut(op.0.add(grp * len), len),
                )
            };
            let (c2, c3) = (T::acc_from_f64(c2), T::acc_from_f64(c3));
            for k in 0..d {
                let c1 = T::acc_from_f64(r * wc(first + k));
                let range = k * s..(k + 1) * s;
                for ((o, &gv), &xv) in or[range.clone()].iter_mut().zip(&gr[range.clone()]).zip(&xr[range]) {
                    *o = T::from_acc(c1 * gv.to_acc() + c2 * xv.to_acc() + c3);
                }
            }
        }
    });
    Ok(())
}
