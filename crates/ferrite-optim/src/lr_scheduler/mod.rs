//! Learning-rate schedules with PyTorch's semantics (`torch.optim.lr_scheduler`).
//!
//! A schedule is created *after* its optimizer and immediately sets the learning rate of epoch
//! 0 (PyTorch's initial step); call [`LrScheduler::step`] after each `optimizer.step()`.
//! Schedules use PyTorch's chainable formulas (each rate computed from the previous one), so
//! the sequence of learning rates — including float rounding — is PyTorch's, and combinations
//! ([`SequentialLr`]) behave as they do there. The optimizer is passed to `step` rather than
//! held, so a training loop keeps full use of it.
//!
//! Per-batch schedules: [`OneCycleLr`] (stepping past its `total_steps` is an error, as in
//! PyTorch) and [`CosineAnnealingWarmRestarts`] (also with fractional epochs). Metric-driven:
//! [`ReduceLrOnPlateau`], stepped with the validation metric instead of through the trait.
//!
//! To resume, build optimizer and schedule as at the start, then load both states.

mod cosine;
mod cosine_warm_restarts;
mod linear_lr;
mod one_cycle;
mod reduce_on_plateau;
mod sequential;
mod step_lr;

pub use cosine::CosineAnnealingLr;
pub use cosine_warm_restarts::CosineAnnealingWarmRestarts;
pub use linear_lr::LinearLr;
pub use one_cycle::{AnnealStrategy, OneCycleConfig, OneCycleLr};
pub use reduce_on_plateau::{PlateauConfig, PlateauMode, ReduceLrOnPlateau, ThresholdMode};
pub use sequential::{SequentialLr, warmup_cosine};
pub use step_lr::StepLr;

use crate::error::{OptimError, Result};
use crate::optimizer::{Optimizer, OptimizerId};
use crate::state_dict::HyperValue;

/// What every schedule offers. The `#[doc(hidden)]` methods are the machinery PyTorch's base
/// class provides (shared by implementations and by [`SequentialLr`]).
pub trait LrScheduler: Send + std::fmt::Debug {
    /// Advance one epoch (or iteration) and set the optimizer's learning rates.
    fn step(&mut self, opt: &mut dyn Optimizer) -> Result<()> {
        self.core().check_optimizer(opt)?;
        self.core_mut().step_count += 1;
        self.update_lr(opt, None)
    }

    /// The learning rates set by the last `step` (one per group).
    fn get_last_lr(&self) -> Vec<f64> {
        self.core().last_lr.clone()
    }

    /// Epochs stepped so far (0 right after construction).
    fn last_epoch(&self) -> i64 {
        self.core().last_epoch
    }

    /// Checkpoint state (PyTorch's keys, e.g. `last_epoch`, `_step_count`, `base_lrs`).
    fn state_dict(&self) -> SchedulerState {
        SchedulerState::of(self.kind(), self.core(), self.params())
    }

    /// Restore a state saved by `state_dict` from a schedule of the same kind.
    fn load_state_dict(&mut self, s: &SchedulerState) -> Result<()> {
        check_kind(self.kind(), s)?;
        self.load_params(&s.params)?;
        let c = self.core_mut();
        c.last_epoch = s.last_epoch;
        c.step_count = s.step_count;
        c.base_lrs = s.base_lrs.clone();
        c.last_lr = s.last_lr.clone();
        Ok(())
    }

    /// PyTorch's class name (`"StepLR"`).
    fn kind(&self) -> &'static str;

    #[doc(hidden)]
    fn core(&self) -> &SchedulerCore;
    #[doc(hidden)]
    fn core_mut(&mut self) -> &mut SchedulerCore;
    /// The chainable formula: new rates from the current ones.
    #[doc(hidden)]
    fn get_lr(&self, current: &[f64]) -> Vec<f64>;
    /// The closed form, used when a specific epoch is set (`SequentialLr` milestones).
    #[doc(hidden)]
    fn closed_form_lr(&self) -> Option<Vec<f64>> {
        None
    }
    #[doc(hidden)]
    fn params(&self) -> Vec<(String, HyperValue)>;
    #[doc(hidden)]
    fn load_params(&mut self, params: &[(String, HyperValue)]) -> Result<()>;

