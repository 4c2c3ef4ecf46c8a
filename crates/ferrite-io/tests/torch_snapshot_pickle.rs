//! ferrite's allocator snapshot written as a PyTorch memory-snapshot pickle loads in Python's own
//! `pickle` with the schema `torch.cuda.memory._snapshot()` has (every key `torch.cuda._memory_viz`
//! reads, blocks tiling their segments), and the plain-data pickle writer round-trips through
//! Python. Needs `python3` (standard library only); skipped loudly when absent unless
//! FERRITE_REQUIRE_SYSTEM_DEPS=1. When a Python with `torch` is found (`python3`, or the one in
//! `$FERRITE_TORCH_PYTHON`), PyTorch's viewer (`python -m torch.cuda._memory_viz trace_plot`,
//! `stats`, `trace`) also opens the file; without torch that part is skipped (CI has no torch).
use std::process::Command;

use ferrite_io::{TorchSnapshot, Value, from_pickle, memory_snapshot_to_value, to_pickle, write_torch_snapshot};
use ferrite_memory::{AllocatorConfig, CachingAllocator, Device};

/// Checks the schema and prints a JSON summary. argv[1]: the pickle.
const SCHEMA_CHECK: &str = r#"
import json, pickle, sys
with open(sys.argv[1], "rb") as f:
    s = pickle.load(f)
assert isinstance(s, dict), type(s)
assert {"segments", "device_traces", "allocator_settings"} <= set(s), sorted(s)
SEG = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
       "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
BLOCK = {"address", "size", "requested_size", "state", "frames"}
FRAME = {"filename", "line", "name"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "snapshot", "oom"}
for seg in s["segments"]:
    assert SEG <= set(seg), sorted(SEG - set(seg))
    assert seg["segment_type"] in ("small", "large")
    assert isinstance(seg["segment_pool_id"], tuple) and len(seg["segment_pool_id"]) == 2
    addr = seg["address"]
    for b in seg["blocks"]:
        assert BLOCK <= set(b), sorted(BLOCK - set(b))
        assert b["state"] in ("active_allocated", "active_pending_free", "inactive"), b["state"]
        assert b["address"] == addr, (b["address"], addr)
        addr += b["size"]
        for fr in b["frames"]:
            assert FRAME <= set(fr)
    assert addr == seg["address"] + seg["total_size"], "blocks do not tile the segment"
    assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
n = 0
for trace in s["device_traces"]:
    assert isinstance(trace, list)
    for e in trace:
        assert e["action"] in ACTIONS, e["action"]
        key = "device_free" if e["action"] == "oom" else "addr"
        assert {key, "size", "stream", "time_us", "frames"} <= set(e), sorted(e)
        assert isinstance(e["size"], int) and isinstance(e["time_us"], int)
        n += 1
st = s["allocator_settings"]
assert {"PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "garbage_collection_threshold", "expandable_segments",
        "roundup_power2_divisions"} <= set(st), sorted(st)
actions = {}
for t in s["device_traces"]:
    for e in t:
        actions[e["action"]] = actions.get(e["action"], 0) + 1
print(json.dumps({"segments": len(s["segments"]), "entries": n, "actions": actions,
                  "reserved": sum(x["total_size"] for x in s["segments"]),
                  "alloc_conf": st["PYTORCH_CUDA_ALLOC_CONF"]}))
"#;

/// Re-pickles what it loads with Python's pickler; argv[1] in, argv[2] out, prints repr.
const ROUND_TRIP: &str = r#"
import pickle, sys
with open(sys.argv[1], "rb") as f:
    v = pickle.load(f)
with open(sys.argv[2], "wb") as f:
    pickle.dump(v, f)
print(repr(v))
"#;

fn python(args: &[&str]) -> Option<std::process::Output> {
    Command::new("python3").args(args).output().ok()
}

fn require_python() -> bool {
    let ok = python(&["-c", "import pickle, json"]).map(|o| o.status.success()).unwrap_or(false);
    ferrite_test_support::present_or_skip(ok, "python3 missing", "install python3 (the standard library is enough)")
}

