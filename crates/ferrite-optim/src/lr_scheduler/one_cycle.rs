//! OneCycleLR: the 1cycle policy (Smith & Topin) — warm the learning rate up from
//! `max_lr / div_factor` to `max_lr`, then anneal it to `initial_lr / final_div_factor`, while
//! the momentum moves the opposite way. PyTorch's phases, formulas and group bookkeeping, so the
//! rates and momenta are PyTorch's step for step.
//!
//! It is stepped once per *batch* for a fixed `total_steps`; PyTorch raises when stepped past
//! it, and so does ferrite ([`OptimError::ScheduleFinished`]) — without changing any state, so
//! a training loop can catch it and stop.

use std::f64::consts::PI;

use super::{LrScheduler, SchedulerCore, param_f64, param_i64};
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use crate::state_dict::HyperValue;

/// How a phase moves from its start value to its end value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AnnealStrategy {
    /// Half a cosine (PyTorch's `"cos"`, the default).
    #[default]
    Cos,
    /// A straight line (`"linear"`).
    Linear,
}

impl AnnealStrategy {
    /// PyTorch's name.
    pub fn name(self) -> &'static str {
        match self {
            AnnealStrategy::Cos => "cos",
            AnnealStrategy::Linear => "linear",
        }
    }

    fn parse(s: &str) -> Result<AnnealStrategy> {
        match s {
            "cos" => Ok(AnnealStrategy::Cos),
            "linear" => Ok(AnnealStrategy::Linear),
            other => Err(OptimError::Scheduler(format!(
                "anneal_strategy must be one of 'cos' or 'linear', instead got '{other}'"
            ))),
        }
    }

    /// PyTorch's `_annealing_cos` / `_annealing_linear` from `start` to `end` at `pct` in [0, 1].
    fn anneal(self, start: f64, end: f64, pct: f64) -> f64 {
        match self {
            AnnealStrategy::Cos => {
                let cos_out = (PI * pct).cos() + 1.0;
                end + (start - end) / 2.0 * cos_out
            }
            AnnealStrategy::Linear => (end - start) * pct + start,
        }
    }
}

/// Settings of a [`OneCycleLr`] (PyTorch's defaults apart from `max_lr` and `total_steps`).
#[derive(Debug, Clone, PartialEq)]
pub struct OneCycleConfig {
    /// Peak learning rate of every group (or one per group with [`max_lrs`](Self::max_lrs)).
    pub max_lr: Vec<f64>,
    /// Steps in the cycle (usually epochs × batches per epoch).
    pub total_steps: i64,
    /// Fraction of the cycle spent increasing the learning rate.
    pub pct_start: f64,
    pub anneal_strategy: AnnealStrategy,
    /// Cycle the momentum inversely to the learning rate (SGD/RMSprop `momentum`, Adam `beta1`).
    pub cycle_momentum: bool,
    /// Lowest momentum (reached at the peak learning rate), per group or one for all.
    pub base_momentum: Vec<f64>,
    /// Highest momentum (at the start and end), per group or one for all.
    pub max_momentum: Vec<f64>,
    /// `initial_lr = max_lr / div_factor`.
    pub div_factor: f64,
    /// `min_lr = initial_lr / final_div_factor`.
    pub final_div_factor: f64,
    /// Three phases (up, back down to `initial_lr`, then to `min_lr`) instead of two.
    pub three_phase: bool,
}

