//! CosineAnnealingLR: anneal the learning rate along half a cosine to `eta_min`.

use std::f64::consts::PI;

use super::{LrScheduler, SchedulerCore, param_f64, param_i64};
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use crate::state_dict::HyperValue;

/// `lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2`, computed with
/// PyTorch's recursive form (so rates match its `CosineAnnealingLR` step for step, including
/// the restart behaviour past `T_max`).
#[derive(Debug, Clone)]
pub struct CosineAnnealingLr {
    core: SchedulerCore,
    t_max: i64,
    eta_min: f64,
}

impl CosineAnnealingLr {
    pub fn new(opt: &mut dyn Optimizer, t_max: i64, eta_min: f64) -> Result<CosineAnnealingLr> {
        if t_max < 1 {
            return Err(OptimError::Scheduler(format!("CosineAnnealingLR T_max must be at least 1, got {t_max}")));
        }
        let mut s = CosineAnnealingLr { core: SchedulerCore::attach(opt)?, t_max, eta_min };
        s.initial_step(opt)?;
        Ok(s)
    }
}

impl LrScheduler for CosineAnnealingLr {
    fn kind(&self) -> &'static str {
        "CosineAnnealingLR"
    }
    fn core(&self) -> &SchedulerCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut SchedulerCore {
        &mut self.core
    }
    fn get_lr(&self, current: &[f64]) -> Vec<f64> {
        let c = &self.core;
        let (e, t, eta) = (c.last_epoch, self.t_max as f64, self.eta_min);
        if c.is_initial {
            return current.to_vec();
        }
        if c.step_count == 1 && e > 0 {
            return c.base_lrs.iter().map(|b| eta + (b - eta) * (1.0 + (e as f64 * PI / t).cos()) / 2.0).collect();
        }
        if (e - 1 - self.t_max).rem_euclid(2 * self.t_max) == 0 {
            return current
                .iter()
                .zip(&c.base_lrs)
                .map(|(lr, b)| lr + (b - eta) * (1.0 - (PI / t).cos()) / 2.0)
                .collect();
        }
        let ratio = (1.0 + (PI * e as f64 / t).cos()) / (1.0 + (PI * (e - 1) as f64 / t).cos());
        current.iter().map(|lr| ratio * (lr - eta) + eta).collect()
    }
    fn closed_form_lr(&self) -> Option<Vec<f64>> {
        let (e, t, eta) = (self.core.last_epoch as f64, self.t_max as f64, self.eta_min);
        Some(self.core.base_lrs.iter().map(|b| eta + (b - eta) * (1.0 + (PI * e / t).cos()) / 2.0).collect())
    }
    fn params(&self) -> Vec<(String, HyperValue)> {
        vec![("T_max".into(), HyperValue::Int(self.t_max)), ("eta_min".into(), HyperValue::Float(self.eta_min))]
    }
    fn load_params(&mut self, p: &[(String, HyperValue)]) -> Result<()> {
        let t = param_i64(p, "T_max")?;
        if t < 1 {
            return Err(OptimError::Scheduler(format!("CosineAnnealingLR T_max must be at least 1, got {t}")));
        }
        self.t_max = t;
        self.eta_min = param_f64(p, "eta_min")?;
        Ok(())
    }
}
