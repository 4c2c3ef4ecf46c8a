//! DataParallel as a setting of the trainer: the model replicated on several devices of one
//! process, each micro-batch scattered between the replicas (`TrainerBuilder::data_parallel`).
//!
//! Why a trait object here: `DataParallel<M>` needs `M: Clone + 'static` (it copies the model
//! onto every device), which a single-device run does not; the builder's `data_parallel` asks for
//! those bounds once and hides the replicas behind [`Replicated`], so `Trainer<M>` and `fit` keep
//! the bounds of a plain run. Batches reach the replicas as the tensors they hold
//! ([`batch_tensors`]) and come back as the same type for the user's step ([`rebuild_batch`]):
//! a `Tensor`, a pair or triple of tensors, or a `Vec<Tensor>` — what ferrite-data's collates
//! produce.

use std::any::{Any, TypeId};

use ferrite_memory::Device;
use ferrite_nn::Module;
use ferrite_optim::{Optimizer, OptimizerState};
use ferrite_parallel::{DataParallel, MemoryReport, OwnerPolicy, ParallelError, Shard, StepLoss};
use ferrite_tensor::Tensor;

use crate::error::TrainError;

/// The replicas of a DataParallel run, as the trainer uses them.
pub(crate) trait Replicated<M>: Send {
    fn module(&self) -> &M;
    fn module_mut(&mut self) -> &mut M;
    fn into_module(self: Box<Self>) -> M;
    /// The tensors the optimizer must hold: each parameter (or piece) on its owner replica.
    fn parameters(&self) -> Vec<Tensor>;
    /// `optimizer` holds exactly [`parameters`](Self::parameters)' tensors.
    fn check_optimizer(&self, optimizer: &dyn Optimizer) -> Result<(), ParallelError>;
    fn devices(&self) -> &[Device];
    /// Forward and loss on every replica (its shard of `batch`), backward, gradients on the owners.
    fn forward_backward(
        &self,
        batch: &[&Tensor],
        loss: &(dyn Fn(&M, &Shard) -> Result<Tensor, ParallelError> + Sync),
    ) -> Result<StepLoss, ParallelError>;
    /// Copy the owners' updated parameters to every replica (after an optimizer step).
    fn sync_from_owners(&self) -> Result<(), ParallelError>;
    /// Copy the primary's parameters and buffers to every replica (after loading weights).
    fn sync_replicas(&self) -> Result<(), ParallelError>;
    /// The optimizer's state in the single-device layout (what a checkpoint stores).
    fn optimizer_state_dict(&self, optimizer: &dyn Optimizer) -> Result<OptimizerState, ParallelError>;
    fn load_optimizer_state_dict(
        &self,
        optimizer: &mut dyn Optimizer,
        state: &OptimizerState,
    ) -> Result<(), ParallelError>;
    fn memory_report(&self) -> MemoryReport;
    fn reset_peak_memory_stats(&self);
    /// Every replica in training (or evaluation) mode.
    fn train(&mut self, training: bool);
}

impl<M: Module + Clone + 'static> Replicated<M> for DataParallel<M> {
    fn module(&self) -> &M {
        DataParallel::module(self)
    }
    fn module_mut(&mut self) -> &mut M {
        DataParallel::module_mut(self)
    }
    fn into_module(self: Box<Self>) -> M {
        DataParallel::into_inner(*self)
    }
    fn parameters(&self) -> Vec<Tensor> {
        DataParallel::parameters(self)
    }
    fn check_optimizer(&self, optimizer: &dyn Optimizer) -> Result<(), ParallelError> {
        DataParallel::check_optimizer(self, optimizer)
    }
    fn devices(&self) -> &[Device] {
        DataParallel::devices(self)
    }
    fn forward_backward(
        &self,
        batch: &[&Tensor],
        loss: &(dyn Fn(&M, &Shard) -> Result<Tensor, ParallelError> + Sync),
    ) -> Result<StepLoss, ParallelError> {
        DataParallel::forward_backward(self, batch, |m, s| loss(m, s))
    }
    fn sync_from_owners(&self) -> Result<(), ParallelError> {
        DataParallel::sync_from_owners(self)
    }
    fn sync_replicas(&self) -> Result<(), ParallelError> {
        DataParallel::sync_replicas(self)
    }
    fn optimizer_state_dict(&self, optimizer: &dyn Optimizer) -> Result<OptimizerState, ParallelError> {
        DataParallel::optimizer_state_dict(self, optimizer)
    }
    fn load_optimizer_state_dict(
        &self,
        optimizer: &mut dyn Optimizer,
        state: &OptimizerState,
    ) -> Result<(), ParallelError> {
        DataParallel::load_optimizer_state_dict(self, optimizer, state)
    }
    fn memory_report(&self) -> MemoryReport {
        DataParallel::memory_report(self)
    }
    fn reset_peak_memory_stats(&self) {
        DataParallel::reset_peak_memory_stats(self)
    }
    fn train(&mut self, training: bool) {
        DataParallel::train(self, training)
    }
}

