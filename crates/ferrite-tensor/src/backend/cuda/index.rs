//! Index ops on `cuda:N` (index.cu): index_select, index_add, gather, scatter_add, one_hot over
//! tensors viewed as `[outer, dim, inner]`. Indices go to the kernels as contiguous i64; values
//! are f32 (f16/bf16 through f32). The kernels flag an index out of range in a slot of the
//! device's flag slab, which is not read here: the CPU's error, naming the op, surfaces at the
//! next synchronisation (`deferred.rs`), so an index op never stalls the host. Class targets of
//! the losses are checked the same way (`check_indices`).

use ferrite_cuda::KernelArg;

use super::data::{contiguous_as, copy, f32_contiguous};
use super::deferred::Check;
use super::elementwise::{check_float, into_f32_out};
use super::launch::{Ctx, n_arg, ptr};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::{DType, Tensor};

/// `index` as a contiguous i64 tensor, refused unless it is i64 or i32 (the index ops' dtypes).
fn i64_index(cx: Ctx<'_>, index: &Tensor, op: &'static str) -> Result<Tensor> {
    if !matches!(index.dtype(), DType::I64 | DType::I32) {
        return Err(TensorError::InvalidDType {
            op,
            arg: "index",
            dtype: index.dtype(),
            expected: &[DType::I64, DType::I32],
        });
    }
    contiguous_as(cx, index, DType::I64)
}

/// Runs `launch` with a flag slot (a `bad` argument) queued for `op`'s index check over the
/// contiguous i64 `idx`, then queues the copy of the first bad index's value into the slot.
fn flagged(
    cx: Ctx<'_>,
    idx: &Tensor,
    dim: usize,
    size: usize,
    op: &'static str,
    launch: impl FnOnce(KernelArg) -> Result<()>,
) -> Result<()> {
    cx.flagged(idx, op, Check::Index { dim, size }, |slot| {
        launch(KernelArg::Ptr(slot))?;
        cx.launch(op, "index.cu", "flag_index_value_i64", 1, 1, &[ptr(idx, op)?, KernelArg::Ptr(slot)])
    })
}

/// Error (at the next synchronisation) unless every element of `index` is in `[0, size)` or
/// equals `ignore` (see [`crate::backend::KernelBackend::check_indices`]).
pub(super) fn check_indices(
    cx: Ctx<'_>,
    index: &Tensor,
    size: usize,
    ignore: Option<i64>,
    dim: usize,
    op: &'static str,
) -> Result<()> {
    let count = index.numel();
    if count == 0 {
        return Ok(());
    }
    // Any dtype (the losses pass their targets as they are): no dtype check here.
    let idx = contiguous_as(cx, index, DType::I64)?;
    flagged(cx, &idx, dim, size, op, |bad| {
        let args = [
            n_arg(count),
            n_arg(size),
            KernelArg::I64(ignore.unwrap_or(0)),
            KernelArg::I32(ignore.is_some() as i32),
            ptr(&idx, op)?,
            bad,
        ];
        cx.launch_n(op, "index.cu", "check_indices_i64", count, &args)
    })
}

/// (outer, inner) of `shape` around `dim`.
fn around(shape: &[usize], dim: usize) -> (usize, usize) {
    (shape[..dim].iter().product(), shape[dim + 1..].iter().product())
}

/// The `[outer, size, inner]` view of the indexed tensor along `dim` and the `count` positions of
/// the index along it: the numbers every index.cu kernel takes first.
#[derive(Clone, Copy)]
struct Span {
    dim: usize,
    outer: usize,
    size: usize,
    count: usize,
    inner: usize,
}

impl Span {
    fn args(&self) -> [KernelArg; 4] {
        [n_arg(self.outer), n_arg(self.size), n_arg(self.count), n_arg(self.inner)]
    }
}

/// `out[outer, j, inner] = xs[outer, idx[...], inner]` by `kernel` (`index_select_f32` reads
/// `idx[j]`, `gather_f32` the index at the output's own position) over the contiguous f32 `xs`
/// and the contiguous i64 `idx`, flagging an index outside `[0, size)`.
fn select_f32(
    cx: Ctx<'_>,
    op: &'static str,
    kernel: &str,
    out: &Tensor,
    xs: &Tensor,
    idx: &Tensor,
    at: Span,
) -> Result<()> {
    flagged(cx, idx, at.dim, at.size, op, |bad| {
        into_f32_out(cx, out, |o| {
            let [outer, size, count, inner] = at.args();
            let args = [outer, size, count, inner, ptr(xs, op)?, ptr(idx, op)?, ptr(o, op)?, bad];
            cx.launch_n(op, "index.cu", kernel, at.outer * at.count * at.inner, &args)
        })
    })
}

