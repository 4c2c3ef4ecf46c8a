//! Unary elementwise math with fused backward kernels (`grad_in = grad_out * f'(saved)`).

use std::borrow::Cow;
use std::marker::PhantomData;

use crate::autograd::{BackwardFn, SavedTensor};
use crate::element::{AccFloat, Element, Float};
use crate::error::{Result, TensorError};
use crate::kernels::map::{map1, map1_contig, map2, zip2_contig, In};
use crate::ops::copy::materialize;
use crate::{DType, Tensor};

/// A differentiable unary function with an optional scalar parameter `p`.
pub(crate) trait Unary: Send + Sync + 'static {
    const NAME: &'static str;
    const BACKWARD: &'static str;
    /// Whether the derivative is expressed through the output (else through the input).
    const FROM_OUTPUT: bool;
    fn f<F: AccFloat>(x: F, p: F) -> F;
    /// f'(x) given the saved value (output if FROM_OUTPUT, else input).
    fn df<F: AccFloat>(s: F, p: F) -> F;
}

macro_rules! unary {
    ($name:ident, $n:expr, $b:expr, $from_out:expr, |$x:ident, $p:ident| $f:expr, |$s:ident, $q:ident| $df:expr) => {
        pub(crate) struct $name;
        impl Unary for $name {
            const NAME: &'static str = $n;
            const BACKWARD: &'static str = $b;
            const FROM_OUTPUT: bool = $from_out;
            #[inline(always)]
            #[allow(unused_variables)]
            fn f<F: AccFloat>($x: F, $p: F) -> F {
                $f
            }
            #[inline(always)]
            #[allow(unused_variables)]
            fn df<F: AccFloat>($s: F, $q: F) -> F {
                $df
            }
        }
    };
}

#[inline(always)]
fn c<F: AccFloat>(v: f64) -> F {
    F::from_f64c(v)
}

unary!(Exp, "exp", "ExpBackward0", true, |x, p| x.vexp(), |y, p| y);
unary!(Log, "log", "LogBackward0", false, |x, p| x.ln(), |x, p| x.recip());
unary!(Sqrt, "sqrt", "SqrtBackward0", true, |x, p| x.sqrt(), |y, p| c::<F>(0.5) / y);
unary!(Rsqrt, "rsqrt", "RsqrtBackward0", true, |x, p| x.sqrt().recip(), |y, p| c::<F>(-0.5) * y * y * y);
unary!(Tanh, "tanh", "TanhBackward0", true, |x, p| x.vtanh(), |y, p| F::one() - y * y);
unary!(Sigmoid, "sigmoid", "SigmoidBackward0", true, |x, p| x.vsigmoid(), |y, p| y * (F::one() - y));
unary!(Relu, "relu", "ReluBackward0", true, |x, p| if x > F::zero() { x } else if x.is_nan() { x } else { F::zero() }, |y, p| if y > F::zero() { F::one() } else { F::zero() });
unary!(Neg, "neg", "NegBackward0", false, |x, p| -x, |x, p| -F::one());
unary!(Abs, "abs", "AbsBackward0", false, |x, p| x.abs(), |x, p| if x > F::zero() { F::one() } else if x < F::zero() { -F::one() } else { F::zero() });
unary!(Sin, "sin", "SinBackward0", false, |x, p| x.sin(), |x, p| x.cos());
unary!(Cos, "cos", "CosBackward0", false, |x, p| x.cos(), |x, p| -x.sin());
unary!(Log1p, "log1p", "Log1PBackward0", false, |x, p| x.ln_1p(), |x, p| (F::one() + x).recip());
unary!(Reciprocal, "reciprocal", "ReciprocalBackward0", true, |x, p| x.recip(), |y, p| -(y * y));
unary!(Square, "square", "PowBackward0", false, |x, p| x * x, |x, p| c::<F>(2.0) * x);
unary!(PowScalar, "pow", "PowBackward0", false, |x, p| powf_exact(x, p), |x, p| if p == F::zero() { F::zero() } else { p * powf_exact(x, p - F::one()) });
unary!(Gelu, "gelu", "GeluBackward0", false,
    |x, p| c::<F>(0.5) * x * (F::one() + (x * c::<F>(std::f64::consts::FRAC_1_SQRT_2)).erf()),
    |x, p| {
        let cdf = c::<F>(0.5) * (F::one() + (x * c::<F>(std::f64::consts::FRAC_1_SQRT_2)).erf());
        let pdf = (c::<F>(-0.5) * x * x).vexp() * c::<F>(0.3989422804014327);
        cdf + x * pdf
    });
