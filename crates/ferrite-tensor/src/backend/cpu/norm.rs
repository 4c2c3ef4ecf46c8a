//! CPU layer normalisation: one pass per row for the mean, one for the variance, one for the
//! output, in the element type's accumulation type (f32 for f32/f16/bf16, as PyTorch's CPU
//! kernel uses `opmath_t`; f64 for f64). The passes run in independent lanes inside
//! [`vectorize`], so they compile to AVX2 / AVX-512 code where the CPU has it. (The passes used
//! to run in f64: half the lanes per vector and a conversion per element, 2.3x PyTorch's time on
//! AVX2.)
//!
//! Backward is one fused kernel too (it used to be ~12 tensor ops — a pass and an allocation
//! each — at 5–10× PyTorch's time on AVX2): tasks of [`ROW_GROUP`] rows; per row one pass for
//! `Σ dy·w` and `Σ dy·w·x̂`, and one that writes `dx` and adds the row into the group's sums of
//! the weight and bias gradients (so x and dy are read from memory once). Each group's sums go to
//! f64 partials, added in group order: the order is fixed by the shape alone, so the bits do not
//! depend on the thread count.

use num_traits::{Float as _, One, Zero};

use super::channel_vectors::{read, write};
use crate::backend::{LayerNormArgs, LayerNormBackwardArgs, LayerNormGrads, LayerNormParams, rows_cols};
use crate::element::Float;
use crate::error::Result;
use crate::kernels::simd::{pairwise_fold, vectorize};
use crate::kernels::strided::{SendPtr, par_ranges};

pub(super) fn layer_norm(args: &LayerNormArgs<'_>) -> Result<()> {
    crate::dispatch_float!(args.x.dtype(), "layer_norm", T => k::<T>(args))
}

