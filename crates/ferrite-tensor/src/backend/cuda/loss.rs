//! The elementwise losses ([`PointwiseLoss`]) and their gradients on `cuda:N` (loss.cu), with the
//! CPU backend's formulas (`backend/cpu/loss.rs`) in f32. Every operand is handed to the kernel as
//! a contiguous f32 buffer of the output's shape (strided inputs and broadcast weights are
//! materialised first), so the kernel is a plain map; f16 and bf16 go through f32, f64 is refused
//! with `UnsupportedDType` as everywhere on CUDA.
//!
//! Why a device flag for `binary_cross_entropy`: the CPU refuses inputs or targets outside
//! [0, 1] with a typed error naming the first offending value, and a kernel cannot stop the run;
//! it records an offending value in a 4-word slot of the device's flag slab, which becomes the
//! CPU's error at the next synchronisation (`deferred.rs`), so the loss never stalls the host.
use ferrite_cuda::KernelArg;

use super::data::copy;
use super::deferred::Check;
use super::elementwise::{check_float, into_f32_out};
use super::launch::{Ctx, n_arg, opt_ptr, ptr};
use crate::backend::{LossGrad, LossOperands, PointwiseLoss};
use crate::error::Result;
use crate::{DType, Tensor};

/// The loss's code in loss.cu (`FERRITE_LOSS_*`) and its scalar (beta or delta).
fn code(op: PointwiseLoss) -> (i32, f32) {
    match op {
        PointwiseLoss::Bce => (0, 0.0),
        PointwiseLoss::BceWithLogits => (1, 0.0),
        PointwiseLoss::SmoothL1 { beta } => (2, beta as f32),
        PointwiseLoss::Huber { delta } => (3, delta as f32),
        PointwiseLoss::KlDiv { log_target: false } => (4, 0.0),
        PointwiseLoss::KlDiv { log_target: true } => (5, 0.0),
    }
}

/// `t` broadcast to `shape` as a contiguous f32 buffer (`t` itself when it already is one).
fn dense(cx: Ctx<'_>, t: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if t.dtype() == DType::F32 && t.is_contiguous() && t.shape() == shape {
        return Ok(t.clone());
    }
    let d = cx.scratch(t, shape, DType::F32)?;
    copy(cx, &d, t)?;
    Ok(d)
}

/// The dense optional operand (null pointer when absent).
fn dense_opt(cx: Ctx<'_>, t: Option<&Tensor>, shape: &[usize]) -> Result<Option<Tensor>> {
    t.map(|t| dense(cx, t, shape)).transpose()
}

/// Error unless every tensor is f32, f16 or bf16.
fn check(op: &'static str, out: &Tensor, grad: Option<&Tensor>, x: &LossOperands<'_>) -> Result<()> {
    let mut ts = vec![out, x.input, x.target];
    ts.extend(grad);
    ts.extend(x.weight);
    ts.extend(x.pos_weight);
    check_float(op, &ts)
}

pub(super) fn pointwise_loss(cx: Ctx<'_>, op: PointwiseLoss, out: &Tensor, x: LossOperands<'_>) -> Result<()> {
    let name = op.name();
    check(name, out, None, &x)?;
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    let shape = out.shape();
    let (input, target) = (dense(cx, x.input, shape)?, dense(cx, x.target, shape)?);
    let (weight, pos_weight) = (dense_opt(cx, x.weight, shape)?, dense_opt(cx, x.pos_weight, shape)?);
    let (kind, k) = code(op);
    let launch = |bad: KernelArg| {
        into_f32_out(cx, out, |o| {
            let args = [
                n_arg(n),
                KernelArg::I32(kind),
                KernelArg::F32(k),
                ptr(&input, name)?,
                ptr(&target, name)?,
                opt_ptr(weight.as_ref(), name)?,
                opt_ptr(pos_weight.as_ref(), name)?,
                ptr(o, name)?,
                bad,
            ];
            cx.launch_n(name, "loss.cu", "pointwise_loss_f32", n, &args)
        })
    };
    // The range flag only for binary_cross_entropy (the other losses never write it).
    if op == PointwiseLoss::Bce {
        cx.flagged(out, name, Check::BceRange, |slot| launch(KernelArg::Ptr(slot)))
    } else {
        launch(KernelArg::Ptr(0))
    }
}

pub(super) fn pointwise_loss_backward(
    cx: Ctx<'_>,
    op: PointwiseLoss,
    wrt: LossGrad,
    out: &Tensor,
    grad: &Tensor,
    x: LossOperands<'_>,
) -> Result<()> {
    let name = op.backward_name();
    check(name, out, Some(grad), &x)?;
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    let shape = out.shape();
    let g = dense(cx, grad, shape)?;
    let (input, target) = (dense(cx, x.input, shape)?, dense(cx, x.target, shape)?);
    let (weight, pos_weight) = (dense_opt(cx, x.weight, shape)?, dense_opt(cx, x.pos_weight, shape)?);
    let (kind, k) = code(op);
    into_f32_out(cx, out, |o| {
        let args = [
            n_arg(n),
            KernelArg::I32(kind),
            KernelArg::I32((wrt == LossGrad::Target) as i32),
            KernelArg::F32(k),
            ptr(&g, name)?,
            ptr(&input, name)?,
            ptr(&target, name)?,
            opt_ptr(weight.as_ref(), name)?,
            opt_ptr(pos_weight.as_ref(), name)?,
            ptr(o, name)?,
        ];
        cx.launch_n(name, "loss.cu", "pointwise_loss_backward_f32", n, &args)
    })
}
