//! Every allocator rule with exact byte figures, seen from outside.
use ferrite_memory::{CachingAllocator, Device, MemoryError, OomDiagnosis};

const KIB: usize = 1024;
const MIB: usize = 1 << 20;

mod common;

use common::{sim, stat};

#[test]
fn small_request_reserves_one_2mib_segment() {
    let a = sim("sim:a100-40gb", "");
    let b = a.allocate(600 * KIB).unwrap();
    assert_eq!(b.size(), 600 * KIB);
    assert_eq!(a.memory_allocated(), 614_400);
    assert_eq!(a.memory_reserved(), 2 * MIB as u64);
    assert_eq!(stat(&a, "segment.small_pool.current"), 1);
    assert_eq!(stat(&a, "allocated_bytes.small_pool.current"), 614_400);
    // two more fit in the same segment (614400 * 3 = 1843200 <= 2 MiB), the fourth does not
    let b2 = a.allocate(600 * KIB).unwrap();
    let b3 = a.allocate(600 * KIB).unwrap();
    assert_eq!(b2.addr(), b.addr() + 614_400);
    assert_eq!(b3.addr(), b.addr() + 2 * 614_400);
    assert_eq!(a.memory_reserved(), 2 * MIB as u64);
    let _b4 = a.allocate(600 * KIB).unwrap();
    assert_eq!(a.memory_reserved(), 4 * MIB as u64);
    a.check_consistency().unwrap();
}

#[test]
fn sizes_are_rounded_to_512_bytes() {
    let a = sim("sim:a100-40gb", "");
    let b = a.allocate(1).unwrap();
    assert_eq!((b.size(), b.requested_size()), (512, 1));
    let c = a.allocate(513).unwrap();
    assert_eq!(c.size(), 1024);
    assert_eq!(a.memory_allocated(), 1536);
    assert_eq!(stat(&a, "requested_bytes.all.current"), 514);
}

#[test]
fn mid_large_request_reserves_20mib_and_large_one_its_own_size() {
    let a = sim("sim:a100-40gb", "");
    let _b = a.allocate(5 * MIB).unwrap();
    assert_eq!(a.memory_reserved(), 20 * MIB as u64);
    assert_eq!(stat(&a, "segment.large_pool.current"), 1);
    let _c = a.allocate(30 * MIB).unwrap();
    assert_eq!(a.memory_reserved(), 50 * MIB as u64);
    let _d = a.allocate(30 * MIB + 1).unwrap();
    assert_eq!(a.memory_reserved(), 82 * MIB as u64, "30 MiB + 1 byte rounds its segment to 32 MiB");
    // 10 MiB fits in the 15 MiB left of the 20 MiB segment
    let _e = a.allocate(10 * MIB).unwrap();
    assert_eq!(a.memory_reserved(), 82 * MIB as u64);
    // on its own, 10 MiB is the first size that gets a segment of its own (2 MiB rounded) size
    let fresh = sim("sim:a100-40gb", "");
    let _f = fresh.allocate(10 * MIB).unwrap();
    assert_eq!(fresh.memory_reserved(), 10 * MIB as u64);
    let _g = fresh.allocate(10 * MIB - 512).unwrap();
    assert_eq!(fresh.memory_reserved(), 30 * MIB as u64);
}

