//! What a run reports, in one place, so `/metrics` and `--metrics-file` can never disagree.
//!
//! [`LiveFigures`] is written by the training thread only (plain atomic stores: no lock, no
//! allocation, no system call) and read by the output threads. Allocator figures are not copied
//! by the training thread at all: [`DeviceFigures::read`] takes them from the device's allocator
//! when a scraper or the file writer asks, which costs the step nothing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ferrite_memory::{Device, allocator};
use serde::Serialize;

/// What is running: constant for the run, exported as `ferrite_run_info{...} 1` (the label a
/// monitor checks to know it talks to ferrite) and in every JSON-lines record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunInfo {
    /// ferrite's version.
    pub version: String,
    /// The model as the trainer names it (`mlp 64-128-128-10`).
    pub model: String,
    pub dataset: String,
    /// The device training runs on (`sim:a100-40gb:0`).
    pub device: String,
}

/// An `f64` that one thread stores and others load.
#[derive(Debug, Default)]
pub struct AtomicF64(AtomicU64);

impl AtomicF64 {
    pub fn new(v: f64) -> AtomicF64 {
        AtomicF64(AtomicU64::new(v.to_bits()))
    }
    pub fn store(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }
    pub fn load(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// The training figures, updated after every batch.
#[derive(Debug)]
pub struct LiveFigures {
    /// Optimizer steps taken since the run started (a resumed run starts at its checkpoint's).
    pub steps: AtomicU64,
    /// Steps the GradScaler skipped because gradients had inf/NaN.
    pub skipped_steps: AtomicU64,
    /// Training samples processed by this process.
    pub samples: AtomicU64,
    /// The epoch running (1-based; 0 before the first).
    pub epoch: AtomicU64,
    pub epochs: AtomicU64,
    /// Loss of the last micro-batch.
    pub loss: AtomicF64,
    /// Learning rate of the first parameter group.
    pub learning_rate: AtomicF64,
    /// Samples per second over the last measurement window (training only, not evaluation).
    pub samples_per_second: AtomicF64,
    /// Share of the last window's wall time spent waiting for the data loader.
    pub loader_wait_ratio: AtomicF64,
    /// The GradScaler's scale, NaN when loss scaling is off.
    pub grad_scale: AtomicF64,
    /// Batches timed, their total wall time and total loader wait (the histograms' count and
    /// sums, kept here too so a record is read without the histograms' locks).
    pub batches: AtomicU64,
    pub batch_seconds_total: AtomicF64,
    pub loader_wait_seconds_total: AtomicF64,
    /// Set when the training loop has ended.
    pub finished: AtomicBool,
}

impl Default for LiveFigures {
    fn default() -> Self {
        LiveFigures {
            steps: AtomicU64::new(0),
            skipped_steps: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            epochs: AtomicU64::new(0),
            loss: AtomicF64::new(f64::NAN),
            learning_rate: AtomicF64::new(f64::NAN),
            samples_per_second: AtomicF64::new(0.0),
            loader_wait_ratio: AtomicF64::new(0.0),
            grad_scale: AtomicF64::new(f64::NAN),
            batches: AtomicU64::new(0),
            batch_seconds_total: AtomicF64::new(0.0),
            loader_wait_seconds_total: AtomicF64::new(0.0),
            finished: AtomicBool::new(false),
        }
    }
}

/// The training figures at one moment (the JSON-lines record's `train` object).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainFigures {
    pub steps_total: u64,
    pub skipped_steps_total: u64,
    pub samples_total: u64,
    pub epoch: u64,
    pub epochs: u64,
    /// `null` before the first batch.
    pub loss: Option<f64>,
    pub learning_rate: Option<f64>,
    pub samples_per_second: f64,
    pub loader_wait_ratio: f64,
    /// `null` without loss scaling.
    pub grad_scale: Option<f64>,
    /// Batches timed so far and their total wall time (the step-time histogram's count and sum).
    pub batches_total: u64,
    pub batch_seconds_total: f64,
    /// Total time spent waiting for the data loader (the loader-wait histogram's sum).
    pub loader_wait_seconds_total: f64,
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

impl TrainFigures {
    /// The figures in `live` now.
    pub fn read(live: &LiveFigures) -> TrainFigures {
        TrainFigures {
            steps_total: live.steps.load(Ordering::Relaxed),
            skipped_steps_total: live.skipped_steps.load(Ordering::Relaxed),
            samples_total: live.samples.load(Ordering::Relaxed),
            epoch: live.epoch.load(Ordering::Relaxed),
            epochs: live.epochs.load(Ordering::Relaxed),
            loss: finite(live.loss.load()),
            learning_rate: finite(live.learning_rate.load()),
            samples_per_second: live.samples_per_second.load(),
            loader_wait_ratio: live.loader_wait_ratio.load(),
            grad_scale: finite(live.grad_scale.load()),
            batches_total: live.batches.load(Ordering::Relaxed),
            batch_seconds_total: live.batch_seconds_total.load(),
            loader_wait_seconds_total: live.loader_wait_seconds_total.load(),
        }
    }
}

/// One device's allocator figures (PyTorch's `memory_stats`, the parts a dashboard needs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceFigures {
    pub device: String,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// What the allocator may reserve in total; `null` for devices without a fixed capacity.
    pub capacity_bytes: Option<u64>,
    /// Reserved but not allocated: cached free memory, the raw material of fragmentation.
    pub reserved_unallocated_bytes: u64,
    /// The largest cached free block: a request above it needs a new segment.
    pub largest_free_block_bytes: u64,
    pub segments: u64,
    pub allocations_total: u64,
    pub frees_total: u64,
    pub ooms_total: u64,
    pub alloc_retries_total: u64,
}

fn non_negative(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl DeviceFigures {
    /// The figures of `device`'s process-wide allocator now.
    pub fn read(device: &Device) -> DeviceFigures {
        let a = allocator(device);
        let s = a.memory_stats();
        let allocated = non_negative(s.allocated_bytes.all.current);
        let reserved = non_negative(s.reserved_bytes.all.current);
        DeviceFigures {
            device: device.to_string(),
            allocated_bytes: allocated,
            reserved_bytes: reserved,
            peak_allocated_bytes: non_negative(s.allocated_bytes.all.peak),
            peak_reserved_bytes: non_negative(s.reserved_bytes.all.peak),
            capacity_bytes: a.mem_get_info().map(|(_, total)| total),
            reserved_unallocated_bytes: reserved.saturating_sub(allocated),
            largest_free_block_bytes: a.largest_free_block(),
            segments: non_negative(s.segment.all.current),
            allocations_total: non_negative(s.allocation.all.allocated),
            frees_total: non_negative(s.allocation.all.freed),
            ooms_total: non_negative(s.num_ooms),
            alloc_retries_total: non_negative(s.num_alloc_retries),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_figures_follow_the_allocator() {
        let dev = Device::parse("sim:1GiB:77").unwrap();
        let before = DeviceFigures::read(&dev);
        let block = allocator(&dev).allocate(3 << 20).unwrap();
        let during = DeviceFigures::read(&dev);
        assert_eq!(during.allocated_bytes - before.allocated_bytes, 3 << 20);
        assert!(during.reserved_bytes >= during.allocated_bytes);
        assert_eq!(during.allocations_total, before.allocations_total + 1);
        assert_eq!(during.capacity_bytes, Some(1 << 30));
        drop(block);
        let after = DeviceFigures::read(&dev);
        assert_eq!(after.frees_total, before.frees_total + 1);
        assert_eq!(after.reserved_unallocated_bytes, after.reserved_bytes - after.allocated_bytes);
        assert!(after.largest_free_block_bytes >= 3 << 20);
        assert!(allocator(&dev).allocate(2 << 30).is_err());
        assert_eq!(DeviceFigures::read(&dev).ooms_total, after.ooms_total + 1);
    }

    #[test]
    fn unset_figures_are_null_not_nan() {
        let live = LiveFigures::default();
        let t = TrainFigures::read(&live);
        assert_eq!((t.loss, t.learning_rate, t.grad_scale), (None, None, None));
        let json = serde_json::to_string(&t).unwrap();
        assert!(json.contains("\"loss\":null") && !json.contains("NaN"), "{json}");
    }
}
