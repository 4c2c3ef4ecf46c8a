//! Rust types that can be tensor elements, and the arithmetic type each one computes in.
//!
//! Half-precision types compute in f32 (loads widen, stores round to nearest even) — the same
//! contract as PyTorch's CPU kernels — so kernels are written once over [`Float`].

use half::{bf16, f16};

use crate::DType;

/// A Rust type that maps 1:1 onto a [`DType`].
pub trait Element: Copy + Send + Sync + 'static + std::fmt::Debug + PartialEq + bytemuck::Pod {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
}

macro_rules! element {
    ($t:ty, $d:expr, $to:expr, $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            #[inline(always)]
            fn to_f64(self) -> f64 {
                ($to)(self)
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                ($from)(v)
            }
        }
    };
}

element!(f32, DType::F32, |x: f32| x as f64, |v: f64| v as f32);
element!(f64, DType::F64, |x: f64| x, |v: f64| v);
element!(f16, DType::F16, |x: f16| x.to_f64(), f16::from_f64);
element!(bf16, DType::BF16, |x: bf16| x.to_f64(), bf16::from_f64);
element!(i64, DType::I64, |x: i64| x as f64, |v: f64| v as i64);
element!(i32, DType::I32, |x: i32| x as f64, |v: f64| v as i32);
element!(u8, DType::U8, |x: u8| x as f64, |v: f64| v as u8);

/// How a `bool` element is stored: one byte, 0 or 1 when written by ferrite (like PyTorch); any
/// nonzero byte (e.g. from a foreign file) reads as true. Users normally pass plain `bool`s (see
/// [`HostElement`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct Bool8(pub u8);

impl Element for Bool8 {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        if self.0 != 0 { 1.0 } else { 0.0 }
    }
    fn from_f64(v: f64) -> Self {
        Bool8((v != 0.0) as u8)
    }
}

/// A Rust value type tensors are built from and read back into: every [`Element`] plus plain
/// `bool`. `bool` cannot be an [`Element`] itself (elements are `Pod`, so any byte pattern read
/// from a file must be a valid value, and only 0 and 1 are valid bools); it converts through
/// [`Bool8`] at the boundary instead, so `Tensor::from_vec(vec![true, false], ..)` and
/// `to_vec::<bool>()` work like for every other type.
pub trait HostElement: Copy + Send + Sync + 'static + std::fmt::Debug + PartialEq {
    /// The element type stored in the tensor.
    type Stored: Element;
    fn to_stored(self) -> Self::Stored;
    fn from_stored(v: Self::Stored) -> Self;
    /// `data` viewed as stored elements without a copy, when `Self` is its own stored type.
    fn as_stored_slice(data: &[Self]) -> Option<&[Self::Stored]> {
        let _ = data;
        None
    }
}

impl<T: Element> HostElement for T {
    type Stored = T;
    #[inline(always)]
    fn to_stored(self) -> T {
        self
    }
    #[inline(always)]
    fn from_stored(v: T) -> T {
        v
    }
    #[inline]
    fn as_stored_slice(data: &[T]) -> Option<&[T]> {
        Some(data)
    }
}

impl HostElement for bool {
    type Stored = Bool8;
    #[inline(always)]
    fn to_stored(self) -> Bool8 {
        Bool8(self as u8)
    }
    #[inline(always)]
    fn from_stored(v: Bool8) -> bool {
        v.0 != 0
    }
}

/// The types kernels compute in (f32, f64): num-traits' `Float` plus what it lacks.
pub trait AccFloat:
    num_traits::Float + Send + Sync + Copy + std::iter::Sum + std::ops::AddAssign + 'static + std::fmt::Debug
{
    fn erf(self) -> Self;
    fn from_f64c(v: f64) -> Self;
    /// e^x; for f32 a vectorisable version within 1 ulp (see `kernels::vmath`).
    fn vexp(self) -> Self;
    /// e^x for x ≤ 0 (or NaN), as softmax needs it after subtracting the row maximum; for f32 a
    /// shorter vectorisable version within 1 ulp that returns 0 where e^x is subnormal (see
    /// `kernels::vmath::exp_nonpositive_f32`).
    fn vexp_nonpositive(self) -> Self;
    /// tanh(x); for f32 a vectorisable version within 2 ulp.
    fn vtanh(self) -> Self;
    /// 1 / (1 + e^-x).
    fn vsigmoid(self) -> Self;
}
impl AccFloat for f32 {
    #[inline(always)]
    fn erf(self) -> f32 {
        libm::erff(self)
    }
    #[inline(always)]
    fn from_f64c(v: f64) -> f32 {
        v as f32
    }
    #[inline(always)]
    fn vexp(self) -> f32 {
        crate::kernels::vmath::exp_f32(self)
    }
    #[inline(always)]
    fn vexp_nonpositive(self) -> f32 {
        crate::kernels::vmath::exp_nonpositive_f32(self)
    }
    #[inline(always)]
    fn vtanh(self) -> f32 {
        crate::kernels::vmath::tanh_f32(self)
    }
    #[inline(always)]
    fn vsigmoid(self) -> f32 {
        crate::kernels::vmath::sigmoid_f32(self)
    }
}
impl AccFloat for f64 {
    #[inline(always)]
    fn erf(self) -> f64 {
        libm::erf(self)
    }
    #[inline(always)]
    fn from_f64c(v: f64) -> f64 {
        v
    }
    #[inline(always)]
    fn vexp(self) -> f64 {
        self.exp()
    }
    #[inline(always)]
    fn vexp_nonpositive(self) -> f64 {
        self.exp()
    }
    #[inline(always)]
    fn vtanh(self) -> f64 {
        self.tanh()
    }
    #[inline(always)]
    fn vsigmoid(self) -> f64 {
        1.0 / (1.0 + (-self).exp())
    }
}

