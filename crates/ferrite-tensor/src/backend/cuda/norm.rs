//! RMS norm, layer norm's fused backward, batch norm and group norm on `cuda:N` (layer_norm.cu,
//! batch_norm.cu; group norm is layer norm on `[N·G, C/G·S]` rows plus a per-channel affine): one block per row for
//! the row passes, one thread per column (rows in order) for the parameter gradients, so results
//! do not depend on timing. f32 compute, f16/bf16 through f32; statistics are f32.
use ferrite_cuda::KernelArg;

use super::data::{copy, f32_contiguous};
use super::elementwise::{check_float, into_f32_out};
use super::launch::{Ctx, n_arg, opt_ptr, ptr};
use crate::DType;
use crate::Tensor;
use crate::backend::{
    BatchNormArgs, BatchNormBackwardArgs, BatchNormStats, GroupNormArgs, GroupNormBackwardArgs, GroupNormParams,
    LayerNormBackwardArgs, LayerNormGrads, NormArgs, NormBackwardArgs, RmsNormArgs, RmsNormBackwardArgs, ncs,
    rows_cols,
};
use crate::error::Result;

pub(super) fn rms_norm(cx: Ctx<'_>, args: &RmsNormArgs<'_>) -> Result<()> {
    const OP: &str = "rms_norm";
    let RmsNormArgs { y, rstd, x, weight, eps } = *args;
    let mut ts = vec![y, rstd, x];
    ts.extend(weight);
    check_float(OP, &ts)?;
    let (rows, cols) = rows_cols(x);
    let xs = f32_contiguous(cx, x)?;
    let w = weight.map(|w| f32_contiguous(cx, w)).transpose()?;
    into_f32_out(cx, rstd, |r| {
        into_f32_out(cx, y, |o| {
            let a = [
                n_arg(rows),
                n_arg(cols),
                KernelArg::F32(eps as f32),
                ptr(&xs, OP)?,
                opt_ptr(w.as_ref(), OP)?,
                ptr(o, OP)?,
                ptr(r, OP)?,
            ];
            cx.launch_rows(OP, "layer_norm.cu", "rms_norm_f32", rows, &a)
        })
    })
}

pub(super) fn rms_norm_backward(cx: Ctx<'_>, args: &RmsNormBackwardArgs<'_>) -> Result<()> {
    const OP: &str = "rms_norm_backward";
    let RmsNormBackwardArgs { grad_input, grad_weight, grad_output, x, rstd, weight } = *args;
    let mut ts = vec![grad_output, x, rstd];
    ts.extend(weight);
    ts.extend(grad_input);
    ts.extend(grad_weight);
    check_float(OP, &ts)?;
    let (rows, cols) = rows_cols(x);
    let (xs, dy, rs) = (f32_contiguous(cx, x)?, f32_contiguous(cx, grad_output)?, f32_contiguous(cx, rstd)?);
    let w = weight.map(|w| f32_contiguous(cx, w)).transpose()?;
    if let Some(gi) = grad_input {
        into_f32_out(cx, gi, |dx| {
            let a = [
                n_arg(rows),
                n_arg(cols),
                ptr(&xs, OP)?,
                opt_ptr(w.as_ref(), OP)?,
                ptr(&rs, OP)?,
                ptr(&dy, OP)?,
                ptr(dx, OP)?,
            ];
            cx.launch_rows(OP, "layer_norm.cu", "rms_norm_backward_input_f32", rows, &a)
        })?;
    }
    if let Some(gw) = grad_weight {
        into_f32_out(cx, gw, |dw| {
            let a = [n_arg(rows), n_arg(cols), ptr(&xs, OP)?, ptr(&rs, OP)?, ptr(&dy, OP)?, ptr(dw, OP)?];
            cx.launch_n(OP, "layer_norm.cu", "rms_norm_backward_weight_f32", cols, &a)
        })?;
    }
    Ok(())
}