/// A Python that can `import torch`, if any.
fn torch_python() -> Option<String> {
    let candidates = std::env::var("FERRITE_TORCH_PYTHON").into_iter().chain(["python3".to_string()]);
    candidates.into_iter().find(|p| {
        Command::new(p)
            .args(["-c", "import torch.cuda._memory_viz"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    })
}

/// A snapshot with live and cached blocks in both pools, frees and an OOM.
fn ferrite_snapshot() -> ferrite_memory::MemorySnapshot {
    let a = CachingAllocator::unbacked(
        Device::parse("sim:256MiB").unwrap(),
        AllocatorConfig::parse("max_split_size_mb:64").unwrap(),
    );
    a.record_memory_history(Some(10_000));
    let big = a.allocate(30 << 20).unwrap();
    let small = a.allocate(4000).unwrap();
    let mid = a.allocate(5 << 20).unwrap();
    drop(big);
    assert!(a.allocate(1 << 30).is_err());
    let again = a.allocate(12 << 20).unwrap();
    let snap = a.snapshot();
    drop((small, mid, again));
    snap
}

#[test]
fn ferrite_snapshot_pickle_has_pytorchs_schema_in_python() {
    if !require_python() {
        return;
    }
    let snap = ferrite_snapshot();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("snap.pickle");
    write_torch_snapshot(&path, &snap).unwrap();
    let out = python(&["-c", SCHEMA_CHECK, path.to_str().unwrap()]).unwrap();
    assert!(out.status.success(), "schema check failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["segments"], snap.segments.len());
    assert_eq!(v["reserved"], snap.reserved_bytes());
    assert_eq!(v["alloc_conf"], snap.allocator_settings.alloc_conf);
    // Every ferrite free is PyTorch's two steps; the OOM is there.
    assert_eq!(v["actions"]["free_requested"], v["actions"]["free_completed"]);
    assert_eq!(v["actions"]["oom"], 1);
    assert!(v["actions"]["segment_alloc"].as_u64().unwrap() >= 2);
    // And ferrite reads its own file back.
    let back = TorchSnapshot::read(&path).unwrap();
    assert_eq!(back.segments.len(), snap.segments.len());
    // Recording began with the allocator, so the recorded series starts from zero reserved.
    let t = back.device_replay_trace(0);
    assert_eq!(t.allocated_before_trace, 0);
    assert_eq!(t.recorded.last().map(|p| p.reserved), Some(snap.reserved_bytes()));
}

#[test]
fn pytorch_viewer_opens_the_ferrite_snapshot() {
    let Some(py) = torch_python() else {
        eprintln!("SKIPPED: no Python with torch (set FERRITE_TORCH_PYTHON=/path/to/python with torch installed)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("snap.pickle");
    write_torch_snapshot(&path, &ferrite_snapshot()).unwrap();
    let html = dir.path().join("trace.html");
    let viz = |args: &[&str]| {
        let out = Command::new(&py).args(["-m", "torch.cuda._memory_viz"]).args(args).output().unwrap();
        assert!(out.status.success(), "_memory_viz {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    viz(&["trace_plot", path.to_str().unwrap(), "-o", html.to_str().unwrap()]);
    assert!(std::fs::read_to_string(&html).unwrap().contains("Active Memory Timeline"));
    let stats = viz(&["stats", path.to_str().unwrap()]);
    assert!(stats.contains("total_reserved"), "{stats}");
    let trace = viz(&["trace", path.to_str().unwrap()]);
    assert!(trace.contains("cudaMalloc(") && trace.contains("raise OutOfMemoryError"), "{trace}");
}

#[test]
fn plain_pickles_round_trip_through_python() {
    if !require_python() {
        return;
    }
    let v = Value::Dict(vec![
        (Value::Str("ints".into()), Value::List([0, 255, 256, 70_000, -5, 1 << 40, i64::MIN].map(Value::Int).to_vec())),
        (Value::Str("f".into()), Value::Float(-2.5e-300)),
        (Value::Str("flags".into()), Value::Tuple(vec![Value::Bool(true), Value::Bool(false), Value::None])),
        (Value::Str("text".into()), Value::Str("ünï ✓".into())),
        (Value::Int(3), Value::Bytes(vec![0, 255])),
        (
            Value::Str("nested".into()),
            Value::List(vec![Value::Dict(vec![]), Value::Tuple(vec![]), Value::List(vec![])]),
        ),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.pickle"), dir.path().join("b.pickle"));
    std::fs::write(&a, to_pickle(&v).unwrap()).unwrap();
    let out = python(&["-c", ROUND_TRIP, a.to_str().unwrap(), b.to_str().unwrap()]).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let repr = String::from_utf8_lossy(&out.stdout);
    assert!(repr.contains("'ints': [0, 255, 256, 70000, -5, 1099511627776, -9223372036854775808]"), "{repr}");
    assert!(repr.contains("'flags': (True, False, None)") && repr.contains("3: b'\\x00\\xff'"), "{repr}");
    // What Python's own pickler (protocol 4+, framing, memoize) writes back reads as the same value.
    let back = from_pickle(&std::fs::read(&b).unwrap()).unwrap();
    assert_eq!(back, v);
}

#[test]
fn snapshot_value_is_what_the_pickle_holds() {
    let snap = ferrite_snapshot();
    let v = memory_snapshot_to_value(&snap);
    assert_eq!(from_pickle(&to_pickle(&v).unwrap()).unwrap(), v);
}

mod mutated_snapshots {
    use super::*;
    use ferrite_memory::replay::what_if;
    use proptest::prelude::*;

    fn snapshot_bytes() -> Vec<u8> {
        to_pickle(&memory_snapshot_to_value(&ferrite_snapshot())).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Flipped bytes and truncations of a snapshot give a value or a typed error, never a
        /// panic, and whatever parses also replays (or is refused) without one.
        #[test]
        fn mutated_snapshots_never_panic(
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
            cut in any::<prop::sample::Index>(),
            truncate in any::<bool>(),
        ) {
            let mut b = snapshot_bytes();
            for (i, v) in flips {
                let i = i.index(b.len());
                b[i] = v;
            }
            if truncate {
                b.truncate(cut.index(b.len()));
            }
            if let Ok(traces) = TorchSnapshot::from_bytes(&b).and_then(|s| s.replay_traces()) {
                for t in traces {
                    let _ = what_if(&t.trace, &Device::Meta, &[AllocatorConfig::default()]);
                }
            }
        }
    }
}
