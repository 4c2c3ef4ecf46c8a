//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot()` pickles), both directions.
//!
//! Reading: a snapshot holds every segment the CUDA caching allocator reserved and, when history
//! was recorded, the allocator's event trace per device (`alloc`, `free_requested`,
//! `free_completed`, `segment_alloc`, `segment_free`, `oom`, …). [`TorchSnapshot::replay_traces`]
//! turns each device's trace into a ferrite [`Trace`], so a run recorded on a real GPU can be
//! replayed through ferrite's allocator under other settings — the what-if "would
//! `expandable_segments` or `max_split_size_mb` have saved my run?". The pickle is read with the
//! restricted unpickler ([`crate::from_pickle`]): a snapshot cannot run code.
//!
//! Writing: [`write_torch_snapshot`] turns ferrite's own [`MemorySnapshot`] into the same schema,
//! so PyTorch's viewers (pytorch.org/memory_viz, `python -m torch.cuda._memory_viz`) open it.
//!
//! Schema (PyTorch `torch/csrc/cuda/memory_snapshot.cpp`, `torch/cuda/_memory_viz.py`): top keys
//! `segments`, `device_traces`, optionally `allocator_settings`, `host_segments`/`host_traces`.
//! Trace entries carry `action`, `addr` (for `oom`: `device_free`), `size` (the requested bytes),
//! `stream`, `frames`, since 2.1 `time_us`, from `profile_plot` a `category`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use ferrite_memory::replay::{Trace, TraceEvent};
use ferrite_memory::{BlockState, Frame, MemorySnapshot, TraceAction, TraceEntry};

use crate::error::{IoError, Result};
use crate::value::Value;

/// Which PyTorch produced a snapshot, judged by its keys (snapshots carry no version number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotFormat {
    /// PyTorch 2.0: blocks describe their allocations in a `history` list.
    BlockHistory,
    /// PyTorch 2.1 and later: blocks carry `requested_size` and `frames`, trace entries `time_us`.
    Current,
}

impl std::fmt::Display for SnapshotFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SnapshotFormat::BlockHistory => "PyTorch 2.0 layout (block history)",
            SnapshotFormat::Current => "PyTorch 2.1+ layout",
        })
    }
}

/// A trace entry's action. Unknown actions (newer PyTorch, user annotations) are kept by name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TorchAction {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
    Other(String),
}

impl TorchAction {
    fn parse(s: &str) -> TorchAction {
        match s {
            "alloc" => TorchAction::Alloc,
            "free_requested" => TorchAction::FreeRequested,
            "free_completed" => TorchAction::FreeCompleted,
            "segment_alloc" => TorchAction::SegmentAlloc,
            "segment_free" => TorchAction::SegmentFree,
            "segment_map" => TorchAction::SegmentMap,
            "segment_unmap" => TorchAction::SegmentUnmap,
            "snapshot" => TorchAction::Snapshot,
            "oom" => TorchAction::Oom,
            other => TorchAction::Other(other.to_string()),
        }
    }

    /// The name PyTorch writes.
    pub fn as_str(&self) -> &str {
        match self {
            TorchAction::Alloc => "alloc",
            TorchAction::FreeRequested => "free_requested",
            TorchAction::FreeCompleted => "free_completed",
            TorchAction::SegmentAlloc => "segment_alloc",
            TorchAction::SegmentFree => "segment_free",
            TorchAction::SegmentMap => "segment_map",
            TorchAction::SegmentUnmap => "segment_unmap",
            TorchAction::Snapshot => "snapshot",
            TorchAction::Oom => "oom",
            TorchAction::Other(s) => s,
        }
    }
}

/// One entry of a device trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TorchTraceEntry {
    pub action: TorchAction,
    /// Block or segment address (`device_free` bytes for `oom`).
    pub addr: u64,
    /// Requested bytes (segment bytes for segment actions).
    pub size: u64,
    pub stream: i64,
    pub time_us: Option<i64>,
    /// Category (`parameter`, `activation`, …) when the snapshot came from `profile_plot`.
    pub category: Option<String>,
}