pub(super) fn layer_norm_backward(args: &LayerNormBackwardArgs<'_>) -> Result<LayerNormGrads> {
    let grads = args.outputs()?;
    crate::dispatch_float!(args.x.dtype(), "layer_norm_backward", T => backward::<T>(args, &grads))?;
    Ok(grads)
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
    let mut t = pairwise_fold(lanes, |a, b| a + b);
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

/// Rows per task of the backward pass: the weight and bias gradients of a group are summed in
/// the accumulation type, row by row, then kept as the group's f64 partial (added in group
/// order at the end).
const ROW_GROUP: usize = 64;

fn backward<T: Float>(args: &LayerNormBackwardArgs<'_>, grads: &LayerNormGrads) -> Result<()> {
    let LayerNormBackwardArgs { grad_output, x, mean, rstd, weight, .. } = *args;
    let (rows, cols) = rows_cols(x);
    let want_params = grads.weight.is_some() || grads.bias.is_some();
    if cols == 0 || (grads.input.is_none() && !want_params) {
        return Ok(());
    }
    let to_acc = |v: Option<Vec<f64>>| v.unwrap_or_default().into_iter().map(T::acc_from_f64).collect::<Vec<_>>();
    let mu = to_acc(read(Some(mean))?);
    let rs = to_acc(read(Some(rstd))?);
    if mu.len() < rows || rs.len() < rows {
        return Ok(()); // no statistics for these rows: nothing the op layer would hand over
    }
    let wv: Vec<T::Acc> = match weight {
        Some(w) => to_acc(read(Some(w))?),
        None => vec![T::Acc::one(); cols],
    };
    let xp = SendPtr(x.ptr::<T>("layer_norm_backward")?);
    let gp = SendPtr(grad_output.ptr::<T>("layer_norm_backward")?);
    let op = match &grads.input {
        Some(gi) => Some(SendPtr(gi.ptr::<T>("layer_norm_backward")?)),
        None => None,
    };
    let inv_n = T::Acc::one() / T::acc_from_f64(cols as f64);
    let groups = rows.div_ceil(ROW_GROUP);
    // Per row group, the f64 partials of Σ dy·x̂ and Σ dy (empty when not asked for).
    let plen = if want_params { groups * cols } else { 0 };
    let (mut pw, mut pb) = (vec![0f64; plen], vec![0f64; plen]);
    let (wp, bp) = (SendPtr(pw.as_mut_ptr()), SendPtr(pb.as_mut_ptr()));
    let (mu, rs, wv) = (&mu, &rs, &wv[..cols]);
    par_ranges(groups, ROW_GROUP.min(rows) * cols * 8, |g0, g1| {
        let (xp, gp, wp, bp) = (xp, gp, wp, bp);
        let (mut sw, mut sb) = if want_params {
            (vec![T::Acc::zero(); cols], vec![T::Acc::zero(); cols])
        } else {
            (Vec::new(), Vec::new())
        };
        for group in g0..g1 {
            sw.fill(T::Acc::zero());
            sb.fill(T::Acc::zero());
            let (sw, sb) = (&mut sw[..], &mut sb[..]);
            vectorize(
                #[inline(always)]
                || {
                    let (start, end) = (group * ROW_GROUP, ((group + 1) * ROW_GROUP).min(rows));
                    // SAFETY: rows start..end of the contiguous [rows, cols] x and dy (read only).
                    let (xs, gs) = unsafe {
                        (
                            std::slice::from_raw_parts(xp.0.add(start * cols), (end - start) * cols),
                            std::slice::from_raw_parts(gp.0.add(start * cols), (end - start) * cols),
                        )
                    };
                    let row = |r: usize| -> (&[T], &[T]) {
                        let span = (r - start) * cols..(r - start + 1) * cols;
                        (&xs[span.clone()], &gs[span])
                    };
                    let mut r = start;
                    while r < end {
                        match op {
                            Some(op) if want_params && r + 4 <= end => {
                                // Four rows at a time: the weight and bias sums are read and
                                // written once per four rows (they are `cols` wide: on wide rows
                                // they left the L1 cache and cost as much as dx itself).
                                let (x0, g0) = row(r);
                                let (x1, g1) = row(r + 1);
                                let (x2, g2) = row(r + 2);
                                let (x3, g3) = row(r + 3);
                                let st = [
                                    row_stats::<T>(x0, g0, wv, mu[r], rs[r], inv_n),
                                    row_stats::<T>(x1, g1, wv, mu[r + 1], rs[r + 1], inv_n),
                                    row_stats::<T>(x2, g2, wv, mu[r + 2], rs[r + 2], inv_n),
                                    row_stats::<T>(x3, g3, wv, mu[r + 3], rs[r + 3], inv_n),
                                ];
                                // SAFETY: rows r..r+4 of dx belong to this task only, and are disjoint.
                                let (o0, o1, o2, o3) = unsafe {
                                    (
                                        std::slice::from_raw_parts_mut(op.0.add(r * cols), cols),
                                        std::slice::from_raw_parts_mut(op.0.add((r + 1) * cols), cols),
                                        std::slice::from_raw_parts_mut(op.0.add((r + 2) * cols), cols),
                                        std::slice::from_raw_parts_mut(op.0.add((r + 3) * cols), cols),
                                    )
                                };
                                rows4_dx::<T>([o0, o1, o2, o3], [g0, g1, g2, g3], [x0, x1, x2, x3], wv, st, sw, sb);
                                r += 4;
                            }
                            Some(op) => {
                                let (xr, gr) = row(r);
                                let st = row_stats::<T>(xr, gr, wv, mu[r], rs[r], inv_n);
                                // SAFETY: row r of dx belongs to this task only.
                                let or = unsafe { std::slice::from_raw_parts_mut(op.0.add(r * cols), cols) };
                                if want_params {
                                    row_dx::<T, true>(or, gr, xr, wv, &st, sw, sb);
                                } else {
                                    row_dx::<T, false>(or, gr, xr, wv, &st, sw, sb);
                                }
                                r += 1;
                            }
                            None => {
                                let (xr, gr) = row(r);
                                let (m, a) = (mu[r], rs[r]);
                                for (((bw, bb), &g), &v) in sw.iter_mut().zip(sb.iter_mut()).zip(gr).zip(xr) {
                                    let g = g.to_acc();
                                    *bw += g * ((v.to_acc() - m) * a);
                                    *bb += g;
                                }
                                r += 1;
                            }
                        }
                    }
                },
            );
            if want_params {
                // SAFETY: this group's partials, which only this task writes.
                let (tw, tb) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(wp.0.add(group * cols), cols),
                        std::slice::from_raw_parts_mut(bp.0.add(group * cols), cols),
                    )
                };
                for (((tw, tb), &bw), &bb) in tw.iter_mut().zip(tb.iter_mut()).zip(sw.iter()).zip(sb.iter()) {
                    *tw = T::acc_to_f64(bw);
                    *tb = T::acc_to_f64(bb);
                }
            }
        }
    });
    if want_params {
        let (mut dw, mut db) = (vec![0f64; cols], vec![0f64; cols]);
        for group in 0..groups {
            let span = group * cols..(group + 1) * cols;
            for ((t, u), (&w, &b)) in dw.iter_mut().zip(db.iter_mut()).zip(pw[span.clone()].iter().zip(&pb[span])) {
                *t += w;
                *u += b;
            }
        }
        if let Some(gw) = &grads.weight {
            write(gw, &dw, "layer_norm_backward")?;
        }
        if let Some(gb) = &grads.bias {
            write(gb, &db, "layer_norm_backward")?;
        }
    }
    Ok(())
}

/// A row's statistics for the dx pass: mean `m`, reciprocal deviation `a`, and the row means
/// `mg = Σ g·w / n`, `mgx = Σ g·w·x̂ / n`.
#[derive(Clone, Copy)]
struct RowStats<A> {
    m: A,
    a: A,
    mg: A,
    mgx: A,
}

/// A row's [`RowStats`] from its mean `m` and reciprocal deviation `a`.
#[inline(always)]
fn row_stats<T: Float>(xr: &[T], gr: &[T], wv: &[T::Acc], m: T::Acc, a: T::Acc, inv_n: T::Acc) -> RowStats<T::Acc> {
    let (sg, sgx) = lane_sums2::<T>(gr, xr, wv, m, a);
    RowStats { m, a, mg: sg * inv_n, mgx: sgx * inv_n }
}

