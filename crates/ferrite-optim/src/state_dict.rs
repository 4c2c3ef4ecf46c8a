//! Optimizer state as plain data, in PyTorch's `optimizer.state_dict()` structure.
//!
//! A training checkpoint must resume bit-identically, and ferrite-io must be able to write it
//! (and read PyTorch's) without knowing any optimizer. So the state is a small tree of Rust
//! values and tensors with PyTorch's names:
//!
//! ```text
//! OptimizerState {
//!   state: [(0, [("momentum_buffer", Tensor)]), …]            // SGD with momentum
//!          [(0, [("step", Tensor f32 0-dim), ("exp_avg", Tensor), ("exp_avg_sq", Tensor)]), …]
//!   param_groups: [GroupState { hyper: [("lr", Float), ("betas", Floats), …],
//!                               params: [0, 1, 2, 3], param_names: None }],
//! }
//! ```
//! Parameter indices count through the groups in order, as in PyTorch. `state()` hands out
//! handles that share storage with the live optimizer (no copy, no extra device memory):
//! serialise them before the next step, or [`OptimizerState::deep_clone`] them.
//! Loading copies tensors into fresh storage on each parameter's device and dtype.

use ferrite_tensor::{Device, Tensor, no_grad};

use crate::error::{OptimError, Result};

/// One value in a parameter's state.
#[derive(Debug, Clone)]
pub enum StateValue {
    Tensor(Tensor),
    Float(f64),
    Int(i64),
}

impl StateValue {
    /// The value as a number (a one-element tensor is read back).
    pub fn as_f64(&self) -> Result<f64> {
        match self {
            StateValue::Tensor(t) => Ok(t.item()?),
            StateValue::Float(f) => Ok(*f),
            StateValue::Int(i) => Ok(*i as f64),
        }
    }
}

/// One hyperparameter of a parameter group (Python's float / int / bool / tuple / None).
#[derive(Debug, Clone, PartialEq)]
pub enum HyperValue {
    Float(f64),
    Int(i64),
    Bool(bool),
    /// A tuple of floats, e.g. Adam's `betas`.
    Floats(Vec<f64>),
    /// A list of ints, e.g. a schedule's `milestones`.
    Ints(Vec<i64>),
    /// Python's `None` (e.g. `foreach`, `fused` left to their defaults).
    None,
    /// A string, e.g. a schedule's `mode` (`"min"`) or `_anneal_func_type` (`"cos"`).
    Str(String),
}

impl HyperValue {
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            HyperValue::Float(f) => Some(*f),
            HyperValue::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            HyperValue::Int(i) => Some(*i),
            HyperValue::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Some(*f as i64),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            HyperValue::Bool(b) => Some(*b),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            HyperValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// A parameter group: its hyperparameters (PyTorch's keys and order) and parameter indices.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupState {
    pub hyper: Vec<(String, HyperValue)>,
    pub params: Vec<usize>,
    /// Present when the optimizer was built from named parameters (PyTorch's `param_names`).
    pub param_names: Option<Vec<String>>,
}

impl GroupState {
    pub fn get(&self, key: &str) -> Option<&HyperValue> {
        self.hyper.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

/// The whole optimizer state (PyTorch's `{"state": …, "param_groups": …}`).
#[derive(Debug, Clone, Default)]
pub struct OptimizerState {
    /// Per parameter index (only parameters that have state), its named values.
    pub state: Vec<(usize, Vec<(String, StateValue)>)>,
    pub param_groups: Vec<GroupState>,
}

impl OptimizerState {
    /// The entries of parameter `index`, if it has state.
    pub fn param_state(&self, index: usize) -> Option<&[(String, StateValue)]> {
        self.state.iter().find(|(i, _)| *i == index).map(|(_, v)| v.as_slice())
    }

    /// A copy whose tensors own their storage, so later optimizer steps cannot change it.
    pub fn deep_clone(&self) -> Result<OptimizerState> {
        let _g = no_grad();
        let mut state = Vec::with_capacity(self.state.len());
        for (i, entries) in &self.state {
            let mut e = Vec::with_capacity(entries.len());
            for (k, v) in entries {
                e.push((
                    k.clone(),
                    match v {
                        StateValue::Tensor(t) => StateValue::Tensor(t.detach().deep_clone()?),
                        other => other.clone(),
                    },
                ));
            }
            state.push((*i, e));
        }
        Ok(OptimizerState { state, param_groups: self.param_groups.clone() })
    }
}

/// Look up `key` in a parameter's saved entries.
pub(crate) fn entry<'a>(entries: &'a [(String, StateValue)], key: &str, index: usize) -> Result<&'a StateValue> {
    entries
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
        .ok_or_else(|| OptimError::StateDict(format!("the state of parameter {index} has no `{key}` entry")))
}

