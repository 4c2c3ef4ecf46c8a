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
    if let Device::Gpu { index } = &device {
        // A replay on a real GPU uses its capacity (when known); a GPU that is not there is an
        // error, not an address-only replay.
        crate::gpu::context(*index)?;
    }
    let alloc = CachingAllocator::unbacked(device.clone(), config.clone());
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
    fn bad_traces_are_errors() {
        assert!(Trace::from_json(r#"{"events": [{"action": "alloc", "id": 1}]}"#).is_err());
        assert!(Trace::from_json(r#"{"events": [{"action": "explode"}]}"#).is_err());
        let t = Trace::from_json(r#"{"events": [{"action": "free", "id": 9}]}"#).unwrap();
        assert!(replay(&t, Device::Meta, AllocatorConfig::default()).is_err());
    }
}
