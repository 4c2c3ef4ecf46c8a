//! The pinned host allocator's bookkeeping (PyTorch's `CachingHostAllocator`) against a fake
//! driver that checks every call: no double free, no free of memory it did not hand out, events
//! created before they are recorded and destroyed once, and a block used on a stream never handed
//! out again before that stream's event completed.
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use ferrite_memory::MemoryError;
use ferrite_memory::cuda::{CudaDriverError, PinnedHostAllocator, PinnedHostDriver, pinned_round_size};

#[derive(Default)]
struct FakeState {
    next: u64,
    live: HashMap<u64, u64>,
    /// Bytes the fake "host" can page-lock.
    capacity: u64,
    events: HashSet<u64>,
    /// Recorded events: stream and whether done.
    recorded: HashMap<u64, (u32, bool)>,
    next_event: u64,
    calls: Vec<String>,
}

#[derive(Clone)]
struct Fake(Arc<Mutex<FakeState>>);

impl Fake {
    fn new(capacity: u64) -> Fake {
        Fake(Arc::new(Mutex::new(FakeState { next: 0x1000, capacity, ..Default::default() })))
    }
    fn complete(&self, stream: u32) {
        for (s, done) in self.0.lock().unwrap().recorded.values_mut() {
            if *s == stream {
                *done = true;
            }
        }
    }
    fn live_bytes(&self) -> u64 {
        self.0.lock().unwrap().live.values().sum()
    }
    fn count(&self, call: &str) -> usize {
        self.0.lock().unwrap().calls.iter().filter(|c| c.starts_with(call)).count()
    }
}

fn oom() -> CudaDriverError {
    CudaDriverError { code: 2, name: "CUDA_ERROR_OUT_OF_MEMORY".into(), call: "cuMemHostAlloc" }
}

impl PinnedHostDriver for Fake {
    fn host_alloc(&mut self, size: u64) -> Result<u64, CudaDriverError> {
        let mut s = self.0.lock().unwrap();
        s.calls.push(format!("host_alloc {size}"));
        if s.live.values().sum::<u64>() + size > s.capacity {
            return Err(oom());
        }
        let p = s.next;
        s.next += size.max(1).next_multiple_of(4096);
        s.live.insert(p, size);
        Ok(p)
    }
    fn host_free(&mut self, ptr: u64) -> Result<(), CudaDriverError> {
        let mut s = self.0.lock().unwrap();
        s.calls.push(format!("host_free {ptr:#x}"));
        assert!(s.live.remove(&ptr).is_some(), "cuMemFreeHost of {ptr:#x}, which is not live (double free?)");
        Ok(())
    }
    fn event_create(&mut self) -> Result<u64, CudaDriverError> {
        let mut s = self.0.lock().unwrap();
        s.next_event += 1;
        let e = s.next_event;
        s.events.insert(e);
        s.calls.push(format!("event_create {e}"));
        Ok(e)
    }
    fn event_record(&mut self, event: u64, stream: u32) -> Result<(), CudaDriverError> {
        let mut s = self.0.lock().unwrap();
        assert!(s.events.contains(&event), "recording event {event}, which does not exist");
        s.recorded.insert(event, (stream, false));
        s.calls.push(format!("event_record {event} {stream}"));
        Ok(())
    }
    fn event_query(&mut self, event: u64) -> Result<bool, CudaDriverError> {
        let s = self.0.lock().unwrap();
        assert!(s.events.contains(&event), "querying event {event}, which does not exist");
        Ok(s.recorded.get(&event).is_none_or(|r| r.1))
    }
    fn event_destroy(&mut self, event: u64) -> Result<(), CudaDriverError> {
        let mut s = self.0.lock().unwrap();
        assert!(s.events.remove(&event), "destroying event {event} twice or never created");
        s.recorded.remove(&event);
        Ok(())
    }
}

