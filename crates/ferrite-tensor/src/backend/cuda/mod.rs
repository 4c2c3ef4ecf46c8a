//! The CUDA kernel backend (devices `cuda:<i>`): the CUDA C kernels of ferrite-cuda launched
//! through a [`CudaRuntime`] chosen once per device — the NVIDIA driver ([`DriverRuntime`]:
//! NVRTC, `cuLaunchKernel`, cuBLAS) or, only when `FERRITE_CUDA_EMULATOR=1`, the host emulator
//! ([`HostRuntime`], the CI path: memory is host memory, kernels run on CPU threads). Memory comes
//! from ferrite-memory's caching allocator on the same device; a tensor's device address is its
//! block's address plus its offset.
//!
//! Supported dtypes: every dtype is stored, copied (layouts and conversions between f32, f16,
//! bf16, i64, i32, u8 and bool), filled, read, written and selected by `where`; comparisons are
//! exact on i64/i32 (int64 kernels) and on u8/bool; arithmetic is f32, with f16 and bf16
//! converted to f32 and back; f64 and integer arithmetic are refused with `UnsupportedDType` (as
//! on `gpu:N`). Sums and norms accumulate in f32. Random numbers and `arange` are computed on the
//! host by `backend/host_side.rs` (the CPU backend's code) and uploaded, so seeded runs match
//! `cpu`. The fused multi-tensor kernels (optimizer steps, GradScaler unscaling, norms and
//! clipping: `fused.rs`), the pointwise losses (`loss.rs`) and the recurrent cells
//! (`recurrent.rs`) run on the device like every other op. Convolutions run as implicit GEMM
//! (`conv_implicit.rs`): no unfolded-image scratch. Work queues on the device's one stream;
//! a device-side error (an index out of range, a class target, a BCE probability outside [0, 1])
//! is the CPU's typed error at the next synchronisation, naming the op (`deferred.rs`).
//!
//! [`DriverRuntime`]: ferrite_cuda::DriverRuntime
//! [`HostRuntime`]: ferrite_cuda::HostRuntime

mod conv_implicit;
mod conv_pool;
mod data;
mod deferred;
mod elementwise;
mod fused;
mod index;
mod launch;
mod loss;
mod matmul;
mod norm;
mod recurrent;
mod reduce;

use std::collections::HashMap;
use std::sync::OnceLock;

use ferrite_cuda::{CudaRuntime, DriverRuntime, HostRuntime};
use parking_lot::Mutex;

use self::launch::Ctx;
use crate::backend::{
    BatchNormArgs, BatchNormBackwardArgs, BinaryOp, CellBackward, CellForward, CompareOp, ConvGeometry, Distribution,
    FusedKernel, GroupNormArgs, GroupNormBackwardArgs, KernelBackend, LayerNormArgs, LayerNormBackwardArgs,
    LayerNormGrads, LogicalOp, LossGrad, LossOperands, Plan, PointwiseLoss, Pool2d, RecurrentCell, RmsNormArgs,
    RmsNormBackwardArgs, UnaryOp, check_host_len, host_side,
};
use crate::error::{Result, TensorError};
use crate::random::Generator;
use crate::{Device, Tensor};

/// The kernels of one CUDA device.
pub struct CudaBackend {
    device: String,
    /// The runtime, or why the device cannot run kernels.
    runtime: std::result::Result<Box<dyn CudaRuntime>, String>,
    /// Device-side checks queued until the next synchronisation.
    deferred: deferred::Deferred,
}

/// The backend of `cuda:<index>` (created on first use and kept for the process, as the
/// device's context is).
pub fn backend(index: usize) -> &'static CudaBackend {
    static BACKENDS: OnceLock<Mutex<HashMap<usize, &'static CudaBackend>>> = OnceLock::new();
    let mut map = BACKENDS.get_or_init(|| Mutex::new(HashMap::new())).lock();
    map.entry(index).or_insert_with(|| {
        let device = Device::Cuda { index }.to_string();
        let runtime = open_runtime(index).map_err(|e| e.to_string());
        Box::leak(Box::new(CudaBackend { device, runtime, deferred: deferred::Deferred::default() }))
    })
}

