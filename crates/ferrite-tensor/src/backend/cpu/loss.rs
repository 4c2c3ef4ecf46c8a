//! CPU bodies of the elementwise losses ([`PointwiseLoss`]) and their gradients: one pass over
//! input, target and the optional weights, whatever their strides (a weight broadcast along the
//! batch has stride 0), writing the contiguous output.
//!
//! The formulas are PyTorch's CPU kernels' (`binary_cross_entropy_out_cpu`, `smooth_l1_kernel`,
//! `huber_kernel`, the composite `kl_div` and `binary_cross_entropy_with_logits`), in the compute
//! type of the element, so values agree with PyTorch to rounding. `binary_cross_entropy` checks
//! that inputs and targets lie in [0, 1], as PyTorch's CPU kernel does, and fails with the first
//! offending value instead of returning a loss built on NaNs.

use std::sync::atomic::{AtomicU64, Ordering};

use num_traits::Float as _;

use crate::backend::{LossGrad, LossOperands, PointwiseLoss};
use crate::element::{AccFloat, Float};
use crate::error::{Result, TensorError};
use crate::kernels::strided::{SendPtr, Walk, par_ranges};
use crate::layout::Layout;
use crate::{Tensor, dispatch_float};

/// `binary_cross_entropy`'s lower bound on each log (PyTorch's).
const LOG_FLOOR: f64 = -100.0;
/// `binary_cross_entropy`'s backward floor on `x (1 - x)` (PyTorch's `EPSILON`).
const BCE_EPSILON: f64 = 1e-12;
/// No value seen yet (a NaN payload no kernel produces).
const NONE_SEEN: u64 = u64::MAX;

pub(super) fn pointwise_loss(op: PointwiseLoss, out: &Tensor, x: LossOperands<'_>) -> Result<()> {
    dispatch_float!(out.dtype(), op.name(), T => forward::<T>(op, out, x))
}

pub(super) fn pointwise_loss_backward(
    op: PointwiseLoss,
    wrt: LossGrad,
    out: &Tensor,
    grad: &Tensor,
    x: LossOperands<'_>,
) -> Result<()> {
    dispatch_float!(out.dtype(), op.backward_name(), T => backward::<T>(op, wrt, out, grad, x))
}

/// One operand seen through the output's iteration space: base pointer and broadcast layout.
struct Operand<T> {
    ptr: SendPtr<T>,
    layout: Layout,
}

impl<T> Operand<T> {
    fn of(t: &Tensor, shape: &[usize], op: &'static str) -> Result<Operand<T>> {
        Ok(Operand { ptr: SendPtr(t.storage_base_ptr::<T>(op)?), layout: t.layout().broadcast_to(shape, op)? })
    }

    /// The constant `*one` at every position (an absent weight).
    fn constant(one: &T, shape: &[usize]) -> Operand<T> {
        let mut layout = Layout::contiguous(shape);
        layout.strides.iter_mut().for_each(|s| *s = 0);
        layout.offset = 0;
        // The pointer is only read (kernels never write through an operand).
        Operand { ptr: SendPtr(one as *const T as *mut T), layout }
    }
}

/// `out[i] = f([a0[i], …, a(N-1)[i]])` over the contiguous `out`.
fn map_n<T: Float, const N: usize>(out: &Tensor, ops: &[Operand<T>; N], f: impl Fn([T; N]) -> T + Sync) -> Result<()> {
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    let op = SendPtr(out.ptr::<T>("loss")?);
    let walk: Walk<N> = Walk::new(
        out.shape(),
        std::array::from_fn(|k| ops[k].layout.strides.as_slice()),
        std::array::from_fn(|k| ops[k].layout.offset),
    );
    let inner = walk.inner_strides();
    let ptrs: [SendPtr<T>; N] = std::array::from_fn(|k| ops[k].ptr);
    par_ranges(n, 8, |start, end| {
        let (ptrs, op) = (ptrs, op);
        walk.rows(start, end, |offs, len, lin| {
            for i in 0..len {
                // SAFETY: every operand's layout was broadcast to `out`'s shape from a layout
                // validated against its storage (or is a stride-0 view of a live local value), so
                // each offset is in bounds; `out` is a fresh contiguous buffer of `n` elements and
                // this task alone writes the range [start, end).
                unsafe {
                    let vals: [T; N] = std::array::from_fn(|k| *ptrs[k].0.add(offs[k] + i * inner[k]));
                    *op.0.add(lin + i) = f(vals);
                }
            }
        });
    });
    Ok(())
}

