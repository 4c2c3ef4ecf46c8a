//! Expandable segments against PyTorch's code paths, written independently of
//! `expandable_segments.rs` as a cross-check: exact byte figures for both pools, the statistics
//! PyTorch keeps (`segment` untouched, no `inactive_split`), the OOM ladder with `max_split_size`,
//! turning the option off and on at run time, and random traffic checked after every operation.
use ferrite_memory::{CachingAllocator, MemoryError, OomDiagnosis, SuggestionKind, TraceAction};

const MIB: usize = 1 << 20;

mod common;

use common::{sim, stat};

#[test]
fn segments_grow_in_pages_and_blocks_tile_them() {
    let a = sim("sim:1GiB", "expandable_segments:True");
    let x = a.allocate(5 * MIB).unwrap();
    assert_eq!(a.memory_reserved(), 20 * MIB as u64, "one 20 MiB page of the large pool");
    assert_eq!(stat(&a, "num_device_alloc"), 1);
    assert_eq!(stat(&a, "segment.all.current"), 0, "PyTorch counts mapped pages, not segments");
    let y = a.allocate(5 * MIB).unwrap();
    assert_eq!(y.addr(), x.addr() + 5 * MIB as u64);
    assert_eq!(a.memory_reserved(), 20 * MIB as u64);
    // 30 MiB: the 10 MiB free at the end of the page plus one more page, contiguous
    let z = a.allocate(30 * MIB).unwrap();
    assert_eq!(z.addr(), x.addr() + 10 * MIB as u64);
    assert_eq!(z.size(), 30 * MIB);
    assert_eq!(a.memory_reserved(), 40 * MIB as u64);
    assert_eq!(stat(&a, "num_device_alloc"), 2);
    // the small pool has its own segment, mapped 2 MiB at a time
    let s = a.allocate(600 * 1024).unwrap();
    assert_eq!(a.memory_reserved(), 42 * MIB as u64);
    assert_eq!(stat(&a, "reserved_bytes.small_pool.current"), 2 * MIB as i64);
    assert_eq!(stat(&a, "inactive_split.all.current"), 0, "expandable blocks are never inactive_split");
    let snap = a.snapshot();
    assert_eq!(snap.segments.len(), 2);
    assert!(snap.segments.iter().all(|g| g.is_expandable));
    assert!(snap.allocator_settings.expandable_segments);
    let large = snap.segments.iter().find(|g| g.segment_type == "large").unwrap();
    assert_eq!((large.address, large.total_size, large.allocated_size), (x.addr(), 40 * MIB as u64, 40 * MIB as u64));
    a.check_consistency().unwrap();
    drop((x, y, z, s));
    a.check_consistency().unwrap();
    assert_eq!(a.memory_reserved(), 42 * MIB as u64, "freed blocks stay mapped until empty_cache");
    a.empty_cache();
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(stat(&a, "num_device_free"), 2, "one unmap per pool");
    assert!(a.snapshot().segments.is_empty());
    a.check_consistency().unwrap();
}

/// Two 40 MiB blocks on a 100 MiB device, both freed and each reused for 30 MiB: the free 10 MiB
/// tails of the two segments plus the 20 MiB never reserved would hold a third 30 MiB block, but
/// not contiguously — unless the segment can grow in place.
fn tails_then_30mib(a: &CachingAllocator) -> Result<Vec<ferrite_memory::Block>, MemoryError> {
    let p = a.allocate(40 * MIB)?;
    let q = a.allocate(40 * MIB)?;
    drop((p, q));
    let c = a.allocate(30 * MIB)?;
    let d = a.allocate(30 * MIB)?;
    let e = a.allocate(30 * MIB)?;
    Ok(vec![c, d, e])
}

