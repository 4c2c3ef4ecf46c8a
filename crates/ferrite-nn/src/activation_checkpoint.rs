//! Activation checkpointing: trade compute for memory by keeping only a region's inputs and
//! recomputing its activations during backward (PyTorch's reentrant `torch.utils.checkpoint`).
//!
//! The forward runs under `no_grad`, so the region's intermediate tensors are freed as soon as
//! they are dead; one custom autograd node stands for the whole region and saves only its
//! inputs. When backward reaches it, the node re-runs the region with grad enabled, under the
//! autocast state of the original forward and with every random generator the region drew from
//! (dropout) rewound to its state before the forward, then back-propagates through the
//! recomputed graph. Masks and gradients are therefore bit-identical to a run without
//! checkpointing, and the live RNG streams are left where the forward left them.
//!
//! Parameters used inside the region receive their gradients from the recomputation directly
//! (into their `.grad`), as in PyTorch. Tensors with history from *outside* the region must be
//! passed in `inputs`, not captured, or the recomputation would back-propagate into a part of
//! the graph that may already be released.

use std::borrow::Cow;
use std::sync::Arc;

use ferrite_tensor::autocast::{autocast_dtype, set_autocast};
use ferrite_tensor::autograd::backward as autograd_backward;
use ferrite_tensor::random::GeneratorState;
use ferrite_tensor::{BackwardFn, DType, SavedTensor, Tensor, enable_grad, is_grad_enabled, no_grad};

use crate::error::{NnError, Result};
use crate::module::Module;
use crate::rng::{RngHandle, RngRecording, replay_states, restore_states};

type Region = Box<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send>;

thread_local! {
    static RECOMPUTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the current thread is re-running a checkpointed region in backward.
///
/// Why layers ask: a region runs twice, and a layer with side effects beyond its output must
/// not apply them twice. `BatchNorm` uses the batch's statistics in both runs (so the
/// recomputed activations are the forward's) but updates its running statistics and
/// `num_batches_tracked` only in the first — PyTorch's checkpoint applies the momentum update
/// twice, which is why its running statistics drift from an uncheckpointed run's.
pub fn is_recomputing() -> bool {
    RECOMPUTING.with(|r| r.get())
}

/// Sets [`is_recomputing`] for its lifetime (restoring the previous value: regions nest).
struct RecomputingGuard(bool);

impl RecomputingGuard {
    fn enter() -> RecomputingGuard {
        RecomputingGuard(RECOMPUTING.with(|r| r.replace(true)))
    }
}

impl Drop for RecomputingGuard {
    fn drop(&mut self) {
        let previous = self.0;
        RECOMPUTING.with(|r| r.set(previous));
    }
}

/// Run `f(inputs)` without keeping its activations; recompute them in backward.
///
/// ```
/// # use ferrite_nn::{checkpoint, Linear, Module, ReLU, Sequential};
/// # use ferrite_tensor::{DType, Device, Tensor};
/// # fn main() -> ferrite_nn::Result<()> {
/// let block = Sequential::new().append(Linear::new(16, 16)?).append(ReLU::new());
/// let x = Tensor::randn(&[4, 16], DType::F32, &Device::Cpu)?.requires_grad_(true)?;
/// let b = block.clone(); // shares the parameters; the graph keeps this handle until backward
/// let y = checkpoint(move |xs| b.forward(&xs[0]), &[&x])?;
/// y.sum()?.backward()?;
/// assert!(x.grad().is_some() && block.parameters()[0].grad().is_some());
/// # Ok(()) }
/// ```
///
/// If grad mode is off, or no input requires grad, `f` simply runs (there would be nothing to
/// recompute for, and PyTorch's reentrant variant would silently drop the parameters'
/// gradients); use [`checkpoint_with_params`] to checkpoint a region whose inputs are data.
pub fn checkpoint<F>(f: F, inputs: &[&Tensor]) -> Result<Tensor>
where
    F: Fn(&[Tensor]) -> Result<Tensor> + Send + 'static,
{
    single(checkpoint_impl(Box::new(move |xs| Ok(vec![f(xs)?])), inputs, &[])?)
}

/// [`checkpoint`] for a region with several outputs.
pub fn checkpoint_multi<F>(f: F, inputs: &[&Tensor]) -> Result<Vec<Tensor>>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + 'static,
{
    checkpoint_impl(Box::new(f), inputs, &[])
}

/// [`checkpoint`] that also lists the parameters the region uses, so the region is recorded
/// (and its parameters get gradients) even when no input requires grad — e.g. the first layers
/// of a network, whose input is the data batch.
pub fn checkpoint_with_params<F>(f: F, inputs: &[&Tensor], params: &[Tensor]) -> Result<Tensor>
where
    F: Fn(&[Tensor]) -> Result<Tensor> + Send + 'static,
{
    single(checkpoint_impl(Box::new(move |xs| Ok(vec![f(xs)?])), inputs, params)?)
}

fn single(mut v: Vec<Tensor>) -> Result<Tensor> {
    match v.len() {
        1 => Ok(v.remove(0)),
        n => Err(NnError::config("checkpoint", format!("the region returned {n} outputs, expected 1"))),
    }
}

fn checkpoint_impl(f: Region, inputs: &[&Tensor], params: &[Tensor]) -> Result<Vec<Tensor>> {
    let wants_graph =
        is_grad_enabled() && (inputs.iter().any(|t| t.requires_grad()) || params.iter().any(|p| p.requires_grad()));
    let owned: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
    if !wants_graph {
        return f(&owned);
    }
    let detached: Vec<Tensor> = inputs.iter().map(|t| t.detach()).collect();
    let autocast = autocast_dtype();
    let recording = RngRecording::start();
    let outputs = {
        let _g = no_grad();
        f(&detached)?
    };
    let rng = recording.finish();
    let node = CheckpointBackward {
        region: f,
        inputs: inputs.iter().map(|t| SavedTensor::new(t)).collect(),
        input_requires_grad: inputs.iter().map(|t| t.requires_grad()).collect(),
        num_params: params.len(),
        autocast,
        rng,
    };
    let mut edges: Vec<&Tensor> = inputs.to_vec();
    edges.extend(params.iter());
    Ok(Tensor::from_op(outputs, &edges, Box::new(node)))
}

struct CheckpointBackward {
    region: Region,
    inputs: Vec<SavedTensor>,
    input_requires_grad: Vec<bool>,
    num_params: usize,
    autocast: Option<DType>,
    rng: Vec<(RngHandle, GeneratorState)>,
}

impl BackwardFn for CheckpointBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("CheckpointFunctionBackward")
    }

    fn backward(&mut self, grads: &[Option<Tensor>]) -> ferrite_tensor::Result<Vec<Option<Tensor>>> {
        let mut xs = Vec::with_capacity(self.inputs.len());
        for (s, &req) in self.inputs.iter().zip(&self.input_requires_grad) {
            let x = s.get("CheckpointFunctionBackward")?.detach();
            xs.push(if req { x.requires_grad_(true)? } else { x });
        }
        let outputs = {
            let _g = enable_grad();
            let _a = set_autocast(self.autocast)?;
            let live = replay_states(&self.rng);
            let recomputing = RecomputingGuard::enter();
            let r = (self.region)(&xs);
            drop(recomputing);
            restore_states(&self.rng, live);
            r.map_err(NnError::into_tensor_error)?
        };
        if outputs.len() != grads.len() {
            return Err(ferrite_tensor::TensorError::Autograd {
                detail: format!(
                    "checkpoint: the recomputed region returned {} outputs, the forward returned {}",
                    outputs.len(),
                    grads.len()
                ),
            });
        }
        let roots: Vec<(Tensor, Tensor)> = outputs
            .into_iter()
            .zip(grads)
            .filter_map(|(o, g)| g.as_ref().filter(|_| o.requires_grad()).map(|g| (o, g.clone())))
            .collect();
        if !roots.is_empty() {
            autograd_backward(&roots, false)?;
        }
        drop(roots);
        let mut out: Vec<Option<Tensor>> =
            xs.iter().zip(&self.input_requires_grad).map(|(x, &r)| if r { x.grad() } else { None }).collect();
        out.extend(std::iter::repeat_n(None, self.num_params));
        Ok(out)
    }
}

