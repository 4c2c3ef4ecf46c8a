//! ZeRO stages 1 and 2 over MPI (DeepSpeed's ZeRO; PyTorch's `ZeroRedundancyOptimizer` for
//! stage 1): each rank keeps the optimizer state of only its share of the parameters.
//!
//! - Stage 1: gradients are all-reduced exactly as [`GradientSync`] does for DDP (same buckets,
//!   overlapped with backward); each rank steps only its partition; the updated values are
//!   all-gathered into every rank's full parameters.
//! - Stage 2: gradients are reduce-scattered instead (see [`super::grad_reduce_scatter`]), so
//!   after a synchronizing backward a rank holds the averaged gradient of its partition only; the
//!   model's full gradients are freed.
//!
//! The partition is the flat layout of `ferrite_optim::FlatPartition` (every rank ⌈N/W⌉ values, a parameter
//! cut across ranks where needed). Each rank's share lives in *shard tensors*: one flat f32
//! tensor per piece of a parameter it owns, on that parameter's device, which the sharded
//! optimizer updates (the f32 master values of DeepSpeed's partition). Why copies and not views
//! into the parameters: the optimizer checks its tensors are distinct leaves, and a separate f32
//! master keeps the update exact when parameters are stored in a narrower dtype.
//!
//! The optimizer is built as usual over the model's parameters (it allocates no state until its
//! first step), then [`ZeroRedundancy::shard_optimizer`] makes the same optimizer — same rule,
//! groups and hyper-parameters — over this rank's shards. Group indices are kept on every rank
//! (a group with nothing on this rank holds one empty tensor), so LR schedules work unchanged.
//!
//! One step, as in DeepSpeed: gradient clipping uses the global norm (each rank's sum of squares
//! over its shards, exchanged), and with a [`GradScaler`] the inf/NaN verdict is exchanged too, so
//! a non-finite gradient in one rank's shard skips the step on every rank (PyTorch's
//! `ShardedGradScaler`). Every collective of [`ZeroRedundancy::step`] carries each rank's status,
//! so a rank whose step fails stops every rank with an error naming it, never a hang.

use std::sync::atomic::{AtomicBool, Ordering};

use ferrite_nn::Module;
use ferrite_optim::{GradScaler, Optim, Optimizer, ParamGroup, UpdateRule, clip_grads_with_norm_};
use ferrite_tensor::{DType, Tensor, no_grad};

use super::comm_dtype::CommDtype;
use super::ddp::{DdpOptions, GradientSync, NoSync, replicate_from_rank0};
use super::error::{DistributedError, Result};
use super::grad_reduce_scatter::reduce_scatter_grads;
use super::host_values::{read_f32, write_f32};
use super::process_group::{Comm, Pending};
use ferrite_optim::{FlatPartition, ShardPiece};

/// How [`ZeroRedundancy::shard_optimizer`] laid the sharded optimizer out.
#[derive(Debug, Clone)]
pub(crate) struct OptimizerLayout {
    /// Per trainable parameter: its index in the full optimizer (counted over the groups), or
    /// `None` when the optimizer does not update it.
    pub(crate) full_index: Vec<Option<usize>>,
    /// Per parameter of the sharded optimizer (counted over its groups): the piece it is (an
    /// index into the rank's pieces), `None` for an empty group's placeholder.
    pub(crate) shard_piece: Vec<Option<usize>>,
    /// Per group of the full optimizer: its parameter count and names, as it had them.
    pub(crate) full_groups: Vec<(usize, Option<Vec<String>>)>,
}

/// Which ZeRO stage a [`ZeroRedundancy`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZeroStage {
    /// Optimizer state sharded; gradients all-reduced.
    One,
    /// Optimizer state and gradients sharded (reduce-scatter).
    Two,
    /// Parameters sharded too: driven by [`super::FullySharded`], which gathers each unit's
    /// parameters around its forward and backward.
    Three,
}

