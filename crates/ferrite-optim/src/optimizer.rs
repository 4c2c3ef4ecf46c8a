//! What every optimizer shares: parameter groups, lazily created per-parameter state,
//! `zero_grad`, and the PyTorch-shaped `state_dict`.
//!
//! An optimizer is [`Optim<R>`] for an [`UpdateRule`] `R` (the arithmetic of one step); [`Sgd`]
//! and [`Adam`] are such aliases. Schedules, clipping and the GradScaler only need the
//! object-safe [`Optimizer`] trait, so they work with any rule, including user-written ones.
//!
//! [`Sgd`]: crate::Sgd
//! [`Adam`]: crate::Adam

use std::sync::atomic::{AtomicU64, Ordering};

use ferrite_tensor::{Tensor, no_grad};

use crate::error::{OptimError, Result};
use crate::state_dict::{GroupState, HyperValue, OptimizerState, StateValue};

/// The interface schedules, clipping, the GradScaler and trainers use.
pub trait Optimizer: Send {
    /// Apply one update to every parameter that has a gradient (parameters without one are
    /// skipped, as in PyTorch). Runs under `no_grad` itself.
    fn step(&mut self) -> Result<()>;

    /// Clear gradients. `set_to_none = true` (PyTorch's default, and [`zero_grad`]'s) drops
    /// them, returning their memory to the allocator; `false` fills them with zeros in place.
    ///
    /// [`zero_grad`]: Optimizer::zero_grad
    fn zero_grad_with(&mut self, set_to_none: bool) -> Result<()>;

    /// Drop every gradient (frees gradient memory until the next backward).
    fn zero_grad(&mut self) -> Result<()> {
        self.zero_grad_with(true)
    }

    /// A process-unique identity, used by the GradScaler to track per-optimizer stages.
    fn id(&self) -> OptimizerId;

    /// Number of parameter groups.
    fn num_groups(&self) -> usize;

    /// The learning rate of `group`.
    fn lr(&self, group: usize) -> Result<f64>;

    /// Set the learning rate of `group` (what schedules do).
    fn set_lr(&mut self, group: usize, lr: f64) -> Result<()>;

    /// The momentum of `group` that schedules cycle (OneCycleLR's `cycle_momentum`): SGD's and
    /// RMSprop's `momentum`, Adam's `beta1`; `None` for rules without one (Adagrad).
    fn momentum(&self, group: usize) -> Result<Option<f64>>;

    /// Set the momentum of `group` (see [`momentum`](Optimizer::momentum)); an error for rules
    /// without one.
    fn set_momentum(&mut self, group: usize, momentum: f64) -> Result<()>;

    /// The learning rate a schedule started from (PyTorch's `initial_lr` group key).
    fn initial_lr(&self, group: usize) -> Result<Option<f64>>;

    fn set_initial_lr(&mut self, group: usize, lr: Option<f64>) -> Result<()>;

    /// Parameters of `group`, in order.
    fn group_params(&self, group: usize) -> Result<&[Tensor]>;

    /// Every parameter, group by group (PyTorch's parameter index order).
    fn params(&self) -> Vec<Tensor> {
        (0..self.num_groups()).filter_map(|g| self.group_params(g).ok()).flat_map(|p| p.iter().cloned()).collect()
    }

    /// The learning rates of all groups.
    fn lrs(&self) -> Vec<f64> {
        (0..self.num_groups()).filter_map(|g| self.lr(g).ok()).collect()
    }

    /// The state in PyTorch's structure; tensors share storage with the live state.
    fn state_dict(&self) -> Result<OptimizerState>;

    /// Restore state saved by `state_dict` (copies tensors; checks group and parameter counts
    /// and state shapes).
    fn load_state_dict(&mut self, state: &OptimizerState) -> Result<()>;
}

/// Identity of an optimizer instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OptimizerId(u64);

