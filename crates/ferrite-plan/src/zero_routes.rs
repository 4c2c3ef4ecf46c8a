//! The way forward's sharded routes: for ZeRO-1, ZeRO-2 and ZeRO-3 (the stages ferrite runs), the
//! smallest number of the target's GPUs on which the step fits, as [`Variant`]s for
//! [`crate::way_forward`]. ZeRO-3 is offered only on fewer GPUs than ZeRO-1/2 need (where it fits
//! and they do not): on as many GPUs it fits too, but gathers every block's weights twice a step
//! — half as much communication again — for memory the step does not need; and only for models
//! with blocks to shard (`ferrite_optim::zero3_units`).
//!
//! Why search the GPU count here and not try a fixed list: the answer users want is "how many of
//! these cards" — the smallest count, since each card costs — and a fixed list (2, 4, 8) would
//! answer 8 where 5 suffices. Each count is judged by its fullest rank's planned step
//! ([`crate::sharded_step`]), under the leanest settings the way forward tries (micro-batch 1,
//! bf16 autocast, activation checkpointing) and under the run's own settings; the way forward then
//! searches each count's settings like any route. A rank's peak falls as the count grows (its
//! shard and its share of the batch shrink), so the count is found by bisection.
use std::sync::Arc;

use crate::PlanError;
use crate::evaluate::{Target, evaluate};
use crate::rank_plan::{ranks_to_plan, trainable_sizes};
use crate::sharded_step::{DataParallel, RankLayout, fullest_rank};
use crate::trace::record_rank;
use crate::way_forward::Variant;
use crate::workload::{AmpMode, StepConfig, Workload};

/// Most GPUs a sharded route asks for.
pub const MAX_ZERO_GPUS: usize = 64;

/// For ZeRO-1, ZeRO-2 and (on fewer GPUs than they need) ZeRO-3: the smallest GPU count that fits with the leanest settings, and the
/// smallest that fits with the run's own settings when larger — as variants sharing
/// `workload`, for an effective batch of `effective` shared out over the GPUs.
pub fn zero_variants(
    workload: Arc<dyn Workload>,
    config: &StepConfig,
    target: &Target,
    effective: usize,
) -> Result<Vec<Variant>, PlanError> {
    config.check()?;
    let numels = trainable_sizes(&*workload, config)?;
    let mut out = Vec::new();
    // The fewest GPUs ZeRO-1 or ZeRO-2 fits on: ZeRO-3 must do with fewer to be worth its traffic.
    let mut fewest_1_2: Option<usize> = None;
    for mode in [DataParallel::Zero1, DataParallel::Zero2, DataParallel::Zero3] {
        let most = match mode {
            DataParallel::Zero3 if !has_blocks(&*workload, config)? => continue,
            DataParallel::Zero3 => fewest_1_2.map_or(MAX_ZERO_GPUS, |n| n - 1),
            _ => MAX_ZERO_GPUS,
        };
        let fits_rank = |gpus: usize, lean: bool, rank: usize| -> Result<bool, PlanError> {
            let per_rank = effective.div_ceil(gpus).max(1);
            let step = if lean {
                StepConfig {
                    batch: 1,
                    accum_steps: per_rank.min(2),
                    amp: Some(config.amp.unwrap_or(AmpMode::Bf16)),
                    checkpoint_activations: true,
                    ..config.clone()
                }
            } else {
                let micro = (1..=config.batch.min(per_rank)).rev().find(|m| per_rank.is_multiple_of(*m)).unwrap_or(1);
                StepConfig { batch: micro, accum_steps: (per_rank / micro).min(2), ..config.clone() }
            };
            let layout = RankLayout { mode, world: gpus, rank };
            Ok(evaluate(&record_rank(&*workload, &step, layout)?, target)?.fits)
        };
        // The bisection judges the fullest rank (one trace per count); the count it finds is then
        // confirmed on every rank `plan --zero` plans — a rank with fewer, larger pieces can
        // reserve more — moving up one GPU at a time until all of them fit.
        let fits = |gpus: usize, lean: bool| fits_rank(gpus, lean, fullest_rank(&numels, gpus));
        let settle = |found: Option<usize>, lean: bool| -> Result<Option<usize>, PlanError> {
            let Some(mut gpus) = found else { return Ok(None) };
            while gpus <= most {
                let mut all = true;
                for rank in ranks_to_plan(&numels, gpus, mode) {
                    if !fits_rank(gpus, lean, rank)? {
                        all = false;
                        break;
                    }
                }
                if all {
                    return Ok(Some(gpus));
                }
                gpus += 1;
            }
            Ok(None)
        };
        let Some(lean) = settle(smallest(2, most, |n| fits(n, true))?, true)? else { continue };
        if mode != DataParallel::Zero3 {
            fewest_1_2 = Some(fewest_1_2.map_or(lean, |f| f.min(lean)));
        }
        let plain =
            settle(if fits(lean, false)? { Some(lean) } else { smallest(lean + 1, most, |n| fits(n, false))? }, false)?;
        let mut counts = vec![lean];
        counts.extend(plain.filter(|p| *p != lean));
        for gpus in counts {
            out.push(Variant {
                label: format!("{} over {gpus} GPUs", mode.name()),
                flags: std::iter::once("--distributed".to_string()).chain(mode.train_flags()).collect(),
                workload: workload.clone(),
                gpus,
                adapters_only: false,
                compute: 1.0,
                sharding: Some(mode),
            });
        }
    }
    Ok(out)
}