/// Floating-point element types: they compute in `Acc` (f32 for f16/bf16/f32, f64 for f64).
pub trait Float: Element {
    type Acc: AccFloat;
    fn to_acc(self) -> Self::Acc;
    fn from_acc(v: Self::Acc) -> Self;
    fn acc_from_f64(v: f64) -> Self::Acc;
    fn acc_to_f64(v: Self::Acc) -> f64;
}

impl Float for f32 {
    type Acc = f32;
    #[inline(always)]
    fn to_acc(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_acc(v: f32) -> f32 {
        v
    }
    #[inline(always)]
    fn acc_from_f64(v: f64) -> f32 {
        v as f32
    }
    #[inline(always)]
    fn acc_to_f64(v: f32) -> f64 {
        v as f64
    }
}
impl Float for f64 {
    type Acc = f64;
    #[inline(always)]
    fn to_acc(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_acc(v: f64) -> f64 {
        v
    }
    #[inline(always)]
    fn acc_from_f64(v: f64) -> f64 {
        v
    }
    #[inline(always)]
    fn acc_to_f64(v: f64) -> f64 {
        v
    }
}
/// The half-precision types compute in f32: loads widen exactly, stores round to nearest even.
macro_rules! half_float {
    ($($t:ty),*) => {$(
        impl Float for $t {
            type Acc = f32;
            #[inline(always)]
            fn to_acc(self) -> f32 {
                self.to_f32()
            }
            #[inline(always)]
            fn from_acc(v: f32) -> $t {
                <$t>::from_f32(v)
            }
            #[inline(always)]
            fn acc_from_f64(v: f64) -> f32 {
                v as f32
            }
            #[inline(always)]
            fn acc_to_f64(v: f32) -> f64 {
                v as f64
            }
        }
    )*};
}
half_float!(f16, bf16);

/// Integer element types (arithmetic wraps like PyTorch's).
pub trait Int: Element + Ord {
    fn to_i64(self) -> i64;
    fn from_i64(v: i64) -> Self;
}
impl Int for i64 {
    fn to_i64(self) -> i64 {
        self
    }
    fn from_i64(v: i64) -> i64 {
        v
    }
}
impl Int for i32 {
    fn to_i64(self) -> i64 {
        self as i64
    }
    fn from_i64(v: i64) -> i32 {
        v as i32
    }
}
impl Int for u8 {
    fn to_i64(self) -> i64 {
        self as i64
    }
    fn from_i64(v: i64) -> u8 {
        v as u8
    }
}

/// Dispatch on a dtype to a block generic over the floating-point element type `$T`.
#[macro_export]
#[doc(hidden)]
macro_rules! dispatch_float {
    ($dtype:expr, $op:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            other => return Err($crate::TensorError::UnsupportedDType { op: $op, dtype: other }),
        }
    };
}

/// Dispatch on any dtype to a block generic over the element type `$T` (bool as [`Bool8`]).
#[macro_export]
#[doc(hidden)]
macro_rules! dispatch_all {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::DType::Bool => {
                type $T = $crate::element::Bool8;
                $body
            }
        }
    };
}

/// Dispatch on the element *size* for pure data movement (copies, gathers, cats).
#[macro_export]
#[doc(hidden)]
macro_rules! dispatch_bits {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype.size_in_bytes() {
            8 => {
                type $T = u64;
                $body
            }
            4 => {
                type $T = u32;
                $body
            }
            2 => {
                type $T = u16;
                $body
            }
            _ => {
                type $T = u8;
                $body
            }
        }
    };
}
