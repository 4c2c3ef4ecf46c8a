//! The wgpu kernel backend (devices `gpu:<i>`): every kernel is WGSL, compiled once per operand
//! layout class and cached, recorded in program order on the device's queue and run
//! asynchronously; reads back to the host are the synchronisation points.
//!
//! Supported dtypes: f32 (compute), f16 and bf16 (stored, computed in f32 as the CPU backend
//! does), i64 (values within ±2³¹ — indices, labels, counts), i32, u8, bool. f64 has no WGSL type
//! on most GPUs: ops on f64 GPU tensors fail with `UnsupportedDType` (convert to f32 first).
//! Sums and norms accumulate in f32 (the CPU backend uses f64); the conformance suite's
//! tolerances say so.
//!
//! Random numbers and `arange` are computed on the host by `backend/host_side.rs`, the same code
//! the CPU backend runs, and uploaded, so a seeded run gives the same values on `cpu` and
//! `gpu:<i>` (dropout masks included); index values are validated there too.

mod elementwise;
mod fused;
mod index;
mod loss;
mod matmul;
mod recurrent;
mod reduce;
mod runtime;
mod wgsl;
// normalisation and pooling (normpool)
mod norm;
mod plane_kernel;
mod pool;
// convolution (conv)
mod conv;

use std::collections::HashMap;
use std::sync::OnceLock;

use parking_lot::Mutex;

use self::runtime::Runtime;
use crate::backend::ConvGeometry;
use crate::backend::{
    BinaryOp, CellBackward, CellForward, CompareOp, Distribution, FusedKernel, KernelBackend, LayerNormArgs,
    LayerNormBackwardArgs, LayerNormGrads, LogicalOp, LossGrad, LossOperands, Plan, PointwiseLoss, RecurrentCell,
    UnaryOp, check_host_len, host_side,
};
use crate::error::{Result, TensorError};
use crate::random::Generator;
use crate::{DType, Device, Tensor};

/// The kernels of one GPU.
pub struct WgpuBackend {
    device: String,
    /// The runtime, or why the GPU cannot run kernels.
    runtime: std::result::Result<Runtime, String>,
}

/// The backend of `gpu:<index>` (created on first use and kept for the life of the process, as
/// the GPU's context is).
pub fn backend(index: usize) -> &'static WgpuBackend {
    static BACKENDS: OnceLock<Mutex<HashMap<usize, &'static WgpuBackend>>> = OnceLock::new();
    let mut map = BACKENDS.get_or_init(|| Mutex::new(HashMap::new())).lock();
    map.entry(index).or_insert_with(|| {
        let runtime = ferrite_memory::gpu::context(index).map(Runtime::new).map_err(|e| e.to_string());
        Box::leak(Box::new(WgpuBackend { device: format!("gpu:{index}"), runtime }))
    })
}

impl WgpuBackend {
    fn rt(&self, op: &'static str) -> Result<&Runtime> {
        self.runtime.as_ref().map_err(|reason| TensorError::Gpu {
            op,
            device: self.device.clone(),
            detail: reason.clone(),
        })
    }

    /// The runtime, after refusing f64 operands (no WGSL type).
    fn rt_for(&self, op: &'static str, ts: &[&Tensor]) -> Result<&Runtime> {
        if let Some(t) = ts.iter().find(|t| t.dtype() == DType::F64) {
            return Err(TensorError::UnsupportedDType { op, dtype: t.dtype() });
        }
        self.rt(op)
    }
}