    /// PyTorch's `_update_lr(epoch)`.
    #[doc(hidden)]
    fn update_lr(&mut self, opt: &mut dyn Optimizer, epoch: Option<i64>) -> Result<()> {
        let current = opt.lrs();
        let values = match epoch {
            None => {
                self.core_mut().last_epoch += 1;
                self.get_lr(&current)
            }
            Some(e) => {
                self.core_mut().last_epoch = e;
                match self.closed_form_lr() {
                    Some(v) => v,
                    None => self.get_lr(&current),
                }
            }
        };
        for (g, lr) in values.iter().enumerate() {
            opt.set_lr(g, *lr)?;
        }
        self.core_mut().last_lr = opt.lrs();
        Ok(())
    }

    /// PyTorch's `_initial_step()`.
    #[doc(hidden)]
    fn initial_step(&mut self, opt: &mut dyn Optimizer) -> Result<()> {
        self.core_mut().step_count = 0;
        self.core_mut().is_initial = true;
        let r = self.step(opt);
        self.core_mut().is_initial = false;
        r
    }

    /// PyTorch's `recursive_undo` (used when a `SequentialLr` takes over its children).
    #[doc(hidden)]
    fn undo_last_epoch(&mut self) {
        self.core_mut().last_epoch -= 1;
    }

    #[doc(hidden)]
    fn optimizer_id(&self) -> OptimizerId {
        self.core().optimizer
    }
}

/// A schedule's checkpoint state.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerState {
    /// PyTorch's class name (`"StepLR"`, `"SequentialLR"` …).
    pub kind: String,
    pub last_epoch: i64,
    /// PyTorch's `_step_count`.
    pub step_count: i64,
    pub base_lrs: Vec<f64>,
    /// PyTorch's `_last_lr`.
    pub last_lr: Vec<f64>,
    /// The schedule's own settings under PyTorch's names (`step_size`, `gamma`, `T_max` …).
    pub params: Vec<(String, HyperValue)>,
    /// Child schedules (PyTorch's `_schedulers`).
    pub children: Vec<SchedulerState>,
}

impl SchedulerState {
    /// The state of a schedule without children: its kind, counters and learning rates from
    /// `core`, and its own settings.
    fn of(kind: &str, core: &SchedulerCore, params: Vec<(String, HyperValue)>) -> SchedulerState {
        SchedulerState {
            kind: kind.to_string(),
            last_epoch: core.last_epoch,
            step_count: core.step_count,
            base_lrs: core.base_lrs.clone(),
            last_lr: core.last_lr.clone(),
            params,
            children: Vec::new(),
        }
    }
}

/// The state PyTorch's `LRScheduler` base class keeps.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct SchedulerCore {
    pub base_lrs: Vec<f64>,
    pub last_epoch: i64,
    pub step_count: i64,
    pub last_lr: Vec<f64>,
    pub is_initial: bool,
    optimizer: OptimizerId,
}

impl SchedulerCore {
    /// Attach to `opt` as PyTorch's base constructor does (with `last_epoch = -1`): record
    /// `initial_lr` in every group that has none and take those as the base rates.
    pub fn attach(opt: &mut dyn Optimizer) -> Result<SchedulerCore> {
        let mut base_lrs = Vec::with_capacity(opt.num_groups());
        for g in 0..opt.num_groups() {
            let lr0 = match opt.initial_lr(g)? {
                Some(v) => v,
                None => {
                    let lr = opt.lr(g)?;
                    opt.set_initial_lr(g, Some(lr))?;
                    lr
                }
            };
            base_lrs.push(lr0);
        }
        Ok(SchedulerCore {
            base_lrs,
            last_epoch: -1,
            step_count: 0,
            last_lr: Vec::new(),
            is_initial: false,
            optimizer: opt.id(),
        })
    }

    pub(crate) fn check_optimizer(&self, opt: &dyn Optimizer) -> Result<()> {
        if opt.id() != self.optimizer {
            return Err(OptimError::Scheduler("this learning-rate schedule was created for a different optimizer; step it with the optimizer it was built on".into()));
        }
        Ok(())
    }
}

pub(crate) fn check_kind(kind: &str, s: &SchedulerState) -> Result<()> {
    if s.kind != kind {
        return Err(OptimError::Scheduler(format!("cannot load a {} state into a {kind}", s.kind)));
    }
    Ok(())
}

pub(crate) fn param_f64(params: &[(String, HyperValue)], key: &str) -> Result<f64> {
    params
        .iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| v.as_f64())
        .ok_or_else(|| OptimError::Scheduler(format!("schedule state has no numeric `{key}`")))
}

pub(crate) fn param_i64(params: &[(String, HyperValue)], key: &str) -> Result<i64> {
    params
        .iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| v.as_i64())
        .ok_or_else(|| OptimError::Scheduler(format!("schedule state has no integer `{key}`")))
}
