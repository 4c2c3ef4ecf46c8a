//! Reductions and row kernels on `cuda:N` (reduce.cu, layer_norm.cu): sums over any dims (the
//! plan's permuted view made contiguous, then one block per output row), (log-)softmax and its
//! gradient, layer norm. One block of 256 threads reduces each row with a fixed tree, so results
//! do not depend on timing; sums accumulate in f32 (the CPU backend uses f64, as on `gpu:N`).
use ferrite_cuda::KernelArg;

use super::data::{copy, f32_contiguous};
use super::elementwise::{check_float, into_f32_out};
use super::launch::{Ctx, n_arg, opt_ptr, ptr};
use crate::backend::{BinaryOp, LayerNormArgs, LayerNormParams, Plan, rows_cols};
use crate::error::Result;
use crate::{DType, Tensor};

pub(super) fn sum(cx: Ctx<'_>, out: &Tensor, x: &Tensor, plan: &Plan, scale: f64) -> Result<()> {
    const OP: &str = "sum";
    check_float(OP, &[out, x])?;
    let rows = out.numel();
    if rows == 0 {
        return Ok(());
    }
    // The input with kept dims first and reduced dims last, as a contiguous f32 [rows, rn].
    let permuted = x.view_with_layout(plan.permuted.clone());
    let flat = cx.scratch(x, &[rows * plan.rn], DType::F32)?;
    copy(cx, &flat.contiguous_view_as(permuted.shape()), &permuted)?;
    into_f32_out(cx, out, |o| {
        let sums = if scale == 1.0 { o.clone() } else { cx.scratch(o, o.shape(), DType::F32)? };
        let args = [n_arg(rows), n_arg(plan.rn), ptr(&flat, OP)?, ptr(&sums, OP)?];
        cx.launch_rows(OP, "reduce.cu", "sum_rows_f32", rows, &args)?;
        if scale != 1.0 {
            super::elementwise::binary_scalar(cx, BinaryOp::Mul, o, &sums, scale)?;
        }
        Ok(())
    })
}

pub(super) fn softmax(cx: Ctx<'_>, out: &Tensor, x: &Tensor, log: bool) -> Result<()> {
    let op = if log { "log_softmax" } else { "softmax" };
    check_float(op, &[out, x])?;
    let (rows, cols) = rows_cols(x);
    let x = f32_contiguous(cx, x)?;
    let kernel = if log { "log_softmax_rows_f32" } else { "softmax_rows_f32" };
    into_f32_out(cx, out, |o| {
        cx.launch_rows(op, "reduce.cu", kernel, rows, &[n_arg(rows), n_arg(cols), ptr(&x, op)?, ptr(o, op)?])
    })
}

pub(super) fn softmax_backward(cx: Ctx<'_>, out: &Tensor, grad: &Tensor, y: &Tensor, log: bool) -> Result<()> {
    let op = if log { "log_softmax_backward" } else { "softmax_backward" };
    check_float(op, &[out, grad, y])?;
    let (rows, cols) = rows_cols(y);
    let (g, y) = (f32_contiguous(cx, grad)?, f32_contiguous(cx, y)?);
    let kernel = if log { "log_softmax_rows_backward_f32" } else { "softmax_rows_backward_f32" };
    into_f32_out(cx, out, |o| {
        let args = [n_arg(rows), n_arg(cols), ptr(&y, op)?, ptr(&g, op)?, ptr(o, op)?];
        cx.launch_rows(op, "reduce.cu", kernel, rows, &args)
    })
}

pub(super) fn layer_norm(cx: Ctx<'_>, args: &LayerNormArgs<'_>) -> Result<()> {
    const OP: &str = "layer_norm";
    let LayerNormArgs { y, mean, rstd, x, weight, bias, params: LayerNormParams { eps } } = *args;
    let mut ts = vec![y, x, mean, rstd];
    ts.extend(weight);
    ts.extend(bias);
    check_float(OP, &ts)?;
    let (rows, cols) = rows_cols(x);
    let x = f32_contiguous(cx, x)?;
    let w = weight.map(|w| f32_contiguous(cx, w)).transpose()?;
    let b = bias.map(|b| f32_contiguous(cx, b)).transpose()?;
    // The statistics are f32 for every input but f64 (refused above).
    into_f32_out(cx, mean, |m| {
        into_f32_out(cx, rstd, |r| {
            into_f32_out(cx, y, |o| {
                let kargs = [
                    n_arg(rows),
                    n_arg(cols),
                    KernelArg::F32(eps as f32),
                    ptr(&x, OP)?,
                    opt_ptr(w.as_ref(), OP)?,
                    opt_ptr(b.as_ref(), OP)?,
                    ptr(o, OP)?,
                    ptr(m, OP)?,
                    ptr(r, OP)?,
                ];
                cx.launch_rows(OP, "layer_norm.cu", "layer_norm_f32", rows, &kargs)
            })
        })
    })
}