impl ZeroStage {
    /// Stage `1` or `2`; `None` for anything else.
    pub fn from_number(n: u32) -> Option<ZeroStage> {
        match n {
            1 => Some(ZeroStage::One),
            2 => Some(ZeroStage::Two),
            3 => Some(ZeroStage::Three),
            _ => None,
        }
    }

    pub fn number(self) -> u32 {
        match self {
            ZeroStage::One => 1,
            ZeroStage::Two => 2,
            ZeroStage::Three => 3,
        }
    }
}

/// How a [`ZeroRedundancy`] shards and exchanges.
#[derive(Debug, Clone)]
pub struct ZeroOptions {
    pub stage: ZeroStage,
    /// Buckets, unused parameters and buffers as for DDP. Stage 2 uses `bucket_cap_bytes` as
    /// the size of one reduce-scatter (all ranks' blocks together).
    pub ddp: DdpOptions,
    /// What the reduce-scatters and all-gathers carry (`--zero-comm-dtype`): f32, or bf16 (half
    /// the bytes; the f32 masters in the shards are never rounded). Stage 1's all-reduce is
    /// DDP's, in f32 buckets, whatever this says.
    pub comm_dtype: CommDtype,
}

impl ZeroOptions {
    pub fn new(stage: ZeroStage) -> ZeroOptions {
        ZeroOptions { stage, ddp: DdpOptions::default(), comm_dtype: CommDtype::F32 }
    }

    pub fn comm_dtype(mut self, dtype: CommDtype) -> ZeroOptions {
        self.comm_dtype = dtype;
        self
    }

    pub fn ddp(mut self, ddp: DdpOptions) -> ZeroOptions {
        self.ddp = ddp;
        self
    }
}

/// What [`ZeroRedundancy::step`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ZeroStepOutcome {
    /// False when the GradScaler found an inf/NaN gradient on some rank (every rank skipped).
    pub stepped: bool,
    /// The global gradient norm before clipping, when clipping was asked for.
    pub grad_norm: Option<f64>,
}

/// ZeRO-1/2 data parallelism over the parameters of a model kept elsewhere (see the module docs).
///
/// ```ignore
/// let zero = ZeroRedundancy::new(&model, group.comm(), ZeroOptions::new(ZeroStage::Two))?;
/// let mut opt = zero.shard_optimizer(&Adam::new(model.parameters(), AdamConfig::adamw(1e-3))?)?;
/// zero.backward(&loss)?;                          // gradients averaged (1) or reduce-scattered (2)
/// zero.step(&mut opt, Some(1.0), None)?;           // clip by the global norm, step, all-gather
/// zero.zero_grad(&mut opt)?;
/// zero.finish()?;
/// ```
pub struct ZeroRedundancy {
    pub(super) comm: Comm,
    stage: ZeroStage,
    pub(super) comm_dtype: CommDtype,
    pub(super) names: Vec<String>,
    pub(super) params: Vec<Tensor>,
    pub(super) partition: FlatPartition,
    pub(super) pieces: Vec<ShardPiece>,
    pub(super) shards: Vec<Tensor>,
    /// How [`shard_optimizer`](Self::shard_optimizer) laid the sharded optimizer out (what a
    /// sharded checkpoint needs to map its state back to the full optimizer's layout).
    pub(super) layout: std::sync::Mutex<Option<OptimizerLayout>>,
    /// Stage 1: DDP's bucketed all-reduce.
    sync: Option<GradientSync>,
    /// Stage 2: values of one rank's block in one reduce-scatter.
    bucket_values: usize,
    find_unused: bool,
    pub(super) synchronizing: AtomicBool,
    failed: AtomicBool,
    finished: bool,
}

