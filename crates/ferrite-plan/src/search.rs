//! Questions answered with several plans: the largest micro-batch that fits, the memory-growth
//! curve over batch sizes, the cheapest way to reach an effective batch, several jobs on one
//! card, and the remedies for an out-of-memory step.
//!
//! Every answer is a set of [`crate::record`] + [`crate::evaluate`] runs: no formula.
use ferrite_memory::format_size;
use serde::Serialize;

use crate::PlanError;
use crate::evaluate::{MemoryPlan, Target, evaluate};
use crate::trace::record;
use crate::way_forward::{ALLOC_OPTIONS, Route, Variant, WayForward, way_forward};
use crate::workload::{AmpMode, StepConfig, Workload};

/// Largest batch any search tries (a model whose batch of a million still fits is not what
/// this search is for).
const MAX_BATCH: usize = 1 << 20;

/// Plan `workload` with `config` on `target`.
pub fn plan(workload: &dyn Workload, config: &StepConfig, target: &Target) -> Result<MemoryPlan, PlanError> {
    evaluate(&record(workload, config)?, target)
}

/// One batch size tried by a search.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchPoint {
    pub batch: usize,
    pub fits: bool,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
}

/// The result of `--find-batch-size`.
#[derive(Debug, Clone, Serialize)]
pub struct BatchSearch {
    pub max_batch_size: usize,
    /// Whether every batch tried below the answer fits, every one above does not, and peak
    /// reserved grows with the batch among those tried.
    pub monotone: bool,
    /// Every batch tried, in increasing order.
    pub tried: Vec<BatchPoint>,
    /// The plan at the answer.
    pub plan: MemoryPlan,
}

fn point(p: &MemoryPlan) -> BatchPoint {
    BatchPoint {
        batch: p.batch_size,
        fits: p.fits,
        peak_allocated_bytes: p.peak_allocated_bytes,
        peak_reserved_bytes: p.peak_reserved_bytes,
    }
}

/// The largest micro-batch of `config`'s other settings that fits on `target`: doubling until a
/// batch does not fit, then bisection. Fitting is assumed monotone in the batch for the search
/// and checked on the batches tried (also at 3/4 and 1/2 of the answer).
pub fn find_batch_size(
    workload: &dyn Workload,
    config: &StepConfig,
    target: &Target,
) -> Result<BatchSearch, PlanError> {
    find_batch_size_up_to(workload, config, target, MAX_BATCH)
}

/// As [`find_batch_size`], answering at most `limit`.
pub fn find_batch_size_up_to(
    workload: &dyn Workload,
    config: &StepConfig,
    target: &Target,
    limit: usize,
) -> Result<BatchSearch, PlanError> {
    let limit = limit.clamp(1, MAX_BATCH);
    let mut tried: Vec<(usize, MemoryPlan)> = Vec::new();
    let at = |b: usize, tried: &mut Vec<(usize, MemoryPlan)>| -> Result<bool, PlanError> {
        if let Some((_, p)) = tried.iter().find(|(x, _)| *x == b) {
            return Ok(p.fits);
        }
        let p = plan(workload, &StepConfig { batch: b, ..config.clone() }, target)?;
        let fits = p.fits;
        tried.push((b, p));
        Ok(fits)
    };
    if !at(1, &mut tried)? {
        let p = &tried[0].1;
        return Err(PlanError::NothingFits {
            device: target.device_name(),
            needed: p.peak_reserved_bytes,
            usable: p.usable_bytes,
            details: format!(
                "model states alone: parameters {} + gradients {} + optimizer state {}",
                format_size(p.breakdown.parameters),
                format_size(p.breakdown.gradients),
                format_size(p.breakdown.optimizer_state)
            ),
        });
    }
    let (mut lo, mut hi) = (1usize, None::<usize>);
    while hi.is_none() && lo < limit {
        let b = (lo * 2).min(limit);
        if at(b, &mut tried)? { lo = b } else { hi = Some(b) }
    }
    if let Some(mut hi) = hi {
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if at(mid, &mut tried)? { lo = mid } else { hi = mid }
        }
    }
    for b in [lo * 3 / 4, lo / 2] {
        if b >= 1 {
            at(b, &mut tried)?;
        }
    }
    tried.sort_by_key(|(b, _)| *b);
    let monotone = tried.iter().all(|(b, p)| p.fits == (*b <= lo))
        && tried.windows(2).all(|w| w[0].1.peak_reserved_bytes <= w[1].1.peak_reserved_bytes);
    let points = tried.iter().map(|(_, p)| point(p)).collect();
    let plan = tried.into_iter().find(|(b, _)| *b == lo).map(|(_, p)| p).ok_or_else(|| {
        PlanError::setting("batch search", "the answer was not among the batches tried (please report this)")
    })?;
    Ok(BatchSearch { max_batch_size: lo, monotone, tried: points, plan })
}

