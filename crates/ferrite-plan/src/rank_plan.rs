//! The plan of every rank of a data-parallel run (`ferrite plan --zero 1|2 --gpus-per-node N`):
//! each rank's step recorded on `meta` ([`crate::sharded_step`]) and replayed on the target GPU.
//!
//! Why every rank and not one: ZeRO's flat partition gives every rank but the last ⌈P/W⌉ values,
//! cut into a different number of pieces (one allocation each), and the last rank fewer values, so
//! the ranks' peaks differ slightly; the run fits only if its fullest rank does. Beyond
//! [`MAX_RANKS_PLANNED`] ranks, rank 0, the fullest rank and the last one are planned (the others
//! own as many values as rank 0, in at most as many pieces as the fullest).
use serde::Serialize;

use crate::PlanError;
use crate::evaluate::{Target, evaluate};
use crate::model_states::{FerriteModelStates, ferrite_model_states};
use crate::sharded_step::{DataParallel, RankLayout, fullest_rank, trainable_numels};
use crate::trace::{plan_lock, record_rank};
use crate::workload::{StepConfig, Workload};
use ferrite_optim::FlatPartition;
use ferrite_tensor::Device;

/// Most ranks planned one by one.
pub const MAX_RANKS_PLANNED: usize = 16;

/// One rank's predicted peak.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankPeak {
    pub rank: usize,
    /// Trainable values whose optimizer state (and at ZeRO-2 gradient) this rank keeps.
    pub shard_values: u64,
    /// Pieces of parameters those values come in (one shard tensor each).
    pub shard_pieces: usize,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub fits: bool,
    pub headroom_bytes: i64,
    /// Model states at their most (requested bytes): weights (the f32 shards, ferrite's master
    /// copy of the partition, included), gradients (DDP's buckets included), optimizer state.
    pub model_states: FerriteModelStates,
}

/// Every rank's plan of one data-parallel layout.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShardedPlan {
    pub mode: DataParallel,
    pub world: usize,
    pub device: String,
    pub usable_bytes: u64,
    /// The ranks planned (all of them up to [`MAX_RANKS_PLANNED`]).
    pub ranks: Vec<RankPeak>,
    /// The rank with the highest peak reserved.
    pub max_rank: usize,
    pub peak_reserved_bytes: u64,
    /// Whether every rank fits.
    pub fits: bool,
}

impl ShardedPlan {
    /// The planned rank with the highest peak.
    pub fn max(&self) -> Option<&RankPeak> {
        self.ranks.iter().find(|r| r.rank == self.max_rank)
    }
}

/// The trainable parameter sizes of `workload`'s model (built on `meta`).
pub fn trainable_sizes(workload: &dyn Workload, config: &StepConfig) -> Result<Vec<usize>, PlanError> {
    let _guard = plan_lock();
    let model = workload.build(config, &Device::Meta)?;
    Ok(trainable_numels(&*model))
}

/// The ranks [`plan_ranks`] plans for `world` ranks of a model with these trainable sizes.
pub fn ranks_to_plan(numels: &[usize], world: usize, mode: DataParallel) -> Vec<usize> {
    if mode == DataParallel::Ddp {
        // Every rank holds the same.
        return vec![0];
    }
    if world <= MAX_RANKS_PLANNED {
        return (0..world).collect();
    }
    let mut r = vec![0, fullest_rank(numels, world), world - 1];
    r.sort_unstable();
    r.dedup();
    r
}

