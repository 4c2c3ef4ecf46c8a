//! `--metrics-addr` and `ferrite monitor`'s target: any text parses or is a typed error; what
//! parses prints to a form that parses back to it. The CI counterpart is the proptest in
//! `crates/ferrite-train/src/observe/metrics_addr.rs`.
#![no_main]

use ferrite_train::observe::metrics_addr::{parse_listen_addr, parse_target};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(a) = parse_listen_addr(&text) {
        assert_eq!(parse_listen_addr(&a.socket_string()).ok().as_ref(), Some(&a), "`{text}`");
    }
    if let Ok(t) = parse_target(&text) {
        assert_eq!(parse_target(&t.url()).ok().as_ref(), Some(&t), "`{text}`");
    }
});
