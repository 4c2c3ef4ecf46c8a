//! "It does not fit — what now?": every way ferrite can run the step that fits on the target
//! card, each planned (not estimated), ranked, and written as the flags that run it.
//!
//! Why one search for two questions: a step that does not fit and `--target-batch N` ask the same
//! thing — which settings reach this effective batch on this card — so both answers come from
//! [`way_forward`]. The planner varies what it can build itself (micro-batch with accumulation,
//! autocast, activation checkpointing, allocator settings); changes that need another model or
//! another kind of run — LoRA adapters, sharding over several GPUs — come in as [`Variant`]s that
//! the caller builds, each a [`Workload`] the planner runs through the same step on `meta`; a
//! sharded variant (ZeRO-1/2/3 over N GPUs, [`zero_variants`] finds the smallest N) runs the step of
//! its fullest rank ([`crate::sharded_step`]), with the effective batch shared out over the ranks.
//!
//! Ranking: first what the change does to the training — the same model on one GPU, then the
//! same model on more GPUs, then adapters only (a different fine-tuning) — then compute per
//! effective batch ([`Route::relative_cost`]), then the number of changes, then the peak. A route
//! that changes a superset of what a cheaper fitting route changes is left out.
use std::sync::Arc;

use ferrite_memory::format_size;
use serde::Serialize;

use crate::PlanError;
use crate::evaluate::{MemoryPlan, Target, evaluate};
use crate::rank_plan::trainable_sizes;
use crate::sharded_step::{DataParallel, RankLayout, fullest_rank};
use crate::trace::{record, record_rank};
use crate::workload::{AmpMode, StepConfig, Workload};

/// The allocator settings the search tries besides the run's own.
pub(crate) const ALLOC_OPTIONS: [&str; 2] = ["expandable_segments:True", "max_split_size_mb:128"];

/// Micro-batch sizes tried per setting (the largest divisors of the effective batch).
const MAX_MICRO_OPTIONS: usize = 16;

/// A change the caller can run but the planner cannot build by itself: another model (LoRA
/// adapters on frozen weights) or another kind of run (sharded over several GPUs).
#[derive(Clone)]
pub struct Variant {
    /// What it changes, in words: `LoRA r8 on q_proj,v_proj, base weights in bf16`.
    pub label: String,
    /// The `ferrite train` flags that make the change.
    pub flags: Vec<String>,
    /// The model with the change; the planner runs its step as any other.
    pub workload: Arc<dyn Workload>,
    /// GPUs the change runs on; what is planned is one GPU's peak.
    pub gpus: usize,
    /// Whether the run then trains adapters only (ranked after every route that trains the model).
    pub adapters_only: bool,
    /// Compute per effective batch relative to the unchanged step (LoRA: about 2/3, no weight
    /// gradients; sharding: 1, the same work spread over the GPUs).
    pub compute: f64,
    /// Data parallelism over the `gpus` (ZeRO-1/2/3): the planned peak is one rank's, the fullest.
    pub sharding: Option<DataParallel>,
}

impl std::fmt::Debug for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Variant")
            .field("label", &self.label)
            .field("flags", &self.flags)
            .field("gpus", &self.gpus)
            .field("adapters_only", &self.adapters_only)
            .field("compute", &self.compute)
            .field("sharding", &self.sharding)
            .finish()
    }
}

/// One planned way to run the step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Route {
    /// What differs from the run as asked, in words (empty: the run as asked).
    pub changes: Vec<String>,
    /// Every step flag of `ferrite train` for this route (`--batch-size`, `--accum-steps`,
    /// `--amp`, `--checkpoint-activations`, `--alloc-conf`, and the variant's).
    pub flags: Vec<String>,
    pub micro_batch: usize,
    pub accum_steps: usize,
    pub amp: Option<&'static str>,
    pub checkpoint_activations: bool,
    /// Allocator settings of the route (empty: the defaults).
    pub alloc_conf: String,
    /// The variant's label, if the route uses one.
    pub variant: Option<String>,
    pub gpus: usize,
    /// How the GPUs share the model states, for a route over several (`ZeRO-1`, `ZeRO-2`).
    pub data_parallel: Option<DataParallel>,
    /// For a sharded route: the rank whose peak is given (the one with the most shard pieces).
    pub planned_rank: Option<usize>,
    /// What starts the command: `mpirun -np N` for a route over several GPUs, else empty.
    pub launcher: String,
    pub adapters_only: bool,
    pub fits: bool,
    /// Predicted peak reserved on one GPU.
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    /// What the allocator may use minus the peak (negative: missing).
    pub headroom_bytes: i64,
    /// Compute per effective batch relative to one plain step of the whole batch on one GPU:
    /// 4/3 with checkpointing (one more forward in backward), plus 2 % per extra micro-step,
    /// times the variant's own factor. The optimizer steps once per effective batch in every row.
    pub relative_cost: f64,
}

