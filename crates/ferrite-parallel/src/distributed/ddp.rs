//! `DistributedDataParallel`: one model replica per process, gradients averaged over MPI.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ferrite_nn::{Module, StateDict};
use ferrite_tensor::{Tensor, no_grad};

use super::error::{DistributedError, Result};
use super::process_group::{Comm, ProcessGroup};
use super::reducer::{Reducer, StepTimings};

/// How a [`DistributedDataParallel`] buckets and checks gradients.
#[derive(Debug, Clone)]
pub struct DdpOptions {
    /// Bytes of gradients per all-reduce (PyTorch's `bucket_cap_mb`, 25 MiB by default).
    pub bucket_cap_bytes: usize,
    /// Bytes of the first bucket, the last parameters, whose gradients backward produces first
    /// (PyTorch's 1 MiB `first_bucket_bytes`): small, so the first all-reduce starts early in
    /// backward instead of when 25 MiB of gradients are ready.
    pub first_bucket_bytes: usize,
    /// Allow parameters that receive no gradient in a step (PyTorch's `find_unused_parameters`);
    /// without it such a parameter is a [`DistributedError::UnusedParameters`].
    pub find_unused_parameters: bool,
    /// Copy rank 0's buffers (batch-norm statistics, ...) to every rank at wrap time.
    pub broadcast_buffers: bool,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            bucket_cap_bytes: ferrite_optim::DDP_BUCKET_CAP_BYTES,
            first_bucket_bytes: ferrite_optim::DDP_FIRST_BUCKET_BYTES,
            find_unused_parameters: false,
            broadcast_buffers: true,
        }
    }
}

impl DdpOptions {
    /// Bucket size in MiB. As in PyTorch, a bucket size given explicitly applies to the first
    /// bucket as well; call [`first_bucket_mb`](Self::first_bucket_mb) after it to change that.
    pub fn bucket_cap_mb(mut self, mb: f64) -> Self {
        self.bucket_cap_bytes = ((mb * 1024.0 * 1024.0) as usize).max(1);
        self.first_bucket_bytes = self.bucket_cap_bytes;
        self
    }

    /// Size of the first bucket in MiB (1 MiB by default).
    pub fn first_bucket_mb(mut self, mb: f64) -> Self {
        self.first_bucket_bytes = ((mb * 1024.0 * 1024.0) as usize).max(1);
        self
    }

    pub fn find_unused_parameters(mut self, yes: bool) -> Self {
        self.find_unused_parameters = yes;
        self
    }
}

/// Data parallelism across processes: each MPI rank holds a full replica, computes the loss on its
/// own share of the batch, and [`backward`](Self::backward) averages the gradients over all
/// ranks, overlapping the all-reduces with the rest of backward. After it every rank holds the
/// same gradients, so the same optimizer step keeps the replicas identical.
///
/// ```ignore
/// let group = ProcessGroup::init()?;
/// let ddp = DistributedDataParallel::new(model, &group, DdpOptions::default())?;
/// let loss = loss_fn(&ddp.forward(&x)?, &y)?;
/// ddp.backward(&loss)?;        // gradients averaged over ranks
/// opt.step()?;
/// ```
///
/// Faults: before every synchronizing backward the ranks exchange a status word; a rank whose
/// step fails still completes the step's collectives (with zeros), then reports its error in that
/// exchange, so every other rank stops with [`DistributedError::PeerFailed`] naming it. A rank
/// that dies outright (SIGKILL, a crash) is caught by `mpirun`, which ends the job when a rank
/// dies, or else by the collective deadline (`FERRITE_DDP_TIMEOUT_S`): the survivors then probe
/// their peers and stop with [`DistributedError::PeerDied`] naming the dead rank
/// ([`DistributedError::Timeout`] when every peer is alive but one hangs).
pub struct DistributedDataParallel<M: Module> {
    module: M,
    sync: GradientSync,
}