/// One block of a segment.
#[derive(Debug, Clone, PartialEq)]
pub struct TorchBlock {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    /// `active_allocated`, `active_pending_free` (also spelled `active_awaiting_free`) or `inactive`.
    pub state: String,
}

impl TorchBlock {
    /// Held by the program (allocated, or freed but awaiting other streams).
    pub fn is_active(&self) -> bool {
        self.state != "inactive"
    }
}

/// One segment (one `cudaMalloc`, or one mapped range of an expandable segment).
#[derive(Debug, Clone, PartialEq)]
pub struct TorchSegment {
    pub device: usize,
    pub address: u64,
    pub total_size: u64,
    pub stream: i64,
    pub segment_type: String,
    pub is_expandable: bool,
    pub blocks: Vec<TorchBlock>,
}

/// A parsed `_dump_snapshot()` file.
#[derive(Debug, Clone, PartialEq)]
pub struct TorchSnapshot {
    pub format: SnapshotFormat,
    pub segments: Vec<TorchSegment>,
    /// One list per device index.
    pub device_traces: Vec<Vec<TorchTraceEntry>>,
    /// `allocator_settings["PYTORCH_CUDA_ALLOC_CONF"]` when the snapshot records it.
    pub alloc_conf: Option<String>,
}

/// Allocated and reserved bytes after one trace entry, as the snapshot recorded them.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedPoint {
    /// Index of the entry in the device trace.
    pub index: usize,
    pub time_us: Option<i64>,
    /// Requested bytes of live blocks (those allocated before the trace began included).
    pub allocated: u64,
    /// Bytes of segments (from `segment_alloc`/`segment_free`/`segment_map`/`segment_unmap`).
    pub reserved: u64,
    /// Allocated bytes per category, in the order of [`DeviceReplayTrace::categories`].
    pub by_category: Vec<u64>,
}

/// One device's trace, ready to replay, with what the snapshot itself recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceReplayTrace {
    pub device: usize,
    /// Allocations and frees in ferrite's trace form: first the blocks that were allocated before
    /// the recording began (freed in the trace, or still active in the segments), then the trace.
    /// Each `oom` entry becomes a probe: its request allocated and released at once.
    pub trace: Trace,
    /// How many of `trace.events` are those earlier allocations.
    pub allocated_before_trace: usize,
    /// The recorded series, one point per entry of the device trace.
    pub recorded: Vec<RecordedPoint>,
    /// Category names when the trace carries them (`"unknown"` for entries without one).
    pub categories: Vec<String>,
    /// `oom` entries in the trace.
    pub recorded_ooms: usize,
    /// Entries that a replay ignores by action name (annotations, unknown actions), with counts.
    pub ignored_actions: BTreeMap<String, usize>,
}

impl DeviceReplayTrace {
    /// Highest recorded reserved bytes.
    pub fn recorded_peak_reserved(&self) -> u64 {
        self.recorded.iter().map(|p| p.reserved).max().unwrap_or(0)
    }

    /// Highest recorded allocated (requested) bytes.
    pub fn recorded_peak_allocated(&self) -> u64 {
        self.recorded.iter().map(|p| p.allocated).max().unwrap_or(0)
    }
}

impl TorchSnapshot {
    /// Reads a snapshot file.
    pub fn read(path: impl AsRef<Path>) -> Result<TorchSnapshot> {
        let path = path.as_ref();
        let bytes = crate::map_file(path)?;
        TorchSnapshot::from_bytes(&bytes)
    }

