//! The CPU body of `torch.optim.SGD` (plain and with momentum), one file per optimizer so that a
//! reader comparing it with PyTorch's sequence of ops finds it by name.

use num_traits::Float as _;

use super::rounding::r;
use crate::element::Float;

/// Scalars of one SGD step, in the compute type.
#[derive(Clone, Copy, Debug)]
pub(super) struct SgdScalars<A> {
    pub(super) maximize: bool,
    /// `Some(weight_decay)` when non-zero: `grad = grad.add(param, alpha=wd)`.
    pub(super) weight_decay: Option<A>,
    pub(super) momentum: A,
    /// `1 - dampening` (the alpha of `buf.add_(grad, alpha=1-dampening)`).
    pub(super) one_minus_dampening: A,
    pub(super) nesterov: bool,
    /// `-lr` (the alpha of `param.add_(grad, alpha=-lr)`).
    pub(super) neg_lr: A,
}

#[inline(always)]
pub(super) fn sgd_grad<T: Float>(k: &SgdScalars<T::Acc>, g: T, p: T::Acc) -> T::Acc {
    let mut g = g.to_acc();
    if k.maximize {
        g = -g;
    }
    if let Some(wd) = k.weight_decay {
        g = r::<T>(p.mul_add(wd, g));
    }
    g
}

/// SGD without momentum: `param += -lr * grad'`.
#[inline(always)]
pub(super) fn sgd_plain<T: Float>(k: &SgdScalars<T::Acc>, p: &mut [T], g: &[T]) {
    for (p, &g) in p.iter_mut().zip(g) {
        let pa = p.to_acc();
        let ga = sgd_grad::<T>(k, g, pa);
        *p = T::from_acc(ga.mul_add(k.neg_lr, pa));
    }
}

/// SGD with momentum; `first` creates the buffer as a copy of the (decayed) gradient.
#[inline(always)]
pub(super) fn sgd_momentum<T: Float>(k: &SgdScalars<T::Acc>, first: bool, p: &mut [T], buf: &mut [T], g: &[T]) {
    for ((p, b), &g) in p.iter_mut().zip(buf.iter_mut()).zip(g) {
        let pa = p.to_acc();
        let ga = sgd_grad::<T>(k, g, pa);
        let ba = if first { ga } else { r::<T>(ga.mul_add(k.one_minus_dampening, r::<T>(b.to_acc() * k.momentum))) };
        *b = T::from_acc(ba);
        let step = if k.nesterov { r::<T>(ba.mul_add(k.momentum, ga)) } else { ba };
        *p = T::from_acc(step.mul_add(k.neg_lr, pa));
    }
}
