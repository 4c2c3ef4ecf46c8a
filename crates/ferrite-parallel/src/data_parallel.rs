//! `DataParallel`: one process, one model replica per device, each step's batch split between
//! them (PyTorch's `nn.DataParallel`, with its footguns removed).
//!
//! A step: the batch is [scattered](scatter) along dim 0 (as evenly as possible; replicas with
//! no samples sit the step out), every replica runs forward, **its own loss** and backward in its
//! own thread, only the scalar losses come back, and the replicas' gradients are summed onto the
//! parameter's **owner** replica — each replica's loss weighted by its share of the samples, so the
//! result equals the single-device step on the whole batch with a mean loss. The optimizer steps
//! the owners' parameters; [`DataParallel::step`] then copies every parameter from its owner (and
//! the buffers from the primary) to the other replicas, which stay in sync.
//!
//! Where this differs from PyTorch, on purpose:
//! - **Balanced memory.** PyTorch gathers every replica's output on GPU 0 and computes the loss
//!   there, which is why GPU 0 runs out first. Here the loss is computed per replica and only
//!   scalars are gathered; [`DataParallel::memory_report`] shows every device's peak.
//! - **Balanced optimizer state.** PyTorch reduces every gradient onto GPU 0 and its optimizer
//!   keeps all its state there (AdamW: twice the parameters). Here each parameter has an
//!   [owner](owners) replica, chosen to balance bytes across the devices
//!   ([`OwnerPolicy::Balanced`], the default); [`DataParallel::parameters`] returns the owners'
//!   tensors, so an ordinary optimizer built from them creates each state tensor on its owner's
//!   device, and its state_dict has the single-device layout. Whole parameters balance only as
//!   finely as the largest one; [`OwnerPolicy::Sharded`] cuts the parameters into one equal flat
//!   run per device (ZeRO stage 1), balancing any model, with
//!   [`DataParallel::optimizer_state_dict`] for the single-device layout.
//!   [`OwnerPolicy::Primary`] keeps PyTorch's layout.
//! - **No `module.` prefix.** [`DataParallel::state_dict`] has the plain model's names, and
//!   [`DataParallel::load_state_dict`] / [`DataParallel::load_file`] strip a `module.` prefix
//!   left by PyTorch's wrappers.
//! - **Packed sequences keep their length.** Every replica unpacks to the whole batch's padded
//!   length ([`Shard::pad_packed`], [`DataParallel::forward_packed`]), so outputs of replicas
//!   that saw shorter sequences still gather.
//!
//! ```
//! use ferrite_memory::{Device, select_devices};
//! use ferrite_nn::{Linear, Module};
//! use ferrite_optim::{Sgd, SgdConfig};
//! use ferrite_parallel::DataParallel;
//! use ferrite_tensor::{DType, Tensor, functional::mse_loss};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let devices = select_devices(&Device::parse("sim:a100-40gb")?, Some("0,1"))?;
//! let dp = DataParallel::new(Linear::new(4, 1)?, &devices)?;
//! let mut opt = Sgd::new(dp.parameters(), SgdConfig::new(0.1))?;
//! let (x, y) = (Tensor::randn(&[6, 4], DType::F32, &Device::Cpu)?, Tensor::zeros(&[6, 1], DType::F32, &Device::Cpu)?);
//! let loss = dp.forward_backward(&[&x, &y], |m, s| Ok(mse_loss(&m.forward(&s.tensors[0])?, &s.tensors[1])?))?;
//! dp.step(&mut opt)?;
//! println!("loss {:.4}; {}", loss.loss, dp.memory_report());
//! # Ok(()) }
//! ```

pub mod memory_report;
mod optimizer_state;
pub mod owners;
pub mod replicate;
pub mod scatter;

use std::path::Path;

use ferrite_memory::Device;
use ferrite_nn::state_dict::{IncompatibleKeys, LoadOptions as NnLoadOptions, StateDict};
use ferrite_nn::{Module, PackedSequence, pack_padded_sequence};
use ferrite_optim::{Optimizer, OptimizerState};
use ferrite_tensor::{Tensor, no_grad};

pub use memory_report::{DeviceMemory, MemoryReport};
pub use owners::{OwnerPolicy, Piece};
pub use scatter::{Shard, split_sizes};

use crate::error::{ParallelError, Result};

/// The prefix PyTorch's `DataParallel`/`DistributedDataParallel` put before every key.
pub const MODULE_PREFIX: &str = "module.";