#[test]
fn freeing_then_allocating_smaller_reuses_by_split() {
    let a = sim("sim:a100-40gb", "");
    let b = a.allocate(5 * MIB).unwrap();
    let addr = b.addr();
    drop(b);
    assert_eq!(a.memory_allocated(), 0);
    assert_eq!(a.memory_reserved(), 20 * MIB as u64);
    let c = a.allocate(3 * MIB).unwrap();
    assert_eq!(c.addr(), addr, "best fit reuses the cached segment from its start");
    assert_eq!(c.size(), 3 * MIB);
    assert_eq!(a.memory_reserved(), 20 * MIB as u64);
    assert_eq!(stat(&a, "num_device_alloc"), 1);
    assert_eq!(stat(&a, "inactive_split.large_pool.current"), 1);
    assert_eq!(stat(&a, "inactive_split_bytes.large_pool.current"), 17 * MIB as i64);
    // the remainder serves the next request right after it
    let d = a.allocate(2 * MIB).unwrap();
    assert_eq!(d.addr(), addr + 3 * MIB as u64);
    assert_eq!(stat(&a, "inactive_split_bytes.large_pool.current"), 15 * MIB as i64);
    drop(c);
    drop(d);
    // merged back into one unsplit 20 MiB block
    assert_eq!(stat(&a, "inactive_split.all.current"), 0);
    assert_eq!(stat(&a, "inactive_split_bytes.all.current"), 0);
    assert_eq!(a.largest_free_block(), 20 * MIB as u64);
    a.check_consistency().unwrap();
}

#[test]
fn large_pool_splits_only_with_more_than_1mib_left() {
    let a = sim("sim:a100-40gb", "");
    drop(a.allocate(5 * MIB).unwrap()); // caches a 20 MiB segment
    let b = a.allocate(19 * MIB + 512 * KIB).unwrap();
    assert_eq!(b.size(), 20 * MIB, "0.5 MiB left: not split, the whole block is handed out");
    assert_eq!(a.memory_allocated(), 20 * MIB as u64);
    assert_eq!(stat(&a, "requested_bytes.all.current"), (19 * MIB + 512 * KIB) as i64);
    drop(b);
    let c = a.allocate(18 * MIB + 512 * KIB).unwrap();
    assert_eq!(c.size(), 18 * MIB + 512 * KIB, "1.5 MiB left: split");
}

#[test]
fn small_pool_splits_with_512_bytes_left() {
    let a = sim("sim:a100-40gb", "");
    let b = a.allocate(2 * MIB - 512).unwrap(); // 2 MiB - 512 > 1 MiB: large pool, 20 MiB segment
    assert_eq!(a.memory_reserved(), 20 * MIB as u64);
    drop(b);
    let s1 = a.allocate(MIB).unwrap(); // small pool
    let s2 = a.allocate(MIB - 512).unwrap();
    assert_eq!(s2.addr(), s1.addr() + MIB as u64);
    let s3 = a.allocate(512).unwrap();
    assert_eq!(s3.addr(), s2.addr() + (MIB - 512) as u64, "the last 512 bytes are a block of their own");
    assert_eq!(a.memory_reserved(), 22 * MIB as u64);
}

#[test]
fn best_fit_picks_the_smallest_block_then_the_lowest_address() {
    let a = sim("sim:a100-40gb", "");
    let big = a.allocate(40 * MIB).unwrap();
    let mid = a.allocate(24 * MIB).unwrap();
    let mid2 = a.allocate(24 * MIB).unwrap();
    let (mid_addr, mid2_addr) = (mid.addr(), mid2.addr());
    drop(big);
    drop(mid2);
    drop(mid);
    let lo = mid_addr.min(mid2_addr);
    let b = a.allocate(22 * MIB).unwrap();
    assert_eq!(b.addr(), lo, "24 MiB blocks fit best; the lower address wins");
    assert_eq!(b.size(), 22 * MIB, "2 MiB left (> 1 MiB): split");
    assert_eq!(a.memory_reserved(), 88 * MIB as u64);
}

