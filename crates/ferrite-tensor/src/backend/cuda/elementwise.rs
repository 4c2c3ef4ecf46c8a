//! Elementwise kernels on `cuda:N` (elementwise.cu, activation_backward.cu): binary ops with
//! broadcasting through strides, ops with a scalar, unary ops and their gradients, clamp,
//! comparisons, logical ops and `where`. Arithmetic is f32 in registers; each kernel exists for
//! f32, f16 and bf16 storage, so half tensors are read as they are and their result rounded once
//! on store (as PyTorch's CUDA kernels and our CPU backend compute them) — no f32 copy of an
//! operand or the result, so an op takes only its output's memory, as the planner assumes. Only
//! operands whose dtypes differ from the output's go through f32 copies; other dtypes are refused
//! with `UnsupportedDType` (f64 has no kernels, as on `gpu:N`).
use ferrite_cuda::KernelArg;

use super::data::{copy, f32_contiguous, scalar_f32};
use super::launch::{Ctx, MAX_DIMS, broadcast, broadcast3, merge_dims, n_arg, ptr};
use crate::backend::{BinaryOp, CompareOp, LogicalOp, UnaryOp};
use crate::error::{Result, TensorError};
use crate::layout::contiguous_strides;
use crate::{DType, Tensor};

/// Whether `d` is computed through f32 here.
fn floating(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// Error unless every tensor is f32, f16 or bf16.
pub(super) fn check_float(op: &'static str, ts: &[&Tensor]) -> Result<()> {
    match ts.iter().find(|t| !floating(t.dtype())) {
        Some(t) => Err(TensorError::UnsupportedDType { op, dtype: t.dtype() }),
        None => Ok(()),
    }
}

/// The suffix of a float dtype's kernels (`add_bf16`, ...).
fn suffix(d: DType) -> &'static str {
    match d {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => "f32",
    }
}

/// Whether every tensor has `out`'s dtype (then the kernels of that dtype read them as they are).
fn same_dtype(out: &Tensor, ts: &[&Tensor]) -> bool {
    ts.iter().all(|t| t.dtype() == out.dtype())
}

/// `t` as a contiguous tensor of `shape` in its own dtype (`t` itself when it already is one;
/// else a raw copy, no conversion).
fn contiguous_as(cx: Ctx<'_>, t: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if t.is_contiguous() && t.shape() == shape {
        return Ok(t.clone());
    }
    let c = cx.scratch(t, shape, t.dtype())?;
    copy(cx, &c, t)?;
    Ok(c)
}

/// `t` as f32 (same shape and layout when it already is f32; else a contiguous f32 copy).
pub(super) fn as_f32(cx: Ctx<'_>, t: &Tensor) -> Result<Tensor> {
    if t.dtype() == DType::F32 { Ok(t.clone()) } else { f32_contiguous(cx, t) }
}

/// Runs `f` with an f32 output standing for `out`, then converts it into `out` when `out` is
/// f16 or bf16.
pub(super) fn into_f32_out(cx: Ctx<'_>, out: &Tensor, f: impl FnOnce(&Tensor) -> Result<()>) -> Result<()> {
    if out.dtype() == DType::F32 {
        return f(out);
    }
    let o = cx.scratch(out, out.shape(), DType::F32)?;
    f(&o)?;
    copy(cx, out, &o)
}

/// The strides of `t` broadcast to `shape`.
fn strides_to(t: &Tensor, shape: &[usize], op: &'static str) -> Result<Vec<usize>> {
    Ok(t.layout().broadcast_to(shape, op)?.strides.to_vec())
}

