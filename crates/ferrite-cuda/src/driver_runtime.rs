//! [`CudaRuntime`] on an NVIDIA GPU: kernels compiled by NVRTC for the device's architecture and
//! loaded with `cuModuleLoadData` (once per source, kept), launched with `cuLaunchKernel` on one
//! stream of the device's primary context (the context ferrite-memory's caching allocator uses);
//! copies with `cuMemcpy*Async` on that stream; f32 GEMMs through cuBLAS
//! (`cublasSgemmStridedBatched`), TF32 off unless `FERRITE_ALLOW_TF32=1`.
//!
//! Everything is loaded at run time (libcuda, libnvrtc, libcublas): the crate builds without
//! CUDA, and a machine without a driver gets a typed [`CudaError`] from [`DriverRuntime::open`],
//! never cudarc's panic (the driver library is checked by `ferrite_memory::cuda::driver` first,
//! cuBLAS by `is_culib_present` before its first use).
use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::{Mutex, OnceLock};

use cudarc::cublas::sys as cublas;
use cudarc::driver::sys;

use crate::CudaError;
use crate::kernel_arg::{KernelArg, param_array};
use crate::kernel_sources::KernelSource;
use crate::nvrtc::Nvrtc;
use crate::runtime::{ALLOW_TF32_ENV, CudaRuntime, GemmElement, GemmStridedBatched};

/// A loaded module and the functions looked up in it.
struct Module {
    module: sys::CUmodule,
    functions: HashMap<String, sys::CUfunction>,
}

/// Driver handles shared by the calls (behind one mutex: the driver serialises a stream anyway).
struct State {
    modules: HashMap<&'static str, Module>,
    cublas: Option<cublas::cublasHandle_t>,
}

/// One `cuda:N` on the real driver.
pub struct DriverRuntime {
    device: String,
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    /// `sm_XY` of the device, what NVRTC compiles for.
    arch: String,
    state: Mutex<State>,
}

// SAFETY: the context is the process-wide primary context, made current before every call; the
// stream, modules, functions and cuBLAS handle are driver handles valid from any thread of the
// process, and every use of the mutable ones goes through the mutex.
unsafe impl Send for DriverRuntime {}
// SAFETY: as above.
unsafe impl Sync for DriverRuntime {}

/// `Ok` for `CUDA_SUCCESS`, else the typed error naming the call.
fn check(device: &str, call: &'static str, r: sys::CUresult) -> Result<(), CudaError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Driver { device: device.to_string(), call, code: format!("{r:?}") })
    }
}