/// The runtime of `cuda:<index>`: the host emulator under `FERRITE_CUDA_EMULATOR=1` (for the one
/// emulated device), else the driver.
fn open_runtime(index: usize) -> std::result::Result<Box<dyn CudaRuntime>, TensorError> {
    if ferrite_memory::cuda::emulator_enabled() {
        ferrite_memory::cuda::cuda_ordinal(index)?;
        return Ok(Box::new(HostRuntime::new(&Device::Cuda { index }.to_string())));
    }
    DriverRuntime::open(index).map(|r| Box::new(r) as Box<dyn CudaRuntime>).map_err(|e| TensorError::Cuda {
        op: "open",
        device: Device::Cuda { index }.to_string(),
        detail: e.to_string(),
    })
}

impl CudaBackend {
    /// Error unless the device can run kernels (what `Storage::new` asks before the first
    /// tensor of the device exists).
    pub(crate) fn check_usable(&self) -> Result<()> {
        self.cx("allocate").map(|_| ())
    }

    fn cx(&self, op: &'static str) -> Result<Ctx<'_>> {
        match &self.runtime {
            Ok(rt) => Ok(Ctx { rt: rt.as_ref(), device: &self.device, deferred: &self.deferred }),
            Err(reason) => Err(TensorError::Cuda { op, device: self.device.clone(), detail: reason.clone() }),
        }
    }
}

impl KernelBackend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn write_from_host(&self, dst: &Tensor, bytes: &[u8]) -> Result<()> {
        check_host_len("write", bytes.len(), dst)?;
        data::write(self.cx("write")?, dst, bytes)
    }

    fn read_to_host(&self, src: &Tensor, bytes: &mut [u8]) -> Result<()> {
        check_host_len("read", bytes.len(), src)?;
        data::read(self.cx("read")?, src, bytes)
    }

    fn copy(&self, dst: &Tensor, src: &Tensor) -> Result<()> {
        data::copy(self.cx("copy_")?, dst, src)
    }

    fn fill(&self, dst: &Tensor, value: f64) -> Result<()> {
        data::fill(self.cx("fill")?, dst, value)
    }

    fn arange(&self, dst: &Tensor, start: f64, step: f64) -> Result<()> {
        // Computed on the host as the CPU backend does, then uploaded: the same values everywhere.
        data::arange(self.cx("arange")?, dst, start, step)
    }

    fn random(&self, dst: &Tensor, dist: Distribution, generator: &Generator) -> Result<()> {
        let cx = self.cx("rand")?;
        let host = Tensor::empty(dst.shape(), dst.dtype(), &Device::Cpu)?;
        host_side::random(&host, dist, generator)?;
        data::upload(cx, dst, &host)
    }

    fn binary(&self, op: BinaryOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
        elementwise::binary(self.cx(op.name())?, op, out, a, b)
    }

    fn binary_scalar(&self, op: BinaryOp, out: &Tensor, a: &Tensor, s: f64) -> Result<()> {
        elementwise::binary_scalar(self.cx(op.name())?, op, out, a, s)
    }

    fn binary_inplace(&self, op: BinaryOp, dst: &Tensor, src: &Tensor) -> Result<()> {
        elementwise::binary_inplace(self.cx(op.name())?, op, dst, src)
    }

    fn unary(&self, op: UnaryOp, out: &Tensor, x: &Tensor) -> Result<()> {
        elementwise::unary(self.cx(op.name())?, op, out, x)
    }

    fn unary_backward(&self, op: UnaryOp, out: &Tensor, grad: &Tensor, saved: &Tensor) -> Result<()> {
        elementwise::unary_backward(self.cx(op.backward_name())?, op, out, grad, saved)
    }

    fn clamp(&self, out: &Tensor, x: &Tensor, lo: f64, hi: f64) -> Result<()> {
        elementwise::clamp(self.cx("clamp")?, out, x, lo, hi)
    }

    fn compare(&self, op: CompareOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
        elementwise::compare(self.cx(op.name())?, op, out, a, b)
    }

