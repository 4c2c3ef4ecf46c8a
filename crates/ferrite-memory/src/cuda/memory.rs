//! The caching allocator's backend on a CUDA device: segments from `cuMemAlloc`, expandable
//! segments through the virtual-memory API, events for blocks used on other streams.
//!
//! What PyTorch's allocator does with the driver, call for call: a segment is one `cuMemAlloc`
//! and goes back with `cuMemFree` only from `empty_cache` or the OOM ladder; an expandable
//! segment is address space from `cuMemAddressReserve`, backed granule by granule with
//! `cuMemCreate` + `cuMemMap` (+ `cuMemSetAccess` for the run just mapped) and given back with
//! `cuMemUnmap` + `cuMemRelease`, so any page-aligned run can be unmapped on its own (after
//! `cuCtxSynchronize`: unlike `cuMemFree`, unmapping does not wait for queued kernels); events come
//! from a pool (`cuEventCreate` once, reused). An out-of-memory answer of the driver is retryable
//! (the allocator frees its cache and asks again); any other failure means the context is
//! unusable, and every later request reports it instead of calling the driver again.
use std::collections::HashMap;

use super::driver::{CudaDriver, CudaDriverError};
use crate::raw_memory::{RawAllocError, RawMemory, RawSegment};

/// The [`RawMemory`] of one CUDA device, over a [`CudaDriver`].
pub struct CudaMemory<D: CudaDriver> {
    driver: D,
    total: u64,
    /// Free bytes when the backend was created: the card minus the context and other processes.
    usable: u64,
    /// `cuMemGetAllocationGranularity`, if the device has virtual-memory management.
    granularity: Option<u64>,
    reserved: u64,
    /// Physical handle behind each mapped granule, by its device address.
    handles: HashMap<u64, u64>,
    /// Events ready for reuse.
    event_pool: Vec<u64>,
    /// The first failure that was not "out of memory": the context cannot be trusted after it.
    broken: Option<CudaDriverError>,
}

impl<D: CudaDriver> CudaMemory<D> {
    /// The backend of the device `driver` talks to (it asks the driver for the device's memory
    /// and granularity once).
    pub fn new(mut driver: D) -> Result<CudaMemory<D>, CudaDriverError> {
        let (free, total) = driver.mem_get_info()?;
        let granularity = driver.allocation_granularity()?;
        Ok(CudaMemory {
            driver,
            total,
            usable: free,
            granularity,
            reserved: 0,
            handles: HashMap::new(),
            event_pool: Vec::new(),
            broken: None,
        })
    }

    /// The driver (tests read their fake driver's record through it).
    pub fn driver(&self) -> &D {
        &self.driver
    }

    /// The failure that made the context unusable, if any.
    pub fn broken(&self) -> Option<&CudaDriverError> {
        self.broken.as_ref()
    }

    /// An allocator-facing error for a driver failure; a failure other than out-of-memory marks
    /// the backend broken.
    fn refuse(&mut self, e: CudaDriverError) -> RawAllocError {
        if e.is_out_of_memory() {
            return RawAllocError::DriverRefused;
        }
        let reason = e.to_string();
        self.broken.get_or_insert(e);
        RawAllocError::DeviceLost { reason }
    }

    fn check_usable(&self) -> Result<(), RawAllocError> {
        match &self.broken {
            Some(e) => Err(RawAllocError::DeviceLost { reason: format!("an earlier driver call failed: {e}") }),
            None => Ok(()),
        }
    }

    /// A failure where nothing can be returned: remembered, so the next request reports it.
    fn note(&mut self, r: Result<(), CudaDriverError>) {
        if let Err(e) = r {
            self.broken.get_or_insert(e);
        }
    }

    fn granule(&self) -> Result<u64, RawAllocError> {
        self.granularity.filter(|g| *g > 0).ok_or(RawAllocError::Unsupported)
    }

    /// Unmap and release the granules at `[start, end)` (all mapped by this backend).
    fn unmap_granules(&mut self, start: u64, end: u64, gran: u64) {
        let mut at = start;
        while at < end {
            let r = self.driver.mem_unmap(at, gran);
            self.note(r);
            if let Some(h) = self.handles.remove(&at) {
                let r = self.driver.mem_release(h);
                self.note(r);
            }
            at += gran;
        }
    }
}

impl<D: CudaDriver> RawMemory for CudaMemory<D> {
    fn allocate(&mut self, size: u64) -> Result<RawSegment, RawAllocError> {
        self.check_usable()?;
        match self.driver.mem_alloc(size) {
            Ok(addr) => {
                self.reserved += size;
                Ok(RawSegment { addr, ptr: None, size })
            }
            Err(e) => Err(self.refuse(e)),
        }
    }

