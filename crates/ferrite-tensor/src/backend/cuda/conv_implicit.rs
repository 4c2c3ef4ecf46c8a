//! Convolution on `cuda:N` as implicit GEMM (conv_implicit.cu): the three convolution products
//! of the [`KernelBackend`](crate::backend::KernelBackend) seam computed without ever storing the
//! unfolded image — each product's only device memory is its result (plus, for a weight gradient
//! whose depth is split across blocks, `splits` partial results of the weight's size, summed in a
//! fixed order). The unfold + GEMM default would allocate up to
//! [`UNFOLD_BUDGET`](crate::backend::UNFOLD_BUDGET) of unfolded chunks per product and write and
//! read them through device memory.
//!
//! f32 compute; f16/bf16 operands (which the op layer widens before calling, so only a direct
//! caller sends them) through f32 copies, as elsewhere in this backend. A product whose per-image
//! extents do not fit the kernels' 32-bit index arithmetic takes the unfold + GEMM default.
use ferrite_cuda::KernelArg;
use ferrite_cuda::records::ConvGemm;

use super::data::f32_contiguous;
use super::elementwise::{check_float, into_f32_out};
use super::launch::{Ctx, n_arg, ptr};
use crate::Tensor;
use crate::backend::{ConvGeometry, conv_products};
use crate::error::Result;

const SOURCE: &str = "conv_implicit.cu";
/// Threads per block (`CI_THREADS`); one block computes a 64 × 64 output tile (`CI_TILE`).
const THREADS: u32 = 256;
const TILE: usize = 64;
/// Blocks the weight gradient aims for before splitting its depth (a few per SM of an H100).
const TARGET_BLOCKS: usize = 512;
/// Least depth one split of the weight gradient walks, so the partial results stay small next
/// to the work.
const MIN_SPLIT_DEPTH: usize = 512;
/// Most splits of the weight gradient (bounds the partial-result scratch at this many weights).
const MAX_SPLITS: usize = 16;

/// The record, or `None` when an extent the kernels index with `int` does not fit: any of the
/// geometry's numbers, or one image's elements (`channels·h·w`), one sample's `y`
/// (`groups·m·oh·ow`), the weight (`groups·m·K`), or their sums with a tile's overhang.
fn record(g: &ConvGeometry, groups: usize, m: usize, images: usize, splits: usize) -> Option<ConvGemm> {
    let fits = |v: usize| v.checked_add(2 * TILE).is_some_and(|v| i32::try_from(v).is_ok());
    let taps = g.kernel[0].checked_mul(g.kernel[1])?;
    let per_image = g.channels.checked_mul(g.pixels())?;
    let per_y = groups.checked_mul(m)?.checked_mul(g.windows())?;
    let weight = groups.checked_mul(m)?.checked_mul(g.rows() / groups.max(1))?;
    let depth = m.checked_mul(taps)?;
    // Window starts (index·stride − padding), tap offsets and their sums stay within int as well:
    // each term below a quarter of its range.
    let quarter = |v: usize| v <= i32::MAX as usize / 4;
    let reach = [
        g.output[0].checked_mul(g.stride[0])?,
        g.output[1].checked_mul(g.stride[1])?,
        g.kernel[0].checked_mul(g.dilation[0])?,
        g.kernel[1].checked_mul(g.dilation[1])?,
        g.input[0].checked_add(g.padding[0])?,
        g.input[1].checked_add(g.padding[1])?,
    ];
    let all = [per_image, per_y, weight, depth, images, splits, g.rows(), g.pixels(), g.windows()];
    if !all.iter().all(|&v| fits(v)) || !reach.iter().all(|&v| quarter(v)) {
        return None;
    }
    let i = |v: usize| v as i32;
    Some(ConvGemm {
        channels: i(g.channels),
        h: i(g.input[0]),
        w: i(g.input[1]),
        out_h: i(g.output[0]),
        out_w: i(g.output[1]),
        kh: i(g.kernel[0]),
        kw: i(g.kernel[1]),
        sh: i(g.stride[0]),
        sw: i(g.stride[1]),
        ph: i(g.padding[0]),
        pw: i(g.padding[1]),
        dh: i(g.dilation[0]),
        dw: i(g.dilation[1]),
        groups: i(groups),
        m: i(m),
        images: i(images),
        splits: i(splits),
    })
}

