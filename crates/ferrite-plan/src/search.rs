//! Questions answered with several plans: the largest micro-batch that fits, the memory-growth
//! curve over batch sizes, the cheapest way to reach an effective batch, several jobs on one
//! card, and the remedies for an out-of-memory step.
//!
//! Every answer is a set of [`crate::record`] + [`crate::evaluate`] runs: no formula.
use serde::Serialize;

use crate::PlanError;
use crate::evaluate::{MemoryPlan, Target, evaluate};
use crate::trace::record;
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
                "model states alone: parameters {} + gradients {} + optimizer state {} bytes",
                p.breakdown.parameters, p.breakdown.gradients, p.breakdown.optimizer_state
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

/// One way to reach an effective batch.
#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    pub micro_batch: usize,
    pub accum_steps: usize,
    pub amp: Option<&'static str>,
    pub checkpoint_activations: bool,
    pub alloc_conf: String,
    pub fits: bool,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    /// Compute per effective batch relative to one plain step of the whole batch: 4/3 with
    /// checkpointing (one more forward in backward), plus 2 % per extra micro-step (smaller
    /// kernels, launch overhead). The optimizer steps once per effective batch in every row.
    pub relative_cost: f64,
}

/// `--target-batch`: every combination of micro-batch (divisors of N), AMP, checkpointing and
/// allocator setting, with for each (AMP, checkpointing, allocator) the largest micro-batch that
/// fits; ranked cheapest first (then fewest changes, then lowest peak).
#[derive(Debug, Clone, Serialize)]
pub struct TargetBatchPlan {
    pub target_batch: usize,
    pub fitting: Vec<Candidate>,
    /// When nothing fits: the smallest change that would.
    pub advice: Option<String>,
}

/// Relative compute of one effective batch; see [`Candidate::relative_cost`].
pub fn relative_cost(accum_steps: usize, checkpoint: bool) -> f64 {
    (if checkpoint { 4.0 / 3.0 } else { 1.0 }) + 0.02 * (accum_steps.saturating_sub(1)) as f64
}

/// The allocator settings `--target-batch` tries besides the run's own.
const ALLOC_OPTIONS: [&str; 2] = ["expandable_segments:True", "max_split_size_mb:128"];

pub fn target_batch(
    workload: &dyn Workload,
    config: &StepConfig,
    target: &Target,
    effective: usize,
) -> Result<TargetBatchPlan, PlanError> {
    if effective == 0 {
        return Err(PlanError::setting("--target-batch 0", "the effective batch must hold at least one sample"));
    }
    let mut micro: Vec<usize> = (1..=effective).filter(|m| effective.is_multiple_of(*m)).collect();
    micro.reverse();
    micro.truncate(16);
    let mut targets = vec![target.clone()];
    for opt in ALLOC_OPTIONS {
        let mut cfg = target.config.clone();
        cfg.apply(opt)?;
        targets.push(Target { config: cfg, ..target.clone() });
    }
    let mut fitting = Vec::new();
    let mut best_effort: Option<MemoryPlan> = None;
    for amp in [config.amp, Some(AmpMode::Bf16), Some(AmpMode::F16)].into_iter().enumerate().filter_map(|(i, a)| {
        // The run's own precision first, then the others once each.
        if i > 0 && a == config.amp { None } else { Some(a) }
    }) {
        for ckpt in [false, true] {
            // For each allocator setting, the largest fitting micro-batch.
            let mut found = vec![false; targets.len()];
            for &m in &micro {
                if found.iter().all(|f| *f) {
                    break;
                }
                let cfg = StepConfig {
                    batch: m,
                    accum_steps: (effective / m).min(2),
                    amp,
                    checkpoint_activations: ckpt,
                    ..config.clone()
                };
                let trace = record(workload, &cfg)?;
                for (t, tgt) in targets.iter().enumerate() {
                    if found[t] {
                        continue;
                    }
                    let p = evaluate(&trace, tgt)?;
                    if p.fits {
                        found[t] = true;
                        let k = effective / m;
                        fitting.push(Candidate {
                            micro_batch: m,
                            accum_steps: k,
                            amp: amp.map(|a| a.name()),
                            checkpoint_activations: ckpt,
                            alloc_conf: p.alloc_conf.clone(),
                            fits: true,
                            peak_reserved_bytes: p.peak_reserved_bytes,
                            peak_allocated_bytes: p.peak_allocated_bytes,
                            relative_cost: relative_cost(k, ckpt),
                        });
                    } else if best_effort.as_ref().is_none_or(|b| p.peak_reserved_bytes < b.peak_reserved_bytes) {
                        best_effort = Some(p);
                    }
                }
            }
        }
    }
    let changes = |c: &Candidate| {
        usize::from(c.amp != config.amp.map(|a| a.name()))
            + usize::from(c.checkpoint_activations != config.checkpoint_activations)
            + usize::from(c.alloc_conf != target.config.to_string())
    };
    fitting.sort_by(|a, b| {
        a.relative_cost
            .total_cmp(&b.relative_cost)
            .then(changes(a).cmp(&changes(b)))
            .then(a.peak_reserved_bytes.cmp(&b.peak_reserved_bytes))
    });
    let advice = if fitting.is_empty() {
        Some(nothing_fits_advice(workload, config, target, best_effort.as_ref())?)
    } else {
        None
    };
    Ok(TargetBatchPlan { target_batch: effective, fitting, advice })
}

/// The smallest change that makes the leanest plan (micro-batch 1, bf16, checkpointing) fit: a
/// larger card from the catalogue, or a smaller model when none is large enough.
fn nothing_fits_advice(
    workload: &dyn Workload,
    config: &StepConfig,
    target: &Target,
    leanest: Option<&MemoryPlan>,
) -> Result<String, PlanError> {
    let lean = StepConfig {
        batch: 1,
        accum_steps: 1,
        amp: Some(AmpMode::Bf16),
        checkpoint_activations: true,
        ..config.clone()
    };
    let trace = record(workload, &lean)?;
    let mut cards: Vec<_> = ferrite_memory::GpuProfile::catalogue()
        .into_iter()
        .filter(|p| p.total_bytes > target.profile.total_bytes)
        .collect();
    cards.sort_by_key(|p| p.total_bytes);
    for card in cards {
        let t = Target { profile: card.clone(), ..target.clone() };
        if evaluate(&trace, &t)?.fits {
            return Ok(format!(
                "nothing fits on {}; the smallest change: micro-batch 1 with --amp bf16 and --checkpoint-activations on sim:{} ({})",
                target.device_name(),
                card.key,
                card.name
            ));
        }
    }
    let need = leanest.map_or(0, |p| p.peak_reserved_bytes);
    Ok(format!(
        "nothing fits on {} nor on any card of the catalogue: the leanest plan still needs {} bytes; the model states (parameters, gradients, optimizer state) must shrink: a smaller model, or an optimizer with less state (--optimizer sgd)",
        target.device_name(),
        need
    ))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recompute_and_micro_steps_cost_more() {
        assert_eq!(relative_cost(1, false), 1.0);
        assert!((relative_cost(1, true) - 4.0 / 3.0).abs() < 1e-12);
        assert!(relative_cost(4, false) > relative_cost(2, false));
    }
}