/// The gradient averaging of [`DistributedDataParallel`] without owning the model: for training
/// loops that keep the model elsewhere (`ferrite train --distributed`). Built from the model's
/// parameters; the same protocol (status exchange, buckets, `no_sync`, failure reports).
pub struct GradientSync {
    comm: Comm,
    reducer: Arc<Reducer>,
    options: DdpOptions,
    sync: AtomicBool,
    failed: AtomicBool,
    finished: bool,
}

/// Returned by [`DistributedDataParallel::no_sync`]: until it drops, backward only accumulates
/// local gradients (PyTorch's `no_sync()` context manager).
pub struct NoSync<'a> {
    pub(crate) flag: &'a AtomicBool,
    pub(crate) previous: bool,
}

impl Drop for NoSync<'_> {
    fn drop(&mut self) {
        self.flag.store(self.previous, Ordering::SeqCst);
    }
}

impl<M: Module> DistributedDataParallel<M> {
    /// Wrap `module`: check that every rank has the same parameter names and shapes (the error
    /// names the first difference), then copy rank 0's parameters and buffers to every rank.
    pub fn new(module: M, group: &ProcessGroup, options: DdpOptions) -> Result<Self> {
        Self::with_comm(module, group.comm(), options)
    }

    /// As [`new`](Self::new), from a [`Comm`] handle.
    pub fn with_comm(module: M, comm: Comm, options: DdpOptions) -> Result<Self> {
        let sync = GradientSync::new(&module, comm, options)?;
        Ok(DistributedDataParallel { module, sync })
    }

    pub fn rank(&self) -> usize {
        self.sync.rank()
    }

    pub fn world_size(&self) -> usize {
        self.sync.world_size()
    }

    /// The wrapped model.
    pub fn module(&self) -> &M {
        &self.module
    }

    pub fn module_mut(&mut self) -> &mut M {
        &mut self.module
    }

    /// The wrapped model's state dict: the plain names, no `module.` prefix.
    pub fn state_dict(&self) -> StateDict {
        self.module.state_dict()
    }

    /// The wrapped model's forward.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.module.forward(x)?)
    }

    /// How many parameters each gradient bucket holds (the first bucket = the last parameters,
    /// started first).
    pub fn bucket_sizes(&self) -> Vec<usize> {
        self.sync.bucket_sizes()
    }

    /// Until the guard drops, [`backward`](Self::backward) accumulates gradients locally without
    /// communicating; the first backward after it averages the accumulated gradients.
    pub fn no_sync(&self) -> NoSync<'_> {
        self.sync.no_sync()
    }

    /// `loss.backward()`, then (outside [`no_sync`](Self::no_sync)) the gradients averaged over
    /// every rank. Every rank must call it the same number of times.
    pub fn backward(&self, loss: &Tensor) -> Result<()> {
        self.sync.backward(loss)
    }

    /// See [`GradientSync::synchronize`].
    pub fn synchronize(&self) -> Result<()> {
        self.sync.synchronize()
    }

    /// See [`GradientSync::last_timings`].
    pub fn last_timings(&self) -> StepTimings {
        self.sync.last_timings()
    }

    /// See [`GradientSync::announce_failure`].
    pub fn announce_failure(&self, message: &str) {
        self.sync.announce_failure(message)
    }

    /// End of training: one last status exchange, so a rank that failed after the last step is
    /// reported too. Returns the module.
    pub fn finish(self) -> Result<M> {
        self.sync.finish()?;
        Ok(self.module)
    }
}