/// Launches a tile kernel over `tiles` 64 × 64 output tiles (grid-stride over them; two blocks
/// on the emulator, where each thread is an OS thread).
fn launch_tiles(cx: Ctx<'_>, op: &'static str, kernel: &str, tiles: usize, args: &[KernelArg]) -> Result<()> {
    if tiles == 0 {
        return Ok(());
    }
    let cap = if cx.rt.is_emulated() { 2 } else { i32::MAX as usize };
    cx.launch(op, SOURCE, kernel, tiles.min(cap) as u32, THREADS, args)
}

fn tiles(rows: usize, cols: usize) -> usize {
    rows.div_ceil(TILE) * cols.div_ceil(TILE)
}

/// [`KernelBackend::conv_unfold_product`](crate::backend::KernelBackend::conv_unfold_product).
pub(super) fn unfold_product(
    cx: Ctx<'_>,
    img: &Tensor,
    a3: &Tensor,
    g: &ConvGeometry,
    groups: usize,
) -> Result<Tensor> {
    const OP: &str = "conv_forward";
    check_float(OP, &[img, a3])?;
    let (n, m) = (img.shape()[0], a3.shape()[1]);
    let Some(rec) = record(g, groups, m, n, 1) else {
        return conv_products::unfold_product(img, a3, g, groups);
    };
    let y = img.empty_like_shape(&[n, groups * m, g.output[0], g.output[1]], img.dtype())?;
    if y.numel() == 0 {
        return Ok(y);
    }
    let (x, a) = (f32_contiguous(cx, img)?, f32_contiguous(cx, a3)?);
    into_f32_out(cx, &y, |o| {
        let args = [KernelArg::record(&rec), ptr(&a, OP)?, ptr(&x, OP)?, ptr(o, OP)?];
        launch_tiles(cx, OP, "conv_forward_f32", n * groups * tiles(m, g.windows()), &args)
    })?;
    Ok(y)
}

/// [`KernelBackend::conv_product_fold`](crate::backend::KernelBackend::conv_product_fold): each
/// pixel gathers its `(channel of y, tap)` terms from `y` directly (no fold).
pub(super) fn product_fold(
    cx: Ctx<'_>,
    a3: &Tensor,
    y: &Tensor,
    g: &ConvGeometry,
    groups: usize,
    img_shape: &[usize],
) -> Result<Tensor> {
    const OP: &str = "conv_input_grad";
    check_float(OP, &[a3, y])?;
    let (n, m) = (y.shape()[0], a3.shape()[1]);
    let Some(rec) = record(g, groups, m, n, 1) else {
        return conv_products::product_fold(a3, y, g, groups, img_shape);
    };
    let img = y.empty_like_shape(img_shape, y.dtype())?;
    if img.numel() == 0 {
        return Ok(img);
    }
    let (dy, a) = (f32_contiguous(cx, y)?, f32_contiguous(cx, a3)?);
    into_f32_out(cx, &img, |o| {
        let args = [KernelArg::record(&rec), ptr(&a, OP)?, ptr(&dy, OP)?, ptr(o, OP)?];
        launch_tiles(cx, OP, "conv_input_grad_f32", n * groups * tiles(g.channels / groups, g.pixels()), &args)
    })?;
    Ok(img)
}

/// How many depth ranges the weight gradient splits into: enough blocks for the device when the
/// output has few tiles, each range at least [`MIN_SPLIT_DEPTH`] deep. A function of the shapes
/// only, so a product's result (its summation order) is the same on every run.
fn weight_splits(out_tiles: usize, depth: usize) -> usize {
    let want = TARGET_BLOCKS.div_ceil(out_tiles.max(1));
    want.min(depth / MIN_SPLIT_DEPTH).clamp(1, MAX_SPLITS)
}