/// A saved state tensor, checked against its parameter and copied onto its device and dtype.
pub(crate) fn load_tensor(entries: &[(String, StateValue)], key: &str, index: usize, param: &Tensor) -> Result<Tensor> {
    let StateValue::Tensor(t) = entry(entries, key, index)? else {
        return Err(OptimError::StateDict(format!("`{key}` of parameter {index} must be a tensor")));
    };
    if t.shape() != param.shape() {
        return Err(OptimError::StateDict(format!(
            "`{key}` of parameter {index} has shape {:?} but the parameter has shape {:?}; was the state saved for a different model?",
            t.shape(),
            param.shape()
        )));
    }
    let _g = no_grad();
    let out = Tensor::zeros(param.shape(), param.dtype(), param.device())?;
    let src = t.detach().to_device(param.device())?;
    out.copy_(&src)?;
    Ok(out)
}

/// A parameter's state entries in PyTorch's order: `step` (a 0-dim f32 tensor on the CPU) when
/// given, then each tensor that is present, under its key.
pub(crate) fn state_entries(
    step: Option<f32>,
    tensors: &[(&str, Option<&Tensor>)],
) -> Result<Vec<(String, StateValue)>> {
    let mut v = Vec::with_capacity(1 + tensors.len());
    if let Some(step) = step {
        v.push(("step".to_string(), StateValue::Tensor(Tensor::scalar(step, &Device::Cpu)?)));
    }
    for (key, t) in tensors {
        if let Some(t) = t {
            v.push((key.to_string(), StateValue::Tensor((*t).clone())));
        }
    }
    Ok(v)
}

/// A saved state tensor that a parameter may or may not have (`momentum_buffer`,
/// `max_exp_avg_sq`), loaded as [`load_tensor`] does when it is there.
pub(crate) fn load_optional_tensor(
    entries: &[(String, StateValue)],
    key: &str,
    index: usize,
    param: &Tensor,
) -> Result<Option<Tensor>> {
    if entries.iter().any(|(k, _)| k == key) { load_tensor(entries, key, index, param).map(Some) } else { Ok(None) }
}

/// Overwrite `field` with the saved float hyperparameter `key`, if the group has one.
pub(crate) fn load_hyper_f64(g: &GroupState, key: &str, group: usize, field: &mut f64) -> Result<()> {
    if let Some(v) = hyper_f64(g, key, group)? {
        *field = v;
    }
    Ok(())
}

/// Overwrite `field` with the saved bool hyperparameter `key`, if the group has one.
pub(crate) fn load_hyper_bool(g: &GroupState, key: &str, group: usize, field: &mut bool) -> Result<()> {
    if let Some(v) = hyper_bool(g, key, group)? {
        *field = v;
    }
    Ok(())
}

/// Read a float hyperparameter if present.
pub(crate) fn hyper_f64(g: &GroupState, key: &str, group: usize) -> Result<Option<f64>> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| {
            OptimError::StateDict(format!("`{key}` of parameter group {group} must be a number, found {v:?}"))
        }),
    }
}

/// Read a bool hyperparameter if present.
pub(crate) fn hyper_bool(g: &GroupState, key: &str, group: usize) -> Result<Option<bool>> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or_else(|| {
            OptimError::StateDict(format!("`{key}` of parameter group {group} must be a bool, found {v:?}"))
        }),
    }
}

/// A saved `step` (a 0-dim tensor or a number): a non-negative whole number, kept as float32
/// like PyTorch's `step` tensor.
pub(crate) fn step_count(v: &StateValue, index: usize) -> Result<f32> {
    let step = v.as_f64()?;
    if !(step >= 0.0) || step.fract() != 0.0 {
        return Err(OptimError::StateDict(format!(
            "`step` of parameter {index} must be a non-negative whole number, found {step}"
        )));
    }
    Ok(step as f32)
}