impl OptimizerId {
    fn fresh() -> OptimizerId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        OptimizerId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// Per-group hyperparameters of an update rule.
pub trait GroupConfig: Clone + Send + std::fmt::Debug {
    fn lr(&self) -> f64;
    fn set_lr(&mut self, lr: f64);
    /// The momentum a schedule may cycle (SGD/RMSprop `momentum`, Adam `beta1`); `None` (the
    /// default) for rules without one.
    fn momentum(&self) -> Option<f64> {
        None
    }
    /// Set that momentum; returns false (the default) for rules without one.
    fn set_momentum(&mut self, _momentum: f64) -> bool {
        false
    }
    /// Reject values PyTorch rejects, with its wording.
    fn validate(&self) -> Result<()>;
    /// PyTorch's group keys, in PyTorch's order (without `params`).
    fn to_hyper(&self) -> Vec<(String, HyperValue)>;
    /// Update from saved keys (unknown keys are ignored, missing ones keep their value).
    fn load_hyper(&mut self, g: &GroupState, group: usize) -> Result<()>;
}

/// Per-parameter state of an update rule.
pub trait ParamState: Sized + Send {
    /// PyTorch's keys and values.
    fn to_entries(&self) -> Result<Vec<(String, StateValue)>>;
    /// Rebuild from saved entries, checked against the parameter.
    fn from_entries(entries: &[(String, StateValue)], index: usize, param: &Tensor) -> Result<Self>;
}

/// The arithmetic of one optimizer step over one parameter group.
pub trait UpdateRule: 'static {
    type Config: GroupConfig;
    type State: ParamState;
    /// Name for messages (`"SGD"`, `"Adam"`).
    const NAME: &'static str;
    /// Update `param` from its gradient `grad` and its `state` (created lazily: `None` on the
    /// first step). Called under `no_grad`.
    fn update(config: &Self::Config, param: &Tensor, grad: &Tensor, state: &mut Option<Self::State>) -> Result<()>;
}

/// A parameter group: tensors and the hyperparameters they are optimized with.
#[derive(Debug, Clone)]
pub struct ParamGroup<C> {
    pub params: Vec<Tensor>,
    /// Optional names (e.g. `fc1.weight`), recorded in the state dict like PyTorch's `param_names`.
    pub param_names: Option<Vec<String>>,
    pub config: C,
    /// Set by the first learning-rate schedule attached (PyTorch's `initial_lr`).
    pub initial_lr: Option<f64>,
}

impl<C> ParamGroup<C> {
    pub fn new(params: Vec<Tensor>, config: C) -> Self {
        ParamGroup { params, param_names: None, config, initial_lr: None }
    }

    /// A group from `(name, tensor)` pairs, e.g. a module's `named_parameters()`.
    pub fn named(named: Vec<(String, Tensor)>, config: C) -> Self {
        let (names, params) = named.into_iter().unzip();
        ParamGroup { params, param_names: Some(names), config, initial_lr: None }
    }
}

/// An optimizer: parameter groups, their per-parameter state, and an update rule.
pub struct Optim<R: UpdateRule> {
    groups: Vec<ParamGroup<R::Config>>,
    state: Vec<Vec<Option<R::State>>>,
    id: OptimizerId,
}

impl<R: UpdateRule> std::fmt::Debug for Optim<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct(R::NAME);
        for (i, g) in self.groups.iter().enumerate() {
            d.field(&format!("group{i}"), &format_args!("{} params, {:?}", g.params.len(), g.config));
        }
        d.finish()
    }
}

impl<R: UpdateRule> Optim<R> {
    /// One group holding `params`.
    pub fn new(params: Vec<Tensor>, config: R::Config) -> Result<Self> {
        Self::with_groups(vec![ParamGroup::new(params, config)])
    }

    /// One group from named parameters (names go into the state dict).
    pub fn named(named: Vec<(String, Tensor)>, config: R::Config) -> Result<Self> {
        Self::with_groups(vec![ParamGroup::named(named, config)])
    }

    /// Several groups, each with its own hyperparameters.
    pub fn with_groups(groups: Vec<ParamGroup<R::Config>>) -> Result<Self> {
        if groups.is_empty() {
            return Err(OptimError::EmptyParameterList);
        }
        let mut o = Optim { groups: Vec::new(), state: Vec::new(), id: OptimizerId::fresh() };
        for g in groups {
            o.add_param_group(g)?;
        }
        Ok(o)
    }