/// One element's `dx = a·(g·w - mg - x̂·mgx)` from its `g` and `x̂ = (x - m)·a`.
#[inline(always)]
fn dx_of<T: Float>(g: T::Acc, xh: T::Acc, w: T::Acc, s: &RowStats<T::Acc>) -> T {
    T::from_acc(s.a * (g * w - s.mg - xh * s.mgx))
}

/// One element of a row: its [`dx_of`], and its terms `g·x̂` and `g` added to the weight and
/// bias sums.
#[inline(always)]
fn element_dx<T: Float>(g: T, x: T, w: T::Acc, s: &RowStats<T::Acc>, bw: &mut T::Acc, bb: &mut T::Acc) -> T {
    let (g, xh) = (g.to_acc(), (x.to_acc() - s.m) * s.a);
    *bw += g * xh;
    *bb += g;
    dx_of(g, xh, w, s)
}

/// One row of `dx`, and with `PARAMS` the row's terms of the weight and bias gradients added to
/// the group's sums `sw += g·x̂`, `sb += g`.
#[inline(always)]
fn row_dx<T: Float, const PARAMS: bool>(
    or: &mut [T],
    gr: &[T],
    xr: &[T],
    wv: &[T::Acc],
    s: &RowStats<T::Acc>,
    sw: &mut [T::Acc],
    sb: &mut [T::Acc],
) {
    if PARAMS {
        for (((((o, &g), &v), &w), bw), bb) in
            or.iter_mut().zip(gr).zip(xr).zip(wv).zip(sw.iter_mut()).zip(sb.iter_mut())
        {
            *o = element_dx(g, v, w, s, bw, bb);
        }
    } else {
        for (((o, &g), &v), &w) in or.iter_mut().zip(gr).zip(xr).zip(wv) {
            *o = dx_of(g.to_acc(), (v.to_acc() - s.m) * s.a, w, s);
        }
    }
}

/// Four consecutive rows of `dx` with their weight and bias terms, column by column: each sum
/// is loaded once, takes the four rows' terms in row order (the same additions, in the same
/// order, as four calls of [`row_dx`]) and is stored once.
#[inline(always)]
fn rows4_dx<T: Float>(
    [o0, o1, o2, o3]: [&mut [T]; 4],
    g: [&[T]; 4],
    x: [&[T]; 4],
    wv: &[T::Acc],
    st: [RowStats<T::Acc>; 4],
    sw: &mut [T::Acc],
    sb: &mut [T::Acc],
) {
    let n = wv.len();
    let (o0, o1, o2, o3) = (&mut o0[..n], &mut o1[..n], &mut o2[..n], &mut o3[..n]);
    let (g, x) = (g.map(|r| &r[..n]), x.map(|r| &r[..n]));
    let (sw, sb) = (&mut sw[..n], &mut sb[..n]);
    for j in 0..n {
        let (w, mut bw, mut bb) = (wv[j], sw[j], sb[j]);
        o0[j] = element_dx(g[0][j], x[0][j], w, &st[0], &mut bw, &mut bb);
        o1[j] = element_dx(g[1][j], x[1][j], w, &st[1], &mut bw, &mut bb);
        o2[j] = element_dx(g[2][j], x[2][j], w, &st[2], &mut bw, &mut bb);
        o3[j] = element_dx(g[3][j], x[3][j], w, &st[3], &mut bw, &mut bb);
        sw[j] = bw;
        sb[j] = bb;
    }
}

/// `(Σ g·w, Σ g·w·x̂)` over a row with `x̂ = (x - m)·a`, in lanes of the accumulation type
/// (pairwise lane combination, then the tail), as [`lane_sum`].
#[inline(always)]
fn lane_sums2<T: Float>(g: &[T], x: &[T], w: &[T::Acc], m: T::Acc, a: T::Acc) -> (T::Acc, T::Acc) {
    let mut s1 = [T::Acc::zero(); LANES];
    let mut s2 = [T::Acc::zero(); LANES];
    let (gc, xc, wc) = (g.chunks_exact(LANES), x.chunks_exact(LANES), w.chunks_exact(LANES));
    let (gr, xr, wr) = (gc.remainder(), xc.remainder(), wc.remainder());
    for ((gch, xch), wch) in gc.zip(xc).zip(wc) {
        for k in 0..LANES {
            let gw = gch[k].to_acc() * wch[k];
            s1[k] += gw;
            s2[k] += gw * ((xch[k].to_acc() - m) * a);
        }
    }
    let (mut t1, mut t2) = (pairwise_fold(s1, |a, b| a + b), pairwise_fold(s2, |a, b| a + b));
    for ((&g, &v), &w) in gr.iter().zip(xr).zip(wr) {
        let gw = g.to_acc() * w;
        t1 += gw;
        t2 += gw * ((v.to_acc() - m) * a);
    }
    (t1, t2)
}
