//! Raw memory backends: the only code that obtains and returns device memory.
//!
//! The caching allocator asks a [`RawMemory`] for whole segments (PyTorch's `cudaMalloc` calls)
//! and never touches memory otherwise. Three backends stand behind the trait:
//! [`HostMemory`] (real, aligned host memory; the `cpu` device), [`SimMemory`] (host memory with a
//! real GPU's capacity and context overhead; `sim:*`) and [`MetaMemory`] (addresses only; `meta`);
//! real GPUs' buffers come from [`crate::gpu::memory::WgpuMemory`] (`gpu:N`).
//!
//! Host-backed segments get their device addresses from a counter, as address-only segments do,
//! not from where the host's `malloc`/`mmap` put the bytes: the allocator's best fit takes the
//! lowest address among equal free blocks, so with host addresses (top-down `mmap`, a heap
//! growing up, holes reused) a `cpu` or `sim` run would split other blocks than the unbacked
//! replay of the same allocations, and the planner's replay would not predict its own
//! measurement (GPT-2 small under bf16 autocast once reserved one 74 MiB segment more than its
//! replay). Counter addresses grow in the order segments are made, as a fresh CUDA context's do.
use std::alloc::{Layout, alloc, dealloc};
use std::ptr::NonNull;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::GpuProfile;

/// Alignment of every segment. Blocks are carved at 512-byte multiples from it, so every block
/// is at least 512-byte aligned (SIMD kernels rely on this).
pub const SEGMENT_ALIGN: usize = 4096;

/// One segment obtained from a backend.
#[derive(Debug)]
pub struct RawSegment {
    /// Device address. Host-backed backends number their segments in creation order (see the
    /// module note); the bytes are at `ptr`.
    pub addr: u64,
    /// Host pointer to the bytes; `None` for address-only backends.
    pub ptr: Option<NonNull<u8>>,
    pub size: u64,
}

// SAFETY: a RawSegment is a plain description of memory that only the owning allocator (behind
// its lock) reads or frees; the pointer is never dereferenced through this type.
unsafe impl Send for RawSegment {}

/// Why a backend refused a segment. The allocator frees its cached segments and asks again only
/// for a [retryable](RawAllocError::is_retryable) refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawAllocError {
    /// The device's capacity (as ferrite accounts for it) would be exceeded.
    CapacityExceeded,
    /// The host could not provide the memory.
    HostRefused,
    /// A GPU driver refused the buffer (out of device memory), whatever ferrite's accounting
    /// says: the card may be shared with other processes, or its capacity unknown.
    DriverRefused,
    /// Larger than any single buffer the device can create: no amount of freeing helps.
    TooLarge { max: u64 },
    /// The backend cannot reserve address space for expandable segments.
    Unsupported,
    /// The GPU is gone (driver reset, hang, removal): nothing can be allocated on it any more.
    DeviceLost { reason: String },
}

impl RawAllocError {
    /// Whether returning cached segments to the backend can make the same request succeed:
    /// true for the refusals that mean "not enough memory right now", false for a request that
    /// no memory can serve (too large, unsupported, device lost).
    pub fn is_retryable(&self) -> bool {
        match self {
            RawAllocError::CapacityExceeded | RawAllocError::HostRefused | RawAllocError::DriverRefused => true,
            RawAllocError::TooLarge { .. } | RawAllocError::Unsupported | RawAllocError::DeviceLost { .. } => false,
        }
    }
}

