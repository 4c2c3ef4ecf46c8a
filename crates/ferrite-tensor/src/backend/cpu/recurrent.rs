//! CPU bodies of the recurrent cells' pointwise step ([`RecurrentCell`]) and its gradient: one
//! pass over a step's `rows × hidden` units that reads the two projections and the biases,
//! applies every gate's activation and writes the new state and what backward keeps — instead
//! of the dozen elementwise ops (and their temporaries) a composition would run per step.
//!
//! The index space `rows × hidden` is split into column ranges of rows for the kernel team (a
//! step has few rows and many units, so splitting by rows alone would leave threads idle), and
//! each range runs vectorised ([`vectorize`], branch-free `exp`/`tanh` from `kernels/vmath.rs`).
//! Sums follow PyTorch's order, `(W_ih x + b_ih) + (W_hh h + b_hh)`, and the GRU's update is
//! ATen's `n + z (h - n)`, so values agree with PyTorch's CPU cells to rounding.

use crate::backend::{CellBackward, CellForward, RecurrentCell};
use crate::element::{AccFloat, Float};
use crate::error::{Result, TensorError};
use crate::kernels::simd::vectorize;
use crate::kernels::strided::{SendPtr, par_ranges};
use crate::{Tensor, dispatch_float};

pub(super) fn forward(cell: RecurrentCell, x: &CellForward<'_>) -> Result<()> {
    dispatch_float!(x.h.dtype(), cell.name(), T => fwd::<T>(cell, x))
}

pub(super) fn backward(cell: RecurrentCell, x: &CellBackward<'_>) -> Result<()> {
    dispatch_float!(x.dgi.dtype(), cell.backward_name(), T => bwd::<T>(cell, x))
}

/// A row-block operand: the first element of row 0 and the distance between rows.
#[derive(Clone, Copy)]
struct Rows<T> {
    p: SendPtr<T>,
    stride: usize,
}

impl<T: Copy> Rows<T> {
    fn of(t: &Tensor, op: &'static str) -> Result<Rows<T>> {
        let unit_columns = t.rank() == 2 && (t.shape()[1] <= 1 || t.strides()[1] == 1);
        if !unit_columns {
            return Err(TensorError::NotContiguous { op, shape: t.shape().to_vec(), strides: t.strides().to_vec() });
        }
        Ok(Rows { p: SendPtr(t.ptr::<T>(op)?), stride: t.strides()[0] })
    }

    fn opt(t: Option<&Tensor>, op: &'static str) -> Result<Option<Rows<T>>> {
        t.map(|t| Rows::of(t, op)).transpose()
    }

    /// Columns `[c0, c1)` of row `r`.
    ///
    /// # Safety
    /// `r` is a row of the operand and `c1` at most its width; the memory outlives `'a` and no
    /// one writes the range meanwhile.
    #[inline(always)]
    unsafe fn cols<'a>(self, r: usize, c0: usize, c1: usize) -> &'a [T] {
        // SAFETY: forwarded from the caller.
        unsafe { std::slice::from_raw_parts(self.p.0.add(r * self.stride + c0), c1 - c0) }
    }

    /// Writable columns `[c0, c1)` of row `r`.
    ///
    /// # Safety
    /// As [`cols`](Self::cols), and this task alone touches the range.
    #[inline(always)]
    unsafe fn cols_mut<'a>(self, r: usize, c0: usize, c1: usize) -> &'a mut [T] {
        // SAFETY: forwarded from the caller.
        unsafe { std::slice::from_raw_parts_mut(self.p.0.add(r * self.stride + c0), c1 - c0) }
    }

    /// Writable columns `[c0, c1)` of each of the first `N` gates (blocks of `hidden` columns)
    /// of row `r`.
    ///
    /// # Safety
    /// As [`cols_mut`](Self::cols_mut) for each of the `N` ranges.
    #[inline(always)]
    unsafe fn gates_mut<'a, const N: usize>(self, r: usize, hidden: usize, c0: usize, c1: usize) -> [&'a mut [T]; N] {
        // SAFETY: forwarded from the caller; the N ranges are disjoint.
        std::array::from_fn(|k| unsafe { self.cols_mut(r, k * hidden + c0, k * hidden + c1) })
    }
}

