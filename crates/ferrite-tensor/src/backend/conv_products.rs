//! The three products every convolution pass is made of, as unfold (im2col) plus batched GEMM:
//! the default of [`KernelBackend::conv_unfold_product`], [`KernelBackend::conv_product_fold`]
//! and [`KernelBackend::conv_weight_product`], which `cpu`, `sim`, `meta` and `gpu` use.
//!
//! Why a seam here and not in `functional/conv.rs`: the products are where a backend's
//! convolution strategy lives. Unfold + GEMM only needs two data-movement kernels next to a GEMM
//! every backend has, but it materialises the unfolded image (`C·kh·kw·oh·ow` elements per
//! sample, chunked under [`UNFOLD_BUDGET`]); a backend with an implicit GEMM (`cuda:N`: the
//! unfolded matrix is gathered tile by tile in shared memory, never stored) or a library
//! convolution overrides the three methods and keeps the op layer — shapes, dtypes, autograd,
//! bias, the choice between the products — unchanged.
//!
//! Memory, which the planner must be able to predict: batches are unfolded in chunks of at most
//! [`UNFOLD_BUDGET`] bytes; the chunk size depends on shapes only, so `meta` makes the same
//! allocations as `cpu`. The functions allocate through the operands' own allocator, in the same
//! order on every device that uses them.
//!
//! Operands (every method): `img [n, c, h, w]` and `y [n, groups·m, oh, ow]` contiguous, `a3` the
//! contiguous weight viewed `[groups, m, c/groups·kh·kw]` (or the flipped weight of the stride-1
//! input gradient), one floating dtype that the backend's `matmul` takes (f32 or f64; the op layer
//! widens f16/bf16 to f32 before calling).

use crate::backend::{BinaryOp, ConvGeometry, Plan};
use crate::error::Result;
use crate::layout::{Layout, Shape};
use crate::{DType, Tensor};

/// Most bytes of per-chunk temporaries (the unfolded image, the per-sample weight products) one
/// product allocates at a time; batches are processed in chunks of as many samples as fit (at
/// least one). Why 6 MiB: the unfolded chunk is written and then read straight back by the
/// product's packing, so it should stay in the last-level cache between the two; a 64-channel
/// 32×32 3×3 layer (2.25 MiB per sample) then runs two samples per chunk, one per core, and was
/// measured 25–30 % faster per convolution step than with whole-batch chunks (64 MiB, which put
/// the 72 MiB unfolded batch of that layer through DRAM). Small first layers (3 input channels)
/// still unfold a CIFAR batch at once.
pub const UNFOLD_BUDGET: usize = 6 << 20;

/// Samples per chunk when each needs `per_sample` temporary elements of `dtype`.
fn chunk(batch: usize, per_sample: usize, dtype: DType) -> usize {
    let bytes = per_sample.saturating_mul(dtype.size_in_bytes()).max(1);
    (UNFOLD_BUDGET / bytes).clamp(1, batch.max(1))
}

/// Samples `[start, start + shape[0])` of the contiguous `t` (`per` elements each), viewed as
/// `shape`.
fn samples(t: &Tensor, start: usize, per: usize, shape: &[usize]) -> Tensor {
    let mut l = Layout::contiguous(shape);
    l.offset = t.storage_offset() + start * per;
    t.view_with_layout(l)
}

/// `a3` with its last two dimensions swapped (a strided view; the GEMM takes strides).
fn transposed(a3: &Tensor) -> Tensor {
    a3.view_with_layout(a3.layout().transpose(1, 2))
}

/// `y[n, g] = a3[g] · U(img[n])[g]` → `[n, groups·m, oh, ow]`; `img [n, c, h, w]` contiguous.
pub fn unfold_product(img: &Tensor, a3: &Tensor, geom: &ConvGeometry, groups: usize) -> Result<Tensor> {
    let (n, dtype) = (img.shape()[0], img.dtype());
    let (rows, win, m) = (geom.rows(), geom.windows(), a3.shape()[1]);
    let y = img.empty_like_shape(&[n, groups * m, geom.output[0], geom.output[1]], dtype)?;
    if y.numel() == 0 {
        return Ok(y);
    }
    let per_img = geom.channels * geom.pixels();
    let step = chunk(n, rows * win, dtype);
    for s in (0..n).step_by(step) {
        let b = step.min(n - s);
        let cols = img.empty_like_shape(&[b, groups, rows / groups, win], dtype)?;
        let xs = samples(img, s, per_img, &[b, geom.channels, geom.input[0], geom.input[1]]);
        img.kernels().im2col(&cols.contiguous_view_as(&[b, rows, win]), &xs, geom)?;
        let ys = samples(&y, s, groups * m * win, &[b, groups, m, win]);
        y.kernels().matmul(&ys, a3, &cols, &[b, groups])?;
    }
    Ok(y)
}

