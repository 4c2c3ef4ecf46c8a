//! LinearLR: ramp the learning rate linearly between two factors (the usual warm-up).

use super::{LrScheduler, SchedulerCore, param_f64, param_i64};
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use crate::state_dict::HyperValue;

/// `lr = base_lr * (start + (end - start) * min(epoch, total_iters) / total_iters)`
/// (PyTorch's `LinearLR`; its defaults are `start_factor = 1/3`, `end_factor = 1`, 5 iterations).
#[derive(Debug, Clone)]
pub struct LinearLr {
    core: SchedulerCore,
    start_factor: f64,
    end_factor: f64,
    total_iters: i64,
}

fn validate(start_factor: f64, end_factor: f64, total_iters: i64) -> Result<()> {
    if !(start_factor > 0.0 && start_factor <= 1.0) {
        return Err(OptimError::Scheduler(
            "Starting multiplicative factor expected to be greater than 0 and less or equal to 1.".into(),
        ));
    }
    if !(0.0..=1.0).contains(&end_factor) {
        return Err(OptimError::Scheduler("Ending multiplicative factor expected to be between 0 and 1.".into()));
    }
    if total_iters < 0 {
        return Err(OptimError::Scheduler(format!("LinearLR total_iters must be >= 0, got {total_iters}")));
    }
    Ok(())
}

impl LinearLr {
    pub fn new(opt: &mut dyn Optimizer, start_factor: f64, end_factor: f64, total_iters: i64) -> Result<LinearLr> {
        validate(start_factor, end_factor, total_iters)?;
        let mut s = LinearLr { core: SchedulerCore::attach(opt)?, start_factor, end_factor, total_iters };
        s.initial_step(opt)?;
        Ok(s)
    }
}

impl LrScheduler for LinearLr {
    fn kind(&self) -> &'static str {
        "LinearLR"
    }
    fn core(&self) -> &SchedulerCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut SchedulerCore {
        &mut self.core
    }
    fn get_lr(&self, current: &[f64]) -> Vec<f64> {
        let e = self.core.last_epoch;
        if e == 0 {
            return current.iter().map(|lr| lr * self.start_factor).collect();
        }
        if self.core.is_initial || e > self.total_iters {
            return current.to_vec();
        }
        let d = self.end_factor - self.start_factor;
        let factor = 1.0 + d / (self.total_iters as f64 * self.start_factor + (e - 1) as f64 * d);
        current.iter().map(|lr| lr * factor).collect()
    }
    fn closed_form_lr(&self) -> Option<Vec<f64>> {
        let d = self.end_factor - self.start_factor;
        let frac = if self.total_iters == 0 {
            1.0
        } else {
            d * self.total_iters.min(self.core.last_epoch) as f64 / self.total_iters as f64
        };
        let f = if self.total_iters == 0 { self.end_factor } else { self.start_factor + frac };
        Some(self.core.base_lrs.iter().map(|b| b * f).collect())
    }
    fn params(&self) -> Vec<(String, HyperValue)> {
        vec![
            ("start_factor".into(), HyperValue::Float(self.start_factor)),
            ("end_factor".into(), HyperValue::Float(self.end_factor)),
            ("total_iters".into(), HyperValue::Int(self.total_iters)),
        ]
    }
    fn load_params(&mut self, p: &[(String, HyperValue)]) -> Result<()> {
        let (s, e, t) = (param_f64(p, "start_factor")?, param_f64(p, "end_factor")?, param_i64(p, "total_iters")?);
        validate(s, e, t)?;
        (self.start_factor, self.end_factor, self.total_iters) = (s, e, t);
        Ok(())
    }
}