/// Layer norm's gradients in the fused kernels; `None` (the caller composes them) for inputs the
/// kernels do not take (f64, or statistics that are not f32).
pub(super) fn layer_norm_backward(cx: Ctx<'_>, args: &LayerNormBackwardArgs<'_>) -> Result<Option<LayerNormGrads>> {
    const OP: &str = "layer_norm_backward";
    let LayerNormBackwardArgs { grad_output, x, mean, rstd, weight, need } = *args;
    let mut ts = vec![grad_output, x];
    ts.extend(weight);
    if check_float(OP, &ts).is_err() || mean.dtype() != DType::F32 || rstd.dtype() != DType::F32 {
        return Ok(None);
    }
    let grads = args.outputs()?;
    let (rows, cols) = rows_cols(x);
    let (xs, dy) = (f32_contiguous(cx, x)?, f32_contiguous(cx, grad_output)?);
    let (m, r) = (f32_contiguous(cx, mean)?, f32_contiguous(cx, rstd)?);
    let w = weight.map(|w| f32_contiguous(cx, w)).transpose()?;
    if let Some(gi) = &grads.input {
        into_f32_out(cx, gi, |dx| {
            let a = [
                n_arg(rows),
                n_arg(cols),
                ptr(&xs, OP)?,
                opt_ptr(w.as_ref(), OP)?,
                ptr(&m, OP)?,
                ptr(&r, OP)?,
                ptr(&dy, OP)?,
                ptr(dx, OP)?,
            ];
            cx.launch_rows(OP, "layer_norm.cu", "layer_norm_backward_input_f32", rows, &a)
        })?;
    }
    if need[1] || need[2] {
        let dw = cx.scratch(x, &[cols], DType::F32)?;
        let db = cx.scratch(x, &[cols], DType::F32)?;
        let a = [
            n_arg(rows),
            n_arg(cols),
            ptr(&xs, OP)?,
            ptr(&m, OP)?,
            ptr(&r, OP)?,
            ptr(&dy, OP)?,
            ptr(&dw, OP)?,
            ptr(&db, OP)?,
        ];
        cx.launch_n(OP, "layer_norm.cu", "layer_norm_backward_affine_f32", cols, &a)?;
        if let Some(gw) = &grads.weight {
            copy(cx, gw, &dw)?;
        }
        if let Some(gb) = &grads.bias {
            copy(cx, gb, &db)?;
        }
    }
    Ok(Some(grads))
}

/// `t` as a contiguous f32 tensor updated in place by `f`, written back when it had to be
/// converted (running statistics may be any floating dtype).
fn updated_f32(cx: Ctx<'_>, t: Option<&Tensor>, f: impl FnOnce(Option<&Tensor>) -> Result<()>) -> Result<()> {
    match t {
        None => f(None),
        Some(t) if t.dtype() == DType::F32 && t.is_contiguous() => f(Some(t)),
        Some(t) => {
            let c = f32_contiguous(cx, t)?;
            f(Some(&c))?;
            copy(cx, t, &c)
        }
    }
}

pub(super) fn batch_norm(cx: Ctx<'_>, args: &BatchNormArgs<'_>) -> Result<()> {
    const OP: &str = "batch_norm";
    let NormArgs { y, x, mean, rstd, weight, bias, params } = *args;
    let mut ts = vec![y, x, mean, rstd];
    ts.extend(weight);
    ts.extend(bias);
    check_float(OP, &ts)?;
    let (n, c, l) = ncs(x);
    let xs = f32_contiguous(cx, x)?;
    let w = weight.map(|w| f32_contiguous(cx, w)).transpose()?;
    let b = bias.map(|b| f32_contiguous(cx, b)).transpose()?;
    let apply = |m: &Tensor, r: &Tensor| {
        into_f32_out(cx, y, |o| {
            let a = [
                n_arg(n),
                n_arg(c),
                n_arg(l),
                ptr(&xs, OP)?,
                ptr(m, OP)?,
                ptr(r, OP)?,
                opt_ptr(w.as_ref(), OP)?,
                opt_ptr(b.as_ref(), OP)?,
                ptr(o, OP)?,
            ];
            cx.launch_n(OP, "batch_norm.cu", "batch_norm_apply_f32", n * c * l, &a)
        })
    };
    match params {
        BatchNormStats::Given => {
            let (m, r) = (f32_contiguous(cx, mean)?, f32_contiguous(cx, rstd)?);
            apply(&m, &r)
        }
        BatchNormStats::Batch { eps, running } => {
            let factor = running.map_or(0.0, |r| r.factor);
            into_f32_out(cx, mean, |m| {
                into_f32_out(cx, rstd, |r| {
                    updated_f32(cx, running.map(|s| s.mean), |rm| {
                        updated_f32(cx, running.map(|s| s.var), |rv| {
                            let a = [
                                n_arg(n),
                                n_arg(c),
                                n_arg(l),
                                ptr(&xs, OP)?,
                                KernelArg::F32(eps as f32),
                                KernelArg::F32(factor as f32),
                                ptr(m, OP)?,
                                ptr(r, OP)?,
                                opt_ptr(rm, OP)?,
                                opt_ptr(rv, OP)?,
                            ];
                            cx.launch_rows(OP, "batch_norm.cu", "batch_norm_stats_f32", c, &a)
                        })
                    })?;
                    apply(m, r)
                })
            })
        }
    }
}

