//! ReduceLROnPlateau: cut the learning rate by `factor` when a watched metric (validation loss,
//! accuracy) has stopped improving for `patience` epochs.
//!
//! Unlike the other schedules it is driven by a value, not by time, so it is not an
//! [`LrScheduler`](super::LrScheduler): call [`ReduceLrOnPlateau::step`] with the metric once per
//! epoch. Its decisions (the relative/absolute threshold, the cooldown, `min_lr`, `eps`) are
//! PyTorch's, comparison for comparison. A NaN metric never counts as an improvement (so it
//! counts as a bad epoch), as in PyTorch.

use super::{SchedulerState, check_kind, param_f64, param_i64};
use crate::error::{OptimError, Result};
use crate::optimizer::{Optimizer, OptimizerId};
use crate::state_dict::HyperValue;

/// Whether the metric should go down (a loss) or up (an accuracy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlateauMode {
    #[default]
    Min,
    Max,
}

/// How `threshold` decides what counts as an improvement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ThresholdMode {
    /// Better than `best * (1 ∓ threshold)`.
    #[default]
    Rel,
    /// Better than `best ∓ threshold`.
    Abs,
}

/// Settings of a [`ReduceLrOnPlateau`] (PyTorch's defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct PlateauConfig {
    pub mode: PlateauMode,
    /// New rate = old rate × factor; in (0, 1).
    pub factor: f64,
    /// Bad epochs tolerated before the rate is cut.
    pub patience: u64,
    pub threshold: f64,
    pub threshold_mode: ThresholdMode,
    /// Epochs to wait after a cut before counting bad epochs again.
    pub cooldown: u64,
    /// Lower bound of each group's rate (one value for all groups, or one per group).
    pub min_lr: Vec<f64>,
    /// Cuts smaller than this are skipped.
    pub eps: f64,
}

impl Default for PlateauConfig {
    /// mode min, factor 0.1, patience 10, threshold 1e-4 relative, no cooldown, min_lr 0, eps 1e-8.
    fn default() -> Self {
        PlateauConfig {
            mode: PlateauMode::Min,
            factor: 0.1,
            patience: 10,
            threshold: 1e-4,
            threshold_mode: ThresholdMode::Rel,
            cooldown: 0,
            min_lr: vec![0.0],
            eps: 1e-8,
        }
    }
}

impl PlateauConfig {
    pub fn mode(mut self, mode: PlateauMode) -> Self {
        self.mode = mode;
        self
    }
    pub fn factor(mut self, factor: f64) -> Self {
        self.factor = factor;
        self
    }
    pub fn patience(mut self, patience: u64) -> Self {
        self.patience = patience;
        self
    }
    pub fn threshold(mut self, threshold: f64, mode: ThresholdMode) -> Self {
        self.threshold = threshold;
        self.threshold_mode = mode;
        self
    }
    pub fn cooldown(mut self, cooldown: u64) -> Self {
        self.cooldown = cooldown;
        self
    }
    /// One lower bound for every group.
    pub fn min_lr(mut self, min_lr: f64) -> Self {
        self.min_lr = vec![min_lr];
        self
    }
    /// One lower bound per parameter group.
    pub fn min_lrs(mut self, min_lrs: Vec<f64>) -> Self {
        self.min_lr = min_lrs;
        self
    }
    pub fn eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }

    fn validate(&self) -> Result<()> {
        if !(self.factor > 0.0 && self.factor < 1.0) {
            return Err(OptimError::Scheduler(format!(
                "ReduceLROnPlateau factor should be < 1.0 (and > 0), got {}",
                self.factor
            )));
        }
        if !(self.threshold >= 0.0) || !self.threshold.is_finite() {
            return Err(OptimError::Scheduler(format!(
                "ReduceLROnPlateau threshold must be a finite number >= 0, got {}",
                self.threshold
            )));
        }
        if !(self.eps >= 0.0) {
            return Err(OptimError::Scheduler(format!("ReduceLROnPlateau eps must be >= 0, got {}", self.eps)));
        }
        if let Some(bad) = self.min_lr.iter().find(|v| !(**v >= 0.0)) {
            return Err(OptimError::Scheduler(format!("ReduceLROnPlateau min_lr must be >= 0, got {bad}")));
        }
        Ok(())
    }
}

