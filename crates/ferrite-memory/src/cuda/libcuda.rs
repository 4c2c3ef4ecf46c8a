//! [`CudaDriver`] on the real NVIDIA driver (libcuda through cudarc's run-time-loaded bindings):
//! what the caching allocator's [`CudaMemory`] calls on a `cuda:N`.
//!
//! Each method makes the device's primary context current on the calling thread first (the
//! allocator runs on whichever thread frees a tensor), then makes the one driver call its name
//! says. Stream 0 is CUDA's default stream; other allocator stream ids get a non-blocking stream
//! each, created on first use.
use std::collections::HashMap;

use cudarc::driver::sys;

use super::driver::{CudaDriver, CudaDriverError};
use super::library::check;
use super::memory::CudaMemory;
use super::pinned::{PinnedHostAllocator, PinnedHostDriver};
use super::system::{context, cuda_ordinal, device_handle, make_current};
use crate::MemoryError;

/// The real driver for one device.
pub struct LibCuda {
    ordinal: usize,
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    streams: HashMap<u32, sys::CUstream>,
}

// SAFETY: the context is a process-wide primary context that any thread may make current (every
// method does, first); streams and events are driver handles usable from any thread of the
// process. `LibCuda` is used behind the allocator's mutex, one thread at a time.
unsafe impl Send for LibCuda {}

impl LibCuda {
    /// The driver of the device at the driver's `ordinal` (its primary context retained).
    pub fn open(ordinal: usize) -> Result<LibCuda, CudaDriverError> {
        let ctx = context(ordinal)?;
        let device = device_handle(ordinal)?;
        Ok(LibCuda { ordinal, device, ctx, streams: HashMap::new() })
    }

    fn current(&self) -> Result<(), CudaDriverError> {
        make_current(self.ctx)
    }

    fn location(&self) -> sys::CUmemLocation {
        sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: self.device }
    }

    fn allocation_prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: the property struct is plain C data for which all-zero is the documented
        // starting point (`memset(&prop, 0, sizeof(prop))` in CUDA's samples).
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location = self.location();
        prop
    }

    fn stream(&mut self, id: u32) -> Result<sys::CUstream, CudaDriverError> {
        if id == 0 {
            return Ok(std::ptr::null_mut());
        }
        if let Some(s) = self.streams.get(&id) {
            return Ok(*s);
        }
        let mut s: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the context is current; valid out-pointer.
        check("cuStreamCreate", unsafe { sys::cuStreamCreate(&mut s, flags) })?;
        self.streams.insert(id, s);
        Ok(s)
    }

    /// The driver's ordinal of this device.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
}

impl CudaDriver for LibCuda {
    fn mem_get_info(&mut self) -> Result<(u64, u64), CudaDriverError> {
        super::system::mem_get_info(self.ctx)
    }

    fn mem_alloc(&mut self, size: u64) -> Result<u64, CudaDriverError> {
        self.current()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: the context is current; valid out-pointer.
        check("cuMemAlloc_v2", unsafe { sys::cuMemAlloc_v2(&mut ptr, size as usize) })?;
        Ok(ptr)
    }

    fn mem_free(&mut self, ptr: u64) -> Result<(), CudaDriverError> {
        self.current()?;
        // SAFETY: `ptr` came from cuMemAlloc_v2 of this context (the allocator's contract).
        check("cuMemFree_v2", unsafe { sys::cuMemFree_v2(ptr) })
    }