/// Whether the model has blocks ZeRO-3 can gather one at a time (the units training cuts).
fn has_blocks(workload: &dyn Workload, config: &StepConfig) -> Result<bool, PlanError> {
    let _guard = crate::trace::plan_lock();
    let model = workload.build(config, &ferrite_tensor::Device::Meta)?;
    let names: Vec<String> =
        model.named_parameters().into_iter().filter(|(_, t)| t.requires_grad()).map(|(n, _)| n).collect();
    Ok(!ferrite_optim::zero3_units(&names).is_empty())
}

/// The smallest `n` in `lo..=hi` with `ok(n)`, assuming `ok` stays true once it is (`None` when
/// `ok(hi)` is false).
fn smallest(
    lo: usize,
    hi: usize,
    mut ok: impl FnMut(usize) -> Result<bool, PlanError>,
) -> Result<Option<usize>, PlanError> {
    if lo > hi || !ok(hi)? {
        return Ok(None);
    }
    let (mut lo, mut hi) = (lo, hi);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if ok(mid)? {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok(Some(lo))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Builtin, plan_ranks, way_forward};

    /// 12,156,010 parameters: weights, gradients and AdamW moments (16 B/param) exceed 170 MiB.
    fn mlp() -> Builtin {
        Builtin::Mlp { input: [1, 8, 8], hidden: 2000, layers: 4, classes: 10, dropout: 0.0 }
    }

    #[test]
    fn zero2_over_the_fewest_cards_is_the_way_forward_when_the_model_states_do_not_fit() {
        let target = Target::parse("sim:170MiB", Default::default()).unwrap();
        let config = StepConfig::new(8);
        let w: Arc<dyn Workload> = Arc::new(mlp());
        let variants = zero_variants(w.clone(), &config, &target, 8).unwrap();
        // ZeRO-1 keeps the full gradients in DDP's buckets: never below one GPU's 16 B/param.
        assert!(variants.iter().all(|v| v.sharding != Some(DataParallel::Zero1)), "{variants:?}");
        let count = |mode| variants.iter().filter(|v| v.sharding == Some(mode)).map(|v| v.gpus).min();
        let fewest = count(DataParallel::Zero2).expect("ZeRO-2 fits over some cards");
        // ZeRO-3 (the MLP's linears are its blocks) only where it needs fewer cards than ZeRO-2,
        // and then it is offered.
        if let Some(z3) = count(DataParallel::Zero3) {
            assert!(z3 < fewest, "{variants:?}");
        }
        // One card fewer does not fit, even with the leanest settings.
        let lean = StepConfig {
            batch: 1,
            accum_steps: 2,
            amp: Some(AmpMode::Bf16),
            checkpoint_activations: true,
            ..config.clone()
        };
        let fewer = plan_ranks(&*w, &lean, &target, DataParallel::Zero2, fewest - 1, None).unwrap();
        assert!(!fewer.fits, "{fewer:?}");
        let forward = way_forward(&*w, &variants, &config, &target, None).unwrap();
        assert!(!forward.routes.is_empty());
        for r in &forward.routes {
            let mode = r.data_parallel.expect("every route here is sharded");
            assert!(matches!(mode, DataParallel::Zero2 | DataParallel::Zero3), "{r:?}");
            assert_eq!(r.launcher, format!("mpirun -np {}", r.gpus));
            // The promised peak is the planned rank's, replanned as `plan --zero 2` plans it.
            let step = StepConfig {
                batch: r.micro_batch,
                accum_steps: r.accum_steps.min(2),
                amp: r.amp.map(|a| if a == "f16" { AmpMode::F16 } else { AmpMode::Bf16 }),
                checkpoint_activations: r.checkpoint_activations,
                ..config.clone()
            };
            let rank = r.planned_rank.unwrap();
            let again = plan_ranks(&*w, &step, &target, mode, r.gpus, Some(&[rank][..])).unwrap();
            assert_eq!(again.peak_reserved_bytes, r.peak_reserved_bytes, "{r:?}");
        }
    }

    #[test]
    fn zero3_over_fewer_cards_than_zero2_needs_and_never_for_a_model_without_blocks() {
        // ZeRO-3 also shards the weights: on a card where ZeRO-2 needs n GPUs, it fits on fewer.
        let target = Target::parse("sim:120MiB", Default::default()).unwrap();
        let config = StepConfig::new(8);
        let w: Arc<dyn Workload> = Arc::new(mlp());
        let variants = zero_variants(w.clone(), &config, &target, 8).unwrap();
        let fewest = |mode| variants.iter().filter(|v| v.sharding == Some(mode)).map(|v| v.gpus).min();
        let (z2, z3) = (fewest(DataParallel::Zero2), fewest(DataParallel::Zero3));
        let z3 = z3.unwrap_or_else(|| panic!("ZeRO-3 fits on fewer cards than ZeRO-2 ({z2:?}): {variants:?}"));
        assert!(z2.is_none_or(|z2| z3 < z2), "{variants:?}");
        let v = variants.iter().find(|v| v.sharding == Some(DataParallel::Zero3)).unwrap();
        assert_eq!(v.flags, ["--distributed", "--zero", "3"]);
        // ZeRO-2 does not fit on ZeRO-3's count, even with the leanest settings.
        let lean = StepConfig {
            batch: 1,
            accum_steps: 8usize.div_ceil(z3).min(2),
            amp: Some(AmpMode::Bf16),
            checkpoint_activations: true,
            ..config.clone()
        };
        assert!(!plan_ranks(&*w, &lean, &target, DataParallel::Zero2, z3, None).unwrap().fits);
        assert!(plan_ranks(&*w, &lean, &target, DataParallel::Zero3, z3, None).unwrap().fits);
        // An LSTM has no repeated blocks to gather one at a time: no ZeRO-3 route.
        let lstm: Arc<dyn Workload> =
            Arc::new(Builtin::Lstm { vocab: 20000, hidden: 1024, layers: 2, seq: 32, dropout: 0.0 });
        let small = Target::parse("sim:200MiB", Default::default()).unwrap();
        let v = zero_variants(lstm, &StepConfig::new(8), &small, 8).unwrap();
        assert!(v.iter().all(|v| v.sharding != Some(DataParallel::Zero3)), "{v:?}");
    }

    #[test]
    fn bisection_finds_the_smallest_count_and_reports_none_when_even_the_most_fail() {
        let mut asked = Vec::new();
        let got = smallest(2, 64, |n| {
            asked.push(n);
            Ok(n >= 5)
        })
        .unwrap();
        assert_eq!(got, Some(5));
        assert!(asked.len() <= 8, "bisection, not a scan: {asked:?}");
        assert_eq!(smallest(2, 64, |_| Ok(false)).unwrap(), None);
        assert_eq!(smallest(2, 64, |_| Ok(true)).unwrap(), Some(2));
        assert_eq!(smallest(9, 8, |_| Ok(true)).unwrap(), None);
    }
}