/// The `Broadcast` record of `a` and `b` read over the contiguous `out`.
fn broadcast_args(cx: Ctx<'_>, op: &'static str, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<KernelArg> {
    let shape = out.shape();
    let (sa, sb) = (strides_to(a, shape, op)?, strides_to(b, shape, op)?);
    let (s, st) = merge_dims(shape, &[&contiguous_strides(shape), &sa, &sb]);
    if s.len() > MAX_DIMS {
        return Err(cx.too_many_dims(op, shape.len(), MAX_DIMS));
    }
    Ok(KernelArg::record(&broadcast(&s, &st[1], &st[2])))
}

/// A `Broadcast`-record kernel (`n, g, a, b, out`) over the contiguous `out`.
fn broadcast_kernel(cx: Ctx<'_>, op: &'static str, kernel: &str, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    let n = out.numel();
    let args = [n_arg(n), broadcast_args(cx, op, out, a, b)?, ptr(a, op)?, ptr(b, op)?, ptr(out, op)?];
    cx.launch_n(op, "elementwise.cu", kernel, n, &args)
}

/// The kernel family of a binary op and whether its operands are swapped (the reversed forms).
fn binary_kernel(op: BinaryOp) -> (&'static str, bool) {
    match op {
        BinaryOp::Add => ("add", false),
        BinaryOp::Sub => ("sub", false),
        BinaryOp::Mul => ("mul", false),
        BinaryOp::Div => ("div", false),
        BinaryOp::Pow => ("pow", false),
        BinaryOp::Maximum => ("maximum", false),
        BinaryOp::Minimum => ("minimum", false),
        BinaryOp::RSub => ("sub", true),
        BinaryOp::RDiv => ("div", true),
    }
}

/// The kernel family of a binary op with a scalar (`scalar_rsub` is `s - x`).
fn scalar_kernel(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "scalar_add",
        BinaryOp::Sub => "scalar_sub",
        BinaryOp::Mul => "scalar_mul",
        BinaryOp::Div => "scalar_div",
        BinaryOp::Pow => "scalar_pow",
        BinaryOp::Maximum => "scalar_maximum",
        BinaryOp::Minimum => "scalar_minimum",
        BinaryOp::RSub => "scalar_rsub",
        BinaryOp::RDiv => "scalar_rdiv",
    }
}

pub(super) fn binary(cx: Ctx<'_>, op: BinaryOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    let name = op.name();
    check_float(name, &[out, a, b])?;
    let (family, swap) = binary_kernel(op);
    let (a, b) = if swap { (b, a) } else { (a, b) };
    if same_dtype(out, &[a, b]) {
        let kernel = format!("{family}_{}", suffix(out.dtype()));
        return broadcast_kernel(cx, name, &kernel, out, a, b);
    }
    // Mixed dtypes: every operand as f32.
    let (a, b) = (as_f32(cx, a)?, as_f32(cx, b)?);
    into_f32_out(cx, out, |o| broadcast_kernel(cx, name, &format!("{family}_f32"), o, &a, &b))
}

pub(super) fn binary_scalar(cx: Ctx<'_>, op: BinaryOp, out: &Tensor, a: &Tensor, s: f64) -> Result<()> {
    let name = op.name();
    check_float(name, &[out, a])?;
    if !same_dtype(out, &[a]) {
        let s = scalar_f32(cx, a, s)?;
        return binary(cx, op, out, a, &s);
    }
    // The scalar as an f32 argument (the CPU's `s as f32`); `a` through the record's `a` strides.
    let kernel = format!("{}_{}", scalar_kernel(op), suffix(out.dtype()));
    let n = out.numel();
    let args =
        [n_arg(n), broadcast_args(cx, name, out, a, a)?, KernelArg::F32(s as f32), ptr(a, name)?, ptr(out, name)?];
    cx.launch_n(name, "elementwise.cu", &kernel, n, &args)
}

pub(super) fn binary_inplace(cx: Ctx<'_>, op: BinaryOp, dst: &Tensor, src: &Tensor) -> Result<()> {
    check_float(op.name(), &[dst, src])?;
    // Straight into dst when it is contiguous and src is not some other view of dst's storage
    // (each element is then read and written by one thread; the binary kernels allow `out` to
    // alias an input). Otherwise the result into a contiguous scratch, then back.
    let overlaps = std::sync::Arc::ptr_eq(dst.storage(), src.storage()) && dst.layout() != src.layout();
    if dst.is_contiguous() && !overlaps {
        return binary(cx, op, dst, dst, src);
    }
    let t = cx.scratch(dst, dst.shape(), dst.dtype())?;
    binary(cx, op, &t, dst, src)?;
    copy(cx, dst, &t)
}

