//! The driver calls the caching allocator makes, as a trait (see the module note for why).
//!
//! Each method is one CUDA driver API entry point, named after it, with the same meaning; the
//! context and the device are the implementation's (one driver object per device). Streams are
//! the allocator's stream ids; the implementation maps them to its `CUstream`s.
use std::fmt;

/// A failed driver call: the `CUresult` code and its name, and the call that returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDriverError {
    /// `CUresult` (e.g. 2 for `CUDA_ERROR_OUT_OF_MEMORY`).
    pub code: i32,
    /// `cuGetErrorName` of the code, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
    pub name: String,
    /// The driver entry point, e.g. `cuMemAlloc_v2`.
    pub call: &'static str,
}

impl CudaDriverError {
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub const OUT_OF_MEMORY: i32 = 2;

    /// Whether the device is out of memory (freeing cached segments may help).
    pub fn is_out_of_memory(&self) -> bool {
        self.code == Self::OUT_OF_MEMORY
    }
}

impl fmt::Display for CudaDriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {} ({})", self.call, self.name, self.code)
    }
}

impl std::error::Error for CudaDriverError {}

/// The driver calls of the caching allocator on one device.
pub trait CudaDriver: Send {
    /// `cuMemGetInfo_v2`: (free, total) bytes of the device.
    fn mem_get_info(&mut self) -> Result<(u64, u64), CudaDriverError>;
    /// `cuMemAlloc_v2`: a device allocation of `size` bytes; its address.
    fn mem_alloc(&mut self, size: u64) -> Result<u64, CudaDriverError>;
    /// `cuMemFree_v2` of an address from [`Self::mem_alloc`].
    fn mem_free(&mut self, ptr: u64) -> Result<(), CudaDriverError>;
    /// `cuMemGetAllocationGranularity` (minimum) of device memory created by [`Self::mem_create`];
    /// `None` when the device has no virtual-memory management (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`).
    fn allocation_granularity(&mut self) -> Result<Option<u64>, CudaDriverError>;
    /// `cuMemAddressReserve`: `size` bytes of virtual address space, nothing backing them.
    fn address_reserve(&mut self, size: u64) -> Result<u64, CudaDriverError>;
    /// `cuMemAddressFree` of a whole reserved range (every page unmapped).
    fn address_free(&mut self, ptr: u64, size: u64) -> Result<(), CudaDriverError>;
    /// `cuMemCreate`: `size` bytes (a multiple of the granularity) of physical device memory; its
    /// handle.
    fn mem_create(&mut self, size: u64) -> Result<u64, CudaDriverError>;
    /// `cuMemRelease` of a handle that is no longer mapped.
    fn mem_release(&mut self, handle: u64) -> Result<(), CudaDriverError>;
    /// `cuMemMap`: back `size` bytes at `ptr` (inside a reserved range) with `handle`'s memory.
    fn mem_map(&mut self, ptr: u64, size: u64, handle: u64) -> Result<(), CudaDriverError>;
    /// `cuMemSetAccess`: read-write access for this device to mapped bytes.
    fn mem_set_access(&mut self, ptr: u64, size: u64) -> Result<(), CudaDriverError>;
    /// `cuCtxSynchronize`: wait for all work queued on the device. Unlike `cuMemFree`, which
    /// synchronizes by itself, `cuMemUnmap` and `cuMemRelease` do not, so the allocator calls this
    /// before it unmaps pages a stream may still use.
    fn ctx_synchronize(&mut self) -> Result<(), CudaDriverError>;
    /// `cuMemUnmap` of mapped bytes.
    fn mem_unmap(&mut self, ptr: u64, size: u64) -> Result<(), CudaDriverError>;
    /// `cuEventCreate` with `CU_EVENT_DISABLE_TIMING`.
    fn event_create(&mut self) -> Result<u64, CudaDriverError>;
    /// `cuEventRecord` of `event` on `stream`.
    fn event_record(&mut self, event: u64, stream: u32) -> Result<(), CudaDriverError>;
    /// `cuEventQuery`: `true` for `CUDA_SUCCESS`, `false` for `CUDA_ERROR_NOT_READY`.
    fn event_query(&mut self, event: u64) -> Result<bool, CudaDriverError>;
    /// `cuEventSynchronize`.
    fn event_synchronize(&mut self, event: u64) -> Result<(), CudaDriverError>;
    /// `cuEventDestroy_v2`.
    fn event_destroy(&mut self, event: u64) -> Result<(), CudaDriverError>;
}
