//! ZeRO-3 (PyTorch FSDP's `FULL_SHARD`): the parameters are sharded too. Each rank keeps only
//! its ZeRO shards (f32 master values of its range of the flat layout, the same
//! [`ZeroRedundancy`] pieces as stages 1 and 2, so the optimizer, clipping, the scaler's verdict
//! and sharded checkpoints are stage 2's); a unit's full parameters exist only while the unit
//! computes.
//!
//! **Units.** A unit is one repeated block of the model, found from the trainable parameter
//! names (`ferrite_optim::zero3_units`, which the planner uses too): the prefix up to the first
//! numeric component (`blocks.3`, `model.layers.3`,
//! `encoder.block.0`, an MLP's `2`). Every built-in and HF model announces the block its forward
//! enters with `ferrite_nn::mark_layer` under exactly that name, which is how the gathering knows
//! where it is. Parameters outside every unit (embeddings, final norm, tied head) form the *root*:
//! always gathered, as PyTorch keeps the root FSDP unit's parameters. A model with no unit is
//! [`DistributedError::ZeroNoUnits`].
//!
//! **Forward.** On the mark of unit `k`: the unit computed before it is released (its storage
//! given back to the allocator: `Tensor::release_storage`), unit `k` is all-gathered from every
//! rank's shards into its parameters (`Tensor::refill_storage_from`, no copy), and unit `k + 1`'s
//! all-gather is started on the communication thread (prefetch: it runs while `k` computes).
//! The sequence number of the next autograd node is noted at each mark.
//!
//! **Backward.** Autograd runs nodes in decreasing creation order and calls a per-thread hook
//! before each (`ferrite_tensor::autograd::set_backward_node_hook`); from a node's number the
//! hook knows its unit. Entering unit `k`: every other unit still gathered is finished — its
//! gradients reduce-scattered (queued; the next unit's backward runs meanwhile) into the ranks'
//! shards and its storage released — unit `k` is gathered again (prefetched when backward
//! entered the unit after it) and the gather of the unit computed before `k` in forward is
//! started. Activation checkpointing works unchanged: a recomputation re-enters the unit's mark,
//! which gathers it. The released parameters keep their identity, so the tensors autograd saved
//! see the refilled bytes (the version counter is not bumped: the values are the same).
//!
//! Under [`no_sync`](FullySharded::no_sync) (accumulation) the full gradients accumulate on the
//! parameters and are reduce-scattered by the synchronizing backward, as PyTorch's FSDP does. The
//! step is [`ZeroRedundancy::step`]: after it only the root's parameters are written.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use ferrite_nn::{LayerMarkGuard, Module, listen_for_layer_marks};
use ferrite_optim::{GradScaler, Optim, Optimizer, UpdateRule};
use ferrite_tensor::autograd::{BackwardNodeHookGuard, next_node_seq, set_backward_node_hook};
use ferrite_tensor::{Tensor, no_grad};

use super::ddp::NoSync;
use super::error::{DistributedError, Result};
use super::host_values::{fresh_like, read_f32};
use super::process_group::{Comm, Pending};
use super::zero::{ZeroOptions, ZeroRedundancy, ZeroStage, ZeroStepOutcome};

/// Consecutive parameters (indices `first..=last`) and their flat span `[lo, hi)`.
#[derive(Debug, Clone)]
struct Run {
    first: usize,
    last: usize,
    lo: usize,
    hi: usize,
}

#[derive(Debug)]
struct Unit {
    name: String,
    params: Vec<usize>,
    runs: Vec<Run>,
}

struct Inner {
    zero: ZeroRedundancy,
    units: Vec<Unit>,
    root: Vec<Run>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    gathered: Vec<bool>,
    /// Forward: the unit computing now.
    open: Option<usize>,
    in_backward: bool,
    /// Node sequence numbers where a unit (or the root: `None`) begins, in forward order.
    ranges: Vec<(u64, Option<usize>)>,
    /// Backward: the unit backward is in.
    bw_open: Option<usize>,
    /// Reduce-scattered in this backward.
    done: Vec<bool>,
    prefetch: Option<(usize, Vec<Pending<Vec<f32>>>)>,
    scatters: VecDeque<(Run, Pending<Vec<f32>>)>,
    /// The first error met inside a hook or a mark (neither can return one).
    error: Option<DistributedError>,
    /// Most units gathered at once (for the tests and the memory summary).
    max_gathered: usize,
    /// Time the training thread spent blocked on gathers and reduce-scatters (see
    /// [`FullySharded::take_waited`]).
    waited: std::time::Duration,
    /// After [`FullySharded::gather_all`]: the whole model stays gathered (marks and backward
    /// change nothing) until [`FullySharded::release_all`].
    pinned: bool,
}