impl ZeroRedundancy {
    /// Check that every rank has the same parameters, copy rank 0's to every rank, and cut
    /// the trainable ones into this rank's shards.
    pub fn new(module: &dyn Module, comm: Comm, options: ZeroOptions) -> Result<ZeroRedundancy> {
        let (named, sync) = match options.stage {
            ZeroStage::One => {
                let sync = GradientSync::new(module, comm.clone(), options.ddp.clone())?;
                (module.named_parameters(), Some(sync))
            }
            ZeroStage::Two | ZeroStage::Three => {
                (replicate_from_rank0(module, &comm, options.ddp.broadcast_buffers)?, None)
            }
        };
        let (names, params): (Vec<String>, Vec<Tensor>) = named.into_iter().filter(|(_, t)| t.requires_grad()).unzip();
        let numels: Vec<usize> = params.iter().map(Tensor::numel).collect();
        let partition = FlatPartition::new(&numels, comm.world_size());
        let pieces = partition.pieces(comm.rank());
        let shards = pieces.iter().map(|s| read_piece(&params, s)).collect::<Result<Vec<_>>>()?;
        Ok(ZeroRedundancy {
            bucket_values: (options.ddp.bucket_cap_bytes / 4 / comm.world_size()).max(1),
            comm,
            stage: options.stage,
            comm_dtype: options.comm_dtype,
            names,
            params,
            partition,
            pieces,
            shards,
            sync,
            layout: std::sync::Mutex::new(None),
            find_unused: options.ddp.find_unused_parameters,
            synchronizing: AtomicBool::new(true),
            failed: AtomicBool::new(false),
            finished: false,
        })
    }

    /// Copy the parameters' current values into this rank's shards again: after changing the
    /// parameters by hand (loading weights) on every rank.
    pub fn reload_shards(&self) -> Result<()> {
        let _g = no_grad();
        for (k, piece) in self.pieces.iter().enumerate() {
            let fresh = read_piece(&self.params, piece)?;
            self.shards[k].copy_(&fresh)?;
        }
        Ok(())
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    pub fn stage(&self) -> ZeroStage {
        self.stage
    }

    /// What the collectives carry (see [`ZeroOptions::comm_dtype`]).
    pub fn comm_dtype(&self) -> CommDtype {
        self.comm_dtype
    }

    /// Stage 1: where the time of the last synchronizing backward went (DDP's buckets; see
    /// [`GradientSync::last_timings`]). `None` at stage 2, whose reduce-scatter follows backward.
    pub fn last_timings(&self) -> Option<super::reducer::StepTimings> {
        self.sync.as_ref().map(GradientSync::last_timings)
    }

    /// This rank's shard tensors (what the sharded optimizer updates).
    pub fn shards(&self) -> &[Tensor] {
        &self.shards
    }

    /// Values of optimizer state slots per rank (⌈trainable values / world size⌉).
    pub fn partition_numel(&self) -> usize {
        self.partition.per_rank()
    }

    /// The optimizer `full` (built over the model's parameters) rebuilt over this rank's shards:
    /// the same rule, groups, hyper-parameters and `initial_lr`. `full` itself is not used
    /// afterwards; build it before its first step (its state is not carried over).
    pub fn shard_optimizer<R: UpdateRule>(&self, full: &Optim<R>) -> Result<Optim<R>> {
        let mut groups = Vec::with_capacity(full.param_groups().len());
        let mut layout = OptimizerLayout {
            full_index: vec![None; self.params.len()],
            shard_piece: Vec::new(),
            full_groups: Vec::new(),
        };
        let mut full_index = 0usize;
        for (gi, g) in full.param_groups().iter().enumerate() {
            let mut params = Vec::new();
            let mut names = Vec::new();
            layout.full_groups.push((g.params.len(), g.param_names.clone()));
            for (k, p) in g.params.iter().enumerate() {
                let Some(i) = self.params.iter().position(|q| same_tensor(p, q)) else {
                    return Err(DistributedError::ZeroUnknownParameter {
                        rank: self.rank(),
                        group: gi,
                        index: k,
                        shape: p.shape().to_vec(),
                    });
                };
                layout.full_index[i] = Some(full_index);
                full_index += 1;
                for (pi, (piece, shard)) in self.pieces.iter().zip(&self.shards).enumerate() {
                    if piece.param == i {
                        params.push(shard.clone());
                        names.push(self.names[i].clone());
                        layout.shard_piece.push(Some(pi));
                    }
                }
            }
            if params.is_empty() {
                layout.shard_piece.push(None);
                let device = g.params.first().map(|p| p.device().clone()).unwrap_or(ferrite_tensor::Device::Cpu);
                params.push(Tensor::zeros(&[0], DType::F32, &device)?);
                names.push(String::new());
            }
            groups.push(ParamGroup {
                params,
                param_names: Some(names),
                config: g.config.clone(),
                initial_lr: g.initial_lr,
            });
        }
        let opt = Optim::with_groups(groups)?;
        *self.layout.lock().unwrap_or_else(|p| p.into_inner()) = Some(layout);
        Ok(opt)
    }

    /// Until the guard drops, [`backward`](Self::backward) accumulates local gradients without
    /// communicating (gradient accumulation).
    pub fn no_sync(&self) -> NoSync<'_> {
        match &self.sync {
            Some(sync) => sync.no_sync(),
            None => {
                let previous = self.synchronizing.swap(false, Ordering::SeqCst);
                NoSync { flag: &self.synchronizing, previous }
            }
        }
    }

