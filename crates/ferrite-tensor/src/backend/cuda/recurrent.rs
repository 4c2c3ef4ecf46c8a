//! The recurrent cells' pointwise step ([`RecurrentCell`]: LSTM, GRU, tanh and ReLU RNN) and its
//! gradient on `cuda:N` (recurrent.cu): one kernel each way over a step's `rows × hidden` units,
//! with the CPU backend's formulas and summation order (`backend/cpu/recurrent.rs`) in f32.
//!
//! Why row blocks: a step of a batch-first sequence is a range of rows with a stride between
//! them, and the kernels take each operand as (address, row stride) with unit column stride, so
//! f32 operands — the common case — are read and written where they are, without copies. Other
//! layouts and f16/bf16 go through contiguous f32 copies (written ones are copied back after the
//! launch); f64 is refused with `UnsupportedDType` as everywhere on CUDA.
use ferrite_cuda::KernelArg;

use super::data::{copy, f32_contiguous};
use super::elementwise::check_float;
use super::launch::{Ctx, n_arg, opt_ptr, ptr};
use crate::backend::{CellBackward, CellForward, RecurrentCell};
use crate::error::{Result, TensorError};
use crate::{DType, Tensor};

/// Whether the kernels can address `t` in place: f32, 2-D, unit stride along its columns.
fn in_place(t: &Tensor) -> bool {
    t.dtype() == DType::F32 && t.rank() == 2 && (t.shape()[1] <= 1 || t.strides()[1] == 1)
}

/// Error unless `t` is a 2-D row block (the CPU backend's contract check).
fn check_2d(t: &Tensor, op: &'static str) -> Result<()> {
    if t.rank() == 2 {
        Ok(())
    } else {
        Err(TensorError::NotContiguous { op, shape: t.shape().to_vec(), strides: t.strides().to_vec() })
    }
}

/// A row block as the kernels see it: an f32 tensor with unit column stride, its row stride, and
/// the operand it stands for when it is a copy that must be written back.
struct Rows<'a> {
    t: Tensor,
    rs: usize,
    write_back: Option<&'a Tensor>,
}