#[test]
fn a_freed_block_is_reused_for_the_same_rounded_size_without_a_driver_call() {
    let fake = Fake::new(1 << 30);
    let a = PinnedHostAllocator::new(Box::new(fake.clone()));
    let b = a.allocate(3000).unwrap();
    assert_eq!((b.requested_size(), b.size()), (3000, 4096));
    let addr = b.addr();
    drop(b);
    let again = a.allocate(4000).unwrap();
    assert_eq!(again.addr(), addr, "same rounded size: the cached block");
    assert_eq!(fake.count("host_alloc"), 1);
    let other = a.allocate(5000).unwrap();
    assert_ne!(other.addr(), addr);
    assert_eq!(other.size(), 8192);
    let s = a.stats();
    assert_eq!((s.allocations.current, s.allocated_bytes.current), (2, 4096 + 8192));
    assert_eq!((s.active_requests.current, s.active_bytes.current), (2, 4096 + 8192));
    assert_eq!((s.num_host_alloc, s.num_host_free), (2, 0));
    drop(again);
    drop(other);
    let s = a.stats();
    assert_eq!((s.active_requests.current, s.active_bytes.current, s.active_bytes.peak), (0, 0, 4096 + 8192));
    assert_eq!(s.allocated_bytes.current, 4096 + 8192, "freed blocks stay cached");
    a.empty_cache();
    assert_eq!(fake.live_bytes(), 0);
    let s = a.stats();
    assert_eq!((s.allocations.current, s.allocated_bytes.current, s.num_host_free), (0, 0, 2));
    a.reset_peak_stats();
    assert_eq!(a.stats().allocated_bytes.peak, 0);
}

#[test]
fn a_block_used_on_a_stream_waits_for_its_event_before_reuse_or_release() {
    let fake = Fake::new(1 << 30);
    let a = PinnedHostAllocator::new(Box::new(fake.clone()));
    let b = a.allocate(1 << 20).unwrap();
    let addr = b.addr();
    b.record_stream(1);
    b.record_stream(1);
    drop(b);
    assert_eq!(fake.count("event_record"), 1, "one event per stream used");
    assert_eq!(a.pending_blocks(), 1);
    // The copy on stream 1 may still read it: a new request gets other memory...
    let c = a.allocate(1 << 20).unwrap();
    assert_ne!(c.addr(), addr);
    // ...and empty_cache does not give it back to the driver.
    drop(c);
    a.empty_cache();
    assert_eq!(fake.live_bytes(), 1 << 20, "the block with a pending event is still held");
    // Once stream 1 is past the event, the block is free again.
    fake.complete(1);
    assert_eq!(a.pending_blocks(), 0);
    let d = a.allocate(1 << 20).unwrap();
    assert_eq!(d.addr(), addr);
    drop(d);
    a.empty_cache();
    assert_eq!(fake.live_bytes(), 0);
    // The event went back to the pool and was destroyed once by empty_cache (the fake checks).
    assert_eq!(fake.count("event_create"), 1);
}

#[test]
fn a_refused_request_frees_the_cache_and_retries_once_then_is_a_typed_error() {
    let fake = Fake::new(4 << 20);
    let a = PinnedHostAllocator::new(Box::new(fake.clone()));
    drop(a.allocate(2 << 20).unwrap());
    // 2 MiB cached + 4 MiB new > 4 MiB: refused, the cache is freed, the retry succeeds.
    let b = a.allocate((3 << 20) + 1).unwrap();
    assert_eq!(b.size(), 4 << 20);
    assert_eq!((fake.count("host_alloc"), fake.count("host_free")), (3, 1));
    // Nothing cached to free: the retry is refused too, and the error says what was asked and held.
    let e = a.allocate(1).unwrap_err();
    assert!(matches!(e, MemoryError::PinnedHostFailed { requested: 1, held, .. } if held == 4 << 20), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("page-lock") && msg.contains("4.00 MiB"), "{msg}");
    drop(b);
    assert!(a.allocate(1).is_ok(), "after a free the same request is served");
    assert_eq!(pinned_round_size(0), 1);
    assert_eq!(a.allocate(0).unwrap().addr(), 0, "an empty request takes no memory");
}

#[test]
fn dropping_the_allocator_returns_every_block_and_event() {
    let fake = Fake::new(1 << 30);
    {
        let a = PinnedHostAllocator::new(Box::new(fake.clone()));
        let b = a.allocate(100).unwrap();
        b.record_stream(2);
        drop(b);
        drop(a.allocate(10_000).unwrap());
    }
    assert_eq!(fake.live_bytes(), 0);
    assert!(fake.0.lock().unwrap().events.is_empty(), "every event destroyed");
}
