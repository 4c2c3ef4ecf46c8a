//! One rank's training step under data parallelism over MPI — DDP, ZeRO-1 or ZeRO-2 (ZeRO-3:
//! [`crate::fully_sharded_step`]) as
//! `mpirun -np W ferrite train --distributed [--zero S]` runs it — with every allocation the
//! rank's device sees, so the planner predicts each rank's own peak.
//!
//! Why a transcription of the training crate's tensor operations and not a formula: the peak of
//! a rank is decided by the caching allocator (block rounding, pools, segments), so the planner
//! runs the same tensor calls on `meta` that `ferrite-parallel`'s `GradientSync` and
//! `ZeroRedundancy` make on the rank's device, in the same order, with the same layout
//! ([`ferrite_optim::FlatPartition`] for the shards, [`ferrite_optim::ddp_buckets`] for the
//! buckets — the functions the training crate itself calls). What runs on the host there (MPI's
//! buffers, the all-gather, `to_vec`) allocates nothing on the device and is left out here.
//! The planner cannot depend on `ferrite-parallel` (it sits beside it), so each step below names
//! the function it mirrors; `tests/sharded_plan.rs` of `ferrite-cli` checks the prediction
//! against `mpirun` runs on `sim` devices (within 2 %).
//!
//! Per rank, in order:
//! - Build: the model; rank 0's weights broadcast (`replicate_from_rank0`: one f64 tensor per
//!   parameter and buffer, copied in); DDP and ZeRO-1: two flat f32 buffers per gradient bucket
//!   (`BucketBuffers::new`); ZeRO: one f32 *shard* per piece of a parameter the rank owns
//!   (`read_piece`), over which the optimizer is built.
//! - Backward as in the plain step (autograd allocates full gradients). Then DDP and ZeRO-1: the
//!   gradients copied into the buckets' send side, the average scaled in the receive side, and the
//!   gradients replaced by views into it (`write_back`); ZeRO-2: one f32 gradient per shard piece
//!   (`reduce_scatter_grads` then `scatter`), the full gradients freed.
//! - Optimizer step: DDP over every parameter, as in the plain step; ZeRO over the shards only
//!   (ZeRO-1's shard gradients view the averaged buckets), then every gradient cleared.
use ferrite_nn::autocast;
use ferrite_optim::{
    Accumulator, Adam, AdamConfig, DDP_BUCKET_CAP_BYTES, DDP_FIRST_BUCKET_BYTES, FlatPartition, GradScaler,
    GradScalerConfig, Optimizer, Sgd, SgdConfig, ddp_buckets,
};
use ferrite_tensor::{DType, Device, Tensor, no_grad};
use serde::Serialize;

use crate::PlanError;
use crate::step::{MarkKind, Phase, STEPS, TakenSteps, mark};
use crate::workload::{AmpMode, OptimizerKind, StepConfig, Workload};

/// How the ranks of a data-parallel run share the model states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DataParallel {
    /// Every rank holds everything; gradients all-reduced in buckets (`--distributed`).
    Ddp,
    /// Optimizer state partitioned; gradients all-reduced (`--zero 1`).
    Zero1,
    /// Optimizer state and gradients partitioned; gradients reduce-scattered (`--zero 2`).
    Zero2,
    /// Parameters partitioned too, each unit gathered around its forward and backward
    /// (`--zero 3`; see [`crate::fully_sharded_step`]).
    Zero3,
}

impl DataParallel {
    /// `--zero 1|2|3`; `None` for any other stage.
    pub fn zero_stage(stage: u8) -> Option<DataParallel> {
        match stage {
            1 => Some(DataParallel::Zero1),
            2 => Some(DataParallel::Zero2),
            3 => Some(DataParallel::Zero3),
            _ => None,
        }
    }

    /// `DDP`, `ZeRO-1`, `ZeRO-2`.
    pub fn name(self) -> &'static str {
        match self {
            DataParallel::Ddp => "DDP",
            DataParallel::Zero1 => "ZeRO-1",
            DataParallel::Zero2 => "ZeRO-2",
            DataParallel::Zero3 => "ZeRO-3",
        }
    }

    /// The `ferrite train` flags after `--distributed`.
    pub fn train_flags(self) -> Vec<String> {
        match self {
            DataParallel::Ddp => vec![],
            DataParallel::Zero1 => vec!["--zero".into(), "1".into()],
            DataParallel::Zero2 => vec!["--zero".into(), "2".into()],
            DataParallel::Zero3 => vec!["--zero".into(), "3".into()],
        }
    }

    fn sharded(self) -> bool {
        self != DataParallel::Ddp
    }
}