/// [`KernelBackend::conv_weight_product`](crate::backend::KernelBackend::conv_weight_product):
/// the sum over samples and windows in a fixed order (split ranges summed in order), no atomics.
pub(super) fn weight_product(cx: Ctx<'_>, y: &Tensor, img: &Tensor, g: &ConvGeometry, groups: usize) -> Result<Tensor> {
    const OP: &str = "conv_weight_grad";
    check_float(OP, &[y, img])?;
    let n = img.shape()[0];
    let m = y.shape()[1] / groups;
    let kc = g.rows() / groups;
    let out_tiles = groups * tiles(m, kc);
    let depth = n.saturating_mul(g.windows());
    let splits = weight_splits(out_tiles, depth);
    let Some(rec) = record(g, groups, m, n, splits) else {
        return conv_products::weight_product(y, img, g, groups);
    };
    let out = img.empty_like_shape(&[groups, m, kc], img.dtype())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    let (dy, x) = (f32_contiguous(cx, y)?, f32_contiguous(cx, img)?);
    into_f32_out(cx, &out, |o| {
        let run = |dst: &Tensor| {
            let args = [KernelArg::record(&rec), ptr(&dy, OP)?, ptr(&x, OP)?, ptr(dst, OP)?];
            launch_tiles(cx, OP, "conv_weight_grad_f32", splits * out_tiles, &args)
        };
        if splits == 1 {
            return run(o);
        }
        let partial = cx.scratch(o, &[splits, groups, m, kc], crate::DType::F32)?;
        run(&partial)?;
        let len = o.numel();
        let args = [n_arg(len), KernelArg::I32(splits as i32), ptr(&partial, OP)?, ptr(o, OP)?];
        cx.launch_n(OP, SOURCE, "conv_sum_splits_f32", len, &args)
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The weight gradient splits only when its output has few tiles and the depth is deep, and
    /// never beyond the bounds.
    #[test]
    fn weight_gradient_splits_follow_the_shapes() {
        assert_eq!(weight_splits(1, 100), 1, "shallow: one range");
        assert_eq!(weight_splits(1, 3 * MIN_SPLIT_DEPTH), 3);
        assert_eq!(weight_splits(1, 1 << 30), MAX_SPLITS);
        assert_eq!(weight_splits(TARGET_BLOCKS, 1 << 30), 1, "enough tiles: no split");
        assert_eq!(weight_splits(0, 0), 1);
    }

    /// Geometries beyond the kernels' `int` arithmetic get no record (the products then take the
    /// unfold + GEMM default); ordinary ones do, with every field carried over.
    #[test]
    fn only_geometries_within_int_arithmetic_get_a_record() {
        let g = ConvGeometry {
            channels: 6,
            input: [9, 11],
            kernel: [3, 2],
            stride: [2, 1],
            padding: [1, 0],
            dilation: [1, 2],
            output: [5, 9],
        };
        let r = record(&g, 2, 4, 3, 1).expect("a small geometry fits");
        assert_eq!(
            [r.channels, r.h, r.w, r.out_h, r.out_w, r.kh, r.kw, r.sh, r.sw, r.ph, r.pw, r.dh, r.dw],
            [6, 9, 11, 5, 9, 3, 2, 2, 1, 1, 0, 1, 2]
        );
        assert_eq!([r.groups, r.m, r.images, r.splits], [2, 4, 3, 1]);
        let long = ConvGeometry { channels: 1, input: [1, 1 << 30], output: [1, 1 << 30], ..g };
        assert!(record(&long, 1, 1, 1, 1).is_none(), "a 2^30-long signal's window offsets overflow int");
        let wide = ConvGeometry { channels: 1 << 16, input: [1 << 8, 1 << 8], ..g };
        assert!(record(&wide, 1, 1, 1, 1).is_none(), "2^32 elements per image");
        assert!(record(&g, 1, 1 << 31, 1, 1).is_none(), "a y of 2^31 channels");
    }
}
