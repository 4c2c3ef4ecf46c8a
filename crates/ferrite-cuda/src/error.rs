//! The one error type of the CUDA crate.
use thiserror::Error;

/// Every failure of the CUDA backend; each says what to do.
#[derive(Debug, Error)]
pub enum CudaError {
    /// NVRTC (the run-time CUDA C compiler) is not installed where ferrite looks.
    #[error(
        "NVRTC (libnvrtc) was not found; looked in: {searched}. Install it with `python3 -m pip install nvidia-cuda-nvrtc` or a CUDA toolkit, or set {env} to the path of libnvrtc.so"
    )]
    NvrtcNotFound { searched: String, env: &'static str },
    /// A library file was found but could not be loaded.
    #[error("cannot load {path}: {reason}")]
    NvrtcUnloadable { path: String, reason: String },
    /// A kernel source did not compile (or compiled with warnings, which ferrite treats as
    /// errors); the log is NVRTC's.
    #[error("kernel source {source_name} does not compile for {arch}:\n{log}")]
    CompileFailed { source_name: String, arch: String, log: String },
    /// An NVRTC call failed outside compilation.
    #[error("{call} failed: {reason}")]
    Nvrtc { call: &'static str, reason: String },
    /// The host emulator's C++ compiler could not be run.
    #[error(
        "the host C++ compiler `{compiler}` could not be run ({reason}); the CUDA kernels' host \
         emulator needs a C++20 compiler: install g++ (`apt-get install g++`) or set CXX"
    )]
    HostCompilerMissing { compiler: String, reason: String },
    /// A kernel source did not compile for the host emulator.
    #[error("kernel source {source_name} does not compile for the host emulator:\n{log}")]
    HostCompile { source_name: String, log: String },
    /// A launch named a kernel its source does not define.
    #[error("kernel `{kernel}` is not one of {source_name}'s kernels")]
    NoSuchKernel { kernel: String, source_name: String },
    /// A CUDA driver call of the runtime failed.
    #[error(
        "{device}: {call} failed ({code}); the device or its context is unusable — check `nvidia-smi`, or run on `cpu` or `gpu:N`"
    )]
    Driver { device: String, call: &'static str, code: String },
    /// The device cannot run kernels at all (no driver, no such device, …); `reason` says why
    /// and what to do.
    #[error("{device} cannot run CUDA kernels: {reason}")]
    DeviceUnavailable { device: String, reason: String },
    /// cuBLAS (the GEMMs of matmul) could not be loaded.
    #[error(
        "{device}: cuBLAS (libcublas) was not found; install it with `python3 -m pip install nvidia-cublas` or a CUDA toolkit (and put its lib directory on LD_LIBRARY_PATH)"
    )]
    CublasNotFound { device: String },
    /// A cuBLAS call failed.
    #[error("{device}: {call} failed with {status}")]
    Cublas { device: String, call: &'static str, status: String },
    /// A GEMM dimension beyond cuBLAS's 32-bit `int`.
    #[error("{device}: the GEMM's {what} = {value} exceeds cuBLAS's 32-bit limit; split the product")]
    GemmTooLarge { device: String, what: &'static str, value: usize },
}