pub(super) fn index_select(cx: Ctx<'_>, out: &Tensor, x: &Tensor, dim: usize, index: &Tensor) -> Result<()> {
    const OP: &str = "index_select";
    check_float(OP, &[out, x])?;
    let (outer, inner) = around(x.shape(), dim);
    let at = Span { dim, outer, size: x.shape()[dim], count: index.numel(), inner };
    let (xs, idx) = (f32_contiguous(cx, x)?, i64_index(cx, index, OP)?);
    select_f32(cx, OP, "index_select_f32", out, &xs, &idx, at)
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

/// `dst[outer, idx[...], inner] += s[outer, j, inner]` by `kernel` (`index_add_f32` reads
/// `idx[j]`, `scatter_add_f32` the index at the source's own position) into `dst` through a
/// contiguous f32 stand-in, from the contiguous f32 `s` and the contiguous i64 `idx`, flagging an
/// index outside `[0, size)`.
fn add_f32(
    cx: Ctx<'_>,
    op: &'static str,
    kernel: &str,
    dst: &Tensor,
    s: &Tensor,
    idx: &Tensor,
    at: Span,
) -> Result<()> {
    flagged(cx, idx, at.dim, at.size, op, |bad| {
        in_place_f32(cx, dst, |d| {
            let [outer, size, count, inner] = at.args();
            let args = [outer, size, count, inner, ptr(d, op)?, ptr(idx, op)?, ptr(s, op)?, bad];
            cx.launch_n(op, "index.cu", kernel, at.outer * at.size * at.inner, &args)
        })
    })
}

pub(super) fn index_add(cx: Ctx<'_>, dst: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<()> {
    const OP: &str = "index_add";
    check_float(OP, &[dst, src])?;
    let (outer, inner) = around(dst.shape(), dim);
    let at = Span { dim, outer, size: dst.shape()[dim], count: index.numel(), inner };
    let (s, idx) = (f32_contiguous(cx, src)?, i64_index(cx, index, OP)?);
    add_f32(cx, OP, "index_add_f32", dst, &s, &idx, at)
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
    let at = Span { dim, outer, size: x.shape()[dim], count: index.shape()[dim], inner };
    let (xs, idx) = (f32_contiguous(cx, &xv)?, i64_index(cx, index, OP)?);
    select_f32(cx, OP, "gather_f32", out, &xs, &idx, at)
}

pub(super) fn scatter_add(cx: Ctx<'_>, out: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<()> {
    const OP: &str = "scatter_add";
    check_float(OP, &[out, src])?;
    let (outer, inner) = around(index.shape(), dim);
    let at = Span { dim, outer, size: out.shape()[dim], count: index.shape()[dim], inner };
    let ov = cut_to(out, index.shape(), dim);
    let sv = cut_to(src, index.shape(), dim);
    let sv = sv.narrow(dim as i64, 0, at.count)?;
    let (s, idx) = (f32_contiguous(cx, &sv)?, i64_index(cx, index, OP)?);
    add_f32(cx, OP, "scatter_add_f32", &ov, &s, &idx, at)
}

pub(super) fn one_hot(cx: Ctx<'_>, out: &Tensor, index: &Tensor) -> Result<()> {
    const OP: &str = "one_hot";
    if out.dtype() != DType::I64 {
        return Err(TensorError::UnsupportedDType { op: OP, dtype: out.dtype() });
    }
    let classes = out.shape().last().copied().unwrap_or(1);
    let count = index.numel();
    let idx = i64_index(cx, index, OP)?;
    flagged(cx, &idx, 1, classes, OP, |bad| {
        let args = [n_arg(count), n_arg(classes), ptr(&idx, OP)?, ptr(out, OP)?, bad];
        cx.launch_n(OP, "index.cu", "one_hot_i64", count * classes, &args)
    })
}