    /// Parses snapshot bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<TorchSnapshot> {
        if bytes.first() != Some(&0x80) {
            return Err(IoError::UnsupportedSnapshot {
                found: "not a pickle".into(),
                reason: "the file does not start with a pickle protocol header (0x80)".into(),
            });
        }
        TorchSnapshot::from_value(&crate::from_pickle(bytes)?)
    }

    /// Interprets an unpickled value.
    pub fn from_value(v: &Value) -> Result<TorchSnapshot> {
        let items = match v {
            Value::Dict(items) => items,
            Value::List(_) => {
                return Err(IoError::UnsupportedSnapshot {
                    found: "a list of segments".into(),
                    reason: "this is `torch.cuda.memory_snapshot()` output (segments only, as PyTorch \
                             1.x wrote), which has no allocation trace to replay"
                        .into(),
                });
            }
            other => {
                return Err(IoError::UnsupportedSnapshot {
                    found: format!("a pickled {}", other.kind()),
                    reason: "a snapshot is a dict".into(),
                });
            }
        };
        let keys: Vec<String> = items.iter().map(|(k, _)| crate::value::key_to_string(k)).collect();
        let Some(segments_v) = v.get("segments") else {
            return Err(IoError::UnsupportedSnapshot {
                found: format!("a dict with keys [{}]", keys.join(", ")),
                reason: "it has no \"segments\" key".into(),
            });
        };
        let segments_list = as_list(segments_v, "segments")?;
        let mut format = SnapshotFormat::Current;
        let mut segments = Vec::with_capacity(segments_list.len());
        for (i, s) in segments_list.iter().enumerate() {
            let path = format!("segments/{i}");
            let (seg, seg_format) = parse_segment(s, &path)?;
            if seg_format == SnapshotFormat::BlockHistory {
                format = SnapshotFormat::BlockHistory;
            }
            segments.push(seg);
        }
        let mut device_traces = Vec::new();
        if let Some(traces) = v.get("device_traces") {
            for (d, list) in as_list(traces, "device_traces")?.iter().enumerate() {
                let path = format!("device_traces/{d}");
                let entries = as_list(list, &path)?;
                let mut out = Vec::with_capacity(entries.len());
                for (i, e) in entries.iter().enumerate() {
                    out.push(parse_entry(e, &format!("{path}/{i}"))?);
                }
                device_traces.push(out);
            }
        }
        let alloc_conf = v
            .get("allocator_settings")
            .and_then(|s| s.get("PYTORCH_CUDA_ALLOC_CONF"))
            .and_then(|c| if let Value::Str(s) = c { Some(s.clone()) } else { None });
        Ok(TorchSnapshot { format, segments, device_traces, alloc_conf })
    }

    /// Devices whose trace has at least one entry.
    pub fn traced_devices(&self) -> Vec<usize> {
        self.device_traces.iter().enumerate().filter(|(_, t)| !t.is_empty()).map(|(d, _)| d).collect()
    }

    /// Every traced device's trace in replayable form. A snapshot without any trace entries (history
    /// was not recorded) is [`IoError::UnsupportedSnapshot`]: there is nothing to replay.
    pub fn replay_traces(&self) -> Result<Vec<DeviceReplayTrace>> {
        let devices = self.traced_devices();
        if devices.is_empty() {
            return Err(IoError::UnsupportedSnapshot {
                found: format!("{}, {} segments, no trace entries", self.format, self.segments.len()),
                reason: "allocation history was not recorded, so there is no trace to replay (call \
                         `torch.cuda.memory._record_memory_history()` before the step)"
                    .into(),
            });
        }
        Ok(devices.into_iter().map(|d| self.device_replay_trace(d)).collect())
    }

    /// One device's trace in replayable form (empty when the device has no trace).
    pub fn device_replay_trace(&self, device: usize) -> DeviceReplayTrace {
        let entries: &[TorchTraceEntry] = self.device_traces.get(device).map(|v| v.as_slice()).unwrap_or(&[]);
        let segments: Vec<&TorchSegment> = self.segments.iter().filter(|s| s.device == device).collect();

        // Blocks allocated before the recording began: freed in the trace without an alloc in it,
        // or still active at the end without one.
        let mut live: HashMap<u64, u64> = HashMap::new();
        let mut before: BTreeMap<u64, u64> = BTreeMap::new();
        for e in entries {
            match e.action {
                TorchAction::Alloc => {
                    live.insert(e.addr, e.size);
                }
                TorchAction::FreeCompleted if live.remove(&e.addr).is_none() => {
                    before.entry(e.addr).or_insert(e.size);
                }
                _ => {}
            }
        }
        let allocated_in_trace: BTreeSet<u64> =
            entries.iter().filter(|e| e.action == TorchAction::Alloc).map(|e| e.addr).collect();
        for b in segments.iter().flat_map(|s| &s.blocks) {
            if b.is_active() && !allocated_in_trace.contains(&b.address) && !before.contains_key(&b.address) {
                let size = if b.requested_size > 0 { b.requested_size } else { b.size };
                before.insert(b.address, size);
            }
        }

        // Streams are pointers in PyTorch; ferrite numbers them 0, 1, … in order of appearance.
        let mut streams: HashMap<i64, u32> = HashMap::from([(0, 0)]);
        let mut stream_of = |s: i64| {
            let n = streams.len() as u32;
            *streams.entry(s).or_insert(n)
        };

        let mut events = Vec::with_capacity(before.len() + entries.len());
        let mut next_id = 0u64;
        let mut ids: HashMap<u64, u64> = HashMap::new();
        for (&addr, &size) in &before {
            events.push(TraceEvent::Alloc { id: next_id, size, stream: 0 });
            ids.insert(addr, next_id);
            next_id += 1;
        }
        let allocated_before_trace = events.len();

        // Categories, for stacking.
        let mut categories: Vec<String> = Vec::new();
        if entries.iter().any(|e| e.category.is_some()) {
            let mut seen = BTreeSet::new();
            for e in entries.iter().filter(|e| e.action == TorchAction::Alloc) {
                seen.insert(e.category.clone().unwrap_or_else(|| "unknown".into()));
            }
            if !before.is_empty() {
                seen.insert("unknown".into());
            }
            categories = seen.into_iter().collect();
        }
        let cat_index = |c: &Option<String>| -> Option<usize> {
            if categories.is_empty() {
                return None;
            }
            let name = c.as_deref().unwrap_or("unknown");
            categories.iter().position(|x| x == name)
        };

        // The recorded reserved bytes before the trace: the final segments minus the trace's net.
        let final_reserved: u64 = segments.iter().map(|s| s.total_size).sum();
        let net: i128 = entries
            .iter()
            .map(|e| match e.action {
                TorchAction::SegmentAlloc | TorchAction::SegmentMap => e.size as i128,
                TorchAction::SegmentFree | TorchAction::SegmentUnmap => -(e.size as i128),
                _ => 0,
            })
            .sum();
        let mut reserved: i128 = (final_reserved as i128 - net).max(0);
        let mut allocated: u64 = before.values().sum();
        let mut by_category = vec![0u64; categories.len()];
        if let Some(u) = cat_index(&None) {
            by_category[u] = allocated;
        }
        let mut live_cat: HashMap<u64, (u64, Option<usize>)> =
            before.iter().map(|(&a, &s)| (a, (s, cat_index(&None)))).collect();

        let mut recorded = Vec::with_capacity(entries.len());
        let mut recorded_ooms = 0;
        let mut ignored_actions: BTreeMap<String, usize> = BTreeMap::new();
        for (i, e) in entries.iter().enumerate() {
            match &e.action {
                TorchAction::Alloc => {
                    if let Some(old) = ids.remove(&e.addr) {
                        // The trace lost this address's free (ring buffer); free it before reuse.
                        events.push(TraceEvent::Free { id: old });
                    }
                    if let Some((s, c)) = live_cat.remove(&e.addr) {
                        allocated = allocated.saturating_sub(s);
                        if let Some(c) = c {
                            by_category[c] = by_category[c].saturating_sub(s);
                        }
                    }
                    events.push(TraceEvent::Alloc { id: next_id, size: e.size, stream: stream_of(e.stream) });
                    ids.insert(e.addr, next_id);
                    next_id += 1;
                    let c = cat_index(&e.category);
                    allocated += e.size;
                    if let Some(c) = c {
                        by_category[c] += e.size;
                    }
                    live_cat.insert(e.addr, (e.size, c));
                }
                TorchAction::FreeCompleted => {
                    if let Some(id) = ids.remove(&e.addr) {
                        events.push(TraceEvent::Free { id });
                    }
                    if let Some((s, c)) = live_cat.remove(&e.addr) {
                        allocated = allocated.saturating_sub(s);
                        if let Some(c) = c {
                            by_category[c] = by_category[c].saturating_sub(s);
                        }
                    }
                }
                TorchAction::SegmentAlloc | TorchAction::SegmentMap => reserved += e.size as i128,
                TorchAction::SegmentFree | TorchAction::SegmentUnmap => reserved = (reserved - e.size as i128).max(0),
                TorchAction::Oom => {
                    // The request that failed is retried here as a probe (allocated and released
                    // at once): under other settings it may fit, which is the what-if's answer.
                    recorded_ooms += 1;
                    events.push(TraceEvent::Alloc { id: next_id, size: e.size, stream: stream_of(e.stream) });
                    events.push(TraceEvent::Free { id: next_id });
                    next_id += 1;
                }
                TorchAction::FreeRequested | TorchAction::Snapshot => {}
                TorchAction::Other(name) => *ignored_actions.entry(name.clone()).or_default() += 1,
            }
            recorded.push(RecordedPoint {
                index: i,
                time_us: e.time_us,
                allocated,
                reserved: reserved as u64,
                by_category: by_category.clone(),
            });
        }
        DeviceReplayTrace {
            device,
            trace: Trace { device: None, events },
            allocated_before_trace,
            recorded,
            categories,
            recorded_ooms,
            ignored_actions,
        }
    }
}

