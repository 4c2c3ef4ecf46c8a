//! History ring and snapshots, exported as JSON.
use ferrite_memory::{AllocatorConfig, BlockState, CachingAllocator, Device, TraceAction};

const MIB: usize = 1 << 20;

#[test]
fn history_records_events_with_caller_locations() {
    let a = CachingAllocator::unbacked(Device::parse("sim:64MiB").unwrap(), AllocatorConfig::default());
    drop(a.allocate(100).unwrap()); // not recorded: history is off
    assert!(a.memory_history().is_empty());
    a.record_memory_history(Some(100));
    let line = line!() + 1;
    let b = a.allocate(5 * MIB).unwrap();
    drop(b);
    a.empty_cache();
    let _ = a.allocate(100 * MIB);
    let h = a.memory_history();
    let actions: Vec<_> = h.iter().map(|e| e.action).collect();
    assert_eq!(
        actions,
        [
            TraceAction::SegmentAlloc,
            TraceAction::Alloc,
            TraceAction::Free,
            TraceAction::SegmentFree,
            TraceAction::SegmentFree,
            TraceAction::Oom
        ]
    );
    assert_eq!(h[0].size, 20 * MIB as u64);
    assert_eq!(h[1].size, 5 * MIB as u64);
    assert_eq!(h[3].size, 20 * MIB as u64, "the large segment is released first");
    assert_eq!(h[4].size, 2 * MIB as u64);
    assert!(h[1].frames[0].filename.ends_with("history_and_snapshot.rs"));
    assert_eq!(h[1].frames[0].line, line);
    assert!(h[1].time_us > 0);
    assert_eq!(h[5].size, 100 * MIB as u64);
    // the JSON export has PyTorch's field names
    let json = serde_json::to_value(&h).unwrap();
    assert_eq!(json[1]["action"], "alloc");
    assert_eq!(json[3]["action"], "segment_free");
    assert!(json[0]["frames"][0]["filename"].is_string());
    a.record_memory_history(None);
    assert!(a.memory_history().is_empty());
}

#[test]
fn history_ring_is_bounded() {
    let a = CachingAllocator::new(Device::Meta);
    a.record_memory_history(Some(10));
    for _ in 0..100 {
        drop(a.allocate(1000).unwrap());
    }
    let h = a.memory_history();
    assert_eq!(h.len(), 10);
    assert_eq!(h[9].action, TraceAction::Free);
}

#[test]
fn segment_alloc_events_name_the_caller() {
    let a = CachingAllocator::new(Device::Meta);
    a.record_memory_history(Some(10));
    let _b = a.allocate(1000).unwrap();
    let h = a.memory_history();
    assert_eq!(h[0].action, TraceAction::SegmentAlloc);
    assert_eq!(h[0].size, 2 * MIB as u64);
    assert_eq!(h[1].action, TraceAction::Alloc);
    assert!(h[0].frames[0].filename.ends_with("history_and_snapshot.rs"));
}

#[test]
fn snapshot_lists_segments_and_blocks() {
    let a = CachingAllocator::unbacked(Device::parse("sim:a100-40gb:2").unwrap(), AllocatorConfig::default());
    let b1 = a.allocate(600 * 1024).unwrap();
    let b2 = a.allocate(3 * MIB).unwrap();
    let b3 = a.allocate(1000).unwrap();
    drop(b3);
    let s = a.snapshot();
    assert_eq!(s.segments.len(), 2);
    assert_eq!(s.reserved_bytes(), 22 * MIB as u64);
    let small = s.segments.iter().find(|g| g.segment_type == "small").unwrap();
    assert_eq!(small.device, 2);
    assert_eq!(small.total_size, 2 * MIB as u64);
    assert_eq!(small.allocated_size, 614_400);
    assert_eq!(small.blocks.len(), 2);
    assert_eq!(small.blocks[0].state, BlockState::ActiveAllocated);
    assert_eq!(small.blocks[0].requested_size, 614_400);
    assert_eq!(small.blocks[1].state, BlockState::Inactive);
    assert_eq!(small.blocks[1].address, small.address + 614_400);
    assert!(small.blocks[0].frames[0].filename.ends_with("history_and_snapshot.rs"));
    let large = s.segments.iter().find(|g| g.segment_type == "large").unwrap();
    assert_eq!(large.total_size, 20 * MIB as u64);
    assert_eq!(large.blocks.iter().map(|b| b.size).sum::<u64>(), 20 * MIB as u64);
    let json: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
    assert_eq!(json["segments"][0]["blocks"][0]["state"], "active_allocated");
    assert!(json["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"].is_string());
    assert!(json["device_traces"].is_array());
    drop((b1, b2));
}

#[test]
fn summary_table_reflects_the_allocator() {
    let a = CachingAllocator::new(Device::Meta);
    let _b = a.allocate(3 * MIB).unwrap();
    let t = a.memory_summary(false);
    assert!(t.contains("ferrite memory summary, device meta"), "{t}");
    assert!(t.contains("| Allocated memory      |   3072 KiB |   3072 KiB |   3072 KiB |      0 B   |"), "{t}");
    assert!(t.contains("| GPU reserved memory   |  20480 KiB |"), "{t}");
}
