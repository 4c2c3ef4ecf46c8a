//! CPU elementwise kernels: arithmetic, unary math and its derivatives, comparisons, selection,
//! copies with dtype conversion, fills.
//!
//! Each op's per-element arithmetic is written once, generic over the compute type (`Float::Acc`:
//! f32 for f32/f16/bf16, f64 for f64) and over integers; the walks over strided, broadcast
//! operands live in `kernels/map.rs`.

use num_traits::Float as NumFloat;

use crate::backend::{BinaryOp, CompareOp, LogicalOp, UnaryOp};
use crate::element::{AccFloat, Bool8, Element, Float, Int};
use crate::error::{Result, TensorError};
use crate::kernels::map::{In, map1, map1_contig, map2, map3, update2, zip2_contig};
use crate::kernels::strided::{SendPtr, par_ranges};
use crate::{DType, Tensor, dispatch_all, dispatch_bits};

// ------------------------------------------------------------------------------ arithmetic

/// An arithmetic op, defined once for every float compute type and for integers.
trait Arith: Copy + Send + Sync + 'static {
    fn float<F: NumFloat>(x: F, y: F) -> F;
    /// `None` when the op is not defined on integers (true division).
    fn int(x: i64, y: i64) -> Option<i64>;
}

macro_rules! arith {
    ($name:ident, |$x:ident, $y:ident| $f:expr, |$a:ident, $b:ident| $i:expr) => {
        #[derive(Copy, Clone)]
        struct $name;
        impl Arith for $name {
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

arith!(Add, |x, y| x + y, |a, b| Some(a.wrapping_add(b)));
arith!(Sub, |x, y| x - y, |a, b| Some(a.wrapping_sub(b)));
arith!(Mul, |x, y| x * y, |a, b| Some(a.wrapping_mul(b)));
arith!(Div, |x, y| x / y, |_a, _b| None);
arith!(Pow, |x, y| x.powf(y), |a, b| if b >= 0 { Some(a.wrapping_pow(b.min(u32::MAX as i64) as u32)) } else { None });
arith!(
    Maximum,
    |x, y| if x.is_nan() || y.is_nan() {
        F::nan()
    } else if x > y {
        x
    } else {
        y
    },
    |a, b| Some(a.max(b))
);
arith!(
    Minimum,
    |x, y| if x.is_nan() || y.is_nan() {
        F::nan()
    } else if x < y {
        x
    } else {
        y
    },
    |a, b| Some(a.min(b))
);
arith!(RSub, |x, y| y - x, |a, b| Some(b.wrapping_sub(a)));
arith!(RDiv, |x, y| y / x, |_a, _b| None);

/// Run `$body` with `$O` bound to the arithmetic type of `$op`.
macro_rules! with_arith {
    ($op:expr, $O:ident => $body:expr) => {
        match $op {
            BinaryOp::Add => {
                type $O = Add;
                $body
            }
            BinaryOp::Sub => {
                type $O = Sub;
                $body
            }
            BinaryOp::Mul => {
                type $O = Mul;
                $body
            }
            BinaryOp::Div => {
                type $O = Div;
                $body
            }
            BinaryOp::Pow => {
                type $O = Pow;
                $body
            }
            BinaryOp::Maximum => {
                type $O = Maximum;
                $body
            }
            BinaryOp::Minimum => {
                type $O = Minimum;
                $body
            }
            BinaryOp::RSub => {
                type $O = RSub;
                $body
            }
            BinaryOp::RDiv => {
                type $O = RDiv;
                $body
            }
        }
    };
}

fn float_binary<T: Float, O: Arith>(out: &Tensor, a: &Tensor, b: &Tensor, name: &'static str) -> Result<()> {
    if a.shape() == out.shape() && b.shape() == out.shape() && a.is_contiguous() && b.is_contiguous() {
        return zip2_contig::<T, T, T>(out, a, b, |x, y| T::from_acc(O::float(x.to_acc(), y.to_acc())));
    }
    let ia = In::<T>::new(a, out.shape(), name)?;
    let ib = In::<T>::new(b, out.shape(), name)?;
    map2::<T, T, T>(out, &ia, &ib, |x, y| T::from_acc(O::float(x.to_acc(), y.to_acc())))
}

fn int_binary<T: Int, O: Arith>(out: &Tensor, a: &Tensor, b: &Tensor, name: &'static str) -> Result<()> {
    if a.shape() == out.shape() && b.shape() == out.shape() && a.is_contiguous() && b.is_contiguous() {
        return zip2_contig::<T, T, T>(out, a, b, |x, y| T::from_i64(O::int(x.to_i64(), y.to_i64()).unwrap_or(0)));
    }
    let ia = In::<T>::new(a, out.shape(), name)?;
    let ib = In::<T>::new(b, out.shape(), name)?;
    map2::<T, T, T>(out, &ia, &ib, |x, y| T::from_i64(O::int(x.to_i64(), y.to_i64()).unwrap_or(0)))
}

pub(super) fn binary(op: BinaryOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    let name = op.name();
    with_arith!(op, O => match out.dtype() {
        DType::F32 => float_binary::<f32, O>(out, a, b, name),
        DType::F64 => float_binary::<f64, O>(out, a, b, name),
        DType::F16 => float_binary::<half::f16, O>(out, a, b, name),
        DType::BF16 => float_binary::<half::bf16, O>(out, a, b, name),
        DType::I64 => int_binary::<i64, O>(out, a, b, name),
        DType::I32 => int_binary::<i32, O>(out, a, b, name),
        DType::U8 => int_binary::<u8, O>(out, a, b, name),
        DType::Bool => Err(TensorError::UnsupportedDType { op: name, dtype: DType::Bool }),
    })
}

pub(super) fn binary_scalar(op: BinaryOp, out: &Tensor, a: &Tensor, s: f64) -> Result<()> {
    fn fk<T: Float, O: Arith>(out: &Tensor, a: &Tensor, s: f64, name: &'static str) -> Result<()> {
        let sv = T::acc_from_f64(s);
        if a.is_contiguous() {
            return map1_contig::<T, T>(out, a, move |x| T::from_acc(O::float(x.to_acc(), sv)));
        }
        let ia = In::<T>::new(a, out.shape(), name)?;
        map1::<T, T>(out, &ia, move |x| T::from_acc(O::float(x.to_acc(), sv)))
    }
    fn ik<T: Int, O: Arith>(out: &Tensor, a: &Tensor, s: f64, name: &'static str) -> Result<()> {
        let ia = In::<T>::new(a, out.shape(), name)?;
        let sv = s as i64;
        map1::<T, T>(out, &ia, move |x| T::from_i64(O::int(x.to_i64(), sv).unwrap_or(0)))
    }
    let name = op.name();
    with_arith!(op, O => match out.dtype() {
        DType::F32 => fk::<f32, O>(out, a, s, name),
        DType::F64 => fk::<f64, O>(out, a, s, name),
        DType::F16 => fk::<half::f16, O>(out, a, s, name),
        DType::BF16 => fk::<half::bf16, O>(out, a, s, name),
        DType::I64 => ik::<i64, O>(out, a, s, name),
        DType::I32 => ik::<i32, O>(out, a, s, name),
        DType::U8 => ik::<u8, O>(out, a, s, name),
        DType::Bool => Err(TensorError::UnsupportedDType { op: name, dtype: DType::Bool }),
    })
}

pub(super) fn binary_inplace(op: BinaryOp, dst: &Tensor, src: &Tensor) -> Result<()> {
    fn fk<T: Float, O: Arith>(dst: &Tensor, src: &Tensor, name: &'static str) -> Result<()> {
        let is = In::<T>::new(src, dst.shape(), name)?;
        update2::<T, T>(dst, &is, |d, s| T::from_acc(O::float(d.to_acc(), s.to_acc())))
    }
    fn ik<T: Int, O: Arith>(dst: &Tensor, src: &Tensor, name: &'static str) -> Result<()> {
        let is = In::<T>::new(src, dst.shape(), name)?;
        update2::<T, T>(dst, &is, |d, s| T::from_i64(O::int(d.to_i64(), s.to_i64()).unwrap_or(0)))
    }
    let name = op.name();
    let int_ok = op.defined_on_integers();
    with_arith!(op, O => match dst.dtype() {
        DType::F32 => fk::<f32, O>(dst, src, name),
        DType::F64 => fk::<f64, O>(dst, src, name),
        DType::F16 => fk::<half::f16, O>(dst, src, name),
        DType::BF16 => fk::<half::bf16, O>(dst, src, name),
        DType::I64 if int_ok => ik::<i64, O>(dst, src, name),
        DType::I32 if int_ok => ik::<i32, O>(dst, src, name),
        DType::U8 if int_ok => ik::<u8, O>(dst, src, name),
        d => Err(TensorError::UnsupportedDType { op: name, dtype: d }),
    })
}

// ------------------------------------------------------------------------------ unary math

/// A differentiable unary function with a scalar parameter `p` (ignored by most).
trait Unary: Send + Sync + 'static {
    fn f<F: AccFloat>(x: F, p: F) -> F;
    /// f'(x) given the saved value (output or input, see `UnaryOp::derivative_from_output`).
    fn df<F: AccFloat>(s: F, p: F) -> F;
}

macro_rules! unary {
    ($name:ident, |$x:ident, $p:ident| $f:expr, |$s:ident, $q:ident| $df:expr) => {
        struct $name;
        impl Unary for $name {
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

/// √(2/π), the constant of GELU's tanh approximation.
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// 1/√(2π), the standard normal density at 0.
const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

unary!(Exp, |x, p| x.vexp(), |y, p| y);
unary!(Log, |x, p| x.ln(), |x, p| x.recip());
unary!(Sqrt, |x, p| x.sqrt(), |y, p| c::<F>(0.5) / y);
unary!(Rsqrt, |x, p| x.sqrt().recip(), |y, p| c::<F>(-0.5) * y * y * y);
unary!(Tanh, |x, p| x.vtanh(), |y, p| F::one() - y * y);
unary!(Sigmoid, |x, p| x.vsigmoid(), |y, p| y * (F::one() - y));
unary!(
    Relu,
    // NaN passes through, as in PyTorch.
    |x, p| if x > F::zero() || x.is_nan() { x } else { F::zero() },
    |y, p| if y > F::zero() { F::one() } else { F::zero() }
);
unary!(Neg, |x, p| -x, |x, p| -F::one());
unary!(Abs, |x, p| x.abs(), |x, p| if x > F::zero() {
    F::one()
} else if x < F::zero() {
    -F::one()
} else {
    F::zero()
});
unary!(Sin, |x, p| x.sin(), |x, p| x.cos());
unary!(Cos, |x, p| x.cos(), |x, p| -x.sin());
unary!(Log1p, |x, p| x.ln_1p(), |x, p| (F::one() + x).recip());
unary!(Reciprocal, |x, p| x.recip(), |y, p| -(y * y));
unary!(Square, |x, p| x * x, |x, p| c::<F>(2.0) * x);
unary!(PowScalar, |x, p| powf_exact(x, p), |x, p| if p == F::zero() {
    F::zero()
} else {
    p * powf_exact(x, p - F::one())
});
unary!(Gelu, |x, p| c::<F>(0.5) * x * (F::one() + (x * c::<F>(std::f64::consts::FRAC_1_SQRT_2)).erf()), |x, p| {
    let cdf = c::<F>(0.5) * (F::one() + (x * c::<F>(std::f64::consts::FRAC_1_SQRT_2)).erf());
    let pdf = (c::<F>(-0.5) * x * x).vexp() * c::<F>(INV_SQRT_2PI);
    cdf + x * pdf
});
unary!(
    GeluTanh,
    |x, p| {
        let k = c::<F>(SQRT_2_OVER_PI);
        let inner = k * (x + c::<F>(0.044715) * x * x * x);
        c::<F>(0.5) * x * (F::one() + inner.vtanh())
    },
    |x, p| {
        let k = c::<F>(SQRT_2_OVER_PI);
        let x2 = x * x;
        let inner = k * (x + c::<F>(0.044715) * x2 * x);
        let t = inner.vtanh();
        c::<F>(0.5) * (F::one() + t)
            + c::<F>(0.5) * x * (F::one() - t * t) * k * (F::one() + c::<F>(3.0 * 0.044715) * x2)
    }
);
unary!(Silu, |x, p| x / (F::one() + (-x).vexp()), |x, p| {
    let s = x.vsigmoid();
    s * (F::one() + x * (F::one() - s))
});
unary!(LeakyRelu, |x, p| if x > F::zero() { x } else { x * p }, |x, p| if x > F::zero() { F::one() } else { p });

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

/// Run `$body` with `$U` bound to the math of `$op` and `$p` to its parameter.
macro_rules! with_unary {
    ($op:expr, $U:ident, $p:ident => $body:expr) => {
        match $op {
            UnaryOp::Exp => {
                type $U = Exp;
                let $p = 0.0;
                $body
            }
            UnaryOp::Log => {
                type $U = Log;
                let $p = 0.0;
                $body
            }
            UnaryOp::Sqrt => {
                type $U = Sqrt;
                let $p = 0.0;
                $body
            }
            UnaryOp::Rsqrt => {
                type $U = Rsqrt;
                let $p = 0.0;
                $body
            }
            UnaryOp::Tanh => {
                type $U = Tanh;
                let $p = 0.0;
                $body
            }
            UnaryOp::Sigmoid => {
                type $U = Sigmoid;
                let $p = 0.0;
                $body
            }
            UnaryOp::Relu => {
                type $U = Relu;
                let $p = 0.0;
                $body
            }
            UnaryOp::Neg => {
                type $U = Neg;
                let $p = 0.0;
                $body
            }
            UnaryOp::Abs => {
                type $U = Abs;
                let $p = 0.0;
                $body
            }
            UnaryOp::Sin => {
                type $U = Sin;
                let $p = 0.0;
                $body
            }
            UnaryOp::Cos => {
                type $U = Cos;
                let $p = 0.0;
                $body
            }
            UnaryOp::Log1p => {
                type $U = Log1p;
                let $p = 0.0;
                $body
            }
            UnaryOp::Reciprocal => {
                type $U = Reciprocal;
                let $p = 0.0;
                $body
            }
            UnaryOp::Square => {
                type $U = Square;
                let $p = 0.0;
                $body
            }
            UnaryOp::Pow(e) => {
                type $U = PowScalar;
                let $p = e;
                $body
            }
            UnaryOp::Gelu => {
                type $U = Gelu;
                let $p = 0.0;
                $body
            }
            UnaryOp::GeluTanh => {
                type $U = GeluTanh;
                let $p = 0.0;
                $body
            }
            UnaryOp::Silu => {
                type $U = Silu;
                let $p = 0.0;
                $body
            }
            UnaryOp::LeakyRelu(s) => {
                type $U = LeakyRelu;
                let $p = s;
                $body
            }
        }
    };
}

fn unary_kernel<T: Float, U: Unary>(out: &Tensor, x: &Tensor, p: f64, name: &'static str) -> Result<()> {
    let pp = T::acc_from_f64(p);
    if x.is_contiguous() {
        return map1_contig::<T, T>(out, x, move |v| T::from_acc(U::f(v.to_acc(), pp)));
    }
    let ix = In::<T>::new(x, out.shape(), name)?;
    map1::<T, T>(out, &ix, move |v| T::from_acc(U::f(v.to_acc(), pp)))
}

fn grad_kernel<T: Float, U: Unary>(out: &Tensor, g: &Tensor, s: &Tensor, p: f64, name: &'static str) -> Result<()> {
    let pp = T::acc_from_f64(p);
    if g.shape() == out.shape() && s.shape() == out.shape() && g.is_contiguous() && s.is_contiguous() {
        return zip2_contig::<T, T, T>(out, g, s, move |g, s| T::from_acc(g.to_acc() * U::df(s.to_acc(), pp)));
    }
    let ig = In::<T>::new(g, out.shape(), name)?;
    let is = In::<T>::new(s, out.shape(), name)?;
    map2::<T, T, T>(out, &ig, &is, move |g, s| T::from_acc(g.to_acc() * U::df(s.to_acc(), pp)))
}

pub(super) fn unary(op: UnaryOp, out: &Tensor, x: &Tensor) -> Result<()> {
    let name = op.name();
    with_unary!(op, U, p => match out.dtype() {
        DType::F32 => unary_kernel::<f32, U>(out, x, p, name),
        DType::F64 => unary_kernel::<f64, U>(out, x, p, name),
        DType::F16 => unary_kernel::<half::f16, U>(out, x, p, name),
        DType::BF16 => unary_kernel::<half::bf16, U>(out, x, p, name),
        d => Err(TensorError::UnsupportedDType { op: name, dtype: d }),
    })
}

pub(super) fn unary_backward(op: UnaryOp, out: &Tensor, g: &Tensor, s: &Tensor) -> Result<()> {
    let name = op.backward_name();
    with_unary!(op, U, p => match out.dtype() {
        DType::F32 => grad_kernel::<f32, U>(out, g, s, p, name),
        DType::F64 => grad_kernel::<f64, U>(out, g, s, p, name),
        DType::F16 => grad_kernel::<half::f16, U>(out, g, s, p, name),
        DType::BF16 => grad_kernel::<half::bf16, U>(out, g, s, p, name),
        d => Err(TensorError::UnsupportedDType { op: name, dtype: d }),
    })
}

pub(super) fn clamp(out: &Tensor, x: &Tensor, lo: f64, hi: f64) -> Result<()> {
    dispatch_all!(out.dtype(), T => {
        let ix = In::<T>::new(x, out.shape(), "clamp")?;
        map1::<T, T>(out, &ix, move |v| {
            let f = v.to_f64();
            if f.is_nan() { v } else if f < lo { T::from_f64(lo) } else if f > hi { T::from_f64(hi) } else { v }
        })
    })
}

// ------------------------------------------------------------------------------ comparisons

/// Run `$body` with `$f` bound to the comparison of `$op` as an inlinable closure over `$t`.
macro_rules! with_compare {
    ($op:expr, $t:ty, $f:ident => $body:expr) => {
        match $op {
            CompareOp::Eq => {
                let $f = |x: $t, y: $t| x == y;
                $body
            }
            CompareOp::Ne => {
                let $f = |x: $t, y: $t| x != y;
                $body
            }
            CompareOp::Lt => {
                let $f = |x: $t, y: $t| x < y;
                $body
            }
            CompareOp::Le => {
                let $f = |x: $t, y: $t| x <= y;
                $body
            }
            CompareOp::Gt => {
                let $f = |x: $t, y: $t| x > y;
                $body
            }
            CompareOp::Ge => {
                let $f = |x: $t, y: $t| x >= y;
                $body
            }
        }
    };
}

pub(super) fn compare(op: CompareOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    let name = op.name();
    if a.dtype() == DType::F32 {
        let ia = In::<f32>::new(a, out.shape(), name)?;
        let ib = In::<f32>::new(b, out.shape(), name)?;
        return with_compare!(op, f32, f => map2::<f32, f32, Bool8>(out, &ia, &ib, move |x, y| Bool8(f(x, y) as u8)));
    }
    dispatch_all!(a.dtype(), T => {
        let ia = In::<T>::new(a, out.shape(), name)?;
        let ib = In::<T>::new(b, out.shape(), name)?;
        with_compare!(op, f64, f => map2::<T, T, Bool8>(out, &ia, &ib, move |x, y| Bool8(f(x.to_f64(), y.to_f64()) as u8)))
    })
}

pub(super) fn compare_scalar(op: CompareOp, out: &Tensor, a: &Tensor, s: f64) -> Result<()> {
    let name = op.name();
    dispatch_all!(a.dtype(), T => {
        let ia = In::<T>::new(a, out.shape(), name)?;
        with_compare!(op, f64, f => map1::<T, Bool8>(out, &ia, move |x| Bool8(f(x.to_f64(), s) as u8)))
    })
}

pub(super) fn logical(op: LogicalOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    let ia = In::<Bool8>::new(a, out.shape(), "logical")?;
    let ib = In::<Bool8>::new(b, out.shape(), "logical")?;
    match op {
        LogicalOp::And => map2::<Bool8, Bool8, Bool8>(out, &ia, &ib, |x, y| Bool8(((x.0 != 0) && (y.0 != 0)) as u8)),
        LogicalOp::Or => map2::<Bool8, Bool8, Bool8>(out, &ia, &ib, |x, y| Bool8(((x.0 != 0) || (y.0 != 0)) as u8)),
    }
}

pub(super) fn where_cond(out: &Tensor, cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    let ic = In::<Bool8>::new(cond, out.shape(), "where")?;
    dispatch_bits!(out.dtype(), T => {
        let ia = In::<T>::new(a, out.shape(), "where")?;
        let ib = In::<T>::new(b, out.shape(), "where")?;
        map3::<Bool8, T, T, T>(out, &ic, &ia, &ib, move |c, x, y| if c.0 != 0 { x } else { y })
    })
}

// ------------------------------------------------------------------------------ copies, fills

pub(super) fn copy(dst: &Tensor, src: &Tensor) -> Result<()> {
    if dst.numel() == 0 {
        return Ok(());
    }
    if dst.dtype() == src.dtype() {
        dispatch_bits!(dst.dtype(), T => {
            let s = In::<T>::new(src, dst.shape(), "copy_")?;
            update2::<T, T>(dst, &s, |_, x| x)?;
        });
        return Ok(());
    }
    match (src.dtype(), dst.dtype()) {
        (DType::F32, DType::BF16) => {
            let s = In::<f32>::new(src, dst.shape(), "copy_")?;
            update2::<half::bf16, f32>(dst, &s, |_, x| half::bf16::from_f32(x))
        }
        (DType::F32, DType::F16) => {
            let s = In::<f32>::new(src, dst.shape(), "copy_")?;
            update2::<half::f16, f32>(dst, &s, |_, x| half::f16::from_f32(x))
        }
        (DType::BF16, DType::F32) => {
            let s = In::<half::bf16>::new(src, dst.shape(), "copy_")?;
            update2::<f32, half::bf16>(dst, &s, |_, x| x.to_f32())
        }
        (DType::F16, DType::F32) => {
            let s = In::<half::f16>::new(src, dst.shape(), "copy_")?;
            update2::<f32, half::f16>(dst, &s, |_, x| x.to_f32())
        }
        (sd, dd) => {
            dispatch_all!(sd, S => {
                let s = In::<S>::new(src, dst.shape(), "copy_")?;
                dispatch_all!(dd, D => {
                    update2::<D, S>(dst, &s, |_, x| D::from_f64(x.to_f64()))?;
                });
            });
            Ok(())
        }
    }
}

pub(super) fn fill(t: &Tensor, value: f64) -> Result<()> {
    if t.numel() == 0 {
        return Ok(());
    }
    dispatch_all!(t.dtype(), T => {
        let v = T::from_f64(value);
        let p = SendPtr(t.ptr::<T>("fill")?);
        let n = t.numel();
        par_ranges(n, 1, |s, e| {
            let p = p;
            // SAFETY: contiguous tensor of n elements; disjoint ranges per task.
            unsafe { std::slice::from_raw_parts_mut(p.0.add(s), e - s).fill(v) };
        });
    });
    Ok(())
}