pub(super) fn batch_norm_backward(cx: Ctx<'_>, args: &BatchNormBackwardArgs<'_>) -> Result<()> {
    const OP: &str = "batch_norm_backward";
    let NormBackwardArgs { grad_input, grad_weight, grad_bias, grad_output, x, mean, rstd, weight, params } = *args;
    let mut ts = vec![grad_output, x, mean, rstd];
    ts.extend(weight);
    check_float(OP, &ts)?;
    let (n, c, l) = ncs(x);
    let (xs, dy) = (f32_contiguous(cx, x)?, f32_contiguous(cx, grad_output)?);
    let (m, r) = (f32_contiguous(cx, mean)?, f32_contiguous(cx, rstd)?);
    let w = weight.map(|w| f32_contiguous(cx, w)).transpose()?;
    let need_sums = grad_weight.is_some() || grad_bias.is_some() || (grad_input.is_some() && params.batch_stats);
    let sums = if need_sums {
        let (sd, sdx) = (cx.scratch(x, &[c], DType::F32)?, cx.scratch(x, &[c], DType::F32)?);
        let a = [
            n_arg(n),
            n_arg(c),
            n_arg(l),
            ptr(&xs, OP)?,
            ptr(&dy, OP)?,
            ptr(&m, OP)?,
            ptr(&r, OP)?,
            ptr(&sd, OP)?,
            ptr(&sdx, OP)?,
        ];
        cx.launch_rows(OP, "batch_norm.cu", "batch_norm_backward_reduce_f32", c, &a)?;
        Some((sd, sdx))
    } else {
        None
    };
    if let (Some(gw), Some((_, sdx))) = (grad_weight, &sums) {
        copy(cx, gw, sdx)?;
    }
    if let (Some(gb), Some((sd, _))) = (grad_bias, &sums) {
        copy(cx, gb, sd)?;
    }
    if let Some(gi) = grad_input {
        let (sd, sdx) = match &sums {
            Some((sd, sdx)) => (ptr(sd, OP)?, ptr(sdx, OP)?),
            None => (KernelArg::Ptr(0), KernelArg::Ptr(0)),
        };
        into_f32_out(cx, gi, |dx| {
            let a = [
                n_arg(n),
                n_arg(c),
                n_arg(l),
                KernelArg::I32(params.batch_stats as i32),
                ptr(&xs, OP)?,
                ptr(&dy, OP)?,
                ptr(&m, OP)?,
                ptr(&r, OP)?,
                opt_ptr(w.as_ref(), OP)?,
                sd,
                sdx,
                ptr(dx, OP)?,
            ];
            cx.launch_n(OP, "batch_norm.cu", "batch_norm_backward_input_f32", n * c * l, &a)
        })?;
    }
    Ok(())
}