/// One rank of a data-parallel run: which layout, how many ranks, which one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct RankLayout {
    pub mode: DataParallel,
    pub world: usize,
    pub rank: usize,
}

impl RankLayout {
    pub(crate) fn check(&self) -> Result<(), PlanError> {
        if self.world == 0 || self.rank >= self.world {
            return Err(PlanError::setting(
                format!("rank {} of {} ranks", self.rank, self.world),
                "a data-parallel run has at least one rank, numbered from 0",
            ));
        }
        Ok(())
    }
}

/// The trainable parameters' sizes of `model`, in registration order (what the partition cuts).
pub(crate) fn trainable_numels(model: &dyn ferrite_nn::Module) -> Vec<usize> {
    model.named_parameters().iter().filter(|(_, t)| t.requires_grad()).map(|(_, t)| t.numel()).collect()
}

/// The rank whose shard has the most pieces (ties: the lowest rank): every rank but the last owns
/// ⌈N/W⌉ values, so the pieces — one allocation each — are what tells the ranks' peaks apart.
pub fn fullest_rank(numels: &[usize], world: usize) -> usize {
    let p = FlatPartition::new(numels, world);
    let values = |r: usize| p.pieces(r).iter().map(|s| s.len).sum::<usize>();
    (0..world.max(1)).max_by_key(|&r| (values(r), p.pieces(r).len(), std::cmp::Reverse(r))).unwrap_or(0)
}

/// A rank's model as every layout starts from it: built on the device, its named parameters, and
/// the trainable ones (what the partition cuts), in registration order.
pub(crate) struct RankModel {
    pub(crate) model: Box<dyn ferrite_nn::Module>,
    pub(crate) named: Vec<(String, Tensor)>,
    /// Every parameter's count (the plan's parameter total).
    pub(crate) parameters: u64,
    pub(crate) trainable: Vec<(String, Tensor)>,
    pub(crate) params: Vec<Tensor>,
    pub(crate) numels: Vec<usize>,
}

impl RankModel {
    /// Check `layout`, mark the build phase and build the model on `device`.
    pub(crate) fn build(
        workload: &dyn Workload,
        config: &StepConfig,
        device: &Device,
        layout: RankLayout,
    ) -> Result<RankModel, PlanError> {
        layout.check()?;
        mark(MarkKind::Phase { phase: Phase::Build, step: 0 });
        let model = workload.build(config, device)?;
        let named = model.named_parameters();
        let parameters: u64 = named.iter().map(|(_, p)| p.numel() as u64).sum();
        let trainable: Vec<(String, Tensor)> = named.iter().filter(|(_, t)| t.requires_grad()).cloned().collect();
        let params: Vec<Tensor> = trainable.iter().map(|(_, t)| t.clone()).collect();
        let numels: Vec<usize> = params.iter().map(Tensor::numel).collect();
        Ok(RankModel { model, named, parameters, trainable, params, numels })
    }

    /// `replicate_from_rank0` over this model's parameters and buffers.
    pub(crate) fn replicate(&self, device: &Device) -> Result<(), PlanError> {
        replicate_from_rank0(&self.named, &self.model.named_buffers(), device)
    }

    /// `ZeroRedundancy::new` → `read_piece`: one f32 shard per owned piece.
    pub(crate) fn shards(pieces: &[ferrite_optim::ShardPiece], device: &Device) -> Result<Vec<Tensor>, PlanError> {
        pieces.iter().map(|piece| Ok(Tensor::zeros(&[piece.len], DType::F32, device)?)).collect()
    }

    /// `shard_optimizer`'s parameters: the shards, named after their parameters; a rank with
    /// nothing holds one empty tensor (a group is never empty).
    pub(crate) fn shard_opt_params(
        &self,
        pieces: &[ferrite_optim::ShardPiece],
        shards: &[Tensor],
        device: &Device,
    ) -> Result<Vec<(String, Tensor)>, PlanError> {
        let mut v: Vec<(String, Tensor)> =
            pieces.iter().zip(shards).map(|(p, s)| (self.trainable[p.param].0.clone(), s.clone())).collect();
        if v.is_empty() {
            v.push((String::new(), Tensor::zeros(&[0], DType::F32, device)?));
        }
        Ok(v)
    }
}

/// `replicate_from_rank0`: rank 0's values arrive as f64 and are copied into each parameter and
/// buffer.
pub(crate) fn replicate_from_rank0(
    named: &[(String, Tensor)],
    buffers: &[(String, Tensor)],
    device: &Device,
) -> Result<(), PlanError> {
    let _g = no_grad();
    for (_, t) in named.iter().chain(buffers) {
        let src = Tensor::zeros(t.shape(), DType::F64, device)?;
        t.copy_(&src)?;
    }
    Ok(())
}

