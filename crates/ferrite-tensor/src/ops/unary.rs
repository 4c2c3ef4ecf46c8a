//! Unary elementwise math with fused backward kernels (`grad_in = grad_out * f'(saved)`).
//!
//! The op layer decides dtypes, allocates, and records what backward needs; the math of each
//! function lives in the kernel backends (`backend::UnaryOp`).

use std::borrow::Cow;

use crate::autograd::{BackwardFn, SavedTensor};
use crate::backend::UnaryOp;
use crate::error::{Result, TensorError};
use crate::ops::copy::materialize;
use crate::{DType, Tensor};

fn float_input(x: &Tensor, op: &'static str) -> Result<Tensor> {
    match x.dtype() {
        d if d.is_floating_point() => Ok(x.clone()),
        DType::Bool => Err(TensorError::UnsupportedDType { op, dtype: DType::Bool }),
        _ => materialize(x, DType::F32),
    }
}

pub(crate) fn unary_raw(op: UnaryOp, x: &Tensor) -> Result<Tensor> {
    let x = float_input(x, op.name())?;
    let out = x.empty_like_shape(x.shape(), x.dtype())?;
    out.kernels().unary(op, &out, &x)?;
    Ok(out)
}

fn unary_grad_raw(op: UnaryOp, g: &Tensor, s: &Tensor) -> Result<Tensor> {
    let dtype = s.dtype();
    let g = if g.dtype() != dtype { materialize(g, dtype)? } else { g.clone() };
    let out = g.empty_like_shape(s.shape(), dtype)?;
    out.kernels().unary_backward(op, &out, &g, s)?;
    Ok(out)
}

struct UnaryBackward {
    saved: SavedTensor,
    op: UnaryOp,
}

impl BackwardFn for UnaryBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(self.op.backward_name())
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None]) };
        let s = self.saved.get(self.op.backward_name())?;
        Ok(vec![Some(unary_grad_raw(self.op, g, s)?)])
    }
}

fn apply(op: UnaryOp, x: &Tensor) -> Result<Tensor> {
    let out = unary_raw(op, x)?;
    if !Tensor::needs_graph(&[x]) {
        return Ok(out);
    }
    let saved = if op.derivative_from_output() { SavedTensor::new(&out) } else { SavedTensor::new(x) };
    Ok(Tensor::from_op1(out, &[x], UnaryBackward { saved, op }))
}

struct ClampBackward {
    x: SavedTensor,
    min: Option<f64>,
    max: Option<f64>,
}
impl BackwardFn for ClampBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("ClampBackward1")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None]) };
        let x = self.x.get("ClampBackward1")?;
        let mut mask = x.ge_scalar(self.min.unwrap_or(f64::NEG_INFINITY))?;
        mask = mask.logical_and(&x.le_scalar(self.max.unwrap_or(f64::INFINITY))?)?;
        Ok(vec![Some(crate::ops::binary::arith_raw(crate::backend::BinaryOp::Mul, g, &mask.to_dtype(g.dtype())?)?)])
    }
}

impl Tensor {
    pub fn exp(&self) -> Result<Tensor> {
        apply(UnaryOp::Exp, self)
    }
    pub fn log(&self) -> Result<Tensor> {
        apply(UnaryOp::Log, self)
    }
    pub fn sqrt(&self) -> Result<Tensor> {
        apply(UnaryOp::Sqrt, self)
    }
    pub fn rsqrt(&self) -> Result<Tensor> {
        apply(UnaryOp::Rsqrt, self)
    }
    pub fn tanh(&self) -> Result<Tensor> {
        apply(UnaryOp::Tanh, self)
    }
    pub fn sigmoid(&self) -> Result<Tensor> {
        apply(UnaryOp::Sigmoid, self)
    }
    pub fn relu(&self) -> Result<Tensor> {
        apply(UnaryOp::Relu, self)
    }
    pub fn neg(&self) -> Result<Tensor> {
        apply(UnaryOp::Neg, self)
    }
    pub fn abs(&self) -> Result<Tensor> {
        apply(UnaryOp::Abs, self)
    }
    pub fn sin(&self) -> Result<Tensor> {
        apply(UnaryOp::Sin, self)
    }
    pub fn cos(&self) -> Result<Tensor> {
        apply(UnaryOp::Cos, self)
    }
    pub fn log1p(&self) -> Result<Tensor> {
        apply(UnaryOp::Log1p, self)
    }
    pub fn reciprocal(&self) -> Result<Tensor> {
        apply(UnaryOp::Reciprocal, self)
    }
    pub fn square(&self) -> Result<Tensor> {
        apply(UnaryOp::Square, self)
    }
    /// `self ** exponent` for a scalar exponent (PyTorch's `pow` with a number).
    pub fn pow_scalar(&self, exponent: f64) -> Result<Tensor> {
        apply(UnaryOp::Pow(exponent), self)
    }
    /// GELU with the exact erf formulation (PyTorch's default `approximate='none'`).
    pub fn gelu(&self) -> Result<Tensor> {
        apply(UnaryOp::Gelu, self)
    }
    /// GELU with the tanh approximation (`approximate='tanh'`).
    pub fn gelu_tanh(&self) -> Result<Tensor> {
        apply(UnaryOp::GeluTanh, self)
    }
    pub fn silu(&self) -> Result<Tensor> {
        apply(UnaryOp::Silu, self)
    }
    pub fn leaky_relu(&self, negative_slope: f64) -> Result<Tensor> {
        apply(UnaryOp::LeakyRelu(negative_slope), self)
    }

    /// Clamp into `[min, max]` (either bound optional). Gradient passes where not clamped.
    /// PyTorch's rules at the edges: `min(max(x, min), max)`, so a `min` above `max` sets every
    /// element to `max`; a NaN element stays NaN; a NaN bound makes a floating-point result NaN.
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
        let lo = min.unwrap_or(f64::NEG_INFINITY);
        let hi = max.unwrap_or(f64::INFINITY);
        let out = self.empty_like_shape(self.shape(), self.dtype())?;
        if (lo.is_nan() || hi.is_nan()) && self.dtype().is_floating_point() {
            out.kernels().fill(&out, f64::NAN)?;
        } else {
            // The kernels clamp with lo <= hi; a lower bound above the upper one is the upper one.
            out.kernels().clamp(&out, self, lo.min(hi), hi)?;
        }
        if !Tensor::needs_graph(&[self]) {
            return Ok(out);
        }
        Ok(Tensor::from_op1(out, &[self], ClampBackward { x: SavedTensor::new(self), min, max }))
    }
}
