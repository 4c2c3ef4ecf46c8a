//! What `ferrite train` asks the planner: `--batch-size auto`, and the ranked remedies an
//! out-of-memory error carries (the bytes each saves for this model).
use ferrite_memory::{AllocatorConfig, DeviceKind, GpuProfile, OutOfMemoryReport, PlannedRemedy, format_size};
use ferrite_plan::{PlanError, Target, remedies};
use ferrite_tensor::Device;

use super::{OptimizerArg, PlanArgs};
use crate::commands::train::{TrainArgs, TrainError, data_parallel_requested};

/// Largest batch `--batch-size auto` chooses (beyond it an epoch of the built-in datasets is a
/// handful of steps).
pub const AUTO_BATCH_LIMIT: usize = 4096;

/// The vocabulary the planner assumes for the character-level models before the text is read:
/// more than the Jargon File's, so the answer errs on the safe side.
const TEXT_VOCAB: usize = 128;

/// The plan flags of a training run.
pub fn plan_args(args: &TrainArgs) -> PlanArgs {
    PlanArgs {
        model: args.model,
        hf_config: None,
        zero: Default::default(),
        device: args.device.clone(),
        batch: args.batch_size.max(1),
        accum_steps: args.accum_steps,
        amp: args.amp,
        checkpoint_activations: args.checkpoint_activations,
        optimizer: OptimizerArg::Adamw,
        alloc_conf: args.alloc_conf.clone(),
        memory_fraction: None,
        seq: args.seq,
        vocab: TEXT_VOCAB,
        d_model: args.d_model,
        heads: args.heads,
        hidden: args.hidden,
        layers: args.layers,
        dataset: match args.dataset.as_deref() {
            Some("fashion-mnist") => "fashion-mnist".into(),
            _ => "digits".into(),
        },
        dropout: args.dropout,
        json: false,
        measure: false,
        find_batch_size: false,
        plot: None,
        sweep_batch: None,
        target_batch: None,
        jobs: None,
    }
}

/// `--batch-size auto`: the largest micro-batch (up to [`AUTO_BATCH_LIMIT`]) that the planner
/// finds fits on the run's simulated GPU; prints the chosen plan.
pub fn auto_batch_size(args: &TrainArgs) -> Result<usize, PlanError> {
    let device = Device::parse(&args.device)?;
    if !matches!(device, Device::Sim { .. }) {
        return Err(PlanError::InvalidSetting {
            what: format!("--batch-size auto on {device}"),
            reason: "the planner needs a device with a known capacity: a simulated GPU such as --device sim:t4-16gb (plan for a real GPU with `ferrite plan --device sim:<its model>`)".into(),
        });
    }
    let p = plan_args(args);
    let workload = p.workload()?;
    let s = ferrite_plan::find_batch_size_up_to(&*workload, &p.step_config(), &p.target()?, AUTO_BATCH_LIMIT)?;
    println!(
        "batch size auto: {} — the largest micro-batch{} that fits on {} (ferrite plan: peak reserved {} of {} usable)",
        s.max_batch_size,
        if s.max_batch_size == AUTO_BATCH_LIMIT { format!(" up to {AUTO_BATCH_LIMIT}") } else { String::new() },
        s.plan.device,
        format_size(s.plan.peak_reserved_bytes),
        format_size(s.plan.usable_bytes)
    );
    if !s.monotone {
        println!("  warning: fitting was not monotone in the batch over the sizes tried");
    }
    Ok(s.max_batch_size)
}

/// `error` with its out-of-memory report's suggestions replaced by the planner's ranked
/// remedies for this run's model on its device (the bytes each saves, the peak it leads to,
/// whether it fits); where the planner cannot model the run, the report keeps its fixed-rule
/// suggestions and says why. Any other error is returned unchanged.
pub fn with_planned_remedies(error: TrainError, args: &TrainArgs) -> TrainError {
    if !error.is_out_of_memory() {
        return error;
    }
    error.map_oom_report(|report| match planned_remedies(args, report) {
        Ok((target, list)) => report.set_planned_remedies(target, list),
        Err(reason) => report.set_planner_unavailable(reason),
    })
}