impl<'a> Rows<'a> {
    /// A row block the kernel reads.
    fn read(cx: Ctx<'_>, t: &'a Tensor, op: &'static str) -> Result<Rows<'a>> {
        check_2d(t, op)?;
        if in_place(t) {
            return Ok(Rows { t: t.clone(), rs: t.strides()[0], write_back: None });
        }
        let c = f32_contiguous(cx, t)?;
        Ok(Rows { rs: t.shape()[1], t: c, write_back: None })
    }

    fn read_opt(cx: Ctx<'_>, t: Option<&'a Tensor>, op: &'static str) -> Result<Option<Rows<'a>>> {
        t.map(|t| Rows::read(cx, t, op)).transpose()
    }

    /// A row block the kernel writes (every element).
    fn write(cx: Ctx<'_>, t: &'a Tensor, op: &'static str) -> Result<Rows<'a>> {
        check_2d(t, op)?;
        if in_place(t) {
            return Ok(Rows { t: t.clone(), rs: t.strides()[0], write_back: None });
        }
        let c = cx.scratch(t, t.shape(), DType::F32)?;
        Ok(Rows { rs: t.shape()[1], t: c, write_back: Some(t) })
    }

    /// The (address, row stride) argument pair.
    fn args(&self, op: &'static str) -> Result<[KernelArg; 2]> {
        Ok([ptr(&self.t, op)?, n_arg(self.rs)])
    }

    /// The pair of an optional operand (null, 0 when absent).
    fn opt_args(r: Option<&Rows<'_>>, op: &'static str) -> Result<[KernelArg; 2]> {
        match r {
            Some(r) => r.args(op),
            None => Ok([KernelArg::Ptr(0), n_arg(0)]),
        }
    }

    /// Copies a written stand-in back into its operand.
    fn finish(&self, cx: Ctx<'_>) -> Result<()> {
        match self.write_back {
            Some(dst) => copy(cx, dst, &self.t),
            None => Ok(()),
        }
    }
}

fn missing(op: &'static str) -> TensorError {
    TensorError::invalid(op, "internal: a recurrent cell operand is missing")
}

/// A bias as a contiguous f32 tensor (absent: none).
fn bias(cx: Ctx<'_>, b: Option<&Tensor>) -> Result<Option<Tensor>> {
    b.map(|b| f32_contiguous(cx, b)).transpose()
}

/// Launches `kernel` of recurrent.cu over `rows × hidden` units with `args`, then writes back
/// the stand-ins of `written`.
fn launch(
    cx: Ctx<'_>,
    op: &'static str,
    kernel: &str,
    units: usize,
    args: &[KernelArg],
    written: &[&Rows<'_>],
) -> Result<()> {
    cx.launch_n(op, "recurrent.cu", kernel, units, args)?;
    written.iter().try_for_each(|w| w.finish(cx))
}

pub(super) fn forward(cx: Ctx<'_>, cell: RecurrentCell, x: &CellForward<'_>) -> Result<()> {
    let op = cell.name();
    let mut ts = vec![x.gi, x.gh, x.h_prev, x.h];
    ts.extend([x.b_ih, x.b_hh, x.c_prev, x.c, x.saved].into_iter().flatten());
    check_float(op, &ts)?;
    check_2d(x.h, op)?;
    let (rows, hidden) = (x.h.shape()[0], x.h.shape()[1]);
    if rows == 0 || hidden == 0 {
        return Ok(());
    }
    let gi = Rows::read(cx, x.gi, op)?;
    let gh = Rows::read(cx, x.gh, op)?;
    let (bi, bh) = (bias(cx, x.b_ih)?, bias(cx, x.b_hh)?);
    let h = Rows::write(cx, x.h, op)?;
    let mut a = vec![n_arg(rows), n_arg(hidden)];
    match cell {
        RecurrentCell::Lstm => {
            let cp = Rows::read(cx, x.c_prev.ok_or_else(|| missing(op))?, op)?;
            let c = Rows::write(cx, x.c.ok_or_else(|| missing(op))?, op)?;
            let sv = Rows::write(cx, x.saved.ok_or_else(|| missing(op))?, op)?;
            a.extend(gi.args(op)?);
            a.extend(gh.args(op)?);
            a.extend([opt_ptr(bi.as_ref(), op)?, opt_ptr(bh.as_ref(), op)?]);
            for r in [&cp, &h, &c, &sv] {
                a.extend(r.args(op)?);
            }
            launch(cx, op, "lstm_cell_f32", rows * hidden, &a, &[&h, &c, &sv])
        }
        RecurrentCell::Gru => {
            let hp = Rows::read(cx, x.h_prev, op)?;
            let sv = Rows::write(cx, x.saved.ok_or_else(|| missing(op))?, op)?;
            a.extend(gi.args(op)?);
            a.extend(gh.args(op)?);
            a.extend([opt_ptr(bi.as_ref(), op)?, opt_ptr(bh.as_ref(), op)?]);
            for r in [&hp, &h, &sv] {
                a.extend(r.args(op)?);
            }
            launch(cx, op, "gru_cell_f32", rows * hidden, &a, &[&h, &sv])
        }
        RecurrentCell::RnnTanh | RecurrentCell::RnnRelu => {
            a.push(KernelArg::I32((cell == RecurrentCell::RnnRelu) as i32));
            a.extend(gi.args(op)?);
            a.extend(gh.args(op)?);
            a.extend([opt_ptr(bi.as_ref(), op)?, opt_ptr(bh.as_ref(), op)?]);
            a.extend(h.args(op)?);
            launch(cx, op, "rnn_cell_f32", rows * hidden, &a, &[&h])
        }
    }
}

pub(super) fn backward(cx: Ctx<'_>, cell: RecurrentCell, x: &CellBackward<'_>) -> Result<()> {
    let op = cell.backward_name();
    let mut ts = vec![x.dh, x.h, x.dgi];
    ts.extend([x.dh_out, x.dc, x.saved, x.c, x.c_prev, x.h_prev, x.dgh, x.dh_prev, x.dc_prev].into_iter().flatten());
    check_float(op, &ts)?;
    check_2d(x.dh, op)?;
    let (rows, hidden) = (x.dh.shape()[0], x.dh.shape()[1]);
    if rows == 0 || hidden == 0 {
        return Ok(());
    }
    let dh = Rows::read(cx, x.dh, op)?;
    let dho = Rows::read_opt(cx, x.dh_out, op)?;
    let dgi = Rows::write(cx, x.dgi, op)?;
    let mut a = vec![n_arg(rows), n_arg(hidden)];
    match cell {
        RecurrentCell::Lstm => {
            let dc = Rows::read_opt(cx, x.dc, op)?;
            let sv = Rows::read(cx, x.saved.ok_or_else(|| missing(op))?, op)?;
            let c = Rows::read(cx, x.c.ok_or_else(|| missing(op))?, op)?;
            let cp = Rows::read(cx, x.c_prev.ok_or_else(|| missing(op))?, op)?;
            let dcp = Rows::write(cx, x.dc_prev.ok_or_else(|| missing(op))?, op)?;
            a.extend(dh.args(op)?);
            a.extend(Rows::opt_args(dho.as_ref(), op)?);
            a.extend(Rows::opt_args(dc.as_ref(), op)?);
            for r in [&sv, &c, &cp, &dgi, &dcp] {
                a.extend(r.args(op)?);
            }
            launch(cx, op, "lstm_cell_backward_f32", rows * hidden, &a, &[&dgi, &dcp])
        }
        RecurrentCell::Gru => {
            let sv = Rows::read(cx, x.saved.ok_or_else(|| missing(op))?, op)?;
            let hp = Rows::read(cx, x.h_prev.ok_or_else(|| missing(op))?, op)?;
            let dgh = Rows::write(cx, x.dgh.ok_or_else(|| missing(op))?, op)?;
            let dhp = Rows::write(cx, x.dh_prev.ok_or_else(|| missing(op))?, op)?;
            a.extend(dh.args(op)?);
            a.extend(Rows::opt_args(dho.as_ref(), op)?);
            for r in [&sv, &hp, &dgi, &dgh, &dhp] {
                a.extend(r.args(op)?);
            }
            launch(cx, op, "gru_cell_backward_f32", rows * hidden, &a, &[&dgi, &dgh, &dhp])
        }
        RecurrentCell::RnnTanh | RecurrentCell::RnnRelu => {
            let h = Rows::read(cx, x.h, op)?;
            a.push(KernelArg::I32((cell == RecurrentCell::RnnRelu) as i32));
            a.extend(dh.args(op)?);
            a.extend(Rows::opt_args(dho.as_ref(), op)?);
            a.extend(h.args(op)?);
            a.extend(dgi.args(op)?);
            launch(cx, op, "rnn_cell_backward_f32", rows * hidden, &a, &[&dgi])
        }
    }
}
