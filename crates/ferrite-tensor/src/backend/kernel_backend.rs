//! The [`KernelBackend`] trait itself (see the module documentation of `backend` for the
//! contract), with the two bookkeeping helpers every implementation shares. It sits apart from
//! `backend/mod.rs` so that the backends implementing it (`cpu/`, `meta.rs`, `gpu/`) depend on
//! this file while `mod.rs`, which picks a device's backend in [`kernels_for`], depends on them:
//! one direction, no circle.
//!
//! [`kernels_for`]: super::kernels_for

use crate::Tensor;
use crate::backend::{
    BatchNormArgs, BatchNormBackwardArgs, BinaryOp, CellBackward, CellForward, CompareOp, ConvGeometry, Distribution,
    FusedKernel, GroupNormArgs, GroupNormBackwardArgs, LayerNormArgs, LayerNormBackwardArgs, LayerNormGrads, LogicalOp,
    LossGrad, LossOperands, Plan, PointwiseLoss, Pool2d, RecurrentCell, RmsNormArgs, RmsNormBackwardArgs, UnaryOp,
};
use crate::error::{Result, TensorError};
use crate::random::Generator;

/// The kernels of one kind of device. See the module documentation for the contract.
pub trait KernelBackend: Send + Sync + 'static {
    /// Short name for messages (`"cpu"`, `"meta"`, `"wgpu"`).
    fn name(&self) -> &'static str;

    // ------------------------------------------------------------------ data movement

    /// Write `bytes` (exactly `dst.nbytes()`, element layout of `dst.dtype()`) into the
    /// contiguous `dst`.
    fn write_from_host(&self, dst: &Tensor, bytes: &[u8]) -> Result<()>;
    /// Read the contiguous `src` into `bytes` (exactly `src.nbytes()`). A synchronisation point.
    fn read_to_host(&self, src: &Tensor, bytes: &mut [u8]) -> Result<()>;
    /// `dst = src` elementwise: `src` is broadcast to `dst`'s shape and converted to its dtype;
    /// `dst` may be any non-overlapping strided view (it is written in place).
    fn copy(&self, dst: &Tensor, src: &Tensor) -> Result<()>;
    /// Fill the contiguous `dst` with `value` converted to its dtype.
    fn fill(&self, dst: &Tensor, value: f64) -> Result<()>;
    /// `dst[i] = start + i * step` (contiguous `dst`).
    fn arange(&self, dst: &Tensor, start: f64, step: f64) -> Result<()>;
    /// Fill the contiguous floating-point `dst` from `dist`, element `i` using the generator's
    /// words `[w·i, w·(i+1))` past its current position (the caller advances the generator).
    fn random(&self, dst: &Tensor, dist: Distribution, generator: &Generator) -> Result<()>;

    // ------------------------------------------------------------------ elementwise

    /// `out = op(a, b)`; `a` and `b` have `out`'s dtype and broadcast to its shape.
    fn binary(&self, op: BinaryOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()>;
    /// `out = op(a, s)`; `a` has `out`'s dtype and shape.
    fn binary_scalar(&self, op: BinaryOp, out: &Tensor, a: &Tensor, s: f64) -> Result<()>;
    /// In place `dst = op(dst, src)`; `src` has `dst`'s dtype and broadcasts to its shape; `dst`
    /// may be strided.
    fn binary_inplace(&self, op: BinaryOp, dst: &Tensor, src: &Tensor) -> Result<()>;
    /// `out = op(x)` for a floating-point `x` of `out`'s dtype and shape (x may be strided).
    fn unary(&self, op: UnaryOp, out: &Tensor, x: &Tensor) -> Result<()>;
    /// `out = grad * op'(saved)` where `saved` is the op's output or input
    /// ([`UnaryOp::derivative_from_output`]); all of `out`'s dtype, broadcast to its shape.
    fn unary_backward(&self, op: UnaryOp, out: &Tensor, grad: &Tensor, saved: &Tensor) -> Result<()>;
    /// `out = clamp(x, lo, hi)` (NaN stays NaN); `x` of `out`'s dtype.
    fn clamp(&self, out: &Tensor, x: &Tensor, lo: f64, hi: f64) -> Result<()>;
    /// Bool `out = op(a, b)`; `a` and `b` share a dtype and broadcast to `out`'s shape.
    fn compare(&self, op: CompareOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()>;
    /// Bool `out = op(a, s)`.
    fn compare_scalar(&self, op: CompareOp, out: &Tensor, a: &Tensor, s: f64) -> Result<()>;
    /// Bool `out = op(a, b)` for bool `a`, `b` broadcast to `out`'s shape.
    fn logical(&self, op: LogicalOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()>;
    /// `out = cond ? a : b` (bool `cond`; `a`, `b` of `out`'s dtype; all broadcast).
    fn where_cond(&self, out: &Tensor, cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<()>;

    // ------------------------------------------------------------------ reductions

    /// Sum over the plan's reduced dims, times `scale`; floats accumulate in f64, integers and
    /// bools sum into int64 `out`.
    fn sum(&self, out: &Tensor, x: &Tensor, plan: &Plan, scale: f64) -> Result<()>;
    /// Index (int64, into the reduced dim) and optionally the value of the max or min; the first
    /// NaN wins, ties take the first index.
    fn arg_extreme(
        &self,
        x: &Tensor,
        plan: &Plan,
        values: Option<&Tensor>,
        indices: &Tensor,
        is_max: bool,
    ) -> Result<()>;
    /// Variance over the plan's reduced dims with the given denominator (two passes in f64).
    fn var(&self, out: &Tensor, x: &Tensor, plan: &Plan, denom: f64) -> Result<()>;
    /// (log-)softmax over the last dim of the contiguous `x`.
    fn softmax(&self, out: &Tensor, x: &Tensor, log: bool) -> Result<()>;
    /// Backward of (log-)softmax over the last dim: contiguous `grad` and saved output `y`.
    fn softmax_backward(&self, out: &Tensor, grad: &Tensor, y: &Tensor, log: bool) -> Result<()>;
    /// Layer norm over the last dim (see [`LayerNormArgs`]).
    fn layer_norm(&self, args: &LayerNormArgs<'_>) -> Result<()>;
    /// The gradients of [`layer_norm`](Self::layer_norm) in one fused kernel (see
    /// [`LayerNormBackwardArgs`]; the backend allocates the outputs), or `None` when this backend
    /// has none (the default): the caller then composes them from tensor ops.
    fn layer_norm_backward(&self, args: &LayerNormBackwardArgs<'_>) -> Result<Option<LayerNormGrads>> {
        let _ = args;
        Ok(None)
    }

    // ------------------------------------------------------------------ products

    /// `out [batch.., m, n] = a [.., m, k] @ b [.., k, n]` with batch dims broadcast (a and b
    /// strided, f32 or f64 — or f16/bf16 where [`matmul_takes_half`](Self::matmul_takes_half) —,
    /// same dtype as `out`).
    fn matmul(&self, out: &Tensor, a: &Tensor, b: &Tensor, batch: &[usize]) -> Result<()>;
    /// Whether [`matmul`](Self::matmul) takes f16/bf16 operands and output of one dtype itself,
    /// accumulating in f32 and rounding once (cuBLAS on `cuda:N`; the CPU widens into host
    /// workspace of its own). Where not (`gpu:N`), the op widens them to f32 scratch tensors
    /// first, and those count in the device's memory.
    fn matmul_takes_half(&self) -> bool {
        false
    }

    // ------------------------------------------------------------------ indexing

    /// Error unless every element of the integer tensor `index` is in `[0, size)` or equals
    /// `ignore` (class targets of a loss: negative values are not wrapped). `dim` and `op` name the indexed dimension and the op in the error.
    /// An asynchronous backend (`cuda:N`) checks on the device and reports the error at the next
    /// synchronisation.
    fn check_indices(
        &self,
        index: &Tensor,
        size: usize,
        ignore: Option<i64>,
        dim: usize,
        op: &'static str,
    ) -> Result<()>;
    /// `out.select(dim, i) = x.select(dim, index[i])` for a 1-D integer `index`.
    fn index_select(&self, out: &Tensor, x: &Tensor, dim: usize, index: &Tensor) -> Result<()>;
    /// In place `dst.select(dim, index[i]) += src.select(dim, i)` (src of dst's dtype).
    fn index_add(&self, dst: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<()>;
    /// `out[..i..] = x[.. index[..i..] ..]` along `dim` (int64 `index` of `out`'s shape).
    fn gather(&self, out: &Tensor, x: &Tensor, dim: usize, index: &Tensor) -> Result<()>;
    /// In place on the contiguous `out`: `out[.. index[..i..] ..] += src[..i..]` along `dim`.
    fn scatter_add(&self, out: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<()>;
    /// `out[i, index[i]] = 1` on a zero-filled int64 `out [n, classes]` (index flattened).
    fn one_hot(&self, out: &Tensor, index: &Tensor) -> Result<()>;

    // ------------------------------------------------------------------ fused updates

    /// Run a named multi-tensor kernel over contiguous, same-shaped operands; `outputs` are
    /// updated in place. Returns the kernel's scalar result (norm partials, found-inf as 0/1), or
    /// 0 for kernels without one.
    fn fused(&self, kernel: &FusedKernel, outputs: &[&Tensor], inputs: &[&Tensor]) -> Result<f64>;

    // ------------------------------------------------------------------ losses (lossopt)

    /// Elementwise `out = op(input, target)` (weighted); see [`PointwiseLoss`].
    fn pointwise_loss(&self, op: PointwiseLoss, out: &Tensor, x: LossOperands<'_>) -> Result<()>;
    /// `out = grad * ∂op/∂wrt` elementwise: `grad` (of `out`'s dtype) broadcasts to `out`'s shape,
    /// which is the operands' shape.
    fn pointwise_loss_backward(
        &self,
        op: PointwiseLoss,
        wrt: LossGrad,
        out: &Tensor,
        grad: &Tensor,
        x: LossOperands<'_>,
    ) -> Result<()>;

    /// Wait until every kernel submitted so far has finished (no-op for synchronous backends).
    /// On an asynchronous backend this (like every read to the host) is where a device-side
    /// error of a queued op is reported.
    fn synchronize(&self) -> Result<()>;

    // ------------------------------------------------------------------ normalisation and pooling (normpool)

    /// Batch norm over `x [N, C, S]`: statistics per channel (or given), then the normalised,
    /// scaled output; see [`BatchNormArgs`].
    fn batch_norm(&self, args: &BatchNormArgs<'_>) -> Result<()>;
    /// Gradients of [`batch_norm`](Self::batch_norm); see [`BatchNormBackwardArgs`].
    fn batch_norm_backward(&self, args: &BatchNormBackwardArgs<'_>) -> Result<()>;
    /// Group norm over `x [N, C, S]`; see [`GroupNormArgs`].
    fn group_norm(&self, args: &GroupNormArgs<'_>) -> Result<()>;
    /// Gradients of [`group_norm`](Self::group_norm); see [`GroupNormBackwardArgs`].
    fn group_norm_backward(&self, args: &GroupNormBackwardArgs<'_>) -> Result<()>;
    /// RMS norm over the rows of `x [rows, cols]`; see [`RmsNormArgs`].
    fn rms_norm(&self, args: &RmsNormArgs<'_>) -> Result<()>;
    /// Gradients of [`rms_norm`](Self::rms_norm); see [`RmsNormBackwardArgs`].
    fn rms_norm_backward(&self, args: &RmsNormBackwardArgs<'_>) -> Result<()>;
    /// Max pooling of the contiguous planes `x [P, H, W]` into `out [P, OH, OW]`, writing the
    /// int64 position `h·W + w` of each maximum into `indices` (NaN wins, then the first maximum).
    fn max_pool2d(&self, out: &Tensor, indices: &Tensor, x: &Tensor, pool: &Pool2d) -> Result<()>;
    /// `grad_input [P, H, W]` (fully written) from `grad_output [P, OH, OW]` routed to the saved
    /// `indices`.
    fn max_pool2d_backward(
        &self,
        grad_input: &Tensor,
        grad_output: &Tensor,
        indices: &Tensor,
        pool: &Pool2d,
    ) -> Result<()>;
    /// Average pooling (fixed or adaptive windows, [`Pool2d::avg_window`]) of `x [P, H, W]`.
    fn avg_pool2d(&self, out: &Tensor, x: &Tensor, pool: &Pool2d) -> Result<()>;
    /// `grad_input [P, H, W]` (fully written): each output's gradient spread over its window
    /// divided by the window's divisor.
    fn avg_pool2d_backward(&self, grad_input: &Tensor, grad_output: &Tensor, pool: &Pool2d) -> Result<()>;
    // ------------------------------------------------------------------ convolution (conv)

    /// Unfold (im2col): `cols [n, channels·kh·kw, oh·ow]` from the image `x [n, channels, h, w]`
    /// (both contiguous, one floating-point dtype) through the windows of `geom`: row
    /// `c·kh·kw + i·kw + j` holds tap `(i, j)` of channel `c` for every window, 0 where the tap
    /// falls into the padding. Writes every element of `cols`.
    fn im2col(&self, cols: &Tensor, x: &Tensor, geom: &ConvGeometry) -> Result<()>;
    /// Fold (col2im), the adjoint of [`im2col`](Self::im2col): every pixel of the contiguous
    /// `x [n, channels, h, w]` is the sum of the `cols` entries whose tap reads it (0 for pixels no
    /// window reads). Writes every element of `x`.
    fn col2im(&self, x: &Tensor, cols: &Tensor, geom: &ConvGeometry) -> Result<()>;

    // The three products every convolution pass is made of (see `functional/conv.rs` for which
    // pass uses which). Unlike every other method they allocate their result and whatever
    // temporaries they need, because how much scratch a convolution takes is exactly what a
    // backend chooses here. The default is unfold (im2col) + batched GEMM through
    // [`im2col`](Self::im2col)/[`col2im`](Self::col2im)/[`matmul`](Self::matmul) in chunks of at
    // most [`UNFOLD_BUDGET`](super::UNFOLD_BUDGET) bytes (`backend/conv_products.rs`), whose
    // allocations depend on shapes only, so `meta` and `sim` plan what `cpu` does. Operands:
    // `img [n, c, h, w]` and `y [n, groups·m, oh, ow]` contiguous, `a3` the contiguous weight
    // viewed `[groups, m, (c/groups)·kh·kw]`, one float dtype the backend's `matmul` takes; the
    // result is contiguous, of that dtype, on the operands' device.

    /// `y[n, g] = a3[g] · U(img[n])[g]` → `[n, groups·m, oh, ow]` (`U` the unfolded image of
    /// [`im2col`](Self::im2col), rows of group `g` only): the forward of a convolution.
    fn conv_unfold_product(&self, img: &Tensor, a3: &Tensor, geom: &ConvGeometry, groups: usize) -> Result<Tensor> {
        super::conv_products::unfold_product(img, a3, geom, groups)
    }
    /// `img[n] = fold(a3[g]ᵀ · y[n, g])` → `img_shape = [n, c, h, w]` (`fold` is
    /// [`col2im`](Self::col2im)): the input gradient of a convolution, the forward of a
    /// transposed one.
    fn conv_product_fold(
        &self,
        a3: &Tensor,
        y: &Tensor,
        geom: &ConvGeometry,
        groups: usize,
        img_shape: &[usize],
    ) -> Result<Tensor> {
        super::conv_products::product_fold(a3, y, geom, groups, img_shape)
    }
    /// `Σₙ y[n, g] · U(img[n])[g]ᵀ` → `[groups, m, (c/groups)·kh·kw]`: the weight gradient.
    fn conv_weight_product(&self, y: &Tensor, img: &Tensor, geom: &ConvGeometry, groups: usize) -> Result<Tensor> {
        super::conv_products::weight_product(y, img, geom, groups)
    }
    // ------------------------------------------------------------------ recurrent cells (rnn)

    /// One time step's gate arithmetic of a recurrent layer (see [`CellForward`]).
    fn recurrent_cell(&self, cell: RecurrentCell, x: &CellForward<'_>) -> Result<()>;
    /// Its gradient (see [`CellBackward`]).
    fn recurrent_cell_backward(&self, cell: RecurrentCell, x: &CellBackward<'_>) -> Result<()>;

    /// The 2-D `b [k, n]` made ready for many products `a [m, k] @ b` with the same `b` (a
    /// recurrent layer multiplies every time step's state by the same weight), or `None` when
    /// this backend has nothing faster than one [`matmul`](Self::matmul) per product (the
    /// default). The caller leaves `b` unmodified while it holds the result.
    fn prepare_rhs(&self, b: &Tensor) -> Result<Option<Box<dyn PreparedRhs>>> {
        let _ = b;
        Ok(None)
    }
}

/// A right-hand side made ready by [`KernelBackend::prepare_rhs`].
pub trait PreparedRhs: Send + Sync {
    /// `out [m, n] = a [m, k] @ b`: `a` a 2-D view of `b`'s dtype and device (any strides),
    /// `out` fresh and contiguous.
    fn matmul(&self, out: &Tensor, a: &Tensor) -> Result<()>;
}

/// The `[rows, cols]` a row kernel (softmax, layer norm) sees in its contiguous operand `t`:
/// `cols` is the last dimension (1 for a 0-dim tensor), `rows` the product of the others. Every
/// backend's row kernels take their bookkeeping from here.
pub fn rows_cols(t: &Tensor) -> (usize, usize) {
    let cols = t.shape().last().copied().unwrap_or(1);
    (t.numel().checked_div(cols).unwrap_or(0), cols)
}

/// Error unless a host buffer of `len` bytes matches `t` byte for byte (the length check of
/// every backend's `write_from_host`/`read_to_host`).
pub(crate) fn check_host_len(op: &'static str, len: usize, t: &Tensor) -> Result<()> {
    let nbytes = t.nbytes();
    if len == nbytes { Ok(()) } else { Err(TensorError::ByteLength { op, len, nbytes }) }
}
