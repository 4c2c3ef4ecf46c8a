//! Replaying an allocation trace through an allocator.
//!
//! A trace is the sequence of allocations and frees of a workload. Replaying it under different
//! settings (`max_split_size_mb`, `roundup_power2_divisions`, another GPU) shows, in milliseconds
//! and without the hardware, how peak reserved memory and OOMs change. The replay uses an
//! unbacked allocator: the same decisions as the real one, no memory touched.
//!
//! Format: `{"device": "sim:a100-40gb", "events": [{"action": "alloc", "id": 1, "size": 614400},
//! {"action": "free", "id": 1}, {"action": "empty_cache"}, {"action": "reset_peak_memory_stats"}]}`
//! (`device` optional; `alloc` may carry a `stream`). A failed allocation is recorded as an OOM
//! and the replay goes on; a later free of its id is ignored.
use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::{AllocatorConfig, Block, CachingAllocator, Device, MemoryError, MemoryStats, OomDiagnosis};

/// One event of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum TraceEvent {
    Alloc {
        id: u64,
        size: u64,
        #[serde(default)]
        stream: u32,
    },
    Free {
        id: u64,
    },
    EmptyCache,
    ResetPeakMemoryStats,
}

/// A recorded workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trace {
    #[serde(default)]
    pub device: Option<String>,
    pub events: Vec<TraceEvent>,
}

impl Trace {
    /// Parse a trace from JSON.
    pub fn from_json(json: &str) -> Result<Trace, MemoryError> {
        serde_json::from_str(json).map_err(|e| MemoryError::InvalidTrace { reason: e.to_string() })
    }
}

/// One allocation of the trace that failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayOom {
    /// Index of the event in `events`.
    pub event_index: usize,
    pub id: u64,
    /// Requested bytes.
    pub size: u64,
    pub diagnosis: OomDiagnosis,
    /// The full error text.
    #[serde(skip)]
    pub message: String,
}

/// Result of a replay.
#[derive(Debug, Clone)]
pub struct ReplayReport {
    pub device: Device,
    pub config: AllocatorConfig,
    pub events: usize,
    /// Statistics at the end of the trace (peaks cover the whole trace unless it reset them).
    pub stats: MemoryStats,
    pub ooms: Vec<ReplayOom>,
    /// The `memory_summary` table at the end.
    pub summary: String,
}

impl ReplayReport {
    /// One JSON object: PyTorch's flattened `memory_stats` keys plus `ooms`.
    pub fn to_json(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for (k, v) in self.stats.flatten() {
            m.insert(k, serde_json::Value::from(v));
        }
        m.insert("ooms".into(), serde_json::to_value(&self.ooms).unwrap_or_default());
        serde_json::Value::Object(m)
    }

    /// Flattened final statistics.
    pub fn flat_stats(&self) -> BTreeMap<String, i64> {
        self.stats.flatten()
    }
}

/// Replay `trace` on `device` with `config`.
pub fn replay(trace: &Trace, device: Device, config: AllocatorConfig) -> Result<ReplayReport, MemoryError> {
    replay_observed(trace, device, config, |_, _| {})
}

/// Allocated and reserved bytes right after one event of a replay: the series a memory timeline
/// plots and the what-if comparison reads its fragmentation from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayPoint {
    pub event_index: usize,
    pub allocated: u64,
    pub reserved: u64,
}

/// [`replay`], also returning allocated/reserved after every event.
pub fn replay_timeline(
    trace: &Trace,
    device: Device,
    config: AllocatorConfig,
) -> Result<(ReplayReport, Vec<ReplayPoint>), MemoryError> {
    let mut points = Vec::with_capacity(trace.events.len());
    let report = replay_observed(trace, device, config, |i, a| {
        points.push(ReplayPoint { event_index: i, allocated: a.memory_allocated(), reserved: a.memory_reserved() })
    })?;
    Ok((report, points))
}

/// What one allocator configuration does with a trace: the row of a what-if comparison
/// ("would `expandable_segments` or `max_split_size_mb` have saved my run?").
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WhatIf {
    /// The configuration in `PYTORCH_CUDA_ALLOC_CONF` syntax (`""` for PyTorch's defaults).
    pub alloc_conf: String,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    /// The most bytes allocated while reserved memory stood at its peak.
    pub allocated_at_peak_reserved_bytes: u64,
    /// `(peak reserved - allocated_at_peak_reserved) / peak reserved`: the share of the reserved
    /// peak that was never handed out at once (rounding, split remainders, stranded free blocks).
    pub fragmentation_at_peak: f64,
    /// Allocations that failed on the replay device (0 on `meta`, which has no capacity).
    pub ooms: usize,
    /// Index of the first failed event, if any.
    pub first_oom_event: Option<usize>,
    /// Allocations that succeeded only after the allocator freed its cache.
    pub alloc_retries: i64,
}

