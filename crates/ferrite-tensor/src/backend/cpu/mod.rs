//! The CPU kernel backend (devices `cpu` and `sim:*`): kernels over host memory, parallel on the
//! kernel team, vectorised for the CPU's widest SIMD extension (`kernels/`).

mod elementwise;
mod fused;
mod index;
mod loss;
mod matmul;
mod norm;
mod recurrent;
mod reduce;
mod softmax;
// normalisation and pooling (normpool)
mod batch_norm;
mod channel_vectors;
mod group_norm;
mod pool;
mod rms_norm;
// convolution (conv)
mod conv;

use crate::Tensor;
use crate::backend::ConvGeometry;
use crate::backend::{
    BinaryOp, CellBackward, CellForward, CompareOp, Distribution, FusedKernel, KernelBackend, LayerNormArgs, LogicalOp,
    LossGrad, LossOperands, Plan, PointwiseLoss, RecurrentCell, UnaryOp, check_host_len, host_side,
};
use crate::error::Result;
use crate::random::Generator;

/// Kernels over host memory.
pub struct CpuBackend;

/// The host bytes of the contiguous tensor `t` (`t.nbytes()` of them).
fn host_ptr(t: &Tensor, op: &'static str) -> Result<*mut u8> {
    t.ptr::<u8>(op)
}

