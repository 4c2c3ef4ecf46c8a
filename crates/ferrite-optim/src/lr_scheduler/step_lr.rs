//! StepLR: multiply the learning rate by `gamma` every `step_size` epochs.

use super::{LrScheduler, SchedulerCore, param_f64, param_i64};
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use crate::state_dict::HyperValue;

/// `lr = base_lr * gamma^(epoch / step_size)` (PyTorch's `StepLR`).
#[derive(Debug, Clone)]
pub struct StepLr {
    core: SchedulerCore,
    step_size: i64,
    gamma: f64,
}

fn validate(step_size: i64) -> Result<()> {
    if step_size < 1 {
        return Err(OptimError::Scheduler(format!("StepLR step_size must be at least 1, got {step_size}")));
    }
    Ok(())
}

impl StepLr {
    pub fn new(opt: &mut dyn Optimizer, step_size: i64, gamma: f64) -> Result<StepLr> {
        validate(step_size)?;
        let mut s = StepLr { core: SchedulerCore::attach(opt)?, step_size, gamma };
        s.initial_step(opt)?;
        Ok(s)
    }
}

impl LrScheduler for StepLr {
    fn kind(&self) -> &'static str {
        "StepLR"
    }
    fn core(&self) -> &SchedulerCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut SchedulerCore {
        &mut self.core
    }
    fn get_lr(&self, current: &[f64]) -> Vec<f64> {
        let e = self.core.last_epoch;
        if e == 0 || e.rem_euclid(self.step_size) != 0 {
            return current.to_vec();
        }
        current.iter().map(|lr| lr * self.gamma).collect()
    }
    fn closed_form_lr(&self) -> Option<Vec<f64>> {
        let k = self.core.last_epoch.div_euclid(self.step_size) as f64;
        Some(self.core.base_lrs.iter().map(|b| b * self.gamma.powf(k)).collect())
    }
    fn params(&self) -> Vec<(String, HyperValue)> {
        vec![("step_size".into(), HyperValue::Int(self.step_size)), ("gamma".into(), HyperValue::Float(self.gamma))]
    }
    fn load_params(&mut self, p: &[(String, HyperValue)]) -> Result<()> {
        let step_size = param_i64(p, "step_size")?;
        validate(step_size)?;
        self.step_size = step_size;
        self.gamma = param_f64(p, "gamma")?;
        Ok(())
    }
}
