//! The named fused kernels ([`FusedKernel`]) on `cuda:N` (optimizer.cu): the optimizer steps
//! (SGD, Adam/AdamW, RMSprop, Adagrad with every flag), clipping and scaling as one elementwise
//! pass each; a vector norm's partial reduction per block in f64, combined on the host in block
//! order (the result depends on the element count and the grid, never on timing); the
//! GradScaler's inf/NaN check through a one-word device flag read back by the host.
//!
//! Why these host-side preparations: the kernels take every scalar as the CPU backend derives it
//! (`backend/cpu/fused.rs`: −lr, 1 − dampening, lerp's weight rounded to f32 and which of its two
//! formulas PyTorch picks), so the steps follow the CPU's sequence of PyTorch ops bit for bit in
//! f32 up to the device's `expf`/`sqrtf`. f16 and bf16 operands are computed through f32 copies
//! (intermediates are not rounded to the element type as on the CPU, only the stored results);
//! f64 is refused with `UnsupportedDType`, as every CUDA kernel does.
use ferrite_cuda::KernelArg;

use super::data::{copy, f32_contiguous, fill, read};
use super::elementwise::check_float;
use super::launch::{Ctx, ROW_BLOCK, n_arg, opt_ptr, ptr};
use crate::backend::{FusedKernel, NormKind};
use crate::error::{Result, TensorError};
use crate::{DType, Tensor};

/// Bits of the kernels' `flags` (the `FERRITE_OPT_*` of optimizer.cu).
const MAXIMIZE: i32 = 1;
const WEIGHT_DECAY: i32 = 2;
const NESTEROV: i32 = 4;
const FIRST_STEP: i32 = 8;
const DECOUPLED: i32 = 16;
const LERP_SMALL: i32 = 32;

/// Most blocks of a norm's partial reduction on a GPU (the host combines this many partials).
const MAX_PARTIALS: usize = 1024;

/// `bit` when `on`.
fn flag(on: bool, bit: i32) -> i32 {
    if on { bit } else { 0 }
}

/// Lerp's weight `1 − beta` as f32, `1 − w` and whether PyTorch takes lerp's first formula.
fn lerp_weight(beta: f64) -> (f32, f32, bool) {
    let w = (1.0 - beta) as f32;
    (w, 1.0 - w, w.abs() < 0.5)
}

pub(super) fn fused(cx: Ctx<'_>, kernel: &FusedKernel, outputs: &[&Tensor], inputs: &[&Tensor]) -> Result<f64> {
    let op = kernel.name();
    let first = outputs
        .first()
        .or(inputs.first())
        .copied()
        .ok_or_else(|| TensorError::invalid(op, "a fused kernel needs at least one tensor"))?;
    let mut all: Vec<&Tensor> = outputs.to_vec();
    all.extend(inputs);
    check_float(op, &all)?;
    let n = first.numel();
    if n == 0 {
        return Ok(kernel.empty_result());
    }
    // Outputs are updated in place: f32 ones directly, others through an f32 copy written back.
    let outs: Vec<Tensor> = outputs.iter().map(|t| f32_contiguous(cx, t)).collect::<Result<_>>()?;
    let ins: Vec<Tensor> = inputs.iter().map(|t| f32_contiguous(cx, t)).collect::<Result<_>>()?;
    let result = run(cx, kernel, n, first.dtype(), &outs, &ins)?;
    for (o, w) in outputs.iter().zip(&outs) {
        if !(o.dtype() == DType::F32 && o.is_contiguous()) {
            copy(cx, o, w)?;
        }
    }
    Ok(result)
}

/// Operand `i` of `ts`, or the op layer's count was not the kernel's.
fn at<'t>(ts: &'t [Tensor], i: usize, op: &'static str) -> Result<&'t Tensor> {
    ts.get(i).ok_or_else(|| TensorError::invalid(op, format!("internal: operand {i} of the fused kernel is missing")))
}