impl KernelBackend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn write_from_host(&self, dst: &Tensor, bytes: &[u8]) -> Result<()> {
        check_host_len("write", bytes.len(), dst)?;
        let n = dst.nbytes();
        if n == 0 {
            return Ok(());
        }
        let d = host_ptr(dst, "write")?;
        // SAFETY: `dst` is contiguous with `n` bytes of host memory and `bytes` holds `n` bytes;
        // `copy` (memmove) is correct even if the two ranges overlapped.
        unsafe { std::ptr::copy(bytes.as_ptr(), d, n) };
        Ok(())
    }

    fn read_to_host(&self, src: &Tensor, bytes: &mut [u8]) -> Result<()> {
        check_host_len("read", bytes.len(), src)?;
        let n = src.nbytes();
        if n == 0 {
            return Ok(());
        }
        let s = host_ptr(src, "read")?;
        // SAFETY: `src` is contiguous with `n` initialised bytes; `bytes` is an exclusive buffer
        // of the same length.
        unsafe { std::ptr::copy_nonoverlapping(s, bytes.as_mut_ptr(), n) };
        Ok(())
    }

    fn copy(&self, dst: &Tensor, src: &Tensor) -> Result<()> {
        elementwise::copy(dst, src)
    }

    fn fill(&self, dst: &Tensor, value: f64) -> Result<()> {
        elementwise::fill(dst, value)
    }

    fn arange(&self, dst: &Tensor, start: f64, step: f64) -> Result<()> {
        host_side::arange(dst, start, step)
    }

    fn random(&self, dst: &Tensor, dist: Distribution, generator: &Generator) -> Result<()> {
        host_side::random(dst, dist, generator)
    }

    fn binary(&self, op: BinaryOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
        elementwise::binary(op, out, a, b)
    }

    fn binary_scalar(&self, op: BinaryOp, out: &Tensor, a: &Tensor, s: f64) -> Result<()> {
        elementwise::binary_scalar(op, out, a, s)
    }

    fn binary_inplace(&self, op: BinaryOp, dst: &Tensor, src: &Tensor) -> Result<()> {
        elementwise::binary_inplace(op, dst, src)
    }

    fn unary(&self, op: UnaryOp, out: &Tensor, x: &Tensor) -> Result<()> {
        elementwise::unary(op, out, x)
    }

    fn unary_backward(&self, op: UnaryOp, out: &Tensor, grad: &Tensor, saved: &Tensor) -> Result<()> {
        elementwise::unary_backward(op, out, grad, saved)
    }

    fn clamp(&self, out: &Tensor, x: &Tensor, lo: f64, hi: f64) -> Result<()> {
        elementwise::clamp(out, x, lo, hi)
    }

    fn compare(&self, op: CompareOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
        elementwise::compare(op, out, a, b)
    }

    fn compare_scalar(&self, op: CompareOp, out: &Tensor, a: &Tensor, s: f64) -> Result<()> {
        elementwise::compare_scalar(op, out, a, s)
    }

    fn logical(&self, op: LogicalOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
        elementwise::logical(op, out, a, b)
    }

    fn where_cond(&self, out: &Tensor, cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
        elementwise::where_cond(out, cond, a, b)
    }

    fn sum(&self, out: &Tensor, x: &Tensor, plan: &Plan, scale: f64) -> Result<()> {
        reduce::sum(out, x, plan, scale)
    }

    fn arg_extreme(
        &self,
        x: &Tensor,
        plan: &Plan,
        values: Option<&Tensor>,
        indices: &Tensor,
        is_max: bool,
    ) -> Result<()> {
        reduce::arg_extreme(x, plan, values, indices, is_max)
    }

    fn var(&self, out: &Tensor, x: &Tensor, plan: &Plan, denom: f64) -> Result<()> {
        reduce::var(out, x, plan, denom)
    }

    fn softmax(&self, out: &Tensor, x: &Tensor, log: bool) -> Result<()> {
        softmax::softmax(out, x, log)
    }

    fn softmax_backward(&self, out: &Tensor, grad: &Tensor, y: &Tensor, log: bool) -> Result<()> {
        softmax::softmax_backward(out, grad, y, log)
    }

    fn layer_norm(&self, args: &LayerNormArgs<'_>) -> Result<()> {
        norm::layer_norm(args)
    }

    fn layer_norm_backward(
        &self,
        args: &crate::backend::LayerNormBackwardArgs<'_>,
    ) -> Result<Option<crate::backend::LayerNormGrads>> {
        norm::layer_norm_backward(args).map(Some)
    }

    fn matmul(&self, out: &Tensor, a: &Tensor, b: &Tensor, batch: &[usize]) -> Result<()> {
        matmul::matmul(out, a, b, batch)
    }

    fn matmul_takes_half(&self) -> bool {
        true
    }

    fn check_indices(
        &self,
        index: &Tensor,
        size: usize,
        ignore: Option<i64>,
        dim: usize,
        op: &'static str,
    ) -> Result<()> {
        host_side::check_indices(index, size, ignore, dim, op)
    }

    fn index_select(&self, out: &Tensor, x: &Tensor, dim: usize, index: &Tensor) -> Result<()> {
        index::index_select(out, x, dim, index)
    }

    fn index_add(&self, dst: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<()> {
        index::index_add(dst, dim, index, src)
    }

    fn gather(&self, out: &Tensor, x: &Tensor, dim: usize, index: &Tensor) -> Result<()> {
        index::gather(out, x, dim, index)
    }

    fn scatter_add(&self, out: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<()> {
        index::scatter_add(out, dim, index, src)
    }

    fn one_hot(&self, out: &Tensor, index: &Tensor) -> Result<()> {
        index::one_hot(out, index)
    }

    fn fused(&self, kernel: &FusedKernel, outputs: &[&Tensor], inputs: &[&Tensor]) -> Result<f64> {
        fused::fused(kernel, outputs, inputs)
    }

    fn pointwise_loss(&self, op: PointwiseLoss, out: &Tensor, x: LossOperands<'_>) -> Result<()> {
        loss::pointwise_loss(op, out, x)
    }

    fn pointwise_loss_backward(
        &self,
        op: PointwiseLoss,
        wrt: LossGrad,
        out: &Tensor,
        grad: &Tensor,
        x: LossOperands<'_>,
    ) -> Result<()> {
        loss::pointwise_loss_backward(op, wrt, out, grad, x)
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    // ------------------------------------------------------------------ normalisation and pooling (normpool)

    fn batch_norm(&self, args: &crate::backend::BatchNormArgs<'_>) -> Result<()> {
        batch_norm::batch_norm(args)
    }
    fn batch_norm_backward(&self, args: &crate::backend::BatchNormBackwardArgs<'_>) -> Result<()> {
        batch_norm::batch_norm_backward(args)
    }
    fn group_norm(&self, args: &crate::backend::GroupNormArgs<'_>) -> Result<()> {
        group_norm::group_norm(args)
    }
    fn group_norm_backward(&self, args: &crate::backend::GroupNormBackwardArgs<'_>) -> Result<()> {
        group_norm::group_norm_backward(args)
    }
    fn rms_norm(&self, args: &crate::backend::RmsNormArgs<'_>) -> Result<()> {
        rms_norm::rms_norm(args)
    }
    fn rms_norm_backward(&self, args: &crate::backend::RmsNormBackwardArgs<'_>) -> Result<()> {
        rms_norm::rms_norm_backward(args)
    }
    fn max_pool2d(&self, out: &Tensor, indices: &Tensor, x: &Tensor, pool: &crate::backend::Pool2d) -> Result<()> {
        pool::max_pool2d(out, indices, x, pool)
    }
    fn max_pool2d_backward(
        &self,
        grad_input: &Tensor,
        grad_output: &Tensor,
        indices: &Tensor,
        pool: &crate::backend::Pool2d,
    ) -> Result<()> {
        pool::max_pool2d_backward(grad_input, grad_output, indices, pool)
    }
    fn avg_pool2d(&self, out: &Tensor, x: &Tensor, pool: &crate::backend::Pool2d) -> Result<()> {
        pool::avg_pool2d(out, x, pool)
    }
    fn avg_pool2d_backward(
        &self,
        grad_input: &Tensor,
        grad_output: &Tensor,
        pool: &crate::backend::Pool2d,
    ) -> Result<()> {
        pool::avg_pool2d_backward(grad_input, grad_output, pool)
    }
    // ------------------------------------------------------------------ convolution (conv)

    fn im2col(&self, cols: &Tensor, x: &Tensor, geom: &ConvGeometry) -> Result<()> {
        conv::im2col(cols, x, geom)
    }

    fn col2im(&self, x: &Tensor, cols: &Tensor, geom: &ConvGeometry) -> Result<()> {
        conv::col2im(x, cols, geom)
    }
    // ------------------------------------------------------------------ recurrent cells (rnn)

    fn recurrent_cell(&self, cell: RecurrentCell, x: &CellForward<'_>) -> Result<()> {
        recurrent::forward(cell, x)
    }

    fn recurrent_cell_backward(&self, cell: RecurrentCell, x: &CellBackward<'_>) -> Result<()> {
        recurrent::backward(cell, x)
    }

    fn prepare_rhs(&self, b: &Tensor) -> Result<Option<Box<dyn crate::backend::PreparedRhs>>> {
        matmul::prepare_rhs(b)
    }
}