/// The answer: the fitting routes ranked, or the closest one and what else would help.
#[derive(Debug, Clone, Serialize)]
pub struct WayForward {
    pub device: String,
    pub usable_bytes: u64,
    pub effective_batch: usize,
    /// Routes that fit, best first.
    pub routes: Vec<Route>,
    /// When nothing fits: the route with the lowest peak.
    pub closest: Option<Route>,
    /// When nothing fits: the smallest card of the catalogue on which the closest route fits.
    pub larger_card: Option<String>,
    /// Settings planned (each a recorded step).
    pub steps_planned: usize,
}

impl WayForward {
    /// One paragraph for when nothing fits (None when something does).
    pub fn nothing_fits(&self) -> Option<String> {
        if !self.routes.is_empty() {
            return None;
        }
        let closest = self.closest.as_ref()?;
        let how = if closest.changes.is_empty() { "as asked".to_string() } else { closest.changes.join(", ") };
        let missing = format_size(closest.headroom_bytes.unsigned_abs());
        Some(match &self.larger_card {
            Some(card) => format!(
                "nothing ferrite can run fits on {}: the closest plan ({how}) needs {} per GPU, {missing} more than the {} the allocator may use; it fits on {card}",
                self.device,
                format_size(closest.peak_reserved_bytes),
                format_size(self.usable_bytes),
            ),
            None => format!(
                "nothing ferrite can run fits on {} nor on any card of the catalogue: the closest plan ({how}) needs {} per GPU, {missing} more than the {} the allocator may use; the model states (parameters, gradients, optimizer state) must shrink: a smaller model, adapters (--lora-rank), or an optimizer with less state (--optimizer sgd)",
                self.device,
                format_size(closest.peak_reserved_bytes),
                format_size(self.usable_bytes),
            ),
        })
    }
}

/// Relative compute of one effective batch; see [`Route::relative_cost`].
pub fn relative_cost(accum_steps: usize, checkpoint: bool) -> f64 {
    (if checkpoint { 4.0 / 3.0 } else { 1.0 }) + 0.02 * (accum_steps.saturating_sub(1)) as f64
}

/// One point of the search before it is planned.
#[derive(Clone, Copy)]
struct Setting {
    variant: Option<usize>,
    micro: usize,
    amp: Option<AmpMode>,
    checkpoint: bool,
}