impl KernelBackend for WgpuBackend {
    fn name(&self) -> &'static str {
        "wgpu"
    }

    fn write_from_host(&self, dst: &Tensor, bytes: &[u8]) -> Result<()> {
        check_host_len("write", bytes.len(), dst)?;
        if bytes.is_empty() {
            return Ok(());
        }
        let rt = self.rt("write")?;
        let start = dst.storage_offset() * dst.dtype().size_in_bytes();
        let end = start + bytes.len();
        // Buffer copies move whole 32-bit words: a range that does not start on a word, or ends
        // inside a word that other elements of the storage share, goes through a fresh tensor
        // and a lane-wise copy kernel.
        if start.is_multiple_of(4) && (end.is_multiple_of(4) || end == dst.storage().nbytes()) {
            return rt.write(dst, bytes);
        }
        let staging = Tensor::empty_with(dst.storage().allocator(), dst.shape(), dst.dtype())?;
        rt.write(&staging, bytes)?;
        elementwise::copy(rt, dst, &staging)
    }

    fn read_to_host(&self, src: &Tensor, bytes: &mut [u8]) -> Result<()> {
        check_host_len("read", bytes.len(), src)?;
        if bytes.is_empty() {
            return self.synchronize();
        }
        self.rt("read")?.read(src, bytes)
    }

    fn copy(&self, dst: &Tensor, src: &Tensor) -> Result<()> {
        elementwise::copy(self.rt_for("copy_", &[dst, src])?, dst, src)
    }

    fn fill(&self, dst: &Tensor, value: f64) -> Result<()> {
        elementwise::fill(self.rt_for("fill", &[dst])?, dst, value)
    }

    fn arange(&self, dst: &Tensor, start: f64, step: f64) -> Result<()> {
        // Computed on the host exactly as the CPU backend does (f64 arithmetic, then converted),
        // so `arange` gives the same values on every device; uploads are ordered with kernels.
        let host = Tensor::empty(dst.shape(), dst.dtype(), &Device::Cpu)?;
        host_side::arange(&host, start, step)?;
        self.upload_from(dst, &host)
    }

    fn random(&self, dst: &Tensor, dist: Distribution, generator: &Generator) -> Result<()> {
        let host = Tensor::empty(dst.shape(), dst.dtype(), &Device::Cpu)?;
        host_side::random(&host, dist, generator)?;
        self.upload_from(dst, &host)
    }

    fn binary(&self, op: BinaryOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
        elementwise::binary(self.rt_for(op.name(), &[out, a, b])?, op, out, a, b)
    }

    fn binary_scalar(&self, op: BinaryOp, out: &Tensor, a: &Tensor, s: f64) -> Result<()> {
        elementwise::binary_scalar(self.rt_for(op.name(), &[out, a])?, op, out, a, s)
    }

    fn binary_inplace(&self, op: BinaryOp, dst: &Tensor, src: &Tensor) -> Result<()> {
        elementwise::binary_inplace(self.rt_for(op.name(), &[dst, src])?, op, dst, src)
    }

    fn unary(&self, op: UnaryOp, out: &Tensor, x: &Tensor) -> Result<()> {
        elementwise::unary(self.rt_for(op.name(), &[out, x])?, op, out, x)
    }

    fn unary_backward(&self, op: UnaryOp, out: &Tensor, grad: &Tensor, saved: &Tensor) -> Result<()> {
        elementwise::unary_backward(self.rt_for(op.backward_name(), &[out, grad, saved])?, op, out, grad, saved)
    }

    fn clamp(&self, out: &Tensor, x: &Tensor, lo: f64, hi: f64) -> Result<()> {
        elementwise::clamp(self.rt_for("clamp", &[out, x])?, out, x, lo, hi)
    }

    fn compare(&self, op: CompareOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
        elementwise::compare(self.rt_for(op.name(), &[a, b])?, op, out, a, b)
    }

    fn compare_scalar(&self, op: CompareOp, out: &Tensor, a: &Tensor, s: f64) -> Result<()> {
        elementwise::compare_scalar(self.rt_for(op.name(), &[a])?, op, out, a, s)
    }

    fn logical(&self, op: LogicalOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
        elementwise::logical(self.rt("logical")?, op, out, a, b)
    }

    fn where_cond(&self, out: &Tensor, cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
        elementwise::where_cond(self.rt_for("where", &[out, a, b])?, out, cond, a, b)
    }

    fn sum(&self, out: &Tensor, x: &Tensor, plan: &Plan, scale: f64) -> Result<()> {
        reduce::sum(self.rt_for("sum", &[out, x])?, out, x, plan, scale)
    }

    fn arg_extreme(
        &self,
        x: &Tensor,
        plan: &Plan,
        values: Option<&Tensor>,
        indices: &Tensor,
        is_max: bool,
    ) -> Result<()> {
        let op = if is_max { "max" } else { "min" };
        reduce::arg_extreme(self.rt_for(op, &[x])?, x, plan, values, indices, is_max)
    }

    fn var(&self, out: &Tensor, x: &Tensor, plan: &Plan, denom: f64) -> Result<()> {
        reduce::var(self.rt_for("var", &[out, x])?, out, x, plan, denom)
    }

    fn softmax(&self, out: &Tensor, x: &Tensor, log: bool) -> Result<()> {
        reduce::softmax(self.rt_for("softmax", &[out, x])?, out, x, log)
    }

    fn softmax_backward(&self, out: &Tensor, grad: &Tensor, y: &Tensor, log: bool) -> Result<()> {
        reduce::softmax_backward(self.rt_for("softmax_backward", &[out, grad, y])?, out, grad, y, log)
    }

    fn layer_norm(&self, args: &LayerNormArgs<'_>) -> Result<()> {
        reduce::layer_norm(self.rt_for("layer_norm", &[args.y, args.x])?, args)
    }

    fn layer_norm_backward(&self, args: &LayerNormBackwardArgs<'_>) -> Result<Option<LayerNormGrads>> {
        // f64 and other operands the kernels do not take: `None`, and the caller composes.
        norm::layer_norm_backward(self.rt("layer_norm_backward")?, args)
    }

    fn matmul(&self, out: &Tensor, a: &Tensor, b: &Tensor, batch: &[usize]) -> Result<()> {
        matmul::matmul(self.rt_for("matmul", &[out, a, b])?, out, a, b, batch)
    }

    fn check_indices(
        &self,
        index: &Tensor,
        size: usize,
        ignore: Option<i64>,
        dim: usize,
        op: &'static str,
    ) -> Result<()> {
        // Validation needs the values on the host (a synchronisation point, as `.item()` is);
        // the kernels check again on the device and raise the error flag.
        let host = Tensor::empty(index.shape(), index.dtype(), &Device::Cpu)?;
        let src = index.contiguous()?;
        let n = host.nbytes();
        let dst = host.ptr::<u8>(op)?;
        // SAFETY: `host` is a fresh contiguous CPU tensor of `n` bytes that nothing else can
        // reach; the slice lives only for the read.
        let bytes = unsafe { std::slice::from_raw_parts_mut(dst, n) };
        self.read_to_host(&src, bytes)?;
        host_side::check_indices(&host, size, ignore, dim, op)
    }

    fn index_select(&self, out: &Tensor, x: &Tensor, dim: usize, index: &Tensor) -> Result<()> {
        index::index_select(self.rt_for("index_select", &[out, x])?, out, x, dim, index)
    }

    fn index_add(&self, dst: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<()> {
        index::index_add(self.rt_for("index_add", &[dst, src])?, dst, dim, index, src)
    }

    fn gather(&self, out: &Tensor, x: &Tensor, dim: usize, index: &Tensor) -> Result<()> {
        index::gather(self.rt_for("gather", &[out, x])?, out, x, dim, index)
    }

    fn scatter_add(&self, out: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<()> {
        index::scatter_add(self.rt_for("scatter_add", &[out, src])?, out, dim, index, src)
    }

    fn one_hot(&self, out: &Tensor, index: &Tensor) -> Result<()> {
        index::one_hot(self.rt("one_hot")?, out, index)
    }

    fn fused(&self, kernel: &FusedKernel, outputs: &[&Tensor], inputs: &[&Tensor]) -> Result<f64> {
        fused::fused(self.rt(kernel.name())?, kernel, outputs, inputs)
    }

    fn pointwise_loss(&self, op: PointwiseLoss, out: &Tensor, x: LossOperands<'_>) -> Result<()> {
        loss::pointwise_loss(self.rt_for(op.name(), &[out])?, op, out, x)
    }

    fn pointwise_loss_backward(
        &self,
        op: PointwiseLoss,
        wrt: LossGrad,
        out: &Tensor,
        grad: &Tensor,
        x: LossOperands<'_>,
    ) -> Result<()> {
        loss::pointwise_loss_backward(self.rt_for(op.backward_name(), &[out])?, op, wrt, out, grad, x)
    }

    fn synchronize(&self) -> Result<()> {
        self.rt("synchronize")?.synchronize("synchronize")
    }

    // ------------------------------------------------------------------ normalisation and pooling (normpool)

    fn batch_norm(&self, args: &crate::backend::BatchNormArgs<'_>) -> Result<()> {
        let running = match args.params {
            crate::backend::BatchNormStats::Batch { running: Some(r), .. } => [Some(r.mean), Some(r.var)],
            _ => [None, None],
        };
        let ts =
            present(&[Some(args.y), Some(args.x), Some(args.mean), args.weight, args.bias, running[0], running[1]]);
        norm::batch_norm(self.rt_for("batch_norm", &ts)?, args)
    }
    fn batch_norm_backward(&self, args: &crate::backend::BatchNormBackwardArgs<'_>) -> Result<()> {
        let ts = present(&[Some(args.grad_output), Some(args.x), Some(args.mean), args.weight]);
        norm::batch_norm_backward(self.rt_for("batch_norm_backward", &ts)?, args)
    }
    fn group_norm(&self, args: &crate::backend::GroupNormArgs<'_>) -> Result<()> {
        let ts = present(&[Some(args.y), Some(args.x), Some(args.mean), args.weight, args.bias]);
        norm::group_norm(self.rt_for("group_norm", &ts)?, args)
    }
    fn group_norm_backward(&self, args: &crate::backend::GroupNormBackwardArgs<'_>) -> Result<()> {
        let ts = present(&[Some(args.grad_output), Some(args.x), Some(args.mean), args.weight]);
        norm::group_norm_backward(self.rt_for("group_norm_backward", &ts)?, args)
    }
    fn rms_norm(&self, args: &crate::backend::RmsNormArgs<'_>) -> Result<()> {
        let ts = present(&[Some(args.y), Some(args.x), Some(args.rstd), args.weight]);
        norm::rms_norm(self.rt_for("rms_norm", &ts)?, args)
    }
    fn rms_norm_backward(&self, args: &crate::backend::RmsNormBackwardArgs<'_>) -> Result<()> {
        let ts = present(&[Some(args.grad_output), Some(args.x), Some(args.rstd), args.weight]);
        norm::rms_norm_backward(self.rt_for("rms_norm_backward", &ts)?, args)
    }
    fn max_pool2d(&self, out: &Tensor, indices: &Tensor, x: &Tensor, pool: &crate::backend::Pool2d) -> Result<()> {
        pool::max_pool2d(self.rt_for("max_pool2d", &[out, x])?, out, indices, x, pool)
    }
    fn max_pool2d_backward(
        &self,
        grad_input: &Tensor,
        grad_output: &Tensor,
        indices: &Tensor,
        pool: &crate::backend::Pool2d,
    ) -> Result<()> {
        let rt = self.rt_for("max_pool2d_backward", &[grad_input, grad_output])?;
        pool::max_pool2d_backward(rt, grad_input, grad_output, indices, pool)
    }
    fn avg_pool2d(&self, out: &Tensor, x: &Tensor, pool: &crate::backend::Pool2d) -> Result<()> {
        pool::avg_pool2d(self.rt_for("avg_pool2d", &[out, x])?, out, x, pool)
    }
    fn avg_pool2d_backward(
        &self,
        grad_input: &Tensor,
        grad_output: &Tensor,
        pool: &crate::backend::Pool2d,
    ) -> Result<()> {
        pool::avg_pool2d_backward(
            self.rt_for("avg_pool2d_backward", &[grad_input, grad_output])?,
            grad_input,
            grad_output,
            pool,
        )
    }
    // ------------------------------------------------------------------ convolution (conv)

    fn im2col(&self, cols: &Tensor, x: &Tensor, geom: &ConvGeometry) -> Result<()> {
        conv::im2col(self.rt_for("im2col", &[cols, x])?, cols, x, geom)
    }

    fn col2im(&self, x: &Tensor, cols: &Tensor, geom: &ConvGeometry) -> Result<()> {
        conv::col2im(self.rt_for("col2im", &[x, cols])?, x, cols, geom)
    }
    // ------------------------------------------------------------------ recurrent cells (rnn)

    fn recurrent_cell(&self, cell: RecurrentCell, x: &CellForward<'_>) -> Result<()> {
        recurrent::forward(self.rt_for(cell.name(), &[x.h, x.gi])?, cell, x)
    }

    fn recurrent_cell_backward(&self, cell: RecurrentCell, x: &CellBackward<'_>) -> Result<()> {
        recurrent::backward(self.rt_for(cell.backward_name(), &[x.dgi, x.dh])?, cell, x)
    }
}

impl WgpuBackend {
    /// Upload the contiguous CPU tensor `host` into `dst` (same shape and dtype).
    fn upload_from(&self, dst: &Tensor, host: &Tensor) -> Result<()> {
        let n = host.nbytes();
        if n == 0 {
            return Ok(());
        }
        let p = host.ptr::<u8>("write")?;
        // SAFETY: `host` is a contiguous CPU tensor of `n` initialised bytes, borrowed for the call.
        let bytes = unsafe { std::slice::from_raw_parts(p, n) };
        self.write_from_host(dst, bytes)
    }
}

/// The tensors among optional kernel operands (for the f64 check of `rt_for`).
fn present<'a>(ts: &[Option<&'a Tensor>]) -> Vec<&'a Tensor> {
    ts.iter().flatten().copied().collect()
}
