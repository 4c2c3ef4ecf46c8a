//! The seam between the `cuda:N` kernel backend and whatever runs its kernels: [`CudaRuntime`].
//!
//! Why a trait: the backend (in ferrite-tensor) is the same code whether a kernel runs on an
//! NVIDIA GPU ([`crate::DriverRuntime`]: NVRTC, the driver API, cuBLAS) or on the CPU through the
//! host emulator ([`crate::HostRuntime`], what CI runs with `FERRITE_CUDA_EMULATOR=1`). The
//! backend only ever sees device addresses, kernel launches by name with [`KernelArg`] arrays,
//! copies, a synchronisation and one GEMM — exactly what a GPU offers — so everything above the
//! runtime is checked on machines without a GPU.
use crate::CudaError;
use crate::kernel_arg::KernelArg;
use crate::kernel_sources::KernelSource;

/// The environment variable that allows TF32 tensor cores in f32 GEMMs on a real GPU (`1`);
/// off by default, as PyTorch's `torch.backends.cuda.matmul.allow_tf32 = False`.
pub const ALLOW_TF32_ENV: &str = "FERRITE_ALLOW_TF32";

/// The element type of a GEMM's `A`, `B` and `C`. Whatever it is, products accumulate in f32
/// and `alpha`/`beta` are f32 (cuBLAS's `CUBLAS_COMPUTE_32F`, PyTorch's f16/bf16 matmul on CUDA):
/// half-precision operands go to the tensor cores without an f32 copy, and `C` is rounded once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmElement {
    F32,
    F16,
    Bf16,
}

/// One strided-batched GEMM with cuBLAS's arguments and column-major meaning: for each
/// `i < batch`, `C_i = alpha · op(A_i) · op(B_i) + beta · C_i`, where `C_i` is `m × n` at
/// `c + i·stride_c` (element `(r, s)` at `r + s·ldc`), `op(A_i)` is `m × k` (`A_i` stored
/// `m × k` with leading dimension `lda`, or `k × m` when `trans_a`), `op(B_i)` is `k × n`.
/// Addresses are device addresses; strides and leading dimensions count elements of `element`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmStridedBatched {
    pub element: GemmElement,
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub alpha: f32,
    pub a: u64,
    pub lda: usize,
    pub stride_a: usize,
    pub b: u64,
    pub ldb: usize,
    pub stride_b: usize,
    pub beta: f32,
    pub c: u64,
    pub ldc: usize,
    pub stride_c: usize,
    pub batch: usize,
}

/// What the `cuda:N` backend needs from a device. Every call is ordered after the calls before
/// it (one stream); [`CudaRuntime::synchronize`] waits for all of them.
pub trait CudaRuntime: Send + Sync {
    /// `cuda:N`, for messages.
    fn device(&self) -> &str;

    /// Whether kernels run on the host emulator (the backend then launches small grids: each GPU
    /// thread is an OS thread there).
    fn is_emulated(&self) -> bool;

    /// Runs `kernel` of `source` as `grid` blocks of `block` threads.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters (count and types) and every address in them
    /// must be valid device memory for what the kernel reads and writes until the work is done.
    unsafe fn launch(
        &self,
        source: &KernelSource,
        kernel: &str,
        grid: u32,
        block: u32,
        args: &[KernelArg],
    ) -> Result<(), CudaError>;

    /// Copies `src` to the device at `dst` (complete when this returns: `src` may be reused).
    ///
    /// # Safety
    /// `dst .. dst + src.len()` must be device memory this runtime may write.
    unsafe fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<(), CudaError>;

    /// Copies device bytes at `src` into `dst`, after all work queued before it.
    ///
    /// # Safety
    /// `src .. src + dst.len()` must be device memory this runtime may read.
    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64) -> Result<(), CudaError>;

    /// Copies `bytes` device bytes from `src` to `dst` (non-overlapping), in stream order.
    ///
    /// # Safety
    /// Both ranges must be device memory of this runtime.
    unsafe fn copy_on_device(&self, dst: u64, src: u64, bytes: usize) -> Result<(), CudaError>;

    /// Waits for every call queued so far.
    fn synchronize(&self) -> Result<(), CudaError>;

    /// Queues the GEMM `g` (see [`GemmStridedBatched`]).
    ///
    /// # Safety
    /// Every matrix `g` describes must be valid device memory (`c` writable).
    unsafe fn gemm_strided_batched(&self, g: &GemmStridedBatched) -> Result<(), CudaError>;
}
