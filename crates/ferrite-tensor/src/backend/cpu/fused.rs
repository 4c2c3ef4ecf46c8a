//! CPU bodies of the named fused kernels (optimizer steps, GradScaler unscaling, norms,
//! clipping).
//!
//! Each body reproduces the sequence of PyTorch CPU ops it replaces, in the same compute type,
//! rounding to the element type wherever PyTorch stores a tensor, with fused multiply-adds
//! exactly where PyTorch's vectorised kernels use them (`add` with alpha, `lerp`, the second step
//! of `addcmul`). Trajectories therefore match PyTorch's to the last bit or so, and are
//! bit-identical across machines: FMA is exactly rounded wherever it runs. The loops run inside
//! [`vectorize`], so they are compiled for AVX-512 / AVX2+FMA where the CPU has them.
//!
//! Work is split into fixed chunks of [`FUSED_CHUNK`] elements (never derived from the thread
//! count), and per-chunk results combine in chunk order, so results are reproducible bit for bit.

use num_traits::Float as _;
use rayon::prelude::*;
use smallvec::SmallVec;

use crate::element::{AccFloat, Float};
use crate::error::Result;
use crate::kernels::simd::vectorize;
use crate::ops::fused::{FUSED_CHUNK, FusedKernel, NormKind};
use crate::{Tensor, dispatch_float};

/// Raw element pointer that may cross into rayon tasks.
#[derive(Copy, Clone)]
struct RawPtr<T>(*mut T);
// SAFETY: used only below, where every task gets disjoint element ranges of the outputs and
// reads inputs that no task writes (the op layer rejects overlapping operands); the tensors
// outlive the parallel loop because the caller holds them by reference.
unsafe impl<T> Send for RawPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for RawPtr<T> {}

/// Run `f` over matching chunks of the (contiguous, same-length, non-overlapping) operands and
/// return the per-chunk results in chunk order.
fn chunks<T: Float, R: Send>(
    outputs: &[&Tensor],
    inputs: &[&Tensor],
    f: impl Fn(&mut [&mut [T]], &[&[T]]) -> R + Sync + Send,
) -> Result<Vec<R>> {
    let n = outputs.first().or(inputs.first()).map_or(0, |t| t.numel());
    let outs: SmallVec<[RawPtr<T>; 4]> =
        outputs.iter().map(|t| t.ptr::<T>("fused").map(RawPtr)).collect::<Result<_>>()?;
    let ins: SmallVec<[RawPtr<T>; 4]> =
        inputs.iter().map(|t| t.ptr::<T>("fused").map(RawPtr)).collect::<Result<_>>()?;
    let run = |c: usize| -> R {
        let start = c * FUSED_CHUNK;
        let len = FUSED_CHUNK.min(n - start);
        // SAFETY: every operand is contiguous with `n` initialised elements of T (checked by the
        // op layer), so [start, start+len) is in bounds. Chunks are disjoint, so no two tasks
        // build slices over the same output elements, and outputs overlap neither each other nor
        // any input (checked by the op layer), so the `&mut` slices alias nothing else we create.
        let mut o: SmallVec<[&mut [T]; 4]> =
            outs.iter().map(|p| unsafe { std::slice::from_raw_parts_mut(p.0.add(start), len) }).collect();
        // SAFETY: as above; inputs are only read.
        let i: SmallVec<[&[T]; 4]> =
            ins.iter().map(|p| unsafe { std::slice::from_raw_parts(p.0.add(start), len) as &[T] }).collect();
        f(&mut o, &i)
    };
    let count = n.div_ceil(FUSED_CHUNK);
    Ok(if count <= 1 || rayon::current_num_threads() <= 1 {
        (0..count).map(run).collect()
    } else {
        (0..count).into_par_iter().map(run).collect()
    })
}

pub(super) fn fused(kernel: &FusedKernel, outputs: &[&Tensor], inputs: &[&Tensor]) -> Result<f64> {
    let dtype = outputs.first().or(inputs.first()).map(|t| t.dtype()).unwrap_or(crate::DType::F32);
    dispatch_float!(dtype, kernel.name(), T => run::<T>(kernel, outputs, inputs))
}

