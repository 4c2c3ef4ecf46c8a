//! CosineAnnealingWarmRestarts (SGDR): cosine annealing from the base rate to `eta_min` over
//! `T_i` epochs, then a restart at the base rate with `T_i` multiplied by `T_mult`.
//!
//! It may be stepped with whole epochs ([`LrScheduler::step`]) or with a fractional epoch
//! ([`CosineAnnealingWarmRestarts::step_to`], e.g. `epoch + batch / batches` after every batch),
//! exactly as PyTorch's `step(epoch)`; both use PyTorch's arithmetic, so the rates are PyTorch's.

use std::f64::consts::PI;

use super::{LrScheduler, SchedulerCore, param_f64, param_i64};
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use crate::state_dict::HyperValue;

/// `lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * T_cur / T_i)) / 2` with `T_cur` the
/// epochs since the last restart (PyTorch's `CosineAnnealingWarmRestarts`).
///
/// ```
/// use ferrite_optim::{CosineAnnealingWarmRestarts, LrScheduler, Optimizer, Sgd, SgdConfig};
/// use ferrite_tensor::{DType, Device, Tensor};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let w = Tensor::zeros(&[4], DType::F32, &Device::Cpu)?.requires_grad_(true)?;
/// let mut opt = Sgd::new(vec![w], SgdConfig::new(0.1))?;
/// let mut sched = CosineAnnealingWarmRestarts::new(&mut opt, 4, 2, 0.0)?;
/// for _ in 0..4 {
///     sched.step(&mut opt)?;
/// }
/// assert_eq!(opt.lr(0)?, 0.1); // restarted after T_0 = 4 epochs; the next period is 8
/// sched.step_to(&mut opt, 8.0)?; // or set a (fractional) epoch: half-way through the period of 8
/// assert!((opt.lr(0)? - 0.05).abs() < 1e-12);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct CosineAnnealingWarmRestarts {
    core: SchedulerCore,
    t_0: i64,
    t_i: i64,
    t_mult: i64,
    eta_min: f64,
    /// Epochs since the last restart (fractional when stepped with fractional epochs).
    t_cur: f64,
}

fn check(t_0: i64, t_mult: i64, eta_min: f64) -> Result<()> {
    if t_0 <= 0 {
        return Err(OptimError::Scheduler(format!("Expected positive integer T_0, but got {t_0}")));
    }
    if t_mult < 1 {
        return Err(OptimError::Scheduler(format!("Expected integer T_mult >= 1, but got {t_mult}")));
    }
    if !eta_min.is_finite() {
        return Err(OptimError::Scheduler(format!("Expected a finite eta_min, but got {eta_min}")));
    }
    Ok(())
}

impl CosineAnnealingWarmRestarts {
    /// First period `t_0` epochs, each next period `t_mult` times longer, rates down to `eta_min`.
    pub fn new(opt: &mut dyn Optimizer, t_0: i64, t_mult: i64, eta_min: f64) -> Result<CosineAnnealingWarmRestarts> {
        check(t_0, t_mult, eta_min)?;
        let mut s = CosineAnnealingWarmRestarts {
            core: SchedulerCore::attach(opt)?,
            t_0,
            t_i: t_0,
            t_mult,
            eta_min,
            t_cur: -1.0,
        };
        s.initial_step(opt)?;
        Ok(s)
    }