    fn free(&mut self, segment: RawSegment) {
        let r = self.driver.mem_free(segment.addr);
        self.note(r);
        self.reserved = self.reserved.saturating_sub(segment.size);
    }

    fn total_capacity(&self) -> Option<u64> {
        Some(self.total)
    }

    fn usable_capacity(&self) -> Option<u64> {
        Some(self.usable)
    }

    fn reserved(&self) -> u64 {
        self.reserved
    }

    fn device_free(&self) -> Option<u64> {
        // `cuMemGetInfo` needs `&mut` on the driver; the allocator's own accounting is the answer
        // between calls: what was free at start minus what this allocator holds.
        Some(self.usable.saturating_sub(self.reserved))
    }

    fn reserve_address_space(&mut self, size: u64) -> Result<RawSegment, RawAllocError> {
        self.check_usable()?;
        let gran = self.granule()?;
        let size = size.div_ceil(gran).saturating_mul(gran);
        match self.driver.address_reserve(size) {
            Ok(addr) => Ok(RawSegment { addr, ptr: None, size }),
            Err(e) => Err(self.refuse(e)),
        }
    }

    fn map(&mut self, range: &RawSegment, offset: u64, len: u64) -> Result<(), RawAllocError> {
        self.check_usable()?;
        let gran = self.granule()?;
        if !offset.is_multiple_of(gran) || !len.is_multiple_of(gran) || offset + len > range.size {
            return Err(RawAllocError::Unsupported);
        }
        let start = range.addr + offset;
        let end = start + len;
        let mut at = start;
        while at < end {
            let handle = match self.driver.mem_create(gran) {
                Ok(h) => h,
                Err(e) => {
                    self.unmap_granules(start, at, gran);
                    return Err(self.refuse(e));
                }
            };
            if let Err(e) = self.driver.mem_map(at, gran, handle) {
                let r = self.driver.mem_release(handle);
                self.note(r);
                self.unmap_granules(start, at, gran);
                return Err(self.refuse(e));
            }
            self.handles.insert(at, handle);
            at += gran;
        }
        if let Err(e) = self.driver.mem_set_access(start, len) {
            self.unmap_granules(start, end, gran);
            return Err(self.refuse(e));
        }
        self.reserved += len;
        Ok(())
    }

    fn unmap(&mut self, range: &RawSegment, offset: u64, len: u64) {
        let Ok(gran) = self.granule() else { return };
        if len == 0 {
            return;
        }
        // Queued kernels may still touch these pages, and unmapping does not wait for them.
        let r = self.driver.ctx_synchronize();
        self.note(r);
        let start = range.addr + offset;
        self.unmap_granules(start, start + len, gran);
        self.reserved = self.reserved.saturating_sub(len);
    }

    fn release_address_space(&mut self, range: RawSegment) {
        let r = self.driver.address_free(range.addr, range.size);
        self.note(r);
    }

    fn supports_expandable_segments(&self) -> bool {
        // The allocator maps 2 MiB pages (small pool) and 20 MiB pages (large pool).
        self.granularity.is_some_and(|g| g > 0 && (2u64 << 20).is_multiple_of(g))
    }

    fn asynchronous_streams(&self) -> bool {
        true
    }

    fn record_event(&mut self, stream: u32) -> Result<u64, RawAllocError> {
        self.check_usable()?;
        let event = match self.event_pool.pop() {
            Some(e) => e,
            None => match self.driver.event_create() {
                Ok(e) => e,
                Err(e) => return Err(self.refuse(e)),
            },
        };
        match self.driver.event_record(event, stream) {
            Ok(()) => Ok(event),
            Err(e) => {
                self.event_pool.push(event);
                Err(self.refuse(e))
            }
        }
    }

    fn event_done(&mut self, event: u64) -> Result<bool, RawAllocError> {
        self.driver.event_query(event).map_err(|e| self.refuse(e))
    }

    fn event_wait(&mut self, event: u64) -> Result<(), RawAllocError> {
        self.driver.event_synchronize(event).map_err(|e| self.refuse(e))
    }

    fn destroy_event(&mut self, event: u64) {
        self.event_pool.push(event);
    }
}

impl<D: CudaDriver> Drop for CudaMemory<D> {
    fn drop(&mut self) {
        for event in std::mem::take(&mut self.event_pool) {
            // Nothing to report to at drop: a failure here leaks one event of a dying context.
            let _ = self.driver.event_destroy(event);
        }
    }
}