/// A bias `[G·hidden]` widened to the compute type (zeros when absent).
fn bias<T: Float>(b: Option<&Tensor>, len: usize) -> Result<Vec<T::Acc>> {
    let zero = T::acc_from_f64(0.0);
    match b {
        None => Ok(vec![zero; len]),
        Some(b) => {
            let v = b.contiguous()?;
            let p = v.ptr::<T>("recurrent bias")?;
            // SAFETY: `v` is a contiguous tensor of `len` elements (the op layer checked the
            // bias shape) that lives until the end of this function.
            let s = unsafe { std::slice::from_raw_parts(p, len) };
            Ok(s.iter().map(|x| x.to_acc()).collect())
        }
    }
}

/// Run `f(row, c0, c1)` over the `rows × hidden` units, split into column ranges of rows on the
/// kernel team.
fn units(rows: usize, hidden: usize, cost: usize, f: impl Fn(usize, usize, usize) + Sync + Send) {
    par_ranges(rows * hidden, cost, |s, e| {
        let mut i = s;
        while i < e {
            let r = i / hidden;
            let c0 = i - r * hidden;
            let c1 = hidden.min(c0 + (e - i));
            f(r, c0, c1);
            i += c1 - c0;
        }
    });
}

/// Columns `[c0, c1)` of the `k`-th gate of a `[G·hidden]` row.
#[inline(always)]
fn part<U>(row: &[U], k: usize, hidden: usize, c0: usize, c1: usize) -> &[U] {
    &row[k * hidden + c0..k * hidden + c1]
}

fn fwd<T: Float>(cell: RecurrentCell, x: &CellForward<'_>) -> Result<()> {
    let op = cell.name();
    let (rows, hidden) = (x.h.shape()[0], x.h.shape()[1]);
    if rows == 0 || hidden == 0 {
        return Ok(());
    }
    let width = cell.gates() * hidden;
    let (bi, bh) = (bias::<T>(x.b_ih, width)?, bias::<T>(x.b_hh, width)?);
    let gi = Rows::<T>::of(x.gi, op)?;
    let gh = Rows::<T>::of(x.gh, op)?;
    let hp = Rows::<T>::of(x.h_prev, op)?;
    let cp = Rows::<T>::opt(x.c_prev, op)?;
    let h = Rows::<T>::of(x.h, op)?;
    let c = Rows::<T>::opt(x.c, op)?;
    let sv = Rows::<T>::opt(x.saved, op)?;
    let missing = || TensorError::invalid(op, "internal: a recurrent cell operand is missing");
    match cell {
        RecurrentCell::Lstm => {
            let (cp, c, sv) = (cp.ok_or_else(missing)?, c.ok_or_else(missing)?, sv.ok_or_else(missing)?);
            units(rows, hidden, 48, |r, c0, c1| {
                // SAFETY: `r < rows` and `c1 <= hidden` index the row blocks the op layer
                // allocated with these shapes; each (row, column range) belongs to one task, and
                // written operands do not overlap read ones (the contract of `CellForward`).
                unsafe {
                    let (gir, ghr) = (gi.cols(r, 0, width), gh.cols(r, 0, width));
                    let cpr = cp.cols(r, c0, c1);
                    let (hr, cr) = (h.cols_mut(r, c0, c1), c.cols_mut(r, c0, c1));
                    let svr = sv.gates_mut::<4>(r, hidden, c0, c1);
                    vectorize(
                        #[inline(always)]
                        || lstm_forward::<T>(hidden, c0, c1, gir, ghr, &bi, &bh, cpr, hr, cr, svr),
                    )
                }
            });
        }
        RecurrentCell::Gru => {
            let sv = sv.ok_or_else(missing)?;
            units(rows, hidden, 40, |r, c0, c1| {
                // SAFETY: as for the LSTM above.
                unsafe {
                    let (gir, ghr) = (gi.cols(r, 0, width), gh.cols(r, 0, width));
                    let hpr = hp.cols(r, c0, c1);
                    let hr = h.cols_mut(r, c0, c1);
                    let svr = sv.gates_mut::<4>(r, hidden, c0, c1);
                    vectorize(
                        #[inline(always)]
                        || gru_forward::<T>(hidden, c0, c1, gir, ghr, &bi, &bh, hpr, hr, svr),
                    )
                }
            });
        }
        RecurrentCell::RnnTanh | RecurrentCell::RnnRelu => {
            let relu = cell == RecurrentCell::RnnRelu;
            units(rows, hidden, 12, |r, c0, c1| {
                // SAFETY: as for the LSTM above.
                unsafe {
                    let (gir, ghr) = (gi.cols(r, c0, c1), gh.cols(r, c0, c1));
                    let hr = h.cols_mut(r, c0, c1);
                    vectorize(
                        #[inline(always)]
                        || rnn_forward::<T>(relu, gir, ghr, &bi[c0..c1], &bh[c0..c1], hr),
                    )
                }
            });
        }
    }
    Ok(())
}

