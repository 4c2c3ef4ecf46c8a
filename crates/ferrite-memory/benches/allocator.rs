//! Allocator speed: a cached alloc+free pair and a cold allocation (segment reserved and
//! released), against the system allocator, for 4 KiB – 64 MiB.
//!
//! Run: `cargo bench -p ferrite-memory --bench allocator`
//! (`ferrite` rows use the registry allocator of `cpu`, as tensor code does.)
//!
//! glibc raises its mmap threshold after the first large free (up to 32 MiB) and then serves
//! repeated same-size requests from its heap, so the `system` rows below 32 MiB measure glibc's own
//! cache. To compare with one mmap/munmap per large allocation (glibc's policy before it adapts),
//! run with `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072`, which fixes the threshold.
use std::alloc::{Layout, alloc, dealloc};
use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ferrite_memory::{CachingAllocator, Device};

const SIZES: [(usize, &str); 6] = [
    (4 << 10, "4KiB"),
    (64 << 10, "64KiB"),
    (1 << 20, "1MiB"),
    (4 << 20, "4MiB"),
    (16 << 20, "16MiB"),
    (64 << 20, "64MiB"),
];

fn cached(c: &mut Criterion) {
    let mut g = c.benchmark_group("cached_alloc_free");
    // The registry allocator, as tensor code uses it.
    let a = ferrite_memory::allocator(&Device::Cpu);
    for (size, name) in SIZES {
        // Warm the cache: the segment stays reserved between iterations.
        drop(a.allocate(size).unwrap());
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::new("ferrite", name), &size, |b, &s| {
            b.iter(|| {
                let blk = a.allocate(black_box(s)).unwrap();
                black_box(blk.addr());
            })
        });
        g.bench_with_input(BenchmarkId::new("system", name), &size, |b, &s| {
            let layout = Layout::from_size_align(s, 512).unwrap();
            b.iter(|| {
                // SAFETY: non-zero size, valid alignment; freed right away with the same layout.
                unsafe {
                    let p = alloc(layout);
                    black_box(p);
                    dealloc(p, layout);
                }
            })
        });
    }
    g.finish();
}

fn cold(c: &mut Criterion) {
    let mut g = c.benchmark_group("cold_alloc");
    let a = CachingAllocator::new(Device::Cpu);
    for (size, name) in SIZES {
        g.bench_with_input(BenchmarkId::new("ferrite", name), &size, |b, &s| {
            b.iter(|| {
                let blk = a.allocate(black_box(s)).unwrap();
                black_box(blk.addr());
                drop(blk);
                a.empty_cache();
            })
        });
        g.bench_with_input(BenchmarkId::new("system_touch_first_page", name), &size, |b, &s| {
            let layout = Layout::from_size_align(s, 512).unwrap();
            b.iter(|| {
                // SAFETY: non-zero size, valid alignment; one byte written inside the allocation,
                // then freed with the same layout.
                unsafe {
                    let p = alloc(layout);
                    p.write_volatile(1);
                    dealloc(p, layout);
                }
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1)).sample_size(30);
    targets = cached, cold
}
criterion_main!(benches);