#[test]
fn max_split_size_keeps_oversize_blocks_whole() {
    let a = sim("sim:a100-40gb", "max_split_size_mb:20");
    assert_eq!(stat(&a, "max_split_size"), 20 * MIB as i64);
    let big = a.allocate(25 * MIB).unwrap(); // 26 MiB oversize segment
    assert_eq!(a.memory_reserved(), 26 * MIB as u64);
    assert_eq!(stat(&a, "oversize_segments.current"), 1);
    assert_eq!(stat(&a, "oversize_allocations.current"), 1);
    drop(big);
    // a non-oversize request may not take the oversize block
    let small = a.allocate(5 * MIB).unwrap();
    assert_eq!(a.memory_reserved(), 46 * MIB as u64);
    drop(small);
    // an oversize request takes it whole if it is within 20 MiB of rounding
    let b = a.allocate(24 * MIB).unwrap();
    assert_eq!(b.size(), 26 * MIB, "oversize blocks are never split");
    assert_eq!(a.memory_reserved(), 46 * MIB as u64);
    drop(b);
    let big = a.allocate(60 * MIB).unwrap();
    drop(big);
    let reserved = a.memory_reserved();
    // 60 >= 30 + 20: the 60 MiB block is too wasteful for 30 MiB; 26 MiB blocks are too small
    let _c = a.allocate(30 * MIB).unwrap();
    assert_eq!(a.memory_reserved(), reserved + 30 * MIB as u64);
}

#[test]
fn max_non_split_rounding_widens_the_slack() {
    let a = sim("sim:a100-40gb", "max_split_size_mb:20,max_non_split_rounding_mb:40");
    drop(a.allocate(60 * MIB).unwrap());
    let c = a.allocate(30 * MIB).unwrap();
    assert_eq!(c.size(), 60 * MIB);
    assert_eq!(a.memory_reserved(), 60 * MIB as u64);
}

#[test]
fn roundup_power2_divisions_round_requests() {
    let a = sim("sim:a100-40gb", "roundup_power2_divisions:4");
    let b = a.allocate(MIB + 100 * KIB).unwrap();
    assert_eq!(b.size(), MIB + 256 * KIB);
    let c = a.allocate(5000).unwrap();
    assert_eq!(c.size(), 5120);
    let a = sim("sim:a100-40gb", "roundup_power2_divisions:[1:1,>:8]");
    let d = a.allocate(3 * MIB).unwrap();
    assert_eq!(d.size(), 3 * MIB, "interval 1-2 MiB: 1 division = off; 3 MiB sits on a 1/8 step");
    let e = a.allocate(3 * MIB + 1).unwrap();
    assert_eq!(e.size(), 3 * MIB + 256 * KIB);
}

#[test]
fn oom_ladder_releases_cached_segments_and_retries() {
    let a = sim("sim:64MiB", "");
    drop(a.allocate(30 * MIB).unwrap());
    assert_eq!(a.memory_reserved(), 30 * MIB as u64);
    let b = a.allocate(40 * MIB).unwrap();
    assert_eq!(b.size(), 40 * MIB);
    assert_eq!(a.memory_reserved(), 40 * MIB as u64);
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
    assert_eq!(stat(&a, "num_device_free"), 1);
    assert_eq!(stat(&a, "num_ooms"), 0);
}

#[test]
fn with_max_split_size_an_oversize_block_is_released_without_a_retry() {
    let a = sim("sim:100MiB", "max_split_size_mb:20");
    let x = a.allocate(50 * MIB).unwrap();
    let _y = a.allocate(40 * MIB).unwrap();
    drop(x);
    // 50 >= 30 + 20: not reusable; 90 + 30 > 100: no room; release the 50 MiB oversize block
    let _z = a.allocate(30 * MIB).unwrap();
    assert_eq!(a.memory_reserved(), 70 * MIB as u64);
    assert_eq!(stat(&a, "num_alloc_retries"), 0);
    assert_eq!(stat(&a, "num_device_free"), 1);
}

#[test]
fn garbage_collection_releases_the_oldest_cached_block() {
    let a = sim("sim:100MiB", "garbage_collection_threshold:0.5");
    a.set_per_process_memory_fraction(1.0).unwrap();
    drop(a.allocate(30 * MIB).unwrap()); // A, older
    let b = a.allocate(34 * MIB).unwrap(); // B: 64 MiB reserved
    drop(b);
    let _c = a.allocate(40 * MIB).unwrap();
    // GC (64 > 50): A is at least as old as the average and is released; B stays cached
    assert_eq!(a.memory_reserved(), 74 * MIB as u64);
    assert_eq!(stat(&a, "num_alloc_retries"), 0);
    assert_eq!(a.largest_free_block(), 34 * MIB as u64);
}