    fn compare_scalar(&self, op: CompareOp, out: &Tensor, a: &Tensor, s: f64) -> Result<()> {
        elementwise::compare_scalar(self.cx(op.name())?, op, out, a, s)
    }

    fn logical(&self, op: LogicalOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
        elementwise::logical(self.cx("logical")?, op, out, a, b)
    }

    fn where_cond(&self, out: &Tensor, cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
        elementwise::where_cond(self.cx("where")?, out, cond, a, b)
    }

    fn sum(&self, out: &Tensor, x: &Tensor, plan: &Plan, scale: f64) -> Result<()> {
        reduce::sum(self.cx("sum")?, out, x, plan, scale)
    }

    fn arg_extreme(
        &self,
        x: &Tensor,
        plan: &Plan,
        values: Option<&Tensor>,
        indices: &Tensor,
        is_max: bool,
    ) -> Result<()> {
        reduce::arg_extreme(self.cx(if is_max { "max" } else { "min" })?, x, plan, values, indices, is_max)
    }

    fn var(&self, out: &Tensor, x: &Tensor, plan: &Plan, denom: f64) -> Result<()> {
        reduce::var(self.cx("var")?, out, x, plan, denom)
    }

    fn softmax(&self, out: &Tensor, x: &Tensor, log: bool) -> Result<()> {
        reduce::softmax(self.cx("softmax")?, out, x, log)
    }

    fn softmax_backward(&self, out: &Tensor, grad: &Tensor, y: &Tensor, log: bool) -> Result<()> {
        reduce::softmax_backward(self.cx("softmax_backward")?, out, grad, y, log)
    }

    fn layer_norm(&self, args: &LayerNormArgs<'_>) -> Result<()> {
        reduce::layer_norm(self.cx("layer_norm")?, args)
    }

    fn layer_norm_backward(&self, args: &LayerNormBackwardArgs<'_>) -> Result<Option<LayerNormGrads>> {
        norm::layer_norm_backward(self.cx("layer_norm_backward")?, args)
    }

    fn matmul(&self, out: &Tensor, a: &Tensor, b: &Tensor, batch: &[usize]) -> Result<()> {
        matmul::matmul(self.cx("matmul")?, out, a, b, batch)
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
        // Checked on the device; a bad value is reported at the next synchronisation.
        index::check_indices(self.cx(op)?, index, size, ignore, dim, op)
    }

    fn index_select(&self, out: &Tensor, x: &Tensor, dim: usize, index: &Tensor) -> Result<()> {
        index::index_select(self.cx("index_select")?, out, x, dim, index)
    }

