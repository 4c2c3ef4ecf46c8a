//! The `Module` trait: a tree of layers whose parameters carry PyTorch's dotted names.
//!
//! A layer implements a handful of small methods — its own parameters, buffers and children, its
//! train/eval flag, and `forward` — and gets the rest as provided methods: recursive
//! `named_parameters`, `state_dict`/`load_state_dict` with PyTorch's key names and error
//! messages, `train`/`eval`, `to_device`/`to_dtype`, `zero_grad`. Names are built exactly as
//! PyTorch builds them (own parameters first, then each child's under `child.`), so checkpoints
//! move between the two frameworks key for key.
//!
//! Modules are `Clone` (via `dyn-clone`, so `Box<dyn Module>` clones too). Cloning copies the
//! tensor *handles*: the clone shares parameters with the original (what activation
//! checkpointing and data-parallel replicas want). `to_device`/`to_dtype` on a clone give it
//! its own tensors.

use std::collections::HashMap;

use dyn_clone::DynClone;
use ferrite_tensor::{DType, Device, Tensor, no_grad};

use crate::error::{LoadStateDictError, NnError, Result, SizeMismatch};
use crate::lora_host::LoraHost;
use crate::state_dict::{IncompatibleKeys, LoadOptions, StateDict};

/// A layer or a model: a tree of modules holding parameters and buffers.
pub trait Module: DynClone + Send + Sync {
    /// Class name used in messages (`Linear`, `Sequential`, …), as PyTorch's `__class__.__name__`.
    fn type_name(&self) -> &'static str;

    /// The single-input forward pass (layers with other signatures add inherent methods).
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// This module's own parameters (not its children's), in registration order.
    fn own_parameters(&self) -> Vec<(String, &Tensor)> {
        Vec::new()
    }

