//! A memory tracker for a region of code: what it left allocated, and how high it went.
//!
//! The practitioner's `log_memory("after forward")` pattern, made exact: a [`MemoryScope`]
//! records allocated and reserved bytes when it opens, tracks the peak inside itself without
//! resetting the allocator's own peak statistics (so scopes nest and `max_memory_allocated`
//! keeps its meaning), and reports the delta and the in-scope peak when it closes.
//!
//! ```
//! use ferrite_memory::{allocator, Device, MemoryScope};
//! let dev = Device::parse("sim:1GiB:42").unwrap();
//! let scope = MemoryScope::new("forward", &dev).quiet();
//! let a = allocator(&dev).allocate(5 << 20).unwrap();
//! drop(allocator(&dev).allocate(20 << 20).unwrap());
//! let r = scope.finish();
//! assert_eq!(r.delta_allocated(), 5 << 20);
//! assert_eq!(r.peak_allocated - r.allocated_before, 25 << 20);
//! # drop(a);
//! ```

use std::fmt;
use std::sync::Arc;

use crate::oom::format_size;
use crate::{CachingAllocator, Device, allocator};

/// An open measurement; reports on [`finish`](Self::finish) or, unless [`quiet`](Self::quiet),
/// prints its report to stderr when dropped.
pub struct MemoryScope {
    allocator: Arc<CachingAllocator>,
    label: String,
    allocated_before: u64,
    reserved_before: u64,
    watermark: u64,
    print_on_drop: bool,
    finished: bool,
}

/// What happened inside a scope. All figures are bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScopeReport {
    pub label: String,
    pub device: String,
    pub allocated_before: u64,
    pub allocated_after: u64,
    pub reserved_before: u64,
    pub reserved_after: u64,
    /// Highest allocated bytes while the scope was open (absolute, not relative).
    pub peak_allocated: u64,
    /// Highest reserved bytes while the scope was open.
    pub peak_reserved: u64,
}

impl ScopeReport {
    /// Bytes still allocated at exit that were not at entry (negative if the scope freed memory).
    pub fn delta_allocated(&self) -> i64 {
        self.allocated_after as i64 - self.allocated_before as i64
    }

    /// How far above its entry level the scope pushed allocated memory.
    pub fn peak_above_entry(&self) -> u64 {
        self.peak_allocated.saturating_sub(self.allocated_before)
    }
}

fn signed(v: i64) -> String {
    if v < 0 { format!("-{}", format_size(v.unsigned_abs())) } else { format!("+{}", format_size(v as u64)) }
}

impl fmt::Display for ScopeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[memory] {} on {}: allocated {} -> {} ({}), peak {} ({} above entry), reserved {} -> {}",
            self.label,
            self.device,
            format_size(self.allocated_before),
            format_size(self.allocated_after),
            signed(self.delta_allocated()),
            format_size(self.peak_allocated),
            format_size(self.peak_above_entry()),
            format_size(self.reserved_before),
            format_size(self.reserved_after),
        )
    }
}

impl MemoryScope {
    /// Open a scope on the process-wide allocator of `device`.
    pub fn new(label: impl Into<String>, device: &Device) -> MemoryScope {
        MemoryScope::with_allocator(label, allocator(device))
    }

    /// Open a scope on a specific allocator.
    pub fn with_allocator(label: impl Into<String>, allocator: Arc<CachingAllocator>) -> MemoryScope {
        let watermark = allocator.begin_watermark();
        MemoryScope {
            allocated_before: allocator.memory_allocated(),
            reserved_before: allocator.memory_reserved(),
            allocator,
            label: label.into(),
            watermark,
            print_on_drop: true,
            finished: false,
        }
    }

    /// Do not print the report when dropped.
    pub fn quiet(mut self) -> MemoryScope {
        self.print_on_drop = false;
        self
    }

    /// The figures so far, leaving the scope open.
    pub fn report(&self) -> ScopeReport {
        let (pa, pr) =
            self.allocator.watermark(self.watermark).unwrap_or((self.allocated_before, self.reserved_before));
        self.make(pa, pr)
    }

    fn make(&self, peak_allocated: u64, peak_reserved: u64) -> ScopeReport {
        ScopeReport {
            label: self.label.clone(),
            device: self.allocator.device().to_string(),
            allocated_before: self.allocated_before,
            allocated_after: self.allocator.memory_allocated(),
            reserved_before: self.reserved_before,
            reserved_after: self.allocator.memory_reserved(),
            peak_allocated,
            peak_reserved,
        }
    }

    /// Close the scope and return its report (nothing is printed).
    pub fn finish(mut self) -> ScopeReport {
        self.finished = true;
        let (pa, pr) =
            self.allocator.end_watermark(self.watermark).unwrap_or((self.allocated_before, self.reserved_before));
        self.make(pa, pr)
    }
}

impl Drop for MemoryScope {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let (pa, pr) =
            self.allocator.end_watermark(self.watermark).unwrap_or((self.allocated_before, self.reserved_before));
        if self.print_on_drop {
            eprintln!("{}", self.make(pa, pr));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AllocatorConfig;

    #[test]
    fn nested_scopes_track_their_own_peaks_without_resetting_the_allocator() {
        let a = Arc::new(CachingAllocator::with_config(Device::parse("sim:1GiB").unwrap(), AllocatorConfig::default()));
        let keep = a.allocate(1 << 20).unwrap();
        let outer = MemoryScope::with_allocator("outer", a.clone()).quiet();
        let big = a.allocate(30 << 20).unwrap();
        drop(big);
        let inner = MemoryScope::with_allocator("inner", a.clone()).quiet();
        let x = a.allocate(2 << 20).unwrap();
        let ri = inner.finish();
        assert_eq!(ri.delta_allocated(), 2 << 20);
        assert_eq!(ri.peak_above_entry(), 2 << 20);
        drop(x);
        let ro = outer.finish();
        assert_eq!(ro.delta_allocated(), 0);
        assert_eq!(ro.peak_above_entry(), 30 << 20);
        assert_eq!(a.max_memory_allocated(), (30 << 20) + (1 << 20), "allocator peak untouched by scopes");
        assert!(ro.to_string().contains("outer") && ro.to_string().contains("30.00 MiB above entry"), "{ro}");
        drop(keep);
    }
}