    fn allocation_granularity(&mut self) -> Result<Option<u64>, CudaDriverError> {
        self.current()?;
        let mut vmm = 0;
        let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED;
        // SAFETY: valid device and out-pointer.
        check("cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut vmm, attr, self.device) })?;
        if vmm == 0 {
            return Ok(None);
        }
        let prop = self.allocation_prop();
        let mut g = 0usize;
        let min = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
        // SAFETY: `prop` describes pinned device memory of this device; valid out-pointer.
        check("cuMemGetAllocationGranularity", unsafe { sys::cuMemGetAllocationGranularity(&mut g, &prop, min) })?;
        Ok(Some(g as u64))
    }

    fn address_reserve(&mut self, size: u64) -> Result<u64, CudaDriverError> {
        self.current()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; alignment 0 and address 0 let the driver choose.
        check("cuMemAddressReserve", unsafe { sys::cuMemAddressReserve(&mut ptr, size as usize, 0, 0, 0) })?;
        Ok(ptr)
    }

    fn address_free(&mut self, ptr: u64, size: u64) -> Result<(), CudaDriverError> {
        self.current()?;
        // SAFETY: a whole range from cuMemAddressReserve with every page unmapped (the allocator's
        // contract).
        check("cuMemAddressFree", unsafe { sys::cuMemAddressFree(ptr, size as usize) })
    }

    fn mem_create(&mut self, size: u64) -> Result<u64, CudaDriverError> {
        self.current()?;
        let prop = self.allocation_prop();
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `size` is a multiple of the granularity (the allocator's contract); valid
        // pointers.
        check("cuMemCreate", unsafe { sys::cuMemCreate(&mut handle, size as usize, &prop, 0) })?;
        Ok(handle)
    }

    fn mem_release(&mut self, handle: u64) -> Result<(), CudaDriverError> {
        self.current()?;
        // SAFETY: a handle from cuMemCreate that is no longer mapped.
        check("cuMemRelease", unsafe { sys::cuMemRelease(handle) })
    }

    fn mem_map(&mut self, ptr: u64, size: u64, handle: u64) -> Result<(), CudaDriverError> {
        self.current()?;
        // SAFETY: `ptr..ptr+size` lies in a reserved range and is not mapped; `handle` holds
        // `size` bytes.
        check("cuMemMap", unsafe { sys::cuMemMap(ptr, size as usize, 0, handle, 0) })
    }

    fn mem_set_access(&mut self, ptr: u64, size: u64) -> Result<(), CudaDriverError> {
        self.current()?;
        let desc = sys::CUmemAccessDesc {
            location: self.location(),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the bytes are mapped; one valid descriptor.
        check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(ptr, size as usize, &desc, 1) })
    }

    fn ctx_synchronize(&mut self) -> Result<(), CudaDriverError> {
        self.current()?;
        // SAFETY: the context is current.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    fn mem_unmap(&mut self, ptr: u64, size: u64) -> Result<(), CudaDriverError> {
        self.current()?;
        // SAFETY: the bytes were mapped with cuMemMap and no queued work uses them (the caller
        // synchronised).
        check("cuMemUnmap", unsafe { sys::cuMemUnmap(ptr, size as usize) })
    }

    fn event_create(&mut self) -> Result<u64, CudaDriverError> {
        self.current()?;
        let mut e: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: the context is current; valid out-pointer.
        check("cuEventCreate", unsafe { sys::cuEventCreate(&mut e, flags) })?;
        Ok(e as u64)
    }

    fn event_record(&mut self, event: u64, stream: u32) -> Result<(), CudaDriverError> {
        self.current()?;
        let s = self.stream(stream)?;
        // SAFETY: `event` came from event_create of this context; `s` is its stream.
        check("cuEventRecord", unsafe { sys::cuEventRecord(event as sys::CUevent, s) })
    }

    fn event_query(&mut self, event: u64) -> Result<bool, CudaDriverError> {
        self.current()?;
        // SAFETY: `event` came from event_create of this context.
        match unsafe { sys::cuEventQuery(event as sys::CUevent) } {
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check("cuEventQuery", r).map(|()| true),
        }
    }

    fn event_synchronize(&mut self, event: u64) -> Result<(), CudaDriverError> {
        self.current()?;
        // SAFETY: `event` came from event_create of this context.
        check("cuEventSynchronize", unsafe { sys::cuEventSynchronize(event as sys::CUevent) })
    }

    fn event_destroy(&mut self, event: u64) -> Result<(), CudaDriverError> {
        self.current()?;
        // SAFETY: `event` came from event_create and is destroyed once (the pool's contract).
        check("cuEventDestroy_v2", unsafe { sys::cuEventDestroy_v2(event as sys::CUevent) })
    }
}

/// Page-locked host memory of the device's context (portable to every context), and the events
/// that tell when a copy from it has finished.
impl PinnedHostDriver for LibCuda {
    fn host_alloc(&mut self, size: u64) -> Result<u64, CudaDriverError> {
        self.current()?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: the context is current; valid out-pointer.
        check("cuMemHostAlloc", unsafe { sys::cuMemHostAlloc(&mut p, size as usize, sys::CU_MEMHOSTALLOC_PORTABLE) })?;
        Ok(p as u64)
    }

    fn host_free(&mut self, ptr: u64) -> Result<(), CudaDriverError> {
        self.current()?;
        // SAFETY: `ptr` came from cuMemHostAlloc and is freed once (the pinned cache's contract).
        check("cuMemFreeHost", unsafe { sys::cuMemFreeHost(ptr as *mut std::ffi::c_void) })
    }

    fn event_create(&mut self) -> Result<u64, CudaDriverError> {
        CudaDriver::event_create(self)
    }

    fn event_record(&mut self, event: u64, stream: u32) -> Result<(), CudaDriverError> {
        CudaDriver::event_record(self, event, stream)
    }

    fn event_query(&mut self, event: u64) -> Result<bool, CudaDriverError> {
        CudaDriver::event_query(self, event)
    }

    fn event_destroy(&mut self, event: u64) -> Result<(), CudaDriverError> {
        CudaDriver::event_destroy(self, event)
    }
}

/// The pinned host memory cache of `cuda:index`'s context, or the typed error saying why the
/// device cannot be used.
pub fn open_pinned(index: usize) -> Result<PinnedHostAllocator, MemoryError> {
    let ordinal = cuda_ordinal(index)?;
    let driver = LibCuda::open(ordinal).map_err(|e| super::library::driver_failed(&format!("cuda:{index}"), &e))?;
    Ok(PinnedHostAllocator::new(Box::new(driver)))
}

/// The caching allocator's raw memory for `cuda:index`, or the typed error saying why the device
/// cannot be used.
pub fn open_memory(index: usize) -> Result<CudaMemory<LibCuda>, MemoryError> {
    let ordinal = cuda_ordinal(index)?;
    let name = format!("cuda:{index}");
    let driver = LibCuda::open(ordinal).map_err(|e| super::library::driver_failed(&name, &e))?;
    CudaMemory::new(driver).map_err(|e| super::library::driver_failed(&name, &e))
}

/// The caching allocator's raw memory for `cuda:index`: the emulated device's under
/// `FERRITE_CUDA_EMULATOR=1` (see [`super::emulator`]), else [`open_memory`]'s.
pub(crate) fn open_raw_memory(index: usize) -> Result<Box<dyn crate::raw_memory::RawMemory>, MemoryError> {
    if super::emulator::emulator_enabled() {
        cuda_ordinal(index)?;
        let memory = CudaMemory::new(super::emulator::EmulatedCuda::new())
            .map_err(|e| super::library::driver_failed(&format!("cuda:{index}"), &e))?;
        return Ok(Box::new(memory));
    }
    Ok(Box::new(open_memory(index)?))
}