fn run(cx: Ctx<'_>, kernel: &FusedKernel, n: usize, dtype: DType, o: &[Tensor], i: &[Tensor]) -> Result<f64> {
    const SRC: &str = "optimizer.cu";
    let op = kernel.name();
    let no_flag = KernelArg::Ptr(0);
    match *kernel {
        FusedKernel::Sgd { lr, momentum, dampening, nesterov, weight_decay, maximize, first_step } => {
            let buf = if momentum != 0.0 { Some(at(o, 1, op)?) } else { None };
            let flags = flag(maximize, MAXIMIZE)
                | flag(weight_decay != 0.0, WEIGHT_DECAY)
                | flag(nesterov, NESTEROV)
                | flag(first_step, FIRST_STEP);
            let args = [
                n_arg(n),
                ptr(at(o, 0, op)?, op)?,
                ptr(at(i, 0, op)?, op)?,
                opt_ptr(buf, op)?,
                KernelArg::F32(-lr as f32),
                KernelArg::F32(momentum as f32),
                KernelArg::F32((1.0 - dampening) as f32),
                KernelArg::F32(weight_decay as f32),
                KernelArg::I32(flags),
                no_flag,
            ];
            cx.launch_n(op, SRC, "sgd_step_f32", n, &args)?;
            Ok(0.0)
        }
        FusedKernel::Adam { l2, decay, beta1, beta2, eps, bias_correction2_sqrt, step_size, maximize, amsgrad } => {
            let (w1, one_minus_w1, small) = lerp_weight(beta1);
            let max_sq = if amsgrad { Some(at(o, 3, op)?) } else { None };
            let flags = flag(maximize, MAXIMIZE)
                | flag(l2.is_some(), WEIGHT_DECAY)
                | flag(decay.is_some(), DECOUPLED)
                | flag(small, LERP_SMALL);
            let grad = at(i, 0, op)?;
            let args = [
                n_arg(n),
                ptr(at(o, 0, op)?, op)?,
                ptr(grad, op)?,
                ptr(at(o, 1, op)?, op)?,
                ptr(at(o, 2, op)?, op)?,
                opt_ptr(max_sq, op)?,
                KernelArg::F32(l2.unwrap_or(0.0) as f32),
                KernelArg::F32(decay.unwrap_or(1.0) as f32),
                KernelArg::F32(w1),
                KernelArg::F32(one_minus_w1),
                KernelArg::F32(beta2 as f32),
                KernelArg::F32((1.0 - beta2) as f32),
                KernelArg::F32(bias_correction2_sqrt as f32),
                KernelArg::F32(eps as f32),
                KernelArg::F32(-step_size as f32),
                KernelArg::I32(flags),
                no_flag,
            ];
            cx.launch_n(op, SRC, "adam_step_f32", n, &args)?;
            Ok(0.0)
        }
        FusedKernel::Rmsprop { lr, alpha, eps, weight_decay, momentum, centered, maximize } => {
            // Outputs: param, square_avg, then momentum_buffer (momentum > 0), then grad_avg (centered).
            let has_m = momentum > 0.0;
            let buf = if has_m { Some(at(o, 2, op)?) } else { None };
            let gavg = if centered { Some(at(o, 2 + has_m as usize, op)?) } else { None };
            let (w, one_minus_w, small) = lerp_weight(alpha);
            let flags = flag(maximize, MAXIMIZE) | flag(weight_decay != 0.0, WEIGHT_DECAY) | flag(small, LERP_SMALL);
            let args = [
                n_arg(n),
                ptr(at(o, 0, op)?, op)?,
                ptr(at(i, 0, op)?, op)?,
                ptr(at(o, 1, op)?, op)?,
                opt_ptr(buf, op)?,
                opt_ptr(gavg, op)?,
                KernelArg::F32(-lr as f32),
                KernelArg::F32(alpha as f32),
                KernelArg::F32(w),
                KernelArg::F32(one_minus_w),
                KernelArg::F32(eps as f32),
                KernelArg::F32(weight_decay as f32),
                KernelArg::F32(momentum as f32),
                KernelArg::I32(flags),
                no_flag,
            ];
            cx.launch_n(op, SRC, "rmsprop_step_f32", n, &args)?;
            Ok(0.0)
        }
        FusedKernel::Adagrad { clr, eps, weight_decay, maximize } => {
            let flags = flag(maximize, MAXIMIZE) | flag(weight_decay != 0.0, WEIGHT_DECAY);
            let args = [
                n_arg(n),
                ptr(at(o, 0, op)?, op)?,
                ptr(at(i, 0, op)?, op)?,
                ptr(at(o, 1, op)?, op)?,
                KernelArg::F32(-clr as f32),
                KernelArg::F32(eps as f32),
                KernelArg::F32(weight_decay as f32),
                KernelArg::I32(flags),
                no_flag,
            ];
            cx.launch_n(op, SRC, "adagrad_step_f32", n, &args)?;
            Ok(0.0)
        }
        FusedKernel::Unscale { inv_scale } => {
            let g = at(o, 0, op)?;
            let found = cx.scratch(g, &[1], DType::F32)?;
            fill(cx, &found, 0.0)?;
            let args = [n_arg(n), ptr(g, op)?, KernelArg::F32(inv_scale as f32), ptr(&found, op)?];
            cx.launch_n(op, SRC, "unscale_and_check_f32", n, &args)?;
            let mut bytes = [0u8; 4];
            read(cx, &found, &mut bytes)?;
            Ok(if f32::from_ne_bytes(bytes) != 0.0 { 1.0 } else { 0.0 })
        }
        FusedKernel::NormPartial { kind } => norm_partial(cx, op, n, kind, at(i, 0, op)?),
        FusedKernel::ClampAbs { clip } => {
            let args = [n_arg(n), ptr(at(o, 0, op)?, op)?, KernelArg::F32(clip as f32)];
            cx.launch_n(op, SRC, "clamp_abs_f32", n, &args)?;
            Ok(0.0)
        }
        FusedKernel::Scale { coef } => {
            // The coefficient is first rounded to the element type (a 0-dim tensor of the
            // gradient's dtype in `clip_grad_norm_`).
            let c = match dtype {
                DType::F16 => half::f16::from_f64(coef).to_f32(),
                DType::BF16 => half::bf16::from_f64(coef).to_f32(),
                _ => coef as f32,
            };
            let args = [n_arg(n), ptr(at(o, 0, op)?, op)?, KernelArg::F32(c)];
            cx.launch_n(op, SRC, "scale_f32", n, &args)?;
            Ok(0.0)
        }
    }
}