fn run<T: Float>(kernel: &FusedKernel, outputs: &[&Tensor], inputs: &[&Tensor]) -> Result<f64> {
    let a = T::acc_from_f64;
    match *kernel {
        FusedKernel::Sgd { lr, momentum, dampening, nesterov, weight_decay, maximize, first_step } => {
            let k = SgdScalars::<T::Acc> {
                maximize,
                weight_decay: (weight_decay != 0.0).then(|| a(weight_decay)),
                momentum: a(momentum),
                one_minus_dampening: a(1.0 - dampening),
                nesterov,
                neg_lr: a(-lr),
            };
            if momentum == 0.0 {
                chunks::<T, ()>(outputs, inputs, |o, i| {
                    vectorize(
                        #[inline(always)]
                        || sgd_plain::<T>(&k, o[0], i[0]),
                    )
                })?;
            } else {
                chunks::<T, ()>(outputs, inputs, |o, i| {
                    let (po, bo) = o.split_at_mut(1);
                    vectorize(
                        #[inline(always)]
                        || sgd_momentum::<T>(&k, first_step, po[0], bo[0], i[0]),
                    )
                })?;
            }
            Ok(0.0)
        }
        FusedKernel::Adam { l2, decay, beta1, beta2, eps, bias_correction2_sqrt, step_size, maximize, amsgrad } => {
            let w1 = a(1.0 - beta1);
            let k = AdamScalars::<T::Acc> {
                maximize,
                l2: l2.map(a),
                decay: decay.map(a),
                w1,
                one_minus_w1: a(1.0) - w1,
                w1_small: T::acc_to_f64(w1).abs() < 0.5,
                beta2: a(beta2),
                c2: a(1.0 - beta2),
                bias_correction2_sqrt: a(bias_correction2_sqrt),
                eps: a(eps),
                neg_step_size: a(-step_size),
            };
            if amsgrad {
                chunks::<T, ()>(outputs, inputs, |o, i| {
                    let [po, mo, vo, xo] = o else { unreachable!("the op layer checked four outputs") };
                    vectorize(
                        #[inline(always)]
                        || adam_amsgrad::<T>(&k, po, mo, vo, xo, i[0]),
                    )
                })?;
            } else {
                chunks::<T, ()>(outputs, inputs, |o, i| {
                    let [po, mo, vo] = o else { unreachable!("the op layer checked three outputs") };
                    vectorize(
                        #[inline(always)]
                        || adam::<T>(&k, po, mo, vo, i[0]),
                    )
                })?;
            }
            Ok(0.0)
        }
        FusedKernel::Unscale { inv_scale } => {
            let inv = a(inv_scale);
            let parts = chunks::<T, bool>(outputs, inputs, |o, _| {
                vectorize(
                    #[inline(always)]
                    || unscale::<T>(o[0], inv),
                )
            })?;
            Ok(if parts.into_iter().any(|b| b) { 1.0 } else { 0.0 })
        }
        FusedKernel::NormPartial { kind } => {
            let parts = chunks::<T, f64>(outputs, inputs, |_, i| {
                vectorize(
                    #[inline(always)]
                    || norm_partial::<T>(kind, i[0]),
                )
            })?;
            Ok(parts.into_iter().fold(kind.identity(), |acc, p| kind.combine(acc, p)))
        }
        FusedKernel::ClampAbs { clip } => {
            let c = a(clip);
            chunks::<T, ()>(outputs, inputs, |o, _| {
                vectorize(
                    #[inline(always)]
                    || clamp_abs::<T>(o[0], c),
                )
            })?;
            Ok(0.0)
        }
        FusedKernel::Scale { coef } => {
            let c = T::from_f64(coef).to_acc();
            chunks::<T, ()>(outputs, inputs, |o, _| {
                vectorize(
                    #[inline(always)]
                    || scale::<T>(o[0], c),
                )
            })?;
            Ok(0.0)
        }
        FusedKernel::Rmsprop { lr, alpha, eps, weight_decay, momentum, centered, maximize } => {
            let w = a(1.0 - alpha);
            let k = RmspropScalars::<T::Acc> {
                maximize,
                weight_decay: (weight_decay != 0.0).then(|| a(weight_decay)),
                alpha: a(alpha),
                w,
                one_minus_w: a(1.0) - w,
                w_small: T::acc_to_f64(w).abs() < 0.5,
                eps: a(eps),
                momentum: a(momentum),
                neg_lr: a(-lr),
            };
            match (momentum > 0.0, centered) {
                (false, false) => chunks::<T, ()>(outputs, inputs, |o, i| {
                    let [po, so] = o else { unreachable!("the op layer checked two outputs") };
                    vectorize(
                        #[inline(always)]
                        || rmsprop_plain::<T>(&k, po, so, i[0]),
                    )
                })?,
                (true, false) => chunks::<T, ()>(outputs, inputs, |o, i| {
                    let [po, so, bo] = o else { unreachable!("the op layer checked three outputs") };
                    vectorize(
                        #[inline(always)]
                        || rmsprop_momentum::<T>(&k, po, so, bo, i[0]),
                    )
                })?,
                (false, true) => chunks::<T, ()>(outputs, inputs, |o, i| {
                    let [po, so, go] = o else { unreachable!("the op layer checked three outputs") };
                    vectorize(
                        #[inline(always)]
                        || rmsprop_centered::<T>(&k, po, so, go, i[0]),
                    )
                })?,
                (true, true) => chunks::<T, ()>(outputs, inputs, |o, i| {
                    let [po, so, bo, go] = o else { unreachable!("the op layer checked four outputs") };
                    vectorize(
                        #[inline(always)]
                        || rmsprop_centered_momentum::<T>(&k, po, so, bo, go, i[0]),
                    )
                })?,
            };
            Ok(0.0)
        }
        FusedKernel::Adagrad { clr, eps, weight_decay, maximize } => {
            let k = AdagradScalars::<T::Acc> {
                maximize,
                weight_decay: (weight_decay != 0.0).then(|| a(weight_decay)),
                eps: a(eps),
                neg_clr: a(-clr),
            };
            chunks::<T, ()>(outputs, inputs, |o, i| {
                let [po, so] = o else { unreachable!("the op layer checked two outputs") };
                vectorize(
                    #[inline(always)]
                    || adagrad::<T>(&k, po, so, i[0]),
                )
            })?;
            Ok(0.0)
        }
    }
}

