//! What `ferrite train` asks the planner: `--batch-size auto`, and the remedies printed after
//! an out-of-memory step (ranked, with the bytes each saves for this model).
use ferrite_memory::format_size;
use ferrite_plan::{PlanError, remedies};
use ferrite_tensor::Device;

use super::{OptimizerArg, PlanArgs};
use crate::commands::train::TrainArgs;

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

/// The planner's ranked remedies for a run that ran out of memory, as text to print after the
/// error (empty when the run is not on a simulated GPU or the planner cannot model it).
pub fn oom_remedies(args: &TrainArgs) -> String {
    let Ok(Device::Sim { .. }) = Device::parse(&args.device) else { return String::new() };
    let p = plan_args(args);
    let (Ok(workload), Ok(target)) = (p.workload(), p.target()) else { return String::new() };
    let Ok(list) = remedies(&*workload, &p.step_config(), &target) else { return String::new() };
    let mut out =
        format!("\nRemedies planned for this model on {} (ferrite plan), most effective first:", target.device_name());
    for (i, r) in list.iter().enumerate() {
        out += &format!(
            "\n  {}. {}: saves {} (peak reserved {}){}",
            i + 1,
            r.change,
            format_size(r.saves_bytes),
            format_size(r.peak_reserved_bytes),
            if r.fits { ", fits" } else { ", still does not fit" }
        );
    }
    out
}