#[test]
fn garbage_collection_needs_a_memory_fraction() {
    let a = sim("sim:100MiB", "garbage_collection_threshold:0.5");
    drop(a.allocate(30 * MIB).unwrap());
    let b = a.allocate(34 * MIB).unwrap();
    drop(b);
    let _c = a.allocate(40 * MIB).unwrap();
    // without a fraction there is no GC: the ladder frees everything cached and retries
    assert_eq!(a.memory_reserved(), 40 * MIB as u64);
    assert_eq!(stat(&a, "num_alloc_retries"), 1);
}

#[test]
fn memory_fraction_caps_reserved_memory() {
    let a = sim("sim:100MiB", "");
    a.set_per_process_memory_fraction(0.5).unwrap();
    assert_eq!(a.per_process_memory_fraction(), Some(0.5));
    let _b = a.allocate(40 * MIB).unwrap();
    let e = a.allocate(20 * MIB).unwrap_err();
    let r = e.oom_report().unwrap();
    assert_eq!(r.allowed_bytes, Some(50 * MIB as u64));
    assert_eq!(r.diagnosis, OomDiagnosis::Exhausted);
    assert!(e.to_string().contains("50.00 MiB allowed; "), "{e}");
    assert!(a.set_per_process_memory_fraction(1.5).is_err());
    assert!(CachingAllocator::new(Device::Meta).set_per_process_memory_fraction(0.5).is_err());
}

#[test]
fn empty_cache_releases_only_whole_free_segments() {
    let a = sim("sim:a100-40gb", "");
    let b1 = a.allocate(100 * KIB).unwrap();
    let b2 = a.allocate(100 * KIB).unwrap();
    let l = a.allocate(5 * MIB).unwrap();
    drop(b1);
    drop(l);
    a.empty_cache();
    assert_eq!(a.memory_reserved(), 2 * MIB as u64, "the small segment still holds b2");
    drop(b2);
    a.empty_cache();
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(stat(&a, "segment.all.current"), 0);
}

#[test]
fn streams_do_not_share_cached_blocks() {
    let a = sim("sim:a100-40gb", "");
    drop(a.allocate_on_stream(100 * KIB, 1).unwrap());
    let b = a.allocate_on_stream(100 * KIB, 0).unwrap();
    assert_eq!(a.memory_reserved(), 4 * MIB as u64);
    assert_eq!(b.stream(), 0);
    let c = a.allocate_on_stream(100 * KIB, 1).unwrap();
    assert_eq!(a.memory_reserved(), 4 * MIB as u64, "stream 1 reuses its own cached block");
    drop(c);
}

#[test]
fn zero_size_allocations_touch_nothing() {
    let a = sim("sim:a100-40gb", "");
    let b = a.allocate(0).unwrap();
    assert_eq!((b.size(), b.addr(), b.host_ptr()), (0, 0, None));
    assert!(a.memory_stats_flat().values().all(|&v| v == 0 || v == -1));
    drop(b);
    assert!(a.memory_stats_flat().values().all(|&v| v == 0 || v == -1));
}

#[test]
fn host_blocks_are_real_and_512_byte_aligned() {
    for dev in ["cpu", "sim:64MiB"] {
        let a = CachingAllocator::new(Device::parse(dev).unwrap());
        let blocks: Vec<_> = [1usize, 700, 4096, 3 * MIB].iter().map(|&s| a.allocate(s).unwrap()).collect();
        for b in &blocks {
            let p = b.host_ptr().unwrap();
            assert_eq!(p.as_ptr() as usize % 512, 0);
            assert_eq!(b.addr() % 512, 0);
            // SAFETY: the block owns `size()` writable bytes.
            unsafe { p.as_ptr().write_bytes(0xAB, b.size()) };
        }
        // Device addresses are numbered in segment order, not the host's (see `raw_memory`), but
        // blocks of one segment (the three small ones) lie as far apart in memory as in addresses.
        let ptr = |i: usize| blocks[i].host_ptr().unwrap().as_ptr() as u64;
        for i in 1..3 {
            assert_eq!(ptr(i).wrapping_sub(ptr(0)), blocks[i].addr().wrapping_sub(blocks[0].addr()), "{dev}");
        }
    }
}