    /// Mutable access to the same slots as [`own_parameters`](Self::own_parameters), same order.
    fn own_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        Vec::new()
    }

    /// This module's own persistent buffers (saved in the state dict, not trained).
    fn own_buffers(&self) -> Vec<(String, &Tensor)> {
        Vec::new()
    }

    fn own_buffers_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        Vec::new()
    }

    /// Direct sub-modules with their attribute names (`fc1`, or `0`, `1`, … in a Sequential).
    fn children(&self) -> Vec<(String, &dyn Module)> {
        Vec::new()
    }

    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        Vec::new()
    }

    /// Whether this module is in training mode.
    fn is_training(&self) -> bool;

    /// Set this module's own flag (use [`train`](Self::train), which also sets the children's).
    fn set_own_training(&mut self, training: bool);

    /// This layer as a carrier of LoRA adapters, if it can be one (`Linear`, GPT-2's `Conv1D`):
    /// how `ferrite_nn::apply_lora` finds the layers to adapt in any module tree.
    fn lora_host(&self) -> Option<&dyn LoraHost> {
        None
    }

    /// [`lora_host`](Self::lora_host), mutable.
    fn lora_host_mut(&mut self) -> Option<&mut dyn LoraHost> {
        None
    }

    // ------------------------------------------------------------------ provided

    /// Training (`true`) or evaluation mode for this module and all descendants (PyTorch's
    /// `train(mode)`).
    fn train(&mut self, training: bool) {
        self.set_own_training(training);
        for (_, c) in self.children_mut() {
            c.train(training);
        }
    }

    /// Evaluation mode (dropout off) for this module and all descendants.
    fn eval(&mut self) {
        self.train(false);
    }

    /// Turns activation checkpointing on or off where the module supports it (Hugging Face's
    /// `gradient_checkpointing_enable`): a module that can recompute its blocks' activations in
    /// backward sets its own switch and returns true; by default the call reaches every child and
    /// returns whether any of them supports it (false: nothing in the tree can checkpoint; wrap
    /// the regions to recompute in [`Checkpointed`](crate::Checkpointed) yourself).
    fn set_activation_checkpointing(&mut self, on: bool) -> bool {
        let mut any = false;
        for (_, c) in self.children_mut() {
            any |= c.set_activation_checkpointing(on);
        }
        any
    }

    /// Every module in the tree with its dotted name, pre-order (the root is `""`).
    fn named_modules(&self) -> Vec<(String, &dyn Module)> {
        let mut out: Vec<(String, &dyn Module)> = Vec::new();
        for (cn, c) in self.children() {
            out.push((cn.clone(), c));
            for (n, m) in c.named_modules() {
                out.push((format!("{cn}.{n}"), m));
            }
        }
        out
    }

    /// All parameters with dotted names, each tensor once (a parameter tied into two places is
    /// listed under its first name), in PyTorch's order.
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        collect_params(self.own_parameters(), self.children(), "", &mut out);
        dedup_by_storage(out)
    }

    /// All parameters (for optimizers), each once.
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters().into_iter().map(|(_, t)| t).collect()
    }

    /// All persistent buffers with dotted names.
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        let mut out: Vec<(String, Tensor)> = self.own_buffers().into_iter().map(|(n, t)| (n, t.clone())).collect();
        for (cn, c) in self.children() {
            for (n, t) in c.named_buffers() {
                out.push((format!("{cn}.{n}"), t));
            }
        }
        out
    }

    /// Number of scalar parameters.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(|p| p.numel()).sum()
    }

    /// Bytes held by parameters and buffers.
    fn parameter_bytes(&self) -> usize {
        self.state_dict().nbytes()
    }

    /// Free every parameter's gradient (PyTorch's `zero_grad(set_to_none=True)`): the memory
    /// goes back to the allocator instead of being overwritten with zeros.
    fn zero_grad(&self) -> Result<()> {
        for p in self.parameters() {
            p.set_grad(None)?;
        }
        Ok(())
    }

    /// Parameters and persistent buffers under PyTorch's key names, in PyTorch's order (own
    /// parameters, own buffers, then each child). Values are detached handles sharing storage
    /// with the module. Tied parameters appear under every name, as in PyTorch.
    fn state_dict(&self) -> StateDict {
        let mut sd = StateDict::new();
        fill_state_dict(self.own_parameters(), self.own_buffers(), self.children(), "", &mut sd);
        sd
    }

    /// Copy a checkpoint into this module's existing tensors (PyTorch's
    /// `load_state_dict(sd, strict)`). See [`load_state_dict_with`](Self::load_state_dict_with).
    fn load_state_dict(&mut self, state_dict: &StateDict, strict: bool) -> Result<IncompatibleKeys> {
        self.load_state_dict_with(state_dict, &LoadOptions { strict, strip_prefix: None })
    }

    /// Copy a checkpoint into this module's existing tensors, in place under `no_grad`, so
    /// optimizer handles to the parameters stay valid. Values are converted to each parameter's
    /// device and dtype. Shape mismatches are always an error; missing/unexpected keys are an
    /// error in strict mode (missing listed first, like PyTorch) and returned otherwise.
    /// Validation happens before any copy: on error the module is unchanged.
    fn load_state_dict_with(&mut self, state_dict: &StateDict, options: &LoadOptions) -> Result<IncompatibleKeys> {
        let stripped;
        let sd = match &options.strip_prefix {
            Some(p) => {
                let mut s = state_dict.clone();
                s.strip_prefix(p);
                stripped = s;
                &stripped
            }
            None => state_dict,
        };
        let own = self.state_dict();
        let mut missing = Vec::new();
        let mut mismatches = Vec::new();
        let mut pairs: Vec<(Tensor, Tensor)> = Vec::new();
        for (k, dst) in own.iter() {
            match sd.get(k) {
                None => missing.push(k.to_string()),
                Some(src) if src.shape() != dst.shape() => mismatches.push(SizeMismatch {
                    key: k.to_string(),
                    checkpoint_shape: src.shape().to_vec(),
                    model_shape: dst.shape().to_vec(),
                }),
                Some(src) => pairs.push((dst.clone(), src.clone())),
            }
        }
        let unexpected: Vec<String> = sd.keys().filter(|k| !own.contains_key(k)).map(|k| k.to_string()).collect();
        let keys_fail = options.strict && !(missing.is_empty() && unexpected.is_empty());
        if keys_fail || !mismatches.is_empty() {
            let (m, u) = if options.strict { (missing, unexpected) } else { (Vec::new(), Vec::new()) };
            return Err(NnError::LoadStateDict(Box::new(LoadStateDictError {
                module: self.type_name().to_string(),
                missing: m,
                unexpected: u,
                size_mismatches: mismatches,
            })));
        }
        let _g = no_grad();
        // Straight into each parameter's memory, also from another device (weights read on the
        // CPU): the device holds no second copy of a weight while the model loads.
        for (dst, src) in pairs {
            dst.copy_(&src.detach())?;
        }
        Ok(IncompatibleKeys { missing_keys: missing, unexpected_keys: unexpected })
    }

    /// Replace every parameter and buffer by `f(tensor)` (recursively, each shared tensor once,
    /// so tied weights stay tied). Parameters keep `requires_grad`; gradients are mapped too.
    /// The building block of `to_device`/`to_dtype`.
    fn map_tensors(&mut self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
        self.map_tensors_shared(&mut HashMap::new(), f)
    }

    /// [`map_tensors`](Self::map_tensors) with a memo of tensors already mapped, keyed by
    /// (storage, offset), shared across the whole tree so tied tensors stay tied.
    #[doc(hidden)]
    fn map_tensors_shared(
        &mut self,
        memo: &mut HashMap<(usize, usize), Tensor>,
        f: &mut dyn FnMut(&Tensor) -> Result<Tensor>,
    ) -> Result<()> {
        map_tensors_memo(self.own_parameters_mut(), true, memo, f)?;
        map_tensors_memo(self.own_buffers_mut(), false, memo, f)?;
        for (_, c) in self.children_mut() {
            c.map_tensors_shared(memo, f)?;
        }
        Ok(())
    }

    /// Move all parameters, buffers and gradients to `device`. Parameters become new tensors:
    /// build the optimizer after moving the model (as in PyTorch).
    fn to_device(&mut self, device: &Device) -> Result<()> {
        let d = device.clone();
        self.map_tensors(&mut |t| Ok(t.to_device(&d)?))
    }

    /// Convert floating-point parameters, buffers and gradients to `dtype` (integer buffers are
    /// left alone, as in PyTorch's `module.to(dtype)`).
    fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        if !dtype.is_floating_point() {
            return Err(NnError::config(
                "to_dtype",
                format!("modules can only be cast to floating point dtypes, got {dtype}"),
            ));
        }
        self.map_tensors(&mut |t| if t.dtype().is_floating_point() { Ok(t.to_dtype(dtype)?) } else { Ok(t.clone()) })
    }
}