impl GradientSync {
    /// Check that every rank's `module` has the same parameter names and shapes (the error names
    /// the first difference), copy rank 0's parameters and buffers to every rank, and install
    /// the grad-ready hooks.
    pub fn new(module: &dyn Module, comm: Comm, options: DdpOptions) -> Result<Self> {
        let params = replicate_from_rank0(module, &comm, options.broadcast_buffers)?;
        let trainable: Vec<(String, Tensor)> = params.into_iter().filter(|(_, t)| t.requires_grad()).collect();
        let reducer =
            Arc::new(Reducer::new(comm.clone(), trainable, options.first_bucket_bytes, options.bucket_cap_bytes)?);
        reducer.install_hooks();
        Ok(GradientSync {
            comm,
            reducer,
            options,
            sync: AtomicBool::new(true),
            failed: AtomicBool::new(false),
            finished: false,
        })
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    /// How many gradient buckets there are and how many parameters each holds (first = the
    /// last parameters, started first).
    pub fn bucket_sizes(&self) -> Vec<usize> {
        self.reducer.buckets.iter().map(|b| b.params.len()).collect()
    }

    /// Where the time of the last synchronizing backward (or [`synchronize`](Self::synchronize))
    /// went: backward, communication, how much of it was hidden behind backward, copying.
    pub fn last_timings(&self) -> StepTimings {
        self.reducer.timings()
    }

    /// Until the guard drops, [`backward`](Self::backward) accumulates gradients locally without
    /// communicating; the first backward after it averages the accumulated gradients.
    pub fn no_sync(&self) -> NoSync<'_> {
        let previous = self.sync.swap(false, Ordering::SeqCst);
        NoSync { flag: &self.sync, previous }
    }

    /// `loss.backward()`, then (outside [`no_sync`](Self::no_sync)) the gradients averaged over
    /// every rank. Every rank must call it the same number of times.
    pub fn backward(&self, loss: &Tensor) -> Result<()> {
        if self.failed.load(Ordering::SeqCst) {
            return Err(DistributedError::AlreadyFailed { rank: self.rank() });
        }
        if !self.sync.load(Ordering::SeqCst) {
            return loss.backward().map_err(|e| self.fail_with(e.into(), false));
        }
        self.check_peers()?;
        self.reducer.begin();
        let result = loss
            .backward()
            .map_err(DistributedError::from)
            .and_then(|()| self.reducer.finish(self.options.find_unused_parameters));
        result.map_err(|e| self.fail_with(e, true))
    }

    /// Average the gradients the parameters hold now, without a backward (e.g. a partial
    /// accumulation group at the end of an epoch, accumulated under [`no_sync`](Self::no_sync)).
    pub fn synchronize(&self) -> Result<()> {
        if self.failed.load(Ordering::SeqCst) {
            return Err(DistributedError::AlreadyFailed { rank: self.rank() });
        }
        self.check_peers()?;
        self.reducer.begin();
        self.reducer.finish(true).map_err(|e| self.fail_with(e, true))
    }

    /// Every rank's status before a step: an error naming the first rank that failed.
    fn check_peers(&self) -> Result<()> {
        let statuses = self.comm.all_gather_status(None).inspect_err(|_| self.failed.store(true, Ordering::SeqCst))?;
        if let Some(e) = Comm::first_failure(&statuses) {
            self.failed.store(true, Ordering::SeqCst);
            return Err(e);
        }
        Ok(())
    }

    /// Record a local error: finish this step's collectives, tell the other ranks, return `e`.
    fn fail_with(&self, e: DistributedError, in_step: bool) -> DistributedError {
        if in_step {
            self.reducer.drain();
        }
        self.announce_failure(&e.to_string());
        e
    }

    /// Record that the ranks already agreed this run stops (every rank learnt it in the same
    /// collective), so that nothing is announced any more.
    pub(crate) fn mark_failed(&self) {
        self.failed.store(true, Ordering::SeqCst);
    }

    /// Tell the other ranks that this rank stops because of `message` (they get
    /// [`DistributedError::PeerFailed`] at their next step). Call it when your own code fails
    /// between steps (data loading, a checkpoint write, ...); [`backward`](Self::backward) calls
    /// it itself. Does nothing after a lost collective or a peer's failure.
    pub fn announce_failure(&self, message: &str) {
        if self.failed.swap(true, Ordering::SeqCst) || self.comm.is_broken() {
            return;
        }
        let _ = self.comm.all_gather_status(Some(message));
    }

