//! Binary elementwise ops with broadcasting and PyTorch type promotion.

use std::borrow::Cow;

use crate::autograd::{BackwardFn, SavedTensor};
use crate::backend::{BinaryOp, CompareOp, LogicalOp};
use crate::error::{Result, TensorError};
use crate::layout::broadcast_shapes;
use crate::ops::copy::{check_inplace, materialize};
use crate::ops::{check_same_device, promote_types, promote_with_scalar};
use crate::{DType, Tensor};

/// Result dtype of an arithmetic op (true division of integers gives float32, like PyTorch).
fn arith_dtype(op: BinaryOp, d: DType) -> DType {
    if !d.is_floating_point() && !op.defined_on_integers() { DType::F32 } else { d }
}

/// Compute `op(a, b)` into a fresh tensor of the broadcast shape (no autograd).
pub(crate) fn arith_raw(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let name = op.name();
    check_same_device(name, a, b)?;
    let dtype = arith_dtype(op, promote_types(a.dtype(), b.dtype()));
    if dtype == DType::Bool {
        return Err(TensorError::UnsupportedDType { op: name, dtype });
    }
    let ca;
    let a = if a.dtype() != dtype {
        ca = materialize(a, dtype)?;
        &ca
    } else {
        a
    };
    let cb;
    let b = if b.dtype() != dtype {
        cb = materialize(b, dtype)?;
        &cb
    } else {
        b
    };
    let out = if a.shape() == b.shape() {
        a.empty_like_shape(a.shape(), dtype)?
    } else {
        a.empty_like_shape(&broadcast_shapes(a.shape(), b.shape(), name)?, dtype)?
    };
    out.kernels().binary(op, &out, a, b)?;
    Ok(out)
}

/// Compute `op(a, s)` for a scalar `s` (no autograd).
pub(crate) fn arith_scalar_raw(op: BinaryOp, a: &Tensor, s: f64) -> Result<Tensor> {
    let is_float_scalar = s.fract() != 0.0 || !s.is_finite() || !op.defined_on_integers();
    let dtype = promote_with_scalar(a.dtype(), is_float_scalar);
    let dtype = if dtype == DType::Bool { if is_float_scalar { DType::F32 } else { DType::I64 } } else { dtype };
    let a = if a.dtype() != dtype { materialize(a, dtype)? } else { a.clone() };
    let out = a.empty_like_shape(a.shape(), dtype)?;
    out.kernels().binary_scalar(op, &out, &a, s)?;
    Ok(out)
}

/// In place `dst = op(dst, src)` (src broadcast to dst), no autograd checks.
pub(crate) fn arith_inplace_raw(op: BinaryOp, dst: &Tensor, src: &Tensor) -> Result<()> {
    let name = op.name();
    check_same_device(name, dst, src)?;
    broadcast_shapes(dst.shape(), src.shape(), name).and_then(|s| {
        if s.as_slice() != dst.shape() {
            // `src` broadcasts with `dst` but to a larger shape than `dst` can hold.
            Err(TensorError::ExpandMismatch { op: name, shape: src.shape().to_vec(), target: dst.shape().to_vec() })
        } else {
            Ok(())
        }
    })?;
    if dst.dtype() == DType::Bool || (!dst.dtype().is_floating_point() && !op.defined_on_integers()) {
        return Err(TensorError::UnsupportedDType { op: name, dtype: dst.dtype() });
    }
    // Temporaries are allocated on every device (meta included) so meta runs account the same.
    let src = if src.dtype() != dst.dtype() { materialize(src, dst.dtype())? } else { src.clone() };
    dst.kernels().binary_inplace(op, dst, &src)
}

/// In place `dst = op(dst, s)`.
pub(crate) fn arith_scalar_inplace_raw(op: BinaryOp, dst: &Tensor, s: f64) -> Result<()> {
    let sv = crate::ops::creation::full_on(dst.storage().allocator(), &[], dst.dtype(), s)?;
    arith_inplace_raw(op, dst, &sv)
}

/// Reduce a broadcast gradient back to `shape` (sum over broadcast dims) and cast to `dtype`.
pub(crate) fn reduce_grad(g: &Tensor, shape: &[usize], dtype: DType) -> Result<Tensor> {
    let r = g.sum_to_shape(shape)?;
    r.to_dtype(dtype)
}

