//! The kernel-backend seam: where an op's arithmetic runs.
//!
//! An op is defined once in `ops/` (or `functional/`): its shape rule, its dtype rule, the
//! allocation of its output through the device's caching allocator, and its backward. Only the
//! arithmetic is handed to the [`KernelBackend`] of the output's device, which *writes into
//! outputs it is given* and never allocates the tensors an op returns. That keeps ferrite's
//! invariant — a `meta` run makes exactly the allocations a real run makes — on every device, and
//! keeps autograd, nn, optim, data and io unaware of which backend ran a kernel.
//!
//! A device is a pair (memory, kernels), declared in one table:
//!
//! | device        | memory (`ferrite_memory::raw_memory`)  | kernels                  |
//! |---------------|----------------------------------------|--------------------------|
//! | `cpu`         | host                                   | [`cpu::CpuBackend`]      |
//! | `sim:<gpu>`   | host, with the GPU's capacity          | [`cpu::CpuBackend`]      |
//! | `meta`        | addresses only                         | [`meta::MetaBackend`]    |
//! | `gpu:<i>`     | wgpu buffers                           | [`gpu::WgpuBackend`]     |
//! | `cuda:<i>`    | CUDA driver (or the emulated device)   | [`cuda::CudaBackend`]    |
//!
//! Adding a backend: implement [`KernelBackend`] (every method without a default, which the
//! compiler lists; the defaults are optional fast paths, among them the three convolution products
//! whose default is unfold + GEMM, `conv_products.rs`), give its device a `RawMemory` in
//! ferrite-memory, and add its row to [`kernels_for`]. The PyTorch conformance suite then runs on it from the same test code.
//!
//! Contract of every method: the op layer has already validated shapes, dtypes and devices, made
//! operand dtypes agree where the op needs it, and allocated every output on the same device.
//! `out` arguments are fresh contiguous tensors unless a method says otherwise (the convolution
//! products allocate their own results and scratch: that choice is their point); inputs may be
//! strided and broadcast (zero strides). A backend may run kernels asynchronously: anything
//! that reads data back to the host ([`KernelBackend::read_to_host`], [`FusedKernel`] results)
//! is a synchronisation point.
//!
//! Where things are: the trait in `kernel_backend.rs`; the operand types it takes, one file per
//! family (`elementwise_ops.rs`, `reduce_plan.rs`, `fused_kernel.rs`, `index_dtypes.rs`,
//! `loss_operands.rs`, `recurrent_operands.rs`, `norm_args.rs`, `pool_window.rs`,
//! `conv_geometry.rs`); the default convolution products (unfold + GEMM) in `conv_products.rs`; the
//! kernels computed on the host for every backend in `host_side.rs`; the
//! backends in `cpu/`, `meta.rs` and `gpu/`; and here the device → backend table and cross-device
//! transfers. `ops/` and `functional/` depend on this module; nothing here depends on them.

mod conv_geometry;
pub mod conv_products;
pub(crate) mod cpu;
pub(crate) mod cuda;
mod elementwise_ops;
mod fused_kernel;
#[cfg(feature = "gpu")]
pub(crate) mod gpu;
pub(crate) mod host_side;
mod index_dtypes;
mod kernel_backend;
mod loss_operands;
pub(crate) mod meta;
mod norm_args;
mod pool_window;
mod recurrent_operands;
mod reduce_plan;

use ferrite_memory::Device;

use crate::Tensor;
use crate::error::{Result, TensorError};

pub use conv_geometry::ConvGeometry;
pub use conv_products::UNFOLD_BUDGET;
pub use elementwise_ops::{BinaryOp, CompareOp, Distribution, LogicalOp, UnaryOp};
pub use fused_kernel::{FUSED_CHUNK, FusedKernel, NormKind};
pub(crate) use index_dtypes::INDEX_DTYPES;
pub(crate) use kernel_backend::check_host_len;
pub use kernel_backend::{KernelBackend, PreparedRhs, rows_cols};
pub use loss_operands::{LossGrad, LossOperands, PointwiseLoss};
pub use norm_args::{
    BatchNormArgs, BatchNormBackwardArgs, BatchNormBackwardParams, BatchNormStats, GroupNormArgs,
    GroupNormBackwardArgs, GroupNormParams, LayerNormArgs, LayerNormBackwardArgs, LayerNormGrads, LayerNormParams,
    NormArgs, NormBackwardArgs, RmsNormArgs, RmsNormBackwardArgs, RunningStats, ncs,
};
pub use pool_window::{AvgWindow, Pool2d, PoolKind, adaptive_end, adaptive_start, pool_output_size};
pub use recurrent_operands::{CellBackward, CellForward, RecurrentCell};
pub use reduce_plan::Plan;

/// Copy the contiguous `src` into the contiguous `dst` of the same shape and dtype on another
/// device: through the backend of whichever side is not in host memory, else through a staging
/// buffer on the host.
pub(crate) fn transfer(dst: &Tensor, src: &Tensor) -> Result<()> {
    let n = dst.nbytes();
    if dst.is_meta() || n == 0 {
        return Ok(());
    }
    if src.is_meta() {
        return Err(TensorError::MetaHasNoData { op: "to_device" });
    }
    match (src.storage().ptr(), dst.storage().ptr()) {
        (Some(_), _) => {
            let s = src.ptr::<u8>("to_device")?;
            // SAFETY: `src` is a contiguous tensor of `n` initialised bytes in host memory that
            // stays alive (borrowed) for the duration of the call.
            let bytes = unsafe { std::slice::from_raw_parts(s, n) };
            dst.kernels().write_from_host(dst, bytes)
        }
        (None, Some(_)) => {
            let d = dst.ptr::<u8>("to_device")?;
            // SAFETY: `dst` is a fresh contiguous tensor of `n` bytes in host memory that no
            // other handle can reach yet.
            let bytes = unsafe { std::slice::from_raw_parts_mut(d, n) };
            src.kernels().read_to_host(src, bytes)
        }
        (None, None) => {
            let mut staging = vec![0u8; n];
            src.kernels().read_to_host(src, &mut staging)?;
            dst.kernels().write_from_host(dst, &staging)
        }
    }
}

/// The kernels that compute on `device`'s memory.
///
/// In a build without the `gpu` feature no storage can live on a `gpu:N` (`Storage::new` refuses
/// it with `GpuNotCompiled` before asking for kernels, and the allocator refuses it too); the
/// arm answers the meta backend, which computes nothing, so that this function stays total.
pub fn kernels_for(device: &Device) -> &'static dyn KernelBackend {
    match device {
        Device::Cpu | Device::Sim { .. } => &cpu::CpuBackend,
        Device::Meta => &meta::MetaBackend,
        #[cfg(feature = "gpu")]
        Device::Gpu { index } => gpu::backend(*index),
        #[cfg(not(feature = "gpu"))]
        Device::Gpu { .. } => &meta::MetaBackend,
        Device::Cuda { index } => cuda::backend(*index),
    }
}
