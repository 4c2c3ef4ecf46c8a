//! Expandable segments: one growing segment per pool and stream, mapped and unmapped in pages.
use ferrite_memory::{AllocatorConfig, BlockState, CachingAllocator, Device, OomDiagnosis, TraceAction};

const MIB: usize = 1 << 20;

fn expandable(spec: &str) -> CachingAllocator {
    CachingAllocator::unbacked(
        Device::parse(spec).unwrap(),
        AllocatorConfig::parse("expandable_segments:True").unwrap(),
    )
}

#[test]
fn requests_map_pages_of_one_growing_segment() {
    let a = expandable("sim:1GiB");
    let x = a.allocate(30 * MIB).unwrap();
    assert_eq!(a.memory_reserved(), 40 * MIB as u64, "two 20 MiB pages");
    let y = a.allocate(5 * MIB).unwrap();
    assert_eq!(y.addr(), x.addr() + 30 * MIB as u64, "the next request continues in the same segment");
    assert_eq!(a.memory_reserved(), 40 * MIB as u64);
    let z = a.allocate(12 * MIB).unwrap();
    assert_eq!(z.addr(), y.addr() + 5 * MIB as u64);
    assert_eq!(a.memory_reserved(), 60 * MIB as u64, "one more page mapped at the end");
    let stats = a.memory_stats_flat();
    assert_eq!(stats["segment.all.current"], 0, "expandable segments are not counted as segments (as PyTorch)");
    assert_eq!(stats["inactive_split.all.current"], 0);
    a.check_consistency().unwrap();
    let s = a.snapshot();
    assert_eq!(s.segments.len(), 1);
    assert!(s.segments[0].is_expandable);
    assert_eq!(s.segments[0].total_size, 60 * MIB as u64);
    assert_eq!(s.segments[0].blocks.last().unwrap().state, BlockState::Inactive);
    drop((x, y, z));
    a.empty_cache();
    assert_eq!(a.memory_reserved(), 0);
    assert!(a.snapshot().segments.is_empty());
    a.check_consistency().unwrap();
}

#[test]
fn small_pool_pages_are_2mib() {
    let a = expandable("sim:1GiB");
    let blocks: Vec<_> = (0..5).map(|_| a.allocate(600 * 1024).unwrap()).collect();
    assert_eq!(a.memory_reserved(), 4 * MIB as u64, "3 000 KiB in 2 MiB pages");
    for w in blocks.windows(2) {
        assert_eq!(w[1].addr(), w[0].addr() + 600 * 1024);
    }
}

#[test]
fn empty_cache_unmaps_free_pages_but_keeps_live_ones() {
    let a = expandable("sim:1GiB");
    let x = a.allocate(30 * MIB).unwrap();
    let y = a.allocate(30 * MIB).unwrap();
    assert_eq!(a.memory_reserved(), 60 * MIB as u64);
    a.record_memory_history(Some(100));
    drop(x);
    a.empty_cache();
    // x covered [0, 30 MiB): the page [0, 20 MiB) is wholly free and unmapped; [20, 30) shares
    // a page with y and stays mapped
    assert_eq!(a.memory_reserved(), 40 * MIB as u64);
    let h = a.memory_history();
    assert!(h.iter().any(|e| e.action == TraceAction::SegmentUnmap && e.size == 20 * MIB as u64));
    a.check_consistency().unwrap();
    // the unmapped hole is reused (mapped again) before the segment grows
    let z = a.allocate(25 * MIB).unwrap();
    assert!(z.addr() < y.addr());
    assert_eq!(a.memory_reserved(), 60 * MIB as u64);
    a.check_consistency().unwrap();
    drop((y, z));
    a.empty_cache();
    assert_eq!(a.memory_reserved(), 0);
}

#[test]
fn growing_requests_leave_no_slivers() {
    // The pattern of Note [Expandable Segments]: batch N then N+1. Per-request segments keep a
    // sliver of every earlier segment; an expandable segment just maps more pages.
    let run = |conf: &str| {
        let a = CachingAllocator::unbacked(Device::parse("sim:2GiB").unwrap(), AllocatorConfig::parse(conf).unwrap());
        for n in 10..20usize {
            let batch: Vec<_> = (0..8).map(|_| a.allocate(n * 3 * MIB + 512 * 1024).unwrap()).collect();
            drop(batch);
        }
        a.max_memory_reserved()
    };
    let per_request = run("");
    let grown = run("expandable_segments:True");
    assert!(grown < per_request, "expandable {grown} vs per-request {per_request}");
}

#[test]
fn oom_after_unmapping_and_the_allocator_recovers() {
    let a = expandable("sim:100MiB");
    let mut blocks: Vec<Option<_>> = (0..9).map(|_| Some(a.allocate(10 * MIB).unwrap())).collect();
    // 90 MiB live in 100 MiB of pages: 20 more MiB do not fit however pages are arranged
    let e = a.allocate(20 * MIB).unwrap_err();
    assert_eq!(e.oom_report().unwrap().diagnosis, OomDiagnosis::Exhausted);
    assert!(!e.to_string().contains("expandable_segments:True"), "not suggested when on: {e}");
    blocks[0] = None;
    blocks[1] = None;
    let b = a.allocate(20 * MIB).unwrap();
    assert_eq!(b.size(), 20 * MIB);
    a.check_consistency().unwrap();
}

#[test]
fn host_backed_expandable_memory_is_writable() {
    for dev in ["cpu", "sim:64MiB"] {
        let a = CachingAllocator::with_config(
            Device::parse(dev).unwrap(),
            AllocatorConfig::parse("expandable_segments:True").unwrap(),
        );
        let blocks: Vec<_> = [1usize, 700 * 1024, 3 * MIB, 25 * MIB].iter().map(|&s| a.allocate(s).unwrap()).collect();
        for b in &blocks {
            let p = b.host_ptr().unwrap();
            assert_eq!(p.as_ptr() as usize % 512, 0);
            // SAFETY: the block owns `size()` bytes of mapped memory.
            unsafe { p.as_ptr().write_bytes(0x5A, b.size()) };
        }
        drop(blocks);
        a.empty_cache();
        assert_eq!(a.memory_reserved(), 0);
        // mapped again after unmapping: still writable
        let b = a.allocate(3 * MIB).unwrap();
        // SAFETY: as above.
        unsafe { b.host_ptr().unwrap().as_ptr().write_bytes(1, b.size()) };
        a.check_consistency().unwrap();
    }
}