/// Every way to run `config`'s step (same effective batch: `config.batch × config.accum_steps`,
/// or `effective` when given) that fits on `target`, and the variants' ways, ranked.
///
/// For each (variant, autocast, checkpointing, allocator setting) the largest micro-batch that
/// divides the effective batch and fits is kept.
pub fn way_forward(
    workload: &dyn Workload,
    variants: &[Variant],
    config: &StepConfig,
    target: &Target,
    effective: Option<usize>,
) -> Result<WayForward, PlanError> {
    config.check()?;
    let effective = effective.unwrap_or(config.batch * config.accum_steps);
    if effective == 0 {
        return Err(PlanError::setting("--target-batch 0", "the effective batch must hold at least one sample"));
    }
    for v in variants {
        if v.gpus == 0 {
            return Err(PlanError::setting(format!("variant `{}`", v.label), "runs on at least one GPU"));
        }
    }
    let mut targets = vec![target.clone()];
    for opt in ALLOC_OPTIONS {
        let mut cfg = target.config.clone();
        cfg.apply(opt)?;
        if cfg != target.config {
            targets.push(Target { config: cfg, ..target.clone() });
        }
    }
    // The run's own precision first, then the others once each.
    let amps: Vec<Option<AmpMode>> = [config.amp, Some(AmpMode::Bf16), Some(AmpMode::F16)]
        .into_iter()
        .enumerate()
        .filter_map(|(i, a)| if i > 0 && a == config.amp { None } else { Some(a) })
        .collect();
    let checkpoints: Vec<bool> = if config.checkpoint_activations { vec![true] } else { vec![false, true] };
    let variant_choices: Vec<Option<usize>> = std::iter::once(None).chain((0..variants.len()).map(Some)).collect();

    let mut routes = Vec::new();
    let mut closest: Option<(Route, Setting, usize)> = None;
    let mut steps_planned = 0;
    for &variant in &variant_choices {
        let w: &dyn Workload = match variant {
            Some(i) => &*variants[i].workload,
            None => workload,
        };
        let (per_rank, layout) = rank_share(w, variant.map(|i| &variants[i]), config, effective)?;
        let micro = micro_options(per_rank);
        for &amp in &amps {
            for &checkpoint in &checkpoints {
                let mut found = vec![false; targets.len()];
                for &m in &micro {
                    if found.iter().all(|f| *f) {
                        break;
                    }
                    let setting = Setting { variant, micro: m, amp, checkpoint };
                    // Accumulation's memory is the same for any number of micro-steps from 2 on.
                    let step = StepConfig {
                        batch: m,
                        accum_steps: (per_rank / m).min(2),
                        amp,
                        checkpoint_activations: checkpoint,
                        ..config.clone()
                    };
                    let trace = match layout {
                        Some(l) => record_rank(w, &step, l)?,
                        None => record(w, &step)?,
                    };
                    steps_planned += 1;
                    for (t, tgt) in targets.iter().enumerate() {
                        if found[t] {
                            continue;
                        }
                        let p = evaluate(&trace, tgt)?;
                        let route = route_of(&p, setting, variants, config, target, effective, per_rank, layout);
                        if p.fits {
                            found[t] = true;
                            routes.push(route);
                        } else if closest
                            .as_ref()
                            .is_none_or(|(c, _, _)| route.peak_reserved_bytes < c.peak_reserved_bytes)
                        {
                            closest = Some((route, setting, t));
                        }
                    }
                }
            }
        }
    }
    let routes = rank(routes);
    let (closest, larger_card) = match (routes.is_empty(), closest) {
        (true, Some((route, setting, t))) => {
            let card = larger_card(workload, variants, config, &targets[t], setting, effective)?;
            (Some(route), card)
        }
        _ => (None, None),
    };
    Ok(WayForward {
        device: target.device_name(),
        usable_bytes: target.usable_bytes(),
        effective_batch: effective,
        routes,
        closest,
        larger_card,
        steps_planned,
    })
}

/// The micro-batch sizes tried for an effective batch of `per_rank` on one GPU: its largest divisors.
fn micro_options(per_rank: usize) -> Vec<usize> {
    let mut micro: Vec<usize> = (1..=per_rank).filter(|m| per_rank.is_multiple_of(*m)).collect();
    micro.reverse();
    micro.truncate(MAX_MICRO_OPTIONS);
    micro
}

/// One GPU's share of the effective batch (`effective` over the variant's ranks, rounded up), and
/// for a sharded variant the rank planned: its fullest.
fn rank_share(
    w: &dyn Workload,
    variant: Option<&Variant>,
    config: &StepConfig,
    effective: usize,
) -> Result<(usize, Option<RankLayout>), PlanError> {
    match variant {
        Some(v) if v.gpus > 1 || v.sharding.is_some() => {
            let mode = v.sharding.unwrap_or(DataParallel::Ddp);
            let rank = fullest_rank(&trainable_sizes(w, config)?, v.gpus);
            Ok((effective.div_ceil(v.gpus), Some(RankLayout { mode, world: v.gpus, rank })))
        }
        _ => Ok((effective, None)),
    }
}

