//! SequentialLR: run schedules one after another, switching at milestones — and the common
//! warm-up-then-cosine recipe built from it.

use super::{CosineAnnealingLr, LinearLr, LrScheduler, SchedulerCore, SchedulerState, check_kind};
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use crate::state_dict::HyperValue;

/// Schedules `schedulers[i]` active from `milestones[i-1]` on (PyTorch's `SequentialLR`).
/// At a milestone the next schedule restarts from its epoch 0 (closed form).
#[derive(Debug)]
pub struct SequentialLr {
    core: SchedulerCore,
    schedulers: Vec<Box<dyn LrScheduler>>,
    milestones: Vec<i64>,
}

impl SequentialLr {
    /// Take over `schedulers` (each already built on `opt`), as PyTorch's constructor does:
    /// reset the rates to `initial_lr`, rewind the children and re-run the first one's initial
    /// step.
    pub fn new(
        opt: &mut dyn Optimizer,
        schedulers: Vec<Box<dyn LrScheduler>>,
        milestones: Vec<i64>,
    ) -> Result<SequentialLr> {
        if schedulers.is_empty() {
            return Err(OptimError::Scheduler(
                "SequentialLR expects at least one scheduler, but got no scheduler.".into(),
            ));
        }
        for (i, s) in schedulers.iter().enumerate() {
            if s.optimizer_id() != opt.id() {
                return Err(OptimError::Scheduler(format!(
                    "SequentialLR expects all schedulers to belong to the same optimizer, but got scheduler {} at index {i} built on another optimizer",
                    s.kind()
                )));
            }
        }
        if milestones.len() != schedulers.len() - 1 {
            return Err(OptimError::Scheduler(format!(
                "Sequential Schedulers expects number of schedulers provided to be one more than the number of milestone points, but got number of schedulers {} and the number of milestones to be equal to {}",
                schedulers.len(),
                milestones.len()
            )));
        }
        let mut core = SchedulerCore::attach(opt)?;
        core.last_epoch = 0;
        for g in 0..opt.num_groups() {
            if let Some(lr0) = opt.initial_lr(g)? {
                opt.set_lr(g, lr0)?;
            }
        }
        let mut s = SequentialLr { core, schedulers, milestones };
        for child in s.schedulers.iter_mut() {
            child.undo_last_epoch();
        }
        let idx = s.index_for(0);
        s.schedulers[idx].initial_step(opt)?;
        s.core.last_lr = s.schedulers[idx].get_last_lr();
        Ok(s)
    }

    /// `bisect_right(milestones, epoch)`.
    fn index_for(&self, epoch: i64) -> usize {
        self.milestones.partition_point(|&m| m <= epoch)
    }
}

impl LrScheduler for SequentialLr {
    fn step(&mut self, opt: &mut dyn Optimizer) -> Result<()> {
        self.core.check_optimizer(opt)?;
        self.core.last_epoch += 1;
        let e = self.core.last_epoch;
        let idx = self.index_for(e);
        if idx > 0 && self.milestones[idx - 1] == e {
            self.schedulers[idx].update_lr(opt, Some(0))?;
        } else {
            self.schedulers[idx].step(opt)?;
        }
        self.core.last_lr = self.schedulers[idx].get_last_lr();
        Ok(())
    }

    fn kind(&self) -> &'static str {
        "SequentialLR"
    }
    fn core(&self) -> &SchedulerCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut SchedulerCore {
        &mut self.core
    }
    fn get_lr(&self, current: &[f64]) -> Vec<f64> {
        current.to_vec()
    }
    fn params(&self) -> Vec<(String, HyperValue)> {
        vec![("_milestones".into(), HyperValue::Ints(self.milestones.clone()))]
    }
    fn load_params(&mut self, p: &[(String, HyperValue)]) -> Result<()> {
        match p.iter().find(|(k, _)| k == "_milestones") {
            Some((_, HyperValue::Ints(m))) if m.len() == self.milestones.len() => {
                self.milestones = m.clone();
                Ok(())
            }
            _ => Err(OptimError::Scheduler(format!(
                "SequentialLR state needs `_milestones` with {} entries",
                self.milestones.len()
            ))),
        }
    }
    fn undo_last_epoch(&mut self) {
        for c in self.schedulers.iter_mut() {
            c.undo_last_epoch();
        }
    }

    fn state_dict(&self) -> SchedulerState {
        SchedulerState {
            children: self.schedulers.iter().map(|s| s.state_dict()).collect(),
            ..SchedulerState::of(self.kind(), &self.core, self.params())
        }
    }

    fn load_state_dict(&mut self, s: &SchedulerState) -> Result<()> {
        check_kind(self.kind(), s)?;
        if s.children.len() != self.schedulers.len() {
            return Err(OptimError::Scheduler(format!(
                "SequentialLR state has {} schedulers, this one {}",
                s.children.len(),
                self.schedulers.len()
            )));
        }
        // Check every child first so a failed load changes nothing.
        for (child, cs) in self.schedulers.iter().zip(&s.children) {
            check_kind(child.kind(), cs)?;
        }
        self.load_params(&s.params)?;
        for (child, cs) in self.schedulers.iter_mut().zip(&s.children) {
            child.load_state_dict(cs)?;
        }
        self.core.last_epoch = s.last_epoch;
        self.core.step_count = s.step_count;
        self.core.base_lrs = s.base_lrs.clone();
        self.core.last_lr = s.last_lr.clone();
        Ok(())
    }
}

/// Linear warm-up from `start_factor * lr` to `lr` over `warmup_iters` steps, then cosine
/// annealing to `eta_min` at `total_iters` — PyTorch's
/// `SequentialLR([LinearLR(start_factor, 1.0, warmup_iters), CosineAnnealingLR(total_iters - warmup_iters, eta_min)], [warmup_iters])`.
pub fn warmup_cosine(
    opt: &mut dyn Optimizer,
    warmup_iters: i64,
    total_iters: i64,
    start_factor: f64,
    eta_min: f64,
) -> Result<SequentialLr> {
    if warmup_iters < 1 || total_iters <= warmup_iters {
        return Err(OptimError::Scheduler(format!(
            "warmup_cosine needs 1 <= warmup_iters < total_iters, got warmup_iters {warmup_iters}, total_iters {total_iters}"
        )));
    }
    let warm = LinearLr::new(opt, start_factor, 1.0, warmup_iters)?;
    let cos = CosineAnnealingLr::new(opt, total_iters - warmup_iters, eta_min)?;
    SequentialLr::new(opt, vec![Box::new(warm), Box::new(cos)], vec![warmup_iters])
}
