//! `--measure`: the same step run for real on a `sim` device, whose allocator measures it.
//!
//! Each measurement gets a device index of its own (`sim:<gpu>:<n>`, n from 4096 up), so its
//! allocator starts empty and concurrent measurements never share peaks.
use std::sync::atomic::{AtomicUsize, Ordering};

use ferrite_memory::{Device, allocator, configure};
use serde::Serialize;

use crate::PlanError;
use crate::evaluate::Target;
use crate::fully_sharded_step::run_layout_step;
use crate::sharded_step::RankLayout;
use crate::step::{CustomStep, run_step};
use crate::workload::{StepConfig, Workload};

static NEXT_INDEX: AtomicUsize = AtomicUsize::new(4096);

/// Peaks of the step measured on a `sim` device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Measured {
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
}

/// Run the step of `workload` on a fresh `sim` device of `target` (host memory backs it: keep
/// the model small) and return the allocator's peaks. An out-of-memory is returned as the error.
pub fn measure(workload: &dyn Workload, config: &StepConfig, target: &Target) -> Result<Measured, PlanError> {
    measure_with(workload, config, target, None)
}

/// [`measure`] of one rank's step of a data-parallel run (see [`crate::sharded_step`]).
pub fn measure_rank(
    workload: &dyn Workload,
    config: &StepConfig,
    target: &Target,
    layout: RankLayout,
) -> Result<Measured, PlanError> {
    measure_with(workload, config, target, Some(layout))
}

fn measure_with(
    workload: &dyn Workload,
    config: &StepConfig,
    target: &Target,
    layout: Option<RankLayout>,
) -> Result<Measured, PlanError> {
    let device = Device::Sim { profile: target.profile.clone(), index: NEXT_INDEX.fetch_add(1, Ordering::Relaxed) };
    configure(&device, target.config.clone());
    let alloc = allocator(&device);
    if let Some(f) = target.memory_fraction {
        alloc.set_per_process_memory_fraction(f)?;
    }
    let rank_step = layout.map(|l| move |d: &Device| run_layout_step(workload, config, d, l));
    let result = run_step(workload, config, &device, None, rank_step.as_ref().map(|f| f as &CustomStep<'_>));
    let measured = Measured {
        peak_allocated_bytes: alloc.max_memory_allocated(),
        peak_reserved_bytes: alloc.max_memory_reserved(),
    };
    // Give the host memory back: this device is never used again.
    alloc.empty_cache();
    result.map(|_| measured)
}