dyn_clone::clone_trait_object!(Module);

fn storage_key(t: &Tensor) -> usize {
    std::sync::Arc::as_ptr(t.storage()) as usize
}

fn collect_params(
    own: Vec<(String, &Tensor)>,
    children: Vec<(String, &dyn Module)>,
    prefix: &str,
    out: &mut Vec<(String, Tensor)>,
) {
    for (n, t) in own {
        out.push((format!("{prefix}{n}"), t.clone()));
    }
    for (cn, c) in children {
        let p = format!("{prefix}{cn}.");
        collect_params(c.own_parameters(), c.children(), &p, out);
    }
}

fn dedup_by_storage(v: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    let mut seen = std::collections::HashSet::new();
    v.into_iter().filter(|(_, t)| seen.insert((storage_key(t), t.storage_offset(), t.shape().to_vec()))).collect()
}

fn fill_state_dict(
    params: Vec<(String, &Tensor)>,
    buffers: Vec<(String, &Tensor)>,
    children: Vec<(String, &dyn Module)>,
    prefix: &str,
    sd: &mut StateDict,
) {
    for (n, t) in params.into_iter().chain(buffers) {
        sd.insert(format!("{prefix}{n}"), t.detach());
    }
    for (cn, c) in children {
        let p = format!("{prefix}{cn}.");
        fill_state_dict(c.own_parameters(), c.own_buffers(), c.children(), &p, sd);
    }
}

