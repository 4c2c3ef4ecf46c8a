//! Property test: random alloc/free traffic from several threads never breaks the allocator.
//!
//! ≥ 100 000 operations per case over mixed sizes (small pool, 1–10 MiB, large), on four threads
//! sharing one allocator. Checked: no two live blocks overlap, every statistic equals what is
//! recomputed from the live blocks (from outside) and from the segments (inside), and after freeing
//! everything and `empty_cache` nothing is reserved.
use std::sync::Arc;

use ferrite_memory::{AllocatorConfig, Block, CachingAllocator, Device, MemoryError};
use proptest::prelude::*;

const THREADS: usize = 4;
const OPS_PER_THREAD: usize = 25_000;

/// xorshift64*: a tiny deterministic generator per thread.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn random_size(r: &mut Rng) -> usize {
    match r.next() % 10 {
        0..=5 => 1 + (r.next() % (1 << 20)) as usize,         // small pool
        6..=8 => (1 << 20) + (r.next() % (9 << 20)) as usize, // 1–10 MiB: 20 MiB segments
        _ => (10 << 20) + (r.next() % (54 << 20)) as usize,   // large: own segments
    }
}

fn run_case(seed: u64, conf: &str, device: &str) -> Result<(), TestCaseError> {
    let a = Arc::new(CachingAllocator::unbacked(Device::parse(device).unwrap(), AllocatorConfig::parse(conf).unwrap()));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || -> Result<Vec<Block>, String> {
                let mut r = Rng(seed ^ (0x9E37_79B9_7F4A_7C15u64.wrapping_mul(t as u64 + 1)) | 1);
                let mut live: Vec<Block> = Vec::new();
                for i in 0..OPS_PER_THREAD {
                    let op = r.next() % 100;
                    if op < 55 && live.len() < 48 {
                        match a.allocate_on_stream(random_size(&mut r), (t % 2) as u32) {
                            Ok(b) => live.push(b),
                            Err(MemoryError::OutOfMemory { .. }) => {}
                            Err(e) => return Err(e.to_string()),
                        }
                    } else if op < 97 && !live.is_empty() {
                        let k = (r.next() as usize) % live.len();
                        live.swap_remove(k);
                    } else if op < 98 {
                        a.empty_cache();
                    }
                    if i % 5000 == 0 {
                        a.check_consistency()?;
                    }
                }
                Ok(live)
            })
        })
        .collect();
    let mut live: Vec<Block> = Vec::new();
    for h in handles {
        live.extend(h.join().map_err(|_| TestCaseError::fail("thread panicked"))?.map_err(TestCaseError::fail)?);
    }
    // no overlap
    live.sort_by_key(|b| b.addr());
    for w in live.windows(2) {
        prop_assert!(w[0].addr() + w[0].size() as u64 <= w[1].addr(), "overlapping blocks {:?} {:?}", w[0], w[1]);
    }
    // statistics equal what the live blocks say
    let s = a.memory_stats();
    prop_assert_eq!(s.allocation.all.current as usize, live.len());
    prop_assert_eq!(s.allocated_bytes.all.current as u64, live.iter().map(|b| b.size() as u64).sum::<u64>());
    prop_assert_eq!(s.requested_bytes.all.current as u64, live.iter().map(|b| b.requested_size() as u64).sum::<u64>());
    let small: Vec<_> = live.iter().filter(|b| b.size() <= 1 << 20).collect();
    prop_assert_eq!(s.allocation.small_pool.current as usize, small.len());
    prop_assert_eq!(s.allocated_bytes.small_pool.current as u64, small.iter().map(|b| b.size() as u64).sum::<u64>());
    prop_assert_eq!(s.active_bytes.all.current, s.allocated_bytes.all.current);
    prop_assert!(s.allocated_bytes.all.peak >= s.allocated_bytes.all.current);
    prop_assert!(s.reserved_bytes.all.current >= s.allocated_bytes.all.current);
    a.check_consistency().map_err(TestCaseError::fail)?;
    // free everything, release the cache: nothing reserved
    drop(live);
    a.empty_cache();
    let s = a.memory_stats();
    prop_assert_eq!(s.reserved_bytes.all.current, 0);
    prop_assert_eq!(s.segment.all.current, 0);
    prop_assert_eq!(s.allocated_bytes.all.current, 0);
    prop_assert_eq!(s.inactive_split_bytes.all.current, 0);
    prop_assert_eq!(s.allocation.all.allocated, s.allocation.all.freed);
    a.check_consistency().map_err(TestCaseError::fail)?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn random_traffic_keeps_every_invariant(
        seed in any::<u64>(),
        conf in prop::sample::select(vec![
            "",
            "max_split_size_mb:40",
            "roundup_power2_divisions:4,max_split_size_mb:20,max_non_split_rounding_mb:40",
            "expandable_segments:True",
            "expandable_segments:True,max_split_size_mb:40,garbage_collection_threshold:0.5",
        ]),
    ) {
        // 1 GiB: OOMs (and the recovery ladder) happen regularly under this traffic.
        run_case(seed, conf, "sim:1GiB")?;
    }
}

#[test]
fn random_traffic_with_garbage_collection_and_a_fraction() {
    let a = CachingAllocator::unbacked(
        Device::parse("sim:2GiB").unwrap(),
        AllocatorConfig::parse("garbage_collection_threshold:0.6").unwrap(),
    );
    a.set_per_process_memory_fraction(0.5).unwrap();
    let mut r = Rng(42);
    let mut live = Vec::new();
    for _ in 0..50_000 {
        if r.next().is_multiple_of(2) && live.len() < 64 {
            if let Ok(b) = a.allocate(random_size(&mut r)) {
                live.push(b);
            }
        } else if !live.is_empty() {
            let k = (r.next() as usize) % live.len();
            live.swap_remove(k);
        }
        assert!(a.memory_reserved() <= 1 << 30, "the fraction caps reserved memory");
    }
    a.check_consistency().unwrap();
    drop(live);
    a.empty_cache();
    assert_eq!(a.memory_reserved(), 0);
}