/// A planned setting as a route: its changes in words and its flags. `per_rank` is one GPU's share
/// of the `effective` batch.
#[allow(clippy::too_many_arguments)]
fn route_of(
    p: &MemoryPlan,
    s: Setting,
    variants: &[Variant],
    config: &StepConfig,
    target: &Target,
    effective: usize,
    per_rank: usize,
    layout: Option<RankLayout>,
) -> Route {
    let accum = per_rank / s.micro;
    let variant = s.variant.map(|i| &variants[i]);
    let gpus = variant.map_or(1, |v| v.gpus);
    let mut changes = Vec::new();
    if let Some(v) = variant {
        changes.push(v.label.clone());
        if per_rank * gpus != effective {
            changes.push(format!("effective batch {} ({per_rank} per GPU)", per_rank * gpus));
        }
    }
    if s.micro != config.batch || accum != config.accum_steps {
        changes.push(if accum > 1 {
            format!("micro-batch {} x {accum} accumulation steps", s.micro)
        } else {
            format!("batch {}", s.micro)
        });
    }
    if s.amp != config.amp {
        changes.push(match s.amp {
            Some(AmpMode::Bf16) => "bf16 autocast".to_string(),
            Some(AmpMode::F16) => "f16 autocast with loss scaling".to_string(),
            None => "no autocast".to_string(),
        });
    }
    if s.checkpoint != config.checkpoint_activations {
        changes.push("activation checkpointing".into());
    }
    let alloc_conf = p.alloc_conf.clone();
    if alloc_conf != target.config.to_string() {
        changes.push(format!("allocator {alloc_conf}"));
    }
    let mut flags = vec!["--batch-size".to_string(), s.micro.to_string()];
    if accum > 1 {
        flags.extend(["--accum-steps".to_string(), accum.to_string()]);
    }
    if let Some(a) = s.amp {
        flags.extend(["--amp".to_string(), a.name().to_string()]);
    }
    if s.checkpoint {
        flags.push("--checkpoint-activations".into());
    }
    if !alloc_conf.is_empty() {
        flags.extend(["--alloc-conf".to_string(), alloc_conf.clone()]);
    }
    if let Some(v) = variant {
        flags.extend(v.flags.iter().cloned());
    }
    Route {
        changes,
        flags,
        micro_batch: s.micro,
        accum_steps: accum,
        amp: s.amp.map(|a| a.name()),
        checkpoint_activations: s.checkpoint,
        alloc_conf,
        variant: variant.map(|v| v.label.clone()),
        gpus,
        data_parallel: layout.map(|l| l.mode),
        planned_rank: layout.map(|l| l.rank),
        launcher: if gpus > 1 { format!("mpirun -np {gpus}") } else { String::new() },
        adapters_only: variant.is_some_and(|v| v.adapters_only),
        fits: p.fits,
        peak_reserved_bytes: p.peak_reserved_bytes,
        peak_allocated_bytes: p.peak_allocated_bytes,
        headroom_bytes: p.headroom_bytes,
        relative_cost: relative_cost(accum, s.checkpoint) * variant.map_or(1.0, |v| v.compute),
    }
}

/// Whether `a` makes `b` pointless: it fits, changes a subset of what `b` changes (with at least
/// as large a micro-batch) and costs no more.
fn dominates(a: &Route, b: &Route) -> bool {
    let has = |r: &Route, prefix: &str| r.changes.iter().any(|c| c.starts_with(prefix));
    let kinds_subset =
        ["micro-batch", "batch ", "bf16 autocast", "f16 autocast", "no autocast", "activation", "allocator"]
            .iter()
            .all(|k| !has(a, k) || has(b, k));
    a != b
        && a.fits
        && a.variant == b.variant
        && kinds_subset
        && (a.amp == b.amp || !has(a, "bf16 autocast") && !has(a, "f16 autocast") && !has(a, "no autocast"))
        && (a.alloc_conf == b.alloc_conf || !has(a, "allocator"))
        && a.micro_batch >= b.micro_batch
        && a.relative_cost <= b.relative_cost
        && a.changes.len() < b.changes.len()
}

/// Best first: what the training becomes, then compute, then fewer changes, then lower peak;
/// routes another fitting route makes pointless are dropped.
fn rank(routes: Vec<Route>) -> Vec<Route> {
    let mut kept: Vec<Route> = routes.iter().filter(|b| !routes.iter().any(|a| dominates(a, b))).cloned().collect();
    kept.sort_by(|a, b| {
        a.adapters_only
            .cmp(&b.adapters_only)
            .then(a.gpus.cmp(&b.gpus))
            .then(a.relative_cost.total_cmp(&b.relative_cost))
            .then(a.changes.len().cmp(&b.changes.len()))
            .then(a.peak_reserved_bytes.cmp(&b.peak_reserved_bytes))
    });
    kept
}