/// Round an intermediate to the element type and back (a no-op for f32/f64 elements; for
/// bf16/f16 it reproduces PyTorch materialising an intermediate tensor).
#[inline(always)]
fn r<T: Float>(x: T::Acc) -> T::Acc {
    T::from_acc(x).to_acc()
}

/// PyTorch's `lerp` (its vectorised CPU form): `s + w (e - s)` for |w| < 0.5, else
/// `e - (e - s)(1 - w)`, each as one fused multiply-add.
#[inline(always)]
fn lerp<A: AccFloat>(s: A, e: A, w: A, one_minus_w: A, small: bool) -> A {
    let d = e - s;
    if small { w.mul_add(d, s) } else { (-d).mul_add(one_minus_w, e) }
}

// ------------------------------------------------------------------------------------- SGD

/// Scalars of one SGD step, in the compute type.
#[derive(Clone, Copy, Debug)]
struct SgdScalars<A> {
    maximize: bool,
    /// `Some(weight_decay)` when non-zero: `grad = grad.add(param, alpha=wd)`.
    weight_decay: Option<A>,
    momentum: A,
    /// `1 - dampening` (the alpha of `buf.add_(grad, alpha=1-dampening)`).
    one_minus_dampening: A,
    nesterov: bool,
    /// `-lr` (the alpha of `param.add_(grad, alpha=-lr)`).
    neg_lr: A,
}

