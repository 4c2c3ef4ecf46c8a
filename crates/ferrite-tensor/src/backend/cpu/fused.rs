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
//! This file validates nothing and computes nothing itself: it splits the operands into chunks
//! and dispatches each [`FusedKernel`] to its body, one file per optimizer (`fused/sgd.rs`,
//! `adam.rs`, `rmsprop.rs`, `adagrad.rs`) plus `gradients.rs` (unscale, norms, clipping) and the
//! shared rounding helpers (`rounding.rs`).
//!
//! Work is split into fixed chunks of [`FUSED_CHUNK`] elements (never derived from the thread
//! count), and per-chunk results combine in chunk order, so results are reproducible bit for bit.

use rayon::prelude::*;
use smallvec::SmallVec;

use crate::backend::{FUSED_CHUNK, FusedKernel};
use crate::element::Float;
use crate::error::Result;
use crate::kernels::simd::vectorize;
use crate::{Tensor, dispatch_float};

mod adagrad;
mod adam;
mod gradients;
mod rmsprop;
mod rounding;
mod sgd;

#[cfg(test)]
use crate::backend::NormKind;
use adagrad::{AdagradScalars, adagrad};
use adam::{AdamScalars, adam, adam_amsgrad};
#[cfg(test)]
use adam::{adam_apply, adam_moments};
use gradients::{clamp_abs, norm_partial, scale, unscale};
use rmsprop::{RmspropScalars, rmsprop_centered, rmsprop_centered_momentum, rmsprop_momentum, rmsprop_plain};
#[cfg(test)]
use rounding::lerp;
use sgd::{SgdScalars, sgd_momentum, sgd_plain};

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
        for (p, want) in crate::backend::fused_kernel::tests::norm_cases() {
            let k = NormKind::of(p);
            let got = k.finish(norm_partial::<f32>(k, &x));
            assert!((got - want).abs() < 1e-12, "p={p}: {got} vs {want}");
        }
        let nan = [1.0f32, f32::NAN];
        assert!(NormKind::Inf.finish(norm_partial::<f32>(NormKind::Inf, &nan)).is_nan());
        assert!(NormKind::Two.finish(norm_partial::<f32>(NormKind::Two, &nan)).is_nan());
    }
}
