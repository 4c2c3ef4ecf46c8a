//! Convolution's data movement and 2-D pooling on `cuda:N` (conv.cu, pool.cu): im2col/col2im one
//! image per launch (the kernels take one `[C, H, W]` image), pooling over all `[P, H, W]`
//! planes at once. f32 compute, f16/bf16 through f32.
use ferrite_cuda::KernelArg;
use ferrite_cuda::records::ConvGeometry as ConvRecord;

use super::data::{f32_contiguous, fill};
use super::elementwise::{check_float, into_f32_out};
use super::launch::{Ctx, addr, ptr};
use crate::Tensor;
use crate::backend::{ConvGeometry, Pool2d, PoolKind};
use crate::error::Result;

/// `Pool2d` of pool.cu.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct PoolRecord {
    planes: i64,
    h: i64,
    w: i64,
    out_h: i64,
    out_w: i64,
    kh: i32,
    kw: i32,
    sh: i32,
    sw: i32,
    ph: i32,
    pw: i32,
    dh: i32,
    dw: i32,
    count_include_pad: i32,
    divisor_override: i32,
}

fn conv_record(g: &ConvGeometry) -> ConvRecord {
    ConvRecord {
        channels: g.channels as i64,
        h: g.input[0] as i64,
        w: g.input[1] as i64,
        out_h: g.output[0] as i64,
        out_w: g.output[1] as i64,
        kh: g.kernel[0] as i32,
        kw: g.kernel[1] as i32,
        sh: g.stride[0] as i32,
        sw: g.stride[1] as i32,
        ph: g.padding[0] as i32,
        pw: g.padding[1] as i32,
        dh: g.dilation[0] as i32,
        dw: g.dilation[1] as i32,
    }
}

fn pool_record(planes: usize, p: &Pool2d) -> PoolRecord {
    let mut r = PoolRecord {
        planes: planes as i64,
        h: p.input[0] as i64,
        w: p.input[1] as i64,
        out_h: p.output[0] as i64,
        out_w: p.output[1] as i64,
        kh: 1,
        kw: 1,
        sh: 1,
        sw: 1,
        ph: 0,
        pw: 0,
        dh: 1,
        dw: 1,
        count_include_pad: 0,
        divisor_override: 0,
    };
    match p.kind {
        PoolKind::Max { kernel, stride, padding, dilation } => {
            (r.kh, r.kw, r.sh, r.sw) = (kernel[0] as i32, kernel[1] as i32, stride[0] as i32, stride[1] as i32);
            (r.ph, r.pw, r.dh, r.dw) = (padding[0] as i32, padding[1] as i32, dilation[0] as i32, dilation[1] as i32);
        }
        PoolKind::Avg { kernel, stride, padding, count_include_pad, divisor_override } => {
            (r.kh, r.kw, r.sh, r.sw) = (kernel[0] as i32, kernel[1] as i32, stride[0] as i32, stride[1] as i32);
            (r.ph, r.pw) = (padding[0] as i32, padding[1] as i32);
            r.count_include_pad = count_include_pad as i32;
            r.divisor_override = divisor_override.unwrap_or(0) as i32;
        }
        PoolKind::AdaptiveAvg => {}
    }
    r
}

/// Runs `kernel` (`g, from, to`) once per image: `from` and `to` advance by their image sizes.
#[allow(clippy::too_many_arguments)]
fn per_image(
    cx: Ctx<'_>,
    op: &'static str,
    kernel: &str,
    g: &ConvGeometry,
    images: usize,
    from: &Tensor,
    from_each: usize,
    to: &Tensor,
    to_each: usize,
    work: usize,
) -> Result<()> {
    let (f, t) = (addr(from, op)?, addr(to, op)?);
    for i in 0..images {
        let args = [
            KernelArg::record(&conv_record(g)),
            KernelArg::Ptr(f + (i * from_each * 4) as u64),
            KernelArg::Ptr(t + (i * to_each * 4) as u64),
        ];
        cx.launch_n(op, "conv.cu", kernel, work, &args)?;
    }
    Ok(())
}

