//! Pinned (page-locked) host memory for staging host-to-device copies, with its own caching
//! allocator: PyTorch's `CachingHostAllocator` (what `pin_memory=True` in a DataLoader uses).
//!
//! Why a cache: `cuMemHostAlloc` and `cuMemFreeHost` are slow (they page-lock and unlock memory,
//! and freeing synchronises the device), and a data loader stages a batch of the same size every
//! step. Why events: a copy from a pinned buffer runs asynchronously on a copy stream, so a buffer
//! the loader drops may still be read by the device; like PyTorch, a block used on a stream
//! (`record_stream`) is reused only after an event recorded on that stream at free time has
//! completed, and host memory is only handed back to the driver (`empty_cache`) when no event on
//! it is pending.
//!
//! PyTorch's rules, kept: a request is rounded up to a power of two and served from the free
//! blocks of exactly that size (no splitting: staging buffers come in few sizes); events are polled
//! at each allocation; `empty_cache` frees every cached block. Statistics follow PyTorch's
//! `HostStats`: blocks and bytes held from the driver (`allocations`, `allocated_bytes`), blocks and
//! bytes in use (`active_requests`, `active_bytes`), and the counts of driver calls.
//!
//! Written against [`PinnedHostDriver`] (the six driver calls it makes), so the bookkeeping is
//! tested on a machine without a GPU with a fake driver; [`super::LibCuda`] is the real one.
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use super::driver::CudaDriverError;
use crate::{MemoryError, Stat};

/// The driver calls of the pinned host allocator.
pub trait PinnedHostDriver: Send {
    /// `cuMemHostAlloc` (portable): `size` bytes of page-locked host memory; its address.
    fn host_alloc(&mut self, size: u64) -> Result<u64, CudaDriverError>;
    /// `cuMemFreeHost` of an address from [`Self::host_alloc`].
    fn host_free(&mut self, ptr: u64) -> Result<(), CudaDriverError>;
    /// `cuEventCreate` with `CU_EVENT_DISABLE_TIMING`.
    fn event_create(&mut self) -> Result<u64, CudaDriverError>;
    /// `cuEventRecord` of `event` on `stream` (0: the default stream).
    fn event_record(&mut self, event: u64, stream: u32) -> Result<(), CudaDriverError>;
    /// `cuEventQuery`: whether the work before the event has finished.
    fn event_query(&mut self, event: u64) -> Result<bool, CudaDriverError>;
    /// `cuEventDestroy_v2`.
    fn event_destroy(&mut self, event: u64) -> Result<(), CudaDriverError>;
}

/// PyTorch's `HostStats`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PinnedStats {
    /// Blocks held from the driver (in use or cached).
    pub allocations: Stat,
    /// Bytes held from the driver.
    pub allocated_bytes: Stat,
    /// Blocks handed out and not yet freed.
    pub active_requests: Stat,
    /// Bytes of those blocks (rounded sizes).
    pub active_bytes: Stat,
    /// `cuMemHostAlloc` calls that succeeded.
    pub num_host_alloc: u64,
    /// `cuMemFreeHost` calls.
    pub num_host_free: u64,
}

/// One block of pinned memory the allocator holds.
struct HostBlock {
    size: u64,
    in_use: bool,
    /// Streams the block was used on since it was handed out (`record_stream`).
    streams: Vec<u32>,
    /// Events recorded at free time, not yet completed.
    pending: usize,
}

struct Inner {
    driver: Box<dyn PinnedHostDriver>,
    blocks: HashMap<u64, HostBlock>,
    /// Free blocks by rounded size (addresses).
    free: BTreeMap<u64, Vec<u64>>,
    /// (event, block address) recorded at free time.
    events: Vec<(u64, u64)>,
    event_pool: Vec<u64>,
    stats: PinnedStats,
    /// The first driver failure other than out-of-memory: nothing is trusted after it.
    broken: Option<CudaDriverError>,
}

/// The caching allocator of pinned host memory of one CUDA context.
#[derive(Clone)]
pub struct PinnedHostAllocator {
    inner: Arc<Mutex<Inner>>,
}

/// A block of pinned host memory; returned to the cache when dropped.
pub struct PinnedBlock {
    inner: Arc<Mutex<Inner>>,
    ptr: u64,
    size: u64,
    requested: u64,
}