    fn index_add(&self, dst: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<()> {
        index::index_add(self.cx("index_add")?, dst, dim, index, src)
    }

    fn gather(&self, out: &Tensor, x: &Tensor, dim: usize, index: &Tensor) -> Result<()> {
        index::gather(self.cx("gather")?, out, x, dim, index)
    }

    fn scatter_add(&self, out: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<()> {
        index::scatter_add(self.cx("scatter_add")?, out, dim, index, src)
    }

    fn one_hot(&self, out: &Tensor, index: &Tensor) -> Result<()> {
        index::one_hot(self.cx("one_hot")?, out, index)
    }

    fn fused(&self, kernel: &FusedKernel, outputs: &[&Tensor], inputs: &[&Tensor]) -> Result<f64> {
        fused::fused(self.cx(kernel.name())?, kernel, outputs, inputs)
    }

    fn pointwise_loss(&self, op: PointwiseLoss, out: &Tensor, x: LossOperands<'_>) -> Result<()> {
        loss::pointwise_loss(self.cx(op.name())?, op, out, x)
    }

    fn pointwise_loss_backward(
        &self,
        op: PointwiseLoss,
        wrt: LossGrad,
        out: &Tensor,
        grad: &Tensor,
        x: LossOperands<'_>,
    ) -> Result<()> {
        loss::pointwise_loss_backward(self.cx(op.backward_name())?, op, wrt, out, grad, x)
    }

    fn synchronize(&self) -> Result<()> {
        let cx = self.cx("synchronize")?;
        cx.rt.synchronize().map_err(|e| cx.fail("synchronize", e))?;
        cx.drain()
    }

    fn batch_norm(&self, args: &BatchNormArgs<'_>) -> Result<()> {
        norm::batch_norm(self.cx("batch_norm")?, args)
    }

    fn batch_norm_backward(&self, args: &BatchNormBackwardArgs<'_>) -> Result<()> {
        norm::batch_norm_backward(self.cx("batch_norm_backward")?, args)
    }

    fn group_norm(&self, args: &GroupNormArgs<'_>) -> Result<()> {
        norm::group_norm(self.cx("group_norm")?, args)
    }

    fn group_norm_backward(&self, args: &GroupNormBackwardArgs<'_>) -> Result<()> {
        norm::group_norm_backward(self.cx("group_norm_backward")?, args)
    }

    fn rms_norm(&self, args: &RmsNormArgs<'_>) -> Result<()> {
        norm::rms_norm(self.cx("rms_norm")?, args)
    }

    fn rms_norm_backward(&self, args: &RmsNormBackwardArgs<'_>) -> Result<()> {
        norm::rms_norm_backward(self.cx("rms_norm_backward")?, args)
    }

    fn max_pool2d(&self, out: &Tensor, indices: &Tensor, x: &Tensor, pool: &Pool2d) -> Result<()> {
        conv_pool::max_pool2d(self.cx("max_pool2d")?, out, indices, x, pool)
    }

    fn max_pool2d_backward(
        &self,
        grad_input: &Tensor,
        grad_output: &Tensor,
        indices: &Tensor,
        pool: &Pool2d,
    ) -> Result<()> {
        conv_pool::max_pool2d_backward(self.cx("max_pool2d_backward")?, grad_input, grad_output, indices, pool)
    }

    fn avg_pool2d(&self, out: &Tensor, x: &Tensor, pool: &Pool2d) -> Result<()> {
        conv_pool::avg_pool2d(self.cx("avg_pool2d")?, out, x, pool)
    }

    fn avg_pool2d_backward(&self, grad_input: &Tensor, grad_output: &Tensor, pool: &Pool2d) -> Result<()> {
        conv_pool::avg_pool2d_backward(self.cx("avg_pool2d_backward")?, grad_input, grad_output, pool)
    }

    fn im2col(&self, cols: &Tensor, x: &Tensor, geom: &ConvGeometry) -> Result<()> {
        conv_pool::im2col(self.cx("im2col")?, cols, x, geom)
    }

    fn col2im(&self, x: &Tensor, cols: &Tensor, geom: &ConvGeometry) -> Result<()> {
        conv_pool::col2im(self.cx("col2im")?, x, cols, geom)
    }

    fn conv_unfold_product(&self, img: &Tensor, a3: &Tensor, geom: &ConvGeometry, groups: usize) -> Result<Tensor> {
        conv_implicit::unfold_product(self.cx("conv_forward")?, img, a3, geom, groups)
    }

    fn conv_product_fold(
        &self,
        a3: &Tensor,
        y: &Tensor,
        geom: &ConvGeometry,
        groups: usize,
        img_shape: &[usize],
    ) -> Result<Tensor> {
        conv_implicit::product_fold(self.cx("conv_input_grad")?, a3, y, geom, groups, img_shape)
    }

    fn conv_weight_product(&self, y: &Tensor, img: &Tensor, geom: &ConvGeometry, groups: usize) -> Result<Tensor> {
        conv_implicit::weight_product(self.cx("conv_weight_grad")?, y, img, geom, groups)
    }

    fn recurrent_cell(&self, cell: RecurrentCell, x: &CellForward<'_>) -> Result<()> {
        recurrent::forward(self.cx(cell.name())?, cell, x)
    }

    fn recurrent_cell_backward(&self, cell: RecurrentCell, x: &CellBackward<'_>) -> Result<()> {
        recurrent::backward(self.cx(cell.backward_name())?, cell, x)
    }
}