impl DriverRuntime {
    /// The runtime of `cuda:index`, or why the device cannot run kernels (no driver, no such
    /// device, a failing context).
    pub fn open(index: usize) -> Result<DriverRuntime, CudaError> {
        let device = format!("cuda:{index}");
        let unusable = |e: ferrite_memory::MemoryError| CudaError::DeviceUnavailable {
            device: device.clone(),
            reason: e.to_string(),
        };
        ferrite_memory::cuda::driver().map_err(|p| unusable(p.for_device(&device)))?;
        let ordinal = ferrite_memory::cuda::cuda_ordinal(index).map_err(unusable)?;
        let ctx = ferrite_memory::cuda::context(ordinal).map_err(|e| CudaError::Driver {
            device: device.clone(),
            call: e.call,
            code: e.name.clone(),
        })?;
        let mut dev: sys::CUdevice = 0;
        // SAFETY: the driver is initialised (checked above); valid out-pointer.
        check(&device, "cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, ordinal as i32) })?;
        let attr = |a: sys::CUdevice_attribute| -> Result<i32, CudaError> {
            let mut v = 0i32;
            // SAFETY: `dev` comes from cuDeviceGet; valid out-pointer.
            check(&device, "cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) })?;
            Ok(v)
        };
        use sys::CUdevice_attribute::*;
        let arch = format!(
            "sm_{}{}",
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?
        );
        let mut stream: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the context is current (`context` made it so); valid out-pointer.
        check(&device, "cuStreamCreate", unsafe { sys::cuStreamCreate(&mut stream, flags) })?;
        Ok(DriverRuntime {
            device,
            ctx,
            stream,
            arch,
            state: Mutex::new(State { modules: HashMap::new(), cublas: None }),
        })
    }

    fn current(&self) -> Result<(), CudaError> {
        // SAFETY: `ctx` is a retained primary context, valid for the process.
        check(&self.device, "cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The function `kernel` of `source`, compiling and loading the source on first use.
    fn function(&self, source: &KernelSource, kernel: &str) -> Result<sys::CUfunction, CudaError> {
        if !source.kernels.contains(&kernel) {
            return Err(CudaError::NoSuchKernel { kernel: kernel.to_string(), source_name: source.name.to_string() });
        }
        let mut state = self.state();
        if !state.modules.contains_key(source.name) {
            let compiled = Nvrtc::load()?.compile(source, &self.arch)?;
            let mut module: sys::CUmodule = std::ptr::null_mut();
            // SAFETY: the context is current; `cubin` is a complete cubin NVRTC produced, alive
            // for the call.
            check(&self.device, "cuModuleLoadData", unsafe {
                sys::cuModuleLoadData(&mut module, compiled.cubin.as_ptr() as *const c_void)
            })?;
            state.modules.insert(source.name, Module { module, functions: HashMap::new() });
        }
        let Some(m) = state.modules.get_mut(source.name) else {
            return Err(CudaError::NoSuchKernel { kernel: kernel.to_string(), source_name: source.name.to_string() });
        };
        if let Some(f) = m.functions.get(kernel) {
            return Ok(*f);
        }
        let name = CString::new(kernel).map_err(|_| CudaError::NoSuchKernel {
            kernel: kernel.to_string(),
            source_name: source.name.to_string(),
        })?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: `module` was loaded in this context; `name` is NUL-terminated; valid out-pointer.
        check(&self.device, "cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut f, m.module, name.as_ptr())
        })?;
        m.functions.insert(kernel.to_string(), f);
        Ok(f)
    }

    /// The cuBLAS handle (created on first use, bound to the stream, TF32 as configured).
    fn cublas(&self) -> Result<cublas::cublasHandle_t, CudaError> {
        let mut state = self.state();
        if let Some(h) = state.cublas {
            return Ok(h);
        }
        // SAFETY: only checks whether the library can be loaded.
        if !unsafe { cublas::is_culib_present() } {
            return Err(CudaError::CublasNotFound { device: self.device.clone() });
        }
        let mut h: cublas::cublasHandle_t = std::ptr::null_mut();
        let fail = |call: &'static str, s: cublas::cublasStatus_t| CudaError::Cublas {
            device: self.device.clone(),
            call,
            status: format!("{s:?}"),
        };
        // SAFETY: the library is present and the context current; valid out-pointer.
        let s = unsafe { cublas::cublasCreate_v2(&mut h) };
        if s != cublas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(fail("cublasCreate_v2", s));
        }
        // SAFETY: `h` was just created; `stream` belongs to the current context.
        let s = unsafe { cublas::cublasSetStream_v2(h, self.stream as cublas::cudaStream_t) };
        if s != cublas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(fail("cublasSetStream_v2", s));
        }
        let mode = if allow_tf32() {
            cublas::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
        } else {
            cublas::cublasMath_t::CUBLAS_DEFAULT_MATH
        };
        // SAFETY: a valid handle.
        let s = unsafe { cublas::cublasSetMathMode(h, mode) };
        if s != cublas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(fail("cublasSetMathMode", s));
        }
        state.cublas = Some(h);
        Ok(h)
    }
}

/// Whether `FERRITE_ALLOW_TF32=1` (read once).
fn allow_tf32() -> bool {
    static ALLOW: OnceLock<bool> = OnceLock::new();
    *ALLOW.get_or_init(|| std::env::var(ALLOW_TF32_ENV).is_ok_and(|v| v == "1"))
}

/// A GEMM dimension as cuBLAS's `int`.
fn int(device: &str, what: &'static str, v: usize) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| CudaError::GemmTooLarge { device: device.to_string(), what, value: v })
}

impl CudaRuntime for DriverRuntime {
    fn device(&self) -> &str {
        &self.device
    }

    fn is_emulated(&self) -> bool {
        false
    }