/// A model replicated on several devices (see the module documentation).
pub struct DataParallel<M: Module + Clone + 'static> {
    replicas: Vec<M>,
    devices: Vec<Device>,
    /// What each replica owns: whole parameters, or flat pieces of them
    /// ([`OwnerPolicy::Sharded`]), in the module's parameter order.
    pieces: Vec<Piece>,
    /// The optimizer's tensors, one per piece (the owner's parameter, or a view into it); kept so
    /// that every call of [`parameters`](Self::parameters) hands out the same tensors (a view's
    /// gradient lives on the view).
    targets: Vec<Tensor>,
    /// The owner of every piece.
    owners: Vec<usize>,
    policy: OwnerPolicy,
}

/// What one data-parallel forward/backward gave: the batch's loss and each replica's part.
#[derive(Debug, Clone, PartialEq)]
pub struct StepLoss {
    /// The whole batch's mean loss (the sample-weighted mean of the replicas' losses): the number
    /// a single-device step would report.
    pub loss: f64,
    /// `(device, samples, loss)` of every replica that had samples.
    pub replicas: Vec<(Device, usize, f64)>,
}

impl<M: Module + Clone + 'static> DataParallel<M> {
    /// Replicate `module` on `devices` (the first is the primary: the model a single-device user
    /// sees), with the parameters' owners spread over the devices ([`OwnerPolicy::Balanced`]).
    /// The module is moved to `devices[0]`; build the optimizer from
    /// [`parameters`](Self::parameters) afterwards.
    pub fn new(module: M, devices: &[Device]) -> Result<Self> {
        Self::with_owners(module, devices, OwnerPolicy::default())
    }

    /// [`new`](Self::new) with the owners chosen by `policy` ([`OwnerPolicy::Primary`]: PyTorch's
    /// layout, every gradient and all optimizer state on device 0).
    pub fn with_owners(module: M, devices: &[Device], policy: OwnerPolicy) -> Result<Self> {
        replicate::check_devices(devices)?;
        let replicas = replicate::replicate(module, devices)?;
        let params = replicas[0].parameters();
        let numels: Vec<usize> = params.iter().map(|p| p.numel()).collect();
        let sizes: Vec<usize> = params.iter().map(|p| p.dtype().size_in_bytes()).collect();
        // A piece is a flat view of the parameter on every replica: only contiguous ones split.
        let per_replica: Vec<Vec<Tensor>> = replicas.iter().map(|r| r.parameters()).collect();
        let splittable: Vec<bool> = (0..params.len())
            .map(|j| per_replica.iter().all(|ps| ps.get(j).is_some_and(|p| p.is_contiguous())))
            .collect();
        let pieces = owners::assign_pieces(&numels, &sizes, &splittable, devices.len(), policy);
        let targets = replicate::piece_tensors(&replicas, &pieces)?;
        let owners = pieces.iter().map(|p| p.owner).collect();
        Ok(DataParallel { replicas, devices: devices.to_vec(), pieces, targets, owners, policy })
    }

    /// How the owners were chosen.
    pub fn owner_policy(&self) -> OwnerPolicy {
        self.policy
    }

    /// The owner replica (an index into [`devices`](Self::devices)) of every tensor
    /// [`parameters`](Self::parameters) returns: of every parameter in the module's order, or of
    /// every piece under [`OwnerPolicy::Sharded`].
    pub fn owners(&self) -> &[usize] {
        &self.owners
    }

    /// What each tensor of [`parameters`](Self::parameters) is: a parameter (whole) or a flat run
    /// of one.
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// The parameter bytes each device owns (and so, with a stateful optimizer, the share of the
    /// optimizer state it holds), in device order.
    pub fn owned_bytes(&self) -> Vec<usize> {
        let bytes: Vec<usize> = self.targets.iter().map(|t| t.nbytes()).collect();
        owners::owned_bytes(&bytes, &self.owners, self.devices.len())
    }

    /// The devices, primary first.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The primary replica: the model as a single-device user sees it (its parameters are up to
    /// date after [`step`](Self::step); the reduced gradients are on
    /// [`parameters`](Self::parameters), the owners' tensors, not necessarily here).
    pub fn module(&self) -> &M {
        &self.replicas[0]
    }

    /// The primary replica, mutable. Call [`sync_replicas`](Self::sync_replicas) after changing
    /// its parameters or buffers.
    pub fn module_mut(&mut self) -> &mut M {
        &mut self.replicas[0]
    }

    /// Every replica, primary first.
    pub fn replicas(&self) -> &[M] {
        &self.replicas
    }

    /// The primary's model, unwrapped.
    pub fn into_inner(mut self) -> M {
        self.replicas.swap_remove(0)
    }

    /// Every parameter in the module's order, each the tensor of its **owner** replica (so on
    /// mixed devices): give these to the optimizer. Its state then lives beside each parameter,
    /// and its state_dict has the single-device layout. Gradients are reduced onto these tensors;
    /// [`step`](Self::step) copies them to the other replicas after the optimizer's step.
    ///
    /// Under [`OwnerPolicy::Sharded`] a parameter split between devices appears as its flat
    /// pieces ([`pieces`](Self::pieces)), views into the owners' parameters.
    pub fn parameters(&self) -> Vec<Tensor> {
        self.targets.clone()
    }

    /// The plain model's state_dict (no `module.` prefix), from the primary.
    pub fn state_dict(&self) -> StateDict {
        self.module().state_dict()
    }

    /// `optimizer`'s state (an optimizer built from [`parameters`](Self::parameters)) in the
    /// single-device layout: one entry per parameter of the module, tensors of the parameter's
    /// shape. The same as `optimizer.state_dict()` unless [`OwnerPolicy::Sharded`] split
    /// parameters, whose pieces' state is then joined (on the host). Save this one: it loads into
    /// the optimizer of a single-device run, or of a DataParallel run over any devices through
    /// [`load_optimizer_state_dict`](Self::load_optimizer_state_dict).
    pub fn optimizer_state_dict(&self, optimizer: &dyn Optimizer) -> Result<OptimizerState> {
        optimizer_state::merge(&optimizer.state_dict()?, &self.pieces, &self.parameter_shapes())
    }

    /// Load a single-device layout optimizer state (from
    /// [`optimizer_state_dict`](Self::optimizer_state_dict), a single-device run or PyTorch) into
    /// `optimizer` (built from [`parameters`](Self::parameters)): split parameters get their
    /// pieces' share, each copied onto its owner's device.
    pub fn load_optimizer_state_dict(&self, optimizer: &mut dyn Optimizer, state: &OptimizerState) -> Result<()> {
        let split = optimizer_state::split(state, &self.pieces, &self.parameter_shapes())?;
        Ok(optimizer.load_state_dict(&split)?)
    }

    fn parameter_shapes(&self) -> Vec<Vec<usize>> {
        self.replicas[0].parameters().iter().map(|p| p.shape().to_vec()).collect()
    }

    /// Load a state_dict into every replica. A state_dict whose every key starts with `module.`
    /// (saved from PyTorch's wrappers) is loaded with the prefix stripped.
    pub fn load_state_dict(&mut self, state_dict: &StateDict, strict: bool) -> Result<IncompatibleKeys> {
        let prefixed = !state_dict.is_empty() && state_dict.keys().all(|k| k.starts_with(MODULE_PREFIX));
        let options = NnLoadOptions { strict, strip_prefix: prefixed.then(|| MODULE_PREFIX.to_string()) };
        let keys = self.replicas[0].load_state_dict_with(state_dict, &options)?;
        self.sync_replicas()?;
        Ok(keys)
    }

    /// Load a checkpoint file (safetensors or a PyTorch `.pt`/`.pth`, read by ferrite-io) into
    /// every replica, stripping a `module.` prefix when every key has one.
    pub fn load_file(&mut self, path: impl AsRef<Path>, strict: bool) -> Result<IncompatibleKeys> {
        let tensors = ferrite_io::load_state_dict(path, &ferrite_io::LoadOptions::new())?;
        let mut sd = StateDict::new();
        for (k, t) in tensors {
            sd.insert(k, t);
        }
        self.load_state_dict(&sd, strict)
    }

    /// Training or evaluation mode on every replica.
    pub fn train(&mut self, training: bool) {
        for r in &mut self.replicas {
            r.train(training);
        }
    }

    /// Free every replica's gradients (and the pieces' under [`OwnerPolicy::Sharded`]).
    pub fn zero_grad(&self) -> Result<()> {
        for r in &self.replicas {
            r.zero_grad()?;
        }
        for t in &self.targets {
            t.set_grad(None)?;
        }
        Ok(())
    }

    /// Copy the primary's parameters and buffers into every other replica (after a load or a
    /// change through [`module_mut`](Self::module_mut)): the primary's values win, owners
    /// included.
    pub fn sync_replicas(&self) -> Result<()> {
        replicate::sync(&self.replicas)
    }

    /// Copy every parameter from its owner (the tensor the optimizer updated) to the other
    /// replicas, and the primary's buffers to the others. [`step`](Self::step) does this; call it
    /// yourself after stepping the optimizer another way (e.g. `GradScaler::step`).
    pub fn sync_from_owners(&self) -> Result<()> {
        replicate::sync_from_owners(&self.replicas, &self.pieces, &self.targets)
    }

    /// The optimizer's step on the owners' parameters, then
    /// [`sync_from_owners`](Self::sync_from_owners): afterwards every replica, the primary
    /// ([`module`](Self::module), [`state_dict`](Self::state_dict)) included, has the new values.
    /// An optimizer holding a tensor that is not one of [`parameters`](Self::parameters) (e.g.
    /// built from `dp.module().parameters()`) is refused before it steps
    /// ([`ParallelError::OptimizerNotOnOwners`]): that tensor would never get a gradient.
    pub fn step(&self, optimizer: &mut dyn Optimizer) -> Result<()> {
        self.check_optimizer(optimizer)?;
        optimizer.step()?;
        self.sync_from_owners()
    }

    /// Every tensor `optimizer` updates is one of the owners' tensors (the same storage, place
    /// and shape): [`ParallelError::OptimizerNotOnOwners`] names the first that is not.
    /// [`step`](Self::step) checks this; call it to refuse such an optimizer before training.
    pub fn check_optimizer(&self, optimizer: &dyn Optimizer) -> Result<()> {
        let key = |t: &Tensor| (std::sync::Arc::as_ptr(t.storage()) as usize, t.storage_offset(), t.shape().to_vec());
        let owned: std::collections::HashSet<_> = self.targets.iter().map(key).collect();
        match optimizer.params().iter().find(|p| !owned.contains(&key(p))) {
            Some(p) => {
                Err(ParallelError::OptimizerNotOnOwners { shape: p.shape().to_vec(), device: p.device().to_string() })
            }
            None => Ok(()),
        }
    }

    /// Forward, loss and backward of one batch on all replicas in parallel, each parameter's
    /// gradients reduced onto its owner (added to any it already holds, so gradient accumulation
    /// works as on one device; the other replicas' copies are freed). `batch` are tensors sharing dim 0 (inputs, targets, …), on any device; each
    /// replica receives its [`Shard`] of them on its own device. `loss_fn` returns the **mean**
    /// loss over its shard's samples, as a one-element tensor.
    pub fn forward_backward<F>(&self, batch: &[&Tensor], loss_fn: F) -> Result<StepLoss>
    where
        F: Fn(&M, &Shard) -> Result<Tensor> + Sync,
    {
        self.forward_backward_shards(scatter::scatter(batch, None, &self.devices)?, &loss_fn)
    }

    /// [`forward_backward`](Self::forward_backward) for batch-first padded sequences with their
    /// `lengths`: each shard carries its lengths and the batch's padded length
    /// ([`Shard::total_length`]), so [`Shard::pad_packed`] unpacks every replica to the same
    /// number of steps.
    pub fn forward_backward_sequences<F>(&self, batch: &[&Tensor], lengths: &[usize], loss_fn: F) -> Result<StepLoss>
    where
        F: Fn(&M, &Shard) -> Result<Tensor> + Sync,
    {
        self.forward_backward_shards(scatter::scatter(batch, Some(lengths), &self.devices)?, &loss_fn)
    }

    fn forward_backward_shards<F>(&self, shards: Vec<Shard>, loss_fn: &F) -> Result<StepLoss>
    where
        F: Fn(&M, &Shard) -> Result<Tensor> + Sync,
    {
        // Gradients of parameters a replica does not own are per-step scratch: start from none.
        replicate::free_unowned_gradients(&self.replicas, &self.pieces)?;
        let losses = self.parallel_apply(&shards, |replica, shard| {
            let loss = loss_fn(replica, shard)?;
            if loss.numel() != 1 {
                return Err(ParallelError::LossNotScalar {
                    device: shard.device.to_string(),
                    shape: loss.shape().to_vec(),
                });
            }
            let value = loss.item()?;
            loss.mul_scalar(shard.weight())?.backward()?;
            Ok(value)
        })?;
        replicate::reduce_gradients(&self.replicas, &self.pieces, &self.targets, shards.iter().map(|s| s.replica))?;
        let replicas: Vec<(Device, usize, f64)> =
            shards.iter().zip(&losses).map(|(s, &l)| (s.device.clone(), s.samples, l)).collect();
        let loss = shards.iter().zip(&losses).map(|(s, l)| s.weight() * l).sum();
        Ok(StepLoss { loss, replicas })
    }

    /// Run `f` on every replica with its shard of `batch` in parallel and gather the outputs
    /// along dim 0 on the primary device (PyTorch's `DataParallel.forward`; for evaluation —
    /// training should use [`forward_backward`](Self::forward_backward), which keeps memory
    /// balanced).
    pub fn forward<F>(&self, batch: &[&Tensor], f: F) -> Result<Tensor>
    where
        F: Fn(&M, &Shard) -> Result<Tensor> + Sync,
    {
        let shards = scatter::scatter(batch, None, &self.devices)?;
        let outs = self.parallel_apply(&shards, &f)?;
        self.gather(outs)
    }

    /// A recurrent forward of batch-first padded sequences: each replica packs its shard
    /// (`pack_padded_sequence`, unsorted allowed), runs `f` and unpacks to the **whole batch's**
    /// padded length, so the outputs gather on the primary whatever each replica's longest
    /// sequence (PyTorch's replicas each unpack to their own longest and the gather fails).
    /// Returns the padded outputs `[batch, steps, *]` and the lengths.
    pub fn forward_packed<F>(&self, padded: &Tensor, lengths: &[usize], f: F) -> Result<(Tensor, Vec<usize>)>
    where
        F: Fn(&M, &PackedSequence) -> Result<PackedSequence> + Sync,
    {
        let shards = scatter::scatter(&[padded], Some(lengths), &self.devices)?;
        let outs = self.parallel_apply(&shards, |m, s| {
            let lengths = s.lengths.as_deref().unwrap_or_default();
            let packed = pack_padded_sequence(&s.tensors[0], lengths, true, false)?;
            Ok(s.pad_packed(&f(m, &packed)?, 0.0)?.0)
        })?;
        Ok((self.gather(outs)?, lengths.to_vec()))
    }

    /// Outputs of the replicas concatenated along dim 0 on the primary device.
    fn gather(&self, outs: Vec<Tensor>) -> Result<Tensor> {
        let moved = outs.iter().map(|t| t.to_device(&self.devices[0])).collect::<std::result::Result<Vec<_>, _>>()?;
        let refs: Vec<&Tensor> = moved.iter().collect();
        Ok(Tensor::cat(&refs, 0)?)
    }

    /// Run `f(replica, shard)` for every shard, each in its own thread (the primary's on the
    /// calling thread, under the caller's grad mode and autocast), results in shard order. The
    /// first error (or a replica's panic) wins.
    fn parallel_apply<T, F>(&self, shards: &[Shard], f: F) -> Result<Vec<T>>
    where
        T: Send,
        F: Fn(&M, &Shard) -> Result<T> + Sync,
    {
        // Grad mode and autocast are per thread: the replicas' threads take the caller's.
        let grad_enabled = ferrite_tensor::is_grad_enabled();
        let amp = ferrite_tensor::autocast::autocast_dtype();
        let run = |s: &Shard| {
            let _g = (!grad_enabled).then(no_grad);
            let _amp = ferrite_tensor::autocast::set_autocast(amp)?;
            f(&self.replicas[s.replica], s)
        };
        let Some((first, rest)) = shards.split_first() else { return Ok(Vec::new()) };
        std::thread::scope(|scope| {
            let handles: Vec<_> = rest.iter().map(|s| (s, scope.spawn(|| run(s)))).collect();
            let mut out = vec![run(first)];
            for (s, h) in handles {
                out.push(h.join().unwrap_or_else(|p| {
                    let message = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|m| m.to_string()))
                        .unwrap_or_else(|| "unknown panic".into());
                    Err(ParallelError::ReplicaPanicked { device: s.device.to_string(), message })
                }));
            }
            out.into_iter().collect()
        })
    }

    /// Every device's memory (allocated, reserved and their peaks) from its allocator.
    pub fn memory_report(&self) -> MemoryReport {
        MemoryReport::of(&self.devices)
    }

    /// Reset every device's peak statistics (to measure one step's peaks).
    pub fn reset_peak_memory_stats(&self) {
        for d in &self.devices {
            ferrite_memory::allocator(d).reset_peak_memory_stats();
        }
    }
}
