//! The CPU body of `torch.optim.Adagrad`, one file per optimizer so that a reader comparing it
//! with PyTorch's sequence of ops finds it by name.

use num_traits::Float as _;

use super::rounding::r;
use crate::element::Float;

/// Scalars of one Adagrad step, in the compute type.
#[derive(Clone, Copy, Debug)]
pub(super) struct AdagradScalars<A> {
    pub(super) maximize: bool,
    pub(super) weight_decay: Option<A>,
    pub(super) eps: A,
    /// `-clr` (the value of `param.addcdiv_(grad, std, value=-clr)`).
    pub(super) neg_clr: A,
}

/// `sum.addcmul_(grad, grad, value=1)`, `std = sum.sqrt().add_(eps)`,
/// `param.addcdiv_(grad, std, value=-clr)`.
#[inline(always)]
pub(super) fn adagrad<T: Float>(k: &AdagradScalars<T::Acc>, p: &mut [T], sum: &mut [T], g: &[T]) {
    for ((p, s), &g) in p.iter_mut().zip(sum.iter_mut()).zip(g) {
        let pa = p.to_acc();
        let mut ga = g.to_acc();
        if k.maximize {
            ga = -ga;
        }
        if let Some(wd) = k.weight_decay {
            ga = r::<T>(pa.mul_add(wd, ga));
        }
        let sa = r::<T>(ga.mul_add(ga, s.to_acc()));
        let std = r::<T>(r::<T>(sa.sqrt()) + k.eps);
        *s = T::from_acc(sa);
        *p = T::from_acc(pa + (k.neg_clr * ga) / std);
    }
}
