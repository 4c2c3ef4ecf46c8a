//! What `ferrite monitor` reads from a `/metrics` endpoint, which may be any server: any text is
//! samples or a typed error with a line number. The CI counterpart is the proptest in
//! `crates/ferrite-train/src/observe/metrics_text.rs`.
#![no_main]

use ferrite_train::observe::metrics_text::parse_metrics_text;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match parse_metrics_text(&text) {
        Ok(m) => {
            for s in &m.samples {
                assert!(!s.name.is_empty(), "a sample without a name from `{text}`");
            }
        }
        Err(e) => assert!(e.line >= 1 && e.line <= text.lines().count().max(1), "line {} of `{text}`", e.line),
    }
});