/// A source of segments. Implementations need not be thread-safe beyond `Send`: the caching
/// allocator calls them under its lock.
pub trait RawMemory: Send {
    /// Reserve `size` bytes (`size > 0`).
    fn allocate(&mut self, size: u64) -> Result<RawSegment, RawAllocError>;
    /// Return a segment obtained from [`RawMemory::allocate`] of this backend.
    fn free(&mut self, segment: RawSegment);
    /// Total device memory (`totalGlobalMem`), if the device has a fixed capacity.
    fn total_capacity(&self) -> Option<u64>;
    /// The most that can be reserved at once (capacity minus the context overhead).
    fn usable_capacity(&self) -> Option<u64>;
    /// Bytes currently reserved through this backend.
    fn reserved(&self) -> u64;
    /// Bytes still free on the device (`cudaMemGetInfo`'s free).
    fn device_free(&self) -> Option<u64> {
        self.usable_capacity().map(|u| u.saturating_sub(self.reserved()))
    }
    /// Reserve `size` bytes of address space for an expandable segment; nothing is committed
    /// (PyTorch's `cuMemAddressReserve`).
    fn reserve_address_space(&mut self, _size: u64) -> Result<RawSegment, RawAllocError> {
        Err(RawAllocError::Unsupported)
    }
    /// Commit `len` bytes at `offset` of a reserved range; counts against the capacity
    /// (`cuMemCreate` + `cuMemMap`).
    fn map(&mut self, _range: &RawSegment, _offset: u64, _len: u64) -> Result<(), RawAllocError> {
        Err(RawAllocError::Unsupported)
    }
    /// Give back the memory of `len` committed bytes at `offset` (`cuMemUnmap` + `cuMemRelease`).
    fn unmap(&mut self, _range: &RawSegment, _offset: u64, _len: u64) {}
    /// Return a reserved range whose pages are all unmapped.
    fn release_address_space(&mut self, _range: RawSegment) {}
    /// Whether [`Self::reserve_address_space`] and [`Self::map`] work (expandable segments).
    fn supports_expandable_segments(&self) -> bool {
        true
    }
    /// Whether work queued on a stream may still run after the call that queued it returns
    /// (CUDA). Only then does a block used on other streams (`record_stream`) wait for events
    /// before it is reused; on host-backed devices every op has finished when it returns.
    fn asynchronous_streams(&self) -> bool {
        false
    }
    /// Record an event after the work queued so far on `stream` (`cuEventRecord`); its id.
    fn record_event(&mut self, _stream: u32) -> Result<u64, RawAllocError> {
        Err(RawAllocError::Unsupported)
    }
    /// Whether the event's work has finished, without waiting (`cuEventQuery`).
    fn event_done(&mut self, _event: u64) -> Result<bool, RawAllocError> {
        Ok(true)
    }
    /// Wait until the event's work has finished (`cuEventSynchronize`).
    fn event_wait(&mut self, _event: u64) -> Result<(), RawAllocError> {
        Ok(())
    }
    /// Give the event back (the backend may pool it, as PyTorch does).
    fn destroy_event(&mut self, _event: u64) {}
}

/// Host address space reserved without backing (`mmap` with `PROT_NONE`); pages become usable
/// when mapped (`mprotect`) and their memory goes back to the kernel when unmapped (`madvise`).
#[cfg(unix)]
mod host_va {
    use super::{HOST_RESERVED, RawAllocError, RawSegment, host_ram};
    use std::ptr::NonNull;
    use std::sync::atomic::Ordering;

    pub fn reserve(size: u64) -> Result<RawSegment, RawAllocError> {
        let len = usize::try_from(size).map_err(|_| RawAllocError::HostRefused)?;
        // SAFETY: an anonymous private mapping with no access rights; it aliases nothing and is
        // only unmapped by `release` with the same length.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(RawAllocError::HostRefused);
        }
        let p = NonNull::new(p.cast::<u8>()).ok_or(RawAllocError::HostRefused)?;
        Ok(RawSegment { addr: p.as_ptr() as u64, ptr: Some(p), size })
    }

    pub fn map(range: &RawSegment, offset: u64, len: u64) -> Result<(), RawAllocError> {
        let Some(base) = range.ptr else { return Ok(()) };
        let before = HOST_RESERVED.fetch_add(len, Ordering::Relaxed);
        if host_ram().is_some_and(|ram| before.saturating_add(len) > ram) {
            HOST_RESERVED.fetch_sub(len, Ordering::Relaxed);
            return Err(RawAllocError::HostRefused);
        }
        // SAFETY: `[offset, offset + len)` lies inside the range reserved by `reserve` (the
        // allocator maps whole pages of its own segment); it becomes readable and writable.
        let rc = unsafe {
            libc::mprotect(base.as_ptr().add(offset as usize).cast(), len as usize, libc::PROT_READ | libc::PROT_WRITE)
        };
        if rc != 0 {
            HOST_RESERVED.fetch_sub(len, Ordering::Relaxed);
            return Err(RawAllocError::HostRefused);
        }
        Ok(())
    }

    pub fn unmap(range: &RawSegment, offset: u64, len: u64) {
        let Some(base) = range.ptr else { return };
        // SAFETY: the pages lie inside the reserved range and hold no live block (the allocator
        // unmaps only free pages); their contents are discarded and access is revoked.
        unsafe {
            let p = base.as_ptr().add(offset as usize).cast();
            libc::madvise(p, len as usize, libc::MADV_DONTNEED);
            libc::mprotect(p, len as usize, libc::PROT_NONE);
        }
        HOST_RESERVED.fetch_sub(len, Ordering::Relaxed);
    }

    pub fn release(range: RawSegment) {
        if let Some(base) = range.ptr {
            // SAFETY: the whole range came from `reserve` with this length and is released once.
            unsafe { libc::munmap(base.as_ptr().cast(), range.size as usize) };
        }
    }
}

