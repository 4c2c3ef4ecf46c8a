//! Index ops on `cuda:N` (index.cu): index_select, index_add, gather, scatter_add, one_hot over
//! tensors viewed as `[outer, dim, inner]`. Indices go to the kernels as contiguous i64; values
//! are f32 (f16/bf16 through f32). The kernels flag an index out of range on the device; the flag
//! is read back after the launch (a synchronisation point) and reported as the CPU reports it.

use super::data::{copy, f32_contiguous, fill};
use super::elementwise::{check_float, into_f32_out};
use super::launch::{Ctx, n_arg, ptr};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::{DType, Tensor};

/// `index` as a contiguous i64 tensor.
fn i64_index(cx: Ctx<'_>, index: &Tensor, op: &'static str) -> Result<Tensor> {
    if !matches!(index.dtype(), DType::I64 | DType::I32) {
        return Err(TensorError::InvalidDType {
            op,
            arg: "index",
            dtype: index.dtype(),
            expected: &[DType::I64, DType::I32],
        });
    }
    if index.dtype() == DType::I64 && index.is_contiguous() {
        return Ok(index.clone());
    }
    let t = cx.scratch(index, index.shape(), DType::I64)?;
    copy(cx, &t, index)?;
    Ok(t)
}

/// A zeroed device flag for a kernel's `bad` argument.
fn flag(cx: Ctx<'_>, like: &Tensor) -> Result<Tensor> {
    let f = cx.scratch(like, &[1], DType::I64)?;
    fill(cx, &f, 0.0)?;
    Ok(f)
}

/// Error when the kernel raised the flag: `pos` is the flat position + 1 of the first bad index in
/// `index` (contiguous i64).
fn check_flag(f: &Tensor, index: &Tensor, size: usize, dim: usize, op: &'static str) -> Result<()> {
    let pos = f.to_vec::<i64>()?[0];
    if pos == 0 {
        return Ok(());
    }
    let at = (pos - 1) as usize;
    let value = index.reshape_usize(&[index.numel()])?.narrow(0, at, 1)?.to_vec::<i64>()?;
    Err(TensorError::IndexOutOfRange { op, index: value.first().copied().unwrap_or(-1), dim, size })
}

/// (outer, inner) of `shape` around `dim`.
fn around(shape: &[usize], dim: usize) -> (usize, usize) {
    (shape[..dim].iter().product(), shape[dim + 1..].iter().product())
}

pub(super) fn index_select(cx: Ctx<'_>, out: &Tensor, x: &Tensor, dim: usize, index: &Tensor) -> Result<()> {
    const OP: &str = "index_select";
    check_float(OP, &[out, x])?;
    let (outer, inner) = around(x.shape(), dim);
    let (size, count) = (x.shape()[dim], index.numel());
    let (xs, idx, bad) = (f32_contiguous(cx, x)?, i64_index(cx, index, OP)?, flag(cx, out)?);
    into_f32_out(cx, out, |o| {
        let args = [
            n_arg(outer),
            n_arg(size),
            n_arg(count),
            n_arg(inner),
            ptr(&xs, OP)?,
            ptr(&idx, OP)?,
            ptr(o, OP)?,
            ptr(&bad, OP)?,
        ];
        cx.launch_n(OP, "index.cu", "index_select_f32", outer * count * inner, &args)
    })?;
    check_flag(&bad, &idx, size, dim, OP)
}

/// Runs `f` on a contiguous f32 stand-in for the in-place operand `dst` (dst itself when it is
/// one), then writes the result back.
fn in_place_f32(cx: Ctx<'_>, dst: &Tensor, f: impl FnOnce(&Tensor) -> Result<()>) -> Result<()> {
    if dst.dtype() == DType::F32 && dst.is_contiguous() {
        return f(dst);
    }
    let t = f32_contiguous(cx, dst)?;
    f(&t)?;
    copy(cx, dst, &t)
}