pub(super) fn im2col(cx: Ctx<'_>, cols: &Tensor, x: &Tensor, g: &ConvGeometry) -> Result<()> {
    check_float("im2col", &[cols, x])?;
    let x = f32_contiguous(cx, x)?;
    let images = x.shape().first().copied().unwrap_or(1);
    let (img, col) = (g.channels * g.pixels(), g.rows() * g.windows());
    into_f32_out(cx, cols, |c| per_image(cx, "im2col", "im2col_f32", g, images, &x, img, c, col, col))
}

pub(super) fn col2im(cx: Ctx<'_>, x: &Tensor, cols: &Tensor, g: &ConvGeometry) -> Result<()> {
    check_float("col2im", &[x, cols])?;
    let cols = f32_contiguous(cx, cols)?;
    let images = x.shape().first().copied().unwrap_or(1);
    let (img, col) = (g.channels * g.pixels(), g.rows() * g.windows());
    into_f32_out(cx, x, |o| per_image(cx, "col2im", "col2im_f32", g, images, &cols, col, o, img, img))
}

/// The planes of a `[P, H, W]` operand.
fn planes(t: &Tensor) -> usize {
    let r = t.rank();
    if r < 2 { 1 } else { t.shape()[..r - 2].iter().product() }
}

pub(super) fn max_pool2d(cx: Ctx<'_>, out: &Tensor, indices: &Tensor, x: &Tensor, p: &Pool2d) -> Result<()> {
    const OP: &str = "max_pool2d";
    check_float(OP, &[out, x])?;
    let x = f32_contiguous(cx, x)?;
    let rec = pool_record(planes(&x), p);
    into_f32_out(cx, out, |o| {
        let args = [KernelArg::record(&rec), ptr(&x, OP)?, ptr(o, OP)?, ptr(indices, OP)?];
        cx.launch_n(OP, "pool.cu", "max_pool2d_f32", o.numel(), &args)
    })
}

pub(super) fn max_pool2d_backward(
    cx: Ctx<'_>,
    grad_input: &Tensor,
    grad_output: &Tensor,
    indices: &Tensor,
    p: &Pool2d,
) -> Result<()> {
    const OP: &str = "max_pool2d_backward";
    check_float(OP, &[grad_input, grad_output])?;
    let dy = f32_contiguous(cx, grad_output)?;
    let rec = pool_record(planes(grad_input), p);
    into_f32_out(cx, grad_input, |dx| {
        fill(cx, dx, 0.0)?;
        let args = [KernelArg::record(&rec), ptr(indices, OP)?, ptr(&dy, OP)?, ptr(dx, OP)?];
        cx.launch_n(OP, "pool.cu", "max_pool2d_backward_f32", rec.planes as usize, &args)
    })
}

pub(super) fn avg_pool2d(cx: Ctx<'_>, out: &Tensor, x: &Tensor, p: &Pool2d) -> Result<()> {
    const OP: &str = "avg_pool2d";
    check_float(OP, &[out, x])?;
    let x = f32_contiguous(cx, x)?;
    let rec = pool_record(planes(&x), p);
    let kernel = if matches!(p.kind, PoolKind::AdaptiveAvg) { "adaptive_avg_pool2d_f32" } else { "avg_pool2d_f32" };
    into_f32_out(cx, out, |o| {
        let args = [KernelArg::record(&rec), ptr(&x, OP)?, ptr(o, OP)?];
        cx.launch_n(OP, "pool.cu", kernel, o.numel(), &args)
    })
}

pub(super) fn avg_pool2d_backward(cx: Ctx<'_>, grad_input: &Tensor, grad_output: &Tensor, p: &Pool2d) -> Result<()> {
    const OP: &str = "avg_pool2d_backward";
    check_float(OP, &[grad_input, grad_output])?;
    let dy = f32_contiguous(cx, grad_output)?;
    let rec = pool_record(planes(grad_input), p);
    let kernel = if matches!(p.kind, PoolKind::AdaptiveAvg) {
        "adaptive_avg_pool2d_backward_f32"
    } else {
        "avg_pool2d_backward_f32"
    };
    into_f32_out(cx, grad_input, |dx| {
        fill(cx, dx, 0.0)?;
        let args = [KernelArg::record(&rec), ptr(&dy, OP)?, ptr(dx, OP)?];
        cx.launch_n(OP, "pool.cu", kernel, rec.planes as usize, &args)
    })
}