/// ZeRO-3 over a model kept elsewhere (see the module docs). Lives on the thread that runs the
/// model (its mark listener and backward hook are that thread's).
///
/// ```ignore
/// let fsdp = FullySharded::new(&model, "TransformerLm", group.comm(), ZeroOptions::new(ZeroStage::Three))?;
/// let mut opt = fsdp.shard_optimizer(&Adam::new(model.parameters(), AdamConfig::adamw(1e-3))?)?;
/// let loss = loss_fn(&model.forward(&x)?)?;   // units gathered and freed as the forward goes
/// fsdp.backward(&loss)?;                        // gathered again, gradients reduce-scattered per unit
/// fsdp.step(&mut opt, Some(1.0), None)?;
/// fsdp.zero_grad(&mut opt)?;
/// fsdp.finish()?;
/// ```
pub struct FullySharded {
    inner: Arc<Inner>,
    _marks: LayerMarkGuard,
    _hook: BackwardNodeHookGuard,
}

impl FullySharded {
    /// Shard `module` (named `model` in errors) over the ranks of `comm` and release every unit's
    /// parameters. `options.stage` is ignored (this is stage 3).
    pub fn new(module: &dyn Module, model: &str, comm: Comm, options: ZeroOptions) -> Result<FullySharded> {
        let names: Vec<String> =
            module.named_parameters().into_iter().filter(|(_, t)| t.requires_grad()).map(|(n, _)| n).collect();
        let found = ferrite_optim::zero3_units(&names);
        let unit_names: Vec<String> = found.iter().map(|(n, _)| n.clone()).collect();
        let mut unit_of: Vec<Option<usize>> = vec![None; names.len()];
        for (u, (_, members)) in found.iter().enumerate() {
            for &i in members {
                unit_of[i] = Some(u);
            }
        }
        if unit_names.is_empty() {
            return Err(DistributedError::ZeroNoUnits { model: model.to_string() });
        }
        let zero = ZeroRedundancy::new(module, comm, ZeroOptions { stage: ZeroStage::Three, ..options })?;
        let runs_of = |members: &[usize]| -> Vec<Run> {
            let mut runs: Vec<Run> = Vec::new();
            for &i in members {
                let (lo, hi) = (zero.partition.offset(i), zero.partition.offset(i) + zero.partition.numel(i));
                match runs.last_mut() {
                    Some(r) if r.last + 1 == i => {
                        r.last = i;
                        r.hi = hi;
                    }
                    _ => runs.push(Run { first: i, last: i, lo, hi }),
                }
            }
            runs
        };
        let units: Vec<Unit> = unit_names
            .into_iter()
            .enumerate()
            .map(|(u, name)| {
                let params: Vec<usize> = (0..names.len()).filter(|&i| unit_of[i] == Some(u)).collect();
                let runs = runs_of(&params);
                Unit { name, params, runs }
            })
            .collect();
        let root_params: Vec<usize> = (0..names.len()).filter(|&i| unit_of[i].is_none()).collect();
        let root = runs_of(&root_params);
        let state = State { gathered: vec![false; units.len()], done: vec![false; units.len()], ..State::default() };
        for u in &units {
            for &i in &u.params {
                zero.params[i].release_storage();
            }
        }
        let inner = Arc::new(Inner { zero, units, root, state: Mutex::new(state) });
        let on_mark = inner.clone();
        let marks = listen_for_layer_marks(move |name| on_mark.on_mark(name));
        let on_node = inner.clone();
        let hook = set_backward_node_hook(Arc::new(move |seq| on_node.before_node(seq)));
        Ok(FullySharded { inner, _marks: marks, _hook: hook })
    }

    /// The ZeRO shards underneath (what sharded checkpoints read and write).
    pub fn zero(&self) -> &ZeroRedundancy {
        &self.inner.zero
    }

    /// The units' names, in parameter order.
    pub fn unit_names(&self) -> Vec<String> {
        self.inner.units.iter().map(|u| u.name.clone()).collect()
    }