pub(super) fn unary(cx: Ctx<'_>, op: UnaryOp, out: &Tensor, x: &Tensor) -> Result<()> {
    let name = op.name();
    check_float(name, &[out, x])?;
    let (family, p) = match op {
        UnaryOp::Exp => ("exp", None),
        UnaryOp::Log => ("log", None),
        UnaryOp::Sqrt => ("sqrt", None),
        UnaryOp::Rsqrt => ("rsqrt", None),
        UnaryOp::Tanh => ("tanh", None),
        UnaryOp::Sigmoid => ("sigmoid", None),
        UnaryOp::Relu => ("relu", None),
        UnaryOp::Neg => ("neg", None),
        UnaryOp::Abs => ("abs", None),
        UnaryOp::Sin => ("sin", None),
        UnaryOp::Cos => ("cos", None),
        UnaryOp::Log1p => ("log1p", None),
        UnaryOp::Reciprocal => ("reciprocal", None),
        UnaryOp::Square => ("square", None),
        UnaryOp::Pow(p) => ("pow_scalar", Some(p)),
        UnaryOp::Gelu => ("gelu", None),
        UnaryOp::GeluTanh => ("gelu_tanh", None),
        UnaryOp::Silu => ("silu", None),
        UnaryOp::LeakyRelu(p) => ("leaky_relu", Some(p)),
    };
    let n = out.numel();
    let launch = |x: &Tensor, o: &Tensor| -> Result<()> {
        let mut args = vec![n_arg(n)];
        if let Some(p) = p {
            args.push(KernelArg::F32(p as f32));
        }
        args.extend([ptr(x, name)?, ptr(o, name)?]);
        cx.launch_n(name, "elementwise.cu", &format!("{family}_{}", suffix(o.dtype())), n, &args)
    };
    if same_dtype(out, &[x]) {
        return launch(&contiguous_as(cx, x, out.shape())?, out);
    }
    let x = f32_contiguous(cx, x)?;
    into_f32_out(cx, out, |o| launch(&x, o))
}

/// The number of an op in `unary_grad_f32`'s switch, for the ops without their own kernel.
fn unary_grad_code(op: UnaryOp) -> Option<(i32, f64)> {
    Some(match op {
        UnaryOp::Exp => (0, 0.0),
        UnaryOp::Log => (1, 0.0),
        UnaryOp::Sqrt => (2, 0.0),
        UnaryOp::Rsqrt => (3, 0.0),
        UnaryOp::Neg => (4, 0.0),
        UnaryOp::Abs => (5, 0.0),
        UnaryOp::Sin => (6, 0.0),
        UnaryOp::Cos => (7, 0.0),
        UnaryOp::Log1p => (8, 0.0),
        UnaryOp::Reciprocal => (9, 0.0),
        UnaryOp::Square => (10, 0.0),
        UnaryOp::Pow(p) => (11, p),
        UnaryOp::LeakyRelu(p) => (12, p),
        _ => return None,
    })
}

