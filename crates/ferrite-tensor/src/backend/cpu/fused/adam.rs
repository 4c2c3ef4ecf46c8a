//! The CPU body of `torch.optim.Adam` / `AdamW` (AMSGrad included), one file per optimizer so
//! that a reader comparing it with PyTorch's sequence of ops finds it by name.

use num_traits::Float as _;

use super::rounding::{lerp, r};
use crate::element::Float;

/// Scalars of one Adam/AdamW step, in the compute type.
#[derive(Clone, Copy, Debug)]
pub(super) struct AdamScalars<A> {
    pub(super) maximize: bool,
    /// Adam's L2 term: `grad = grad.add(param, alpha=wd)`.
    pub(super) l2: Option<A>,
    /// AdamW's decoupled decay: `param.mul_(1 - lr * wd)`.
    pub(super) decay: Option<A>,
    /// `1 - beta1`, the weight of `exp_avg.lerp_(grad, 1 - beta1)`.
    pub(super) w1: A,
    pub(super) one_minus_w1: A,
    pub(super) w1_small: bool,
    pub(super) beta2: A,
    /// `1 - beta2`, the value of `addcmul_`.
    pub(super) c2: A,
    pub(super) bias_correction2_sqrt: A,
    pub(super) eps: A,
    /// `-lr / bias_correction1`, the value of `addcdiv_`.
    pub(super) neg_step_size: A,
}

/// The shared body: returns (new param, new exp_avg, new exp_avg_sq) before the AMSGrad max.
#[inline(always)]
pub(super) fn adam_moments<T: Float>(k: &AdamScalars<T::Acc>, p: T, m: T, v: T, g: T) -> (T::Acc, T::Acc, T::Acc) {
    let mut pa = p.to_acc();
    let mut ga = g.to_acc();
    if k.maximize {
        ga = -ga;
    }
    if let Some(decay) = k.decay {
        pa = r::<T>(pa * decay);
    }
    if let Some(wd) = k.l2 {
        ga = r::<T>(pa.mul_add(wd, ga));
    }
    let ma = r::<T>(lerp(m.to_acc(), ga, k.w1, k.one_minus_w1, k.w1_small));
    let va = r::<T>(v.to_acc() * k.beta2);
    let va = r::<T>((k.c2 * ga).mul_add(ga, va));
    (pa, ma, va)
}

#[inline(always)]
pub(super) fn adam_apply<T: Float>(k: &AdamScalars<T::Acc>, pa: T::Acc, ma: T::Acc, vv: T::Acc) -> T {
    let denom = r::<T>(r::<T>(vv.sqrt()) / k.bias_correction2_sqrt);
    let denom = r::<T>(denom + k.eps);
    T::from_acc(pa + (k.neg_step_size * ma) / denom)
}

/// One Adam/AdamW step over a chunk.
#[inline(always)]
pub(super) fn adam<T: Float>(k: &AdamScalars<T::Acc>, p: &mut [T], m: &mut [T], v: &mut [T], g: &[T]) {
    for (((p, m), v), &g) in p.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(g) {
        let (pa, ma, va) = adam_moments::<T>(k, *p, *m, *v, g);
        *m = T::from_acc(ma);
        *v = T::from_acc(va);
        *p = adam_apply::<T>(k, pa, ma, va);
    }
}

/// One AMSGrad step: the denominator uses the running maximum of `exp_avg_sq`.
#[inline(always)]
pub(super) fn adam_amsgrad<T: Float>(
    k: &AdamScalars<T::Acc>,
    p: &mut [T],
    m: &mut [T],
    v: &mut [T],
    vmax: &mut [T],
    g: &[T],
) {
    for ((((p, m), v), vm), &g) in p.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(vmax.iter_mut()).zip(g) {
        let (pa, ma, va) = adam_moments::<T>(k, *p, *m, *v, g);
        let old = vm.to_acc();
        // torch.maximum propagates NaN.
        let mx = if old.is_nan() || va.is_nan() {
            T::acc_from_f64(f64::NAN)
        } else if va > old {
            va
        } else {
            old
        };
        *m = T::from_acc(ma);
        *v = T::from_acc(va);
        *vm = T::from_acc(mx);
        *p = adam_apply::<T>(k, pa, ma, T::from_acc(mx).to_acc());
    }
}