#[test]
fn meta_blocks_have_distinct_addresses_and_no_memory() {
    let a = CachingAllocator::new(Device::Meta);
    let x = a.allocate(100).unwrap();
    let y = a.allocate(100).unwrap();
    let z = a.allocate(1 << 40).unwrap(); // 1 TiB of nothing
    assert!(x.host_ptr().is_none() && z.host_ptr().is_none());
    assert_ne!(x.addr(), y.addr());
    assert_ne!(x.addr(), z.addr());
    assert_eq!(a.memory_allocated(), 512 + 512 + (1 << 40));
}

#[test]
fn peaks_reset_to_current() {
    let a = sim("sim:a100-40gb", "");
    let b = a.allocate(10 * MIB).unwrap();
    drop(a.allocate(30 * MIB).unwrap());
    assert_eq!(a.max_memory_allocated(), 40 * MIB as u64);
    assert_eq!(a.max_memory_reserved(), 40 * MIB as u64);
    a.empty_cache();
    a.reset_peak_memory_stats();
    assert_eq!(a.max_memory_allocated(), 10 * MIB as u64);
    assert_eq!(a.max_memory_reserved(), 10 * MIB as u64);
    a.reset_accumulated_memory_stats();
    assert_eq!(stat(&a, "allocated_bytes.all.allocated"), 0);
    assert_eq!(stat(&a, "num_device_alloc"), 0);
    drop(b);
}

#[test]
fn requests_of_an_exabyte_are_refused() {
    let a = CachingAllocator::new(Device::Meta);
    assert!(matches!(a.allocate(1 << 60), Err(MemoryError::RequestTooLarge { .. })));
}

#[test]
fn config_can_change_at_runtime() {
    let a = sim("sim:a100-40gb", "");
    a.set_alloc_conf("max_split_size_mb:64").unwrap();
    assert_eq!(a.config().max_split_size, 64 * MIB as u64);
    let e = a.set_alloc_conf("max_split_size_mb:1").unwrap_err();
    assert!(matches!(e, MemoryError::InvalidConfig { ref key, .. } if key == "max_split_size_mb"));
    assert_eq!(a.config().max_split_size, 64 * MIB as u64, "a failed update changes nothing");
}

#[test]
fn sim_refuses_a_segment_exactly_where_the_card_runs_out() {
    // T4: totalGlobalMem 15843721216 - 300 MiB context = 15529148416 usable bytes.
    let a = sim("sim:t4-16gb", "");
    let usable: u64 = 15_843_721_216 - 300 * MIB as u64;
    let fit = usable / (2 * MIB as u64) * (2 * MIB as u64); // 7404 segments of 2 MiB
    let b = a.allocate(fit as usize).unwrap();
    assert_eq!(a.memory_reserved(), fit);
    let e = a.allocate(MIB + 1).unwrap_err();
    let r = e.oom_report().unwrap();
    assert_eq!(r.segment_bytes, 20 * MIB as u64);
    assert_eq!(r.device_free, Some(usable - fit));
    assert_eq!(r.total_capacity, Some(15_843_721_216));
    // a small-pool request (2 MiB segment) still does not fit in the remaining 1.75 MiB
    assert!(a.allocate(KIB).is_err());
    drop(b);
    a.empty_cache();
    assert!(a.allocate(KIB).is_ok());
}

#[test]
fn blocks_and_allocators_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<ferrite_memory::Block>();
    check::<CachingAllocator>();
    check::<MemoryError>();
}