/// A module whose forward is checkpointed: `Checkpointed::new(block)` keeps only the block's
/// input in the graph and recomputes the rest in backward. Transparent to the state dict (same
/// keys as the wrapped module, no `_checkpoint_wrapped_module.` prefix).
pub struct Checkpointed<M: Module + 'static> {
    inner: Arc<M>,
}

// Manual impl: cloning shares the wrapped module (copy-on-write through `inner_mut`), so no
// `M: Clone` bound is needed.
impl<M: Module + 'static> Clone for Checkpointed<M> {
    fn clone(&self) -> Self {
        Checkpointed { inner: self.inner.clone() }
    }
}

impl<M: Module + 'static> Checkpointed<M> {
    pub fn new(module: M) -> Checkpointed<M> {
        Checkpointed { inner: Arc::new(module) }
    }

    pub fn inner(&self) -> &M {
        &self.inner
    }

    /// Mutable access; if a live graph still holds the module for recomputation, the graph keeps
    /// the old version (sharing the parameter tensors) and this wrapper gets its own copy.
    pub fn inner_mut(&mut self) -> &mut M {
        if Arc::get_mut(&mut self.inner).is_none() {
            self.inner = Arc::new(dyn_clone::clone(&*self.inner));
        }
        // Invariant: the Arc was just made unique above.
        Arc::get_mut(&mut self.inner).expect("unique after clone")
    }

    pub fn into_inner(self) -> M {
        Arc::try_unwrap(self.inner).unwrap_or_else(|a| dyn_clone::clone(&*a))
    }
}

impl<M: Module + 'static> Module for Checkpointed<M> {
    fn type_name(&self) -> &'static str {
        self.inner.type_name()
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let m = self.inner.clone();
        let params = self.inner.parameters();
        checkpoint_with_params(move |xs| m.forward(&xs[0]), &[x], &params)
    }
    fn own_parameters(&self) -> Vec<(String, &Tensor)> {
        self.inner.own_parameters()
    }
    fn own_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        self.inner_mut().own_parameters_mut()
    }
    fn own_buffers(&self) -> Vec<(String, &Tensor)> {
        self.inner.own_buffers()
    }
    fn own_buffers_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        self.inner_mut().own_buffers_mut()
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        self.inner.children()
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        self.inner_mut().children_mut()
    }
    fn is_training(&self) -> bool {
        self.inner.is_training()
    }
    fn set_own_training(&mut self, training: bool) {
        self.inner_mut().set_own_training(training)
    }
}