#[test]
fn stranded_segment_tails_are_fragmentation_that_expandable_segments_fix() {
    let fixed = sim("sim:100MiB", "");
    let e = tails_then_30mib(&fixed).unwrap_err();
    let r = e.oom_report().unwrap();
    assert_eq!(r.diagnosis, OomDiagnosis::Fragmented);
    assert_eq!(r.reserved_unallocated_bytes, 20 * MIB as u64);
    assert_eq!(r.suggestions[0].kind, SuggestionKind::ExpandableSegments, "{e}");
    assert!(e.to_string().contains("expandable_segments:True"), "{e}");

    let growing = sim("sim:100MiB", "expandable_segments:True");
    let blocks = tails_then_30mib(&growing).unwrap();
    assert_eq!(growing.memory_reserved(), 100 * MIB as u64);
    assert_eq!(growing.memory_allocated(), 90 * MIB as u64);
    assert_eq!(blocks[2].addr(), blocks[0].addr() + 60 * MIB as u64);
    growing.check_consistency().unwrap();
}

#[test]
fn oom_with_expandable_segments_does_not_suggest_them_again() {
    let a = sim("sim:100MiB", "expandable_segments:True");
    let mut blocks: Vec<Option<_>> = (0..20).map(|_| Some(a.allocate(5 * MIB).unwrap())).collect();
    assert_eq!(a.memory_reserved(), 100 * MIB as u64);
    for b in blocks.iter_mut().step_by(2) {
        *b = None;
    }
    let e = a.allocate(12 * MIB).unwrap_err();
    let r = e.oom_report().unwrap();
    assert_eq!(r.diagnosis, OomDiagnosis::Fragmented);
    assert!(r.suggestions.iter().all(|s| s.kind != SuggestionKind::ExpandableSegments), "{e}");
    assert_eq!(a.memory_stats().num_ooms, 1);
    assert_eq!(a.memory_stats().num_alloc_retries, 1);
    // the ladder unmapped nothing (no whole page was free) and the allocator keeps working
    assert_eq!(a.memory_reserved(), 100 * MIB as u64);
    blocks[1] = None;
    blocks[3] = None; // [5, 20) free: with [0, 5) a whole free page
    let big = a.allocate(12 * MIB).unwrap();
    assert_eq!(big.size(), 12 * MIB);
    a.check_consistency().unwrap();
    drop((big, blocks));
    a.empty_cache();
    assert_eq!(a.memory_reserved(), 0);
}

#[test]
fn turning_expandable_segments_off_stops_reusing_their_blocks() {
    let a = sim("sim:1GiB", "expandable_segments:True");
    drop(a.allocate(5 * MIB).unwrap());
    assert_eq!(a.memory_reserved(), 20 * MIB as u64);
    a.set_alloc_conf("expandable_segments:False").unwrap();
    let b = a.allocate(5 * MIB).unwrap();
    assert_eq!(a.memory_reserved(), 40 * MIB as u64, "a regular 20 MiB segment, not the cached page");
    assert_eq!(stat(&a, "segment.large_pool.current"), 1);
    a.check_consistency().unwrap();
    a.set_alloc_conf("expandable_segments:True").unwrap();
    let c = a.allocate(5 * MIB).unwrap();
    assert_eq!(a.memory_reserved(), 40 * MIB as u64, "expandable again: the cached page serves it");
    drop((b, c));
    a.empty_cache();
    assert_eq!(a.memory_reserved(), 0);
    a.check_consistency().unwrap();
}

#[test]
fn history_records_page_maps_and_unmaps() {
    let a = sim("sim:1GiB", "expandable_segments:True");
    a.record_memory_history(Some(100));
    let line = line!() + 1;
    drop(a.allocate(25 * MIB).unwrap());
    a.empty_cache();
    let h = a.memory_history();
    let actions: Vec<_> = h.iter().map(|e| e.action).collect();
    assert_eq!(actions, [TraceAction::SegmentMap, TraceAction::Alloc, TraceAction::Free, TraceAction::SegmentUnmap]);
    assert_eq!((h[0].size, h[3].size), (40 * MIB as u64, 40 * MIB as u64));
    assert_eq!(h[0].frames[0].line, line);
    let json = serde_json::to_value(&h).unwrap();
    assert_eq!(json[0]["action"], "segment_map");
    assert_eq!(json[3]["action"], "segment_unmap");
}

