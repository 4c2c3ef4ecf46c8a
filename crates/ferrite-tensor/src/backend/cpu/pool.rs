//! CPU 2-D pooling: every kernel is one pass over its planes (`P = N·C` of them, in parallel),
//! with the windows of [`Pool2d`] (PyTorch's arithmetic, `backend/pool_window.rs`).
//!
//! Max pooling keeps PyTorch's rule for ties and NaN (`val > max || isnan(val)`: the first
//! maximum, or the last NaN) and writes the winner's position `h·W + w`. The backward passes
//! scatter each output gradient into its plane (the window, or the saved position), accumulating
//! in the compute type; planes are independent, so no two tasks ever touch the same element.

use num_traits::Float as _;

use crate::backend::{Pool2d, PoolKind};
use crate::element::Float;
use crate::error::Result;
use crate::kernels::strided::{SendPtr, par_ranges};
use crate::{Tensor, dispatch_float};

pub(super) fn max_pool2d(out: &Tensor, indices: &Tensor, x: &Tensor, pool: &Pool2d) -> Result<()> {
    dispatch_float!(x.dtype(), "max_pool2d", T => max_forward::<T>(out, indices, x, pool))
}

pub(super) fn max_pool2d_backward(gi: &Tensor, go: &Tensor, indices: &Tensor, pool: &Pool2d) -> Result<()> {
    dispatch_float!(gi.dtype(), "max_pool2d_backward", T => max_backward::<T>(gi, go, indices, pool))
}

pub(super) fn avg_pool2d(out: &Tensor, x: &Tensor, pool: &Pool2d) -> Result<()> {
    dispatch_float!(x.dtype(), "avg_pool2d", T => avg_forward::<T>(out, x, pool))
}

pub(super) fn avg_pool2d_backward(gi: &Tensor, go: &Tensor, pool: &Pool2d) -> Result<()> {
    dispatch_float!(gi.dtype(), "avg_pool2d_backward", T => avg_backward::<T>(gi, go, pool))
}

/// Planes of the input (`[P, H, W]`) and their element counts in and out.
fn sizes(x_or_gi: &Tensor, pool: &Pool2d) -> (usize, usize, usize) {
    let plane_in = pool.input[0] * pool.input[1];
    let plane_out = pool.output[0] * pool.output[1];
    let planes = x_or_gi.numel().checked_div(plane_in).unwrap_or(0);
    (planes, plane_in, plane_out)
}

/// Window taps per output (the cost estimate of a pass).
fn taps(pool: &Pool2d) -> usize {
    match pool.kind {
        PoolKind::Max { kernel, .. } | PoolKind::Avg { kernel, .. } => kernel[0] * kernel[1],
        PoolKind::AdaptiveAvg => {
            pool.input[0].div_ceil(pool.output[0].max(1)) * pool.input[1].div_ceil(pool.output[1].max(1))
        }
    }
}

fn max_forward<T: Float>(out: &Tensor, indices: &Tensor, x: &Tensor, pool: &Pool2d) -> Result<()> {
    let (planes, pin, pout) = sizes(x, pool);
    if planes == 0 || pout == 0 {
        return Ok(());
    }
    let [_, w] = pool.input;
    let [oh_n, ow_n] = pool.output;
    let xp = SendPtr(x.ptr::<T>("max_pool2d")?);
    let op = SendPtr(out.ptr::<T>("max_pool2d")?);
    let ip = SendPtr(indices.ptr::<i64>("max_pool2d")?);
    par_ranges(planes, pout * taps(pool), |start, end| {
        let (xp, op, ip) = (xp, op, ip);
        for p in start..end {
            // SAFETY: plane p of the contiguous input [P, H, W] and outputs [P, OH, OW]; the
            // output planes belong to this task only.
            let (xr, or, ir) = unsafe {
                (
                    std::slice::from_raw_parts(xp.0.add(p * pin), pin),
                    std::slice::from_raw_parts_mut(op.0.add(p * pout), pout),
                    std::slice::from_raw_parts_mut(ip.0.add(p * pout), pout),
                )
            };
            for oh in 0..oh_n {
                let (h0, dh, h1) = pool.max_taps(0, oh);
                for ow in 0..ow_n {
                    let (w0, dw, w1) = pool.max_taps(1, ow);
                    let mut best = T::acc_from_f64(f64::NEG_INFINITY);
                    let mut at = h0 * w + w0;
                    for hh in (h0..h1).step_by(dh) {
                        for ww in (w0..w1).step_by(dw) {
                            let v = xr[hh * w + ww].to_acc();
                            if v > best || v.is_nan() {
                                best = v;
                                at = hh * w + ww;
                            }
                        }
                    }
                    or[oh * ow_n + ow] = T::from_acc(best);
                    ir[oh * ow_n + ow] = at as i64;
                }
            }
        }
    });
    Ok(())
}