impl PinnedBlock {
    /// The host address (0 for an empty request).
    pub fn addr(&self) -> u64 {
        self.ptr
    }
    /// The bytes asked for.
    pub fn requested_size(&self) -> u64 {
        self.requested
    }
    /// The bytes held (the request rounded up to a power of two).
    pub fn size(&self) -> u64 {
        self.size
    }
    /// Mark the block as used by work queued on `stream` (PyTorch's `record_stream`): when it is
    /// freed, it is reused only after that work has finished.
    pub fn record_stream(&self, stream: u32) {
        if self.ptr == 0 {
            return;
        }
        let mut inner = lock(&self.inner);
        if let Some(b) = inner.blocks.get_mut(&self.ptr)
            && !b.streams.contains(&stream)
        {
            b.streams.push(stream);
        }
    }
}

impl std::fmt::Debug for PinnedBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBlock")
            .field("addr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("requested", &self.requested)
            .finish()
    }
}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        if self.ptr != 0 {
            lock(&self.inner).free(self.ptr);
        }
    }
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// PyTorch's rounding of a host request: the next power of two.
pub fn pinned_round_size(size: u64) -> u64 {
    size.max(1).checked_next_power_of_two().unwrap_or(u64::MAX)
}

impl PinnedHostAllocator {
    /// An empty cache over `driver`.
    pub fn new(driver: Box<dyn PinnedHostDriver>) -> PinnedHostAllocator {
        PinnedHostAllocator {
            inner: Arc::new(Mutex::new(Inner {
                driver,
                blocks: HashMap::new(),
                free: BTreeMap::new(),
                events: Vec::new(),
                event_pool: Vec::new(),
                stats: PinnedStats::default(),
                broken: None,
            })),
        }
    }

    /// `size` bytes of pinned memory: a cached block of the rounded size whose pending work has
    /// finished, else a new one from the driver (after freeing the cache and retrying once if the
    /// driver refuses).
    pub fn allocate(&self, size: u64) -> Result<PinnedBlock, MemoryError> {
        let block = |ptr, rounded| PinnedBlock { inner: self.inner.clone(), ptr, size: rounded, requested: size };
        if size == 0 {
            return Ok(block(0, 0));
        }
        let rounded = pinned_round_size(size);
        let mut inner = lock(&self.inner);
        inner.check(size)?;
        inner.process_events();
        let ptr = match inner.free.get_mut(&rounded).and_then(Vec::pop) {
            Some(p) => p,
            None => inner.host_alloc(size, rounded)?,
        };
        let b = inner.blocks.get_mut(&ptr).expect("a cached or new block is in the table");
        b.in_use = true;
        inner.stats.active_requests.increase(1);
        inner.stats.active_bytes.increase(rounded);
        Ok(block(ptr, rounded))
    }

    /// Give every cached block whose work has finished back to the driver (`cuMemFreeHost`).
    pub fn empty_cache(&self) {
        lock(&self.inner).empty_cache();
    }

    /// The statistics.
    pub fn stats(&self) -> PinnedStats {
        lock(&self.inner).stats.clone()
    }

    /// Peaks back to the current values.
    pub fn reset_peak_stats(&self) {
        let mut inner = lock(&self.inner);
        let s = &mut inner.stats;
        for stat in [&mut s.allocations, &mut s.allocated_bytes, &mut s.active_requests, &mut s.active_bytes] {
            stat.peak = stat.current;
        }
    }

    /// Blocks freed on a stream whose event has not completed yet.
    pub fn pending_blocks(&self) -> usize {
        let mut inner = lock(&self.inner);
        inner.process_events();
        inner.blocks.values().filter(|b| !b.in_use && b.pending > 0).count()
    }
}

impl Inner {
    fn check(&self, requested: u64) -> Result<(), MemoryError> {
        match &self.broken {
            Some(e) => Err(MemoryError::PinnedHostFailed {
                requested,
                held: self.stats.allocated_bytes.current.max(0) as u64,
                reason: format!("an earlier driver call failed: {e}"),
            }),
            None => Ok(()),
        }
    }

    fn note(&mut self, r: Result<(), CudaDriverError>) {
        if let Err(e) = r {
            self.broken.get_or_insert(e);
        }
    }