/// `--sweep-batch`: one plan per batch size.
pub fn sweep_batch(
    workload: &dyn Workload,
    config: &StepConfig,
    target: &Target,
    batches: &[usize],
) -> Result<Vec<MemoryPlan>, PlanError> {
    batches.iter().map(|&b| plan(workload, &StepConfig { batch: b, ..config.clone() }, target)).collect()
}

/// N copies of a run on one card (no memory isolation between them).
#[derive(Debug, Clone, Serialize)]
pub struct JobsPlan {
    pub jobs: usize,
    /// Whether N copies fit side by side, each capped at `memory_fraction`.
    pub fit_together: bool,
    /// What each job should pass to `set_per_process_memory_fraction` (`--memory-fraction`):
    /// its share of the card after every job's CUDA context.
    pub memory_fraction: f64,
    /// Device memory all jobs use at their peaks: N × (peak reserved + context).
    pub total_bytes: u64,
    /// One job's plan under that fraction.
    pub per_job: MemoryPlan,
}

/// Whether `jobs` copies of the step fit together on `target`: each process has its own CUDA
/// context and caching allocator, so the card must hold N × (context + reserved); each job is
/// capped with the fraction that shares what is left equally, and planned under that cap.
pub fn plan_jobs(
    workload: &dyn Workload,
    config: &StepConfig,
    target: &Target,
    jobs: usize,
) -> Result<JobsPlan, PlanError> {
    if jobs == 0 {
        return Err(PlanError::setting("--jobs 0", "at least one job"));
    }
    let total = target.profile.total_bytes;
    let contexts = target.profile.context_overhead_bytes.saturating_mul(jobs as u64);
    let share = total.saturating_sub(contexts) / jobs as u64;
    // Two decimals, rounded down: what a user types.
    let fraction = ((share as f64 / total as f64) * 100.0).floor() / 100.0;
    if fraction <= 0.0 {
        return Err(PlanError::setting(
            format!("--jobs {jobs}"),
            format!("{jobs} CUDA contexts alone take the whole of {}", target.device_name()),
        ));
    }
    let capped = Target { memory_fraction: Some(fraction), ..target.clone() };
    let per_job = plan(workload, config, &capped)?;
    let per_job_total = per_job.peak_reserved_bytes + target.profile.context_overhead_bytes;
    Ok(JobsPlan {
        jobs,
        fit_together: per_job.fits,
        memory_fraction: fraction,
        total_bytes: per_job_total.saturating_mul(jobs as u64),
        per_job,
    })
}

/// One way to reach an effective batch (a [`Route`] of [`way_forward`]).
pub type Candidate = Route;

/// `--target-batch`: every way to reach an effective batch of N on the card — micro-batch
/// (divisors of N) with accumulation, AMP, checkpointing, allocator settings and the caller's
/// variants — ranked as [`way_forward`] ranks them.
#[derive(Debug, Clone, Serialize)]
pub struct TargetBatchPlan {
    pub target_batch: usize,
    pub fitting: Vec<Candidate>,
    /// When nothing fits: the closest plan, by how much it misses, and the smallest card it fits on.
    pub advice: Option<String>,
    /// The whole answer (closest route and larger card included).
    pub way_forward: WayForward,
}

