//! Device strings (`--device`, `FERRITE_TEST_DEVICES`, `map_location`): any text parses or is a
//! typed error that quotes it; a parsed device prints to a string that parses back to it. The CI
//! counterpart is `crates/ferrite-memory/tests/parser_fuzz.rs`.
#![no_main]

use ferrite_io::MapLocation;
use ferrite_memory::Device;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let spec = String::from_utf8_lossy(data);
    match Device::parse(&spec) {
        Ok(d) => assert_eq!(Device::parse(&d.to_string()).ok().as_ref(), Some(&d), "`{spec}`"),
        Err(e) => assert!(spec.trim().is_empty() || e.to_string().contains(spec.trim()), "`{spec}`: {e}"),
    }
    if let Ok(MapLocation::Remap(pairs)) = MapLocation::parse(&spec) {
        for (tag, _) in &pairs {
            assert!(!tag.contains(','), "`{spec}` gave the tag `{tag}`");
        }
    }
});
