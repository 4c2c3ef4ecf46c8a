//! The memory planner: will a training step fit on a named GPU, with what to spare, and if not,
//! what to change — answered before the run, without the GPU.
//!
//! How: the real training step (forward, loss, backward, optimizer step with its lazily created
//! state, `zero_grad`; twice) runs on the `meta` device, which allocates through the caching
//! allocator but computes nothing ([`record`]). The allocator's history of that step is then
//! replayed through an unbacked allocator of the target GPU with the run's settings
//! ([`evaluate`]): PyTorch's rounding, pools, fragmentation, the card's capacity and its CUDA
//! context all count. There is no separate formula that could drift from the code; `--measure`
//! runs the same step on a `sim` device and the two agree within 2 % (tested).
//!
//! ```no_run
//! # use ferrite_plan::*;
//! # fn demo(w: &dyn Workload) -> Result<(), PlanError> {
//! let trace = record(w, &StepConfig::new(8))?;
//! let plan = evaluate(&trace, &Target::parse("sim:a100-40gb", Default::default())?)?;
//! println!("fits: {}, peak reserved {} bytes", plan.fits, plan.peak_reserved_bytes);
//! # Ok(()) }
//! ```

mod builtin;
mod error;
mod evaluate;
mod fully_sharded_step;
mod hf_workload;
mod lora_workload;
mod measure;
mod model_states;
mod rank_plan;
mod search;
mod sharded_step;
mod step;
mod t5_workload;
mod trace;
mod way_forward;
mod workload;
mod zero;
mod zero_routes;

pub use builtin::Builtin;
pub use error::PlanError;
pub use evaluate::{
    Breakdown, LayerBytes, MemoryPlan, PeakSite, PlanOom, StepPoint, Target, alloc_conf_string, evaluate, step_timeline,
};
pub use hf_workload::{HfDecoder, hf_workload};
pub use lora_workload::{LoraWorkload, with_lora};
pub use measure::{Measured, measure, measure_rank};
pub use model_states::{FerriteModelStates, ferrite_model_states};
pub use rank_plan::{MAX_RANKS_PLANNED, RankPeak, ShardedPlan, plan_ranks, ranks_to_plan, trainable_sizes};
pub use search::{
    BatchPoint, BatchSearch, Candidate, JobsPlan, Remedy, TargetBatchPlan, find_batch_size, find_batch_size_up_to,
    plan, plan_jobs, remedies, sweep_batch, target_batch, target_batch_with,
};
pub use sharded_step::{DataParallel, RankLayout, fullest_rank};
pub use step::{Phase, STEPS};
pub use t5_workload::T5Workload;
pub use trace::{AllocInfo, Category, Event, StepTrace, plan_lock, record, record_rank};
pub use way_forward::{Route, Variant, WayForward, relative_cost, way_forward};
pub use workload::{AmpMode, OptimizerKind, StepConfig, Workload};
pub use zero::{
    DEEPSPEED_BUFFER_FACTOR, Difference, ModelSizes, Offload, ZeroEstimate, ZeroReport, ZeroSetup, ZeroStage,
    deepspeed_estimate, deepspeed_gb, deepspeed_table, zero_report, zero_report_sharded,
};
pub use zero_routes::{MAX_ZERO_GPUS, zero_variants};
