//! Binary elementwise ops with broadcasting and PyTorch type promotion.

use std::borrow::Cow;

use num_traits::Float as NumFloat;

use crate::autograd::{BackwardFn, SavedTensor};
use crate::element::{Bool8, Element, Float, Int};
use crate::error::{Result, TensorError};
use crate::kernels::map::{map1, map1_contig, map2, update2, zip2_contig, In};
use crate::layout::broadcast_shapes;
use crate::ops::copy::{check_inplace, materialize};
use crate::ops::{check_same_device, promote_types, promote_with_scalar};
use crate::{DType, Tensor};

/// An arithmetic op, defined once for every float accumulation type and for integers.
pub(crate) trait Arith: Copy + Send + Sync + 'static {
    const NAME: &'static str;
    fn float<F: NumFloat>(x: F, y: F) -> F;
    /// `None` when the op is not defined on integers (true division, pow with float result).
    fn int(x: i64, y: i64) -> Option<i64>;
}

macro_rules! arith {
    ($name:ident, $s:expr, |$x:ident, $y:ident| $f:expr, |$a:ident, $b:ident| $i:expr) => {
        #[derive(Copy, Clone)]
        pub(crate) struct $name;
        impl Arith for $name {
            const NAME: &'static str = $s;
            #[inline(always)]
            fn float<F: NumFloat>($x: F, $y: F) -> F {
                $f
            }
            #[inline(always)]
            fn int($a: i64, $b: i64) -> Option<i64> {
                $i
            }
        }
    };
}

arith!(Add, "add", |x, y| x + y, |a, b| Some(a.wrapping_add(b)));
arith!(Sub, "sub", |x, y| x - y, |a, b| Some(a.wrapping_sub(b)));
arith!(Mul, "mul", |x, y| x * y, |a, b| Some(a.wrapping_mul(b)));
arith!(Div, "div", |x, y| x / y, |_a, _b| None);
arith!(Pow, "pow", |x, y| x.powf(y), |a, b| if b >= 0 { Some(a.wrapping_pow(b.min(u32::MAX as i64) as u32)) } else { None });
arith!(Maximum, "maximum", |x, y| if x.is_nan() || y.is_nan() { F::nan() } else if x > y { x } else { y }, |a, b| Some(a.max(b)));
arith!(Minimum, "minimum", |x, y| if x.is_nan() || y.is_nan() { F::nan() } else if x < y { x } else { y }, |a, b| Some(a.min(b)));
arith!(RSub, "rsub", |x, y| y - x, |a, b| Some(b.wrapping_sub(a)));
arith!(RDiv, "rdiv", |x, y| y / x, |_a, _b| None);

/// Result dtype of an arithmetic op (true division of integers gives float32, like PyTorch).
fn arith_dtype<O: Arith>(d: DType) -> DType {
    if !d.is_floating_point() && O::int(1, 1).is_none() { DType::F32 } else { d }
}

fn float_kernel<T: Float, O: Arith>(out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.shape() == out.shape() && b.shape() == out.shape() && a.is_contiguous() && b.is_contiguous() {
        return zip2_contig::<T, T, T>(out, a, b, |x, y| T::from_acc(O::float(x.to_acc(), y.to_acc())));
    }
    let ia = In::<T>::new(a, out.shape(), O::NAME)?;
    let ib = In::<T>::new(b, out.shape(), O::NAME)?;
    map2::<T, T, T>(out, &ia, &ib, |x, y| T::from_acc(O::float(x.to_acc(), y.to_acc())))
}

fn int_kernel<T: Int, O: Arith>(out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.shape() == out.shape() && b.shape() == out.shape() && a.is_contiguous() && b.is_contiguous() {
        return zip2_contig::<T, T, T>(out, a, b, |x, y| T::from_i64(O::int(x.to_i64(), y.to_i64()).unwrap_or(0)));
    }
    let ia = In::<T>::new(a, out.shape(), O::NAME)?;
    let ib = In::<T>::new(b, out.shape(), O::NAME)?;
    map2::<T, T, T>(out, &ia, &ib, |x, y| T::from_i64(O::int(x.to_i64(), y.to_i64()).unwrap_or(0)))
}