/// The kind's code in optimizer.cu (`FERRITE_NORM_*`) and its exponent.
fn norm_code(kind: NormKind) -> (i32, f64) {
    match kind {
        NormKind::Inf => (0, 0.0),
        NormKind::NegInf => (1, 0.0),
        NormKind::Zero => (2, 0.0),
        NormKind::One => (3, 0.0),
        NormKind::Two => (4, 0.0),
        NormKind::P(p) => (5, p),
    }
}

/// A norm's partial reduction of the contiguous f32 `x`: per-block partials in f64 on the
/// device, combined here in block order.
fn norm_partial(cx: Ctx<'_>, op: &'static str, n: usize, kind: NormKind, x: &Tensor) -> Result<f64> {
    let cap = if cx.rt.is_emulated() { 2 } else { MAX_PARTIALS };
    let blocks = n.div_ceil(ROW_BLOCK as usize).clamp(1, cap);
    let parts = cx.scratch(x, &[blocks], DType::F64)?;
    let (code, p) = norm_code(kind);
    let args = [
        n_arg(n),
        ptr(x, op)?,
        KernelArg::I32(code),
        KernelArg::F64(p),
        KernelArg::F64(kind.identity()),
        ptr(&parts, op)?,
    ];
    cx.launch(op, "optimizer.cu", "norm_partial_f32", blocks as u32, ROW_BLOCK, &args)?;
    let mut bytes = vec![0u8; blocks * 8];
    read(cx, &parts, &mut bytes)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|b| f64::from_ne_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
        .fold(kind.identity(), |acc, v| kind.combine(acc, v)))
}
