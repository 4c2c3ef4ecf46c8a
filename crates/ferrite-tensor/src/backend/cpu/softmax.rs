//! CPU softmax and log-softmax over the last dimension of contiguous rows, in independent lanes
//! so the row loops vectorise.

use num_traits::{Float as _, One, Zero};

use crate::backend::rows_cols;
use crate::element::{AccFloat, Float};
use crate::error::Result;
use crate::kernels::simd::{pairwise_fold, vectorize};
use crate::kernels::strided::{SendPtr, par_ranges};
use crate::{Tensor, dispatch_float};

pub(super) fn softmax(out: &Tensor, x: &Tensor, log: bool) -> Result<()> {
    let (rows, cols) = rows_cols(x);
    dispatch_float!(x.dtype(), "softmax", T => rows_kernel::<T>(x, out, rows, cols, #[inline(always)] move |a, b| softmax_row::<T>(a, b, log)))
}

pub(super) fn softmax_backward(out: &Tensor, g: &Tensor, y: &Tensor, log: bool) -> Result<()> {
    let (rows, cols) = rows_cols(g);
    dispatch_float!(g.dtype(), "softmax_backward", T => backward_kernel::<T>(g, y, out, rows, cols, log))
}

/// Apply `f(row_in, row_out)` to every row of a contiguous `[rows, cols]` pair of buffers.
fn rows_kernel<T: Float>(
    x: &Tensor,
    out: &Tensor,
    rows: usize,
    cols: usize,
    f: impl Fn(&[T], &mut [T]) + Sync + Send,
) -> Result<()> {
    let xp = SendPtr(x.ptr::<T>("softmax")?);
    let op = SendPtr(out.ptr::<T>("softmax")?);
    par_ranges(rows, cols * 8, |s, e| {
        let (xp, op) = (xp, op);
        vectorize(
            #[inline(always)]
            || {
                for r in s..e {
                    // SAFETY: row r of two contiguous [rows, cols] buffers; rows are disjoint per task.
                    let (xi, oi) = unsafe {
                        (
                            std::slice::from_raw_parts(xp.0.add(r * cols), cols),
                            std::slice::from_raw_parts_mut(op.0.add(r * cols), cols),
                        )
                    };
                    f(xi, oi);
                }
            },
        )
    });
    Ok(())
}

const LANES: usize = 16;

/// Maximum of a row's non-NaN elements (-inf if none), in independent lanes so it vectorises
/// (one `max` instruction per vector).
///
/// NaN needs no test here: a NaN element makes its `exp(x - m)` NaN, so the row's sum and every
/// output of the row are NaN — PyTorch's result — whatever `m` is.
#[inline(always)]
fn row_max<T: Float>(x: &[T]) -> T::Acc {
    let mut lanes = [T::Acc::neg_infinity(); LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for ch in chunks {
        for k in 0..LANES {
            let v = ch[k].to_acc();
            lanes[k] = if v > lanes[k] { v } else { lanes[k] };
        }
    }
    // Pairwise across the lanes (vector maxima, not a scalar chain of 16 compares per row: on
    // the [65536, 64] rows that chain cost as much as the row's own loads), then the tail.
    let mut m = pairwise_fold(lanes, |a, b| if b > a { b } else { a });
    for v in rest.iter().map(|v| v.to_acc()) {
        if v > m {
            m = v;
        }
    }
    m
}

/// Σ of the lanes, pairwise (vector additions, not a scalar chain of 16 per row).
#[inline(always)]
fn fold_lanes<A: AccFloat>(lanes: [A; LANES]) -> A {
    pairwise_fold(lanes, |a, b| a + b)
}

/// Σ exp(x - m) in lanes.
#[inline(always)]
fn sum_exp<T: Float>(x: &[T], m: T::Acc) -> T::Acc {
    let mut lanes = [T::Acc::zero(); LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for ch in chunks {
        for k in 0..LANES {
            lanes[k] += (ch[k].to_acc() - m).vexp_nonpositive();
        }
    }
    let mut s = T::Acc::zero();
    for v in rest {
        s += (v.to_acc() - m).vexp_nonpositive();
    }
    fold_lanes(lanes) + s
}

#[inline(always)]
fn softmax_row<T: Float>(x: &[T], out: &mut [T], log: bool) {
    let m = row_max(x);
    let m = if m.is_infinite() && m < T::Acc::zero() { T::Acc::zero() } else { m };
    let full_precision = std::mem::size_of::<T>() == std::mem::size_of::<T::Acc>();
    if log {
        // The exponentials go through `out` (overwritten below) where it holds them exactly:
        // the same sum, from [`exp_into`]'s two short loops.
        let lse = if full_precision { exp_into(x, out, m) } else { sum_exp(x, m) }.ln();
        for (o, &v) in out.iter_mut().zip(x) {
            *o = T::from_acc(v.to_acc() - m - lse);
        }
    } else if full_precision {
        // Full-precision rows: exp once, into the output, then scale (one exp per element
        // instead of two; the row is still in cache for the second pass).
        let s = exp_into(x, out, m);
        let inv = T::Acc::one() / s;
        for o in out.iter_mut() {
            *o = T::from_acc(o.to_acc() * inv);
        }
    } else {
        // Half-precision rows: storing exp(x - m) in 16 bits before scaling would round twice.
        let inv = T::Acc::one() / sum_exp(x, m);
        for (o, &v) in out.iter_mut().zip(x) {
            *o = T::from_acc((v.to_acc() - m).vexp_nonpositive() * inv);
        }
    }
}

/// out = exp(x - m), returning Σ out, in lanes.
///
/// Two loops, not one: with the sum in the exponential's loop, the loop body (the whole
/// polynomial) was too large to unroll over the 16 lanes, so the lanes lived on the stack and
/// every vector of the row waited on a store and a reload of its accumulator. The second loop
/// re-reads the row from L1; for full-precision rows (the only ones that come here) `out`
/// holds `e` exactly, so the sum and its order are unchanged.
#[inline(always)]
fn exp_into<T: Float>(x: &[T], out: &mut [T], m: T::Acc) -> T::Acc {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = T::from_acc((v.to_acc() - m).vexp_nonpositive());
    }
    let mut lanes = [T::Acc::zero(); LANES];
    let chunks = out.chunks_exact(LANES);
    let rest = chunks.remainder();
    for ch in chunks {
        for k in 0..LANES {
            lanes[k] += ch[k].to_acc();
        }
    }
    let mut s = T::Acc::zero();
    for v in rest {
        s += v.to_acc();
    }
    fold_lanes(lanes) + s
}

/// Σ f(x) in lanes.
#[inline(always)]
fn lane_sum<T: Float>(x: &[T], f: impl Fn(T) -> T::Acc) -> T::Acc {
    let mut lanes = [T::Acc::zero(); LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for ch in chunks {
        for k in 0..LANES {
            lanes[k] += f(ch[k]);
        }
    }
    let mut s = fold_lanes(lanes);
    for &v in rest {
        s += f(v);
    }
    s
}

fn backward_kernel<T: Float>(
    gc: &Tensor,
    yc: &Tensor,
    out: &Tensor,
    rows: usize,
    cols: usize,
    log: bool,
) -> Result<()> {
    let gp = SendPtr(gc.ptr::<T>("softmax_backward")?);
    let yp = SendPtr(yc.ptr::<T>("softmax_backward")?);
    let op = SendPtr(out.ptr::<T>("softmax_backward")?);
    par_ranges(rows, cols * 4, |s, e| {
        let (gp, yp, op) = (gp, yp, op);
        vectorize(
            #[inline(always)]
            || {
                for r in s..e {
                    // SAFETY: row r of contiguous [rows, cols] buffers; disjoint rows per task.
                    let (g, y, o) = unsafe {
                        (
                            std::slice::from_raw_parts(gp.0.add(r * cols), cols),
                            std::slice::from_raw_parts(yp.0.add(r * cols), cols),
                            std::slice::from_raw_parts_mut(op.0.add(r * cols), cols),
                        )
                    };
                    if log {
                        let s = lane_sum(g, |v| v.to_acc());
                        for i in 0..cols {
                            o[i] = T::from_acc(g[i].to_acc() - y[i].to_acc().vexp() * s);
                        }
                    } else {
                        let mut lanes = [T::Acc::zero(); LANES];
                        let (gc, yc) = (g.chunks_exact(LANES), y.chunks_exact(LANES));
                        let (gr, yr) = (gc.remainder(), yc.remainder());
                        for (gch, ych) in gc.zip(yc) {
                            for k in 0..LANES {
                                lanes[k] += gch[k].to_acc() * ych[k].to_acc();
                            }
                        }
                        let mut s = fold_lanes(lanes);
                        for (gv, yv) in gr.iter().zip(yr) {
                            s += gv.to_acc() * yv.to_acc();
                        }
                        for i in 0..cols {
                            o[i] = T::from_acc(y[i].to_acc() * (g[i].to_acc() - s));
                        }
                    }
                }
            },
        );
    });
    Ok(())
}