/// Compute `O(a, b)` into a fresh tensor of the broadcast shape (no autograd).
pub(crate) fn arith_raw<O: Arith>(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    check_same_device(O::NAME, a, b)?;
    let dtype = arith_dtype::<O>(promote_types(a.dtype(), b.dtype()));
    if dtype == DType::Bool {
        return Err(TensorError::UnsupportedDType { op: O::NAME, dtype });
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
        a.empty_like_shape(&broadcast_shapes(a.shape(), b.shape(), O::NAME)?, dtype)?
    };
    if out.is_meta() {
        return Ok(out);
    }
    match dtype {
        DType::F32 => float_kernel::<f32, O>(&out, a, b)?,
        DType::F64 => float_kernel::<f64, O>(&out, a, b)?,
        DType::F16 => float_kernel::<half::f16, O>(&out, a, b)?,
        DType::BF16 => float_kernel::<half::bf16, O>(&out, a, b)?,
        DType::I64 => int_kernel::<i64, O>(&out, a, b)?,
        DType::I32 => int_kernel::<i32, O>(&out, a, b)?,
        DType::U8 => int_kernel::<u8, O>(&out, a, b)?,
        DType::Bool => unreachable!("rejected above"),
    }
    Ok(out)
}

/// Compute `O(a, s)` for a scalar `s` (no autograd).
pub(crate) fn arith_scalar_raw<O: Arith>(a: &Tensor, s: f64) -> Result<Tensor> {
    let is_float_scalar = s.fract() != 0.0 || !s.is_finite() || O::int(1, 1).is_none();
    let dtype = promote_with_scalar(a.dtype(), is_float_scalar);
    let dtype = if dtype == DType::Bool { if is_float_scalar { DType::F32 } else { DType::I64 } } else { dtype };
    let a = if a.dtype() != dtype { materialize(a, dtype)? } else { a.clone() };
    let out = a.empty_like_shape(a.shape(), dtype)?;
    if out.is_meta() {
        return Ok(out);
    }
    fn fk<T: Float, O: Arith>(out: &Tensor, a: &Tensor, s: f64) -> Result<()> {
        let sv = T::acc_from_f64(s);
        if a.is_contiguous() {
            return map1_contig::<T, T>(out, a, move |x| T::from_acc(O::float(x.to_acc(), sv)));
        }
        let ia = In::<T>::new(a, out.shape(), O::NAME)?;
        map1::<T, T>(out, &ia, move |x| T::from_acc(O::float(x.to_acc(), sv)))
    }
    fn ik<T: Int, O: Arith>(out: &Tensor, a: &Tensor, s: f64) -> Result<()> {
        let ia = In::<T>::new(a, out.shape(), O::NAME)?;
        let sv = s as i64;
        map1::<T, T>(out, &ia, move |x| T::from_i64(O::int(x.to_i64(), sv).unwrap_or(0)))
    }
    match dtype {
        DType::F32 => fk::<f32, O>(&out, &a, s)?,
        DType::F64 => fk::<f64, O>(&out, &a, s)?,
        DType::F16 => fk::<half::f16, O>(&out, &a, s)?,
        DType::BF16 => fk::<half::bf16, O>(&out, &a, s)?,
        DType::I64 => ik::<i64, O>(&out, &a, s)?,
        DType::I32 => ik::<i32, O>(&out, &a, s)?,
        DType::U8 => ik::<u8, O>(&out, &a, s)?,
        DType::Bool => return Err(TensorError::UnsupportedDType { op: O::NAME, dtype }),
    }
    Ok(out)
}