#[cfg(not(unix))]
mod host_va {
    use super::{RawAllocError, RawSegment};
    pub fn reserve(_size: u64) -> Result<RawSegment, RawAllocError> {
        Err(RawAllocError::Unsupported)
    }
    pub fn map(_range: &RawSegment, _offset: u64, _len: u64) -> Result<(), RawAllocError> {
        Err(RawAllocError::Unsupported)
    }
    pub fn unmap(_range: &RawSegment, _offset: u64, _len: u64) {}
    pub fn release(_range: RawSegment) {}
}

/// Bytes of host memory reserved by all host-backed backends of the process (`cpu` and `sim`).
static HOST_RESERVED: AtomicU64 = AtomicU64::new(0);

/// Physical RAM, read once.
fn host_ram() -> Option<u64> {
    static RAM: OnceLock<Option<u64>> = OnceLock::new();
    *RAM.get_or_init(physical_memory)
}

/// Host memory reserved by all host-backed devices of this process.
pub fn host_reserved() -> u64 {
    HOST_RESERVED.load(Ordering::Relaxed)
}

fn host_alloc(size: u64) -> Result<RawSegment, RawAllocError> {
    // Never promise more host memory than the machine has: with overcommit the allocation would
    // succeed and the process be killed when the pages are touched. Refusing gives a typed OOM.
    let before = HOST_RESERVED.fetch_add(size, Ordering::Relaxed);
    if host_ram().is_some_and(|ram| before.saturating_add(size) > ram) {
        HOST_RESERVED.fetch_sub(size, Ordering::Relaxed);
        return Err(RawAllocError::HostRefused);
    }
    let seg = host_alloc_unchecked(size);
    if seg.is_err() {
        HOST_RESERVED.fetch_sub(size, Ordering::Relaxed);
    }
    seg
}

fn host_alloc_unchecked(size: u64) -> Result<RawSegment, RawAllocError> {
    let len = usize::try_from(size).map_err(|_| RawAllocError::HostRefused)?;
    let layout = Layout::from_size_align(len, SEGMENT_ALIGN).map_err(|_| RawAllocError::HostRefused)?;
    if len == 0 {
        return Err(RawAllocError::HostRefused);
    }
    // SAFETY: the layout has a non-zero size (checked above) and a valid power-of-two alignment.
    let p = unsafe { alloc(layout) };
    let p = NonNull::new(p).ok_or(RawAllocError::HostRefused)?;
    Ok(RawSegment { addr: p.as_ptr() as u64, ptr: Some(p), size })
}

fn host_free(segment: RawSegment) {
    if let Some(p) = segment.ptr {
        HOST_RESERVED.fetch_sub(segment.size, Ordering::Relaxed);
        // `host_alloc` succeeded with exactly this size and alignment, so the layout is valid.
        if let Ok(layout) = Layout::from_size_align(segment.size as usize, SEGMENT_ALIGN) {
            // SAFETY: `p` came from `alloc(layout)` with this layout and is freed exactly once
            // (the segment is consumed by value).
            unsafe { dealloc(p.as_ptr(), layout) };
        }
    }
}

/// First device address of `sim` and `cpu` segments, backed or not.
const DEVICE_BASE: u64 = 0x7f00_0000_0000;

/// `seg` (host memory) with the next counter address as its device address; on the counter's
/// overflow the host memory goes back through `release`.
fn numbered(
    mut seg: RawSegment,
    addresses: &mut FakeAddresses,
    release: fn(RawSegment),
) -> Result<RawSegment, RawAllocError> {
    match addresses.take(seg.size) {
        Ok(addr) => {
            seg.addr = addr;
            Ok(seg)
        }
        Err(e) => {
            release(seg);
            Err(e)
        }
    }
}

/// Bump allocator of fake, never reused device addresses.
#[derive(Debug)]
struct FakeAddresses {
    next: u64,
}

impl FakeAddresses {
    fn new(base: u64) -> FakeAddresses {
        FakeAddresses { next: base }
    }
    fn take(&mut self, size: u64) -> Result<u64, RawAllocError> {
        let addr = self.next;
        let step = size.checked_next_multiple_of(SEGMENT_ALIGN as u64).ok_or(RawAllocError::CapacityExceeded)?;
        self.next = self.next.checked_add(step).ok_or(RawAllocError::CapacityExceeded)?;
        Ok(addr)
    }
}