/// Replays `trace` once per configuration and compares peaks and fragmentation.
pub fn what_if(trace: &Trace, device: &Device, configs: &[AllocatorConfig]) -> Result<Vec<WhatIf>, MemoryError> {
    configs
        .iter()
        .map(|config| {
            let (report, points) = replay_timeline(trace, device.clone(), config.clone())?;
            // Reserved memory reaches its peak and is usually held there for a while; the fairest
            // moment to judge it is when the most of it was handed out.
            let peak_reserved = points.iter().map(|p| p.reserved).max().unwrap_or(0);
            let alloc_at_peak =
                points.iter().filter(|p| p.reserved == peak_reserved).map(|p| p.allocated).max().unwrap_or(0);
            let fragmentation_at_peak = if peak_reserved == 0 {
                0.0
            } else {
                (peak_reserved - alloc_at_peak.min(peak_reserved)) as f64 / peak_reserved as f64
            };
            Ok(WhatIf {
                alloc_conf: config.to_string(),
                peak_reserved_bytes: peak_reserved,
                peak_allocated_bytes: points.iter().map(|p| p.allocated).max().unwrap_or(0),
                allocated_at_peak_reserved_bytes: alloc_at_peak,
                fragmentation_at_peak,
                ooms: report.ooms.len(),
                first_oom_event: report.ooms.first().map(|o| o.event_index),
                alloc_retries: report.stats.num_alloc_retries,
            })
        })
        .collect()
}

/// [`replay`] with allocation history recorded, returning the allocator's snapshot (segments,
/// blocks, history) taken after the last event, before the trace's live blocks are released:
/// what `ferrite memory snapshot` writes as a PyTorch snapshot pickle.
pub fn replay_with_snapshot(
    trace: &Trace,
    device: Device,
    config: AllocatorConfig,
) -> Result<(ReplayReport, crate::MemorySnapshot), MemoryError> {
    let mut snap = None;
    let n = trace.events.len();
    let report = replay_observed_with(trace, device, config, Some(n.saturating_mul(2).max(16)), |i, a| {
        if i + 1 == n {
            snap = Some(a.snapshot());
        }
    })?;
    let snap = match snap {
        Some(s) => s,
        None => return Err(MemoryError::InvalidTrace { reason: "the trace has no events".into() }),
    };
    Ok((report, snap))
}

/// The replay loop; `observe` sees the allocator after every event.
fn replay_observed(
    trace: &Trace,
    device: Device,
    config: AllocatorConfig,
    observe: impl FnMut(usize, &CachingAllocator),
) -> Result<ReplayReport, MemoryError> {
    replay_observed_with(trace, device, config, None, observe)
}