/// The input of a reduction as a contiguous f32 `[rows, rn]` (kept dims first, reduced last).
fn rows_of(cx: Ctx<'_>, x: &Tensor, plan: &Plan, rows: usize) -> Result<Tensor> {
    let permuted = x.view_with_layout(plan.permuted.clone());
    let flat = cx.scratch(x, &[rows, plan.rn], DType::F32)?;
    copy(cx, &flat.contiguous_view_as(permuted.shape()), &permuted)?;
    Ok(flat)
}

pub(super) fn arg_extreme(
    cx: Ctx<'_>,
    x: &Tensor,
    plan: &Plan,
    values: Option<&Tensor>,
    indices: &Tensor,
    is_max: bool,
) -> Result<()> {
    let op = if is_max { "max" } else { "min" };
    check_float(op, &[x])?;
    let rows = indices.numel();
    if rows == 0 {
        return Ok(());
    }
    let mut flat = rows_of(cx, x, plan, rows)?;
    if !is_max {
        // min(x) = -max(-x), the same index (the first NaN, then the first extreme, either way).
        let neg = cx.scratch(x, flat.shape(), DType::F32)?;
        super::elementwise::unary(cx, crate::backend::UnaryOp::Neg, &neg, &flat)?;
        flat = neg;
    }
    let vals = cx.scratch(x, &[rows], DType::F32)?;
    let args = [n_arg(rows), n_arg(plan.rn), ptr(&flat, op)?, ptr(&vals, op)?, ptr(indices, op)?];
    cx.launch_rows(op, "reduce.cu", "max_rows_with_index_f32", rows, &args)?;
    if let Some(v) = values {
        let vals = vals.contiguous_view_as(v.shape());
        if is_max {
            copy(cx, v, &vals)?;
        } else {
            into_f32_out(cx, v, |o| super::elementwise::unary(cx, crate::backend::UnaryOp::Neg, o, &vals))?;
        }
    }
    Ok(())
}

pub(super) fn var(cx: Ctx<'_>, out: &Tensor, x: &Tensor, plan: &Plan, denom: f64) -> Result<()> {
    const OP: &str = "var";
    check_float(OP, &[out, x])?;
    let rows = out.numel();
    if rows == 0 {
        return Ok(());
    }
    let flat = rows_of(cx, x, plan, rows)?;
    // Two passes, as the CPU: the mean of each row, then the sum of squared deviations.
    let sums = cx.scratch(x, &[rows, 1], DType::F32)?;
    cx.launch_rows(
        OP,
        "reduce.cu",
        "sum_rows_f32",
        rows,
        &[n_arg(rows), n_arg(plan.rn), ptr(&flat, OP)?, ptr(&sums, OP)?],
    )?;
    let means = cx.scratch(x, &[rows, 1], DType::F32)?;
    super::elementwise::binary_scalar(cx, BinaryOp::Mul, &means, &sums, 1.0 / plan.rn as f64)?;
    let dev = cx.scratch(x, flat.shape(), DType::F32)?;
    super::elementwise::binary(cx, BinaryOp::Sub, &dev, &flat, &means)?;
    let sq = cx.scratch(x, flat.shape(), DType::F32)?;
    super::elementwise::unary(cx, crate::backend::UnaryOp::Square, &sq, &dev)?;
    let ss = cx.scratch(x, &[rows], DType::F32)?;
    cx.launch_rows(
        OP,
        "reduce.cu",
        "sum_rows_f32",
        rows,
        &[n_arg(rows), n_arg(plan.rn), ptr(&sq, OP)?, ptr(&ss, OP)?],
    )?;
    into_f32_out(cx, out, |o| {
        super::elementwise::binary_scalar(cx, BinaryOp::Mul, o, &ss.contiguous_view_as(o.shape()), 1.0 / denom)
    })
}
