//! OOM on sim devices: fragmented vs exhausted, never a panic, the allocator keeps working.
use ferrite_memory::{AllocatorConfig, CachingAllocator, Device, MemoryError, OomDiagnosis, SuggestionKind};

const MIB: usize = 1 << 20;

/// Fill a 100 MiB device with 5 MiB blocks (four per 20 MiB segment), then free every other one:
/// 50 MiB free, but only in 5 MiB holes.
fn fragmented_device(backed: bool) -> (CachingAllocator, Vec<Option<ferrite_memory::Block>>) {
    let dev = Device::parse("sim:100MiB").unwrap();
    let a =
        if backed { CachingAllocator::new(dev) } else { CachingAllocator::unbacked(dev, AllocatorConfig::default()) };
    let mut blocks: Vec<Option<_>> = (0..20).map(|_| Some(a.allocate(5 * MIB).unwrap())).collect();
    assert_eq!(a.memory_reserved(), 100 * MIB as u64);
    for b in blocks.iter_mut().step_by(2) {
        *b = None;
    }
    assert_eq!(a.memory_allocated(), 50 * MIB as u64);
    (a, blocks)
}

#[test]
fn scattered_free_memory_is_diagnosed_as_fragmented() {
    for backed in [false, true] {
        let (a, mut blocks) = fragmented_device(backed);
        let e = a.allocate(12 * MIB).unwrap_err();
        let MemoryError::OutOfMemory { report } = &e else { panic!("expected an OOM, got {e:?}") };
        assert_eq!(report.diagnosis, OomDiagnosis::Fragmented);
        assert_eq!(report.requested_bytes, 12 * MIB as u64);
        assert_eq!(report.segment_bytes, 12 * MIB as u64);
        assert_eq!(report.allocated_bytes, 50 * MIB as u64);
        assert_eq!(report.reserved_unallocated_bytes, 50 * MIB as u64);
        assert_eq!(report.largest_free_block, 5 * MIB as u64);
        assert_eq!(report.device_free, Some(0));
        let kinds: Vec<_> = report.suggestions.iter().map(|s| s.kind).collect();
        assert_eq!(
            kinds,
            [SuggestionKind::ExpandableSegments, SuggestionKind::MaxSplitSize, SuggestionKind::EmptyCache]
        );
        assert!(report.suggestions[1].text.contains("max_split_size_mb:20"));
        let text = e.to_string();
        assert!(text.starts_with("CUDA out of memory. Tried to allocate 12.00 MiB. GPU 0 (sim:100MiB:0"), "{text}");
        assert!(text.contains("has a total capacity of 100.00 MiB of which 0 bytes is free."), "{text}");
        assert!(text.contains("50.00 MiB is reserved by ferrite but unallocated"), "{text}");
        assert!(text.contains("Diagnosis: fragmented"), "{text}");
        assert_eq!(a.memory_stats().num_ooms, 1);
        // the allocator keeps working: small requests fit in the holes, and after freeing
        // a whole segment the big request succeeds
        let hole = a.allocate(5 * MIB).unwrap();
        drop(hole);
        blocks[1] = None;
        blocks[3] = None;
        let big = a.allocate(12 * MIB).unwrap();
        assert_eq!(big.size(), 12 * MIB);
        a.check_consistency().unwrap();
    }
}

#[test]
fn live_tensors_that_do_not_fit_are_diagnosed_as_exhausted() {
    let a = CachingAllocator::unbacked(Device::parse("sim:100MiB").unwrap(), AllocatorConfig::default());
    let keep = a.allocate(90 * MIB).unwrap();
    let e = a.allocate(20 * MIB).unwrap_err();
    let r = e.oom_report().unwrap();
    assert_eq!(r.diagnosis, OomDiagnosis::Exhausted);
    let kinds: Vec<_> = r.suggestions.iter().map(|s| s.kind).collect();
    assert_eq!(
        kinds,
        [
            SuggestionKind::ReduceBatchSize,
            SuggestionKind::GradientAccumulation,
            SuggestionKind::MixedPrecision,
            SuggestionKind::ActivationCheckpointing
        ]
    );
    assert!(e.to_string().contains("Diagnosis: exhausted"), "{e}");
    assert!(r.suggestions[0].text.contains("by 10.00 MiB"), "{}", r.suggestions[0].text);
    // keeps working (10 MiB gets a 10 MiB segment; 5 MiB would need a 20 MiB one)
    let small = a.allocate(10 * MIB).unwrap();
    drop(keep);
    let big = a.allocate(80 * MIB).unwrap();
    drop((small, big));
    a.empty_cache();
    assert_eq!(a.memory_reserved(), 0);
    a.check_consistency().unwrap();
}

#[test]
fn exhausted_on_a_catalogue_gpu_reports_its_capacity() {
    let a = CachingAllocator::unbacked(Device::parse("sim:a100-40gb").unwrap(), AllocatorConfig::default());
    let e = a.allocate(50_000_000_000).unwrap_err();
    let r = e.oom_report().unwrap();
    assert_eq!(r.diagnosis, OomDiagnosis::Exhausted);
    assert_eq!(r.total_capacity, Some(42_505_273_344));
    assert_eq!(r.limit_bytes, Some(42_505_273_344 - 400 * MIB as u64));
    assert!(e.to_string().contains("total capacity of 39.59 GiB"), "{e}");
}

#[test]
fn max_split_size_is_not_suggested_when_already_set() {
    let (a, _blocks) = fragmented_device(false);
    a.set_alloc_conf("max_split_size_mb:100").unwrap();
    let e = a.allocate(12 * MIB).unwrap_err();
    let r = e.oom_report().unwrap();
    let kinds: Vec<_> = r.suggestions.iter().map(|s| s.kind).collect();
    assert_eq!(kinds, [SuggestionKind::ExpandableSegments, SuggestionKind::EmptyCache]);
}

#[test]
fn segment_granularity_alone_is_fragmentation_with_its_own_advice() {
    let a = CachingAllocator::unbacked(Device::parse("sim:100MiB").unwrap(), AllocatorConfig::default());
    let _keep = a.allocate(90 * MIB).unwrap();
    // 5 MiB fits in the 10 MiB left, but a 1-10 MiB request reserves a 20 MiB segment
    let e = a.allocate(5 * MIB).unwrap_err();
    let r = e.oom_report().unwrap();
    assert_eq!(r.diagnosis, OomDiagnosis::Fragmented);
    assert_eq!(r.segment_bytes, 20 * MIB as u64);
    assert_eq!(r.suggestions.len(), 2);
    assert_eq!(r.suggestions[0].kind, SuggestionKind::ExpandableSegments);
    assert!(r.suggestions[1].text.contains("10.00 MiB is unreserved"), "{}", r.suggestions[1].text);
}

#[test]
fn a_host_backed_sim_device_larger_than_the_machine_gives_a_typed_oom() {
    let ram = ferrite_memory::raw_memory::physical_memory();
    let want: usize = 70 << 30;
    if ram.is_none_or(|r| r >= want as u64) {
        println!("SKIPPED: this machine has more than 70 GiB of RAM; nothing to refuse");
        return;
    }
    let a = CachingAllocator::new(Device::parse("sim:h100-80gb").unwrap());
    let e = a.allocate(want).unwrap_err();
    let r = e.oom_report().unwrap();
    assert!(r.host_refused);
    assert_eq!(r.diagnosis, OomDiagnosis::Exhausted);
    assert!(e.to_string().contains("the host machine cannot back more memory"), "{e}");
    // the device keeps working for sizes the host can back
    assert!(a.allocate(1 << 20).is_ok());
}