/// The replay loop, recording `history` entries when asked.
fn replay_observed_with(
    trace: &Trace,
    device: Device,
    config: AllocatorConfig,
    history: Option<usize>,
    mut observe: impl FnMut(usize, &CachingAllocator),
) -> Result<ReplayReport, MemoryError> {
    if let Device::Gpu { index } = &device {
        // A replay on a real GPU uses its capacity (when known); a GPU that is not there (or a
        // build without GPU support) is an error, not an address-only replay.
        #[cfg(feature = "gpu")]
        crate::gpu::context(*index)?;
        #[cfg(not(feature = "gpu"))]
        return Err(crate::gpu::not_compiled(&format!("gpu:{index}")));
    }
    if let Device::Cuda { index } = &device {
        // The same for a CUDA device: replayed at its capacity, or the error saying why not.
        crate::cuda::cuda_ordinal(*index)?;
    }
    let alloc = CachingAllocator::unbacked(device.clone(), config.clone());
    if history.is_some() {
        alloc.record_memory_history(history);
    }
    let mut live: HashMap<u64, Block> = HashMap::new();
    let mut failed: HashSet<u64> = HashSet::new();
    let mut ooms = Vec::new();
    for (i, ev) in trace.events.iter().enumerate() {
        match *ev {
            TraceEvent::Alloc { id, size, stream } => {
                if live.contains_key(&id) {
                    return Err(MemoryError::InvalidTrace {
                        reason: format!("event {i}: id {id} is allocated again while still live"),
                    });
                }
                let size_usize = usize::try_from(size).map_err(|_| MemoryError::InvalidTrace {
                    reason: format!("event {i}: size {size} does not fit this platform"),
                })?;
                match alloc.allocate_on_stream(size_usize, stream) {
                    Ok(b) => {
                        failed.remove(&id);
                        live.insert(id, b);
                    }
                    Err(MemoryError::OutOfMemory { report } | MemoryError::DriverRefused { report }) => {
                        failed.insert(id);
                        ooms.push(ReplayOom {
                            event_index: i,
                            id,
                            size,
                            diagnosis: report.diagnosis,
                            message: report.to_string(),
                        });
                    }
                    Err(e) => return Err(e),
                }
            }
            TraceEvent::Free { id } => {
                if live.remove(&id).is_none() && !failed.remove(&id) {
                    return Err(MemoryError::InvalidTrace {
                        reason: format!("event {i}: free of id {id}, which is not allocated"),
                    });
                }
            }
            TraceEvent::EmptyCache => alloc.empty_cache(),
            TraceEvent::ResetPeakMemoryStats => alloc.reset_peak_memory_stats(),
        }
        observe(i, &alloc);
    }
    let stats = alloc.memory_stats();
    let summary = alloc.memory_summary(false);
    Ok(ReplayReport { device, config, events: trace.events.len(), stats, ooms, summary })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_and_keeps_going_after_an_oom() {
        let t = Trace::from_json(
            r#"{"device": "sim:64MiB", "events": [
                {"action": "alloc", "id": 1, "size": 614400},
                {"action": "alloc", "id": 2, "size": 104857600},
                {"action": "free", "id": 2},
                {"action": "free", "id": 1},
                {"action": "empty_cache"}
            ]}"#,
        )
        .unwrap();
        let dev = Device::parse(t.device.as_deref().unwrap()).unwrap();
        let r = replay(&t, dev, AllocatorConfig::default()).unwrap();
        assert_eq!(r.ooms.len(), 1);
        assert_eq!(r.ooms[0].event_index, 1);
        assert_eq!(r.ooms[0].diagnosis, OomDiagnosis::Exhausted);
        let j = r.to_json();
        assert_eq!(j["reserved_bytes.all.peak"], 2 << 20);
        assert_eq!(j["reserved_bytes.all.current"], 0);
        assert_eq!(j["num_ooms"], 1);
        assert_eq!(j["ooms"][0]["diagnosis"], "exhausted");
    }

    #[test]
    fn what_if_compares_configurations() {
        // A 500 MiB block freed and a 300 MiB request: by default the 300 MiB is split from the
        // cached 500 MiB block; with max_split_size_mb:200 it is not split, so a new segment is
        // reserved and the peak grows.
        let t = Trace::from_json(
            r#"{"events": [
                {"action": "alloc", "id": 1, "size": 524288000},
                {"action": "free", "id": 1},
                {"action": "alloc", "id": 2, "size": 314572800},
                {"action": "alloc", "id": 3, "size": 1048576}
            ]}"#,
        )
        .unwrap();
        let configs = [AllocatorConfig::default(), AllocatorConfig::parse("max_split_size_mb:200").unwrap()];
        let rows = what_if(&t, &Device::Meta, &configs).unwrap();
        assert_eq!(rows[0].alloc_conf, "");
        assert_eq!(rows[0].peak_reserved_bytes, 524288000 + (2 << 20));
        assert!(rows[1].peak_reserved_bytes > rows[0].peak_reserved_bytes, "{rows:?}");
        assert!(rows[0].fragmentation_at_peak > 0.0 && rows[0].fragmentation_at_peak < 1.0);
        assert_eq!(rows[0].ooms, 0);
        let (_, snap) = replay_with_snapshot(&t, Device::Meta, AllocatorConfig::default()).unwrap();
        assert_eq!(snap.reserved_bytes(), 524288000 + (2 << 20));
        assert!(snap.device_traces.iter().flatten().count() >= 6, "{:?}", snap.device_traces);
        let (_, points) = replay_timeline(&t, Device::Meta, AllocatorConfig::default()).unwrap();
        assert_eq!(points.len(), 4);
        assert_eq!(points[1].allocated, 0);
        assert_eq!(points[1].reserved, 524288000);
    }

    #[test]
    fn bad_traces_are_errors() {
        assert!(Trace::from_json(r#"{"events": [{"action": "alloc", "id": 1}]}"#).is_err());
        assert!(Trace::from_json(r#"{"events": [{"action": "explode"}]}"#).is_err());
        let t = Trace::from_json(r#"{"events": [{"action": "free", "id": 9}]}"#).unwrap();
        assert!(replay(&t, Device::Meta, AllocatorConfig::default()).is_err());
    }
}