fn map_tensors_memo(
    slots: Vec<(String, &mut Tensor)>,
    is_param: bool,
    memo: &mut HashMap<(usize, usize), Tensor>,
    f: &mut dyn FnMut(&Tensor) -> Result<Tensor>,
) -> Result<()> {
    let _g = no_grad();
    for (_, slot) in slots {
        let key = (storage_key(slot), slot.storage_offset());
        if let Some(done) = memo.get(&key)
            && done.shape() == slot.shape()
        {
            *slot = done.clone();
            continue;
        }
        let requires = slot.requires_grad();
        let grad = slot.grad();
        let new = f(&slot.detach())?.detach();
        if is_param && requires {
            new.requires_grad_(true)?;
        }
        if let Some(g) = grad {
            new.set_grad(Some(f(&g)?.detach()))?;
        }
        memo.insert(key, new.clone());
        *slot = new;
    }
    Ok(())
}

/// The named tensors that are present, in order, with their names: a layer's optional
/// parameters or buffers (`weight` and `bias` without affine, running statistics without
/// tracking) as `own_parameters` / `own_buffers` list them.
pub(crate) fn present<'a, const N: usize>(named: [(&str, &'a Option<Tensor>); N]) -> Vec<(String, &'a Tensor)> {
    named.into_iter().filter_map(|(n, t)| t.as_ref().map(|t| (n.to_string(), t))).collect()
}

/// A layer's `weight` and optional `bias` under PyTorch's names (Linear, the convolutions).
pub(crate) fn weight_and_bias<'a>(weight: &'a Tensor, bias: &'a Option<Tensor>) -> Vec<(String, &'a Tensor)> {
    let mut v = vec![("weight".to_string(), weight)];
    v.extend(bias.as_ref().map(|b| ("bias".to_string(), b)));
    v
}

/// [`weight_and_bias`] for `own_parameters_mut`.
pub(crate) fn weight_and_bias_mut<'a>(
    weight: &'a mut Tensor,
    bias: &'a mut Option<Tensor>,
) -> Vec<(String, &'a mut Tensor)> {
    let mut v = vec![("weight".to_string(), weight)];
    v.extend(bias.as_mut().map(|b| ("bias".to_string(), b)));
    v
}