#[test]
fn meta_devices_grow_without_bound() {
    let a = sim("meta", "expandable_segments:True");
    let big = a.allocate(1 << 40).unwrap();
    let small = a.allocate(MIB + 1).unwrap();
    assert_eq!(small.addr(), big.addr() + (1 << 40));
    a.check_consistency().unwrap();
}

#[test]
fn random_traffic_keeps_expandable_segments_consistent() {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for conf in ["expandable_segments:True", "expandable_segments:True,max_split_size_mb:30"] {
        let a = sim("sim:200MiB", conf);
        let mut live = Vec::new();
        for i in 0..6_000 {
            let r = rnd() % 100;
            if r < 55 {
                let size = match rnd() % 3 {
                    0 => 1 + rnd() % MIB as u64,
                    1 => MIB as u64 + rnd() % (9 * MIB as u64),
                    _ => 10 * MIB as u64 + rnd() % (40 * MIB as u64),
                };
                let stream = (rnd() % 2) as u32;
                match a.allocate_on_stream(size as usize, stream) {
                    Ok(b) => live.push(b),
                    Err(e) => assert!(e.oom_report().is_some(), "{e}"),
                }
            } else if r < 95 && !live.is_empty() {
                let k = (rnd() as usize) % live.len();
                live.swap_remove(k);
            } else if r < 97 {
                a.empty_cache();
            } else if r < 98 {
                let on = rnd() % 4 != 0;
                a.set_alloc_conf(if on { "expandable_segments:True" } else { "expandable_segments:False" }).unwrap();
            }
            if let Err(e) = a.check_consistency() {
                panic!("{conf}, operation {i}: {e}");
            }
            assert!(a.memory_reserved() <= 200 * MIB as u64);
        }
        let mut sorted: Vec<_> = live.iter().map(|b| (b.addr(), b.size() as u64)).collect();
        sorted.sort_unstable();
        assert!(sorted.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0), "overlapping blocks");
        // the traffic really went through the OOM ladder and page unmapping
        let s = a.memory_stats();
        assert!(s.num_ooms > 100 && s.num_device_free > 100, "{s:?}");
        drop(live);
        a.empty_cache();
        assert_eq!(a.memory_reserved(), 0);
        a.check_consistency().unwrap();
    }
}

#[test]
fn the_oom_ladder_releases_oversize_segments_below_an_expandable_best_fit() {
    // PyTorch's release_available_cached_blocks: an expandable best fit is never released whole,
    // so oversize segments below it are released (largest first) until the request is covered.
    let a = sim("sim:200MiB", "max_split_size_mb:20");
    drop((a.allocate(40 * MIB).unwrap(), a.allocate(30 * MIB).unwrap())); // two oversize segments
    a.set_alloc_conf("expandable_segments:True").unwrap();
    let e = a.allocate(100 * MIB).unwrap();
    let base = e.addr();
    // 10 MiB is not oversize, so it may not take a cached oversize segment: it maps a page
    let _tail = a.allocate(10 * MIB).unwrap();
    drop(e); // 100 MiB free and mapped, too big for 60 MiB under max_split_size's rounding rule
    assert_eq!(a.memory_reserved(), 190 * MIB as u64);
    let b = a.allocate(60 * MIB).unwrap();
    assert_eq!(b.addr(), base + 110 * MIB as u64, "right after the live tail, in its page and three more");
    assert_eq!(a.memory_reserved(), 180 * MIB as u64, "both oversize segments released, the free pages kept");
    assert_eq!(stat(&a, "num_alloc_retries"), 0, "no full cache release was needed");
    assert_eq!(stat(&a, "num_device_free"), 2);
    a.check_consistency().unwrap();
}