    fn host_alloc(&mut self, requested: u64, rounded: u64) -> Result<u64, MemoryError> {
        let ptr = match self.driver.host_alloc(rounded) {
            Ok(p) => p,
            Err(e) if e.is_out_of_memory() => {
                // The OOM ladder, as for device memory: free the cache, ask once more.
                self.empty_cache();
                self.driver.host_alloc(rounded).map_err(|e| self.failed(requested, e))?
            }
            Err(e) => return Err(self.failed(requested, e)),
        };
        self.blocks.insert(ptr, HostBlock { size: rounded, in_use: false, streams: Vec::new(), pending: 0 });
        self.stats.num_host_alloc += 1;
        self.stats.allocations.increase(1);
        self.stats.allocated_bytes.increase(rounded);
        Ok(ptr)
    }

    fn failed(&mut self, requested: u64, e: CudaDriverError) -> MemoryError {
        let reason = if e.is_out_of_memory() {
            format!("the driver cannot page-lock more host memory ({e}); the cache was freed and the request retried")
        } else {
            let r = e.to_string();
            self.broken.get_or_insert(e);
            r
        };
        MemoryError::PinnedHostFailed { requested, held: self.stats.allocated_bytes.current.max(0) as u64, reason }
    }

    fn free(&mut self, ptr: u64) {
        let Some(b) = self.blocks.get_mut(&ptr) else { return };
        if !b.in_use {
            return;
        }
        b.in_use = false;
        let size = b.size;
        let streams = std::mem::take(&mut b.streams);
        self.stats.active_requests.decrease(1);
        self.stats.active_bytes.decrease(size);
        let mut pending = 0;
        for stream in streams {
            let event = match self.event_pool.pop() {
                Some(e) => Ok(e),
                None => self.driver.event_create(),
            };
            let recorded = event.and_then(|e| self.driver.event_record(e, stream).map(|()| e));
            match recorded {
                Ok(e) => {
                    self.events.push((e, ptr));
                    pending += 1;
                }
                // Without an event the block cannot be known to be idle: it stays out of the
                // cache for good rather than risk handing out memory a copy still reads.
                Err(err) => {
                    self.broken.get_or_insert(err);
                    pending += 1;
                }
            }
        }
        if let Some(b) = self.blocks.get_mut(&ptr) {
            b.pending = pending;
        }
        if pending == 0 {
            self.free.entry(size).or_default().push(ptr);
        }
    }

    /// Blocks whose every event completed go back to the free lists; their events to the pool.
    fn process_events(&mut self) {
        let mut i = 0;
        while i < self.events.len() {
            let (event, ptr) = self.events[i];
            match self.driver.event_query(event) {
                Ok(true) => {
                    self.events.swap_remove(i);
                    self.event_pool.push(event);
                    if let Some(b) = self.blocks.get_mut(&ptr) {
                        b.pending -= 1;
                        if b.pending == 0 && !b.in_use {
                            let size = b.size;
                            self.free.entry(size).or_default().push(ptr);
                        }
                    }
                }
                Ok(false) => i += 1,
                Err(e) => {
                    self.broken.get_or_insert(e);
                    i += 1;
                }
            }
        }
    }

    fn empty_cache(&mut self) {
        self.process_events();
        for (_, ptrs) in std::mem::take(&mut self.free) {
            for ptr in ptrs {
                let r = self.driver.host_free(ptr);
                self.note(r);
                if let Some(b) = self.blocks.remove(&ptr) {
                    self.stats.num_host_free += 1;
                    self.stats.allocations.decrease(1);
                    self.stats.allocated_bytes.decrease(b.size);
                }
            }
        }
        for event in std::mem::take(&mut self.event_pool) {
            let r = self.driver.event_destroy(event);
            self.note(r);
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Every block is idle here (blocks hold the allocator alive); pending ones are waited
        // for by the driver's own cuMemFreeHost, which synchronises.
        for (e, _) in std::mem::take(&mut self.events) {
            self.event_pool.push(e);
        }
        let ptrs: Vec<u64> = self.blocks.keys().copied().collect();
        for ptr in ptrs {
            let _ = self.driver.host_free(ptr);
        }
        for event in std::mem::take(&mut self.event_pool) {
            let _ = self.driver.event_destroy(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_to_powers_of_two() {
        assert_eq!(pinned_round_size(1), 1);
        assert_eq!(pinned_round_size(3), 4);
        assert_eq!(pinned_round_size(4096), 4096);
        assert_eq!(pinned_round_size(4097), 8192);
        assert_eq!(pinned_round_size(u64::MAX), u64::MAX);
    }
}
