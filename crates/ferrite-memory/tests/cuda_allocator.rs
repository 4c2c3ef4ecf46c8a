//! The caching allocator on the CUDA driver API, checked on a CPU: [`CudaMemory`] over a fake
//! driver that models device memory, virtual-memory mappings, streams with queued work and
//! events, and records every call that a real driver would answer with corruption or an error —
//! memory handed out again, or unmapped, while another stream's queued work may still use it
//! (`cuMemFree` synchronizes the device by itself, `cuMemUnmap` does not), double frees,
//! overlapping mappings, handles released while mapped, unbalanced mappings at the end.
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use ferrite_memory::cuda::{CudaDriver, CudaDriverError, CudaMemory};
use ferrite_memory::{AllocatorConfig, Block, CachingAllocator, Device, MemoryError};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;
const GRANULE: u64 = 2 * MIB;

/// Work queued on a stream that touches `[addr, addr + len)`.
#[derive(Debug, Clone, Copy)]
struct Work {
    seq: u64,
    addr: u64,
    len: u64,
}

#[derive(Debug, Default)]
struct FakeState {
    capacity: u64,
    used: u64,
    next_addr: u64,
    allocations: HashMap<u64, u64>,
    reserved_ranges: BTreeMap<u64, u64>,
    /// Mapped granule address → handle.
    mapped: BTreeMap<u64, u64>,
    /// Handle → (size, mapped at).
    handles: HashMap<u64, (u64, Option<u64>)>,
    next_handle: u64,
    /// Queued work per stream, and the sequence number up to which it has finished.
    work: HashMap<u32, Vec<Work>>,
    done_upto: HashMap<u32, u64>,
    next_seq: u64,
    /// Live events: the (stream, sequence) they wait for once recorded.
    events: HashMap<u64, Option<(u32, u64)>>,
    next_event: u64,
    events_created: u64,
    events_destroyed: u64,
    /// A failure to return from the next call of this name.
    fail_next: Option<(&'static str, i32)>,
    calls: Vec<&'static str>,
    violations: Vec<String>,
}

impl FakeState {
    fn outstanding(&self, stream: u32) -> impl Iterator<Item = &Work> {
        let done = self.done_upto.get(&stream).copied().unwrap_or(0);
        self.work.get(&stream).into_iter().flatten().filter(move |w| w.seq > done)
    }

    /// Whether work on any stream other than `except` (all when `None`) may still touch the range.
    fn in_use(&self, addr: u64, len: u64, except: Option<u32>) -> Option<u32> {
        self.work
            .keys()
            .copied()
            .filter(|s| Some(*s) != except)
            .find(|&s| self.outstanding(s).any(|w| w.addr < addr + len && addr < w.addr + w.len))
    }

    fn call(&mut self, name: &'static str) -> Result<(), CudaDriverError> {
        self.calls.push(name);
        match self.fail_next {
            Some((n, code)) if n == name => {
                self.fail_next = None;
                Err(CudaDriverError { code, name: format!("CUDA_ERROR_{code}"), call: name })
            }
            _ => Ok(()),
        }
    }
}

/// A fake CUDA driver; clones share one device.
#[derive(Clone, Default)]
struct FakeDriver(Arc<Mutex<FakeState>>);

impl FakeDriver {
    fn new(capacity: u64) -> FakeDriver {
        FakeDriver(Arc::new(Mutex::new(FakeState { capacity, next_addr: 1 << 40, ..Default::default() })))
    }

    fn state(&self) -> MutexGuard<'_, FakeState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue work touching `block` on `stream`.
    fn launch(&self, stream: u32, block: &Block) {
        let mut s = self.state();
        s.next_seq += 1;
        let seq = s.next_seq;
        s.work.entry(stream).or_default().push(Work { seq, addr: block.addr(), len: block.size() as u64 });
    }

    /// Let every queued kernel of `stream` finish.
    fn complete(&self, stream: u32) {
        let mut s = self.state();
        let seq = s.next_seq;
        s.done_upto.insert(stream, seq);
    }