/// Real host memory (the `cpu` device). The limit defaults to the machine's physical RAM so a run
/// that would be killed by the kernel gets a diagnosable OOM instead. (All host-backed devices of
/// the process together are also kept within the physical RAM.)
#[derive(Debug)]
pub struct HostMemory {
    limit: Option<u64>,
    reserved: u64,
    addresses: FakeAddresses,
}

impl HostMemory {
    /// Host memory limited to the physical RAM (unlimited where it cannot be determined).
    pub fn new() -> HostMemory {
        HostMemory::with_limit(physical_memory())
    }
    /// Host memory with an explicit limit (`None` = only the host's own refusal).
    pub fn with_limit(limit: Option<u64>) -> HostMemory {
        HostMemory { limit, reserved: 0, addresses: FakeAddresses::new(DEVICE_BASE) }
    }
}

impl Default for HostMemory {
    fn default() -> Self {
        HostMemory::new()
    }
}

impl RawMemory for HostMemory {
    fn allocate(&mut self, size: u64) -> Result<RawSegment, RawAllocError> {
        if let Some(l) = self.limit
            && self.reserved.saturating_add(size) > l
        {
            return Err(RawAllocError::CapacityExceeded);
        }
        let seg = numbered(host_alloc(size)?, &mut self.addresses, host_free)?;
        self.reserved += size;
        Ok(seg)
    }
    fn free(&mut self, segment: RawSegment) {
        self.reserved -= segment.size;
        host_free(segment);
    }
    fn total_capacity(&self) -> Option<u64> {
        self.limit
    }
    fn usable_capacity(&self) -> Option<u64> {
        self.limit
    }
    fn reserved(&self) -> u64 {
        self.reserved
    }
    fn reserve_address_space(&mut self, size: u64) -> Result<RawSegment, RawAllocError> {
        numbered(host_va::reserve(size)?, &mut self.addresses, host_va::release)
    }
    fn map(&mut self, range: &RawSegment, offset: u64, len: u64) -> Result<(), RawAllocError> {
        map_counted(range, offset, len, self.limit, &mut self.reserved)
    }
    fn unmap(&mut self, range: &RawSegment, offset: u64, len: u64) {
        unmap_counted(range, offset, len, &mut self.reserved)
    }
    fn release_address_space(&mut self, range: RawSegment) {
        host_va::release(range);
    }
}

/// Commit `len` bytes at `offset` of a reserved host range (an expandable segment's pages),
/// counted in `reserved` and refused past `limit` — the `map` of every host-backed backend.
fn map_counted(
    range: &RawSegment,
    offset: u64,
    len: u64,
    limit: Option<u64>,
    reserved: &mut u64,
) -> Result<(), RawAllocError> {
    if limit.is_some_and(|l| reserved.saturating_add(len) > l) {
        return Err(RawAllocError::CapacityExceeded);
    }
    host_va::map(range, offset, len)?;
    *reserved += len;
    Ok(())
}

/// Give back pages committed by [`map_counted`].
fn unmap_counted(range: &RawSegment, offset: u64, len: u64, reserved: &mut u64) {
    host_va::unmap(range, offset, len);
    *reserved -= len;
}

/// A simulated GPU: refuses a segment exactly where the real card would run out
/// (`total - context overhead`), optionally backed by real host memory so kernels can compute.
#[derive(Debug)]
pub struct SimMemory {
    total: u64,
    usable: u64,
    reserved: u64,
    /// Real host memory behind the segments (`false`: addresses only, for replays and planning).
    backed: bool,
    /// Device addresses, in the same order backed or not.
    addresses: FakeAddresses,
}

impl SimMemory {
    /// Host-backed simulation of `profile`.
    pub fn new(profile: &GpuProfile) -> SimMemory {
        SimMemory { backed: true, ..SimMemory::unbacked(profile) }
    }
    /// Address-only simulation of `profile`: identical allocator decisions, no host memory used.
    pub fn unbacked(profile: &GpuProfile) -> SimMemory {
        SimMemory {
            total: profile.total_bytes,
            usable: profile.usable_bytes(),
            reserved: 0,
            backed: false,
            addresses: FakeAddresses::new(DEVICE_BASE),
        }
    }
}