    /// `loss.backward()`, then (outside [`no_sync`](Self::no_sync)) the gradients averaged over
    /// every rank: all of them (stage 1) or this rank's partition (stage 2).
    pub fn backward(&self, loss: &Tensor) -> Result<()> {
        if let Some(sync) = &self.sync {
            return sync.backward(loss);
        }
        self.check_not_failed()?;
        if !self.synchronizing.load(Ordering::SeqCst) {
            return loss.backward().map_err(|e| self.fail_with(e.into()));
        }
        self.check_peers()?;
        let local = loss.backward().err().map(DistributedError::from);
        self.scatter(local, self.find_unused)
    }

    /// Average the gradients the parameters hold now, without a backward (the end of a partial
    /// accumulation group).
    pub fn synchronize(&self) -> Result<()> {
        if let Some(sync) = &self.sync {
            return sync.synchronize();
        }
        self.check_not_failed()?;
        self.check_peers()?;
        self.scatter(None, true)
    }

    /// Stage 2: reduce-scatter, then hand the averages to the shards and free the full gradients.
    fn scatter(&self, local: Option<DistributedError>, allow_unused: bool) -> Result<()> {
        let zeros = local.is_some();
        let (got, read_error) =
            reduce_scatter_grads(&self.comm, &self.partition, &self.params, self.bucket_values, zeros, self.comm_dtype)
                .inspect_err(|_| self.failed.store(true, Ordering::SeqCst))?;
        if let Some(e) = local.or(read_error) {
            return Err(self.fail_with(e));
        }
        if !allow_unused && !got.unused_here.is_empty() {
            let names = got.unused_here.iter().map(|&i| self.names[i].clone()).collect();
            return Err(self.fail_with(DistributedError::UnusedParameters { rank: self.rank(), names }));
        }
        let _g = no_grad();
        let attach = || -> Result<()> {
            for (piece, shard) in self.pieces.iter().zip(&self.shards) {
                if !got.used_by_any[piece.param] {
                    shard.set_grad(None)?;
                    continue;
                }
                let v = got.values[piece.rank_start..piece.rank_start + piece.len].to_vec();
                let g = Tensor::from_vec(v, &[piece.len], shard.device())?;
                match shard.grad() {
                    // Accumulate as autograd would (a synchronize after an earlier one).
                    Some(old) => old.add_(&g)?,
                    None => shard.set_grad(Some(g))?,
                }
            }
            for p in &self.params {
                p.set_grad(None)?;
            }
            Ok(())
        };
        attach().map_err(|e| self.fail_with(e))
    }

    /// One optimizer step of `opt` (from [`shard_optimizer`](Self::shard_optimizer)) on this
    /// rank's shards after a synchronizing backward: unscale and the global inf/NaN verdict when
    /// `scaler` is given (call `scaler.update()` afterwards, as in PyTorch), clipping to
    /// `max_grad_norm` by the global norm, the update, and the all-gather of the updated values
    /// into every rank's parameters. Every rank must call it.
    pub fn step(
        &self,
        opt: &mut dyn Optimizer,
        max_grad_norm: Option<f64>,
        scaler: Option<&mut GradScaler>,
    ) -> Result<ZeroStepOutcome> {
        self.step_gathering(opt, max_grad_norm, scaler, None)
    }