    /// Add a group (e.g. unfrozen layers during fine-tuning).
    pub fn add_param_group(&mut self, group: ParamGroup<R::Config>) -> Result<()> {
        group.config.validate()?;
        let gi = self.groups.len();
        if group.params.is_empty() {
            return Err(OptimError::EmptyParameterList);
        }
        if let Some(names) = &group.param_names
            && names.len() != group.params.len()
        {
            return Err(OptimError::ParamNamesLength { group: gi, names: names.len(), params: group.params.len() });
        }
        for (i, p) in group.params.iter().enumerate() {
            if let Some(f) = p.grad_fn() {
                return Err(OptimError::NonLeafParameter { group: gi, index: i, grad_fn: f.name().to_string() });
            }
            let earlier = self.groups.iter().map(|g| &g.params[..]).chain(std::iter::once(&group.params[..i]));
            for (gj, other) in earlier.enumerate() {
                if other.iter().any(|q| same_tensor(p, q)) {
                    return Err(OptimError::DuplicateParameter { group: gi, index: i, first_group: gj });
                }
            }
        }
        self.state.push((0..group.params.len()).map(|_| None).collect());
        self.groups.push(group);
        Ok(())
    }

    /// The groups (parameters and hyperparameters).
    pub fn param_groups(&self) -> &[ParamGroup<R::Config>] {
        &self.groups
    }

    /// Mutable hyperparameters of `group` (validated again at the next step).
    pub fn config_mut(&mut self, group: usize) -> Result<&mut R::Config> {
        let count = self.groups.len();
        self.groups.get_mut(group).map(|g| &mut g.config).ok_or(OptimError::NoSuchGroup { group, count })
    }

    /// The state of parameter `index` of `group`, if it was created (after its first step).
    pub fn param_state(&self, group: usize, index: usize) -> Option<&R::State> {
        self.state.get(group)?.get(index)?.as_ref()
    }

    fn group(&self, group: usize) -> Result<&ParamGroup<R::Config>> {
        self.groups.get(group).ok_or(OptimError::NoSuchGroup { group, count: self.groups.len() })
    }

    fn group_mut(&mut self, group: usize) -> Result<&mut ParamGroup<R::Config>> {
        let count = self.groups.len();
        self.groups.get_mut(group).ok_or(OptimError::NoSuchGroup { group, count })
    }
}

/// Same tensor: the same elements of the same storage (tied weights are one handle cloned).
fn same_tensor(a: &Tensor, b: &Tensor) -> bool {
    a.shares_storage(b)
        && a.storage_offset() == b.storage_offset()
        && a.shape() == b.shape()
        && a.strides() == b.strides()
}

impl<R: UpdateRule> Optimizer for Optim<R> {
    fn step(&mut self) -> Result<()> {
        let _g = no_grad();
        for (group, states) in self.groups.iter().zip(self.state.iter_mut()) {
            group.config.validate()?;
            for (p, st) in group.params.iter().zip(states.iter_mut()) {
                let Some(grad) = p.grad() else { continue };
                if grad.shape() != p.shape() {
                    return Err(OptimError::InvalidConfig(format!(
                        "gradient of shape {:?} for a parameter of shape {:?}",
                        grad.shape(),
                        p.shape()
                    )));
                }
                R::update(&group.config, p, &grad, st)?;
            }
        }
        Ok(())
    }

    fn zero_grad_with(&mut self, set_to_none: bool) -> Result<()> {
        let _g = no_grad();
        for p in self.groups.iter().flat_map(|g| &g.params) {
            if set_to_none {
                p.set_grad(None)?;
            } else if let Some(g) = p.grad() {
                g.zero_()?;
            }
        }
        Ok(())
    }

    fn id(&self) -> OptimizerId {
        self.id
    }

    fn num_groups(&self) -> usize {
        self.groups.len()
    }

    fn lr(&self, group: usize) -> Result<f64> {
        Ok(self.group(group)?.config.lr())
    }

    fn set_lr(&mut self, group: usize, lr: f64) -> Result<()> {
        self.group_mut(group)?.config.set_lr(lr);
        Ok(())
    }