fn invalid(path: &str, reason: impl Into<String>) -> IoError {
    IoError::InvalidSnapshot { path: path.to_string(), reason: reason.into() }
}

fn as_list<'v>(v: &'v Value, path: &str) -> Result<&'v [Value]> {
    match v {
        Value::List(items) | Value::Tuple(items) => Ok(items),
        other => Err(invalid(path, format!("expected a list, found {}", other.kind()))),
    }
}

fn field<'v>(v: &'v Value, key: &str, path: &str) -> Result<&'v Value> {
    if !matches!(v, Value::Dict(_)) {
        return Err(invalid(path, format!("expected a dict, found {}", v.kind())));
    }
    v.get(key).ok_or_else(|| invalid(path, format!("missing key \"{key}\"")))
}

fn int_of(v: &Value, key: &str, path: &str) -> Result<i64> {
    match field(v, key, path)? {
        Value::Int(i) => Ok(*i),
        Value::Bool(b) => Ok(*b as i64),
        other => Err(invalid(&format!("{path}/{key}"), format!("expected an int, found {}", other.kind()))),
    }
}

fn uint_of(v: &Value, key: &str, path: &str) -> Result<u64> {
    let i = int_of(v, key, path)?;
    u64::try_from(i).map_err(|_| invalid(&format!("{path}/{key}"), format!("negative value {i}")))
}

