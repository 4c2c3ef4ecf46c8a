//! INTERIM allocator: direct host allocation per block with minimal statistics. Replaced by the
//! PyTorch-semantics caching allocator (issue 2); the public signatures are the contract.
use std::alloc::{alloc, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::{Device, MemoryError};

const ALIGN: usize = 512;

struct Inner {
    device: Device,
    allocated: AtomicU64,
    peak: AtomicU64,
    next_meta: AtomicU64,
}

/// One allocator per device (see [`crate::allocator`]).
pub struct CachingAllocator {
    inner: Arc<Inner>,
}

/// A device buffer. Returned to its allocator when dropped.
pub struct Block {
    inner: Arc<Inner>,
    ptr: Option<NonNull<u8>>,
    addr: u64,
    size: usize,
    requested: usize,
}

// SAFETY: a Block exclusively owns its buffer; the pointer is never shared except through the
// Block itself, and the allocator state it refers to is atomic.
unsafe impl Send for Block {}
// SAFETY: &Block only exposes the pointer value; writing through it is the caller's unsafe business.
unsafe impl Sync for Block {}

impl CachingAllocator {
    pub fn new(device: Device) -> Self {
        CachingAllocator {
            inner: Arc::new(Inner { device, allocated: AtomicU64::new(0), peak: AtomicU64::new(0), next_meta: AtomicU64::new(1 << 40) }),
        }
    }

    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// Allocate `size` bytes (uninitialised). `size == 0` gives an empty block.
    #[track_caller]
    pub fn allocate(&self, size: usize) -> Result<Block, MemoryError> {
        let rounded = if size == 0 { 0 } else { size.div_ceil(ALIGN) * ALIGN };
        let (ptr, addr) = if rounded == 0 {
            (None, 0)
        } else if matches!(self.inner.device, Device::Meta) {
            (None, self.inner.next_meta.fetch_add(rounded as u64, Ordering::Relaxed))
        } else {
            let layout = Layout::from_size_align(rounded, ALIGN).map_err(|_| self.oom(size))?;
            // SAFETY: layout has non-zero size.
            let p = NonNull::new(unsafe { alloc(layout) }).ok_or_else(|| self.oom(size))?;
            (Some(p), p.as_ptr() as u64)
        };
        let now = self.inner.allocated.fetch_add(rounded as u64, Ordering::Relaxed) + rounded as u64;
        self.inner.peak.fetch_max(now, Ordering::Relaxed);
        Ok(Block { inner: self.inner.clone(), ptr, addr, size: rounded, requested: size })
    }

    fn oom(&self, size: usize) -> MemoryError {
        MemoryError::OutOfMemory { device: self.inner.device.to_string(), requested: size as u64 }
    }

    pub fn memory_allocated(&self) -> u64 {
        self.inner.allocated.load(Ordering::Relaxed)
    }
    pub fn max_memory_allocated(&self) -> u64 {
        self.inner.peak.load(Ordering::Relaxed)
    }
    pub fn memory_reserved(&self) -> u64 {
        self.memory_allocated()
    }
    pub fn max_memory_reserved(&self) -> u64 {
        self.max_memory_allocated()
    }
    pub fn reset_peak_memory_stats(&self) {
        self.inner.peak.store(self.memory_allocated(), Ordering::Relaxed);
    }
    pub fn empty_cache(&self) {}
}

impl Block {
    /// Device address (fake but unique for `meta`).
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Host pointer to the bytes: `Some` for `cpu` and `sim`, `None` for `meta` and empty blocks.
    pub fn host_ptr(&self) -> Option<NonNull<u8>> {
        self.ptr
    }
    /// Rounded size in bytes (what the allocator accounts).
    pub fn size(&self) -> usize {
        self.size
    }
    /// Size the caller asked for.
    pub fn requested_size(&self) -> usize {
        self.requested
    }
    pub fn device(&self) -> &Device {
        &self.inner.device
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Some(p) = self.ptr {
            let layout = Layout::from_size_align(self.size, ALIGN).expect("layout was valid at allocation");
            // SAFETY: p was allocated with exactly this layout and is freed once.
            unsafe { dealloc(p.as_ptr(), layout) };
        }
        self.inner.allocated.fetch_sub(self.size as u64, Ordering::Relaxed);
    }
}