impl OneCycleConfig {
    /// PyTorch's defaults: pct_start 0.3, cos, cycle_momentum with momenta 0.85–0.95,
    /// div_factor 25, final_div_factor 1e4, two phases.
    pub fn new(max_lr: f64, total_steps: i64) -> OneCycleConfig {
        OneCycleConfig {
            max_lr: vec![max_lr],
            total_steps,
            pct_start: 0.3,
            anneal_strategy: AnnealStrategy::Cos,
            cycle_momentum: true,
            base_momentum: vec![0.85],
            max_momentum: vec![0.95],
            div_factor: 25.0,
            final_div_factor: 1e4,
            three_phase: false,
        }
    }
    /// `total_steps = epochs * steps_per_epoch`.
    pub fn with_epochs(max_lr: f64, epochs: i64, steps_per_epoch: i64) -> Result<OneCycleConfig> {
        if epochs <= 0 {
            return Err(OptimError::Scheduler(format!("Expected positive integer epochs, but got {epochs}")));
        }
        if steps_per_epoch <= 0 {
            return Err(OptimError::Scheduler(format!(
                "Expected positive integer steps_per_epoch, but got {steps_per_epoch}"
            )));
        }
        let total = epochs.checked_mul(steps_per_epoch).ok_or_else(|| {
            OptimError::Scheduler(format!("epochs ({epochs}) × steps_per_epoch ({steps_per_epoch}) overflows"))
        })?;
        Ok(OneCycleConfig::new(max_lr, total))
    }
    /// One peak learning rate per parameter group.
    pub fn max_lrs(mut self, max_lrs: Vec<f64>) -> Self {
        self.max_lr = max_lrs;
        self
    }
    pub fn pct_start(mut self, pct_start: f64) -> Self {
        self.pct_start = pct_start;
        self
    }
    pub fn anneal_strategy(mut self, strategy: AnnealStrategy) -> Self {
        self.anneal_strategy = strategy;
        self
    }
    pub fn cycle_momentum(mut self, cycle: bool) -> Self {
        self.cycle_momentum = cycle;
        self
    }
    /// The momentum range (`base_momentum` at the peak rate, `max_momentum` at the ends).
    pub fn momentum_range(mut self, base_momentum: f64, max_momentum: f64) -> Self {
        self.base_momentum = vec![base_momentum];
        self.max_momentum = vec![max_momentum];
        self
    }
    pub fn div_factor(mut self, div_factor: f64) -> Self {
        self.div_factor = div_factor;
        self
    }
    pub fn final_div_factor(mut self, final_div_factor: f64) -> Self {
        self.final_div_factor = final_div_factor;
        self
    }
    pub fn three_phase(mut self, three_phase: bool) -> Self {
        self.three_phase = three_phase;
        self
    }
}

/// Per-group values PyTorch keeps in the optimizer's param groups (`initial_lr`, `max_lr`,
/// `min_lr`, `max_momentum`, `base_momentum`); ferrite keeps them in the schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
struct GroupValues {
    initial_lr: f64,
    max_lr: f64,
    min_lr: f64,
    max_momentum: f64,
    base_momentum: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value {
    InitialLr,
    MaxLr,
    MinLr,
    MaxMomentum,
    BaseMomentum,
}

impl GroupValues {
    fn get(&self, v: Value) -> f64 {
        match v {
            Value::InitialLr => self.initial_lr,
            Value::MaxLr => self.max_lr,
            Value::MinLr => self.min_lr,
            Value::MaxMomentum => self.max_momentum,
            Value::BaseMomentum => self.base_momentum,
        }
    }
}

/// One phase of the cycle (PyTorch's `_schedule_phases` entry).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Phase {
    end_step: f64,
    start_lr: Value,
    end_lr: Value,
    start_momentum: Value,
    end_momentum: Value,
}

fn phases(total_steps: i64, pct_start: f64, three_phase: bool) -> Vec<Phase> {
    let total = total_steps as f64;
    let up = Phase {
        end_step: pct_start * total - 1.0,
        start_lr: Value::InitialLr,
        end_lr: Value::MaxLr,
        start_momentum: Value::MaxMomentum,
        end_momentum: Value::BaseMomentum,
    };
    if three_phase {
        vec![
            up,
            Phase {
                end_step: 2.0 * pct_start * total - 2.0,
                start_lr: Value::MaxLr,
                end_lr: Value::InitialLr,
                start_momentum: Value::BaseMomentum,
                end_momentum: Value::MaxMomentum,
            },
            Phase {
                end_step: total - 1.0,
                start_lr: Value::InitialLr,
                end_lr: Value::MinLr,
                start_momentum: Value::MaxMomentum,
                end_momentum: Value::MaxMomentum,
            },
        ]
    } else {
        vec![
            up,
            Phase {
                end_step: total - 1.0,
                start_lr: Value::MaxLr,
                end_lr: Value::MinLr,
                start_momentum: Value::BaseMomentum,
                end_momentum: Value::MaxMomentum,
            },
        ]
    }
}

/// PyTorch's `OneCycleLR`. Step it after every optimizer step (every batch), `total_steps`
/// times in all; the last step allowed is the one that reaches `last_epoch == total_steps`.
///
/// ```
/// use ferrite_optim::{LrScheduler, OneCycleConfig, OneCycleLr, Optimizer, Sgd, SgdConfig};
/// use ferrite_tensor::{Device, Tensor};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let w = Tensor::zeros(&[4], ferrite_tensor::DType::F32, &Device::Cpu)?.requires_grad_(true)?;
/// let mut opt = Sgd::new(vec![w.clone()], SgdConfig::new(0.1).momentum(0.9))?;
/// let mut sched = OneCycleLr::new(&mut opt, OneCycleConfig::new(1.0, 100))?;
/// assert!((opt.lr(0)? - 0.04).abs() < 1e-12);          // max_lr / div_factor
/// assert_eq!(opt.momentum(0)?, Some(0.95));             // max_momentum
/// for _ in 0..30 {
///     opt.step()?;
///     sched.step(&mut opt)?;
/// }
/// assert!((opt.lr(0)? - 1.0).abs() < 1e-3);             // the peak, 30% into the cycle
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct OneCycleLr {
    core: SchedulerCore,
    total_steps: i64,
    pct_start: f64,
    three_phase: bool,
    anneal: AnnealStrategy,
    cycle_momentum: bool,
    groups: Vec<GroupValues>,
    phases: Vec<Phase>,
}

