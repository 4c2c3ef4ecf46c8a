//! How the allocator answers each way a backend can refuse a segment: a GPU driver's refusal is
//! retried after freeing the cache and, if it persists, reported as the retryable
//! `MemoryError::DriverRefused`, apart from `OutOfMemory` (ferrite's own capacity accounting);
//! refusals no freeing can cure (a buffer over the device's limit, a lost device) leave the
//! cache alone and say what happened.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ferrite_memory::raw_memory::{MetaMemory, RawAllocError, RawMemory, RawSegment};
use ferrite_memory::{AllocatorConfig, CachingAllocator, Device, MemoryError};

const MIB: usize = 1 << 20;

/// Address-only memory behind a pretend GPU driver: it refuses buffers past `driver_bytes` in
/// total (its real free memory, unknown to ferrite), buffers over `max_buffer`, and everything
/// once `lost` is set.
struct PretendDriver {
    inner: MetaMemory,
    driver_bytes: u64,
    max_buffer: u64,
    lost: Arc<AtomicBool>,
}

impl RawMemory for PretendDriver {
    fn allocate(&mut self, size: u64) -> Result<RawSegment, RawAllocError> {
        if self.lost.load(Ordering::SeqCst) {
            return Err(RawAllocError::DeviceLost { reason: "Unknown: pretend device removed".into() });
        }
        if size > self.max_buffer {
            return Err(RawAllocError::TooLarge { max: self.max_buffer });
        }
        if self.inner.reserved() + size > self.driver_bytes {
            return Err(RawAllocError::DriverRefused);
        }
        self.inner.allocate(size)
    }
    fn free(&mut self, segment: RawSegment) {
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
    fn supports_expandable_segments(&self) -> bool {
        false
    }
}

fn allocator(driver_mib: u64, max_buffer_mib: u64) -> (CachingAllocator, Arc<AtomicBool>) {
    let lost = Arc::new(AtomicBool::new(false));
    let driver = PretendDriver {
        inner: MetaMemory::new(),
        driver_bytes: driver_mib << 20,
        max_buffer: max_buffer_mib << 20,
        lost: lost.clone(),
    };
    (CachingAllocator::with_backend(Device::Meta, AllocatorConfig::default(), Box::new(driver)), lost)
}

#[test]
fn a_driver_refusal_frees_the_cache_and_retries() {
    let (a, _) = allocator(64, 1024);
    drop(a.allocate(40 * MIB).unwrap());
    assert_eq!(a.memory_reserved(), 40 << 20, "the 40 MiB segment stays cached");
    // 40 MiB cached + 50 MiB new is more than the driver has: the cache goes back, then it fits.
    let b = a.allocate(50 * MIB).unwrap();
    assert_eq!(a.memory_stats().num_alloc_retries, 1);
    assert_eq!(a.memory_reserved(), 50 << 20);
    drop(b);
    a.check_consistency().unwrap();
}

#[test]
fn a_persistent_driver_refusal_is_its_own_retryable_error() {
    let (a, _) = allocator(64, 1024);
    let _live = a.allocate(40 * MIB).unwrap();
    let e = a.allocate(30 * MIB).unwrap_err();
    let MemoryError::DriverRefused { report } = &e else { panic!("expected DriverRefused, got {e:?}") };
    assert!(e.is_retryable());
    assert!(report.driver_refused);
    assert_eq!(e.oom_report(), Some(&**report), "a driver refusal carries the OOM picture too");
    assert!(e.to_string().contains("driver refused"), "{e}");
    assert_eq!(a.memory_stats().num_ooms, 1);

    // Capacity exceeded (ferrite's accounting, the same request fails again) is not retryable.
    let sim = CachingAllocator::new(Device::parse("sim:64MiB").unwrap());
    let _held = sim.allocate(40 * MIB).unwrap();
    let e = sim.allocate(30 * MIB).unwrap_err();
    assert!(matches!(e, MemoryError::OutOfMemory { .. }), "{e:?}");
    assert!(!e.is_retryable());
    assert!(!e.oom_report().unwrap().driver_refused);
}

#[test]
fn a_buffer_over_the_device_limit_leaves_the_cache_alone() {
    let (a, _) = allocator(1024, 100);
    drop(a.allocate(40 * MIB).unwrap());
    let e = a.allocate(200 * MIB).unwrap_err();
    let MemoryError::BufferTooLarge { requested, max, .. } = e else { panic!("expected BufferTooLarge, got {e:?}") };
    assert_eq!((requested, max), ((200 * MIB) as u64, 100 << 20));
    assert!(!e.is_retryable());
    assert_eq!(a.memory_reserved(), 40 << 20, "no freeing helps a buffer that can never exist");
    assert_eq!(a.memory_stats().num_alloc_retries, 0);
    a.check_consistency().unwrap();
}

#[test]
fn a_lost_device_is_unavailable_not_out_of_memory() {
    let (a, lost) = allocator(1024, 1024);
    drop(a.allocate(40 * MIB).unwrap());
    lost.store(true, Ordering::SeqCst);
    let e = a.allocate(50 * MIB).unwrap_err();
    let MemoryError::GpuUnavailable { reason, .. } = &e else { panic!("expected GpuUnavailable, got {e:?}") };
    assert!(reason.contains("pretend device removed") && reason.contains("Restart"), "{reason}");
    assert!(!e.is_retryable());
    assert_eq!(a.memory_stats().num_ooms, 0);
    assert_eq!(a.memory_reserved(), 40 << 20);
}