/// The step's optimizer over `opt_params` (the model's parameters, or a rank's shards).
pub(crate) fn make_optimizer(
    config: &StepConfig,
    opt_params: Vec<(String, Tensor)>,
) -> Result<Box<dyn Optimizer>, PlanError> {
    Ok(match config.optimizer {
        OptimizerKind::Adamw => Box::new(Adam::named(opt_params, AdamConfig::adamw(1e-3).weight_decay(0.01))?),
        OptimizerKind::Adam => Box::new(Adam::named(opt_params, AdamConfig::adam(1e-3))?),
        OptimizerKind::Sgd => Box::new(Sgd::named(opt_params, SgdConfig::new(1e-2).momentum(0.9))?),
        OptimizerKind::SgdPlain => Box::new(Sgd::named(opt_params, SgdConfig::new(1e-2))?),
    })
}

/// Run one rank's step of `layout` (DDP, ZeRO-1 or ZeRO-2) on `device`; the parameter count, as
/// `run_step_inner`. ZeRO-3: [`crate::fully_sharded_step::run_layout_step`] picks.
pub(crate) fn run_rank_step(
    workload: &dyn Workload,
    config: &StepConfig,
    device: &Device,
    layout: RankLayout,
) -> Result<u64, PlanError> {
    let rm = RankModel::build(workload, config, device, layout)?;
    rm.replicate(device)?;
    let (params, numels) = (&rm.params, &rm.numels);
    // `Reducer::new` → `BucketBuffers::new`: per bucket, two buffers of values + one flag per
    // parameter, allocated one after the other.
    let mut buckets: Vec<(Vec<usize>, [Tensor; 2])> = Vec::new();
    if layout.mode != DataParallel::Zero2 {
        for b in ddp_buckets(numels, DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_CAP_BYTES) {
            let len = b.iter().map(|&i| numels[i]).sum::<usize>() + b.len();
            let a = Tensor::zeros(&[len], DType::F32, device)?;
            let c = Tensor::zeros(&[len], DType::F32, device)?;
            buckets.push((b, [a, c]));
        }
    }
    let partition = FlatPartition::new(numels, layout.world);
    let pieces = if layout.mode.sharded() { partition.pieces(layout.rank) } else { Vec::new() };
    let shards = RankModel::shards(&pieces, device)?;
    // The buckets hold gradients (their views become the parameters' gradients).
    mark(MarkKind::Grads(buckets.iter().flat_map(|(_, f)| f.iter().map(|t| t.storage().addr())).collect()));

    let opt_params: Vec<(String, Tensor)> =
        if layout.mode.sharded() { rm.shard_opt_params(&pieces, &shards, device)? } else { rm.named.clone() };
    let mut opt = make_optimizer(config, opt_params)?;
    let scaling = config.amp == Some(AmpMode::F16);
    let mut scaler = GradScaler::new(GradScalerConfig { enabled: scaling, ..GradScalerConfig::default() })?;
    let acc = Accumulator::new(config.accum_steps)?;
    let scale = 1.0 / layout.world as f64;
    let mut steps = TakenSteps::default();
    while let Some(step) = steps.next() {
        let mut held = Vec::new();
        for _ in 0..config.accum_steps {
            held.clear();
            mark(MarkKind::Phase { phase: Phase::Forward, step });
            let (x, y) = workload.batch(config, device)?;
            let (loss, keep) = {
                let _amp = config.amp.map(|a| autocast(a.dtype())).transpose()?;
                workload.loss(&*rm.model, &x, &y)?
            };
            mark(MarkKind::Phase { phase: Phase::Backward, step });
            scaler.scale(&acc.scale_loss(&loss)?)?.backward()?;
            let grads = params.iter().filter_map(|p| p.grad()).map(|g| g.storage().addr()).collect();
            mark(MarkKind::Grads(grads));
            held.push(x);
            held.push(y);
            held.push(loss);
            held.extend(keep);
        }
        {
            let _g = no_grad();
            if layout.mode == DataParallel::Zero2 {
                // `scatter`: this rank's averaged range arrives on the host; one gradient per
                // piece goes onto the device, and the full gradients are freed.
                let mut shard_grads = Vec::with_capacity(pieces.len());
                for (piece, shard) in pieces.iter().zip(&shards) {
                    if params[piece.param].grad().is_none() {
                        continue;
                    }
                    let g = Tensor::zeros(&[piece.len], DType::F32, device)?;
                    shard.set_grad(Some(g.clone()))?;
                    shard_grads.push(g.storage().addr());
                }
                mark(MarkKind::Grads(shard_grads));
                for p in params {
                    p.set_grad(None)?;
                }
            } else {
                // `BucketBuffers::fill` / `write_back`, send side `send`, averages in the other.
                let send = step % 2;
                for (members, flat) in &buckets {
                    let mut off = 0;
                    let mut views = Vec::with_capacity(members.len());
                    for &i in members {
                        let p = &params[i];
                        let (s, r) = (
                            flat[send].narrow(0, off, p.numel())?.reshape_usize(p.shape())?,
                            flat[1 - send].narrow(0, off, p.numel())?.reshape_usize(p.shape())?,
                        );
                        let used = match p.grad() {
                            Some(g) => {
                                s.copy_(&g)?;
                                true
                            }
                            None => {
                                s.zero_()?;
                                false
                            }
                        };
                        // `write_back`: an f32 parameter's gradient becomes the view; a narrower
                        // one (bf16 parameters) keeps its own tensor, the average copied in.
                        if used && p.dtype() != DType::F32 {
                            if let Some(g) = p.grad() {
                                g.copy_(&r)?;
                            }
                            views.push(None);
                            off += p.numel();
                            continue;
                        }
                        views.push(used.then_some(r));
                        off += p.numel();
                    }
                    let values: usize = members.iter().map(|&i| numels[i]).sum();
                    if scale != 1.0 {
                        flat[1 - send].narrow(0, 0, values)?.mul_scalar_(scale)?;
                    }
                    for (&i, view) in members.iter().zip(views) {
                        if let Some(view) = view {
                            params[i].set_grad(Some(view))?;
                        }
                    }
                }
                if layout.mode == DataParallel::Zero1 {
                    // `attach_reduced_grads`: each shard's gradient views its slice.
                    for (piece, shard) in pieces.iter().zip(&shards) {
                        let p = &params[piece.param];
                        let g = match p.grad() {
                            Some(g) => {
                                g.contiguous()?.reshape_usize(&[p.numel()])?.narrow(0, piece.param_start, piece.len)?
                            }
                            None => continue,
                        };
                        // A narrower gradient: only the piece becomes f32.
                        let g = if g.dtype() == DType::F32 { g } else { g.to_dtype(DType::F32)? };
                        shard.set_grad(Some(g))?;
                    }
                }
            }
        }
        mark(MarkKind::Phase { phase: Phase::OptimizerStep, step });
        if layout.mode.sharded() {
            // `ZeroRedundancy::step`, then the trainer's `scaler.update()` and `zero_grad`.
            if scaling {
                scaler.unscale_(&mut *opt)?;
                let found = scaler.found_inf(&*opt).unwrap_or(false);
                scaler.set_found_inf(&*opt, found)?;
                steps.finish(scaler.step(&mut *opt)?);
            } else {
                opt.step()?;
                steps.finish(true);
            }
            scaler.update()?;
            opt.zero_grad()?;
            let _g = no_grad();
            for t in params.iter().chain(&shards) {
                t.set_grad(None)?;
            }
        } else {
            steps.finish(scaler.step(&mut *opt)?);
            scaler.update()?;
            opt.zero_grad()?;
        }
        drop(held);
    }
    mark(MarkKind::Phase { phase: Phase::Build, step: STEPS });
    drop(opt);
    drop(shards);
    drop(buckets);
    let parameters = rm.parameters;
    drop(rm);
    Ok(parameters)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fullest_rank_owns_the_most_values_then_the_most_pieces() {
        // 7 values over 3 ranks: 3 (1 piece), 3 (2 pieces), 1.
        assert_eq!(fullest_rank(&[4, 3], 3), 1);
        // Even split, one piece each: rank 0.
        assert_eq!(fullest_rank(&[6], 3), 0);
        assert_eq!(fullest_rank(&[6], 1), 0);
    }

    #[test]
    fn a_rank_outside_the_run_is_refused() {
        let l = RankLayout { mode: DataParallel::Zero1, world: 2, rank: 2 };
        assert!(l.check().unwrap_err().to_string().contains("rank 2 of 2"));
        assert_eq!(DataParallel::zero_stage(4), None);
        assert_eq!(DataParallel::zero_stage(3).map(DataParallel::name), Some("ZeRO-3"));
        assert_eq!(DataParallel::zero_stage(2).map(DataParallel::train_flags), Some(vec!["--zero".into(), "2".into()]));
    }
}