/// One value per group from a list of one (for all) or one per group (PyTorch's `_format_param`).
fn per_group(name: &str, values: &[f64], groups: usize) -> Result<Vec<f64>> {
    match values.len() {
        1 => Ok(vec![values[0]; groups]),
        n if n == groups => Ok(values.to_vec()),
        n => Err(OptimError::Scheduler(format!("expected {groups} values for {name}, got {n}"))),
    }
}

impl OneCycleLr {
    /// Attach to `opt`: sets every group's learning rate to `max_lr / div_factor` (and, with
    /// `cycle_momentum`, its momentum to `max_momentum`).
    pub fn new(opt: &mut dyn Optimizer, c: OneCycleConfig) -> Result<OneCycleLr> {
        if c.total_steps <= 0 {
            return Err(OptimError::Scheduler(format!(
                "Expected positive integer total_steps, but got {}",
                c.total_steps
            )));
        }
        if !(0.0..=1.0).contains(&c.pct_start) {
            return Err(OptimError::Scheduler(format!(
                "Expected float between 0 and 1 pct_start, but got {}",
                c.pct_start
            )));
        }
        for (name, v) in [("div_factor", c.div_factor), ("final_div_factor", c.final_div_factor)] {
            if !(v > 0.0) || !v.is_finite() {
                return Err(OptimError::Scheduler(format!("OneCycleLR {name} must be a positive number, got {v}")));
            }
        }
        let n = opt.num_groups();
        let max_lrs = per_group("max_lr", &c.max_lr, n)?;
        if let Some(bad) = max_lrs.iter().find(|v| !(**v >= 0.0) || !v.is_finite()) {
            return Err(OptimError::Scheduler(format!("OneCycleLR max_lr must be a number >= 0, got {bad}")));
        }
        let max_m = per_group("max_momentum", &c.max_momentum, n)?;
        let base_m = per_group("base_momentum", &c.base_momentum, n)?;
        if c.cycle_momentum {
            for g in 0..n {
                if opt.momentum(g)?.is_none() {
                    return Err(OptimError::Scheduler(
                        "optimizer must support momentum or beta1 with `cycle_momentum` option enabled (Adagrad has neither; pass cycle_momentum(false))".into(),
                    ));
                }
            }
        }
        let groups: Vec<GroupValues> = (0..n)
            .map(|g| {
                let initial_lr = max_lrs[g] / c.div_factor;
                GroupValues {
                    initial_lr,
                    max_lr: max_lrs[g],
                    min_lr: initial_lr / c.final_div_factor,
                    max_momentum: max_m[g],
                    base_momentum: base_m[g],
                }
            })
            .collect();
        for (g, v) in groups.iter().enumerate() {
            opt.set_initial_lr(g, Some(v.initial_lr))?;
            if c.cycle_momentum {
                opt.set_momentum(g, v.max_momentum)?;
            }
        }
        let mut s = OneCycleLr {
            core: SchedulerCore::attach(opt)?,
            total_steps: c.total_steps,
            pct_start: c.pct_start,
            three_phase: c.three_phase,
            anneal: c.anneal_strategy,
            cycle_momentum: c.cycle_momentum,
            phases: phases(c.total_steps, c.pct_start, c.three_phase),
            groups,
        };
        s.initial_step(opt)?;
        Ok(s)
    }

    /// Steps in the cycle.
    pub fn total_steps(&self) -> i64 {
        self.total_steps
    }

    /// (learning rate, momentum) of every group at step `step_num`.
    fn values_at(&self, step_num: i64) -> Vec<(f64, f64)> {
        let step = step_num as f64;
        self.groups
            .iter()
            .map(|g| {
                let mut start_step = 0.0;
                for (i, ph) in self.phases.iter().enumerate() {
                    if step <= ph.end_step || i == self.phases.len() - 1 {
                        let pct = (step - start_step) / (ph.end_step - start_step);
                        let lr = self.anneal.anneal(g.get(ph.start_lr), g.get(ph.end_lr), pct);
                        let m = self.anneal.anneal(g.get(ph.start_momentum), g.get(ph.end_momentum), pct);
                        return (lr, m);
                    }
                    start_step = ph.end_step;
                }
                (g.initial_lr, g.max_momentum)
            })
            .collect()
    }
}