/// Record `v` as the first out-of-range value seen (later ones are ignored).
fn note_bad(slot: &AtomicU64, v: f64) {
    let _ = slot.compare_exchange(NONE_SEEN, v.to_bits(), Ordering::Relaxed, Ordering::Relaxed);
}

fn bce_range_error(slot: &AtomicU64, what: &str) -> Result<()> {
    match slot.load(Ordering::Relaxed) {
        NONE_SEEN => Ok(()),
        bits => Err(TensorError::invalid(
            "binary_cross_entropy",
            format!(
                "all elements of {what} should be between 0 and 1, found {}{}",
                f64::from_bits(bits),
                if what == "input" {
                    "; pass probabilities (e.g. sigmoid(logits)), or logits to binary_cross_entropy_with_logits"
                } else {
                    ""
                }
            ),
        )),
    }
}

/// `max(ln(v), -100)` as PyTorch's `std::max(std::log(v), -100)` (NaN stays NaN).
#[inline(always)]
fn clamped_log<A: AccFloat>(v: A) -> A {
    let floor = A::from_f64c(LOG_FLOOR);
    if v < floor { floor } else { v }
}

/// PyTorch's `log_sigmoid`: `min(x, 0) - ln(1 + e^-|x|)`.
#[inline(always)]
fn log_sigmoid<A: AccFloat>(x: A) -> A {
    let zero = A::from_f64c(0.0);
    (if x < zero { x } else { zero }) - (-x.abs()).exp().ln_1p()
}

/// `xlogy(t, t)`: 0 where `t` is 0, `t ln t` elsewhere (NaN for negative t).
#[inline(always)]
fn xlogx<A: AccFloat>(t: A) -> A {
    let zero = A::from_f64c(0.0);
    if t == zero { zero } else { t * t.ln() }
}

fn forward<T: Float>(op: PointwiseLoss, out: &Tensor, x: LossOperands<'_>) -> Result<()> {
    let shape = out.shape().to_vec();
    let one = T::from_f64(1.0);
    let name = op.name();
    let weight = |w: Option<&Tensor>| match w {
        Some(w) => Operand::of(w, &shape, name),
        None => Ok(Operand::constant(&one, &shape)),
    };
    let ops = [
        Operand::of(x.input, &shape, name)?,
        Operand::of(x.target, &shape, name)?,
        weight(x.weight)?,
        weight(x.pos_weight)?,
    ];
    let a = T::acc_from_f64;
    match op {
        PointwiseLoss::Bce => {
            let (bad_x, bad_t) = (AtomicU64::new(NONE_SEEN), AtomicU64::new(NONE_SEEN));
            let (zero, one) = (a(0.0), a(1.0));
            map_n::<T, 4>(out, &ops, |[xi, ti, wi, _]| {
                let (xv, tv) = (xi.to_acc(), ti.to_acc());
                if !(xv >= zero && xv <= one) {
                    note_bad(&bad_x, xi.to_f64());
                }
                if !(tv >= zero && tv <= one) {
                    note_bad(&bad_t, ti.to_f64());
                }
                let l = (tv - one) * clamped_log((-xv).ln_1p()) - tv * clamped_log(xv.ln());
                T::from_acc(T::from_acc(l).to_acc() * wi.to_acc())
            })?;
            bce_range_error(&bad_x, "input")?;
            bce_range_error(&bad_t, "target")
        }
        PointwiseLoss::BceWithLogits => {
            let has_pw = x.pos_weight.is_some();
            let one = a(1.0);
            map_n::<T, 4>(out, &ops, |[xi, ti, wi, pwi]| {
                let (xv, tv) = (xi.to_acc(), ti.to_acc());
                let ls = log_sigmoid(xv);
                let ls = if has_pw { ls * ((pwi.to_acc() - one) * tv + one) } else { ls };
                let l = (one - tv) * xv - ls;
                T::from_acc(l * wi.to_acc())
            })
        }
        PointwiseLoss::SmoothL1 { beta } => {
            let (b, half) = (a(beta), a(0.5));
            map_n::<T, 4>(out, &ops, |[xi, ti, _, _]| {
                let z = (xi.to_acc() - ti.to_acc()).abs();
                T::from_acc(if beta == 0.0 {
                    z
                } else if z < b {
                    half * z * z / b
                } else {
                    z - half * b
                })
            })
        }
        PointwiseLoss::Huber { delta } => {
            let (d, half) = (a(delta), a(0.5));
            map_n::<T, 4>(out, &ops, |[xi, ti, _, _]| {
                let z = (xi.to_acc() - ti.to_acc()).abs();
                T::from_acc(if z < d { half * z * z } else { d * (z - half * d) })
            })
        }
        PointwiseLoss::KlDiv { log_target } => map_n::<T, 4>(out, &ops, |[xi, ti, _, _]| {
            let (xv, tv) = (xi.to_acc(), ti.to_acc());
            T::from_acc(if log_target {
                tv.exp() * (tv - xv)
            } else {
                T::from_acc(xlogx(tv)).to_acc() - T::from_acc(tv * xv).to_acc()
            })
        }),
    }
}