    /// The time the training thread spent blocked on unit gathers and reduce-scatters since the
    /// last call (the communication not hidden behind forward and backward; the step's own
    /// collectives are not counted here), reset to zero.
    pub fn take_waited(&self) -> std::time::Duration {
        std::mem::take(&mut self.inner.lock().waited)
    }

    /// The most units gathered at the same time so far (2 with prefetch).
    pub fn max_units_gathered(&self) -> usize {
        self.inner.lock().max_gathered
    }

    pub fn rank(&self) -> usize {
        self.inner.zero.rank()
    }

    pub fn world_size(&self) -> usize {
        self.inner.zero.world_size()
    }

    /// See [`ZeroRedundancy::shard_optimizer`].
    pub fn shard_optimizer<R: UpdateRule>(&self, full: &Optim<R>) -> Result<Optim<R>> {
        self.inner.zero.shard_optimizer(full)
    }

    /// Until the guard drops, [`backward`](Self::backward) accumulates full gradients locally.
    pub fn no_sync(&self) -> NoSync<'_> {
        self.inner.zero.no_sync()
    }

    /// `loss.backward()` with every unit gathered before its backward and released after it;
    /// outside [`no_sync`](Self::no_sync) the gradients are reduce-scattered into the shards
    /// unit by unit, the root's last.
    pub fn backward(&self, loss: &Tensor) -> Result<()> {
        let z = &self.inner.zero;
        z.check_not_failed()?;
        if let Some(e) = self.inner.lock().error.take() {
            return Err(z.fail_with(e));
        }
        let synchronizing = z.synchronizing.load(Ordering::SeqCst);
        if synchronizing {
            z.check_peers()?;
        }
        {
            let mut s = self.inner.lock();
            s.in_backward = true;
            s.bw_open = None;
            s.done.iter_mut().for_each(|d| *d = false);
            s.ranges.push((next_node_seq(), None));
        }
        let local = loss.backward();
        let ended = self.inner.end_backward(synchronizing);
        let mut s = self.inner.lock();
        s.in_backward = false;
        s.ranges.clear();
        let hook_error = s.error.take();
        drop(s);
        match (hook_error, local, ended) {
            (Some(e), _, _) => Err(z.fail_with(e)),
            (None, Err(e), _) => Err(z.fail_with(e.into())),
            (None, Ok(()), r) => r.map_err(|e| z.fail_with(e)),
        }
    }

    /// Reduce-scatter the full gradients the parameters hold now (the end of a partial
    /// accumulation group), without a backward.
    pub fn synchronize(&self) -> Result<()> {
        let z = &self.inner.zero;
        z.check_not_failed()?;
        z.check_peers()?;
        self.inner.lock().done.iter_mut().for_each(|d| *d = false);
        self.inner.end_backward(true).map_err(|e| z.fail_with(e))
    }

    /// See [`ZeroRedundancy::step`]; afterwards only the root's parameters hold values. Only
    /// the root (and any unit held whole, after [`gather_all`](Self::gather_all)) is
    /// all-gathered: a released unit's next gather reads the updated shards.
    pub fn step(
        &self,
        opt: &mut dyn Optimizer,
        max_grad_norm: Option<f64>,
        scaler: Option<&mut GradScaler>,
    ) -> Result<ZeroStepOutcome> {
        self.inner.drain_prefetch()?;
        let spans: Vec<(usize, usize)> = {
            let mut s = self.inner.lock();
            s.ranges.clear();
            let held = self.inner.units.iter().enumerate().filter(|(k, _)| s.gathered[*k]);
            let mut spans: Vec<(usize, usize)> = self.inner.root.iter().map(|r| (r.lo, r.hi)).collect();
            spans.extend(held.flat_map(|(_, u)| u.runs.iter().map(|r| (r.lo, r.hi))));
            spans.sort_unstable();
            spans
        };
        self.inner.zero.step_gathering(opt, max_grad_norm, scaler, Some(&spans))
    }

    pub fn zero_grad(&self, opt: &mut dyn Optimizer) -> Result<()> {
        self.inner.zero.zero_grad(opt)
    }

    /// Gather every unit and keep the model whole — forwards (evaluation, sampling) and
    /// `state_dict` then work as without sharding — until [`release_all`](Self::release_all).
    /// Every rank must call it.
    pub fn gather_all(&self) -> Result<()> {
        self.inner.drain_prefetch()?;
        for k in 0..self.inner.units.len() {
            self.inner.ensure_gathered(k)?;
        }
        self.inner.lock().pinned = true;
        Ok(())
    }

    /// Release every unit's parameters (after [`gather_all`](Self::gather_all)): sharded again.
    pub fn release_all(&self) {
        for k in 0..self.inner.units.len() {
            self.inner.release(k);
        }
        let mut s = self.inner.lock();
        s.open = None;
        s.pinned = false;
    }

    /// Copy the parameters' values into the shards (after loading weights into the model on every
    /// rank): gathers, reloads and releases.
    pub fn reload_shards(&self) -> Result<()> {
        self.gather_all()?;
        let r = self.inner.zero.reload_shards();
        self.release_all();
        r
    }

    /// Tell the other ranks this rank stops (see [`ZeroRedundancy::announce_failure`]).
    pub fn announce_failure(&self, message: &str) {
        self.inner.zero.announce_failure(message);
    }

    /// End of training: the prefetch still in flight is completed, then stage 2's last status
    /// exchange. The units' parameters are left gathered (the model is whole again).
    pub fn finish(self) -> Result<()> {
        self.gather_all()?;
        let FullySharded { inner, _marks, _hook } = self;
        drop(_marks);
        drop(_hook);
        match Arc::try_unwrap(inner) {
            Ok(inner) => inner.zero.finish(),
            Err(_) => Ok(()),
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn keep_error(&self, e: DistributedError) {
        self.zero.mark_failed();
        self.lock().error.get_or_insert(e);
    }

    /// A layer mark (see the module docs). Errors are kept for the next `backward`/`step`; the
    /// forward itself then fails on a released parameter.
    fn on_mark(&self, name: &str) {
        let unit = self.units.iter().position(|u| u.name == name);
        let (in_backward, open) = {
            let mut s = self.lock();
            if s.error.is_some() || s.pinned {
                return;
            }
            if !s.in_backward {
                // A unit before the last one marked: a new forward (after an evaluation's, say),
                // whose nodes the earlier marks must not claim.
                let last = s.ranges.iter().rev().find_map(|(_, u)| *u);
                if let (Some(k), Some(l)) = (unit, last)
                    && k < l
                {
                    s.ranges.clear();
                }
                s.ranges.push((next_node_seq(), unit));
            }
            (s.in_backward, s.open)
        };
        let r = (|| -> Result<()> {
            if in_backward {
                // A recomputation (activation checkpointing): gather only.
                if let Some(k) = unit {
                    self.ensure_gathered(k)?;
                }
                return Ok(());
            }
            if let Some(j) = open
                && Some(j) != unit
            {
                self.release(j);
                self.lock().open = None;
            }
            if let Some(k) = unit {
                self.ensure_gathered(k)?;
                self.lock().open = Some(k);
                if k + 1 < self.units.len() {
                    self.start_prefetch(k + 1)?;
                }
            }
            Ok(())
        })();
        if let Err(e) = r {
            self.keep_error(e);
        }
    }

    /// The backward hook (see the module docs).
    fn before_node(&self, seq: u64) -> std::result::Result<(), String> {
        let (unit, previous_in_forward) = {
            let s = self.lock();
            if let Some(e) = &s.error {
                return Err(e.to_string());
            }
            if s.pinned {
                return Ok(());
            }
            let at = s.ranges.partition_point(|(start, _)| *start <= seq);
            let Some(&(_, Some(k))) = at.checked_sub(1).and_then(|i| s.ranges.get(i)) else { return Ok(()) };
            if s.bw_open == Some(k) {
                return Ok(());
            }
            let before = s.ranges[..at].iter().rev().filter_map(|(_, u)| *u).find(|u| *u != k);
            (k, before)
        };
        let r = (|| -> Result<()> {
            let synchronizing = self.zero.synchronizing.load(Ordering::SeqCst);
            let others: Vec<usize> = {
                let s = self.lock();
                (0..self.units.len()).filter(|&j| j != unit && s.gathered[j]).collect()
            };
            for j in others {
                self.finish_unit(j, synchronizing)?;
            }
            self.ensure_gathered(unit)?;
            self.lock().bw_open = Some(unit);
            if let Some(p) = previous_in_forward {
                self.start_prefetch(p)?;
            }
            Ok(())
        })();
        r.map_err(|e| {
            let text = e.to_string();
            self.keep_error(e);
            text
        })
    }

    /// After `loss.backward()`: finish every unit still gathered, reduce-scatter the units not
    /// yet done and the root (synchronizing), and attach every rank's share.
    fn end_backward(&self, synchronizing: bool) -> Result<()> {
        self.drain_prefetch()?;
        for k in 0..self.units.len() {
            let (gathered, done) = {
                let s = self.lock();
                (s.gathered[k], s.done[k])
            };
            if gathered {
                self.finish_unit(k, synchronizing)?;
            } else if synchronizing && !done {
                for run in &self.units[k].runs {
                    self.scatter(run)?;
                }
                self.lock().done[k] = true;
            }
        }
        if synchronizing {
            for run in &self.root {
                self.scatter(run)?;
            }
        }
        self.wait_scatters(0)?;
        let mut s = self.lock();
        s.open = None;
        s.bw_open = None;
        Ok(())
    }

    /// A unit whose backward is over: its gradients reduce-scattered (synchronizing), its
    /// parameters released.
    fn finish_unit(&self, k: usize, synchronizing: bool) -> Result<()> {
        if synchronizing && !self.lock().done[k] {
            for run in &self.units[k].runs {
                self.scatter(run)?;
            }
            self.lock().done[k] = true;
        }
        self.release(k);
        Ok(())
    }

    fn release(&self, k: usize) {
        for &i in &self.units[k].params {
            self.zero.params[i].release_storage();
        }
        self.lock().gathered[k] = false;
    }

    fn start_prefetch(&self, k: usize) -> Result<()> {
        {
            let s = self.lock();
            if s.gathered[k] || s.prefetch.as_ref().is_some_and(|(u, _)| *u == k) {
                return Ok(());
            }
        }
        self.drain_prefetch()?;
        let pending = self.units[k].runs.iter().map(|run| self.start_gather(run)).collect::<Result<Vec<_>>>()?;
        self.lock().prefetch = Some((k, pending));
        Ok(())
    }

    /// Complete a prefetch in flight (every rank started it) and use it.
    fn drain_prefetch(&self) -> Result<()> {
        let Some((k, pending)) = self.lock().prefetch.take() else { return Ok(()) };
        self.finish_gather(k, pending)
    }

    fn ensure_gathered(&self, k: usize) -> Result<()> {
        if self.lock().gathered[k] {
            return Ok(());
        }
        let prefetched = self.lock().prefetch.as_ref().is_some_and(|(u, _)| *u == k);
        if !prefetched {
            // Every rank started the same prefetch: complete it before the next collective.
            self.drain_prefetch()?;
            let pending = self.units[k].runs.iter().map(|run| self.start_gather(run)).collect::<Result<Vec<_>>>()?;
            self.lock().prefetch = Some((k, pending));
        }
        self.drain_prefetch()
    }

    /// Values per rank block of `run`'s collective: the most any rank owns of its span.
    fn block_len(&self, run: &Run) -> usize {
        let per = self.zero.partition.per_rank();
        (0..self.zero.world_size())
            .map(|r| run.hi.min((r + 1) * per).saturating_sub(run.lo.max(r * per)))
            .max()
            .unwrap_or(0)
    }

    /// This rank's part of `[run.lo, run.hi)`: `(first flat index, count)`.
    fn my_part(&self, run: &Run, rank: usize) -> (usize, usize) {
        let per = self.zero.partition.per_rank();
        // Clamped: a rank whose range ends before the run (or starts after it) owns nothing.
        let lo = run.lo.max(rank * per).min(run.hi);
        (lo, run.hi.min((rank + 1) * per).saturating_sub(lo))
    }

    /// Start the all-gather of `run`: this rank's block is its status, then its shard values.
    fn start_gather(&self, run: &Run) -> Result<Pending<Vec<f32>>> {
        let m = self.block_len(run);
        let mut block = vec![0f32; m + 1];
        let (lo, _) = self.my_part(run, self.zero.rank());
        let local = (|| -> Result<()> {
            for (piece, shard) in self.zero.pieces.iter().zip(&self.zero.shards) {
                if piece.param < run.first || piece.param > run.last {
                    continue;
                }
                let at = self.zero.partition.offset(piece.param) + piece.param_start - lo;
                block[1 + at..1 + at + piece.len].copy_from_slice(&shard.to_vec::<f32>()?);
            }
            Ok(())
        })();
        if local.is_ok() {
            block[0] = 1.0;
        } else {
            block[1..].iter_mut().for_each(|v| *v = 0.0);
        }
        let pending = self.zero.comm.start_all_gather(block, self.zero.comm_dtype)?;
        local?;
        Ok(pending)
    }

    /// Finish unit `k`'s gathers and write the values into its (released) parameters.
    fn finish_gather(&self, k: usize, pending: Vec<Pending<Vec<f32>>>) -> Result<()> {
        let _g = no_grad();
        let world = self.zero.world_size();
        for (run, p) in self.units[k].runs.iter().zip(pending) {
            let t = std::time::Instant::now();
            let all = p.wait();
            self.lock().waited += t.elapsed();
            let all = all?;
            let m = self.block_len(run);
            if let Some(rank) = (0..world).find(|r| all[r * (m + 1)] == 0.0) {
                return Err(DistributedError::PeerFailed {
                    rank,
                    message: format!("its part of ZeRO-3 unit {} could not be read", self.units[k].name),
                });
            }
            let mut flat = vec![0f32; run.hi - run.lo];
            for r in 0..world {
                let (lo, n) = self.my_part(run, r);
                let src = &all[r * (m + 1) + 1..r * (m + 1) + 1 + n];
                flat[lo - run.lo..lo - run.lo + n].copy_from_slice(src);
            }
            for i in run.first..=run.last {
                let p = &self.zero.params[i];
                let at = self.zero.partition.offset(i) - run.lo;
                // Rounded to the parameter's dtype on the host: the device allocates the
                // parameter's own bytes only.
                p.refill_storage_from(fresh_like(p, flat[at..at + p.numel()].to_vec())?)?;
            }
        }
        let mut s = self.lock();
        s.gathered[k] = true;
        let now = s.gathered.iter().filter(|g| **g).count();
        s.max_gathered = s.max_gathered.max(now);
        Ok(())
    }

    /// Queue the reduce-scatter of the full gradients of `run`'s parameters (missing ones count
    /// as zeros) and free them; at most two stay in flight.
    fn scatter(&self, run: &Run) -> Result<()> {
        let _g = no_grad();
        let m = self.block_len(run);
        let world = self.zero.world_size();
        let mut flat = vec![0f32; run.hi - run.lo];
        for i in run.first..=run.last {
            let p = &self.zero.params[i];
            if let Some(g) = p.grad() {
                let at = self.zero.partition.offset(i) - run.lo;
                flat[at..at + p.numel()].copy_from_slice(&read_f32(&g)?);
                p.set_grad(None)?;
            }
        }
        let mut send = vec![0f32; world * m];
        for r in 0..world {
            let (lo, n) = self.my_part(run, r);
            send[r * m..r * m + n].copy_from_slice(&flat[lo - run.lo..lo - run.lo + n]);
        }
        drop(flat);
        let pending = self.zero.comm.reduce_scatter_sum(send, self.zero.comm_dtype)?;
        self.lock().scatters.push_back((run.clone(), pending));
        self.wait_scatters(2)
    }

    /// Wait for the queued reduce-scatters until at most `keep` are in flight, adding each
    /// rank's averaged share into its shards' gradients.
    fn wait_scatters(&self, keep: usize) -> Result<()> {
        loop {
            let next = {
                let mut s = self.lock();
                if s.scatters.len() <= keep {
                    return Ok(());
                }
                s.scatters.pop_front()
            };
            let Some((run, pending)) = next else { return Ok(()) };
            let t = std::time::Instant::now();
            let got = pending.wait();
            self.lock().waited += t.elapsed();
            let got = got?;
            let scale = 1.0 / self.zero.world_size() as f32;
            let (lo, _) = self.my_part(&run, self.zero.rank());
            let _g = no_grad();
            for (piece, shard) in self.zero.pieces.iter().zip(&self.zero.shards) {
                if piece.param < run.first || piece.param > run.last {
                    continue;
                }
                let at = self.zero.partition.offset(piece.param) + piece.param_start - lo;
                let v: Vec<f32> = got[at..at + piece.len].iter().map(|x| x * scale).collect();
                let g = Tensor::from_vec(v, &[piece.len], shard.device())?;
                match shard.grad() {
                    Some(old) => old.add_(&g)?,
                    None => shard.set_grad(Some(g))?,
                }
            }
        }
    }
}