fn opt_int(v: &Value, key: &str) -> Option<i64> {
    match v.get(key) {
        Some(Value::Int(i)) => Some(*i),
        _ => None,
    }
}

fn opt_str(v: &Value, key: &str) -> Option<String> {
    match v.get(key) {
        Some(Value::Str(s)) => Some(s.clone()),
        _ => None,
    }
}

fn parse_segment(s: &Value, path: &str) -> Result<(TorchSegment, SnapshotFormat)> {
    let device = usize::try_from(int_of(s, "device", path)?).map_err(|_| invalid(path, "negative device index"))?;
    let address = uint_of(s, "address", path)?;
    let total_size = uint_of(s, "total_size", path)?;
    let mut format = SnapshotFormat::Current;
    let mut blocks = Vec::new();
    let mut offset = address;
    for (j, b) in as_list(field(s, "blocks", path)?, &format!("{path}/blocks"))?.iter().enumerate() {
        let bpath = format!("{path}/blocks/{j}");
        let size = uint_of(b, "size", &bpath)?;
        let state = match field(b, "state", &bpath)? {
            Value::Str(st) => st.clone(),
            other => return Err(invalid(&bpath, format!("state: expected a str, found {}", other.kind()))),
        };
        // 2.0 blocks describe their allocations in `history` ({addr, real_size, frames}).
        let requested_size = match (opt_int(b, "requested_size"), b.get("history")) {
            (Some(r), _) => u64::try_from(r).unwrap_or(0),
            (None, Some(h)) => {
                format = SnapshotFormat::BlockHistory;
                as_list(h, &format!("{bpath}/history"))?.first().and_then(|h0| opt_int(h0, "real_size")).unwrap_or(0)
                    as u64
            }
            (None, None) => size,
        };
        let block_address = opt_int(b, "address").map(|a| a as u64).unwrap_or(offset);
        offset = offset.saturating_add(size);
        blocks.push(TorchBlock { address: block_address, size, requested_size, state });
    }
    let seg = TorchSegment {
        device,
        address,
        total_size,
        stream: opt_int(s, "stream").unwrap_or(0),
        segment_type: opt_str(s, "segment_type").unwrap_or_else(|| "large".into()),
        is_expandable: matches!(s.get("is_expandable"), Some(Value::Bool(true))),
        blocks,
    };
    Ok((seg, format))
}