pub(super) fn group_norm(cx: Ctx<'_>, args: &GroupNormArgs<'_>) -> Result<()> {
    const OP: &str = "group_norm";
    let NormArgs { y, x, mean, rstd, weight, bias, params: GroupNormParams { groups, eps } } = *args;
    let mut ts = vec![y, x, mean, rstd];
    ts.extend(weight);
    ts.extend(bias);
    check_float(OP, &ts)?;
    let (n, c, l) = ncs(x);
    let (rows, cols) = (n * groups, (c / groups.max(1)) * l);
    let xs = f32_contiguous(cx, x)?;
    let w = weight.map(|w| f32_contiguous(cx, w)).transpose()?;
    let b = bias.map(|b| f32_contiguous(cx, b)).transpose()?;
    into_f32_out(cx, mean, |m| {
        into_f32_out(cx, rstd, |r| {
            into_f32_out(cx, y, |o| {
                let normed = if w.is_none() && b.is_none() { o.clone() } else { cx.scratch(x, x.shape(), DType::F32)? };
                let z = KernelArg::Ptr(0);
                let a = [
                    n_arg(rows),
                    n_arg(cols),
                    KernelArg::F32(eps as f32),
                    ptr(&xs, OP)?,
                    z.clone(),
                    z,
                    ptr(&normed, OP)?,
                    ptr(m, OP)?,
                    ptr(r, OP)?,
                ];
                cx.launch_rows(OP, "layer_norm.cu", "layer_norm_f32", rows, &a)?;
                if w.is_some() || b.is_some() {
                    let a = [
                        n_arg(n),
                        n_arg(c),
                        n_arg(l),
                        ptr(&normed, OP)?,
                        opt_ptr(w.as_ref(), OP)?,
                        opt_ptr(b.as_ref(), OP)?,
                        ptr(o, OP)?,
                    ];
                    cx.launch_n(OP, "batch_norm.cu", "channel_affine_f32", n * c * l, &a)?;
                }
                Ok(())
            })
        })
    })
}

pub(super) fn group_norm_backward(cx: Ctx<'_>, args: &GroupNormBackwardArgs<'_>) -> Result<()> {
    const OP: &str = "group_norm_backward";
    let NormBackwardArgs { grad_input, grad_weight, grad_bias, grad_output, x, mean, rstd, weight, params } = *args;
    let mut ts = vec![grad_output, x, mean, rstd];
    ts.extend(weight);
    check_float(OP, &ts)?;
    let (n, c, l) = ncs(x);
    let groups = params.groups;
    let (rows, cols) = (n * groups, (c / groups.max(1)) * l);
    let (xs, dy) = (f32_contiguous(cx, x)?, f32_contiguous(cx, grad_output)?);
    let (m, r) = (f32_contiguous(cx, mean)?, f32_contiguous(cx, rstd)?);
    if let Some(gi) = grad_input {
        // dx is layer norm's input gradient on the group rows, of g = dy · weight[channel].
        let g = match weight {
            Some(w) => {
                let w = f32_contiguous(cx, w)?;
                let g = cx.scratch(x, x.shape(), DType::F32)?;
                let a = [n_arg(n), n_arg(c), n_arg(l), ptr(&dy, OP)?, ptr(&w, OP)?, KernelArg::Ptr(0), ptr(&g, OP)?];
                cx.launch_n(OP, "batch_norm.cu", "channel_affine_f32", n * c * l, &a)?;
                g
            }
            None => dy.clone(),
        };
        into_f32_out(cx, gi, |dx| {
            let a = [
                n_arg(rows),
                n_arg(cols),
                ptr(&xs, OP)?,
                KernelArg::Ptr(0),
                ptr(&m, OP)?,
                ptr(&r, OP)?,
                ptr(&g, OP)?,
                ptr(dx, OP)?,
            ];
            cx.launch_rows(OP, "layer_norm.cu", "layer_norm_backward_input_f32", rows, &a)
        })?;
    }
    if grad_weight.is_some() || grad_bias.is_some() {
        let (dw, db) = (cx.scratch(x, &[c], DType::F32)?, cx.scratch(x, &[c], DType::F32)?);
        let a = [
            n_arg(n),
            n_arg(c),
            n_arg(l),
            n_arg(groups),
            ptr(&xs, OP)?,
            ptr(&m, OP)?,
            ptr(&r, OP)?,
            ptr(&dy, OP)?,
            ptr(&dw, OP)?,
            ptr(&db, OP)?,
        ];
        cx.launch_n(OP, "batch_norm.cu", "group_norm_backward_affine_f32", c, &a)?;
        if let Some(gw) = grad_weight {
            copy(cx, gw, &dw)?;
        }
        if let Some(gb) = grad_bias {
            copy(cx, gb, &db)?;
        }
    }
    Ok(())
}