/// In place `dst = O(dst, src)` (src broadcast to dst), no autograd checks.
pub(crate) fn arith_inplace_raw<O: Arith>(dst: &Tensor, src: &Tensor) -> Result<()> {
    check_same_device(O::NAME, dst, src)?;
    broadcast_shapes(dst.shape(), src.shape(), O::NAME).and_then(|s| {
        if s.as_slice() != dst.shape() {
            Err(TensorError::shape(O::NAME, format!("output with shape {:?} doesn't match the broadcast shape {:?}", dst.shape(), s)))
        } else {
            Ok(())
        }
    })?;
    // Temporaries are allocated on every device (meta included) so meta runs account the same.
    let src = if src.dtype() != dst.dtype() { materialize(src, dst.dtype())? } else { src.clone() };
    if dst.is_meta() {
        return Ok(());
    }
    fn fk<T: Float, O: Arith>(dst: &Tensor, src: &Tensor) -> Result<()> {
        let is = In::<T>::new(src, dst.shape(), O::NAME)?;
        update2::<T, T>(dst, &is, |d, s| T::from_acc(O::float(d.to_acc(), s.to_acc())))
    }
    fn ik<T: Int, O: Arith>(dst: &Tensor, src: &Tensor) -> Result<()> {
        let is = In::<T>::new(src, dst.shape(), O::NAME)?;
        update2::<T, T>(dst, &is, |d, s| T::from_i64(O::int(d.to_i64(), s.to_i64()).unwrap_or(0)))
    }
    match dst.dtype() {
        DType::F32 => fk::<f32, O>(dst, &src),
        DType::F64 => fk::<f64, O>(dst, &src),
        DType::F16 => fk::<half::f16, O>(dst, &src),
        DType::BF16 => fk::<half::bf16, O>(dst, &src),
        DType::I64 if O::int(1, 1).is_some() => ik::<i64, O>(dst, &src),
        DType::I32 if O::int(1, 1).is_some() => ik::<i32, O>(dst, &src),
        DType::U8 if O::int(1, 1).is_some() => ik::<u8, O>(dst, &src),
        d => Err(TensorError::UnsupportedDType { op: O::NAME, dtype: d }),
    }
}

/// In place `dst = O(dst, s)`.
pub(crate) fn arith_scalar_inplace_raw<O: Arith>(dst: &Tensor, s: f64) -> Result<()> {
    let sv = crate::ops::creation::full_on(dst.storage().allocator(), &[], dst.dtype(), s)?;
    arith_inplace_raw::<O>(dst, &sv)
}

/// Reduce a broadcast gradient back to `shape` (sum over broadcast dims) and cast to `dtype`.
pub(crate) fn reduce_grad(g: &Tensor, shape: &[usize], dtype: DType) -> Result<Tensor> {
    let r = g.sum_to_shape(shape)?;
    r.to_dtype(dtype)
}

struct AddBackward {
    a: (Vec<usize>, DType),
    b: (Vec<usize>, DType),
    alpha_b: f64,
    name: &'static str,
}
impl BackwardFn for AddBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(self.name)
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None, None]) };
        let ga = reduce_grad(g, &self.a.0, self.a.1)?;
        let gb = if self.alpha_b == 1.0 { g.clone() } else { arith_scalar_raw::<Mul>(g, self.alpha_b)? };
        let gb = reduce_grad(&gb, &self.b.0, self.b.1)?;
        Ok(vec![Some(ga), Some(gb)])
    }
}

struct MulBackward {
    a: SavedTensor,
    b: SavedTensor,
    need: [bool; 2],
}
impl BackwardFn for MulBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("MulBackward0")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None, None]) };
        let a = self.a.get("MulBackward0")?;
        let b = self.b.get("MulBackward0")?;
        let ga = if self.need[0] { Some(reduce_grad(&arith_raw::<Mul>(g, b)?, a.shape(), a.dtype())?) } else { None };
        let gb = if self.need[1] { Some(reduce_grad(&arith_raw::<Mul>(g, a)?, b.shape(), b.dtype())?) } else { None };
        Ok(vec![ga, gb])
    }
}

