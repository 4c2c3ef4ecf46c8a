//! Mutation fuzzing of ferrite-memory's parsers of user text: allocator settings
//! (`--alloc-conf`, `FERRITE_ALLOC_CONF`), device strings (`--device`, `FERRITE_TEST_DEVICES`)
//! and allocation traces for `ferrite memory replay`. Every input must give a value or a typed
//! error whose message names what was wrong — never a panic — and what parses must mean what it
//! says: a configuration or a device printed and parsed again is the same, and an accepted trace
//! replays on a simulated GPU.
//!
//! `PROPTEST_CASES` sets the inputs per parser (default 3000). The cargo-fuzz targets
//! `alloc_conf`, `device` and `trace_replay` in `fuzz/` run the same checks for long runs.

use ferrite_memory::replay::{Trace, replay};
use ferrite_memory::{AllocatorConfig, Device};
use ferrite_test_support::text_fuzz::{mutated_text, run_text_fuzz};

fn alloc_conf_seeds() -> Vec<String> {
    [
        "",
        "max_split_size_mb:128",
        "expandable_segments:True",
        "garbage_collection_threshold:0.6,max_split_size_mb:512",
        "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
        "roundup_power2_divisions:4, expandable_segments:False",
        "max_non_split_rounding_mb:40,pinned_num_register_threads:8,backend:native",
        "release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:False,pinned_use_background_threads:True",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

const ALLOC_CONF_TOKENS: &[&str] = &[
    ",",
    ":",
    "[",
    "]",
    ">",
    " ",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "expandable_segments",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "backend",
    "native",
    "cudaMallocAsync",
    "True",
    "False",
    "true",
    "0",
    "1",
    "19",
    "20",
    "3",
    "128",
    "0.5",
    "1.0",
    "-1",
    "1e308",
    "nan",
    "inf",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999",
];

#[test]
fn allocator_settings_parse_or_say_why() {
    run_text_fuzz("alloc_conf", mutated_text(alloc_conf_seeds(), ALLOC_CONF_TOKENS.to_vec()), |spec| {
        match AllocatorConfig::parse(spec) {
            Ok(cfg) => {
                let printed = cfg.to_string();
                let again = AllocatorConfig::parse(&printed)
                    .map_err(|e| format!("`{spec}` parsed, but its canonical form `{printed}` did not: {e}"))?;
                if again != cfg {
                    return Err(format!("`{spec}` → `{printed}` → a different configuration"));
                }
                // Applying a valid spec on top of any configuration is the same as parsing it
                // on top of the defaults for every key it names, and leaves the rest alone.
                let mut layered = cfg.clone();
                layered.apply(spec).map_err(|e| format!("re-applying `{spec}` failed: {e}"))?;
                if layered != cfg {
                    return Err(format!("re-applying `{spec}` changed the configuration"));
                }
                Ok(())
            }
            Err(e) => {
                let msg = e.to_string();
                if msg.trim().is_empty() { Err(format!("`{spec}`: an error with no message")) } else { Ok(()) }
            }
        }
    });
}

/// A failed `apply` leaves the configuration as it was (no half-applied settings).
#[test]
fn a_rejected_setting_changes_nothing() {
    run_text_fuzz("alloc_conf_apply", mutated_text(alloc_conf_seeds(), ALLOC_CONF_TOKENS.to_vec()), |spec| {
        let base = AllocatorConfig::parse("max_split_size_mb:256,garbage_collection_threshold:0.5")
            .map_err(|e| format!("the base configuration must parse: {e}"))?;
        let mut cfg = base.clone();
        if cfg.apply(spec).is_err() && cfg != base {
            return Err(format!("`{spec}` was rejected but changed the configuration"));
        }
        Ok(())
    });
}

fn device_seeds() -> Vec<String> {
    [
        "cpu",
        "meta",
        "gpu",
        "gpu:1",
        "cuda",
        "cuda:2",
        "sim:a100-40gb",
        "sim:h100-80gb:3",
        "sim:1GiB",
        "sim:512MiB:1",
        "sim:2.5GB",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

const DEVICE_TOKENS: &[&str] = &[
    ":",
    "sim",
    "gpu",
    "cuda",
    "cpu",
    "meta",
    "cuda",
    "a100-40gb",
    "h100-80gb",
    "t4-16gb",
    "GiB",
    "MiB",
    "KiB",
    "TiB",
    "GB",
    "kb",
    "b",
    ".",
    "0",
    "1",
    "-1",
    "1e30",
    "999999999999999999999",
    "18446744073709551615",
    " ",
    "\t",
];

#[test]
fn device_strings_parse_or_say_why() {
    run_text_fuzz("device", mutated_text(device_seeds(), DEVICE_TOKENS.to_vec()), |spec| match Device::parse(spec) {
        Ok(d) => {
            let printed = d.to_string();
            match Device::parse(&printed) {
                Ok(again) if again == d => Ok(()),
                Ok(again) => Err(format!("`{spec}` → `{printed}` → {again:?}, not {d:?}")),
                Err(e) => Err(format!("`{spec}` parsed, but its printed form `{printed}` did not: {e}")),
            }
        }
        Err(e) => {
            let msg = e.to_string();
            if msg.contains(spec.trim()) || spec.trim().is_empty() {
                Ok(())
            } else {
                Err(format!("the error for `{spec}` does not quote it: {msg}"))
            }
        }
    });
}

fn trace_seeds() -> Vec<String> {
    [
        r#"{"events": []}"#,
        r#"{"device": "sim:a100-40gb", "events": [{"action": "alloc", "id": 1, "size": 614400}, {"action": "free", "id": 1}]}"#,
        r#"{"device": "sim:1GiB", "events": [{"action": "alloc", "id": 1, "size": 900000000}, {"action": "alloc", "id": 2, "size": 300000000, "stream": 1}, {"action": "free", "id": 1}, {"action": "empty_cache"}, {"action": "reset_peak_memory_stats"}, {"action": "free", "id": 2}]}"#,
        r#"{"events": [{"action": "alloc", "id": 7, "size": 1}, {"action": "alloc", "id": 7, "size": 2}, {"action": "free", "id": 8}]}"#,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

const TRACE_TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    r#""action""#,
    r#""alloc""#,
    r#""free""#,
    r#""empty_cache""#,
    r#""reset_peak_memory_stats""#,
    r#""id""#,
    r#""size""#,
    r#""stream""#,
    r#""device""#,
    r#""sim:4GiB""#,
    r#""cpu""#,
    r#""meta""#,
    r#""gpu:0""#,
    r#""sim:nope""#,
    "null",
    "0",
    "1",
    "-1",
    "1.5",
    "18446744073709551615",
    "18446744073709551616",
    "1099511627776",
    "4294967295",
    "4294967296",
];

/// Events a replay may run per input: enough for every branch, few enough for CI.
const MAX_REPLAY_EVENTS: usize = 2000;

#[test]
fn traces_parse_and_replay_or_say_why() {
    run_text_fuzz("trace_replay", mutated_text(trace_seeds(), TRACE_TOKENS.to_vec()), |json| {
        let trace = match Trace::from_json(json) {
            Ok(t) => t,
            Err(e) if e.to_string().trim().is_empty() => return Err("an empty trace error".into()),
            Err(_) => return Ok(()),
        };
        if trace.events.len() > MAX_REPLAY_EVENTS {
            return Ok(());
        }
        // A real GPU is never the target of a fuzz replay (no adapter or driver in CI): map it to
        // a card.
        let device = match trace.device.as_deref().map(Device::parse) {
            Some(Ok(Device::Gpu { .. } | Device::Cuda { .. })) | None => {
                Device::parse("sim:4GiB").map_err(|e| e.to_string())?
            }
            Some(Ok(d)) => d,
            Some(Err(_)) => return Ok(()),
        };
        match replay(&trace, device, AllocatorConfig::default()) {
            Ok(report) => {
                let st = &report.stats;
                if report.events != trace.events.len() {
                    return Err(format!("replayed {} of {} events", report.events, trace.events.len()));
                }
                let allocated = st.allocated_bytes.all.current;
                let reserved = st.reserved_bytes.all.current;
                if allocated > reserved {
                    return Err(format!("allocated {allocated} > reserved {reserved} after the replay"));
                }
                Ok(())
            }
            Err(e) if e.to_string().trim().is_empty() => Err("an empty replay error".into()),
            Err(_) => Ok(()),
        }
    });
}