/// The planner's remedies for the run of `args` that failed with `report`, and the name of the
/// device it planned for; `Err` says why the planner cannot model the run.
pub fn planned_remedies(args: &TrainArgs, report: &OutOfMemoryReport) -> Result<(String, Vec<PlannedRemedy>), String> {
    if args.distributed || data_parallel_requested(args) {
        return Err("it trains on several devices; `ferrite plan` models one".into());
    }
    let p = plan_args(args);
    let (target, name) = planner_target(&p, report)?;
    let workload = p.workload().map_err(|e| e.to_string())?;
    let list = remedies(&*workload, &p.step_config(), &target).map_err(|e| e.to_string())?;
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

/// The device the planner models for a failed run: the run's own simulated GPU, or a device
/// of the report's capacity (what the allocator could reserve) for `gpu:N`/`cpu` when they have one.
fn planner_target(p: &PlanArgs, report: &OutOfMemoryReport) -> Result<(Target, String), String> {
    if let Ok(Device::Sim { .. }) = Device::parse(&p.device) {
        let t = p.target().map_err(|e| e.to_string())?;
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
    let mut config = match &p.alloc_conf {
        Some(_) => AllocatorConfig::default(),
        None => ferrite_memory::env_alloc_config().map_err(|e| e.to_string())?,
    };
    if let Some(spec) = &p.alloc_conf {
        config.apply(spec).map_err(|e| e.to_string())?;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_tensor::{DType, Tensor};

    /// A real out-of-memory report from a 1 GiB simulated device, as `train` would return it.
    fn oom() -> TrainError {
        let sim = Device::parse("sim:1GiB").unwrap();
        let e = Tensor::zeros(&[1 << 30], DType::F32, &sim).unwrap_err();
        TrainError::During {
            phase: "forward pass",
            device: sim.to_string(),
            source: Box::new(e.into()),
            hint: String::new(),
        }
    }

    /// The same error with its report edited (to stand for another device).
    fn oom_edited(edit: impl FnOnce(&mut OutOfMemoryReport)) -> TrainError {
        let mut report = oom().oom_report().unwrap().clone();
        edit(&mut report);
        TrainError::OutOfMemory { report: Box::new(report) }
    }

    fn args(device: &str) -> TrainArgs {
        TrainArgs { device: device.into(), batch_size: 512, hidden: Some(512), ..TrainArgs::default_demo() }
    }

    #[test]
    fn a_sim_oom_carries_the_planners_remedies_in_its_report() {
        let e = with_planned_remedies(oom(), &args("sim:1GiB"));
        let report = e.oom_report().unwrap();
        let planned = report.planned.as_ref().unwrap();
        assert_eq!(planned.target, "sim:1GiB");
        assert!(!planned.remedies.is_empty());
        assert!(planned.remedies.windows(2).all(|w| w[0].saves_bytes >= w[1].saves_bytes || w[0].fits));
        assert!(planned.remedies.iter().any(|r| r.change.starts_with("--batch-size 256 --accum-steps 2")));
        let msg = e.to_string();
        assert!(msg.starts_with("forward pass on sim:1GiB:0: CUDA out of memory."), "{msg}");
        assert!(
            msg.contains("Ranked remedies (ferrite plan, for this model on sim:1GiB):") && !msg.contains("Suggestions")
        );
        // Not an OOM: unchanged.
        let other = with_planned_remedies(TrainError::MetaDevice, &args("sim:1GiB"));
        assert!(matches!(other, TrainError::MetaDevice));
    }

    #[test]
    fn a_gpu_with_a_capacity_is_planned_for_and_a_device_without_one_keeps_the_rules() {
        let gpu = oom_edited(|r| {
            r.device_kind = DeviceKind::Gpu;
            r.device = "gpu:0".into();
        });
        let e = with_planned_remedies(gpu, &args("gpu:0"));
        let planned = e.oom_report().unwrap().planned.as_ref().unwrap();
        assert_eq!(planned.target, "gpu:0 (1024.00 MiB)");
        assert!(!planned.remedies.is_empty());
        assert!(planned.remedies.iter().all(|r| !r.change.contains("expandable_segments")));

        let cpu = oom_edited(|r| {
            r.device_kind = DeviceKind::Cpu;
            r.device = "cpu".into();
            r.total_capacity = None;
            r.limit_bytes = None;
        });
        let e = with_planned_remedies(cpu, &args("cpu"));
        let r = e.oom_report().unwrap();
        assert!(r.planned.is_none());
        assert_eq!(r.planner_unavailable.as_deref(), Some("cpu has no fixed capacity"));
        let msg = e.to_string();
        assert!(
            msg.contains("The planner cannot model this run (cpu has no fixed capacity)")
                && msg.contains("Suggestions")
        );

        let several = TrainArgs { data_parallel: true, ..args("sim:1GiB") };
        let e = with_planned_remedies(oom(), &several);
        assert!(e.oom_report().unwrap().planner_unavailable.as_deref().unwrap().contains("several devices"));
    }
}