struct DivBackward {
    a: SavedTensor,
    b: SavedTensor,
    need: [bool; 2],
}
impl BackwardFn for DivBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("DivBackward0")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None, None]) };
        let a = self.a.get("DivBackward0")?;
        let b = self.b.get("DivBackward0")?;
        let ga = if self.need[0] { Some(reduce_grad(&arith_raw::<Div>(g, b)?, a.shape(), a.dtype())?) } else { None };
        let gb = if self.need[1] {
            // -g * a / b^2
            let t = arith_raw::<Mul>(g, a)?;
            let t = arith_raw::<Div>(&t, b)?;
            let t = arith_raw::<Div>(&t, b)?;
            let t = arith_scalar_raw::<Mul>(&t, -1.0)?;
            Some(reduce_grad(&t, b.shape(), b.dtype())?)
        } else {
            None
        };
        Ok(vec![ga, gb])
    }
}

struct PowBackward {
    a: SavedTensor,
    b: SavedTensor,
    out: SavedTensor,
    need: [bool; 2],
}
impl BackwardFn for PowBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("PowBackward1")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None, None]) };
        let a = self.a.get("PowBackward1")?;
        let b = self.b.get("PowBackward1")?;
        let ga = if self.need[0] {
            // g * b * a^(b-1)
            let bm1 = arith_scalar_raw::<Sub>(b, 1.0)?;
            let t = arith_raw::<Pow>(a, &bm1)?;
            let t = arith_raw::<Mul>(&t, b)?;
            Some(reduce_grad(&arith_raw::<Mul>(g, &t)?, a.shape(), a.dtype())?)
        } else {
            None
        };
        let gb = if self.need[1] {
            let out = self.out.get("PowBackward1")?;
            let t = arith_raw::<Mul>(out, &a.log()?)?;
            Some(reduce_grad(&arith_raw::<Mul>(g, &t)?, b.shape(), b.dtype())?)
        } else {
            None
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
        let tie = a.eq_t(b)?;
        let wa = arith_raw::<Add>(&pick_a.to_dtype(g.dtype())?, &arith_scalar_raw::<Mul>(&tie.to_dtype(g.dtype())?, 0.5)?)?;
        let wb = arith_scalar_raw::<RSub>(&wa, 1.0)?;
        let ga = reduce_grad(&arith_raw::<Mul>(g, &wa)?, a.shape(), a.dtype())?;
        let gb = reduce_grad(&arith_raw::<Mul>(g, &wb)?, b.shape(), b.dtype())?;
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
        let r = if self.s == 1.0 { g.clone() } else { arith_scalar_raw::<Mul>(g, self.s)? };
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
        let t = arith_raw::<Div>(g, a)?;
        let t = arith_raw::<Div>(&t, a)?;
        Ok(vec![Some(arith_scalar_raw::<Mul>(&t, -self.s)?)])
    }
}

fn needs(a: &Tensor, b: &Tensor) -> [bool; 2] {
    [a.requires_grad(), b.requires_grad()]
}

