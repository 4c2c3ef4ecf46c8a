//! The two rounding helpers every fused optimizer body shares: rounding an intermediate to the
//! element type as PyTorch materialises it, and PyTorch's two-branch `lerp`. A leaf of its own so
//! that the per-optimizer files depend on it and the dispatcher (`fused.rs`) on them, one way.

use crate::element::{AccFloat, Float};

/// Round an intermediate to the element type and back (a no-op for f32/f64 elements; for
/// bf16/f16 it reproduces PyTorch materialising an intermediate tensor).
#[inline(always)]
pub(super) fn r<T: Float>(x: T::Acc) -> T::Acc {
    T::from_acc(x).to_acc()
}

/// PyTorch's `lerp` (its vectorised CPU form): `s + w (e - s)` for |w| < 0.5, else
/// `e - (e - s)(1 - w)`, each as one fused multiply-add.
#[inline(always)]
pub(super) fn lerp<A: AccFloat>(s: A, e: A, w: A, one_minus_w: A, small: bool) -> A {
    let d = e - s;
    if small { w.mul_add(d, s) } else { (-d).mul_add(one_minus_w, e) }
}