/// `(gi + b_ih) + (gh + b_hh)` of gate `k` at column `j` (relative to `c0`).
#[inline(always)]
fn pre<T: Float>(gi: &[T], gh: &[T], bi: &[T::Acc], bh: &[T::Acc], j: usize) -> T::Acc {
    (gi[j].to_acc() + bi[j]) + (gh[j].to_acc() + bh[j])
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn lstm_forward<T: Float>(
    hidden: usize,
    c0: usize,
    c1: usize,
    gi: &[T],
    gh: &[T],
    bi: &[T::Acc],
    bh: &[T::Acc],
    c_prev: &[T],
    h: &mut [T],
    c: &mut [T],
    saved: [&mut [T]; 4],
) {
    let n = c1 - c0;
    let p = |k: usize| (part(gi, k, hidden, c0, c1), part(gh, k, hidden, c0, c1));
    let q = |k: usize| (part(bi, k, hidden, c0, c1), part(bh, k, hidden, c0, c1));
    let ((gi_i, gh_i), (gi_f, gh_f), (gi_g, gh_g), (gi_o, gh_o)) = (p(0), p(1), p(2), p(3));
    let ((bi_i, bh_i), (bi_f, bh_f), (bi_g, bh_g), (bi_o, bh_o)) = (q(0), q(1), q(2), q(3));
    let [s_i, s_f, s_g, s_o] = saved;
    let (c_prev, h, c) = (&c_prev[..n], &mut h[..n], &mut c[..n]);
    for j in 0..n {
        let i = pre::<T>(gi_i, gh_i, bi_i, bh_i, j).vsigmoid();
        let f = pre::<T>(gi_f, gh_f, bi_f, bh_f, j).vsigmoid();
        let gg = pre::<T>(gi_g, gh_g, bi_g, bh_g, j).vtanh();
        let o = pre::<T>(gi_o, gh_o, bi_o, bh_o, j).vsigmoid();
        let cn = T::from_acc(f * c_prev[j].to_acc() + i * gg);
        c[j] = cn;
        h[j] = T::from_acc(o * cn.to_acc().vtanh());
        s_i[j] = T::from_acc(i);
        s_f[j] = T::from_acc(f);
        s_g[j] = T::from_acc(gg);
        s_o[j] = T::from_acc(o);
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn gru_forward<T: Float>(
    hidden: usize,
    c0: usize,
    c1: usize,
    gi: &[T],
    gh: &[T],
    bi: &[T::Acc],
    bh: &[T::Acc],
    h_prev: &[T],
    h: &mut [T],
    saved: [&mut [T]; 4],
) {
    let n = c1 - c0;
    let p = |k: usize| (part(gi, k, hidden, c0, c1), part(gh, k, hidden, c0, c1));
    let q = |k: usize| (part(bi, k, hidden, c0, c1), part(bh, k, hidden, c0, c1));
    let ((gi_r, gh_r), (gi_z, gh_z), (gi_n, gh_n)) = (p(0), p(1), p(2));
    let ((bi_r, bh_r), (bi_z, bh_z), (bi_n, bh_n)) = (q(0), q(1), q(2));
    let [s_r, s_z, s_n, s_hn] = saved;
    let (h_prev, h) = (&h_prev[..n], &mut h[..n]);
    for j in 0..n {
        let r = pre::<T>(gi_r, gh_r, bi_r, bh_r, j).vsigmoid();
        let z = pre::<T>(gi_z, gh_z, bi_z, bh_z, j).vsigmoid();
        let hn = gh_n[j].to_acc() + bh_n[j];
        let nn = ((gi_n[j].to_acc() + bi_n[j]) + r * hn).vtanh();
        h[j] = T::from_acc(nn + z * (h_prev[j].to_acc() - nn));
        s_r[j] = T::from_acc(r);
        s_z[j] = T::from_acc(z);
        s_n[j] = T::from_acc(nn);
        s_hn[j] = T::from_acc(hn);
    }
}

#[inline(always)]
fn rnn_forward<T: Float>(relu: bool, gi: &[T], gh: &[T], bi: &[T::Acc], bh: &[T::Acc], h: &mut [T]) {
    let n = h.len();
    let (gi, gh, bi, bh) = (&gi[..n], &gh[..n], &bi[..n], &bh[..n]);
    let zero = T::acc_from_f64(0.0);
    for j in 0..n {
        let p = pre::<T>(gi, gh, bi, bh, j);
        // relu keeps NaN (PyTorch's clamp_min does).
        h[j] = T::from_acc(if relu { if p < zero { zero } else { p } } else { p.vtanh() });
    }
}

fn bwd<T: Float>(cell: RecurrentCell, x: &CellBackward<'_>) -> Result<()> {
    let op = cell.backward_name();
    let (rows, hidden) = (x.dh.shape()[0], x.dh.shape()[1]);
    if rows == 0 || hidden == 0 {
        return Ok(());
    }
    let dh = Rows::<T>::of(x.dh, op)?;
    let dho = Rows::<T>::opt(x.dh_out, op)?;
    let dc = Rows::<T>::opt(x.dc, op)?;
    let sv = Rows::<T>::opt(x.saved, op)?;
    let h = Rows::<T>::of(x.h, op)?;
    let c = Rows::<T>::opt(x.c, op)?;
    let cp = Rows::<T>::opt(x.c_prev, op)?;
    let hp = Rows::<T>::opt(x.h_prev, op)?;
    let dgi = Rows::<T>::of(x.dgi, op)?;
    let dgh = Rows::<T>::opt(x.dgh, op)?;
    let dhp = Rows::<T>::opt(x.dh_prev, op)?;
    let dcp = Rows::<T>::opt(x.dc_prev, op)?;
    let missing = || TensorError::invalid(op, "internal: a recurrent cell operand is missing");
    match cell {
        RecurrentCell::Lstm => {
            let (sv, c, cp, dcp) =
                (sv.ok_or_else(missing)?, c.ok_or_else(missing)?, cp.ok_or_else(missing)?, dcp.ok_or_else(missing)?);
            units(rows, hidden, 40, |r, c0, c1| {
                // SAFETY: as in `fwd`: rows and column ranges of row blocks shaped by the op layer,
                // one task per range, written operands disjoint from read ones.
                unsafe {
                    let a = LstmGrad {
                        dh: dh.cols(r, c0, c1),
                        dh_out: dho.map(|d| d.cols(r, c0, c1)),
                        dc: dc.map(|d| d.cols(r, c0, c1)),
                        saved: sv.cols(r, 0, 4 * hidden),
                        c: c.cols(r, c0, c1),
                        c_prev: cp.cols(r, c0, c1),
                    };
                    let dgir = dgi.gates_mut::<4>(r, hidden, c0, c1);
                    let dcpr = dcp.cols_mut(r, c0, c1);
                    vectorize(
                        #[inline(always)]
                        || lstm_backward::<T>(hidden, c0, c1, &a, dgir, dcpr),
                    )
                }
            });
        }
        RecurrentCell::Gru => {
            let (sv, hp, dgh, dhp) =
                (sv.ok_or_else(missing)?, hp.ok_or_else(missing)?, dgh.ok_or_else(missing)?, dhp.ok_or_else(missing)?);
            units(rows, hidden, 32, |r, c0, c1| {
                // SAFETY: as for the LSTM above.
                unsafe {
                    let dhr = dh.cols(r, c0, c1);
                    let dhor = dho.map(|d| d.cols(r, c0, c1));
                    let svr = sv.cols(r, 0, 4 * hidden);
                    let hpr = hp.cols(r, c0, c1);
                    let dgir = dgi.gates_mut::<3>(r, hidden, c0, c1);
                    let dghr = dgh.gates_mut::<3>(r, hidden, c0, c1);
                    let dhpr = dhp.cols_mut(r, c0, c1);
                    vectorize(
                        #[inline(always)]
                        || gru_backward::<T>(hidden, c0, c1, dhr, dhor, svr, hpr, dgir, dghr, dhpr),
                    )
                }
            });
        }
        RecurrentCell::RnnTanh | RecurrentCell::RnnRelu => {
            let relu = cell == RecurrentCell::RnnRelu;
            units(rows, hidden, 6, |r, c0, c1| {
                // SAFETY: as for the LSTM above.
                unsafe {
                    let dhr = dh.cols(r, c0, c1);
                    let dhor = dho.map(|d| d.cols(r, c0, c1));
                    let hr = h.cols(r, c0, c1);
                    let dgir = dgi.cols_mut(r, c0, c1);
                    vectorize(
                        #[inline(always)]
                        || rnn_backward::<T>(relu, dhr, dhor, hr, dgir),
                    )
                }
            });
        }
    }
    Ok(())
}

/// The read operands of one LSTM backward range.
struct LstmGrad<'a, T> {
    dh: &'a [T],
    dh_out: Option<&'a [T]>,
    dc: Option<&'a [T]>,
    saved: &'a [T],
    c: &'a [T],
    c_prev: &'a [T],
}

/// `dh + dh_out` at `j`.
#[inline(always)]
fn total<T: Float>(dh: &[T], dh_out: Option<&[T]>, j: usize) -> T::Acc {
    match dh_out {
        Some(o) => dh[j].to_acc() + o[j].to_acc(),
        None => dh[j].to_acc(),
    }
}

#[inline(always)]
fn lstm_backward<T: Float>(
    hidden: usize,
    c0: usize,
    c1: usize,
    a: &LstmGrad<'_, T>,
    dgi: [&mut [T]; 4],
    dc_prev: &mut [T],
) {
    let n = c1 - c0;
    let one = T::acc_from_f64(1.0);
    let g = |k: usize| part(a.saved, k, hidden, c0, c1);
    let (si, sf, sg, so) = (g(0), g(1), g(2), g(3));
    let [d_i, d_f, d_g, d_o] = dgi;
    let (dh, dh_out, dc) = (&a.dh[..n], a.dh_out.map(|d| &d[..n]), a.dc.map(|d| &d[..n]));
    let (c, c_prev, dc_prev) = (&a.c[..n], &a.c_prev[..n], &mut dc_prev[..n]);
    for j in 0..n {
        let dhj = total::<T>(dh, dh_out, j);
        let (i, f, gg, o) = (si[j].to_acc(), sf[j].to_acc(), sg[j].to_acc(), so[j].to_acc());
        let tc = c[j].to_acc().vtanh();
        let dcj = match dc {
            Some(d) => d[j].to_acc(),
            None => T::acc_from_f64(0.0),
        };
        let dct = dcj + dhj * o * (one - tc * tc);
        d_i[j] = T::from_acc(dct * gg * i * (one - i));
        d_f[j] = T::from_acc(dct * c_prev[j].to_acc() * f * (one - f));
        d_g[j] = T::from_acc(dct * i * (one - gg * gg));
        d_o[j] = T::from_acc(dhj * tc * o * (one - o));
        dc_prev[j] = T::from_acc(dct * f);
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn gru_backward<T: Float>(
    hidden: usize,
    c0: usize,
    c1: usize,
    dh: &[T],
    dh_out: Option<&[T]>,
    saved: &[T],
    h_prev: &[T],
    dgi: [&mut [T]; 3],
    dgh: [&mut [T]; 3],
    dh_prev: &mut [T],
) {
    let n = c1 - c0;
    let one = T::acc_from_f64(1.0);
    let g = |k: usize| part(saved, k, hidden, c0, c1);
    let (sr, sz, sn, shn) = (g(0), g(1), g(2), g(3));
    let [gi_r, gi_z, gi_n] = dgi;
    let [gh_r, gh_z, gh_n] = dgh;
    let (dh, dh_out, h_prev, dh_prev) = (&dh[..n], dh_out.map(|d| &d[..n]), &h_prev[..n], &mut dh_prev[..n]);
    for j in 0..n {
        let dhj = total::<T>(dh, dh_out, j);
        let (r, z, nn, hn) = (sr[j].to_acc(), sz[j].to_acc(), sn[j].to_acc(), shn[j].to_acc());
        let dn_pre = dhj * (one - z) * (one - nn * nn);
        let dz_pre = dhj * (h_prev[j].to_acc() - nn) * z * (one - z);
        let dr_pre = dn_pre * hn * r * (one - r);
        let (dr, dz) = (T::from_acc(dr_pre), T::from_acc(dz_pre));
        gi_r[j] = dr;
        gh_r[j] = dr;
        gi_z[j] = dz;
        gh_z[j] = dz;
        gi_n[j] = T::from_acc(dn_pre);
        gh_n[j] = T::from_acc(dn_pre * r);
        dh_prev[j] = T::from_acc(dhj * z);
    }
}

#[inline(always)]
fn rnn_backward<T: Float>(relu: bool, dh: &[T], dh_out: Option<&[T]>, h: &[T], dgi: &mut [T]) {
    let n = dgi.len();
    let (dh, dh_out, h) = (&dh[..n], dh_out.map(|d| &d[..n]), &h[..n]);
    let (zero, one) = (T::acc_from_f64(0.0), T::acc_from_f64(1.0));
    for j in 0..n {
        let d = total::<T>(dh, dh_out, j);
        let y = h[j].to_acc();
        dgi[j] = T::from_acc(if relu { if y > zero { d } else { zero } } else { d * (one - y * y) });
    }
}