    /// End of training: one last status exchange, so a rank that failed after the last step is
    /// reported too.
    pub fn finish(mut self) -> Result<()> {
        if self.failed.load(Ordering::SeqCst) {
            return Err(DistributedError::AlreadyFailed { rank: self.rank() });
        }
        self.finished = true;
        self.check_peers()?;
        self.reducer.remove_hooks();
        Ok(())
    }
}

impl Drop for GradientSync {
    fn drop(&mut self) {
        self.reducer.remove_hooks();
        if !self.finished && !std::thread::panicking() {
            self.announce_failure(
                "training stopped on this rank (its DistributedDataParallel was dropped before finish())",
            );
        }
    }
}

/// Check that every rank's `module` has the same parameter names and shapes (the error names the
/// first difference), then copy rank 0's parameters (and buffers, if asked) to every rank.
/// Returns the module's named parameters. Shared by DDP and ZeRO.
pub(crate) fn replicate_from_rank0(
    module: &dyn Module,
    comm: &Comm,
    broadcast_buffers: bool,
) -> Result<Vec<(String, Tensor)>> {
    let params = module.named_parameters();
    let buffers = if broadcast_buffers { module.named_buffers() } else { Vec::new() };
    let signature = |items: &[(String, Tensor)], kind: &str| -> String {
        items.iter().map(|(n, t)| format!("{kind} {n} {:?}\n", t.shape())).collect()
    };
    let mine = signature(&params, "parameter") + &signature(&buffers, "buffer");
    let root = String::from_utf8_lossy(&comm.broadcast_bytes(mine.clone().into_bytes())?).into_owned();
    let mismatch = describe_mismatch(&root, &mine);
    let statuses = comm.all_gather_status(mismatch.as_deref())?;
    if let Some((rank, detail)) = statuses.iter().enumerate().find_map(|(r, s)| s.clone().map(|d| (r, d))) {
        return Err(DistributedError::ParameterMismatch { rank, detail });
    }
    {
        let _g = no_grad();
        let all: Vec<&Tensor> = params.iter().chain(buffers.iter()).map(|(_, t)| t).collect();
        let mut flat = Vec::new();
        for t in &all {
            flat.extend(t.to_vec_f64()?);
        }
        let flat = comm.broadcast_f64(flat)?;
        let mut off = 0;
        for t in &all {
            let n = t.numel();
            let src = Tensor::from_vec(flat[off..off + n].to_vec(), t.shape(), t.device())?;
            t.copy_(&src)?;
            off += n;
        }
    }
    Ok(params)
}

/// The first line where this rank's parameter list differs from rank 0's.
fn describe_mismatch(root: &str, mine: &str) -> Option<String> {
    if root == mine {
        return None;
    }
    let mut r = root.lines();
    let mut m = mine.lines();
    loop {
        match (r.next(), m.next()) {
            (Some(a), Some(b)) if a == b => continue,
            (Some(a), Some(b)) => return Some(format!("has `{b}` where rank 0 has `{a}` (name and shape)")),
            (Some(a), None) => return Some(format!("lacks `{a}` that rank 0 has")),
            (None, Some(b)) => return Some(format!("has `{b}` that rank 0 lacks")),
            (None, None) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::describe_mismatch;

    #[test]
    fn mismatch_names_the_parameter_and_shapes() {
        let root = "parameter fc.weight [4, 8]\nparameter fc.bias [4]\n";
        assert_eq!(describe_mismatch(root, root), None);
        let d = describe_mismatch(root, "parameter fc.weight [4, 9]\nparameter fc.bias [4]\n").unwrap();
        assert!(d.contains("fc.weight [4, 9]") && d.contains("[4, 8]"), "{d}");
        assert!(describe_mismatch(root, "parameter fc.weight [4, 8]\n").unwrap().contains("fc.bias"));
    }
}