/// `img[n] = fold(a3[g]ᵀ · y[n, g])` → `img_shape = [n, c, h, w]`; `y [n, groups·m, ..windows]`
/// contiguous.
pub fn product_fold(
    a3: &Tensor,
    y: &Tensor,
    geom: &ConvGeometry,
    groups: usize,
    img_shape: &[usize],
) -> Result<Tensor> {
    let (n, dtype) = (y.shape()[0], y.dtype());
    let (rows, win, m) = (geom.rows(), geom.windows(), a3.shape()[1]);
    let img = y.empty_like_shape(img_shape, dtype)?;
    if img.numel() == 0 {
        return Ok(img);
    }
    let per_img = geom.channels * geom.pixels();
    let at = transposed(a3);
    let step = chunk(n, rows * win, dtype);
    for s in (0..n).step_by(step) {
        let b = step.min(n - s);
        let cols = y.empty_like_shape(&[b, groups, rows / groups, win], dtype)?;
        let ys = samples(y, s, groups * m * win, &[b, groups, m, win]);
        y.kernels().matmul(&cols, &at, &ys, &[b, groups])?;
        let xs = samples(&img, s, per_img, &[b, geom.channels, geom.input[0], geom.input[1]]);
        img.kernels().col2im(&xs, &cols.contiguous_view_as(&[b, rows, win]), geom)?;
    }
    Ok(img)
}

/// `Σₙ y[n, g] · U(img[n])[g]ᵀ` → `[groups, m, rows/groups]`; `y [n, groups·m, ..windows]` and
/// `img` contiguous.
pub fn weight_product(y: &Tensor, img: &Tensor, geom: &ConvGeometry, groups: usize) -> Result<Tensor> {
    let (n, dtype) = (img.shape()[0], img.dtype());
    let (rows, win) = (geom.rows(), geom.windows());
    let m = y.shape()[1] / groups;
    let kc = rows / groups;
    let per_img = geom.channels * geom.pixels();
    let step = chunk(n, rows * win + groups * m * kc, dtype);
    let mut acc: Option<Tensor> = None;
    for s in (0..n).step_by(step) {
        let b = step.min(n - s);
        let cols = img.empty_like_shape(&[b, groups, kc, win], dtype)?;
        let xs = samples(img, s, per_img, &[b, geom.channels, geom.input[0], geom.input[1]]);
        img.kernels().im2col(&cols.contiguous_view_as(&[b, rows, win]), &xs, geom)?;
        let ys = samples(y, s, groups * m * win, &[b, groups, m, win]);
        let prod = img.empty_like_shape(&[b, groups, m, kc], dtype)?;
        let ct = cols.view_with_layout(cols.layout().transpose(2, 3));
        img.kernels().matmul(&prod, &ys, &ct, &[b, groups])?;
        drop(cols);
        let part = if b == 1 { prod.contiguous_view_as(&[groups, m, kc]) } else { sum_samples(&prod)? };
        acc = Some(match acc {
            None => part,
            Some(a) => {
                if a.numel() > 0 {
                    a.kernels().binary_inplace(BinaryOp::Add, &a, &part)?;
                }
                a
            }
        });
    }
    match acc {
        Some(a) => Ok(a),
        None => {
            let zeros = Tensor::empty_with(img.storage().allocator(), &[groups, m, kc], dtype)?;
            if zeros.numel() > 0 {
                zeros.kernels().fill(&zeros, 0.0)?;
            }
            Ok(zeros)
        }
    }
}

/// `Σ_b prod[b]` of the contiguous, non-empty-batch `prod [b, groups, m, kc]` → `[groups, m, kc]`
/// (what `ops::reduce::sum_raw(prod, [0])` computes, planned here because the backend layer does
/// not depend on the op layer).
fn sum_samples(prod: &Tensor) -> Result<Tensor> {
    let s = prod.shape();
    let out_shape: Shape = s[1..].iter().copied().collect();
    let mut keep_shape = Shape::new();
    keep_shape.push(1);
    keep_shape.extend(s[1..].iter().copied());
    let permuted = prod.layout().permute(&[1, 2, 3, 0], "conv_weight_backward")?;
    let plan =
        Plan { out_shape, keep_shape, permuted, rn: s[0], reduced: [true, false, false, false].into_iter().collect() };
    let out = prod.empty_like_shape(&plan.out_shape, prod.dtype())?;
    out.kernels().sum(&out, prod, &plan, 1.0)?;
    Ok(out)
}