    /// [`step`](Self::step), all-gathering afterwards only the flat spans `[lo, hi)` in
    /// `gather` (every parameter when `None`): ZeRO-3 gathers the root and any unit held whole,
    /// not the released units, whose next gather reads the shards anyway. Every rank must pass
    /// the same spans.
    pub(super) fn step_gathering(
        &self,
        opt: &mut dyn Optimizer,
        max_grad_norm: Option<f64>,
        mut scaler: Option<&mut GradScaler>,
        gather: Option<&[(usize, usize)]>,
    ) -> Result<ZeroStepOutcome> {
        self.check_not_failed()?;
        // Pairs with the announcement of a rank whose backward failed.
        self.check_peers()?;
        let scaling = scaler.as_ref().is_some_and(|s| s.is_enabled());
        // Phase 1 (local): gradients onto the shards, unscale, inf check, sum of squares.
        let phase1 = (|| -> Result<(bool, f64)> {
            if self.stage == ZeroStage::One {
                self.attach_reduced_grads()?;
            }
            let mut found = false;
            if let Some(s) = scaler.as_deref_mut().filter(|s| s.is_enabled()) {
                s.unscale_(&mut *opt)?;
                found = s.found_inf(&*opt).unwrap_or(false);
            }
            let sumsq = if max_grad_norm.is_some() { self.local_sum_of_squares()? } else { 0.0 };
            Ok((found, sumsq))
        })();
        let (ok, found, sumsq) = match &phase1 {
            Ok((f, s)) => (1.0, f64::from(u8::from(*f)), *s),
            Err(_) => (0.0, 0.0, 0.0),
        };
        let all = self.comm.all_gather_f64(vec![ok, found, sumsq]).inspect_err(|_| self.mark_failed())?;
        self.agree(phase1.map(|_| ()), all.chunks(3).map(|c| c[0] != 0.0), "its gradients before the step")?;
        let found_inf = all.chunks(3).any(|c| c[1] != 0.0);
        let grad_norm = max_grad_norm.map(|_| all.chunks(3).map(|c| c[2]).sum::<f64>().sqrt());
        // Phase 2 (local): clip by the global norm, step (skipped everywhere on an inf).
        let phase2 = (|| -> Result<bool> {
            if let (Some(max), Some(norm)) = (max_grad_norm, grad_norm) {
                clip_grads_with_norm_(&self.shards, max, norm)?;
            }
            match scaler.as_deref_mut().filter(|_| scaling) {
                Some(s) => {
                    s.set_found_inf(&*opt, found_inf)?;
                    Ok(s.step(&mut *opt)?)
                }
                None => {
                    opt.step()?;
                    Ok(true)
                }
            }
        })();
        let stepped = matches!(phase2, Ok(true));
        self.gather_params(phase2.map(|_| ()), stepped, gather)?;
        Ok(ZeroStepOutcome { stepped, grad_norm })
    }

    /// Stage 1: each shard's gradient is its slice of the averaged parameter gradient.
    fn attach_reduced_grads(&self) -> Result<()> {
        let _g = no_grad();
        for (piece, shard) in self.pieces.iter().zip(&self.shards) {
            let p = &self.params[piece.param];
            let Some(g) = p.grad() else {
                shard.set_grad(None)?;
                continue;
            };
            let view = g.contiguous()?.reshape_usize(&[p.numel()])?.narrow(0, piece.param_start, piece.len)?;
            // A narrower gradient (bf16 parameters): only this rank's piece becomes f32.
            let view = if view.dtype() == DType::F32 { view } else { view.to_dtype(DType::F32)? };
            shard.set_grad(Some(view))?;
        }
        Ok(())
    }