/// One operand's gradient of a binary op, when that operand needs one: `grad()` summed over the
/// dimensions it was broadcast along and cast to its dtype.
fn operand_grad(need: bool, operand: &Tensor, grad: impl FnOnce() -> Result<Tensor>) -> Result<Option<Tensor>> {
    if !need {
        return Ok(None);
    }
    Ok(Some(reduce_grad(&grad()?, operand.shape(), operand.dtype())?))
}

struct AddBackward {
    a: (Vec<usize>, DType),
    b: (Vec<usize>, DType),
    alpha_b: f64,
    name: &'static str,
    /// Which operands need a gradient: a frozen bias (LoRA's base) gets no reduction over the
    /// batch in backward.
    need: [bool; 2],
}
impl AddBackward {
    /// `out = a + alpha_b * b`: gradients need only the operands' shapes and dtypes.
    fn record(a: &Tensor, b: &Tensor, alpha_b: f64, name: &'static str, out: Tensor) -> Tensor {
        let f = AddBackward {
            a: (a.shape().to_vec(), a.dtype()),
            b: (b.shape().to_vec(), b.dtype()),
            alpha_b,
            name,
            need: needs(a, b),
        };
        Tensor::from_op1(out, &[a, b], f)
    }
}
impl BackwardFn for AddBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(self.name)
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None, None]) };
        let ga = if self.need[0] { Some(reduce_grad(g, &self.a.0, self.a.1)?) } else { None };
        let gb = if self.need[1] {
            let gb = if self.alpha_b == 1.0 { g.clone() } else { arith_scalar_raw(BinaryOp::Mul, g, self.alpha_b)? };
            Some(reduce_grad(&gb, &self.b.0, self.b.1)?)
        } else {
            None
        };
        Ok(vec![ga, gb])
    }
}

/// The binary ops whose gradients need the operands themselves.
enum OperandRule {
    Mul,
    Div,
    /// `a ** b`; the output is saved for `b`'s gradient (`out * ln a`).
    Pow {
        out: SavedTensor,
    },
}

/// Backward of `mul`, `div` and `pow`: one saved pair of operands, one formula per rule.
struct OperandsBackward {
    rule: OperandRule,
    a: SavedTensor,
    b: SavedTensor,
    need: [bool; 2],
}

impl OperandsBackward {
    fn record(rule: OperandRule, a: &Tensor, b: &Tensor, out: Tensor) -> Tensor {
        let f = OperandsBackward { rule, a: SavedTensor::new(a), b: SavedTensor::new(b), need: needs(a, b) };
        Tensor::from_op1(out, &[a, b], f)
    }
}

impl BackwardFn for OperandsBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(match self.rule {
            OperandRule::Mul => "MulBackward0",
            OperandRule::Div => "DivBackward0",
            OperandRule::Pow { .. } => "PowBackward1",
        })
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None, None]) };
        let name = self.name();
        let a = self.a.get(name.clone())?;
        let b = self.b.get(name.clone())?;
        let [need_a, need_b] = self.need;
        let (ga, gb) = match &self.rule {
            OperandRule::Mul => (
                operand_grad(need_a, a, || arith_raw(BinaryOp::Mul, g, b))?,
                operand_grad(need_b, b, || arith_raw(BinaryOp::Mul, g, a))?,
            ),
            OperandRule::Div => (
                operand_grad(need_a, a, || arith_raw(BinaryOp::Div, g, b))?,
                operand_grad(need_b, b, || {
                    // -g * a / b^2
                    let t = arith_raw(BinaryOp::Mul, g, a)?;
                    let t = arith_raw(BinaryOp::Div, &t, b)?;
                    let t = arith_raw(BinaryOp::Div, &t, b)?;
                    arith_scalar_raw(BinaryOp::Mul, &t, -1.0)
                })?,
            ),
            OperandRule::Pow { out } => (
                operand_grad(need_a, a, || {
                    // g * b * a^(b-1)
                    let bm1 = arith_scalar_raw(BinaryOp::Sub, b, 1.0)?;
                    let t = arith_raw(BinaryOp::Pow, a, &bm1)?;
                    let t = arith_raw(BinaryOp::Mul, &t, b)?;
                    arith_raw(BinaryOp::Mul, g, &t)
                })?,
                operand_grad(need_b, b, || {
                    // g * out * ln(a)
                    let t = arith_raw(BinaryOp::Mul, out.get(name.clone())?, &a.log()?)?;
                    arith_raw(BinaryOp::Mul, g, &t)
                })?,
            ),
        };
        Ok(vec![ga, gb])
    }
}