#[inline(always)]
fn sgd_grad<T: Float>(k: &SgdScalars<T::Acc>, g: T, p: T::Acc) -> T::Acc {
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
fn sgd_plain<T: Float>(k: &SgdScalars<T::Acc>, p: &mut [T], g: &[T]) {
    for (p, &g) in p.iter_mut().zip(g) {
        let pa = p.to_acc();
        let ga = sgd_grad::<T>(k, g, pa);
        *p = T::from_acc(ga.mul_add(k.neg_lr, pa));
    }
}

/// SGD with momentum; `first` creates the buffer as a copy of the (decayed) gradient.
#[inline(always)]
fn sgd_momentum<T: Float>(k: &SgdScalars<T::Acc>, first: bool, p: &mut [T], buf: &mut [T], g: &[T]) {
    for ((p, b), &g) in p.iter_mut().zip(buf.iter_mut()).zip(g) {
        let pa = p.to_acc();
        let ga = sgd_grad::<T>(k, g, pa);
        let ba = if first { ga } else { r::<T>(ga.mul_add(k.one_minus_dampening, r::<T>(b.to_acc() * k.momentum))) };
        *b = T::from_acc(ba);
        let step = if k.nesterov { r::<T>(ba.mul_add(k.momentum, ga)) } else { ba };
        *p = T::from_acc(step.mul_add(k.neg_lr, pa));
    }
}

// ------------------------------------------------------------------------------------ Adam

/// Scalars of one Adam/AdamW step, in the compute type.
#[derive(Clone, Copy, Debug)]
struct AdamScalars<A> {
    maximize: bool,
    /// Adam's L2 term: `grad = grad.add(param, alpha=wd)`.
    l2: Option<A>,
    /// AdamW's decoupled decay: `param.mul_(1 - lr * wd)`.
    decay: Option<A>,
    /// `1 - beta1`, the weight of `exp_avg.lerp_(grad, 1 - beta1)`.
    w1: A,
    one_minus_w1: A,
    w1_small: bool,
    beta2: A,
    /// `1 - beta2`, the value of `addcmul_`.
    c2: A,
    bias_correction2_sqrt: A,
    eps: A,
    /// `-lr / bias_correction1`, the value of `addcdiv_`.
    neg_step_size: A,
}

/// The shared body: returns (new param, new exp_avg, new exp_avg_sq) before the AMSGrad max.
#[inline(always)]
fn adam_moments<T: Float>(k: &AdamScalars<T::Acc>, p: T, m: T, v: T, g: T) -> (T::Acc, T::Acc, T::Acc) {
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
fn adam_apply<T: Float>(k: &AdamScalars<T::Acc>, pa: T::Acc, ma: T::Acc, vv: T::Acc) -> T {
    let denom = r::<T>(r::<T>(vv.sqrt()) / k.bias_correction2_sqrt);
    let denom = r::<T>(denom + k.eps);
    T::from_acc(pa + (k.neg_step_size * ma) / denom)
}

/// One Adam/AdamW step over a chunk.
#[inline(always)]
fn adam<T: Float>(k: &AdamScalars<T::Acc>, p: &mut [T], m: &mut [T], v: &mut [T], g: &[T]) {
    for (((p, m), v), &g) in p.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(g) {
        let (pa, ma, va) = adam_moments::<T>(k, *p, *m, *v, g);
        *m = T::from_acc(ma);
        *v = T::from_acc(va);
        *p = adam_apply::<T>(k, pa, ma, va);
    }
}

/// One AMSGrad step: the denominator uses the running maximum of `exp_avg_sq`.
#[inline(always)]
fn adam_amsgrad<T: Float>(k: &AdamScalars<T::Acc>, p: &mut [T], m: &mut [T], v: &mut [T], vmax: &mut [T], g: &[T]) {
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

// ------------------------------------------------------------------------------ GradScaler

/// Multiply by `inv_scale` (skipped when it is 1) and report whether any element was inf or NaN.
#[inline(always)]
fn unscale<T: Float>(g: &mut [T], inv_scale: T::Acc) -> bool {
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
fn norm_partial<T: Float>(kind: NormKind, x: &[T]) -> f64 {
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
fn clamp_abs<T: Float>(g: &mut [T], clip: T::Acc) {
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
fn scale<T: Float>(g: &mut [T], coef: T::Acc) {
    for x in g.iter_mut() {
        *x = T::from_acc(x.to_acc() * coef);
    }
}

// --------------------------------------------------------------------------------- RMSprop

/// Scalars of one RMSprop step, in the compute type.
#[derive(Clone, Copy, Debug)]
struct RmspropScalars<A> {
    maximize: bool,
    /// `Some(weight_decay)` when non-zero: `grad = grad.add(param, alpha=wd)`.
    weight_decay: Option<A>,
    alpha: A,
    /// `1 - alpha`: the value of `addcmul_` and the weight of `grad_avg.lerp_`.
    w: A,
    one_minus_w: A,
    w_small: bool,
    eps: A,
    momentum: A,
    /// `-lr` (the value of `addcdiv_`, the alpha of `param.add_(buf, alpha=-lr)`).
    neg_lr: A,
}

/// The gradient after `maximize` and weight decay, and the new `square_avg`
/// (`square_avg.mul_(alpha).addcmul_(grad, grad, value=1-alpha)`).
#[inline(always)]
fn rmsprop_grad_sq<T: Float>(k: &RmspropScalars<T::Acc>, pa: T::Acc, g: T, sq: T) -> (T::Acc, T::Acc) {
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
fn rmsprop_avg<T: Float>(k: &RmspropScalars<T::Acc>, sq: T::Acc) -> T::Acc {
    r::<T>(r::<T>(sq.sqrt()) + k.eps)
}

/// Centered: `grad_avg.lerp_(grad, 1-alpha)`, then
/// `avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_().add_(eps)`.
#[inline(always)]
fn rmsprop_centered_avg<T: Float>(k: &RmspropScalars<T::Acc>, ga: T::Acc, gavg: T, sq: T::Acc) -> (T::Acc, T::Acc) {
    let m = r::<T>(lerp(gavg.to_acc(), ga, k.w, k.one_minus_w, k.w_small));
    let v = r::<T>((-m).mul_add(m, sq));
    (m, rmsprop_avg::<T>(k, v))
}

/// `buf.mul_(momentum).addcdiv_(grad, avg)`, then `param.add_(buf, alpha=-lr)`: (param, buf).
#[inline(always)]
fn rmsprop_apply_momentum<T: Float>(k: &RmspropScalars<T::Acc>, pa: T::Acc, ga: T::Acc, avg: T::Acc, buf: T) -> (T, T) {
    let b = r::<T>(r::<T>(buf.to_acc() * k.momentum) + ga / avg);
    (T::from_acc(b.mul_add(k.neg_lr, pa)), T::from_acc(b))
}

/// `param.addcdiv_(grad, avg, value=-lr)`.
#[inline(always)]
fn rmsprop_apply<T: Float>(k: &RmspropScalars<T::Acc>, pa: T::Acc, ga: T::Acc, avg: T::Acc) -> T {
    T::from_acc(pa + (k.neg_lr * ga) / avg)
}

#[inline(always)]
fn rmsprop_plain<T: Float>(k: &RmspropScalars<T::Acc>, p: &mut [T], sq: &mut [T], g: &[T]) {
    for ((p, sq), &g) in p.iter_mut().zip(sq.iter_mut()).zip(g) {
        let pa = p.to_acc();
        let (ga, s) = rmsprop_grad_sq::<T>(k, pa, g, *sq);
        *sq = T::from_acc(s);
        *p = rmsprop_apply::<T>(k, pa, ga, rmsprop_avg::<T>(k, s));
    }
}

#[inline(always)]
fn rmsprop_momentum<T: Float>(k: &RmspropScalars<T::Acc>, p: &mut [T], sq: &mut [T], buf: &mut [T], g: &[T]) {
    for (((p, sq), b), &g) in p.iter_mut().zip(sq.iter_mut()).zip(buf.iter_mut()).zip(g) {
        let pa = p.to_acc();
        let (ga, s) = rmsprop_grad_sq::<T>(k, pa, g, *sq);
        *sq = T::from_acc(s);
        (*p, *b) = rmsprop_apply_momentum::<T>(k, pa, ga, rmsprop_avg::<T>(k, s), *b);
    }
}

#[inline(always)]
fn rmsprop_centered<T: Float>(k: &RmspropScalars<T::Acc>, p: &mut [T], sq: &mut [T], gavg: &mut [T], g: &[T]) {
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
fn rmsprop_centered_momentum<T: Float>(
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

// --------------------------------------------------------------------------------- Adagrad

/// Scalars of one Adagrad step, in the compute type.
#[derive(Clone, Copy, Debug)]
struct AdagradScalars<A> {
    maximize: bool,
    weight_decay: Option<A>,
    eps: A,
    /// `-clr` (the value of `param.addcdiv_(grad, std, value=-clr)`).
    neg_clr: A,
}

/// `sum.addcmul_(grad, grad, value=1)`, `std = sum.sqrt().add_(eps)`,
/// `param.addcdiv_(grad, std, value=-clr)`.
#[inline(always)]
fn adagrad<T: Float>(k: &AdagradScalars<T::Acc>, p: &mut [T], sum: &mut [T], g: &[T]) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lerp_matches_both_pytorch_branches() {
        // w < 0.5: s + w (e - s); w >= 0.5: e - (e - s)(1 - w).
        assert_eq!(lerp(1.0f32, 3.0, 0.25, 0.75, true), 1.5);
        assert_eq!(lerp(1.0f32, 3.0, 0.75, 0.25, false), 2.5);
    }

    #[test]
    fn vectorised_and_scalar_bodies_agree_bitwise() {
        // The same body inside `vectorize` (AVX-512/AVX2 with hardware FMA where available) and
        // called directly must agree, because FMA is exactly rounded on every path.
        let k = AdamScalars::<f32> {
            maximize: false,
            l2: Some(0.01),
            decay: None,
            w1: 0.1,
            one_minus_w1: 0.9,
            w1_small: true,
            beta2: 0.999,
            c2: (1.0f64 - 0.999) as f32,
            bias_correction2_sqrt: 0.0316,
            eps: 1e-8,
            neg_step_size: -0.01,
        };
        let n = 1000;
        let g: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
        let mut p1: Vec<f32> = (0..n).map(|i| (i as f32).sin()).collect();
        let mut m1 = vec![0.01f32; n];
        let mut v1 = vec![0.001f32; n];
        let (mut p2, mut m2, mut v2) = (p1.clone(), m1.clone(), v1.clone());
        vectorize(|| adam::<f32>(&k, &mut p1, &mut m1, &mut v1, &g));
        for i in 0..n {
            let (pa, ma, va) = adam_moments::<f32>(&k, p2[i], m2[i], v2[i], g[i]);
            m2[i] = ma;
            v2[i] = va;
            p2[i] = adam_apply::<f32>(&k, pa, ma, va);
        }
        assert_eq!(p1, p2);
        assert_eq!(m1, m2);
        assert_eq!(v1, v2);
    }

    #[test]
    fn unscale_flags_nonfinite_and_scales() {
        let mut g = vec![2.0f32, f32::INFINITY, 4.0];
        assert!(unscale::<f32>(&mut g, 0.5));
        assert_eq!(g[0], 1.0);
        assert_eq!(g[2], 2.0);
        let mut g = vec![2.0f32, 3.0];
        assert!(!unscale::<f32>(&mut g, 1.0));
        assert_eq!(g, vec![2.0, 3.0]);
        let mut g = vec![f32::NAN];
        assert!(unscale::<f32>(&mut g, 0.25));
    }

    #[test]
    fn norm_partials_of_every_kind() {
        let x = [3.0f32, -4.0, 0.0];
        for (p, want) in crate::ops::fused::tests::norm_cases() {
            let k = NormKind::of(p);
            let got = k.finish(norm_partial::<f32>(k, &x));
            assert!((got - want).abs() < 1e-12, "p={p}: {got} vs {want}");
        }
        let nan = [1.0f32, f32::NAN];
        assert!(NormKind::Inf.finish(norm_partial::<f32>(NormKind::Inf, &nan)).is_nan());
        assert!(NormKind::Two.finish(norm_partial::<f32>(NormKind::Two, &nan)).is_nan());
    }
}