/// [`present`] for `own_parameters_mut` / `own_buffers_mut`.
pub(crate) fn present_mut<'a, const N: usize>(
    named: [(&str, &'a mut Option<Tensor>); N],
) -> Vec<(String, &'a mut Tensor)> {
    named.into_iter().filter_map(|(n, t)| t.as_mut().map(|t| (n.to_string(), t))).collect()
}

/// A fresh leaf parameter of `shape` (zeros on `device`, in f32 or the dtype of an enclosing
/// [`crate::with_parameter_dtype`]) that `init` fills in place before it is marked as requiring
/// grad.
pub(crate) fn new_parameter(
    shape: &[usize],
    device: &Device,
    init: impl FnOnce(&Tensor) -> Result<()>,
) -> Result<Tensor> {
    let t = Tensor::zeros(shape, crate::parameter_dtype::parameter_dtype(), device)?;
    if !SKIP_INIT.with(std::cell::Cell::get) {
        init(&t)?;
    }
    Ok(t.requires_grad_(true)?)
}

thread_local! {
    static SKIP_INIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether [`skip_init`] is in force on this thread: a layer that draws its own weights (not
/// through ferrite-nn's parameter helper) checks it and leaves them zero.
pub fn init_skipped() -> bool {
    SKIP_INIT.with(std::cell::Cell::get)
}

/// Runs `build` with parameter initialisation skipped on this thread: the layers it creates get
/// zero parameters instead of their random initialisation (PyTorch's `skip_init`, transformers'
/// `no_init_weights`). For a model whose every parameter is loaded right after — drawing a 7B
/// model's random weights only to overwrite them takes minutes.
pub fn skip_init<R>(build: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SKIP_INIT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(SKIP_INIT.with(|c| c.replace(true)));
    build()
}

/// Implements the train/eval flag pair for a struct with a `training: bool` field.
macro_rules! training_flag {
    () => {
        fn is_training(&self) -> bool {
            self.training
        }
        fn set_own_training(&mut self, training: bool) {
            self.training = training;
        }
    };
}
pub(crate) use training_flag;

/// A boxed module is a module: a model chosen at run time (`Box<dyn Module>`) goes wherever a
/// concrete one does (a trainer generic over its model, a `Sequential`). Every method is
/// forwarded, so a module that overrides a provided method keeps its own behaviour in the box.
impl Module for Box<dyn Module> {
    fn type_name(&self) -> &'static str {
        (**self).type_name()
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        (**self).forward(x)
    }
    fn own_parameters(&self) -> Vec<(String, &Tensor)> {
        (**self).own_parameters()
    }
    fn own_parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        (**self).own_parameters_mut()
    }
    fn own_buffers(&self) -> Vec<(String, &Tensor)> {
        (**self).own_buffers()
    }
    fn own_buffers_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        (**self).own_buffers_mut()
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        (**self).children()
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        (**self).children_mut()
    }
    fn is_training(&self) -> bool {
        (**self).is_training()
    }
    fn set_own_training(&mut self, training: bool) {
        (**self).set_own_training(training)
    }
    fn lora_host(&self) -> Option<&dyn LoraHost> {
        (**self).lora_host()
    }
    fn lora_host_mut(&mut self) -> Option<&mut dyn LoraHost> {
        (**self).lora_host_mut()
    }
    fn train(&mut self, training: bool) {
        (**self).train(training)
    }
    fn eval(&mut self) {
        (**self).eval()
    }
    fn set_activation_checkpointing(&mut self, on: bool) -> bool {
        (**self).set_activation_checkpointing(on)
    }
    fn named_modules(&self) -> Vec<(String, &dyn Module)> {
        (**self).named_modules()
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        (**self).named_parameters()
    }
    fn parameters(&self) -> Vec<Tensor> {
        (**self).parameters()
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        (**self).named_buffers()
    }
    fn num_parameters(&self) -> usize {
        (**self).num_parameters()
    }
    fn parameter_bytes(&self) -> usize {
        (**self).parameter_bytes()
    }
    fn zero_grad(&self) -> Result<()> {
        (**self).zero_grad()
    }
    fn state_dict(&self) -> StateDict {
        (**self).state_dict()
    }
    fn load_state_dict(&mut self, state_dict: &StateDict, strict: bool) -> Result<IncompatibleKeys> {
        (**self).load_state_dict(state_dict, strict)
    }
    fn load_state_dict_with(&mut self, state_dict: &StateDict, options: &LoadOptions) -> Result<IncompatibleKeys> {
        (**self).load_state_dict_with(state_dict, options)
    }
    fn map_tensors(&mut self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
        (**self).map_tensors(f)
    }
    fn map_tensors_shared(
        &mut self,
        memo: &mut HashMap<(usize, usize), Tensor>,
        f: &mut dyn FnMut(&Tensor) -> Result<Tensor>,
    ) -> Result<()> {
        (**self).map_tensors_shared(memo, f)
    }
    fn to_device(&mut self, device: &Device) -> Result<()> {
        (**self).to_device(device)
    }
    fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        (**self).to_dtype(dtype)
    }
}