/// PyTorch's `ReduceLROnPlateau`.
///
/// ```
/// use ferrite_optim::{Optimizer, PlateauConfig, ReduceLrOnPlateau, Sgd, SgdConfig};
/// use ferrite_tensor::{DType, Device, Tensor};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let w = Tensor::zeros(&[4], DType::F32, &Device::Cpu)?.requires_grad_(true)?;
/// let mut opt = Sgd::new(vec![w], SgdConfig::new(0.1))?;
/// let mut sched = ReduceLrOnPlateau::new(&mut opt, PlateauConfig::default().factor(0.5).patience(1))?;
/// for val_loss in [1.0, 0.8, 0.8, 0.8] {
///     sched.step(&mut opt, val_loss)?; // two epochs without improvement > patience 1: halve
/// }
/// assert_eq!(opt.lr(0)?, 0.05);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ReduceLrOnPlateau {
    config: PlateauConfig,
    min_lrs: Vec<f64>,
    best: f64,
    num_bad_epochs: u64,
    cooldown_counter: u64,
    last_epoch: i64,
    last_lr: Vec<f64>,
    optimizer: OptimizerId,
}

impl ReduceLrOnPlateau {
    pub fn new(opt: &mut dyn Optimizer, config: PlateauConfig) -> Result<ReduceLrOnPlateau> {
        config.validate()?;
        let groups = opt.num_groups();
        let min_lrs = match config.min_lr.len() {
            1 => vec![config.min_lr[0]; groups],
            n if n == groups => config.min_lr.clone(),
            n => return Err(OptimError::Scheduler(format!("expected {groups} min_lrs, got {n}"))),
        };
        let mut s = ReduceLrOnPlateau {
            best: 0.0,
            min_lrs,
            num_bad_epochs: 0,
            cooldown_counter: 0,
            last_epoch: 0,
            last_lr: opt.lrs(),
            optimizer: opt.id(),
            config,
        };
        s.reset();
        Ok(s)
    }

    fn mode_worse(&self) -> f64 {
        match self.config.mode {
            PlateauMode::Min => f64::INFINITY,
            PlateauMode::Max => f64::NEG_INFINITY,
        }
    }

    fn reset(&mut self) {
        self.best = self.mode_worse();
        self.cooldown_counter = 0;
        self.num_bad_epochs = 0;
    }

    /// PyTorch's `_is_better` (false for a NaN metric).
    fn is_better(&self, a: f64) -> bool {
        let (best, th) = (self.best, self.config.threshold);
        match (self.config.mode, self.config.threshold_mode) {
            (PlateauMode::Min, ThresholdMode::Rel) => a < best * (1.0 - th),
            (PlateauMode::Min, ThresholdMode::Abs) => a < best - th,
            (PlateauMode::Max, ThresholdMode::Rel) => a > best * (th + 1.0),
            (PlateauMode::Max, ThresholdMode::Abs) => a > best + th,
        }
    }

    /// Record the epoch's `metric` and cut the rates if it has plateaued.
    pub fn step(&mut self, opt: &mut dyn Optimizer, metric: f64) -> Result<()> {
        if opt.id() != self.optimizer {
            return Err(OptimError::Scheduler("this learning-rate schedule was created for a different optimizer; step it with the optimizer it was built on".into()));
        }
        if opt.num_groups() != self.min_lrs.len() {
            return Err(OptimError::Scheduler(format!(
                "The number of param groups in the optimizer ({}) differs from when ReduceLROnPlateau was initialized ({}), usually due to a new param group being added to the optimizer; build the schedule after adding every group",
                opt.num_groups(),
                self.min_lrs.len()
            )));
        }
        self.last_epoch += 1;
        if self.is_better(metric) {
            self.best = metric;
            self.num_bad_epochs = 0;
        } else {
            self.num_bad_epochs += 1;
        }
        if self.cooldown_counter > 0 {
            self.cooldown_counter -= 1;
            self.num_bad_epochs = 0;
        }
        if self.num_bad_epochs > self.config.patience {
            for (g, min_lr) in self.min_lrs.iter().enumerate() {
                let old = opt.lr(g)?;
                let new = (old * self.config.factor).max(*min_lr);
                if old - new > self.config.eps {
                    opt.set_lr(g, new)?;
                }
            }
            self.cooldown_counter = self.config.cooldown;
            self.num_bad_epochs = 0;
        }
        self.last_lr = opt.lrs();
        Ok(())
    }

    /// The learning rates after the last `step` (one per group).
    pub fn get_last_lr(&self) -> Vec<f64> {
        self.last_lr.clone()
    }

    /// The best metric seen so far.
    pub fn best(&self) -> f64 {
        self.best
    }