    /// The allocator handed `block` to `stream`: no other stream's queued work may touch it.
    fn check_handed_out(&self, block: &Block) {
        let mut s = self.state();
        if let Some(other) = s.in_use(block.addr(), block.size() as u64, Some(block.stream())) {
            let msg = format!(
                "block {:#x}+{} handed to stream {} while stream {other} may still use it",
                block.addr(),
                block.size(),
                block.stream()
            );
            s.violations.push(msg);
        }
    }

    fn violations(&self) -> Vec<String> {
        self.state().violations.clone()
    }

    fn count(&self, call: &str) -> usize {
        self.state().calls.iter().filter(|c| **c == call).count()
    }

    /// After the allocator is gone: everything given back, every event destroyed.
    fn check_balanced(&self) -> Vec<String> {
        let s = self.state();
        let mut v = s.violations.clone();
        if !s.allocations.is_empty() {
            v.push(format!("{} cuMemAlloc allocations never freed", s.allocations.len()));
        }
        if !s.mapped.is_empty() || !s.handles.is_empty() || !s.reserved_ranges.is_empty() {
            v.push(format!(
                "unbalanced virtual memory: {} granules mapped, {} handles, {} ranges reserved",
                s.mapped.len(),
                s.handles.len(),
                s.reserved_ranges.len()
            ));
        }
        if s.events_created != s.events_destroyed {
            v.push(format!("{} events created, {} destroyed", s.events_created, s.events_destroyed));
        }
        v
    }
}

fn oom(call: &'static str) -> CudaDriverError {
    CudaDriverError { code: CudaDriverError::OUT_OF_MEMORY, name: "CUDA_ERROR_OUT_OF_MEMORY".into(), call }
}

impl CudaDriver for FakeDriver {
    fn mem_get_info(&mut self) -> Result<(u64, u64), CudaDriverError> {
        let mut s = self.state();
        s.call("cuMemGetInfo_v2")?;
        Ok((s.capacity - s.used, s.capacity))
    }

    fn mem_alloc(&mut self, size: u64) -> Result<u64, CudaDriverError> {
        let mut s = self.state();
        s.call("cuMemAlloc_v2")?;
        if s.used + size > s.capacity {
            return Err(oom("cuMemAlloc_v2"));
        }
        let addr = s.next_addr;
        s.next_addr += size.div_ceil(GRANULE) * GRANULE;
        s.used += size;
        s.allocations.insert(addr, size);
        Ok(addr)
    }

    fn mem_free(&mut self, ptr: u64) -> Result<(), CudaDriverError> {
        let mut s = self.state();
        s.call("cuMemFree_v2")?;
        let Some(size) = s.allocations.remove(&ptr) else {
            s.violations.push(format!("cuMemFree of {ptr:#x}, which is not allocated (double free?)"));
            return Err(CudaDriverError { code: 1, name: "CUDA_ERROR_INVALID_VALUE".into(), call: "cuMemFree_v2" });
        };
        // cuMemFree synchronizes the device: queued work finishes first.
        let seq = s.next_seq;
        let streams: Vec<u32> = s.work.keys().copied().collect();
        for stream in streams {
            s.done_upto.insert(stream, seq);
        }
        s.used -= size;
        Ok(())
    }

    fn allocation_granularity(&mut self) -> Result<Option<u64>, CudaDriverError> {
        Ok(Some(GRANULE))
    }

    fn address_reserve(&mut self, size: u64) -> Result<u64, CudaDriverError> {
        let mut s = self.state();
        s.call("cuMemAddressReserve")?;
        if !size.is_multiple_of(GRANULE) {
            s.violations.push(format!("cuMemAddressReserve of {size} bytes, not a multiple of the granularity"));
        }
        let addr = s.next_addr;
        s.next_addr += size;
        s.reserved_ranges.insert(addr, size);
        Ok(addr)
    }

    fn address_free(&mut self, ptr: u64, size: u64) -> Result<(), CudaDriverError> {
        let mut s = self.state();
        s.call("cuMemAddressFree")?;
        if s.reserved_ranges.remove(&ptr) != Some(size) {
            s.violations.push(format!("cuMemAddressFree of {ptr:#x}+{size}, not a reserved range"));
        }
        if s.mapped.range(ptr..ptr + size).next().is_some() {
            s.violations.push(format!("cuMemAddressFree of {ptr:#x} with granules still mapped in it"));
        }
        Ok(())
    }

