//! What a training run asks the planner: the largest micro-batch that fits (`--batch-size auto`),
//! and, when a device runs out of memory, the ranked remedies its report carries (the bytes each
//! saves for this model, the peak it leads to, whether it fits).
//!
//! Why in the trainer: both questions are about the run being trained — its model as a planner
//! workload, its step settings, its device and allocator settings — so they take the trainer's
//! settings ([`PlanContext`]) and nothing of any command line.
use ferrite_memory::{AllocatorConfig, DeviceKind, GpuProfile, OutOfMemoryReport, PlannedRemedy, format_size};
use ferrite_plan::{BatchSearch, PlanError, StepConfig, Target, Workload, remedies};
use ferrite_tensor::Device;

use crate::error::TrainError;

/// The run as the planner sees it.
pub struct PlanContext {
    /// The model being trained, as a planner workload (the same builder the run used).
    pub workload: Box<dyn Workload>,
    /// The step's settings: micro-batch, accumulation, precision, checkpointing, optimizer.
    pub step: StepConfig,
    /// The device the run trains on, as the user named it (`sim:t4-16gb`, `gpu:0`, `cpu`).
    pub device: String,
    /// Allocator settings (`PYTORCH_CUDA_ALLOC_CONF` syntax) given for the run; `None` reads
    /// `FERRITE_ALLOC_CONF`.
    pub alloc_conf: Option<String>,
    /// The run's `set_per_process_memory_fraction`.
    pub memory_fraction: Option<f64>,
}

/// The allocator settings of a run: those of `FERRITE_ALLOC_CONF` (the defaults without it), with
/// `spec` applied on top when given (as PyTorch's `_set_allocator_settings` applies on top of
/// `PYTORCH_CUDA_ALLOC_CONF`) — the one place both are resolved, for training and for planning.
pub fn allocator_config(spec: Option<&str>) -> Result<AllocatorConfig, ferrite_memory::MemoryError> {
    let mut config: AllocatorConfig = ferrite_memory::env_alloc_config()?;
    if let Some(spec) = spec {
        config.apply(spec)?;
    }
    Ok(config)
}

/// The simulated GPU `device` names (`sim:t4-16gb`, `sim:24GiB`) with the allocator settings of
/// `alloc_conf` (see [`allocator_config`]) and a per-process memory fraction.
pub fn target(device: &str, alloc_conf: Option<&str>, memory_fraction: Option<f64>) -> Result<Target, PlanError> {
    let config = allocator_config(alloc_conf)?;
    let mut t = Target::parse(device, config)?;
    if let Some(f) = memory_fraction {
        if !(f > 0.0 && f <= 1.0) {
            return Err(PlanError::InvalidSetting {
                what: format!("--memory-fraction {f}"),
                reason: "must be in (0, 1]".into(),
            });
        }
        t.memory_fraction = Some(f);
    }
    Ok(t)
}

impl PlanContext {
    /// The simulated GPU of the run's device with its allocator settings and memory fraction.
    pub fn target(&self) -> Result<Target, PlanError> {
        target(&self.device, self.alloc_conf.as_deref(), self.memory_fraction)
    }
}

/// The largest micro-batch up to `limit` that fits on the run's simulated GPU.
pub fn auto_batch_size(ctx: &PlanContext, limit: usize) -> Result<BatchSearch, PlanError> {
    let device = Device::parse(&ctx.device)?;
    if !matches!(device, Device::Sim { .. }) {
        return Err(PlanError::InvalidSetting {
            what: format!("--batch-size auto on {device}"),
            reason: "the planner needs a device with a known capacity: a simulated GPU such as --device sim:t4-16gb (plan for a real GPU with `ferrite plan --device sim:<its model>`)".into(),
        });
    }
    ferrite_plan::find_batch_size_up_to(&*ctx.workload, &ctx.step, &ctx.target()?, limit)
}

/// `error` with its out-of-memory report's suggestions replaced by the planner's ranked remedies
/// for the run `ctx` describes; where the planner cannot model the run (`ctx` is `Err` with the
/// reason), the report keeps its fixed-rule suggestions and says why. Any other error is
/// returned unchanged.
pub fn with_planned_remedies(error: TrainError, ctx: Result<PlanContext, String>) -> TrainError {
    if !error.is_out_of_memory() {
        return error;
    }
    error.map_oom_report(|report| match ctx.and_then(|ctx| planned_remedies(&ctx, report)) {
        Ok((target, list)) => report.set_planned_remedies(target, list),
        Err(reason) => report.set_planner_unavailable(reason),
    })
}

/// The planner's remedies for the run that failed with `report`, and the name of the device it
/// planned for; `Err` says why the planner cannot model the run.
pub fn planned_remedies(ctx: &PlanContext, report: &OutOfMemoryReport) -> Result<(String, Vec<PlannedRemedy>), String> {
    let (target, name) = planner_target(ctx, report)?;
    let list = remedies(&*ctx.workload, &ctx.step, &target).map_err(|e| e.to_string())?;
    let gpu = report.device_kind == DeviceKind::Gpu;
    let planned = list
        .into_iter()
        // wgpu buffers do not grow: expandable segments do not apply on a real GPU.
        .filter(|r| !(gpu && r.change.contains("expandable_segments")))
        .map(|r| PlannedRemedy {
            change: r.change,
            saves_bytes: r.saves_bytes,
            raises_bytes: r.raises_bytes,
            peak_reserved_bytes: r.peak_reserved_bytes,
            fits: r.fits,
        })
        .collect();
    Ok((name, planned))
}

/// The device the planner models for a failed run: the run's own simulated GPU, or a device of
/// the report's capacity (what the allocator could reserve) for `gpu:N`/`cpu` when they have one.
fn planner_target(ctx: &PlanContext, report: &OutOfMemoryReport) -> Result<(Target, String), String> {
    if let Ok(Device::Sim { .. }) = Device::parse(&ctx.device) {
        let t = ctx.target().map_err(|e| e.to_string())?;
        let name = t.device_name();
        return Ok((t, name));
    }
    let (Some(total), Some(limit)) = (report.total_capacity, report.limit_bytes) else {
        return Err(if report.device_kind == DeviceKind::Gpu {
            format!("the capacity of {} is unknown; set FERRITE_GPU_MEMORY=<size>", report.device)
        } else {
            format!("{} has no fixed capacity", report.device)
        });
    };
    let config = allocator_config(ctx.alloc_conf.as_deref()).map_err(|e| e.to_string())?;
    let name = format!("{} ({})", report.device, format_size(total));
    let profile = GpuProfile {
        key: report.device.clone(),
        name: report.device_name.clone(),
        total_bytes: total,
        // What the allocator could never reserve (context, fraction) is the planned overhead.
        context_overhead_bytes: total.saturating_sub(limit),
    };
    Ok((Target { profile, config, memory_fraction: None }, name))
}
