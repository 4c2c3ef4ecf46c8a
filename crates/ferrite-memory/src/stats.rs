//! Allocator statistics with PyTorch's names and meaning (`torch.cuda.memory_stats`).
//!
//! Keeping PyTorch's vocabulary (`allocation`, `reserved_bytes.large_pool.peak`, …) means notes,
//! dashboards and intuition carry over unchanged from PyTorch.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One counter: current value, high-water mark, and running totals of increases and decreases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

impl Stat {
    #[inline]
    pub(crate) fn increase(&mut self, n: u64) {
        self.current += n as i64;
        if self.current > self.peak {
            self.peak = self.current;
        }
        self.allocated += n as i64;
    }
    #[inline]
    pub(crate) fn decrease(&mut self, n: u64) {
        self.current -= n as i64;
        debug_assert!(self.current >= 0, "negative allocator statistic (logic error)");
        self.freed += n as i64;
    }
    fn reset_peak(&mut self) {
        self.peak = self.current;
    }
    fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// Which pools a figure covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatType {
    All,
    SmallPool,
    LargePool,
}

impl StatType {
    pub const ALL: [StatType; 3] = [StatType::All, StatType::SmallPool, StatType::LargePool];
    /// PyTorch's key: `all`, `small_pool`, `large_pool`.
    pub fn key(self) -> &'static str {
        match self {
            StatType::All => "all",
            StatType::SmallPool => "small_pool",
            StatType::LargePool => "large_pool",
        }
    }
}

/// A [`Stat`] for all pools, the small pool and the large pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatArray {
    pub all: Stat,
    pub small_pool: Stat,
    pub large_pool: Stat,
}

impl StatArray {
    pub fn get(&self, t: StatType) -> &Stat {
        match t {
            StatType::All => &self.all,
            StatType::SmallPool => &self.small_pool,
            StatType::LargePool => &self.large_pool,
        }
    }
    #[inline]
    pub(crate) fn increase(&mut self, small: bool, n: u64) {
        self.all.increase(n);
        if small { self.small_pool.increase(n) } else { self.large_pool.increase(n) }
    }
    #[inline]
    pub(crate) fn decrease(&mut self, small: bool, n: u64) {
        self.all.decrease(n);
        if small { self.small_pool.decrease(n) } else { self.large_pool.decrease(n) }
    }
    fn for_each(&mut self, f: impl Fn(&mut Stat)) {
        f(&mut self.all);
        f(&mut self.small_pool);
        f(&mut self.large_pool);
    }
}

/// Everything `torch.cuda.memory_stats()` reports, for one device allocator.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryStats {
    /// Live allocations (blocks handed out).
    pub allocation: StatArray,
    /// Segments reserved from the device.
    pub segment: StatArray,
    /// Active blocks (allocated, or freed with pending stream uses).
    pub active: StatArray,
    /// Free blocks inside partially used segments ("non-releasable").
    pub inactive_split: StatArray,
    /// Bytes of live blocks (rounded sizes).
    pub allocated_bytes: StatArray,
    /// Bytes of reserved segments.
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks.
    pub active_bytes: StatArray,
    /// Bytes of free blocks inside partially used segments.
    pub inactive_split_bytes: StatArray,
    /// Bytes originally requested by live blocks (before rounding).
    pub requested_bytes: StatArray,
    /// Segment reservations retried after releasing every cached block.
    pub num_alloc_retries: i64,
    /// Allocations that ended in an out-of-memory error.
    pub num_ooms: i64,
    /// Full cache releases (PyTorch: device-wide synchronisations).
    pub num_sync_all_streams: i64,
    /// Segments reserved from the backend.
    pub num_device_alloc: i64,
    /// Segments returned to the backend.
    pub num_device_free: i64,
    /// `max_split_size` in bytes, -1 when unlimited (as PyTorch reports `SIZE_MAX`).
    pub max_split_size: i64,
    /// Live allocations of at least `max_split_size`.
    pub oversize_allocations: Stat,
    /// Reserved segments of at least `max_split_size`.
    pub oversize_segments: Stat,
}

impl MemoryStats {
    pub(crate) fn new(max_split_size: u64) -> MemoryStats {
        let mut s = MemoryStats::default();
        s.set_max_split_size(max_split_size);
        s
    }

    pub(crate) fn set_max_split_size(&mut self, max_split_size: u64) {
        self.max_split_size = if max_split_size == u64::MAX { -1 } else { max_split_size as i64 };
    }

    fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("active", &self.active),
            ("active_bytes", &self.active_bytes),
            ("allocated_bytes", &self.allocated_bytes),
            ("allocation", &self.allocation),
            ("inactive_split", &self.inactive_split),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("segment", &self.segment),
        ]
    }

    /// The flattened, sorted view of `torch.cuda.memory_stats()`:
    /// `allocated_bytes.all.current`, `num_ooms`, `oversize_segments.peak`, …
    pub fn flatten(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        for (name, arr) in self.arrays() {
            for t in StatType::ALL {
                let s = arr.get(t);
                for (field, v) in
                    [("current", s.current), ("peak", s.peak), ("allocated", s.allocated), ("freed", s.freed)]
                {
                    m.insert(format!("{name}.{}.{field}", t.key()), v);
                }
            }
        }
        for (name, s) in
            [("oversize_allocations", &self.oversize_allocations), ("oversize_segments", &self.oversize_segments)]
        {
            for (field, v) in [("current", s.current), ("peak", s.peak), ("allocated", s.allocated), ("freed", s.freed)]
            {
                m.insert(format!("{name}.{field}"), v);
            }
        }
        m.insert("num_alloc_retries".into(), self.num_alloc_retries);
        m.insert("num_ooms".into(), self.num_ooms);
        m.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
        m.insert("num_device_alloc".into(), self.num_device_alloc);
        m.insert("num_device_free".into(), self.num_device_free);
        m.insert("max_split_size".into(), self.max_split_size);
        m
    }

    /// Every peak := current (`torch.cuda.reset_peak_memory_stats`).
    pub(crate) fn reset_peaks(&mut self) {
        for arr in self.arrays_mut() {
            arr.for_each(Stat::reset_peak);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// Running totals and counters := 0 (`torch.cuda.reset_accumulated_memory_stats`).
    pub(crate) fn reset_accumulated(&mut self) {
        for arr in self.arrays_mut() {
            arr.for_each(Stat::reset_accumulated);
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_tracks_peak_and_totals() {
        let mut s = Stat::default();
        s.increase(10);
        s.increase(5);
        s.decrease(12);
        assert_eq!(s, Stat { current: 3, peak: 15, allocated: 15, freed: 12 });
        s.reset_peak();
        assert_eq!(s.peak, 3);
    }

    #[test]
    fn flattened_keys_use_pytorch_names() {
        let m = MemoryStats::new(u64::MAX).flatten();
        for k in [
            "allocated_bytes.all.current",
            "allocated_bytes.large_pool.peak",
            "allocation.small_pool.allocated",
            "reserved_bytes.all.freed",
            "inactive_split_bytes.all.current",
            "requested_bytes.all.peak",
            "segment.large_pool.current",
            "oversize_allocations.current",
            "oversize_segments.peak",
            "num_alloc_retries",
            "num_ooms",
            "num_sync_all_streams",
            "num_device_alloc",
            "num_device_free",
            "max_split_size",
        ] {
            assert!(m.contains_key(k), "missing {k}");
        }
        assert_eq!(m.len(), 9 * 3 * 4 + 2 * 4 + 6);
        assert_eq!(m["max_split_size"], -1);
    }
}
