//! The `meta` device's kernels: none. Outputs are allocated by the op layer exactly as on any
//! other device (so the allocator sees the same requests), and nothing is computed — which is why
//! a planning run of a billion-parameter model takes milliseconds.

use crate::Tensor;
use crate::backend::ConvGeometry;
use crate::backend::Plan;
use crate::backend::{
    BinaryOp, CellBackward, CellForward, CompareOp, Distribution, FusedKernel, KernelBackend, LayerNormArgs,
    LayerNormBackwardArgs, LayerNormGrads, LogicalOp, LossGrad, LossOperands, PointwiseLoss, RecurrentCell, UnaryOp,
};
use crate::error::{Result, TensorError};
use crate::random::Generator;

/// Shape-only execution.
pub struct MetaBackend;

impl KernelBackend for MetaBackend {
    fn name(&self) -> &'static str {
        "meta"
    }
    fn write_from_host(&self, _dst: &Tensor, _bytes: &[u8]) -> Result<()> {
        Ok(())
    }
    fn read_to_host(&self, src: &Tensor, _bytes: &mut [u8]) -> Result<()> {
        if src.numel() == 0 {
            return Ok(());
        }
        Err(TensorError::MetaHasNoData { op: "read" })
    }
    fn copy(&self, _dst: &Tensor, _src: &Tensor) -> Result<()> {
        Ok(())
    }
    fn fill(&self, _dst: &Tensor, _value: f64) -> Result<()> {
        Ok(())
    }
    fn arange(&self, _dst: &Tensor, _start: f64, _step: f64) -> Result<()> {
        Ok(())
    }
    fn random(&self, _dst: &Tensor, _dist: Distribution, _generator: &Generator) -> Result<()> {
        Ok(())
    }
    fn binary(&self, _op: BinaryOp, _out: &Tensor, _a: &Tensor, _b: &Tensor) -> Result<()> {
        Ok(())
    }
    fn binary_scalar(&self, _op: BinaryOp, _out: &Tensor, _a: &Tensor, _s: f64) -> Result<()> {
        Ok(())
    }
    fn binary_inplace(&self, _op: BinaryOp, _dst: &Tensor, _src: &Tensor) -> Result<()> {
        Ok(())
    }
    fn unary(&self, _op: UnaryOp, _out: &Tensor, _x: &Tensor) -> Result<()> {
        Ok(())
    }
    fn unary_backward(&self, _op: UnaryOp, _out: &Tensor, _grad: &Tensor, _saved: &Tensor) -> Result<()> {
        Ok(())
    }
    fn clamp(&self, _out: &Tensor, _x: &Tensor, _lo: f64, _hi: f64) -> Result<()> {
        Ok(())
    }
    fn compare(&self, _op: CompareOp, _out: &Tensor, _a: &Tensor, _b: &Tensor) -> Result<()> {
        Ok(())
    }
    fn compare_scalar(&self, _op: CompareOp, _out: &Tensor, _a: &Tensor, _s: f64) -> Result<()> {
        Ok(())
    }
    fn logical(&self, _op: LogicalOp, _out: &Tensor, _a: &Tensor, _b: &Tensor) -> Result<()> {
        Ok(())
    }
    fn where_cond(&self, _out: &Tensor, _cond: &Tensor, _a: &Tensor, _b: &Tensor) -> Result<()> {
        Ok(())
    }
    fn sum(&self, _out: &Tensor, _x: &Tensor, _plan: &Plan, _scale: f64) -> Result<()> {
        Ok(())
    }
    fn arg_extreme(
        &self,
        _x: &Tensor,
        _plan: &Plan,
        _values: Option<&Tensor>,
        _indices: &Tensor,
        _is_max: bool,
    ) -> Result<()> {
        Ok(())
    }
    fn var(&self, _out: &Tensor, _x: &Tensor, _plan: &Plan, _denom: f64) -> Result<()> {
        Ok(())
    }
    fn softmax(&self, _out: &Tensor, _x: &Tensor, _log: bool) -> Result<()> {
        Ok(())
    }
    fn softmax_backward(&self, _out: &Tensor, _grad: &Tensor, _y: &Tensor, _log: bool) -> Result<()> {
        Ok(())
    }
    fn layer_norm(&self, _args: &LayerNormArgs<'_>) -> Result<()> {
        Ok(())
    }
    fn layer_norm_backward(&self, args: &LayerNormBackwardArgs<'_>) -> Result<Option<LayerNormGrads>> {
        // The CPU's fused kernel allocates exactly these.
        Ok(Some(args.outputs()?))
    }
    fn matmul(&self, _out: &Tensor, _a: &Tensor, _b: &Tensor, _batch: &[usize]) -> Result<()> {
        Ok(())
    }
    fn matmul_takes_half(&self) -> bool {
        // As the CPU backend (and cuBLAS on cuda:N): no f32 scratch tensors for half products.
        true
    }
    fn check_indices(
        &self,
        _index: &Tensor,
        _size: usize,
        _ignore: Option<i64>,
        _dim: usize,
        _op: &'static str,
    ) -> Result<()> {
        // Meta tensors hold no values to check.
        Ok(())
    }
    fn index_select(&self, _out: &Tensor, _x: &Tensor, _dim: usize, _index: &Tensor) -> Result<()> {
        Ok(())
    }
    fn index_add(&self, _dst: &Tensor, _dim: usize, _index: &Tensor, _src: &Tensor) -> Result<()> {
        Ok(())
    }
    fn gather(&self, _out: &Tensor, _x: &Tensor, _dim: usize, _index: &Tensor) -> Result<()> {
        Ok(())
    }
    fn scatter_add(&self, _out: &Tensor, _dim: usize, _index: &Tensor, _src: &Tensor) -> Result<()> {
        Ok(())
    }
    fn one_hot(&self, _out: &Tensor, _index: &Tensor) -> Result<()> {
        Ok(())
    }
    fn fused(&self, kernel: &FusedKernel, _outputs: &[&Tensor], _inputs: &[&Tensor]) -> Result<f64> {
        // No values: a norm is its identity and no gradient is non-finite.
        Ok(kernel.empty_result())
    }
    fn pointwise_loss(&self, _op: PointwiseLoss, _out: &Tensor, _x: LossOperands<'_>) -> Result<()> {
        Ok(())
    }
    fn pointwise_loss_backward(
        &self,
        _op: PointwiseLoss,
        _wrt: LossGrad,
        _out: &Tensor,
        _grad: &Tensor,
        _x: LossOperands<'_>,
    ) -> Result<()> {
        Ok(())
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    // ------------------------------------------------------------------ normalisation and pooling (normpool)

    fn batch_norm(&self, _args: &crate::backend::BatchNormArgs<'_>) -> Result<()> {
        Ok(())
    }
    fn batch_norm_backward(&self, _args: &crate::backend::BatchNormBackwardArgs<'_>) -> Result<()> {
        Ok(())
    }
    fn group_norm(&self, _args: &crate::backend::GroupNormArgs<'_>) -> Result<()> {
        Ok(())
    }
    fn group_norm_backward(&self, _args: &crate::backend::GroupNormBackwardArgs<'_>) -> Result<()> {
        Ok(())
    }
    fn rms_norm(&self, _args: &crate::backend::RmsNormArgs<'_>) -> Result<()> {
        Ok(())
    }
    fn rms_norm_backward(&self, _args: &crate::backend::RmsNormBackwardArgs<'_>) -> Result<()> {
        Ok(())
    }
    fn max_pool2d(&self, _out: &Tensor, _indices: &Tensor, _x: &Tensor, _pool: &crate::backend::Pool2d) -> Result<()> {
        Ok(())
    }
    fn max_pool2d_backward(
        &self,
        _grad_input: &Tensor,
        _grad_output: &Tensor,
        _indices: &Tensor,
        _pool: &crate::backend::Pool2d,
    ) -> Result<()> {
        Ok(())
    }
    fn avg_pool2d(&self, _out: &Tensor, _x: &Tensor, _pool: &crate::backend::Pool2d) -> Result<()> {
        Ok(())
    }
    fn avg_pool2d_backward(
        &self,
        _grad_input: &Tensor,
        _grad_output: &Tensor,
        _pool: &crate::backend::Pool2d,
    ) -> Result<()> {
        Ok(())
    }
    // ------------------------------------------------------------------ convolution (conv)

    fn im2col(&self, _cols: &Tensor, _x: &Tensor, _geom: &ConvGeometry) -> Result<()> {
        Ok(())
    }
    fn col2im(&self, _x: &Tensor, _cols: &Tensor, _geom: &ConvGeometry) -> Result<()> {
        Ok(())
    }
    // ------------------------------------------------------------------ recurrent cells (rnn)

    fn recurrent_cell(&self, _cell: RecurrentCell, _x: &CellForward<'_>) -> Result<()> {
        Ok(())
    }
    fn recurrent_cell_backward(&self, _cell: RecurrentCell, _x: &CellBackward<'_>) -> Result<()> {
        Ok(())
    }
}