    fn mem_create(&mut self, size: u64) -> Result<u64, CudaDriverError> {
        let mut s = self.state();
        s.call("cuMemCreate")?;
        if s.used + size > s.capacity {
            return Err(oom("cuMemCreate"));
        }
        s.used += size;
        s.next_handle += 1;
        let h = s.next_handle;
        s.handles.insert(h, (size, None));
        Ok(h)
    }

    fn mem_release(&mut self, handle: u64) -> Result<(), CudaDriverError> {
        let mut s = self.state();
        s.call("cuMemRelease")?;
        match s.handles.remove(&handle) {
            Some((size, at)) => {
                if let Some(at) = at {
                    s.violations.push(format!("cuMemRelease of handle {handle} still mapped at {at:#x}"));
                }
                s.used -= size;
            }
            None => s.violations.push(format!("cuMemRelease of unknown handle {handle}")),
        }
        Ok(())
    }

    fn mem_map(&mut self, ptr: u64, size: u64, handle: u64) -> Result<(), CudaDriverError> {
        let mut s = self.state();
        s.call("cuMemMap")?;
        let inside = s.reserved_ranges.range(..=ptr).next_back().is_some_and(|(a, l)| ptr + size <= a + l);
        if !inside {
            s.violations.push(format!("cuMemMap at {ptr:#x} outside every reserved range"));
        }
        if s.mapped.range(ptr..ptr + size).next().is_some() {
            s.violations.push(format!("cuMemMap at {ptr:#x} over a mapped granule"));
        }
        match s.handles.get_mut(&handle) {
            Some(h) if h.0 == size && h.1.is_none() => h.1 = Some(ptr),
            _ => s.violations.push(format!("cuMemMap of handle {handle}: unknown, mapped, or of another size")),
        }
        s.mapped.insert(ptr, handle);
        Ok(())
    }

    fn mem_set_access(&mut self, ptr: u64, size: u64) -> Result<(), CudaDriverError> {
        let mut s = self.state();
        s.call("cuMemSetAccess")?;
        let granules = s.mapped.range(ptr..ptr + size).count() as u64;
        if granules * GRANULE != size {
            s.violations.push(format!("cuMemSetAccess over {ptr:#x}+{size}, not all mapped"));
        }
        Ok(())
    }

    fn ctx_synchronize(&mut self) -> Result<(), CudaDriverError> {
        let mut s = self.state();
        s.call("cuCtxSynchronize")?;
        let seq = s.next_seq;
        let streams: Vec<u32> = s.work.keys().copied().collect();
        for stream in streams {
            s.done_upto.insert(stream, seq);
        }
        Ok(())
    }

    fn mem_unmap(&mut self, ptr: u64, size: u64) -> Result<(), CudaDriverError> {
        let mut s = self.state();
        s.call("cuMemUnmap")?;
        if let Some(stream) = s.in_use(ptr, size, None) {
            s.violations.push(format!("cuMemUnmap of {ptr:#x} while stream {stream} may still use it"));
        }
        match s.mapped.remove(&ptr) {
            Some(h) => {
                if let Some(e) = s.handles.get_mut(&h) {
                    e.1 = None;
                }
            }
            None => s.violations.push(format!("cuMemUnmap of {ptr:#x}, which is not mapped")),
        }
        Ok(())
    }

    fn event_create(&mut self) -> Result<u64, CudaDriverError> {
        let mut s = self.state();
        s.call("cuEventCreate")?;
        s.next_event += 1;
        let e = s.next_event;
        s.events.insert(e, None);
        s.events_created += 1;
        Ok(e)
    }

    fn event_record(&mut self, event: u64, stream: u32) -> Result<(), CudaDriverError> {
        let mut s = self.state();
        s.call("cuEventRecord")?;
        let seq = s.work.get(&stream).and_then(|w| w.last()).map_or(0, |w| w.seq);
        match s.events.get_mut(&event) {
            Some(e) => *e = Some((stream, seq)),
            None => s.violations.push(format!("cuEventRecord of destroyed event {event}")),
        }
        Ok(())
    }

    fn event_query(&mut self, event: u64) -> Result<bool, CudaDriverError> {
        let mut s = self.state();
        s.call("cuEventQuery")?;
        match s.events.get(&event).copied() {
            Some(Some((stream, seq))) => Ok(s.done_upto.get(&stream).copied().unwrap_or(0) >= seq),
            Some(None) => Ok(true),
            None => {
                s.violations.push(format!("cuEventQuery of destroyed event {event}"));
                Ok(true)
            }
        }
    }