fn parse_entry(e: &Value, path: &str) -> Result<TorchTraceEntry> {
    let action = match field(e, "action", path)? {
        Value::Str(a) => TorchAction::parse(a),
        other => return Err(invalid(&format!("{path}/action"), format!("expected a str, found {}", other.kind()))),
    };
    let (addr, size) = match action {
        TorchAction::Oom => (opt_int(e, "device_free").unwrap_or(0).max(0) as u64, uint_of(e, "size", path)?),
        TorchAction::Other(_) | TorchAction::Snapshot => {
            (opt_int(e, "addr").unwrap_or(0).max(0) as u64, opt_int(e, "size").unwrap_or(0).max(0) as u64)
        }
        _ => (uint_of(e, "addr", path)?, uint_of(e, "size", path)?),
    };
    Ok(TorchTraceEntry {
        action,
        addr,
        size,
        stream: opt_int(e, "stream").unwrap_or(0),
        time_us: opt_int(e, "time_us"),
        category: opt_str(e, "category"),
    })
}

fn s(v: &str) -> Value {
    Value::Str(v.to_string())
}

fn int(v: u64) -> Value {
    // Device addresses and sizes stay far below 2^63; saturate rather than wrap if one did not.
    Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
}

fn dict(items: Vec<(&str, Value)>) -> Value {
    Value::Dict(items.into_iter().map(|(k, v)| (s(k), v)).collect())
}

fn frames(fs: &[Frame]) -> Value {
    Value::List(
        fs.iter()
            .map(|f| {
                dict(vec![
                    ("filename", s(&f.filename)),
                    ("line", Value::Int(f.line as i64)),
                    ("name", Value::Str(format!("column {}", f.column))),
                ])
            })
            .collect(),
    )
}

fn block_state(st: BlockState) -> &'static str {
    match st {
        BlockState::ActiveAllocated => "active_allocated",
        BlockState::ActivePendingFree => "active_pending_free",
        BlockState::Inactive => "inactive",
    }
}