    fn momentum(&self, group: usize) -> Result<Option<f64>> {
        Ok(self.group(group)?.config.momentum())
    }

    fn set_momentum(&mut self, group: usize, momentum: f64) -> Result<()> {
        if self.group_mut(group)?.config.set_momentum(momentum) {
            Ok(())
        } else {
            Err(OptimError::InvalidConfig(format!(
                "{} has no momentum (nor beta1) to set in parameter group {group}",
                R::NAME
            )))
        }
    }

    fn initial_lr(&self, group: usize) -> Result<Option<f64>> {
        Ok(self.group(group)?.initial_lr)
    }

    fn set_initial_lr(&mut self, group: usize, lr: Option<f64>) -> Result<()> {
        self.group_mut(group)?.initial_lr = lr;
        Ok(())
    }

    fn group_params(&self, group: usize) -> Result<&[Tensor]> {
        Ok(&self.group(group)?.params)
    }

    fn state_dict(&self) -> Result<OptimizerState> {
        let mut out = OptimizerState::default();
        let mut index = 0usize;
        for (g, states) in self.groups.iter().zip(&self.state) {
            let mut hyper = g.config.to_hyper();
            if let Some(lr0) = g.initial_lr {
                hyper.push(("initial_lr".into(), HyperValue::Float(lr0)));
            }
            let params: Vec<usize> = (index..index + g.params.len()).collect();
            for (k, st) in states.iter().enumerate() {
                if let Some(st) = st {
                    out.state.push((index + k, st.to_entries()?));
                }
            }
            index += g.params.len();
            out.param_groups.push(GroupState { hyper, params, param_names: g.param_names.clone() });
        }
        Ok(out)
    }

    fn load_state_dict(&mut self, saved: &OptimizerState) -> Result<()> {
        if saved.param_groups.len() != self.groups.len() {
            return Err(OptimError::StateDict(format!(
                "loaded state dict has a different number of parameter groups ({} saved, {} in this optimizer)",
                saved.param_groups.len(),
                self.groups.len()
            )));
        }
        for (gi, (sg, g)) in saved.param_groups.iter().zip(&self.groups).enumerate() {
            if sg.params.len() != g.params.len() {
                return Err(OptimError::StateDict(format!(
                    "loaded state dict contains a parameter group that doesn't match the size of optimizer's group (group {gi}: {} saved, {} here)",
                    sg.params.len(),
                    g.params.len()
                )));
            }
            if let (Some(a), Some(b)) = (&sg.param_names, &g.param_names) {
                if a.len() != b.len() {
                    return Err(OptimError::StateDict(format!(
                        "group {gi} has {} parameter names in the saved state but {} here",
                        a.len(),
                        b.len()
                    )));
                }
                if let Some((i, (x, y))) = a.iter().zip(b).enumerate().find(|(_, (x, y))| x != y) {
                    return Err(OptimError::StateDict(format!(
                        "parameter {i} of group {gi} is named `{x}` in the saved state but `{y}` here"
                    )));
                }
            }
        }
        // Build everything first, then commit: a failed load leaves the optimizer untouched.
        let mut new_configs = Vec::with_capacity(self.groups.len());
        let mut new_state: Vec<Vec<Option<R::State>>> = Vec::with_capacity(self.groups.len());
        for (gi, (sg, g)) in saved.param_groups.iter().zip(&self.groups).enumerate() {
            let mut cfg = g.config.clone();
            cfg.load_hyper(sg, gi)?;
            cfg.validate()?;
            let initial_lr = crate::state_dict::hyper_f64(sg, "initial_lr", gi)?;
            new_configs.push((cfg, initial_lr));
            let mut states = Vec::with_capacity(g.params.len());
            for (k, p) in g.params.iter().enumerate() {
                let saved_index = sg.params[k];
                states.push(match saved.param_state(saved_index) {
                    Some(entries) => Some(R::State::from_entries(entries, saved_index, p)?),
                    None => None,
                });
            }
            new_state.push(states);
        }
        for (g, (cfg, lr0)) in self.groups.iter_mut().zip(new_configs) {
            g.config = cfg;
            g.initial_lr = lr0;
        }
        self.state = new_state;
        Ok(())
    }
}