/// The smallest card of the catalogue, larger than the target, on which `setting` fits.
fn larger_card(
    workload: &dyn Workload,
    variants: &[Variant],
    config: &StepConfig,
    target: &Target,
    s: Setting,
    effective: usize,
) -> Result<Option<String>, PlanError> {
    let w: &dyn Workload = match s.variant {
        Some(i) => &*variants[i].workload,
        None => workload,
    };
    let (per_rank, layout) = rank_share(w, s.variant.map(|i| &variants[i]), config, effective)?;
    let step = StepConfig {
        batch: s.micro,
        accum_steps: (per_rank / s.micro).min(2),
        amp: s.amp,
        checkpoint_activations: s.checkpoint,
        ..config.clone()
    };
    let trace = match layout {
        Some(l) => record_rank(w, &step, l)?,
        None => record(w, &step)?,
    };
    let mut cards: Vec<_> = ferrite_memory::GpuProfile::catalogue()
        .into_iter()
        .filter(|p| p.total_bytes > target.profile.total_bytes)
        .collect();
    cards.sort_by_key(|p| p.total_bytes);
    for card in cards {
        let t = Target { profile: card.clone(), ..target.clone() };
        if evaluate(&trace, &t)?.fits {
            return Ok(Some(format!("sim:{} ({})", card.key, card.name)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(changes: &[&str], micro: usize, cost: f64, fits: bool) -> Route {
        Route {
            changes: changes.iter().map(|c| c.to_string()).collect(),
            flags: vec![],
            micro_batch: micro,
            accum_steps: 1,
            amp: changes.iter().any(|c| c.starts_with("bf16")).then_some("bf16"),
            checkpoint_activations: changes.iter().any(|c| c.starts_with("activation")),
            alloc_conf: String::new(),
            variant: None,
            gpus: 1,
            data_parallel: None,
            planned_rank: None,
            launcher: String::new(),
            adapters_only: false,
            fits,
            peak_reserved_bytes: 1,
            peak_allocated_bytes: 1,
            headroom_bytes: 0,
            relative_cost: cost,
        }
    }

    #[test]
    fn recompute_and_micro_steps_cost_more() {
        assert_eq!(relative_cost(1, false), 1.0);
        assert!((relative_cost(1, true) - 4.0 / 3.0).abs() < 1e-12);
        assert!(relative_cost(4, false) > relative_cost(2, false));
    }

    #[test]
    fn a_cheaper_subset_of_changes_drops_the_superset() {
        let bf16 = route(&["bf16 autocast"], 8, 1.0, true);
        let both = route(&["bf16 autocast", "activation checkpointing"], 8, 4.0 / 3.0, true);
        let ckpt_small = route(&["micro-batch 2 x 4 accumulation steps", "activation checkpointing"], 2, 1.4, true);
        let ranked = rank(vec![both.clone(), ckpt_small.clone(), bf16.clone()]);
        assert_eq!(ranked, vec![bf16, ckpt_small]);
    }

    #[test]
    fn a_cheaper_superset_is_kept() {
        // A larger micro-batch thanks to an extra change is cheaper: both stay, cheaper first.
        let small = route(&["micro-batch 2 x 4 accumulation steps"], 2, 1.06, true);
        let big = route(&["micro-batch 8 x 1 accumulation steps", "bf16 autocast"], 8, 1.0, true);
        assert_eq!(rank(vec![small.clone(), big.clone()]), vec![big, small]);
    }

    #[test]
    fn adapters_rank_after_the_same_model() {
        let mut lora = route(&["LoRA r8"], 8, 0.67, true);
        lora.adapters_only = true;
        lora.variant = Some("LoRA r8".into());
        let ckpt = route(&["activation checkpointing"], 8, 4.0 / 3.0, true);
        assert_eq!(rank(vec![lora.clone(), ckpt.clone()]), vec![ckpt, lora]);
    }
}