impl LrScheduler for OneCycleLr {
    fn step(&mut self, opt: &mut dyn Optimizer) -> Result<()> {
        self.core.check_optimizer(opt)?;
        let next = self.core.last_epoch + 1;
        if next > self.total_steps {
            return Err(OptimError::ScheduleFinished { steps: next, total_steps: self.total_steps });
        }
        self.core.step_count += 1;
        self.core.last_epoch = next;
        let values = self.values_at(next);
        for (g, (lr, m)) in values.iter().enumerate() {
            opt.set_lr(g, *lr)?;
            if self.cycle_momentum {
                opt.set_momentum(g, *m)?;
            }
        }
        self.core.last_lr = opt.lrs();
        Ok(())
    }

    fn kind(&self) -> &'static str {
        "OneCycleLR"
    }
    fn core(&self) -> &SchedulerCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut SchedulerCore {
        &mut self.core
    }
    fn get_lr(&self, _current: &[f64]) -> Vec<f64> {
        self.values_at(self.core.last_epoch).into_iter().map(|(lr, _)| lr).collect()
    }
    fn closed_form_lr(&self) -> Option<Vec<f64>> {
        Some(self.get_lr(&[]))
    }
    fn params(&self) -> Vec<(String, HyperValue)> {
        let col = |f: fn(&GroupValues) -> f64| HyperValue::Floats(self.groups.iter().map(f).collect());
        vec![
            ("total_steps".into(), HyperValue::Int(self.total_steps)),
            ("pct_start".into(), HyperValue::Float(self.pct_start)),
            ("three_phase".into(), HyperValue::Bool(self.three_phase)),
            ("_anneal_func_type".into(), HyperValue::Str(self.anneal.name().into())),
            ("cycle_momentum".into(), HyperValue::Bool(self.cycle_momentum)),
            ("initial_lr".into(), col(|g| g.initial_lr)),
            ("max_lr".into(), col(|g| g.max_lr)),
            ("min_lr".into(), col(|g| g.min_lr)),
            ("max_momentum".into(), col(|g| g.max_momentum)),
            ("base_momentum".into(), col(|g| g.base_momentum)),
        ]
    }
    fn load_params(&mut self, p: &[(String, HyperValue)]) -> Result<()> {
        let total_steps = param_i64(p, "total_steps")?;
        if total_steps <= 0 {
            return Err(OptimError::Scheduler(format!("OneCycleLR state has total_steps {total_steps}")));
        }
        let pct_start = param_f64(p, "pct_start")?;
        let flag = |key: &str| -> Result<bool> {
            p.iter()
                .find(|(k, _)| k == key)
                .and_then(|(_, v)| v.as_bool())
                .ok_or_else(|| OptimError::Scheduler(format!("OneCycleLR state has no bool `{key}`")))
        };
        let three_phase = flag("three_phase")?;
        let cycle_momentum = flag("cycle_momentum")?;
        let anneal = match p.iter().find(|(k, _)| k == "_anneal_func_type") {
            Some((_, HyperValue::Str(s))) => AnnealStrategy::parse(s)?,
            _ => return Err(OptimError::Scheduler("OneCycleLR state has no `_anneal_func_type`".into())),
        };
        let n = self.groups.len();
        let col = |key: &str| -> Result<Vec<f64>> {
            match p.iter().find(|(k, _)| k == key) {
                Some((_, HyperValue::Floats(v))) if v.len() == n => Ok(v.clone()),
                _ => Err(OptimError::Scheduler(format!(
                    "OneCycleLR state needs `{key}` with one value per parameter group ({n})"
                ))),
            }
        };
        let (i, ma, mi, mm, bm) =
            (col("initial_lr")?, col("max_lr")?, col("min_lr")?, col("max_momentum")?, col("base_momentum")?);
        self.total_steps = total_steps;
        self.pct_start = pct_start;
        self.three_phase = three_phase;
        self.cycle_momentum = cycle_momentum;
        self.anneal = anneal;
        self.phases = phases(total_steps, pct_start, three_phase);
        self.groups = (0..n)
            .map(|g| GroupValues {
                initial_lr: i[g],
                max_lr: ma[g],
                min_lr: mi[g],
                max_momentum: mm[g],
                base_momentum: bm[g],
            })
            .collect();
        Ok(())
    }
}
