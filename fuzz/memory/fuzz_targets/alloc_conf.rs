//! Allocator settings (`--alloc-conf`, `FERRITE_ALLOC_CONF`, `PYTORCH_CUDA_ALLOC_CONF` in the
//! doctor): any text parses or is a typed error; what parses prints to a canonical form that
//! parses back to the same settings; a rejected `apply` changes nothing. The CI counterpart is
//! `crates/ferrite-memory/tests/parser_fuzz.rs`.
#![no_main]

use ferrite_memory::AllocatorConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let spec = String::from_utf8_lossy(data);
    match AllocatorConfig::parse(&spec) {
        Ok(cfg) => {
            let printed = cfg.to_string();
            assert_eq!(AllocatorConfig::parse(&printed).ok().as_ref(), Some(&cfg), "`{spec}` -> `{printed}`");
        }
        Err(e) => assert!(!e.to_string().trim().is_empty()),
    }
    let base = AllocatorConfig::parse("max_split_size_mb:256").expect("a valid base");
    let mut cfg = base.clone();
    if cfg.apply(&spec).is_err() {
        assert_eq!(cfg, base, "a rejected `{spec}` changed the settings");
    }
});