pub(super) fn unary_backward(cx: Ctx<'_>, op: UnaryOp, out: &Tensor, grad: &Tensor, saved: &Tensor) -> Result<()> {
    let name = op.backward_name();
    check_float(name, &[out, grad, saved])?;
    let n = out.numel();
    let launch = |g: &Tensor, s: &Tensor, o: &Tensor| -> Result<()> {
        let own = match op {
            UnaryOp::Relu => Some("relu_backward"),
            UnaryOp::Sigmoid => Some("sigmoid_backward"),
            UnaryOp::Tanh => Some("tanh_backward"),
            UnaryOp::Silu => Some("silu_backward"),
            UnaryOp::Gelu => Some("gelu_backward"),
            UnaryOp::GeluTanh => Some("gelu_tanh_backward"),
            _ => None,
        };
        let sfx = suffix(o.dtype());
        if let Some(family) = own {
            return cx.launch_n(
                name,
                "activation_backward.cu",
                &format!("{family}_{sfx}"),
                n,
                &[n_arg(n), ptr(s, name)?, ptr(g, name)?, ptr(o, name)?],
            );
        }
        let Some((code, p)) = unary_grad_code(op) else {
            return Err(TensorError::invalid(name, "internal: this unary op has no CUDA gradient kernel"));
        };
        let args =
            [n_arg(n), KernelArg::I32(code), KernelArg::F32(p as f32), ptr(s, name)?, ptr(g, name)?, ptr(o, name)?];
        cx.launch_n(name, "activation_backward.cu", &format!("unary_grad_{sfx}"), n, &args)
    };
    if same_dtype(out, &[grad, saved]) {
        // Both operands contiguous of out's shape in their own dtype (they may broadcast to it).
        let (g, s) = (contiguous_as(cx, grad, out.shape())?, contiguous_as(cx, saved, out.shape())?);
        return launch(&g, &s, out);
    }
    // Mixed dtypes: both operands as contiguous f32 of out's shape.
    let full = |t: &Tensor| -> Result<Tensor> {
        if t.dtype() == DType::F32 && t.is_contiguous() && t.shape() == out.shape() {
            return Ok(t.clone());
        }
        let c = cx.scratch(out, out.shape(), DType::F32)?;
        copy(cx, &c, t)?;
        Ok(c)
    };
    let (g, s) = (full(grad)?, full(saved)?);
    into_f32_out(cx, out, |o| launch(&g, &s, o))
}

pub(super) fn clamp(cx: Ctx<'_>, out: &Tensor, x: &Tensor, lo: f64, hi: f64) -> Result<()> {
    check_float("clamp", &[out, x])?;
    let n = out.numel();
    let launch = |x: &Tensor, o: &Tensor| -> Result<()> {
        let args = [n_arg(n), KernelArg::F32(lo as f32), KernelArg::F32(hi as f32), ptr(x, "clamp")?, ptr(o, "clamp")?];
        cx.launch_n("clamp", "elementwise.cu", &format!("clamp_{}", suffix(o.dtype())), n, &args)
    };
    if same_dtype(out, &[x]) {
        return launch(&contiguous_as(cx, x, out.shape())?, out);
    }
    let x = f32_contiguous(cx, x)?;
    into_f32_out(cx, out, |o| launch(&x, o))
}

/// The comparison kernel of `op` for operands of dtype `d` (f32, f16, bf16 or i64).
fn compare_kernel(op: CompareOp, d: DType) -> String {
    let family = match op {
        CompareOp::Eq => "eq",
        CompareOp::Ne => "ne",
        CompareOp::Lt => "lt",
        CompareOp::Le => "le",
        CompareOp::Gt => "gt",
        CompareOp::Ge => "ge",
    };
    let sfx = if d == DType::I64 { "i64" } else { suffix(d) };
    format!("{family}_{sfx}")
}

/// `t` as the operand of a comparison kernel: f32 for the float dtypes and for u8/bool (exact),
/// i64 for i64 and i32 (exact); f64 refused.
fn compare_operand(cx: Ctx<'_>, t: &Tensor, op: &'static str) -> Result<Tensor> {
    let to = match t.dtype() {
        DType::F64 => return Err(TensorError::UnsupportedDType { op, dtype: DType::F64 }),
        DType::I64 => return Ok(t.clone()),
        DType::I32 => DType::I64,
        DType::F32 => return Ok(t.clone()),
        _ => DType::F32,
    };
    let c = cx.scratch(t, t.shape(), to)?;
    copy(cx, &c, t)?;
    Ok(c)
}

pub(super) fn compare(cx: Ctx<'_>, op: CompareOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    let name = op.name();
    // Two f16 (or two bf16) operands are compared as they are (widening to f32 is exact).
    if a.dtype() == b.dtype() && matches!(a.dtype(), DType::F16 | DType::BF16) {
        return broadcast_kernel(cx, name, &compare_kernel(op, a.dtype()), out, a, b);
    }
    let (a, b) = (compare_operand(cx, a, name)?, compare_operand(cx, b, name)?);
    if a.dtype() != b.dtype() {
        return Err(TensorError::DTypeMismatch { op: name, lhs: a.dtype(), rhs: b.dtype() });
    }
    broadcast_kernel(cx, name, &compare_kernel(op, a.dtype()), out, &a, &b)
}