unary!(GeluTanh, "gelu", "GeluBackward0", false,
    |x, p| {
        let k = c::<F>(0.7978845608028654);
        let inner = k * (x + c::<F>(0.044715) * x * x * x);
        c::<F>(0.5) * x * (F::one() + inner.vtanh())
    },
    |x, p| {
        let k = c::<F>(0.7978845608028654);
        let x2 = x * x;
        let inner = k * (x + c::<F>(0.044715) * x2 * x);
        let t = inner.vtanh();
        c::<F>(0.5) * (F::one() + t) + c::<F>(0.5) * x * (F::one() - t * t) * k * (F::one() + c::<F>(3.0 * 0.044715) * x2)
    });
unary!(Silu, "silu", "SiluBackward0", false, |x, p| x / (F::one() + (-x).vexp()), |x, p| {
    let s = x.vsigmoid();
    s * (F::one() + x * (F::one() - s))
});
unary!(LeakyRelu, "leaky_relu", "LeakyReluBackward0", false, |x, p| if x > F::zero() { x } else { x * p }, |x, p| if x > F::zero() { F::one() } else { p });

/// `powf` with exact small integer exponents (x*x*x for 3), which is what PyTorch's CPU kernel
/// does for the common cases and keeps parity to the last bit.
#[inline(always)]
fn powf_exact<F: AccFloat>(x: F, p: F) -> F {
    if p == F::from_f64c(2.0) {
        x * x
    } else if p == F::from_f64c(3.0) {
        x * x * x
    } else if p == F::one() {
        x
    } else if p == F::from_f64c(0.5) {
        x.sqrt()
    } else if p == F::from_f64c(-1.0) {
        x.recip()
    } else {
        x.powf(p)
    }
}

fn unary_kernel<T: Float, U: Unary>(out: &Tensor, x: &Tensor, p: f64) -> Result<()> {
    let pp = T::acc_from_f64(p);
    if x.is_contiguous() {
        return map1_contig::<T, T>(out, x, move |v| T::from_acc(U::f(v.to_acc(), pp)));
    }
    let ix = In::<T>::new(x, out.shape(), U::NAME)?;
    map1::<T, T>(out, &ix, move |v| T::from_acc(U::f(v.to_acc(), pp)))
}

fn grad_kernel<T: Float, U: Unary>(out: &Tensor, g: &Tensor, s: &Tensor, p: f64) -> Result<()> {
    if g.shape() == out.shape() && s.shape() == out.shape() && g.is_contiguous() && s.is_contiguous() {
        let pp = T::acc_from_f64(p);
        return zip2_contig::<T, T, T>(out, g, s, move |g, s| T::from_acc(g.to_acc() * U::df(s.to_acc(), pp)));
    }
    let ig = In::<T>::new(g, out.shape(), U::BACKWARD)?;
    let is = In::<T>::new(s, out.shape(), U::BACKWARD)?;
    let pp = T::acc_from_f64(p);
    map2::<T, T, T>(out, &ig, &is, move |g, s| T::from_acc(g.to_acc() * U::df(s.to_acc(), pp)))
}

fn float_input(x: &Tensor, op: &'static str) -> Result<Tensor> {
    match x.dtype() {
        d if d.is_floating_point() => Ok(x.clone()),
        DType::Bool => Err(TensorError::UnsupportedDType { op, dtype: DType::Bool }),
        _ => materialize(x, DType::F32),
    }
}

pub(crate) fn unary_raw<U: Unary>(x: &Tensor, p: f64) -> Result<Tensor> {
    let x = float_input(x, U::NAME)?;
    let out = x.empty_like_shape(x.shape(), x.dtype())?;
    if out.is_meta() {
        return Ok(out);
    }
    match x.dtype() {
        DType::F32 => unary_kernel::<f32, U>(&out, &x, p)?,
        DType::F64 => unary_kernel::<f64, U>(&out, &x, p)?,
        DType::F16 => unary_kernel::<half::f16, U>(&out, &x, p)?,
        DType::BF16 => unary_kernel::<half::bf16, U>(&out, &x, p)?,
        d => return Err(TensorError::UnsupportedDType { op: U::NAME, dtype: d }),
    }
    Ok(out)
}

fn unary_grad_raw<U: Unary>(g: &Tensor, s: &Tensor, p: f64) -> Result<Tensor> {
    let dtype = s.dtype();
    let g = if g.dtype() != dtype { materialize(g, dtype)? } else { g.clone() };
    let out = g.empty_like_shape(s.shape(), dtype)?;
    if out.is_meta() {
        return Ok(out);
    }
    match dtype {
        DType::F32 => grad_kernel::<f32, U>(&out, &g, s, p)?,
        DType::F64 => grad_kernel::<f64, U>(&out, &g, s, p)?,
        DType::F16 => grad_kernel::<half::f16, U>(&out, &g, s, p)?,
        DType::BF16 => grad_kernel::<half::bf16, U>(&out, &g, s, p)?,
        d => return Err(TensorError::UnsupportedDType { op: U::BACKWARD, dtype: d }),
    }
    Ok(out)
}