pub(super) fn index_add(cx: Ctx<'_>, dst: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<()> {
    const OP: &str = "index_add";
    check_float(OP, &[dst, src])?;
    let (outer, inner) = around(dst.shape(), dim);
    let (size, count) = (dst.shape()[dim], index.numel());
    let (s, idx, bad) = (f32_contiguous(cx, src)?, i64_index(cx, index, OP)?, flag(cx, dst)?);
    in_place_f32(cx, dst, |d| {
        let args = [
            n_arg(outer),
            n_arg(size),
            n_arg(count),
            n_arg(inner),
            ptr(d, OP)?,
            ptr(&idx, OP)?,
            ptr(&s, OP)?,
            ptr(&bad, OP)?,
        ];
        cx.launch_n(OP, "index.cu", "index_add_f32", outer * size * inner, &args)
    })?;
    check_flag(&bad, &idx, size, dim, OP)
}

/// `t` viewed with `shape` in every dimension but `dim` (a narrowing from the start), as gather
/// and scatter_add read only the positions `index` covers.
fn cut_to(t: &Tensor, shape: &[usize], dim: usize) -> Tensor {
    let mut s = crate::layout::Shape::from_slice(shape);
    s[dim] = t.shape()[dim];
    t.view_with_layout(Layout { shape: s, strides: t.layout().strides.clone(), offset: t.storage_offset() })
}

pub(super) fn gather(cx: Ctx<'_>, out: &Tensor, x: &Tensor, dim: usize, index: &Tensor) -> Result<()> {
    const OP: &str = "gather";
    check_float(OP, &[out, x])?;
    let xv = cut_to(x, index.shape(), dim);
    let (outer, inner) = around(index.shape(), dim);
    let (size, count) = (x.shape()[dim], index.shape()[dim]);
    let (xs, idx, bad) = (f32_contiguous(cx, &xv)?, i64_index(cx, index, OP)?, flag(cx, out)?);
    into_f32_out(cx, out, |o| {
        let args = [
            n_arg(outer),
            n_arg(size),
            n_arg(count),
            n_arg(inner),
            ptr(&xs, OP)?,
            ptr(&idx, OP)?,
            ptr(o, OP)?,
            ptr(&bad, OP)?,
        ];
        cx.launch_n(OP, "index.cu", "gather_f32", outer * count * inner, &args)
    })?;
    check_flag(&bad, &idx, size, dim, OP)
}

pub(super) fn scatter_add(cx: Ctx<'_>, out: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<()> {
    const OP: &str = "scatter_add";
    check_float(OP, &[out, src])?;
    let (outer, inner) = around(index.shape(), dim);
    let (size, count) = (out.shape()[dim], index.shape()[dim]);
    let ov = cut_to(out, index.shape(), dim);
    let sv = cut_to(src, index.shape(), dim);
    let sv = sv.narrow(dim as i64, 0, count)?;
    let (s, idx, bad) = (f32_contiguous(cx, &sv)?, i64_index(cx, index, OP)?, flag(cx, out)?);
    in_place_f32(cx, &ov, |d| {
        let args = [
            n_arg(outer),
            n_arg(size),
            n_arg(count),
            n_arg(inner),
            ptr(d, OP)?,
            ptr(&idx, OP)?,
            ptr(&s, OP)?,
            ptr(&bad, OP)?,
        ];
        cx.launch_n(OP, "index.cu", "scatter_add_f32", outer * size * inner, &args)
    })?;
    check_flag(&bad, &idx, size, dim, OP)
}

pub(super) fn one_hot(cx: Ctx<'_>, out: &Tensor, index: &Tensor) -> Result<()> {
    const OP: &str = "one_hot";
    if out.dtype() != DType::I64 {
        return Err(TensorError::UnsupportedDType { op: OP, dtype: out.dtype() });
    }
    let classes = out.shape().last().copied().unwrap_or(1);
    let count = index.numel();
    let (idx, bad) = (i64_index(cx, index, OP)?, flag(cx, out)?);
    let args = [n_arg(count), n_arg(classes), ptr(&idx, OP)?, ptr(out, OP)?, ptr(&bad, OP)?];
    cx.launch_n(OP, "index.cu", "one_hot_i64", count * classes, &args)?;
    check_flag(&bad, &idx, classes, 1, OP)
}