impl RawMemory for SimMemory {
    fn allocate(&mut self, size: u64) -> Result<RawSegment, RawAllocError> {
        if self.reserved.saturating_add(size) > self.usable {
            return Err(RawAllocError::CapacityExceeded);
        }
        let seg = if self.backed {
            numbered(host_alloc(size)?, &mut self.addresses, host_free)?
        } else {
            RawSegment { addr: self.addresses.take(size)?, ptr: None, size }
        };
        self.reserved += size;
        Ok(seg)
    }
    fn free(&mut self, segment: RawSegment) {
        self.reserved -= segment.size;
        host_free(segment);
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
    fn reserve_address_space(&mut self, size: u64) -> Result<RawSegment, RawAllocError> {
        if self.backed {
            numbered(host_va::reserve(size)?, &mut self.addresses, host_va::release)
        } else {
            Ok(RawSegment { addr: self.addresses.take(size)?, ptr: None, size })
        }
    }
    fn map(&mut self, range: &RawSegment, offset: u64, len: u64) -> Result<(), RawAllocError> {
        map_counted(range, offset, len, Some(self.usable), &mut self.reserved)
    }
    fn unmap(&mut self, range: &RawSegment, offset: u64, len: u64) {
        unmap_counted(range, offset, len, &mut self.reserved)
    }
    fn release_address_space(&mut self, range: RawSegment) {
        host_va::release(range);
    }
}

/// Shape-only execution: distinct addresses, no backing memory, no capacity.
#[derive(Debug)]
pub struct MetaMemory {
    reserved: u64,
    fake: FakeAddresses,
}

impl MetaMemory {
    pub fn new() -> MetaMemory {
        MetaMemory { reserved: 0, fake: FakeAddresses::new(0x1000_0000_0000) }
    }
}

impl Default for MetaMemory {
    fn default() -> Self {
        MetaMemory::new()
    }
}

impl RawMemory for MetaMemory {
    fn allocate(&mut self, size: u64) -> Result<RawSegment, RawAllocError> {
        let addr = self.fake.take(size)?;
        self.reserved += size;
        Ok(RawSegment { addr, ptr: None, size })
    }
    fn free(&mut self, segment: RawSegment) {
        self.reserved -= segment.size;
    }
    fn total_capacity(&self) -> Option<u64> {
        None
    }
    fn usable_capacity(&self) -> Option<u64> {
        None
    }
    fn reserved(&self) -> u64 {
        self.reserved
    }
    fn reserve_address_space(&mut self, size: u64) -> Result<RawSegment, RawAllocError> {
        Ok(RawSegment { addr: self.fake.take(size)?, ptr: None, size })
    }
    fn map(&mut self, _range: &RawSegment, _offset: u64, len: u64) -> Result<(), RawAllocError> {
        self.reserved += len;
        Ok(())
    }
    fn unmap(&mut self, _range: &RawSegment, _offset: u64, len: u64) {
        self.reserved -= len;
    }
}

/// Physical RAM in bytes from `/proc/meminfo` (Linux); `None` elsewhere.
pub fn physical_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_refuses_exactly_at_usable_capacity() {
        let p = GpuProfile::custom(10 << 20);
        let mut m = SimMemory::new(&p);
        let a = m.allocate(6 << 20).unwrap();
        assert_eq!(m.allocate(6 << 20).unwrap_err(), RawAllocError::CapacityExceeded);
        let b = m.allocate(4 << 20).unwrap();
        assert_eq!(m.device_free(), Some(0));
        assert_eq!(a.addr % SEGMENT_ALIGN as u64, 0);
        m.free(a);
        m.free(b);
        assert_eq!(m.reserved(), 0);
    }

    #[test]
    fn meta_addresses_are_distinct() {
        let mut m = MetaMemory::new();
        let a = m.allocate(2 << 20).unwrap();
        let b = m.allocate(2 << 20).unwrap();
        assert!(a.ptr.is_none());
        assert!(b.addr >= a.addr + (2 << 20));
    }

    #[test]
    fn host_memory_is_real_and_aligned() {
        let mut m = HostMemory::with_limit(Some(4 << 20));
        let s = m.allocate(2 << 20).unwrap();
        let p = s.ptr.unwrap();
        assert_eq!(p.as_ptr() as usize % SEGMENT_ALIGN, 0);
        // SAFETY: the segment owns 2 MiB of writable memory.
        unsafe { p.as_ptr().write_bytes(7, 2 << 20) };
        assert_eq!(m.allocate(4 << 20).unwrap_err(), RawAllocError::CapacityExceeded);
        m.free(s);
    }
}
