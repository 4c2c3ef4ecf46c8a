//! Every segment a backend hands out comes back: through `empty_cache`, and when the allocator is
//! dropped with segments still cached.
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use ferrite_memory::raw_memory::{MetaMemory, RawAllocError, RawMemory, RawSegment};
use ferrite_memory::{AllocatorConfig, CachingAllocator, Device};

/// Meta memory that counts outstanding segments and mapped bytes.
struct Counting {
    inner: MetaMemory,
    segments: Arc<AtomicI64>,
    mapped: Arc<AtomicI64>,
}

impl RawMemory for Counting {
    fn allocate(&mut self, size: u64) -> Result<RawSegment, RawAllocError> {
        self.segments.fetch_add(1, Ordering::SeqCst);
        self.inner.allocate(size)
    }
    fn free(&mut self, segment: RawSegment) {
        self.segments.fetch_sub(1, Ordering::SeqCst);
        self.inner.free(segment)
    }
    fn total_capacity(&self) -> Option<u64> {
        None
    }
    fn usable_capacity(&self) -> Option<u64> {
        None
    }
    fn reserved(&self) -> u64 {
        self.inner.reserved()
    }
    fn reserve_address_space(&mut self, size: u64) -> Result<RawSegment, RawAllocError> {
        self.segments.fetch_add(1, Ordering::SeqCst);
        self.inner.reserve_address_space(size)
    }
    fn map(&mut self, range: &RawSegment, offset: u64, len: u64) -> Result<(), RawAllocError> {
        self.mapped.fetch_add(len as i64, Ordering::SeqCst);
        self.inner.map(range, offset, len)
    }
    fn unmap(&mut self, range: &RawSegment, offset: u64, len: u64) {
        self.mapped.fetch_sub(len as i64, Ordering::SeqCst);
        self.inner.unmap(range, offset, len)
    }
    fn release_address_space(&mut self, range: RawSegment) {
        self.segments.fetch_sub(1, Ordering::SeqCst);
        self.inner.release_address_space(range)
    }
}

#[test]
fn dropping_an_allocator_returns_its_cached_segments() {
    for conf in ["", "expandable_segments:True"] {
        let segments = Arc::new(AtomicI64::new(0));
        let mapped = Arc::new(AtomicI64::new(0));
        let backend = Counting { inner: MetaMemory::new(), segments: segments.clone(), mapped: mapped.clone() };
        let a = CachingAllocator::with_backend(Device::Meta, AllocatorConfig::parse(conf).unwrap(), Box::new(backend));
        let keep = a.allocate(3 << 20).unwrap();
        for s in [100usize, 600 << 10, 5 << 20, 30 << 20] {
            drop(a.allocate(s).unwrap());
        }
        assert!(segments.load(Ordering::SeqCst) > 0);
        // a block may outlive the allocator handle; the memory goes back when both are gone
        drop(a);
        assert!(segments.load(Ordering::SeqCst) > 0);
        drop(keep);
        assert_eq!(segments.load(Ordering::SeqCst), 0, "{conf}");
        assert_eq!(mapped.load(Ordering::SeqCst), 0, "{conf}");
    }
}
