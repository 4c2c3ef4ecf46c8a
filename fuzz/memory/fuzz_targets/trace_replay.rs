//! Allocation traces for `ferrite memory replay`: any text parses or is a typed error, and an
//! accepted trace replays on a simulated GPU (a real GPU is mapped to one: no adapter here) with
//! consistent statistics. The CI counterpart is `crates/ferrite-memory/tests/parser_fuzz.rs`.
#![no_main]

use ferrite_memory::replay::{Trace, replay};
use ferrite_memory::{AllocatorConfig, Device};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(trace) = Trace::from_json(&String::from_utf8_lossy(data)) else { return };
    if trace.events.len() > 20_000 {
        return;
    }
    let device = match trace.device.as_deref().map(Device::parse) {
        Some(Ok(Device::Gpu { .. })) | None => Device::parse("sim:4GiB").expect("a valid device"),
        Some(Ok(d)) => d,
        Some(Err(_)) => return,
    };
    if let Ok(report) = replay(&trace, device, AllocatorConfig::default()) {
        assert_eq!(report.events, trace.events.len());
        assert!(report.stats.allocated_bytes.all.current <= report.stats.reserved_bytes.all.current);
    }
});
