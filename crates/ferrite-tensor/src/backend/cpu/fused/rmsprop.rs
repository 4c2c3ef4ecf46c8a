//! The CPU body of `torch.optim.RMSprop` (plain, momentum, centered and both), one file per
//! optimizer so that a reader comparing it with PyTorch's sequence of ops finds it by name.

use num_traits::Float as _;

use super::rounding::{lerp, r};
use crate::element::Float;

/// Scalars of one RMSprop step, in the compute type.
#[derive(Clone, Copy, Debug)]
pub(super) struct RmspropScalars<A> {
    pub(super) maximize: bool,
    /// `Some(weight_decay)` when non-zero: `grad = grad.add(param, alpha=wd)`.
    pub(super) weight_decay: Option<A>,
    pub(super) alpha: A,
    /// `1 - alpha`: the value of `addcmul_` and the weight of `grad_avg.lerp_`.
    pub(super) w: A,
    pub(super) one_minus_w: A,
    pub(super) w_small: bool,
    pub(super) eps: A,
    pub(super) momentum: A,
    /// `-lr` (the value of `addcdiv_`, the alpha of `param.add_(buf, alpha=-lr)`).
    pub(super) neg_lr: A,
}

/// The gradient after `maximize` and weight decay, and the new `square_avg`
/// (`square_avg.mul_(alpha).addcmul_(grad, grad, value=1-alpha)`).
#[inline(always)]
pub(super) fn rmsprop_grad_sq<T: Float>(k: &RmspropScalars<T::Acc>, pa: T::Acc, g: T, sq: T) -> (T::Acc, T::Acc) {
    let mut ga = g.to_acc();
    if k.maximize {
        ga = -ga;
    }
    if let Some(wd) = k.weight_decay {
        ga = r::<T>(pa.mul_add(wd, ga));
    }
    let s = r::<T>(sq.to_acc() * k.alpha);
    (ga, r::<T>((k.w * ga).mul_add(ga, s)))
}

/// `avg = sqrt(square_avg).add_(eps)`.
#[inline(always)]
pub(super) fn rmsprop_avg<T: Float>(k: &RmspropScalars<T::Acc>, sq: T::Acc) -> T::Acc {
    r::<T>(r::<T>(sq.sqrt()) + k.eps)
}

/// Centered: `grad_avg.lerp_(grad, 1-alpha)`, then
/// `avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_().add_(eps)`.
#[inline(always)]
pub(super) fn rmsprop_centered_avg<T: Float>(
    k: &RmspropScalars<T::Acc>,
    ga: T::Acc,
    gavg: T,
    sq: T::Acc,
) -> (T::Acc, T::Acc) {
    let m = r::<T>(lerp(gavg.to_acc(), ga, k.w, k.one_minus_w, k.w_small));
    let v = r::<T>((-m).mul_add(m, sq));
    (m, rmsprop_avg::<T>(k, v))
}

/// `buf.mul_(momentum).addcdiv_(grad, avg)`, then `param.add_(buf, alpha=-lr)`: (param, buf).
#[inline(always)]
pub(super) fn rmsprop_apply_momentum<T: Float>(
    k: &RmspropScalars<T::Acc>,
    pa: T::Acc,
    ga: T::Acc,
    avg: T::Acc,
    buf: T,
) -> (T, T) {
    let b = r::<T>(r::<T>(buf.to_acc() * k.momentum) + ga / avg);
    (T::from_acc(b.mul_add(k.neg_lr, pa)), T::from_acc(b))
}

/// `param.addcdiv_(grad, avg, value=-lr)`.
#[inline(always)]
pub(super) fn rmsprop_apply<T: Float>(k: &RmspropScalars<T::Acc>, pa: T::Acc, ga: T::Acc, avg: T::Acc) -> T {
    T::from_acc(pa + (k.neg_lr * ga) / avg)
}

#[inline(always)]
pub(super) fn rmsprop_plain<T: Float>(k: &RmspropScalars<T::Acc>, p: &mut [T], sq: &mut [T], g: &[T]) {
    for ((p, sq), &g) in p.iter_mut().zip(sq.iter_mut()).zip(g) {
        let pa = p.to_acc();
        let (ga, s) = rmsprop_grad_sq::<T>(k, pa, g, *sq);
        *sq = T::from_acc(s);
        *p = rmsprop_apply::<T>(k, pa, ga, rmsprop_avg::<T>(k, s));
    }
}

#[inline(always)]
pub(super) fn rmsprop_momentum<T: Float>(
    k: &RmspropScalars<T::Acc>,
    p: &mut [T],
    sq: &mut [T],
    buf: &mut [T],
    g: &[T],
) {
    for (((p, sq), b), &g) in p.iter_mut().zip(sq.iter_mut()).zip(buf.iter_mut()).zip(g) {
        let pa = p.to_acc();
        let (ga, s) = rmsprop_grad_sq::<T>(k, pa, g, *sq);
        *sq = T::from_acc(s);
        (*p, *b) = rmsprop_apply_momentum::<T>(k, pa, ga, rmsprop_avg::<T>(k, s), *b);
    }
}

#[inline(always)]
pub(super) fn rmsprop_centered<T: Float>(
    k: &RmspropScalars<T::Acc>,
    p: &mut [T],
    sq: &mut [T],
    gavg: &mut [T],
    g: &[T],
) {
    for (((p, sq), m), &g) in p.iter_mut().zip(sq.iter_mut()).zip(gavg.iter_mut()).zip(g) {
        let pa = p.to_acc();
        let (ga, s) = rmsprop_grad_sq::<T>(k, pa, g, *sq);
        let (ma, avg) = rmsprop_centered_avg::<T>(k, ga, *m, s);
        *sq = T::from_acc(s);
        *m = T::from_acc(ma);
        *p = rmsprop_apply::<T>(k, pa, ga, avg);
    }
}

#[inline(always)]
pub(super) fn rmsprop_centered_momentum<T: Float>(
    k: &RmspropScalars<T::Acc>,
    p: &mut [T],
    sq: &mut [T],
    buf: &mut [T],
    gavg: &mut [T],
    g: &[T],
) {
    for ((((p, sq), b), m), &g) in p.iter_mut().zip(sq.iter_mut()).zip(buf.iter_mut()).zip(gavg.iter_mut()).zip(g) {
        let pa = p.to_acc();
        let (ga, s) = rmsprop_grad_sq::<T>(k, pa, g, *sq);
        let (ma, avg) = rmsprop_centered_avg::<T>(k, ga, *m, s);
        *sq = T::from_acc(s);
        *m = T::from_acc(ma);
        (*p, *b) = rmsprop_apply_momentum::<T>(k, pa, ga, avg, *b);
    }
}