    /// Σ g² over this rank's shard gradients, in f64.
    fn local_sum_of_squares(&self) -> Result<f64> {
        let mut sum = 0.0f64;
        for s in &self.shards {
            if let Some(g) = s.grad() {
                sum += g.to_vec::<f32>()?.iter().map(|v| f64::from(*v) * f64::from(*v)).sum::<f64>();
            }
        }
        Ok(sum)
    }

    /// The all-gather of the updated shards into every rank's parameters (those within
    /// `spans`, all when `None`); each rank's block starts with its status, so a rank whose step
    /// failed stops every rank. `stepped` is the same on every rank (the skip decision is
    /// global), and nothing is written when false.
    fn gather_params(&self, local: Result<()>, stepped: bool, spans: Option<&[(usize, usize)]>) -> Result<()> {
        let (per, world, rank) = (self.partition.per_rank(), self.world_size(), self.rank());
        let whole = [(0, self.partition.total())];
        let spans = spans.unwrap_or(&whole);
        // Rank r's part of the flat span [lo, hi): (first flat index, count).
        let part = |r: usize, (lo, hi): (usize, usize)| {
            let a = lo.max(r * per).min(hi);
            (a, hi.min((r + 1) * per).saturating_sub(a))
        };
        // Each span takes the most any rank owns of it in every rank's block.
        let widths: Vec<usize> = spans.iter().map(|&s| (0..world).map(|r| part(r, s).1).max().unwrap_or(0)).collect();
        let len = 1 + widths.iter().sum::<usize>();
        let mut block = vec![0f32; len];
        let mut local = local;
        if local.is_ok() {
            block[0] = 1.0;
            if stepped {
                let mut mine = vec![0f32; per];
                for (piece, shard) in self.pieces.iter().zip(&self.shards) {
                    match shard.to_vec::<f32>() {
                        Ok(v) => mine[piece.rank_start..piece.rank_start + piece.len].copy_from_slice(&v),
                        Err(e) => {
                            block[0] = 0.0;
                            local = Err(e.into());
                            break;
                        }
                    }
                }
                let mut at = 1;
                for (&span, w) in spans.iter().zip(&widths) {
                    let (a, n) = part(rank, span);
                    if n > 0 {
                        block[at..at + n].copy_from_slice(&mine[a - rank * per..a - rank * per + n]);
                    }
                    at += w;
                }
            }
        }
        let all = self
            .comm
            .start_all_gather(block, self.comm_dtype)
            .and_then(Pending::wait)
            .inspect_err(|_| self.mark_failed())?;
        self.agree(local, all.chunks(len).map(|c| c[0] != 0.0), "its optimizer step")?;
        if !stepped {
            return Ok(());
        }
        let _g = no_grad();
        let write = || -> Result<()> {
            let mut at = 1;
            for (&(lo, hi), w) in spans.iter().zip(&widths) {
                let mut flat = vec![0f32; hi - lo];
                for r in 0..world {
                    let (a, n) = part(r, (lo, hi));
                    flat[a - lo..a - lo + n].copy_from_slice(&all[r * len + at..r * len + at + n]);
                }
                at += w;
                for (i, p) in self.params.iter().enumerate() {
                    let off = self.partition.offset(i);
                    // ZeRO-3: a unit's parameters rest released; its next gather reads the shards.
                    if off < lo || off + p.numel() > hi || p.is_storage_released() {
                        continue;
                    }
                    // Rounded to the parameter's dtype on the host: nothing allocated on the device.
                    write_f32(p, &flat[off - lo..off - lo + p.numel()])?;
                }
            }
            Ok(())
        };
        write().map_err(|e| self.fail_with_agreed(e))
    }

    /// After a collective that carried every rank's status: `Ok` when all were healthy; else
    /// every rank stops (this one with its own error, the others naming the first failed rank).
    pub(super) fn agree(&self, local: Result<()>, healthy: impl Iterator<Item = bool>, what: &str) -> Result<()> {
        let first_bad = healthy.enumerate().find(|(_, ok)| !ok).map(|(r, _)| r);
        match (local, first_bad) {
            (Ok(()), None) => Ok(()),
            (Err(e), _) => Err(self.fail_with_agreed(e)),
            (Ok(()), Some(rank)) => Err(self.fail_with_agreed(DistributedError::PeerFailed {
                rank,
                message: format!("{what} failed (its own output has the error)"),
            })),
        }
    }