/// [`target_batch_with`] without variants.
pub fn target_batch(
    workload: &dyn Workload,
    config: &StepConfig,
    target: &Target,
    effective: usize,
) -> Result<TargetBatchPlan, PlanError> {
    target_batch_with(workload, &[], config, target, effective)
}

/// `--target-batch N` with the caller's variants (LoRA, sharding) searched too.
pub fn target_batch_with(
    workload: &dyn Workload,
    variants: &[Variant],
    config: &StepConfig,
    target: &Target,
    effective: usize,
) -> Result<TargetBatchPlan, PlanError> {
    if effective == 0 {
        return Err(PlanError::setting("--target-batch 0", "the effective batch must hold at least one sample"));
    }
    let w = way_forward(workload, variants, config, target, Some(effective))?;
    Ok(TargetBatchPlan { target_batch: effective, fitting: w.routes.clone(), advice: w.nothing_fits(), way_forward: w })
}

/// One remedy for a step that does not fit: the change and what it saves for this model.
#[derive(Debug, Clone, Serialize)]
pub struct Remedy {
    pub change: String,
    /// Predicted peak reserved with the change.
    pub peak_reserved_bytes: u64,
    /// Bytes it saves against the step as configured (0 when it saves nothing).
    pub saves_bytes: u64,
    /// Bytes it adds to the peak against the step as configured (0 unless the change makes the
    /// peak higher, e.g. bf16 autocast keeping 16-bit copies of weights too large to fit anyway).
    pub raises_bytes: u64,
    /// Whether the step fits with this change alone.
    pub fits: bool,
}

/// Ranked remedies for `config` on `target`: each single change planned for this model, those
/// that make the step fit first, then by bytes saved.
pub fn remedies(workload: &dyn Workload, config: &StepConfig, target: &Target) -> Result<Vec<Remedy>, PlanError> {
    let base = plan(workload, config, target)?;
    let mut out = Vec::new();
    let mut try_one = |change: String, cfg: StepConfig, tgt: &Target| -> Result<(), PlanError> {
        let p = plan(workload, &cfg, tgt)?;
        out.push(Remedy {
            change,
            peak_reserved_bytes: p.peak_reserved_bytes,
            saves_bytes: base.peak_reserved_bytes.saturating_sub(p.peak_reserved_bytes),
            raises_bytes: p.peak_reserved_bytes.saturating_sub(base.peak_reserved_bytes),
            fits: p.fits,
        });
        Ok(())
    };
    if config.batch > 1 {
        let half = config.batch / 2;
        try_one(
            format!(
                "--batch-size {half} --accum-steps {} (effective batch {})",
                config.accum_steps * 2,
                half * config.accum_steps * 2
            ),
            StepConfig { batch: half, accum_steps: config.accum_steps * 2, ..config.clone() },
            target,
        )?;
    }
    if config.amp.is_none() {
        try_one("--amp bf16".into(), StepConfig { amp: Some(AmpMode::Bf16), ..config.clone() }, target)?;
    }
    if !config.checkpoint_activations {
        try_one(
            "--checkpoint-activations".into(),
            StepConfig { checkpoint_activations: true, ..config.clone() },
            target,
        )?;
    }
    for opt in ALLOC_OPTIONS {
        let mut cfg = target.config.clone();
        cfg.apply(opt)?;
        if cfg != target.config {
            try_one(format!("--alloc-conf {opt}"), config.clone(), &Target { config: cfg, ..target.clone() })?;
        }
    }
    out.sort_by(|a, b| {
        b.fits.cmp(&a.fits).then(b.saves_bytes.cmp(&a.saves_bytes)).then(a.raises_bytes.cmp(&b.raises_bytes))
    });
    Ok(out)
}