struct UnaryBackward<U: Unary> {
    saved: SavedTensor,
    p: f64,
    _u: PhantomData<U>,
}

impl<U: Unary> BackwardFn for UnaryBackward<U> {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(U::BACKWARD)
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None]) };
        let s = self.saved.get(U::BACKWARD)?;
        Ok(vec![Some(unary_grad_raw::<U>(g, s, self.p)?)])
    }
}

fn apply<U: Unary>(x: &Tensor, p: f64) -> Result<Tensor> {
    let out = unary_raw::<U>(x, p)?;
    if !Tensor::needs_graph(&[x]) {
        return Ok(out);
    }
    let saved = if U::FROM_OUTPUT { SavedTensor::new(&out) } else { SavedTensor::new(x) };
    Ok(Tensor::from_op1(out, &[x], UnaryBackward::<U> { saved, p, _u: PhantomData }))
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
        Ok(vec![Some(crate::ops::binary::arith_raw::<crate::ops::binary::Mul>(g, &mask.to_dtype(g.dtype())?)?)])
    }
}

impl Tensor {
    pub fn exp(&self) -> Result<Tensor> {
        apply::<Exp>(self, 0.0)
    }
    pub fn log(&self) -> Result<Tensor> {
        apply::<Log>(self, 0.0)
    }
    pub fn sqrt(&self) -> Result<Tensor> {
        apply::<Sqrt>(self, 0.0)
    }
    pub fn rsqrt(&self) -> Result<Tensor> {
        apply::<Rsqrt>(self, 0.0)
    }
    pub fn tanh(&self) -> Result<Tensor> {
        apply::<Tanh>(self, 0.0)
    }
    pub fn sigmoid(&self) -> Result<Tensor> {
        apply::<Sigmoid>(self, 0.0)
    }
    pub fn relu(&self) -> Result<Tensor> {
        apply::<Relu>(self, 0.0)
    }
    pub fn neg(&self) -> Result<Tensor> {
        apply::<Neg>(self, 0.0)
    }
    pub fn abs(&self) -> Result<Tensor> {
        apply::<Abs>(self, 0.0)
    }
    pub fn sin(&self) -> Result<Tensor> {
        apply::<Sin>(self, 0.0)
    }
    pub fn cos(&self) -> Result<Tensor> {
        apply::<Cos>(self, 0.0)
    }
    pub fn log1p(&self) -> Result<Tensor> {
        apply::<Log1p>(self, 0.0)
    }
    pub fn reciprocal(&self) -> Result<Tensor> {
        apply::<Reciprocal>(self, 0.0)
    }
    pub fn square(&self) -> Result<Tensor> {
        apply::<Square>(self, 0.0)
    }
    /// `self ** exponent` for a scalar exponent.
    pub fn pow(&self, exponent: f64) -> Result<Tensor> {
        apply::<PowScalar>(self, exponent)
    }
    /// GELU with the exact erf formulation (PyTorch's default `approximate='none'`).
    pub fn gelu(&self) -> Result<Tensor> {
        apply::<Gelu>(self, 0.0)
    }
    /// GELU with the tanh approximation (`approximate='tanh'`).
    pub fn gelu_tanh(&self) -> Result<Tensor> {
        apply::<GeluTanh>(self, 0.0)
    }
    pub fn silu(&self) -> Result<Tensor> {
        apply::<Silu>(self, 0.0)
    }
    pub fn leaky_relu(&self, negative_slope: f64) -> Result<Tensor> {
        apply::<LeakyRelu>(self, negative_slope)
    }

    /// Clamp into `[min, max]` (either bound optional). Gradient passes where not clamped.
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
        let lo = min.unwrap_or(f64::NEG_INFINITY);
        let hi = max.unwrap_or(f64::INFINITY);
        let out = self.empty_like_shape(self.shape(), self.dtype())?;
        if !out.is_meta() {
            crate::dispatch_all!(self.dtype(), T => {
                let ix = In::<T>::new(self, self.shape(), "clamp")?;
                map1::<T, T>(&out, &ix, move |v| {
                    let f = v.to_f64();
                    if f.is_nan() { v } else if f < lo { T::from_f64(lo) } else if f > hi { T::from_f64(hi) } else { v }
                })?;
            });
        }
        if !Tensor::needs_graph(&[self]) {
            return Ok(out);
        }
        Ok(Tensor::from_op1(out, &[self], ClampBackward { x: SavedTensor::new(self), min, max }))
    }
}