fn max_backward<T: Float>(gi: &Tensor, go: &Tensor, indices: &Tensor, pool: &Pool2d) -> Result<()> {
    let (planes, pin, pout) = sizes(gi, pool);
    if planes == 0 || pin == 0 {
        return Ok(());
    }
    let gip = SendPtr(gi.ptr::<T>("max_pool2d_backward")?);
    let gop = SendPtr(go.ptr::<T>("max_pool2d_backward")?);
    let ip = SendPtr(indices.ptr::<i64>("max_pool2d_backward")?);
    par_ranges(planes, pin + pout, |start, end| {
        let (gip, gop, ip) = (gip, gop, ip);
        let mut acc = vec![T::acc_from_f64(0.0); pin];
        for p in start..end {
            // SAFETY: plane p of the contiguous gradients [P, H, W] / [P, OH, OW] and indices;
            // the grad_input plane belongs to this task only.
            let (gr, ir, out) = unsafe {
                (
                    std::slice::from_raw_parts(gop.0.add(p * pout), pout),
                    std::slice::from_raw_parts(ip.0.add(p * pout), pout),
                    std::slice::from_raw_parts_mut(gip.0.add(p * pin), pin),
                )
            };
            acc.fill(T::acc_from_f64(0.0));
            for (&g, &i) in gr.iter().zip(ir) {
                // Indices come from the forward; one outside the plane is skipped, not trusted.
                if let Some(a) = usize::try_from(i).ok().and_then(|i| acc.get_mut(i)) {
                    *a += g.to_acc();
                }
            }
            for (o, &a) in out.iter_mut().zip(&acc) {
                *o = T::from_acc(a);
            }
        }
    });
    Ok(())
}

fn avg_forward<T: Float>(out: &Tensor, x: &Tensor, pool: &Pool2d) -> Result<()> {
    let (planes, pin, pout) = sizes(x, pool);
    if planes == 0 || pout == 0 {
        return Ok(());
    }
    let [_, w] = pool.input;
    let [oh_n, ow_n] = pool.output;
    let xp = SendPtr(x.ptr::<T>("avg_pool2d")?);
    let op = SendPtr(out.ptr::<T>("avg_pool2d")?);
    par_ranges(planes, pout * taps(pool), |start, end| {
        let (xp, op) = (xp, op);
        for p in start..end {
            // SAFETY: plane p of the contiguous input [P, H, W] and output [P, OH, OW]; the
            // output plane belongs to this task only.
            let (xr, or) = unsafe {
                (
                    std::slice::from_raw_parts(xp.0.add(p * pin), pin),
                    std::slice::from_raw_parts_mut(op.0.add(p * pout), pout),
                )
            };
            for oh in 0..oh_n {
                for ow in 0..ow_n {
                    let win = pool.avg_window(oh, ow);
                    // An empty window (only padding) gives 0, as PyTorch.
                    if win.h0 >= win.h1 || win.w0 >= win.w1 || win.divisor == 0 {
                        or[oh * ow_n + ow] = T::from_f64(0.0);
                        continue;
                    }
                    let mut sum = 0f64;
                    for hh in win.h0..win.h1 {
                        for &v in &xr[hh * w + win.w0..hh * w + win.w1] {
                            sum += T::acc_to_f64(v.to_acc());
                        }
                    }
                    or[oh * ow_n + ow] = T::from_f64(sum / win.divisor as f64);
                }
            }
        }
    });
    Ok(())
}

fn avg_backward<T: Float>(gi: &Tensor, go: &Tensor, pool: &Pool2d) -> Result<()> {
    let (planes, pin, pout) = sizes(gi, pool);
    if planes == 0 || pin == 0 {
        return Ok(());
    }
    let [_, w] = pool.input;
    let [oh_n, ow_n] = pool.output;
    let gip = SendPtr(gi.ptr::<T>("avg_pool2d_backward")?);
    let gop = SendPtr(go.ptr::<T>("avg_pool2d_backward")?);
    par_ranges(planes, pin + pout * taps(pool), |start, end| {
        let (gip, gop) = (gip, gop);
        let mut acc = vec![0f64; pin];
        for p in start..end {
            // SAFETY: plane p of the contiguous gradients [P, H, W] / [P, OH, OW]; the
            // grad_input plane belongs to this task only.
            let (gr, out) = unsafe {
                (
                    std::slice::from_raw_parts(gop.0.add(p * pout), pout),
                    std::slice::from_raw_parts_mut(gip.0.add(p * pin), pin),
                )
            };
            acc.fill(0.0);
            for oh in 0..oh_n {
                for ow in 0..ow_n {
                    let win = pool.avg_window(oh, ow);
                    if win.h0 >= win.h1 || win.w0 >= win.w1 || win.divisor == 0 {
                        continue;
                    }
                    let g = T::acc_to_f64(gr[oh * ow_n + ow].to_acc()) / win.divisor as f64;
                    for hh in win.h0..win.h1 {
                        for a in &mut acc[hh * w + win.w0..hh * w + win.w1] {
                            *a += g;
                        }
                    }
                }
            }
            for (o, &a) in out.iter_mut().zip(&acc) {
                *o = T::from_f64(a);
            }
        }
    });
    Ok(())
}
