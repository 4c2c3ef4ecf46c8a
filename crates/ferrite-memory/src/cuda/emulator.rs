//! An emulated CUDA device for machines without an NVIDIA GPU (CI): with
//! `FERRITE_CUDA_EMULATOR=1` in the environment (read once, at the first CUDA question), `cuda:0`
//! is a device whose memory is host memory and whose kernels run on the CPU through
//! ferrite-cuda's host emulator. There is exactly one such device (`cuda:1` is the usual "no such
//! device" error), its description says "emulated" wherever devices are listed, and its caching
//! allocator runs over [`EmulatedCuda`], a [`CudaDriver`] whose `cuMemAlloc` is an aligned host
//! allocation.
//!
//! Why: the `cuda:N` kernel backend (argument arrays, launch geometry, strides, GEMM operands)
//! and the allocator's driver path must be checked on every submission, and CI has no GPU. Why
//! only explicitly: a run that asked for a GPU and silently got the CPU would be a lie about
//! where it ran; without the variable nothing here is used.
//!
//! The device: [`EMULATED_CAPACITY`] bytes (4 GiB, what `cuMemGetInfo` reports; allocations
//! beyond it are `CUDA_ERROR_OUT_OF_MEMORY`, so the allocator's OOM path runs as on a card), no
//! virtual-memory management (no expandable segments), events complete at once (every emulated
//! kernel has finished when its launch returns), blocks aligned to 512 bytes like `cuMemAlloc`'s.
use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::OnceLock;

use super::driver::{CudaDriver, CudaDriverError};

/// The environment variable that turns the emulated device on (`1`).
pub const CUDA_EMULATOR_ENV: &str = "FERRITE_CUDA_EMULATOR";

/// The emulated device's memory: 4 GiB.
pub const EMULATED_CAPACITY: u64 = 4 << 30;

/// The alignment of an emulated `cuMemAlloc` (CUDA guarantees at least 256 bytes).
const ALIGN: usize = 512;

/// The name the emulated device is listed under.
pub const EMULATED_DEVICE_NAME: &str =
    "emulated CUDA device (host memory, kernels on the CPU; FERRITE_CUDA_EMULATOR=1, for tests only)";

/// Whether `FERRITE_CUDA_EMULATOR=1` (read once per process).
pub fn emulator_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var(CUDA_EMULATOR_ENV).is_ok_and(|v| v == "1"))
}

/// The emulated device's driver: host allocations, instant events.
#[derive(Debug, Default)]
pub struct EmulatedCuda {
    /// Live allocations: address → size.
    live: HashMap<u64, usize>,
    allocated: u64,
    next_event: u64,
}

impl EmulatedCuda {
    pub fn new() -> EmulatedCuda {
        EmulatedCuda::default()
    }

    fn unsupported(call: &'static str) -> CudaDriverError {
        CudaDriverError { code: 801, name: "CUDA_ERROR_NOT_SUPPORTED".to_string(), call }
    }

    fn layout(size: usize) -> Option<Layout> {
        Layout::from_size_align(size.max(1), ALIGN).ok()
    }
}

impl CudaDriver for EmulatedCuda {
    fn mem_get_info(&mut self) -> Result<(u64, u64), CudaDriverError> {
        Ok((EMULATED_CAPACITY.saturating_sub(self.allocated), EMULATED_CAPACITY))
    }

    fn mem_alloc(&mut self, size: u64) -> Result<u64, CudaDriverError> {
        let oom = || CudaDriverError {
            code: CudaDriverError::OUT_OF_MEMORY,
            name: "CUDA_ERROR_OUT_OF_MEMORY".to_string(),
            call: "cuMemAlloc_v2",
        };
        if self.allocated.saturating_add(size) > EMULATED_CAPACITY {
            return Err(oom());
        }
        let size = usize::try_from(size).map_err(|_| oom())?;
        let layout = Self::layout(size).ok_or_else(oom)?;
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(oom());
        }
        self.live.insert(p as u64, size);
        self.allocated += size as u64;
        Ok(p as u64)
    }

    fn mem_free(&mut self, ptr: u64) -> Result<(), CudaDriverError> {
        let Some(size) = self.live.remove(&ptr) else {
            return Err(CudaDriverError {
                code: 1,
                name: "CUDA_ERROR_INVALID_VALUE".to_string(),
                call: "cuMemFree_v2",
            });
        };
        self.allocated -= size as u64;
        if let Some(layout) = Self::layout(size) {
            // SAFETY: `ptr` came from `alloc` with this layout and was live until now.
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        }
        Ok(())
    }

    fn allocation_granularity(&mut self) -> Result<Option<u64>, CudaDriverError> {
        Ok(None)
    }

    fn address_reserve(&mut self, _size: u64) -> Result<u64, CudaDriverError> {
        Err(Self::unsupported("cuMemAddressReserve"))
    }

    fn address_free(&mut self, _ptr: u64, _size: u64) -> Result<(), CudaDriverError> {
        Err(Self::unsupported("cuMemAddressFree"))
    }

    fn mem_create(&mut self, _size: u64) -> Result<u64, CudaDriverError> {
        Err(Self::unsupported("cuMemCreate"))
    }

    fn mem_release(&mut self, _handle: u64) -> Result<(), CudaDriverError> {
        Err(Self::unsupported("cuMemRelease"))
    }

    fn mem_map(&mut self, _ptr: u64, _size: u64, _handle: u64) -> Result<(), CudaDriverError> {
        Err(Self::unsupported("cuMemMap"))
    }

    fn mem_set_access(&mut self, _ptr: u64, _size: u64) -> Result<(), CudaDriverError> {
        Err(Self::unsupported("cuMemSetAccess"))
    }

    fn ctx_synchronize(&mut self) -> Result<(), CudaDriverError> {
        Ok(())
    }

    fn mem_unmap(&mut self, _ptr: u64, _size: u64) -> Result<(), CudaDriverError> {
        Err(Self::unsupported("cuMemUnmap"))
    }

    fn event_create(&mut self) -> Result<u64, CudaDriverError> {
        self.next_event += 1;
        Ok(self.next_event)
    }

    fn event_record(&mut self, _event: u64, _stream: u32) -> Result<(), CudaDriverError> {
        Ok(())
    }

    fn event_query(&mut self, _event: u64) -> Result<bool, CudaDriverError> {
        Ok(true)
    }

    fn event_synchronize(&mut self, _event: u64) -> Result<(), CudaDriverError> {
        Ok(())
    }

    fn event_destroy(&mut self, _event: u64) -> Result<(), CudaDriverError> {
        Ok(())
    }
}

impl Drop for EmulatedCuda {
    fn drop(&mut self) {
        for (ptr, size) in std::mem::take(&mut self.live) {
            if let Some(layout) = Self::layout(size) {
                // SAFETY: each live address came from `alloc` with this layout.
                unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_aligned_host_memory_within_the_capacity() {
        let mut d = EmulatedCuda::new();
        let a = d.mem_alloc(1000).unwrap();
        assert_eq!(a % ALIGN as u64, 0);
        // SAFETY: 1000 bytes were just allocated at `a`.
        unsafe { std::ptr::write_bytes(a as *mut u8, 7, 1000) };
        assert_eq!(d.mem_get_info().unwrap(), (EMULATED_CAPACITY - 1000, EMULATED_CAPACITY));
        assert!(d.mem_alloc(EMULATED_CAPACITY).unwrap_err().is_out_of_memory());
        d.mem_free(a).unwrap();
        assert!(d.mem_free(a).is_err(), "a double free is an error");
        assert_eq!(d.allocation_granularity().unwrap(), None);
    }
}