struct MinMaxBackward {
    a: SavedTensor,
    b: SavedTensor,
    is_max: bool,
}
impl BackwardFn for MinMaxBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(if self.is_max { "MaximumBackward0" } else { "MinimumBackward0" })
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None, None]) };
        let a = self.a.get("MaximumBackward0")?;
        let b = self.b.get("MaximumBackward0")?;
        // Ties split the gradient in half, like PyTorch.
        let pick_a = if self.is_max { a.gt(b)? } else { a.lt(b)? };
        let tie = a.eq(b)?;
        let wa = arith_raw(
            BinaryOp::Add,
            &pick_a.to_dtype(g.dtype())?,
            &arith_scalar_raw(BinaryOp::Mul, &tie.to_dtype(g.dtype())?, 0.5)?,
        )?;
        let wb = arith_scalar_raw(BinaryOp::RSub, &wa, 1.0)?;
        let ga = reduce_grad(&arith_raw(BinaryOp::Mul, g, &wa)?, a.shape(), a.dtype())?;
        let gb = reduce_grad(&arith_raw(BinaryOp::Mul, g, &wb)?, b.shape(), b.dtype())?;
        Ok(vec![Some(ga), Some(gb)])
    }
}

struct ScalarMulBackward {
    s: f64,
    dtype: DType,
    name: &'static str,
}
impl BackwardFn for ScalarMulBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(self.name)
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None]) };
        let r = if self.s == 1.0 { g.clone() } else { arith_scalar_raw(BinaryOp::Mul, g, self.s)? };
        Ok(vec![Some(r.to_dtype(self.dtype)?)])
    }
}

struct RDivBackward {
    a: SavedTensor,
    s: f64,
}
impl BackwardFn for RDivBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("DivBackward0")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None]) };
        let a = self.a.get("DivBackward0")?;
        // d(s/a) = -s / a^2
        let t = arith_raw(BinaryOp::Div, g, a)?;
        let t = arith_raw(BinaryOp::Div, &t, a)?;
        Ok(vec![Some(arith_scalar_raw(BinaryOp::Mul, &t, -self.s)?)])
    }
}

fn needs(a: &Tensor, b: &Tensor) -> [bool; 2] {
    [a.requires_grad(), b.requires_grad()]
}