pub(super) fn compare_scalar(cx: Ctx<'_>, op: CompareOp, out: &Tensor, a: &Tensor, s: f64) -> Result<()> {
    if !matches!(a.dtype(), DType::I64 | DType::I32) {
        let a = compare_operand(cx, a, op.name())?;
        let s = scalar_f32(cx, &a, s)?;
        return broadcast_kernel(cx, op.name(), &compare_kernel(op, DType::F32), out, &a, &s);
    }
    // Integers against a scalar, exactly: a fractional or infinite scalar becomes the integer
    // bound with the same answer for every integer (x < 2.5 ⟺ x < 3), or a constant.
    let constant = |v: bool| super::data::fill(cx, out, if v { 1.0 } else { 0.0 });
    if s.is_nan() {
        return constant(op == CompareOp::Ne);
    }
    if s.is_infinite() || s.abs() >= 9.2e18 {
        let above = s > 0.0; // the scalar is above every i64
        return constant(match op {
            CompareOp::Eq => false,
            CompareOp::Ne => true,
            CompareOp::Lt | CompareOp::Le => above,
            CompareOp::Gt | CompareOp::Ge => !above,
        });
    }
    let bound = match op {
        CompareOp::Eq | CompareOp::Ne if s.fract() != 0.0 => return constant(op == CompareOp::Ne),
        CompareOp::Lt | CompareOp::Ge => s.ceil(),
        _ => s.floor(),
    };
    let a = compare_operand(cx, a, op.name())?;
    // The bound as a one-element i64 device tensor: a fill kernel, not an upload (a comparison
    // with a scalar runs in every step, e.g. cross entropy's `target != ignore_index`).
    let b = cx.scratch(&a, &[], DType::I64)?;
    super::data::fill(cx, &b, bound)?;
    broadcast_kernel(cx, op.name(), &compare_kernel(op, DType::I64), out, &a, &b)
}

pub(super) fn logical(cx: Ctx<'_>, op: LogicalOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    let name = match op {
        LogicalOp::And => "logical_and",
        LogicalOp::Or => "logical_or",
    };
    if let Some(t) = [out, a, b].into_iter().find(|t| t.dtype() != DType::Bool) {
        return Err(TensorError::UnsupportedDType { op: name, dtype: t.dtype() });
    }
    let kernel = match op {
        LogicalOp::And => "and_bool",
        LogicalOp::Or => "or_bool",
    };
    broadcast_kernel(cx, name, kernel, out, a, b)
}

pub(super) fn where_cond(cx: Ctx<'_>, out: &Tensor, cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    const OP: &str = "where";
    if cond.dtype() != DType::Bool {
        return Err(TensorError::UnsupportedDType { op: OP, dtype: cond.dtype() });
    }
    // A selection moves elements without computing: one kernel per element width, every dtype.
    let kernel = match out.dtype().size_in_bytes() {
        1 => "where_b8",
        2 => "where_b16",
        4 => "where_b32",
        _ => "where_b64",
    };
    let shape = out.shape();
    let (sc, sa, sb) = (strides_to(cond, shape, OP)?, strides_to(a, shape, OP)?, strides_to(b, shape, OP)?);
    let (s, st) = merge_dims(shape, &[&contiguous_strides(shape), &sc, &sa, &sb]);
    if s.len() > MAX_DIMS {
        return Err(cx.too_many_dims(OP, shape.len(), MAX_DIMS));
    }
    let n = out.numel();
    let args = [
        n_arg(n),
        KernelArg::record(&broadcast3(&s, &st[1], &st[2], &st[3])),
        ptr(cond, OP)?,
        ptr(a, OP)?,
        ptr(b, OP)?,
        ptr(out, OP)?,
    ];
    cx.launch_n(OP, "elementwise.cu", kernel, n, &args)
}
