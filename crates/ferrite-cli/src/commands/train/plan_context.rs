//! What `ferrite train` asks the planner, through the trainer library's own calls
//! (`ferrite_train::planned`): `--batch-size auto`, and the ranked remedies an out-of-memory error
//! carries (the bytes each saves for this model). The run is described once, as a
//! [`PlanContext`] built from the same model flags `ferrite plan` reads.
use ferrite_memory::format_size;
use ferrite_plan::{OptimizerKind, PlanError, StepConfig};
use ferrite_train::PlanContext;
use ferrite_train::planned;

use super::{TrainArgs, TrainError};

/// Largest batch `--batch-size auto` chooses (beyond it an epoch of the built-in datasets is a
/// handful of steps).
pub const AUTO_BATCH_LIMIT: usize = 4096;

/// The vocabulary the planner assumes for the character-level models before the text is read:
/// more than the Jargon File's, so the answer errs on the safe side.
const TEXT_VOCAB: usize = 128;

impl TrainArgs {
    /// The run as the planner sees it: the model these flags build (built-in, or the
    /// `--hf-model` folder's), the step settings,
    /// the device and allocator settings.
    pub fn plan_context(&self) -> Result<PlanContext, PlanError> {
        let dataset = match self.dataset.as_deref() {
            Some("fashion-mnist") => "fashion-mnist",
            _ => "digits",
        };
        let workload: Box<dyn ferrite_plan::Workload> = match &self.hf_model {
            Some(dir) => {
                let config = dir.join("config.json");
                let w = ferrite_plan::hf_workload(&config, self.shape.seq)?;
                let model_type = crate::commands::lora_args::model_type_of(&config);
                self.lora.lora.plan_workload(w, &model_type)?
            }
            None => Box::new(self.shape.builtin(self.model, dataset, TEXT_VOCAB)?),
        };
        Ok(PlanContext {
            workload,
            step: StepConfig {
                batch: self.batch_size.max(1),
                accum_steps: self.accum_steps,
                amp: self.amp.map(|a| a.mode()),
                checkpoint_activations: self.checkpoint_activations,
                optimizer: OptimizerKind::Adamw,
            },
            device: self.device.to_string(),
            alloc_conf: self.alloc_conf.clone(),
            memory_fraction: None,
        })
    }
}

/// `--batch-size auto`: the largest micro-batch (up to [`AUTO_BATCH_LIMIT`]) that the planner
/// finds fits on the run's simulated GPU; prints the chosen plan.
pub fn auto_batch_size(args: &TrainArgs) -> Result<usize, PlanError> {
    let s = planned::auto_batch_size(&args.plan_context()?, AUTO_BATCH_LIMIT)?;
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
/// remedies for this run's model on its device; where the planner cannot model the run, the
/// report keeps its fixed-rule suggestions and says why. Any other error is returned unchanged.
pub fn with_planned_remedies(error: TrainError, args: &TrainArgs) -> TrainError {
    if !error.is_out_of_memory() {
        return error;
    }
    let ctx = if args.distributed || super::data_parallel::requested(args) {
        Err("it trains on several devices; `ferrite plan` models one".to_string())
    } else {
        args.plan_context().map_err(|e| e.to_string())
    };
    planned::with_planned_remedies(error, ctx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_memory::{DeviceKind, OutOfMemoryReport};
    use ferrite_tensor::Device;
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
        TrainArgs {
            device: Device::parse(device).unwrap(),
            batch_size: 512,
            shape: super::super::ModelArgs { hidden: Some(512), ..Default::default() },
            ..TrainArgs::default_demo()
        }
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