impl Tensor {
    /// `self + other` with broadcasting.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        let out = arith_raw(BinaryOp::Add, self, other)?;
        if !Tensor::needs_graph(&[self, other]) {
            return Ok(out);
        }
        Ok(AddBackward::record(self, other, 1.0, "AddBackward0", out))
    }

    /// `self + alpha * other` (PyTorch's `add(other, alpha=)`).
    pub fn add_scaled(&self, other: &Tensor, alpha: f64) -> Result<Tensor> {
        let scaled = if alpha == 1.0 { other.clone() } else { arith_scalar_raw(BinaryOp::Mul, other, alpha)? };
        let out = arith_raw(BinaryOp::Add, self, &scaled)?;
        if !Tensor::needs_graph(&[self, other]) {
            return Ok(out);
        }
        Ok(AddBackward::record(self, other, alpha, "AddBackward0", out))
    }

    /// `self - other` with broadcasting.
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        let out = arith_raw(BinaryOp::Sub, self, other)?;
        if !Tensor::needs_graph(&[self, other]) {
            return Ok(out);
        }
        Ok(AddBackward::record(self, other, -1.0, "SubBackward0", out))
    }

    /// `self * other` with broadcasting.
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        let out = arith_raw(BinaryOp::Mul, self, other)?;
        if !Tensor::needs_graph(&[self, other]) {
            return Ok(out);
        }
        Ok(OperandsBackward::record(OperandRule::Mul, self, other, out))
    }

    /// `self / other` (true division; integers give float32).
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        let out = arith_raw(BinaryOp::Div, self, other)?;
        if !Tensor::needs_graph(&[self, other]) {
            return Ok(out);
        }
        Ok(OperandsBackward::record(OperandRule::Div, self, other, out))
    }

    /// `self ** other` elementwise (see [`pow_scalar`](Self::pow_scalar) for a number).
    pub fn pow(&self, other: &Tensor) -> Result<Tensor> {
        let out = arith_raw(BinaryOp::Pow, self, other)?;
        if !Tensor::needs_graph(&[self, other]) {
            return Ok(out);
        }
        let rule = OperandRule::Pow { out: SavedTensor::new(&out) };
        Ok(OperandsBackward::record(rule, self, other, out))
    }

    /// Elementwise maximum (NaN propagates).
    pub fn maximum(&self, other: &Tensor) -> Result<Tensor> {
        let out = arith_raw(BinaryOp::Maximum, self, other)?;
        if !Tensor::needs_graph(&[self, other]) {
            return Ok(out);
        }
        Ok(Tensor::from_op1(
            out,
            &[self, other],
            MinMaxBackward { a: SavedTensor::new(self), b: SavedTensor::new(other), is_max: true },
        ))
    }

    /// Elementwise minimum (NaN propagates).
    pub fn minimum(&self, other: &Tensor) -> Result<Tensor> {
        let out = arith_raw(BinaryOp::Minimum, self, other)?;
        if !Tensor::needs_graph(&[self, other]) {
            return Ok(out);
        }
        Ok(Tensor::from_op1(
            out,
            &[self, other],
            MinMaxBackward { a: SavedTensor::new(self), b: SavedTensor::new(other), is_max: false },
        ))
    }

    fn scalar_linear(&self, op: BinaryOp, s: f64, grad_scale: f64, name: &'static str) -> Result<Tensor> {
        let out = arith_scalar_raw(op, self, s)?;
        if !Tensor::needs_graph(&[self]) {
            return Ok(out);
        }
        Ok(Tensor::from_op1(out, &[self], ScalarMulBackward { s: grad_scale, dtype: self.dtype(), name }))
    }

    /// `self + s`.
    pub fn add_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_linear(BinaryOp::Add, s, 1.0, "AddBackward1")
    }
    /// `self - s`.
    pub fn sub_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_linear(BinaryOp::Sub, s, 1.0, "SubBackward1")
    }
    /// `s - self`.
    pub fn rsub_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_linear(BinaryOp::RSub, s, -1.0, "RsubBackward1")
    }
    /// `self * s`.
    pub fn mul_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_linear(BinaryOp::Mul, s, s, "MulBackward1")
    }
    /// `self / s`.
    pub fn div_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_linear(BinaryOp::Div, s, 1.0 / s, "DivBackward1")
    }
    /// `s / self`.
    pub fn rdiv_scalar(&self, s: f64) -> Result<Tensor> {
        let out = arith_scalar_raw(BinaryOp::RDiv, self, s)?;
        if !Tensor::needs_graph(&[self]) {
            return Ok(out);
        }
        Ok(Tensor::from_op1(out, &[self], RDivBackward { a: SavedTensor::new(self), s }))
    }

    // ------------------------------------------------------------------ in place

    /// `self += other` in place (bumps the version counter).
    pub fn add_(&self, other: &Tensor) -> Result<()> {
        check_inplace("add_", self, &[other])?;
        arith_inplace_raw(BinaryOp::Add, self, other)?;
        self.storage().bump_version();
        Ok(())
    }
    /// `self += alpha * other` in place.
    pub fn add_scaled_(&self, other: &Tensor, alpha: f64) -> Result<()> {
        check_inplace("add_", self, &[other])?;
        let o = if alpha == 1.0 { other.clone() } else { arith_scalar_raw(BinaryOp::Mul, other, alpha)? };
        arith_inplace_raw(BinaryOp::Add, self, &o)?;
        self.storage().bump_version();
        Ok(())
    }
    /// `self -= other` in place.
    pub fn sub_(&self, other: &Tensor) -> Result<()> {
        check_inplace("sub_", self, &[other])?;
        arith_inplace_raw(BinaryOp::Sub, self, other)?;
        self.storage().bump_version();
        Ok(())
    }
    /// `self *= other` in place.
    pub fn mul_(&self, other: &Tensor) -> Result<()> {
        check_inplace("mul_", self, &[other])?;
        arith_inplace_raw(BinaryOp::Mul, self, other)?;
        self.storage().bump_version();
        Ok(())
    }
    /// `self /= other` in place.
    pub fn div_(&self, other: &Tensor) -> Result<()> {
        check_inplace("div_", self, &[other])?;
        arith_inplace_raw(BinaryOp::Div, self, other)?;
        self.storage().bump_version();
        Ok(())
    }
    /// `self += s` in place.
    pub fn add_scalar_(&self, s: f64) -> Result<()> {
        check_inplace("add_", self, &[])?;
        arith_scalar_inplace_raw(BinaryOp::Add, self, s)?;
        self.storage().bump_version();
        Ok(())
    }
    /// `self *= s` in place.
    pub fn mul_scalar_(&self, s: f64) -> Result<()> {
        check_inplace("mul_", self, &[])?;
        arith_scalar_inplace_raw(BinaryOp::Mul, self, s)?;
        self.storage().bump_version();
        Ok(())
    }

    /// Gradient accumulation helper for the engine: in place, no checks, no version bump needed
    /// (the gradient tensor is exclusively owned).
    pub(crate) fn add_assign_unchecked(&self, other: &Tensor) -> Result<()> {
        arith_inplace_raw(BinaryOp::Add, self, other)
    }

    // ------------------------------------------------------------------ comparisons

    fn compare(&self, other: &Tensor, op: CompareOp) -> Result<Tensor> {
        let name = op.name();
        check_same_device(name, self, other)?;
        let shape = broadcast_shapes(self.shape(), other.shape(), name)?;
        let dtype = promote_types(self.dtype(), other.dtype());
        let a = if self.dtype() != dtype { materialize(self, dtype)? } else { self.clone() };
        let b = if other.dtype() != dtype { materialize(other, dtype)? } else { other.clone() };
        let out = a.empty_like_shape(&shape, DType::Bool)?;
        out.kernels().compare(op, &out, &a, &b)?;
        Ok(out)
    }

    fn compare_scalar(&self, s: f64, op: CompareOp) -> Result<Tensor> {
        let out = self.empty_like_shape(self.shape(), DType::Bool)?;
        out.kernels().compare_scalar(op, &out, self, s)?;
        Ok(out)
    }

    pub fn eq(&self, o: &Tensor) -> Result<Tensor> {
        self.compare(o, CompareOp::Eq)
    }
    pub fn ne(&self, o: &Tensor) -> Result<Tensor> {
        self.compare(o, CompareOp::Ne)
    }
    pub fn lt(&self, o: &Tensor) -> Result<Tensor> {
        self.compare(o, CompareOp::Lt)
    }
    pub fn le(&self, o: &Tensor) -> Result<Tensor> {
        self.compare(o, CompareOp::Le)
    }
    pub fn gt(&self, o: &Tensor) -> Result<Tensor> {
        self.compare(o, CompareOp::Gt)
    }
    pub fn ge(&self, o: &Tensor) -> Result<Tensor> {
        self.compare(o, CompareOp::Ge)
    }
    pub fn eq_scalar(&self, s: f64) -> Result<Tensor> {
        self.compare_scalar(s, CompareOp::Eq)
    }
    pub fn ne_scalar(&self, s: f64) -> Result<Tensor> {
        self.compare_scalar(s, CompareOp::Ne)
    }
    pub fn lt_scalar(&self, s: f64) -> Result<Tensor> {
        self.compare_scalar(s, CompareOp::Lt)
    }
    pub fn le_scalar(&self, s: f64) -> Result<Tensor> {
        self.compare_scalar(s, CompareOp::Le)
    }
    pub fn gt_scalar(&self, s: f64) -> Result<Tensor> {
        self.compare_scalar(s, CompareOp::Gt)
    }
    pub fn ge_scalar(&self, s: f64) -> Result<Tensor> {
        self.compare_scalar(s, CompareOp::Ge)
    }

    /// Logical and of two bool tensors.
    pub fn logical_and(&self, o: &Tensor) -> Result<Tensor> {
        self.logical(o, LogicalOp::And)
    }
    /// Logical or of two bool tensors.
    pub fn logical_or(&self, o: &Tensor) -> Result<Tensor> {
        self.logical(o, LogicalOp::Or)
    }
    /// Logical not (any dtype: zero is false).
    pub fn logical_not(&self) -> Result<Tensor> {
        self.compare_scalar(0.0, CompareOp::Eq)
    }

    fn logical(&self, o: &Tensor, op: LogicalOp) -> Result<Tensor> {
        let name = if op == LogicalOp::And { "logical_and" } else { "logical_or" };
        let a = self.ne_scalar(0.0)?;
        let b = o.ne_scalar(0.0)?;
        check_same_device(name, &a, &b)?;
        let shape = broadcast_shapes(a.shape(), b.shape(), name)?;
        let out = a.empty_like_shape(&shape, DType::Bool)?;
        out.kernels().logical(op, &out, &a, &b)?;
        Ok(out)
    }
}