impl Tensor {
    /// `self + other` with broadcasting.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        let out = arith_raw::<Add>(self, other)?;
        if !Tensor::needs_graph(&[self, other]) {
            return Ok(out);
        }
        Ok(Tensor::from_op1(out, &[self, other], AddBackward { a: (self.shape().to_vec(), self.dtype()), b: (other.shape().to_vec(), other.dtype()), alpha_b: 1.0, name: "AddBackward0" }))
    }

    /// `self + alpha * other` (PyTorch's `add(other, alpha=)`).
    pub fn add_scaled(&self, other: &Tensor, alpha: f64) -> Result<Tensor> {
        let scaled = if alpha == 1.0 { other.clone() } else { arith_scalar_raw::<Mul>(other, alpha)? };
        let out = arith_raw::<Add>(self, &scaled)?;
        if !Tensor::needs_graph(&[self, other]) {
            return Ok(out);
        }
        Ok(Tensor::from_op1(out, &[self, other], AddBackward { a: (self.shape().to_vec(), self.dtype()), b: (other.shape().to_vec(), other.dtype()), alpha_b: alpha, name: "AddBackward0" }))
    }

    /// `self - other` with broadcasting.
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        let out = arith_raw::<Sub>(self, other)?;
        if !Tensor::needs_graph(&[self, other]) {
            return Ok(out);
        }
        Ok(Tensor::from_op1(out, &[self, other], AddBackward { a: (self.shape().to_vec(), self.dtype()), b: (other.shape().to_vec(), other.dtype()), alpha_b: -1.0, name: "SubBackward0" }))
    }

    /// `self * other` with broadcasting.
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        let out = arith_raw::<Mul>(self, other)?;
        if !Tensor::needs_graph(&[self, other]) {
            return Ok(out);
        }
        let f = MulBackward { a: SavedTensor::new(self), b: SavedTensor::new(other), need: needs(self, other) };
        Ok(Tensor::from_op1(out, &[self, other], f))
    }

    /// `self / other` (true division; integers give float32).
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        let out = arith_raw::<Div>(self, other)?;
        if !Tensor::needs_graph(&[self, other]) {
            return Ok(out);
        }
        let f = DivBackward { a: SavedTensor::new(self), b: SavedTensor::new(other), need: needs(self, other) };
        Ok(Tensor::from_op1(out, &[self, other], f))
    }

    /// `self ** other` elementwise.
    pub fn pow_t(&self, other: &Tensor) -> Result<Tensor> {
        let out = arith_raw::<Pow>(self, other)?;
        if !Tensor::needs_graph(&[self, other]) {
            return Ok(out);
        }
        let f = PowBackward { a: SavedTensor::new(self), b: SavedTensor::new(other), out: SavedTensor::new(&out), need: needs(self, other) };
        Ok(Tensor::from_op1(out, &[self, other], f))
    }

    /// Elementwise maximum (NaN propagates).
    pub fn maximum(&self, other: &Tensor) -> Result<Tensor> {
        let out = arith_raw::<Maximum>(self, other)?;
        if !Tensor::needs_graph(&[self, other]) {
            return Ok(out);
        }
        Ok(Tensor::from_op1(out, &[self, other], MinMaxBackward { a: SavedTensor::new(self), b: SavedTensor::new(other), is_max: true }))
    }

    /// Elementwise minimum (NaN propagates).
    pub fn minimum(&self, other: &Tensor) -> Result<Tensor> {
        let out = arith_raw::<Minimum>(self, other)?;
        if !Tensor::needs_graph(&[self, other]) {
            return Ok(out);
        }
        Ok(Tensor::from_op1(out, &[self, other], MinMaxBackward { a: SavedTensor::new(self), b: SavedTensor::new(other), is_max: false }))
    }

    fn scalar_linear<O: Arith>(&self, s: f64, grad_scale: f64, name: &'static str) -> Result<Tensor> {
        let out = arith_scalar_raw::<O>(self, s)?;
        if !Tensor::needs_graph(&[self]) {
            return Ok(out);
        }
        Ok(Tensor::from_op1(out, &[self], ScalarMulBackward { s: grad_scale, dtype: self.dtype(), name }))
    }

    /// `self + s`.
    pub fn add_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_linear::<Add>(s, 1.0, "AddBackward1")
    }
    /// `self - s`.
    pub fn sub_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_linear::<Sub>(s, 1.0, "SubBackward1")
    }
    /// `s - self`.
    pub fn rsub_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_linear::<RSub>(s, -1.0, "RsubBackward1")
    }
    /// `self * s`.
    pub fn mul_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_linear::<Mul>(s, s, "MulBackward1")
    }
    /// `self / s`.
    pub fn div_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_linear::<Div>(s, 1.0 / s, "DivBackward1")
    }
    /// `s / self`.
    pub fn rdiv_scalar(&self, s: f64) -> Result<Tensor> {
        let out = arith_scalar_raw::<RDiv>(self, s)?;
        if !Tensor::needs_graph(&[self]) {
            return Ok(out);
        }
        Ok(Tensor::from_op1(out, &[self], RDivBackward { a: SavedTensor::new(self), s }))
    }

    // ------------------------------------------------------------------ in place

    /// `self += other` in place (bumps the version counter).
    pub fn add_(&self, other: &Tensor) -> Result<()> {
        check_inplace("add_", self, &[other])?;
        arith_inplace_raw::<Add>(self, other)?;
        self.storage().bump_version();
        Ok(())
    }
    /// `self += alpha * other` in place.
    pub fn add_scaled_(&self, other: &Tensor, alpha: f64) -> Result<()> {
        check_inplace("add_", self, &[other])?;
        let o = if alpha == 1.0 { other.clone() } else { arith_scalar_raw::<Mul>(other, alpha)? };
        arith_inplace_raw::<Add>(self, &o)?;
        self.storage().bump_version();
        Ok(())
    }
    /// `self -= other` in place.
    pub fn sub_(&self, other: &Tensor) -> Result<()> {
        check_inplace("sub_", self, &[other])?;
        arith_inplace_raw::<Sub>(self, other)?;
        self.storage().bump_version();
        Ok(())
    }
    /// `self *= other` in place.
    pub fn mul_(&self, other: &Tensor) -> Result<()> {
        check_inplace("mul_", self, &[other])?;
        arith_inplace_raw::<Mul>(self, other)?;
        self.storage().bump_version();
        Ok(())
    }
    /// `self /= other` in place.
    pub fn div_(&self, other: &Tensor) -> Result<()> {
        check_inplace("div_", self, &[other])?;
        arith_inplace_raw::<Div>(self, other)?;
        self.storage().bump_version();
        Ok(())
    }
    /// `self += s` in place.
    pub fn add_scalar_(&self, s: f64) -> Result<()> {
        check_inplace("add_", self, &[])?;
        arith_scalar_inplace_raw::<Add>(self, s)?;
        self.storage().bump_version();
        Ok(())
    }
    /// `self *= s` in place.
    pub fn mul_scalar_(&self, s: f64) -> Result<()> {
        check_inplace("mul_", self, &[])?;
        arith_scalar_inplace_raw::<Mul>(self, s)?;
        self.storage().bump_version();
        Ok(())
    }

    /// Gradient accumulation helper for the engine: in place, no checks, no version bump needed
    /// (the gradient tensor is exclusively owned).
    pub(crate) fn add_assign_unchecked(&self, other: &Tensor) -> Result<()> {
        arith_inplace_raw::<Add>(self, other)
    }

    // ------------------------------------------------------------------ comparisons

    fn compare(&self, other: &Tensor, op: &'static str, f: fn(f64, f64) -> bool, ff: fn(f32, f32) -> bool) -> Result<Tensor> {
        check_same_device(op, self, other)?;
        let shape = broadcast_shapes(self.shape(), other.shape(), op)?;
        let dtype = promote_types(self.dtype(), other.dtype());
        let a = if self.dtype() != dtype { materialize(self, dtype)? } else { self.clone() };
        let b = if other.dtype() != dtype { materialize(other, dtype)? } else { other.clone() };
        let out = a.empty_like_shape(&shape, DType::Bool)?;
        if out.is_meta() {
            return Ok(out);
        }
        if dtype == DType::F32 {
            let ia = In::<f32>::new(&a, &shape, op)?;
            let ib = In::<f32>::new(&b, &shape, op)?;
            map2::<f32, f32, Bool8>(&out, &ia, &ib, move |x, y| Bool8(ff(x, y) as u8))?;
        } else {
            crate::dispatch_all!(dtype, T => {
                let ia = In::<T>::new(&a, &shape, op)?;
                let ib = In::<T>::new(&b, &shape, op)?;
                map2::<T, T, Bool8>(&out, &ia, &ib, move |x, y| Bool8(f(x.to_f64(), y.to_f64()) as u8))?;
            });
        }
        Ok(out)
    }

    fn compare_scalar(&self, s: f64, op: &'static str, f: fn(f64, f64) -> bool) -> Result<Tensor> {
        let out = self.empty_like_shape(self.shape(), DType::Bool)?;
        if out.is_meta() {
            return Ok(out);
        }
        crate::dispatch_all!(self.dtype(), T => {
            let ia = In::<T>::new(self, self.shape(), op)?;
            map1::<T, Bool8>(&out, &ia, move |x| Bool8(f(x.to_f64(), s) as u8))?;
        });
        Ok(out)
    }

    pub fn eq_t(&self, o: &Tensor) -> Result<Tensor> {
        self.compare(o, "eq", |x, y| x == y, |x, y| x == y)
    }
    pub fn ne_t(&self, o: &Tensor) -> Result<Tensor> {
        self.compare(o, "ne", |x, y| x != y, |x, y| x != y)
    }
    pub fn lt(&self, o: &Tensor) -> Result<Tensor> {
        self.compare(o, "lt", |x, y| x < y, |x, y| x < y)
    }
    pub fn le(&self, o: &Tensor) -> Result<Tensor> {
        self.compare(o, "le", |x, y| x <= y, |x, y| x <= y)
    }
    pub fn gt(&self, o: &Tensor) -> Result<Tensor> {
        self.compare(o, "gt", |x, y| x > y, |x, y| x > y)
    }
    pub fn ge(&self, o: &Tensor) -> Result<Tensor> {
        self.compare(o, "ge", |x, y| x >= y, |x, y| x >= y)
    }
    pub fn eq_scalar(&self, s: f64) -> Result<Tensor> {
        self.compare_scalar(s, "eq", |x, y| x == y)
    }
    pub fn ne_scalar(&self, s: f64) -> Result<Tensor> {
        self.compare_scalar(s, "ne", |x, y| x != y)
    }
    pub fn lt_scalar(&self, s: f64) -> Result<Tensor> {
        self.compare_scalar(s, "lt", |x, y| x < y)
    }
    pub fn le_scalar(&self, s: f64) -> Result<Tensor> {
        self.compare_scalar(s, "le", |x, y| x <= y)
    }
    pub fn gt_scalar(&self, s: f64) -> Result<Tensor> {
        self.compare_scalar(s, "gt", |x, y| x > y)
    }
    pub fn ge_scalar(&self, s: f64) -> Result<Tensor> {
        self.compare_scalar(s, "ge", |x, y| x >= y)
    }

    /// Logical and of two bool tensors.
    pub fn logical_and(&self, o: &Tensor) -> Result<Tensor> {
        self.logical(o, "logical_and", |a, b| a && b)
    }
    /// Logical or of two bool tensors.
    pub fn logical_or(&self, o: &Tensor) -> Result<Tensor> {
        self.logical(o, "logical_or", |a, b| a || b)
    }
    /// Logical not (any dtype: zero is false).
    pub fn logical_not(&self) -> Result<Tensor> {
        self.compare_scalar(0.0, "logical_not", |x, _| x == 0.0)
    }

    fn logical(&self, o: &Tensor, op: &'static str, f: fn(bool, bool) -> bool) -> Result<Tensor> {
        let a = self.ne_scalar(0.0)?;
        let b = o.ne_scalar(0.0)?;
        check_same_device(op, &a, &b)?;
        let shape = broadcast_shapes(a.shape(), b.shape(), op)?;
        let out = a.empty_like_shape(&shape, DType::Bool)?;
        if out.is_meta() {
            return Ok(out);
        }
        let ia = In::<Bool8>::new(&a, &shape, op)?;
        let ib = In::<Bool8>::new(&b, &shape, op)?;
        map2::<Bool8, Bool8, Bool8>(&out, &ia, &ib, move |x, y| Bool8(f(x.0 != 0, y.0 != 0) as u8))?;
        Ok(out)
    }
}

