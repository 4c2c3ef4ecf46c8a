//! NVIDIA GPUs for ferrite: the CUDA C kernels of the CUDA backend and their compilation at run
//! time through NVRTC.
//!
//! Why run-time compilation: the project must build on a machine with no CUDA toolkit and no
//! driver (the main command included), and a kernel compiled for the architecture of the GPU at
//! hand is what PyTorch's JIT paths and cuBLAS give a user. The kernel sources live in
//! `kernels/*.cu` ([`KERNEL_SOURCES`]); NVRTC is loaded at run time ([`Nvrtc::load`]) from a CUDA
//! installation or from the `nvidia-cuda-nvrtc` Python wheel, so CI — with no GPU and no driver —
//! compiles every kernel for `sm_80` and `sm_90` on every submission and fails on any error or
//! warning (`tests/nvrtc_compile.rs`), and runs every kernel on the CPU ([`HostModule`], the
//! host emulator of `emulator/cuda_on_host.h`) against PyTorch's numbers
//! (`tests/kernels_on_host.rs`). A launch is an array of [`KernelArg`]s, the form
//! `cuLaunchKernel` takes, so the same launch code serves a GPU and the emulator.
//!
//! The memory side of CUDA (the caching allocator on the driver API) is
//! `ferrite_memory::cuda`. The `cuda:N` kernel backend (in ferrite-tensor) launches them through a [`CudaRuntime`]: the
//! real driver ([`DriverRuntime`]) or the host emulator ([`HostRuntime`]).
mod driver_runtime;
mod error;
mod host_module;
mod host_runtime;
mod kernel_arg;
mod kernel_sources;
mod nvrtc;
pub mod records;
mod runtime;

pub use driver_runtime::DriverRuntime;
pub use error::CudaError;
pub use host_module::{CXX_ENV, HostModule};
pub use host_runtime::HostRuntime;
pub use kernel_arg::{KernelArg, param_array};
pub use kernel_sources::{KERNEL_SOURCES, KernelSource};
pub use nvrtc::{Compiled, NVRTC_ENV, Nvrtc};
pub use runtime::{ALLOW_TF32_ENV, CudaRuntime, GemmElement, GemmStridedBatched};