fn trace_entries(entries: &[TraceEntry]) -> Vec<Value> {
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        let entry = |action: &str, addr_key: &str| {
            dict(vec![
                ("action", s(action)),
                (addr_key, int(e.addr)),
                ("size", int(e.size)),
                ("stream", Value::Int(e.stream as i64)),
                ("time_us", int(e.time_us)),
                ("frames", frames(&e.frames)),
            ])
        };
        match e.action {
            TraceAction::Alloc => out.push(entry("alloc", "addr")),
            // ferrite frees a block at once (its streams are synchronous): both of PyTorch's steps.
            TraceAction::Free => {
                out.push(entry("free_requested", "addr"));
                out.push(entry("free_completed", "addr"));
            }
            TraceAction::SegmentAlloc => out.push(entry("segment_alloc", "addr")),
            TraceAction::SegmentFree => out.push(entry("segment_free", "addr")),
            TraceAction::SegmentMap => out.push(entry("segment_map", "addr")),
            TraceAction::SegmentUnmap => out.push(entry("segment_unmap", "addr")),
            TraceAction::Oom => out.push(entry("oom", "device_free")),
        }
    }
    out
}

/// ferrite's snapshot as the value `torch.cuda.memory._snapshot()` returns (2.1+ layout).
pub fn memory_snapshot_to_value(snap: &MemorySnapshot) -> Value {
    let segments = snap
        .segments
        .iter()
        .map(|seg| {
            let blocks = seg
                .blocks
                .iter()
                .map(|b| {
                    dict(vec![
                        ("address", int(b.address)),
                        ("size", int(b.size)),
                        ("requested_size", int(b.requested_size)),
                        ("state", s(block_state(b.state))),
                        ("frames", frames(&b.frames)),
                    ])
                })
                .collect();
            dict(vec![
                ("device", Value::Int(seg.device as i64)),
                ("address", int(seg.address)),
                ("total_size", int(seg.total_size)),
                ("allocated_size", int(seg.allocated_size)),
                ("active_size", int(seg.active_size)),
                ("requested_size", int(seg.requested_size)),
                ("stream", Value::Int(seg.stream as i64)),
                ("segment_type", s(&seg.segment_type)),
                ("segment_pool_id", Value::Tuple(vec![int(seg.segment_pool_id.0), int(seg.segment_pool_id.1)])),
                ("is_expandable", Value::Bool(seg.is_expandable)),
                ("frames", frames(&seg.frames)),
                ("blocks", Value::List(blocks)),
            ])
        })
        .collect();
    // ferrite's allocator is per device and lists its history first; PyTorch indexes
    // `device_traces` by device, so a lone history moves to its segments' device index.
    let mut traces: Vec<Value> = snap.device_traces.iter().map(|t| Value::List(trace_entries(t))).collect();
    if let ([_], Some(d)) = (snap.device_traces.as_slice(), snap.segments.first().map(|s| s.device))
        && d > 0
        && snap.segments.iter().all(|s| s.device == d)
    {
        let history = traces.remove(0);
        traces = vec![Value::List(Vec::new()); d];
        traces.push(history);
    }
    let st = &snap.allocator_settings;
    let settings = dict(vec![
        ("PYTORCH_CUDA_ALLOC_CONF", s(&st.alloc_conf)),
        ("max_split_size", Value::Int(st.max_split_size)),
        ("garbage_collection_threshold", Value::Float(st.garbage_collection_threshold)),
        ("expandable_segments", Value::Bool(st.expandable_segments)),
        (
            "roundup_power2_divisions",
            Value::Dict(st.roundup_power2_divisions.iter().map(|(k, v)| (s(k), Value::Int(*v as i64))).collect()),
        ),
    ]);
    dict(vec![
        ("segments", Value::List(segments)),
        ("device_traces", Value::List(traces)),
        ("allocator_settings", settings),
    ])
}