/// Replicate `model` on `devices` (the first is the primary, where the model's values are read
/// and evaluation runs).
pub(crate) fn replicate<M: Module + Clone + 'static>(
    model: M,
    devices: &[Device],
    policy: OwnerPolicy,
) -> Result<Box<dyn Replicated<M>>, TrainError> {
    Ok(Box::new(DataParallel::with_owners(model, devices, policy)?))
}

/// The batch types DataParallel can scatter, for messages.
pub(crate) const SCATTERABLE: &str = "Tensor, (Tensor, Tensor), (Tensor, Tensor, Tensor) or Vec<Tensor>";

/// The tensors of a batch, in order, when its type is one DataParallel scatters.
pub(crate) fn batch_tensors<B: 'static>(batch: &B) -> Option<Vec<&Tensor>> {
    let any = batch as &dyn Any;
    if let Some(t) = any.downcast_ref::<Tensor>() {
        return Some(vec![t]);
    }
    if let Some((a, b)) = any.downcast_ref::<(Tensor, Tensor)>() {
        return Some(vec![a, b]);
    }
    if let Some((a, b, c)) = any.downcast_ref::<(Tensor, Tensor, Tensor)>() {
        return Some(vec![a, b, c]);
    }
    any.downcast_ref::<Vec<Tensor>>().map(|v| v.iter().collect())
}

/// A batch of type `B` made of a shard's tensors (the inverse of [`batch_tensors`]).
pub(crate) fn rebuild_batch<B: 'static>(tensors: &[Tensor]) -> Option<B> {
    let id = TypeId::of::<B>();
    let boxed: Box<dyn Any> = match tensors {
        [a] if id == TypeId::of::<Tensor>() => Box::new(a.clone()),
        [a, b] if id == TypeId::of::<(Tensor, Tensor)>() => Box::new((a.clone(), b.clone())),
        [a, b, c] if id == TypeId::of::<(Tensor, Tensor, Tensor)>() => Box::new((a.clone(), b.clone(), c.clone())),
        _ if id == TypeId::of::<Vec<Tensor>>() => Box::new(tensors.to_vec()),
        _ => return None,
    };
    boxed.downcast::<B>().ok().map(|b| *b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_tensor::DType;

    #[test]
    fn batches_of_tensors_round_trip_through_their_tensors() {
        let cpu = Device::Cpu;
        let a = Tensor::zeros(&[4, 2], DType::F32, &cpu).unwrap();
        let b = Tensor::zeros(&[4], DType::I64, &cpu).unwrap();
        let pair = (a.clone(), b.clone());
        let ts: Vec<Tensor> = batch_tensors(&pair).unwrap().into_iter().cloned().collect();
        assert_eq!(ts.len(), 2);
        let back: (Tensor, Tensor) = rebuild_batch(&ts).unwrap();
        assert_eq!((back.0.shape(), back.1.shape()), (a.shape(), b.shape()));
        let single: Tensor = rebuild_batch(&ts[..1]).unwrap();
        assert_eq!(single.shape(), a.shape());
        let v: Vec<Tensor> = rebuild_batch(&ts).unwrap();
        assert_eq!(v.len(), 2);
        // A pair is not a triple, and other types are not scattered.
        assert!(rebuild_batch::<(Tensor, Tensor, Tensor)>(&ts).is_none());
        assert!(batch_tensors(&(1usize, 2usize)).is_none());
        assert!(rebuild_batch::<String>(&ts).is_none());
    }
}
