//! Allocation history: a bounded ring of allocator events, each with the Rust caller location.
//!
//! This is ferrite's `torch.cuda.memory._record_memory_history`: turn it on, run a step, dump the
//! events as JSON and see which line of code reserved which segment. The ring is bounded
//! (`max_entries`) so recording can stay on in long runs; recording costs nothing when off (the
//! allocator only checks one `Option`).
use std::collections::VecDeque;
use std::panic::Location;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceAction {
    /// A block was handed out (`size` = requested bytes).
    Alloc,
    /// A block was returned (`size` = requested bytes).
    Free,
    /// A segment was reserved from the device (`size` = segment bytes).
    SegmentAlloc,
    /// A segment was returned to the device.
    SegmentFree,
    /// Pages were mapped into an expandable segment (`size` = bytes mapped).
    SegmentMap,
    /// Pages of an expandable segment were returned to the device.
    SegmentUnmap,
    /// An allocation failed (`size` = rounded request, `addr` = device free bytes, as PyTorch).
    Oom,
}

/// Where in Rust code an allocation was requested.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    pub filename: String,
    pub line: u32,
    /// Column (PyTorch frames carry a function `name`; Rust's `Location` has the column instead).
    pub column: u32,
}

impl Frame {
    pub(crate) fn from_location(l: &'static Location<'static>) -> Frame {
        Frame { filename: l.file().to_string(), line: l.line(), column: l.column() }
    }
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEntry {
    pub action: TraceAction,
    /// Device address of the block or segment (device free bytes for `oom`).
    pub addr: u64,
    pub size: u64,
    pub stream: u32,
    /// Microseconds since the Unix epoch.
    pub time_us: u64,
    /// The caller of `allocate` (empty when not known, e.g. for frees run by `Drop`).
    pub frames: Vec<Frame>,
}

/// One stored event: (action, addr, size, stream, time_us, caller). Frames are built only on export.
type RawEntry = (TraceAction, u64, u64, u32, u64, Option<&'static Location<'static>>);

/// Recorded events, oldest first, at most `max_entries` of them.
#[derive(Debug)]
pub(crate) struct HistoryRing {
    entries: VecDeque<RawEntry>,
    max_entries: usize,
}

impl HistoryRing {
    pub fn new(max_entries: usize) -> HistoryRing {
        let max_entries = max_entries.max(1);
        HistoryRing { entries: VecDeque::with_capacity(max_entries.min(1 << 16)), max_entries }
    }

    pub fn record(
        &mut self,
        action: TraceAction,
        addr: u64,
        size: u64,
        stream: u32,
        location: Option<&'static Location<'static>>,
    ) {
        if self.entries.len() == self.max_entries {
            self.entries.pop_front();
        }
        let time_us = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
        self.entries.push_back((action, addr, size, stream, time_us, location));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn entries(&self) -> Vec<TraceEntry> {
        self.entries
            .iter()
            .map(|&(action, addr, size, stream, time_us, loc)| TraceEntry {
                action,
                addr,
                size,
                stream,
                time_us,
                frames: loc.map(Frame::from_location).into_iter().collect(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_newest_entries() {
        let mut r = HistoryRing::new(3);
        for i in 0..5 {
            r.record(TraceAction::Alloc, i, 512, 0, Some(Location::caller()));
        }
        let e = r.entries();
        assert_eq!(e.iter().map(|e| e.addr).collect::<Vec<_>>(), vec![2, 3, 4]);
        assert!(e[0].frames[0].filename.ends_with("history.rs"));
    }
}