    /// Every rank knows the run stops: no announcement needed.
    fn fail_with_agreed(&self, e: DistributedError) -> DistributedError {
        self.mark_failed();
        e
    }

    pub(super) fn mark_failed(&self) {
        self.failed.store(true, Ordering::SeqCst);
        if let Some(sync) = &self.sync {
            sync.mark_failed();
        }
    }

    /// Clear the shards' gradients and the model's (stage 1 keeps the model's full gradients
    /// until here; stage 2 freed them in backward).
    pub fn zero_grad(&self, opt: &mut dyn Optimizer) -> Result<()> {
        opt.zero_grad()?;
        let _g = no_grad();
        for t in self.params.iter().chain(&self.shards) {
            t.set_grad(None)?;
        }
        Ok(())
    }

    pub(super) fn check_not_failed(&self) -> Result<()> {
        if self.failed.load(Ordering::SeqCst) {
            return Err(DistributedError::AlreadyFailed { rank: self.rank() });
        }
        Ok(())
    }

    pub(super) fn check_peers(&self) -> Result<()> {
        let statuses = self.comm.all_gather_status(None).inspect_err(|_| self.mark_failed())?;
        if let Some(e) = Comm::first_failure(&statuses) {
            self.mark_failed();
            return Err(e);
        }
        Ok(())
    }

    /// A local error outside a status-carrying collective: tell the others (their next status
    /// exchange names this rank), return `e`.
    pub(super) fn fail_with(&self, e: DistributedError) -> DistributedError {
        self.announce_failure(&e.to_string());
        e
    }

    /// Tell the other ranks that this rank stops because of `message` (they learn it at their
    /// next exchange). Does nothing after a failure every rank already knows.
    pub fn announce_failure(&self, message: &str) {
        if let Some(sync) = &self.sync {
            self.failed.store(true, Ordering::SeqCst);
            return sync.announce_failure(message);
        }
        if self.failed.swap(true, Ordering::SeqCst) || self.comm.is_broken() {
            return;
        }
        let _ = self.comm.all_gather_status(Some(message));
    }

    /// End of training: one last status exchange, so a rank that failed after the last step is
    /// reported too.
    pub fn finish(mut self) -> Result<()> {
        self.check_not_failed()?;
        self.finished = true;
        match self.sync.take() {
            Some(sync) => sync.finish(),
            None => self.check_peers(),
        }
    }
}

impl Drop for ZeroRedundancy {
    fn drop(&mut self) {
        // Stage 1: the GradientSync announces itself when dropped unfinished.
        if self.sync.is_none() && !self.finished && !std::thread::panicking() {
            self.announce_failure("training stopped on this rank (its ZeroRedundancy was dropped before finish())");
        }
    }
}

/// A fresh f32 copy of the values of `piece` of `params`.
fn read_piece(params: &[Tensor], piece: &ShardPiece) -> Result<Tensor> {
    let _g = no_grad();
    let p = &params[piece.param];
    Ok(Tensor::from_vec(piece_values(p, p.numel(), piece)?, &[piece.len], p.device())?)
}

/// The values of `piece` of `t`, a tensor holding a whole parameter of `numel` values (the
/// parameter itself, its saved weight or an optimizer state of its size), as f32. Widened on the
/// host: a bf16 parameter's piece costs the device nothing beyond what the caller makes of it.
pub(super) fn piece_values(t: &Tensor, numel: usize, piece: &ShardPiece) -> Result<Vec<f32>> {
    let flat = t.detach().contiguous()?.reshape_usize(&[numel])?;
    read_f32(&flat.narrow(0, piece.param_start, piece.len)?)
}

/// Same tensor: the same elements of the same storage.
fn same_tensor(a: &Tensor, b: &Tensor) -> bool {
    a.shares_storage(b) && a.storage_offset() == b.storage_offset() && a.shape() == b.shape()
}
