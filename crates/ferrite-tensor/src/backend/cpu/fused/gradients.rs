//! The CPU bodies of the fused kernels that are not optimizer steps: the GradScaler's
//! unscale-and-check, a vector norm's partial reduction, and the two gradient clippings.

use num_traits::Float as _;

use crate::backend::NormKind;
use crate::element::Float;

// ------------------------------------------------------------------------------ GradScaler

/// Multiply by `inv_scale` (skipped when it is 1) and report whether any element was inf or NaN.
#[inline(always)]
pub(super) fn unscale<T: Float>(g: &mut [T], inv_scale: T::Acc) -> bool {
    let mut bad = false;
    let one = inv_scale == T::acc_from_f64(1.0);
    for x in g.iter_mut() {
        let a = x.to_acc();
        bad |= !a.is_finite();
        if !one {
            *x = T::from_acc(a * inv_scale);
        }
    }
    bad
}

// ------------------------------------------------------------------------------------ norms

/// Partial norm reduction of a chunk in f64, with 8 independent accumulators (fixed order, so
/// the result does not depend on the machine).
#[inline(always)]
pub(super) fn norm_partial<T: Float>(kind: NormKind, x: &[T]) -> f64 {
    let mut acc = [kind.identity(); 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a = kind.combine(*a, kind.elem(v.to_f64()));
        }
    }
    let mut total = kind.identity();
    for a in acc {
        total = kind.combine(total, a);
    }
    for v in chunks.remainder() {
        total = kind.combine(total, kind.elem(v.to_f64()));
    }
    total
}

/// `clamp_(-clip, clip)` (NaN stays NaN).
#[inline(always)]
pub(super) fn clamp_abs<T: Float>(g: &mut [T], clip: T::Acc) {
    for x in g.iter_mut() {
        let a = x.to_acc();
        if a > clip {
            *x = T::from_acc(clip);
        } else if a < -clip {
            *x = T::from_acc(-clip);
        }
    }
}

/// `mul_(coef)`.
#[inline(always)]
pub(super) fn scale<T: Float>(g: &mut [T], coef: T::Acc) {
    for x in g.iter_mut() {
        *x = T::from_acc(x.to_acc() * coef);
    }
}