    /// Epochs without improvement counted so far.
    pub fn num_bad_epochs(&self) -> u64 {
        self.num_bad_epochs
    }

    /// Whether the schedule is waiting out its cooldown after a cut.
    pub fn in_cooldown(&self) -> bool {
        self.cooldown_counter > 0
    }

    /// Checkpoint state (PyTorch's keys: `mode`, `best`, `num_bad_epochs`, `cooldown_counter`, …).
    pub fn state_dict(&self) -> SchedulerState {
        let c = &self.config;
        let mode = match c.mode {
            PlateauMode::Min => "min",
            PlateauMode::Max => "max",
        };
        let threshold_mode = match c.threshold_mode {
            ThresholdMode::Rel => "rel",
            ThresholdMode::Abs => "abs",
        };
        let count = |v: u64| HyperValue::Int(i64::try_from(v).unwrap_or(i64::MAX));
        SchedulerState {
            kind: "ReduceLROnPlateau".into(),
            last_epoch: self.last_epoch,
            step_count: self.last_epoch,
            base_lrs: Vec::new(),
            last_lr: self.last_lr.clone(),
            params: vec![
                ("mode".into(), HyperValue::Str(mode.into())),
                ("factor".into(), HyperValue::Float(c.factor)),
                ("patience".into(), count(c.patience)),
                ("threshold".into(), HyperValue::Float(c.threshold)),
                ("threshold_mode".into(), HyperValue::Str(threshold_mode.into())),
                ("cooldown".into(), count(c.cooldown)),
                ("min_lrs".into(), HyperValue::Floats(self.min_lrs.clone())),
                ("eps".into(), HyperValue::Float(c.eps)),
                ("best".into(), HyperValue::Float(self.best)),
                ("num_bad_epochs".into(), count(self.num_bad_epochs)),
                ("cooldown_counter".into(), count(self.cooldown_counter)),
            ],
            children: Vec::new(),
        }
    }

    /// Restore a state saved by [`state_dict`](Self::state_dict); nothing changes if it fails.
    pub fn load_state_dict(&mut self, s: &SchedulerState) -> Result<()> {
        check_kind("ReduceLROnPlateau", s)?;
        let p = &s.params;
        let text = |key: &str| -> Result<&str> {
            match p.iter().find(|(k, _)| k == key) {
                Some((_, HyperValue::Str(v))) => Ok(v.as_str()),
                _ => Err(OptimError::Scheduler(format!("ReduceLROnPlateau state has no string `{key}`"))),
            }
        };
        let count = |key: &str| -> Result<u64> {
            let v = param_i64(p, key)?;
            u64::try_from(v).map_err(|_| OptimError::Scheduler(format!("ReduceLROnPlateau state has {key} = {v}")))
        };
        let mode = match text("mode")? {
            "min" => PlateauMode::Min,
            "max" => PlateauMode::Max,
            other => return Err(OptimError::Scheduler(format!("mode {other} is unknown!"))),
        };
        let threshold_mode = match text("threshold_mode")? {
            "rel" => ThresholdMode::Rel,
            "abs" => ThresholdMode::Abs,
            other => return Err(OptimError::Scheduler(format!("threshold mode {other} is unknown!"))),
        };
        let min_lrs = match p.iter().find(|(k, _)| k == "min_lrs") {
            Some((_, HyperValue::Floats(v))) if v.len() == self.min_lrs.len() => v.clone(),
            _ => {
                return Err(OptimError::Scheduler(format!(
                    "ReduceLROnPlateau state needs `min_lrs` with one value per parameter group ({})",
                    self.min_lrs.len()
                )));
            }
        };
        let config = PlateauConfig {
            mode,
            factor: param_f64(p, "factor")?,
            patience: count("patience")?,
            threshold: param_f64(p, "threshold")?,
            threshold_mode,
            cooldown: count("cooldown")?,
            min_lr: min_lrs.clone(),
            eps: param_f64(p, "eps")?,
        };
        config.validate()?;
        let (best, num_bad_epochs, cooldown_counter) =
            (param_f64(p, "best")?, count("num_bad_epochs")?, count("cooldown_counter")?);
        self.config = config;
        self.min_lrs = min_lrs;
        self.best = best;
        self.num_bad_epochs = num_bad_epochs;
        self.cooldown_counter = cooldown_counter;
        self.last_epoch = s.last_epoch;
        self.last_lr = s.last_lr.clone();
        Ok(())
    }
}
