//! [`CudaRuntime`] on the CPU: the kernels run on the host emulator ([`HostModule`], one module
//! per kernel source, compiled by `$CXX` on first use and kept), device addresses are host
//! addresses (the emulated device of `ferrite_memory::cuda::emulator` hands out host memory),
//! copies are `memcpy`, and the GEMM is a plain loop with cuBLAS's column-major meaning.
//!
//! Why: a machine without an NVIDIA GPU (CI) runs the whole `cuda:N` backend — argument arrays,
//! launch geometry, strides, GEMM operand transposition — through the very kernels a GPU runs.
//! It is slow (an OS thread per GPU thread) and meant for tests.
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::CudaError;
use crate::host_module::HostModule;
use crate::kernel_arg::KernelArg;
use crate::kernel_sources::KernelSource;
use crate::runtime::{CudaRuntime, GemmElement, GemmStridedBatched};

/// The host emulator as a CUDA device.
pub struct HostRuntime {
    device: String,
    /// Compiled modules by source name (compiled on first launch).
    modules: Mutex<HashMap<&'static str, std::sync::Arc<HostModule>>>,
    /// Held for each launch: the emulator's `__shared__` arrays are one static per kernel, so
    /// two launches of a kernel from two host threads at once would share them. One launch at a
    /// time is also what a GPU stream gives.
    launch_lock: Mutex<()>,
}

/// Calls that make the host wait for the device ([`CudaRuntime::synchronize`],
/// [`CudaRuntime::copy_to_host`] and [`CudaRuntime::copy_to_device`], which the driver runtime
/// follows with a stream synchronisation) on every emulated device of this process.
static HOST_WAITS: AtomicU64 = AtomicU64::new(0);

impl HostRuntime {
    /// How many times the host has waited for an emulated device so far in this process (calls
    /// of `synchronize`, `copy_to_host` and `copy_to_device`, which wait for the stream on a
    /// GPU — an upload waits too, so that the host bytes outlive the copy): what tests read
    /// before and after an op to check that the op queues its work without stalling the host.
    pub fn host_waits() -> u64 {
        HOST_WAITS.load(Ordering::Relaxed)
    }

    /// The emulated device named `device` (`cuda:0`). Nothing is compiled yet.
    pub fn new(device: &str) -> HostRuntime {
        HostRuntime { device: device.to_string(), modules: Mutex::new(HashMap::new()), launch_lock: Mutex::new(()) }
    }

    fn module(&self, source: &KernelSource) -> Result<std::sync::Arc<HostModule>, CudaError> {
        let mut map = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = map.get(source.name) {
            return Ok(m.clone());
        }
        let m = std::sync::Arc::new(HostModule::compile(source)?);
        map.insert(source.name, m.clone());
        Ok(m)
    }
}

impl CudaRuntime for HostRuntime {
    fn device(&self) -> &str {
        &self.device
    }

    fn is_emulated(&self) -> bool {
        true
    }

    unsafe fn launch(
        &self,
        source: &KernelSource,
        kernel: &str,
        grid: u32,
        block: u32,
        args: &[KernelArg],
    ) -> Result<(), CudaError> {
        let m = self.module(source)?;
        let _one_at_a_time = self.launch_lock.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the caller's promise; device addresses are host addresses here.
        unsafe { m.launch(kernel, grid, block, args) }
    }

    unsafe fn copy_to_device(&self, dst: u64, src: &[u8]) -> Result<(), CudaError> {
        HOST_WAITS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller vouches that `dst` (a host address on this device) holds
        // `src.len()` writable bytes; the ranges cannot overlap (`src` is borrowed host memory
        // outside the device's blocks).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64) -> Result<(), CudaError> {
        HOST_WAITS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller vouches that `src` holds `dst.len()` readable bytes.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn copy_on_device(&self, dst: u64, src: u64, bytes: usize) -> Result<(), CudaError> {
        // SAFETY: the caller vouches for both ranges; `copy` tolerates overlap anyway.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }

    fn synchronize(&self) -> Result<(), CudaError> {
        HOST_WAITS.fetch_add(1, Ordering::Relaxed);
        // Every launch and copy completed before it returned.
        Ok(())
    }

    unsafe fn gemm_strided_batched(&self, g: &GemmStridedBatched) -> Result<(), CudaError> {
        // Element `i` of a matrix of `g.element`, widened to f32 (the GEMM accumulates in f32).
        let load = |base: u64, i: usize| -> f32 {
            // SAFETY: the caller vouches that every element the GEMM describes is valid memory
            // of `g.element` (host addresses on the emulated device).
            unsafe {
                match g.element {
                    GemmElement::F32 => *(base as *const f32).add(i),
                    GemmElement::F16 => half::f16::from_bits(*(base as *const u16).add(i)).to_f32(),
                    GemmElement::Bf16 => half::bf16::from_bits(*(base as *const u16).add(i)).to_f32(),
                }
            }
        };
        for i in 0..g.batch {
            for s in 0..g.n {
                for r in 0..g.m {
                    let mut acc = 0.0f32;
                    for l in 0..g.k {
                        let ia = if g.trans_a { l + r * g.lda } else { r + l * g.lda };
                        let ib = if g.trans_b { s + l * g.ldb } else { l + s * g.ldb };
                        acc += load(g.a, i * g.stride_a + ia) * load(g.b, i * g.stride_b + ib);
                    }
                    let at = i * g.stride_c + r + s * g.ldc;
                    let v = if g.beta == 0.0 { g.alpha * acc } else { g.alpha * acc + g.beta * load(g.c, at) };
                    // SAFETY: as above, for the writable `C`; rounded once to its element type.
                    unsafe {
                        match g.element {
                            GemmElement::F32 => *(g.c as *mut f32).add(at) = v,
                            GemmElement::F16 => *(g.c as *mut u16).add(at) = half::f16::from_f32(v).to_bits(),
                            GemmElement::Bf16 => *(g.c as *mut u16).add(at) = half::bf16::from_f32(v).to_bits(),
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