/// Writes ferrite's snapshot as a `_dump_snapshot()` pickle, atomically.
pub fn write_torch_snapshot(path: impl AsRef<Path>, snap: &MemorySnapshot) -> Result<()> {
    let bytes = crate::to_pickle(&memory_snapshot_to_value(snap))?;
    crate::write_atomically(path, |f| std::io::Write::write_all(f, &bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_memory::{AllocatorConfig, CachingAllocator, Device};

    #[test]
    fn ferrite_snapshot_round_trips_through_the_pickle() {
        let a = CachingAllocator::unbacked(Device::Meta, AllocatorConfig::default());
        a.record_memory_history(Some(1000));
        let x = a.allocate(3 << 20).unwrap();
        let y = a.allocate(1000).unwrap();
        drop(x);
        let snap = a.snapshot();
        let bytes = crate::to_pickle(&memory_snapshot_to_value(&snap)).unwrap();
        let back = TorchSnapshot::from_bytes(&bytes).unwrap();
        assert_eq!(back.format, SnapshotFormat::Current);
        assert_eq!(back.segments.len(), snap.segments.len());
        let t = back.device_replay_trace(0);
        // alloc, alloc, free → the replayable trace has 2 allocs and 1 free, nothing before it.
        assert_eq!(t.allocated_before_trace, 0);
        assert_eq!(t.trace.events.len(), 3, "{:?}", t.trace.events);
        assert_eq!(t.recorded_peak_allocated(), (3 << 20) + 1000);
        // Both segments were reserved inside the trace and are still there at the end.
        assert_eq!(t.recorded_peak_reserved(), snap.reserved_bytes());
        assert_eq!(t.recorded.last().map(|p| p.allocated), Some(1000));
        drop(y);
    }

    #[test]
    fn history_of_a_second_device_is_listed_under_its_index() {
        let a = CachingAllocator::unbacked(Device::parse("sim:1GiB:2").unwrap(), AllocatorConfig::default());
        a.record_memory_history(Some(100));
        let _x = a.allocate(4096).unwrap();
        let snap = a.snapshot();
        assert!(snap.segments.iter().all(|s| s.device == 2), "{:?}", snap.segments);
        let back = TorchSnapshot::from_value(&memory_snapshot_to_value(&snap)).unwrap();
        assert_eq!(back.traced_devices(), vec![2]);
        assert_eq!(back.device_replay_trace(2).recorded_peak_allocated(), 4096);
    }

    #[test]
    fn not_a_snapshot_is_a_typed_error() {
        let e = TorchSnapshot::from_bytes(b"hello").unwrap_err();
        assert!(matches!(e, IoError::UnsupportedSnapshot { .. }), "{e}");
        let list = crate::to_pickle(&Value::List(vec![])).unwrap();
        let e = TorchSnapshot::from_bytes(&list).unwrap_err().to_string();
        assert!(e.contains("segments only"), "{e}");
        let other = crate::to_pickle(&dict(vec![("state_dict", Value::None)])).unwrap();
        let e = TorchSnapshot::from_bytes(&other).unwrap_err().to_string();
        assert!(e.contains("no \"segments\" key") && e.contains("state_dict"), "{e}");
        let bad = crate::to_pickle(&dict(vec![("segments", Value::List(vec![Value::Int(3)]))])).unwrap();
        let e = TorchSnapshot::from_bytes(&bad).unwrap_err();
        assert!(matches!(&e, IoError::InvalidSnapshot { path, .. } if path == "segments/0"), "{e}");
        let empty = crate::to_pickle(&dict(vec![("segments", Value::List(vec![]))])).unwrap();
        let e = TorchSnapshot::from_bytes(&empty).unwrap().replay_traces().unwrap_err().to_string();
        assert!(e.contains("history was not recorded"), "{e}");
    }
}