    fn event_synchronize(&mut self, event: u64) -> Result<(), CudaDriverError> {
        let mut s = self.state();
        s.call("cuEventSynchronize")?;
        // Waiting lets the stream's work up to the event finish.
        if let Some(Some((stream, seq))) = s.events.get(&event).copied() {
            let done = s.done_upto.entry(stream).or_insert(0);
            *done = (*done).max(seq);
        }
        Ok(())
    }

    fn event_destroy(&mut self, event: u64) -> Result<(), CudaDriverError> {
        let mut s = self.state();
        s.call("cuEventDestroy_v2")?;
        if s.events.remove(&event).is_none() {
            s.violations.push(format!("cuEventDestroy of unknown event {event}"));
        }
        s.events_destroyed += 1;
        Ok(())
    }
}

fn allocator(driver: &FakeDriver, conf: &str) -> CachingAllocator {
    let memory = CudaMemory::new(driver.clone()).expect("fake driver answers");
    let config = AllocatorConfig::parse(conf).expect("valid settings");
    CachingAllocator::with_backend(Device::Gpu { index: 0 }, config, Box::new(memory))
}

#[test]
fn a_block_used_on_another_stream_waits_for_its_event() {
    let d = FakeDriver::new(1 << 30);
    let a = allocator(&d, "");
    let x = a.allocate_on_stream(MIB as usize, 0).unwrap();
    let addr = x.addr();
    d.launch(1, &x);
    x.record_stream(1);
    drop(x);
    assert_eq!(a.memory_allocated(), 0, "freed from the caller's view at once");
    assert_eq!(a.pending_free_blocks(), 1);
    let y = a.allocate_on_stream(MIB as usize, 0).unwrap();
    d.check_handed_out(&y);
    assert_ne!(y.addr(), addr, "reused while stream 1 may still write it");
    d.complete(1);
    let z = a.allocate_on_stream(MIB as usize, 0).unwrap();
    d.check_handed_out(&z);
    assert_eq!(z.addr(), addr, "after the event completes the block is reused");
    assert_eq!(a.pending_free_blocks(), 0);
    a.check_consistency().unwrap();
    drop((y, z, a));
    assert_eq!(d.check_balanced(), Vec::<String>::new());
}

#[test]
fn the_snapshot_shows_a_pending_block_as_active_pending_free() {
    let d = FakeDriver::new(1 << 30);
    let a = allocator(&d, "");
    let x = a.allocate(4 * MIB as usize).unwrap();
    d.launch(2, &x);
    x.record_stream(2);
    drop(x);
    let snap = a.snapshot();
    let states: Vec<_> = snap.segments.iter().flat_map(|s| s.blocks.iter().map(|b| b.state)).collect();
    assert!(states.contains(&ferrite_memory::BlockState::ActivePendingFree), "{states:?}");
    a.check_consistency().unwrap();
}

#[test]
fn empty_cache_waits_for_events_before_returning_memory_to_the_driver() {
    let d = FakeDriver::new(1 << 30);
    let a = allocator(&d, "");
    let x = a.allocate(8 * MIB as usize).unwrap();
    d.launch(1, &x);
    x.record_stream(1);
    drop(x);
    a.empty_cache();
    assert_eq!(d.count("cuEventSynchronize"), 1);
    assert_eq!(d.count("cuMemFree_v2"), 1, "the segment goes back once its stream has finished");
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(d.violations(), Vec::<String>::new());
    drop(a);
    assert_eq!(d.check_balanced(), Vec::<String>::new());
}

#[test]
fn expandable_segments_map_granules_and_give_them_back() {
    let d = FakeDriver::new(1 << 30);
    let a = allocator(&d, "expandable_segments:True");
    let blocks: Vec<Block> = (1..=4).map(|i| a.allocate((i * 3 * MIB) as usize).unwrap()).collect();
    assert!(d.count("cuMemMap") > 0 && d.count("cuMemAddressReserve") >= 1);
    assert_eq!(d.count("cuMemMap"), d.count("cuMemCreate"));
    drop(blocks);
    a.empty_cache();
    assert_eq!(d.count("cuMemUnmap"), d.count("cuMemMap"), "every mapped granule unmapped");
    assert_eq!(d.count("cuMemRelease"), d.count("cuMemCreate"));
    drop(a);
    assert_eq!(d.check_balanced(), Vec::<String>::new());
}

#[test]
fn a_driver_out_of_memory_frees_the_cache_and_retries_then_reports() {
    let d = FakeDriver::new(64 * MIB);
    let a = allocator(&d, "");
    drop(a.allocate(40 * MIB as usize).unwrap());
    // Cached 40 MiB + 50 MiB new exceeds 64 MiB: the allocator frees its cache and retries.
    let b = a.allocate(50 * MIB as usize).unwrap();
    assert_eq!(d.count("cuMemFree_v2"), 1);
    // Now nothing can make room: the out-of-memory report, not a panic.
    let e = a.allocate(20 * MIB as usize).unwrap_err();
    assert!(e.oom_report().is_some(), "{e}");
    drop((b, a));
    assert_eq!(d.check_balanced(), Vec::<String>::new());
}

#[test]
fn a_failure_other_than_out_of_memory_is_a_lost_device_for_every_later_request() {
    let d = FakeDriver::new(1 << 30);
    let a = allocator(&d, "");
    d.state().fail_next = Some(("cuMemAlloc_v2", 700));
    let e = a.allocate(MIB as usize).unwrap_err();
    assert!(e.to_string().contains("cuMemAlloc_v2") && e.to_string().contains("700"), "{e}");
    let calls = d.count("cuMemAlloc_v2");
    let e2 = a.allocate(MIB as usize).unwrap_err();
    assert!(matches!(&e2, MemoryError::GpuUnavailable { reason, .. } if reason.contains("lost")), "{e2:?}");
    assert_eq!(d.count("cuMemAlloc_v2"), calls, "a broken context is not called again");
}

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        size: u64,
        stream: u32,
    },
    /// Use live block `i % live` on a stream (recording it when the stream is another one).
    Use {
        i: usize,
        stream: u32,
    },
    Free {
        i: usize,
    },
    Complete {
        stream: u32,
    },
    EmptyCache,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prop_oneof![1u64..4096, 4096u64..(1 << 20), (1u64 << 20)..(24 << 20)], 0u32..3)
            .prop_map(|(size, stream)| Op::Alloc { size, stream }),
        3 => (any::<usize>(), 0u32..3).prop_map(|(i, stream)| Op::Use { i, stream }),
        3 => any::<usize>().prop_map(|i| Op::Free { i }),
        2 => (0u32..3).prop_map(|stream| Op::Complete { stream }),
        1 => Just(Op::EmptyCache),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any sequence of allocations, cross-stream uses, frees, stream completions and empty_cache,
    /// with or without expandable segments: no memory is handed out or returned while another
    /// stream may use it, the statistics match the blocks after every step, and at the end every
    /// driver resource is given back.
    #[test]
    fn no_block_is_reused_or_returned_while_another_stream_uses_it(
        ops in prop::collection::vec(op(), 1..80),
        expandable in any::<bool>(),
    ) {
        let d = FakeDriver::new(256 * MIB);
        let a = allocator(&d, if expandable { "expandable_segments:True" } else { "" });
        let mut live: Vec<Block> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { size, stream } => {
                    if let Ok(b) = a.allocate_on_stream(size as usize, stream) {
                        d.check_handed_out(&b);
                        live.push(b);
                    }
                }
                Op::Use { i, stream } if !live.is_empty() => {
                    let b = &live[i % live.len()];
                    d.launch(stream, b);
                    b.record_stream(stream);
                }
                Op::Free { i } if !live.is_empty() => {
                    let n = live.len();
                    drop(live.swap_remove(i % n));
                }
                Op::Complete { stream } => d.complete(stream),
                Op::EmptyCache => a.empty_cache(),
                _ => {}
            }
            prop_assert_eq!(d.violations(), Vec::<String>::new());
            prop_assert_eq!(a.check_consistency(), Ok(()));
        }
        drop(live);
        drop(a);
        prop_assert_eq!(d.check_balanced(), Vec::<String>::new());
    }
}