fn backward<T: Float>(
    op: PointwiseLoss,
    wrt: LossGrad,
    out: &Tensor,
    grad: &Tensor,
    x: LossOperands<'_>,
) -> Result<()> {
    let shape = out.shape().to_vec();
    let one_t = T::from_f64(1.0);
    let name = op.backward_name();
    let weight = |w: Option<&Tensor>| match w {
        Some(w) => Operand::of(w, &shape, name),
        None => Ok(Operand::constant(&one_t, &shape)),
    };
    let ops = [
        Operand::of(grad, &shape, name)?,
        Operand::of(x.input, &shape, name)?,
        Operand::of(x.target, &shape, name)?,
        weight(x.weight)?,
        weight(x.pos_weight)?,
    ];
    let a = T::acc_from_f64;
    let (zero, one) = (a(0.0), a(1.0));
    let target = wrt == LossGrad::Target;
    match op {
        PointwiseLoss::Bce => {
            let eps = a(BCE_EPSILON);
            map_n::<T, 5>(out, &ops, |[gi, xi, ti, wi, _]| {
                let (g, xv, tv) = (gi.to_acc(), xi.to_acc(), ti.to_acc());
                let d = if target {
                    g * (clamped_log((-xv).ln_1p()) - clamped_log(xv.ln()))
                } else {
                    g * (xv - tv) / ((one - xv) * xv).max(eps)
                };
                T::from_acc(T::from_acc(d).to_acc() * wi.to_acc())
            })
        }
        PointwiseLoss::BceWithLogits => {
            let has_pw = x.pos_weight.is_some();
            map_n::<T, 5>(out, &ops, |[gi, xi, ti, wi, pwi]| {
                let (g, xv, tv) = (gi.to_acc(), xi.to_acc(), ti.to_acc());
                let pw = if has_pw { pwi.to_acc() } else { one };
                let d = if target {
                    -xv - (pw - one) * log_sigmoid(xv)
                } else {
                    // ∂logsigmoid(x)/∂x = sigmoid(-x).
                    (one - tv) - ((pw - one) * tv + one) * (-xv).vsigmoid()
                };
                T::from_acc(g * d * wi.to_acc())
            })
        }
        PointwiseLoss::SmoothL1 { beta } => {
            let b = a(beta);
            map_n::<T, 5>(out, &ops, |[gi, xi, ti, _, _]| {
                let (g, d) = (gi.to_acc(), xi.to_acc() - ti.to_acc());
                let v = if beta == 0.0 {
                    if d > zero {
                        g
                    } else if d < zero {
                        -g
                    } else {
                        zero * g
                    }
                } else if d <= -b {
                    -g
                } else if d >= b {
                    g
                } else {
                    d * g / b
                };
                T::from_acc(if target { -v } else { v })
            })
        }
        PointwiseLoss::Huber { delta } => {
            let dl = a(delta);
            map_n::<T, 5>(out, &ops, |[gi, xi, ti, _, _]| {
                let (g, d) = (gi.to_acc(), xi.to_acc() - ti.to_acc());
                let v = if d <= -dl {
                    -g * dl
                } else if d >= dl {
                    g * dl
                } else {
                    d * g
                };
                T::from_acc(if target { -v } else { v })
            })
        }
        PointwiseLoss::KlDiv { log_target } => map_n::<T, 5>(out, &ops, |[gi, xi, ti, _, _]| {
            let (g, xv, tv) = (gi.to_acc(), xi.to_acc(), ti.to_acc());
            // xlogy(t, t)'s derivative in its first argument is t / t, as PyTorch computes it:
            // 1, and NaN where t == 0.
            #[allow(clippy::eq_op)]
            let t_over_t = tv / tv;
            T::from_acc(match (log_target, target) {
                (true, false) => -(g * tv.exp()),
                (false, false) => -(g * tv),
                (true, true) => g * tv.exp() * (tv - xv + one),
                // xlogy(t, t)'s two partial derivatives (ln t where t != 0, and t / t), minus x.
                (false, true) => g * ((if tv == zero { zero } else { tv.ln() }) + t_over_t - xv),
            })
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    fn t(v: &[f32], shape: &[usize]) -> Tensor {
        Tensor::from_slice(v, shape, &Device::Cpu).unwrap()
    }

    fn run(op: PointwiseLoss, x: &Tensor, y: &Tensor, w: Option<&Tensor>, pw: Option<&Tensor>) -> Result<Vec<f32>> {
        let out = Tensor::zeros(x.shape(), x.dtype(), &Device::Cpu).unwrap();
        pointwise_loss(op, &out, LossOperands { input: x, target: y, weight: w, pos_weight: pw })?;
        Ok(out.to_vec::<f32>().unwrap())
    }

    #[test]
    fn bce_clamps_logs_and_rejects_out_of_range_values() {
        let x = t(&[0.0, 1.0, 0.25], &[3]);
        let y = t(&[1.0, 0.0, 1.0], &[3]);
        let got = run(PointwiseLoss::Bce, &x, &y, None, None).unwrap();
        assert_eq!(&got[..2], &[100.0, 100.0], "each log is floored at -100");
        assert!((got[2] as f64 - -(0.25f64.ln())).abs() < 1e-6);
        let e = run(PointwiseLoss::Bce, &t(&[0.5, 1.5], &[2]), &t(&[0.0, 1.0], &[2]), None, None).unwrap_err();
        assert!(e.to_string().contains("input should be between 0 and 1, found 1.5"), "{e}");
        let e = run(PointwiseLoss::Bce, &t(&[0.5], &[1]), &t(&[-2.0], &[1]), None, None).unwrap_err();
        assert!(e.to_string().contains("target should be between 0 and 1, found -2"), "{e}");
    }

    #[test]
    fn broadcast_weights_and_strided_operands() {
        // Weight [3] along the last dim of [2, 3]; the input is a transposed view.
        let xt = t(&[0.1, 0.4, 0.2, 0.5, 0.3, 0.6], &[3, 2]);
        let x = xt.t().unwrap();
        let y = t(&[1.0, 0.0, 1.0, 0.0, 1.0, 0.0], &[2, 3]);
        let w = t(&[1.0, 2.0, 3.0], &[3]);
        let got = run(PointwiseLoss::Bce, &x, &y, Some(&w), None).unwrap();
        let xs = [0.1f64, 0.2, 0.3, 0.4, 0.5, 0.6];
        let ys = [1.0f64, 0.0, 1.0, 0.0, 1.0, 0.0];
        for i in 0..6 {
            let want = -(ys[i] * xs[i].ln() + (1.0 - ys[i]) * (1.0 - xs[i]).ln()) * (1 + i % 3) as f64;
            assert!((got[i] as f64 - want).abs() < 1e-5, "element {i}: {} vs {want}", got[i]);
        }
    }

    #[test]
    fn logits_form_is_stable_for_large_logits() {
        let x = t(&[200.0, -200.0, 0.0], &[3]);
        let y = t(&[0.0, 1.0, 1.0], &[3]);
        let got = run(PointwiseLoss::BceWithLogits, &x, &y, None, None).unwrap();
        assert_eq!(&got[..2], &[200.0, 200.0]);
        assert!((got[2] as f64 - 2f64.ln()).abs() < 1e-6);
        // pos_weight 3 on a positive target triples the loss.
        let pw = t(&[3.0], &[1]);
        let got_pw = run(PointwiseLoss::BceWithLogits, &x, &y, None, Some(&pw)).unwrap();
        assert!((got_pw[2] as f64 - 3.0 * 2f64.ln()).abs() < 1e-6);
        assert_eq!(got_pw[0], 200.0, "negative targets are not reweighted");
    }

    #[test]
    fn smooth_l1_with_zero_beta_is_l1_and_its_gradient_is_sign() {
        let x = t(&[1.0, -2.0, 0.5], &[3]);
        let y = t(&[0.0, 0.0, 0.5], &[3]);
        assert_eq!(run(PointwiseLoss::SmoothL1 { beta: 0.0 }, &x, &y, None, None).unwrap(), vec![1.0, 2.0, 0.0]);
        let g = t(&[1.0], &[1]);
        let out = Tensor::zeros(&[3], crate::DType::F32, &Device::Cpu).unwrap();
        let ops = LossOperands { input: &x, target: &y, weight: None, pos_weight: None };
        pointwise_loss_backward(PointwiseLoss::SmoothL1 { beta: 0.0 }, LossGrad::Input, &out, &g, ops).unwrap();
        assert_eq!(out.to_vec::<f32>().unwrap(), vec![1.0, -1.0, 0.0]);
        pointwise_loss_backward(PointwiseLoss::Huber { delta: 1.5 }, LossGrad::Target, &out, &g, ops).unwrap();
        assert_eq!(out.to_vec::<f32>().unwrap(), vec![-1.0, 1.5, -0.0]);
    }
}