    /// Set the schedule to `epoch` (may be fractional, e.g. `epoch + i / iters` inside an
    /// epoch), as PyTorch's `step(epoch)`. A negative or non-finite epoch is an error.
    pub fn step_to(&mut self, opt: &mut dyn Optimizer, epoch: f64) -> Result<()> {
        self.core.check_optimizer(opt)?;
        if !(epoch >= 0.0) || !epoch.is_finite() {
            return Err(OptimError::Scheduler(format!("Expected non-negative epoch, but got {epoch}")));
        }
        let (t_0, t_mult) = (self.t_0 as f64, self.t_mult);
        if epoch >= t_0 {
            if t_mult == 1 {
                self.t_cur = epoch.rem_euclid(t_0);
            } else {
                let m = t_mult as f64;
                let n = ((epoch / t_0 * (m - 1.0) + 1.0).ln() / m.ln()) as i64;
                let pow = u32::try_from(n).ok().and_then(|n| t_mult.checked_pow(n));
                let Some(pow) = pow.and_then(|p| p.checked_mul(self.t_0)) else {
                    return Err(OptimError::Scheduler(format!(
                        "epoch {epoch} is beyond the restarts this schedule can count (T_0 {}, T_mult {t_mult})",
                        self.t_0
                    )));
                };
                self.t_cur = epoch - (pow - self.t_0) as f64 / (m - 1.0);
                self.t_i = pow;
            }
        } else {
            self.t_i = self.t_0;
            self.t_cur = epoch;
        }
        self.core.step_count += 1;
        self.core.last_epoch = epoch.floor() as i64;
        self.apply(opt)
    }

    /// Epochs since the last restart (PyTorch's `T_cur`).
    pub fn t_cur(&self) -> f64 {
        self.t_cur
    }

    /// Length of the current period (PyTorch's `T_i`).
    pub fn t_i(&self) -> i64 {
        self.t_i
    }

    fn rates(&self) -> Vec<f64> {
        let (eta, t_cur, t_i) = (self.eta_min, self.t_cur, self.t_i as f64);
        self.core.base_lrs.iter().map(|b| eta + (b - eta) * (1.0 + (PI * t_cur / t_i).cos()) / 2.0).collect()
    }

    fn apply(&mut self, opt: &mut dyn Optimizer) -> Result<()> {
        for (g, lr) in self.rates().into_iter().enumerate() {
            opt.set_lr(g, lr)?;
        }
        self.core.last_lr = opt.lrs();
        Ok(())
    }
}

impl LrScheduler for CosineAnnealingWarmRestarts {
    fn step(&mut self, opt: &mut dyn Optimizer) -> Result<()> {
        self.core.check_optimizer(opt)?;
        if self.core.last_epoch < 0 {
            return self.step_to(opt, 0.0);
        }
        self.t_cur += 1.0;
        if self.t_cur >= self.t_i as f64 {
            self.t_cur = self.t_cur.rem_euclid(self.t_i as f64);
            self.t_i = self.t_i.saturating_mul(self.t_mult);
        }
        self.core.step_count += 1;
        self.core.last_epoch += 1;
        self.apply(opt)
    }

    fn kind(&self) -> &'static str {
        "CosineAnnealingWarmRestarts"
    }
    fn core(&self) -> &SchedulerCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut SchedulerCore {
        &mut self.core
    }
    fn get_lr(&self, _current: &[f64]) -> Vec<f64> {
        self.rates()
    }
    fn params(&self) -> Vec<(String, HyperValue)> {
        vec![
            ("T_0".into(), HyperValue::Int(self.t_0)),
            ("T_i".into(), HyperValue::Int(self.t_i)),
            ("T_mult".into(), HyperValue::Int(self.t_mult)),
            ("eta_min".into(), HyperValue::Float(self.eta_min)),
            ("T_cur".into(), HyperValue::Float(self.t_cur)),
        ]
    }
    fn load_params(&mut self, p: &[(String, HyperValue)]) -> Result<()> {
        let (t_0, t_i, t_mult) = (param_i64(p, "T_0")?, param_i64(p, "T_i")?, param_i64(p, "T_mult")?);
        let (eta_min, t_cur) = (param_f64(p, "eta_min")?, param_f64(p, "T_cur")?);
        check(t_0, t_mult, eta_min)?;
        if t_i < t_0 || !(t_cur >= -1.0) || !t_cur.is_finite() {
            return Err(OptimError::Scheduler(format!(
                "CosineAnnealingWarmRestarts state has T_i {t_i} (T_0 {t_0}) and T_cur {t_cur}; was it saved by another schedule?"
            )));
        }
        (self.t_0, self.t_i, self.t_mult, self.eta_min, self.t_cur) = (t_0, t_i, t_mult, eta_min, t_cur);
        Ok(())
    }
}