/// Plan `ranks` (all when `None`, see [`ranks_to_plan`]) of a `world`-rank run of `mode`.
pub fn plan_ranks(
    workload: &dyn Workload,
    config: &StepConfig,
    target: &Target,
    mode: DataParallel,
    world: usize,
    ranks: Option<&[usize]>,
) -> Result<ShardedPlan, PlanError> {
    if world == 0 {
        return Err(PlanError::setting("--gpus-per-node 0", "a data-parallel run has at least one rank"));
    }
    let numels = trainable_sizes(workload, config)?;
    let partition = FlatPartition::new(&numels, world);
    let chosen = match ranks {
        Some(r) => r.to_vec(),
        None => ranks_to_plan(&numels, world, mode),
    };
    let mut out = Vec::with_capacity(chosen.len());
    for rank in chosen {
        let trace = record_rank(workload, config, RankLayout { mode, world, rank })?;
        let p = evaluate(&trace, target)?;
        let pieces = if mode == DataParallel::Ddp { Vec::new() } else { partition.pieces(rank) };
        out.push(RankPeak {
            rank,
            shard_values: if mode == DataParallel::Ddp {
                partition.total() as u64
            } else {
                pieces.iter().map(|s| s.len as u64).sum()
            },
            shard_pieces: pieces.len(),
            peak_reserved_bytes: p.peak_reserved_bytes,
            peak_allocated_bytes: p.peak_allocated_bytes,
            fits: p.fits,
            headroom_bytes: p.headroom_bytes,
            model_states: ferrite_model_states(&trace),
        });
    }
    let max = out.iter().max_by_key(|r| (r.peak_reserved_bytes, std::cmp::Reverse(r.rank))).cloned();
    Ok(ShardedPlan {
        mode,
        world,
        device: target.device_name(),
        usable_bytes: target.usable_bytes(),
        max_rank: max.as_ref().map_or(0, |m| m.rank),
        peak_reserved_bytes: max.as_ref().map_or(0, |m| m.peak_reserved_bytes),
        fits: out.iter().all(|r| r.fits),
        ranks: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Builtin;
    use crate::measure::measure_rank;

    /// 4,615,510 parameters: not a multiple of 3, and each hidden weight (2,250,000 values) is
    /// larger than a third of them.
    fn mlp() -> Builtin {
        Builtin::Mlp { input: [1, 8, 8], hidden: 1500, layers: 3, classes: 10, dropout: 0.0 }
    }

    fn t4() -> Target {
        Target::parse("sim:t4-16gb", Default::default()).unwrap()
    }

    #[test]
    fn every_rank_is_predicted_within_two_percent_of_its_step_run_on_sim() {
        let (w, config, target) = (mlp(), StepConfig::new(32), t4());
        for mode in [DataParallel::Ddp, DataParallel::Zero1, DataParallel::Zero2, DataParallel::Zero3] {
            for world in [2, 3] {
                let plan = plan_ranks(&w, &config, &target, mode, world, None).unwrap();
                for r in &plan.ranks {
                    let m = measure_rank(&w, &config, &target, RankLayout { mode, world, rank: r.rank }).unwrap();
                    let err =
                        (r.peak_reserved_bytes as f64 - m.peak_reserved_bytes as f64) / m.peak_reserved_bytes as f64;
                    assert!(
                        err.abs() <= 0.02,
                        "{} rank {}/{world}: predicted {} measured {}",
                        mode.name(),
                        r.rank,
                        r.peak_reserved_bytes,
                        m.peak_reserved_bytes
                    );
                }
            }
        }
    }

    #[test]
    fn at_three_ranks_zero3_needs_less_than_zero2_than_zero1_than_ddp() {
        let (w, config, target) = (mlp(), StepConfig::new(32), t4());
        let peak = |mode| plan_ranks(&w, &config, &target, mode, 3, None).unwrap();
        let (ddp, z1, z2) = (peak(DataParallel::Ddp), peak(DataParallel::Zero1), peak(DataParallel::Zero2));
        let z3 = peak(DataParallel::Zero3);
        assert!(z3.peak_reserved_bytes < z2.peak_reserved_bytes, "{z3:?}\n{z2:?}");
        assert!(z2.peak_reserved_bytes < z1.peak_reserved_bytes, "{z2:?}\n{z1:?}");
        assert!(z1.peak_reserved_bytes < ddp.peak_reserved_bytes, "{z1:?}\n{ddp:?}");
        // The shards cover every trainable value once.
        let values: u64 = z2.ranks.iter().map(|r| r.shard_values).sum();
        assert_eq!(values, 4_615_510);
        // The optimizer state is sharded: each rank keeps about a third of AdamW's 8 B/param (plus its
        // f32 master copy, 4 B/param of its third).
        for r in &z2.ranks {
            assert!(r.model_states.optimizer_state < 4_615_510 * 8 / 2, "{r:?}");
        }
    }

    #[test]
    fn beyond_the_limit_three_ranks_are_planned() {
        let numels = [10usize, 1000, 7];
        assert_eq!(ranks_to_plan(&numels, 3, DataParallel::Zero2), vec![0, 1, 2]);
        assert_eq!(ranks_to_plan(&numels, 3, DataParallel::Ddp), vec![0]);
        let many = ranks_to_plan(&numels, 40, DataParallel::Zero1);
        assert!(many.len() <= 3 && many.contains(&0) && many.contains(&39), "{many:?}");
    }
}
