//! Memory snapshots: every segment and the blocks inside it, in PyTorch's `_snapshot()` schema.
//!
//! A snapshot answers "where did my memory go?" after the fact: which segments exist, which blocks
//! in them are live and who allocated them, and how much is free but stranded between live
//! blocks. The field names follow `torch.cuda.memory._snapshot()` so existing tooling ports 1:1.
use serde::{Deserialize, Serialize};

use crate::history::{Frame, TraceEntry};

/// State of one block inside a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed out to a caller.
    ActiveAllocated,
    /// Freed by the caller but still in use by another stream (kept for schema compatibility).
    ActivePendingFree,
    /// Free, cached in the allocator.
    Inactive,
}

/// One block of a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockSnapshot {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: BlockState,
    /// Where the block was allocated (live blocks only).
    pub frames: Vec<Frame>,
}

/// One segment reserved from the device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentSnapshot {
    pub device: usize,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: u32,
    /// `"small"` or `"large"`.
    pub segment_type: String,
    pub segment_pool_id: (u64, u64),
    pub is_expandable: bool,
    /// Where the segment was reserved.
    pub frames: Vec<Frame>,
    pub blocks: Vec<BlockSnapshot>,
}

/// Settings in force when the snapshot was taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocatorSettings {
    #[serde(rename = "PYTORCH_CUDA_ALLOC_CONF")]
    pub alloc_conf: String,
    pub max_split_size: i64,
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
    pub roundup_power2_divisions: std::collections::BTreeMap<String, u32>,
}

/// A whole-allocator snapshot: segments sorted by address, the recorded history (one list per
/// device, as in PyTorch) and the settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemorySnapshot {
    pub segments: Vec<SegmentSnapshot>,
    pub device_traces: Vec<Vec<TraceEntry>>,
    pub allocator_settings: AllocatorSettings,
}

impl MemorySnapshot {
    /// Pretty-printed JSON.
    pub fn to_json(&self) -> String {
        // Serialising plain data with string keys cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Total bytes of reserved segments.
    pub fn reserved_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.total_size).sum()
    }
}