    unsafe fn launch(
        &self,
        source: &KernelSource,
        kernel: &str,
        grid: u32,
        block: u32,
        args: &[KernelArg],
    ) -> Result<(), CudaError> {
        self.current()?;
        let f = self.function(source, kernel)?;
        let mut params = param_array(args);
        // SAFETY: `f` is a loaded function of the current context; `params` points at each
        // argument's value, alive for the call (the driver copies them at launch); the caller
        // vouches the arguments match the kernel and the addresses are valid.
        check(&self.device, "cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, self.stream, params.as_mut_ptr(), std::ptr::null_mut())
        })
    }

    unsafe fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<(), CudaError> {
        self.current()?;
        // SAFETY: the caller vouches for `dst`; `src` is alive until the stream is synchronised
        // below, so the copy never reads freed host memory.
        check(&self.device, "cuMemcpyHtoDAsync_v2", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr() as *const c_void, src.len(), self.stream)
        })?;
        self.synchronize()
    }

    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64) -> Result<(), CudaError> {
        self.current()?;
        // SAFETY: the caller vouches for `src`; `dst` is borrowed until the synchronisation.
        check(&self.device, "cuMemcpyDtoHAsync_v2", unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr() as *mut c_void, src, dst.len(), self.stream)
        })?;
        self.synchronize()
    }

    unsafe fn copy_on_device(&self, dst: u64, src: u64, bytes: usize) -> Result<(), CudaError> {
        self.current()?;
        // SAFETY: the caller vouches for both device ranges.
        check(&self.device, "cuMemcpyDtoDAsync_v2", unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream) })
    }

    fn synchronize(&self) -> Result<(), CudaError> {
        self.current()?;
        // SAFETY: `stream` belongs to the current context.
        check(&self.device, "cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(self.stream) })
    }

    unsafe fn gemm_strided_batched(&self, g: &GemmStridedBatched) -> Result<(), CudaError> {
        self.current()?;
        let h = self.cublas()?;
        let d = &self.device;
        let op =
            |t: bool| if t { cublas::cublasOperation_t::CUBLAS_OP_T } else { cublas::cublasOperation_t::CUBLAS_OP_N };
        let (m, n, k) = (int(d, "m", g.m)?, int(d, "n", g.n)?, int(d, "k", g.k)?);
        let (lda, ldb, ldc) = (int(d, "lda", g.lda)?, int(d, "ldb", g.ldb)?, int(d, "ldc", g.ldc)?);
        let batch = int(d, "batch", g.batch)?;
        let (alpha, beta) = (g.alpha, g.beta);
        let half = match g.element {
            GemmElement::F32 => None,
            GemmElement::F16 => Some(cublas::cudaDataType::CUDA_R_16F),
            GemmElement::Bf16 => Some(cublas::cudaDataType::CUDA_R_16BF),
        };
        let (call, s) = match half {
            // SAFETY: a valid handle bound to this runtime's stream; the caller vouches for the
            // matrices; alpha and beta are host scalars alive for the call.
            None => ("cublasSgemmStridedBatched", unsafe {
                cublas::cublasSgemmStridedBatched(
                    h,
                    op(g.trans_a),
                    op(g.trans_b),
                    m,
                    n,
                    k,
                    &alpha,
                    g.a as *const f32,
                    lda,
                    g.stride_a as i64,
                    g.b as *const f32,
                    ldb,
                    g.stride_b as i64,
                    &beta,
                    g.c as *mut f32,
                    ldc,
                    g.stride_c as i64,
                    batch,
                )
            }),
            // Half-precision operands, f32 accumulation (`CUBLAS_COMPUTE_32F`, f32 alpha/beta),
            // the default algorithm (tensor cores where the shapes allow).
            // SAFETY: as above; every matrix holds elements of `ty`.
            Some(ty) => ("cublasGemmStridedBatchedEx", unsafe {
                cublas::cublasGemmStridedBatchedEx(
                    h,
                    op(g.trans_a),
                    op(g.trans_b),
                    m,
                    n,
                    k,
                    (&alpha as *const f32).cast(),
                    g.a as *const std::ffi::c_void,
                    ty,
                    lda,
                    g.stride_a as i64,
                    g.b as *const std::ffi::c_void,
                    ty,
                    ldb,
                    g.stride_b as i64,
                    (&beta as *const f32).cast(),
                    g.c as *mut std::ffi::c_void,
                    ty,
                    ldc,
                    g.stride_c as i64,
                    batch,
                    cublas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cublas::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
                )
            }),
        };
        if s != cublas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(CudaError::Cublas { device: d.clone(), call, status: format!("{s:?}") });
        }
        Ok(())
    }
}
