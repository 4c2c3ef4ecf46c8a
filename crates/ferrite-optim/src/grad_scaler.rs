//! Dynamic loss scaling for low-precision training — PyTorch's `torch.amp.GradScaler`.
//!
//! f16 gradients underflow to zero for small values; multiplying the loss by a large scale
//! before backward keeps them representable, and dividing the gradients by it before the step
//! restores their true size. The scale adapts: a step whose gradients contain inf/NaN is
//! skipped and the scale shrinks (`backoff_factor`); after `growth_interval` clean steps it
//! grows (`growth_factor`). Same state machine, error texts and arithmetic as PyTorch
//! (`inv_scale = (1 / scale as f64) as f32`, `_amp_update_scale_`), so scale trajectories match
//! exactly.
//!
//! ```
//! use ferrite_optim::{GradScaler, GradScalerConfig, Optimizer, Sgd, SgdConfig, clip_grad_norm_};
//! use ferrite_tensor::{Device, Tensor};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let w = Tensor::from_vec(vec![1.0f32, 2.0], &[2], &Device::Cpu)?.requires_grad_(true)?;
//! let mut opt = Sgd::new(vec![w.clone()], SgdConfig::new(0.1))?;
//! let mut scaler = GradScaler::new(GradScalerConfig::default())?;
//! let loss = w.square()?.sum()?;
//! scaler.scale(&loss)?.backward()?;
//! scaler.unscale_(&mut opt)?;              // true gradients from here on
//! clip_grad_norm_(&opt.params(), 1.0)?;     // so clipping sees the real norm
//! let stepped = scaler.step(&mut opt)?;     // skipped if a gradient was inf/NaN
//! scaler.update()?;
//! opt.zero_grad()?;
//! assert!(stepped);
//! # Ok(()) }
//! ```

use std::collections::HashMap;

use ferrite_tensor::backend::FusedKernel;
use ferrite_tensor::{DType, Device, Tensor, no_grad};

use crate::error::{OptimError, Result};
use crate::optimizer::{Optimizer, OptimizerId};
use crate::update_target::{unsupported, with_contiguous};

/// GradScaler settings (PyTorch's defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct GradScalerConfig {
    pub init_scale: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: i64,
    /// When false every method is a pass-through: `step` just steps.
    pub enabled: bool,
}

impl Default for GradScalerConfig {
    fn default() -> Self {
        GradScalerConfig {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            enabled: true,
        }
    }
}

/// Where an optimizer is in the current iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptState {
    Ready,
    Unscaled,
    Stepped,
}

/// The scaler's checkpoint state (PyTorch's `state_dict` keys: `scale`, `growth_factor`,
/// `backoff_factor`, `growth_interval`, `_growth_tracker`).
#[derive(Debug, Clone, PartialEq)]
pub struct GradScalerState {
    pub scale: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: i64,
    pub growth_tracker: i64,
}

#[derive(Debug)]
struct PerOptimizer {
    stage: OptState,
    /// One entry per device holding gradients: whether any was inf/NaN.
    found_inf_per_device: Vec<(Device, bool)>,
}

impl PerOptimizer {
    fn ready() -> Self {
        PerOptimizer { stage: OptState::Ready, found_inf_per_device: Vec::new() }
    }
}

/// Dynamic loss scaler (see the module docs).
#[derive(Debug)]
pub struct GradScaler {
    enabled: bool,
    init_scale: f64,
    /// Created by the first `scale()` call, like PyTorch's lazily created tensor.
    scale: Option<f32>,
    growth_factor: f64,
    backoff_factor: f64,
    growth_interval: i64,
    init_growth_tracker: i64,
    growth_tracker: Option<i32>,
    per_optimizer: HashMap<OptimizerId, PerOptimizer>,
}

const FIX: &str = "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration.";

impl GradScaler {
    pub fn new(config: GradScalerConfig) -> Result<GradScaler> {
        if config.enabled {
            if !(config.growth_factor > 1.0) {
                return Err(OptimError::GradScaler("The growth factor must be > 1.0.".into()));
            }
            if !(config.backoff_factor < 1.0) {
                return Err(OptimError::GradScaler("The backoff factor must be < 1.0.".into()));
            }
        }
        Ok(GradScaler {
            enabled: config.enabled,
            init_scale: config.init_scale,
            scale: None,
            growth_factor: config.growth_factor,
            backoff_factor: config.backoff_factor,
            growth_interval: config.growth_interval,
            init_growth_tracker: 0,
            growth_tracker: None,
            per_optimizer: HashMap::new(),
        })
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// `loss * scale` (the loss itself when disabled). Call `backward()` on the result.
    pub fn scale(&mut self, loss: &Tensor) -> Result<Tensor> {
        if !self.enabled {
            return Ok(loss.clone());
        }
        let s = self.lazy_scale();
        Ok(loss.mul_scalar(s as f64)?)
    }

    /// The factor [`scale`](Self::scale) multiplies a loss by (1 when disabled), starting the
    /// scaler as `scale` does: for a caller that scales losses itself, e.g. on other threads.
    pub fn scale_factor(&mut self) -> f64 {
        if !self.enabled {
            return 1.0;
        }
        self.lazy_scale() as f64
    }

    fn lazy_scale(&mut self) -> f32 {
        if self.scale.is_none() {
            self.scale = Some(self.init_scale as f32);
            self.growth_tracker = Some(self.init_growth_tracker as i32);
        }
        self.scale.unwrap_or(self.init_scale as f32)
    }

    fn check_scale(&self, func: &str) -> Result<f32> {
        match self.scale {
            Some(s) if self.growth_tracker.is_some() => Ok(s),
            _ => Err(OptimError::GradScaler(format!("Attempted {func} but _scale is None.  {FIX}"))),
        }
    }

    /// Divide `opt`'s gradients by the scale in place and record whether any is inf/NaN.
    /// Optional: `step` does it when you did not. Call it to clip or inspect true gradients.
    pub fn unscale_(&mut self, opt: &mut dyn Optimizer) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let scale = self.check_scale("unscale_")?;
        let st = self.per_optimizer.entry(opt.id()).or_insert_with(PerOptimizer::ready);
        match st.stage {
            OptState::Unscaled => {
                return Err(OptimError::GradScaler(
                    "unscale_() has already been called on this optimizer since the last update().".into(),
                ));
            }
            OptState::Stepped => return Err(OptimError::GradScaler("unscale_() is being called after step().".into())),
            OptState::Ready => {}
        }
        // FP32 division can be imprecise for certain compile options, so the reciprocal is
        // taken in f64 (as PyTorch does).
        let inv_scale = (1.0 / scale as f64) as f32;
        let mut grads: Vec<Tensor> = Vec::new();
        for p in opt.params() {
            let Some(g) = p.grad() else { continue };
            if g.dtype() == DType::F16 {
                return Err(OptimError::GradScaler("Attempting to unscale FP16 gradients.".into()));
            }
            grads.push(g);
        }
        let _ng = no_grad();
        let mut per_device: Vec<(Device, bool)> = Vec::new();
        for g in &grads {
            if !g.dtype().is_floating_point() {
                return Err(unsupported("unscale_", g.dtype()));
            }
            let mut found = false;
            with_contiguous(g, |g| {
                found = Tensor::fused(&FusedKernel::Unscale { inv_scale: inv_scale as f64 }, &[g], &[])? != 0.0;
                Ok(())
            })?;
            match per_device.iter_mut().find(|(d, _)| d == g.device()) {
                Some((_, f)) => *f |= found,
                None => per_device.push((g.device().clone(), found)),
            }
        }
        st.found_inf_per_device = per_device;
        st.stage = OptState::Unscaled;
        Ok(())
    }

    /// Unscale (if not done yet) and run `opt.step()` unless a gradient was inf/NaN.
    /// Returns whether the optimizer stepped.
    pub fn step(&mut self, opt: &mut dyn Optimizer) -> Result<bool> {
        if !self.enabled {
            opt.step()?;
            return Ok(true);
        }
        self.check_scale("step")?;
        let stage = self.per_optimizer.entry(opt.id()).or_insert_with(PerOptimizer::ready).stage;
        if stage == OptState::Stepped {
            return Err(OptimError::GradScaler("step() has already been called since the last update().".into()));
        }
        if stage == OptState::Ready {
            self.unscale_(opt)?;
        }
        let st = self.per_optimizer.entry(opt.id()).or_insert_with(PerOptimizer::ready);
        if st.found_inf_per_device.is_empty() {
            return Err(OptimError::GradScaler("No inf checks were recorded for this optimizer.".into()));
        }
        let found_inf = st.found_inf_per_device.iter().any(|(_, f)| *f);
        if !found_inf {
            opt.step()?;
        }
        if let Some(st) = self.per_optimizer.get_mut(&opt.id()) {
            st.stage = OptState::Stepped;
        }
        Ok(!found_inf)
    }

    /// Adapt the scale from this iteration's inf checks (all optimizers) and start a new
    /// iteration. Call once per iteration, after every `step`.
    pub fn update(&mut self) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let scale = self.check_scale("update")?;
        let checks: Vec<bool> =
            self.per_optimizer.values().flat_map(|s| s.found_inf_per_device.iter().map(|(_, f)| *f)).collect();
        if checks.is_empty() {
            return Err(OptimError::GradScaler("No inf checks were recorded prior to update.".into()));
        }
        let found_inf = checks.iter().any(|f| *f);
        let tracker = self.growth_tracker.unwrap_or(0);
        let (scale, tracker) =
            update_scale(scale, tracker, found_inf, self.growth_factor, self.backoff_factor, self.growth_interval);
        self.scale = Some(scale);
        self.growth_tracker = Some(tracker);
        self.per_optimizer.clear();
        Ok(())
    }

    /// Set the scale by hand (PyTorch's `update(new_scale)`), starting a new iteration.
    pub fn update_to(&mut self, new_scale: f64) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        self.check_scale("update")?;
        self.scale = Some(new_scale as f32);
        self.per_optimizer.clear();
        Ok(())
    }

    /// The current scale (the initial one before the first `scale()`; 1.0 when disabled).
    pub fn get_scale(&self) -> f64 {
        if !self.enabled {
            return 1.0;
        }
        self.scale.map(|s| s as f64).unwrap_or(self.init_scale)
    }

    /// Consecutive clean steps since the last growth or backoff.
    pub fn growth_tracker(&self) -> i64 {
        if !self.enabled {
            return 0;
        }
        self.growth_tracker.map(|t| t as i64).unwrap_or(self.init_growth_tracker)
    }

    pub fn growth_factor(&self) -> f64 {
        self.growth_factor
    }
    pub fn set_growth_factor(&mut self, f: f64) {
        self.growth_factor = f;
    }
    pub fn backoff_factor(&self) -> f64 {
        self.backoff_factor
    }
    pub fn set_backoff_factor(&mut self, f: f64) {
        self.backoff_factor = f;
    }
    pub fn growth_interval(&self) -> i64 {
        self.growth_interval
    }
    pub fn set_growth_interval(&mut self, n: i64) {
        self.growth_interval = n;
    }

    /// Where `opt` is in the current iteration.
    pub fn stage(&self, opt: &dyn Optimizer) -> OptState {
        self.per_optimizer.get(&opt.id()).map(|s| s.stage).unwrap_or(OptState::Ready)
    }

    /// Whether the last unscale of `opt` found an inf/NaN gradient (`None` before any check).
    pub fn found_inf(&self, opt: &dyn Optimizer) -> Option<bool> {
        let s = self.per_optimizer.get(&opt.id())?;
        if s.found_inf_per_device.is_empty() {
            return None;
        }
        Some(s.found_inf_per_device.iter().any(|(_, f)| *f))
    }

    /// Replace the inf/NaN verdict of `opt`'s unscale with `found` (what PyTorch's
    /// `ShardedGradScaler` does after all-reducing `found_inf`): when each process holds only a
    /// shard of the gradients, an inf in another process's shard must skip the step here too.
    /// Call it between [`unscale_`](Self::unscale_) and [`step`](Self::step); an error at any
    /// other stage. Does nothing when disabled.
    pub fn set_found_inf(&mut self, opt: &dyn Optimizer, found: bool) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let Some(st) = self.per_optimizer.get_mut(&opt.id()).filter(|s| s.stage == OptState::Unscaled) else {
            return Err(OptimError::GradScaler(
                "set_found_inf() needs unscale_() first, and must come before step() and update().".into(),
            ));
        };
        if st.found_inf_per_device.is_empty() {
            // No gradient on this process (an empty shard): the verdict is still recorded.
            st.found_inf_per_device.push((Device::Cpu, found));
        }
        st.found_inf_per_device.iter_mut().for_each(|(_, f)| *f = found);
        Ok(())
    }

    /// Checkpoint state (`None` when disabled, PyTorch's empty dict). Take it after `update()`.
    pub fn state_dict(&self) -> Option<GradScalerState> {
        self.enabled.then(|| GradScalerState {
            scale: self.get_scale(),
            growth_factor: self.growth_factor,
            backoff_factor: self.backoff_factor,
            growth_interval: self.growth_interval,
            growth_tracker: self.growth_tracker(),
        })
    }

    /// Restore a checkpoint state (ignored when disabled; `None` from a disabled scaler is an error).
    pub fn load_state_dict(&mut self, state: Option<&GradScalerState>) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let Some(s) = state else {
            return Err(OptimError::GradScaler(
                "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler."
                    .into(),
            ));
        };
        self.init_scale = s.scale;
        if self.scale.is_some() {
            self.scale = Some(s.scale as f32);
        }
        self.growth_factor = s.growth_factor;
        self.backoff_factor = s.backoff_factor;
        self.growth_interval = s.growth_interval;
        self.init_growth_tracker = s.growth_tracker;
        if self.growth_tracker.is_some() {
            self.growth_tracker = Some(s.growth_tracker as i32);
        }
        Ok(())
    }
}

/// `_amp_update_scale_` (CPU): backoff on inf/NaN; grow after `growth_interval` clean steps
/// unless the grown scale would be infinite. Factors are doubles, the scale a float.
fn update_scale(scale: f32, tracker: i32, found_inf: bool, growth: f64, backoff: f64, interval: i64) -> (f32, i32) {
    if found_inf {
        return ((scale as f64 * backoff) as f32, 0);
    }
    let successful = tracker.wrapping_add(1);
    if successful as i64 == interval {
        let grown = (scale as f64 * growth) as f32;
        (if grown.is_finite() { grown } else { scale }, 0)
    } else {
        (scale, successful)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Sgd, SgdConfig};

    fn setup() -> (Tensor, Sgd, GradScaler) {
        let w = Tensor::from_vec(vec![1.0f32, 2.0], &[2], &Device::Cpu).unwrap().requires_grad_(true).unwrap();
        let opt = Sgd::new(vec![w.clone()], SgdConfig::new(0.5)).unwrap();
        let cfg = GradScalerConfig { init_scale: 1024.0, ..Default::default() };
        (w, opt, GradScaler::new(cfg).unwrap())
    }

    #[test]
    fn update_scale_rules() {
        assert_eq!(update_scale(8.0, 3, true, 2.0, 0.5, 4), (4.0, 0));
        assert_eq!(update_scale(8.0, 2, false, 2.0, 0.5, 4), (8.0, 3));
        assert_eq!(update_scale(8.0, 3, false, 2.0, 0.5, 4), (16.0, 0));
        // Growth that would overflow keeps the scale (and resets the tracker).
        assert_eq!(update_scale(f32::MAX, 3, false, 2.0, 0.5, 4), (f32::MAX, 0));
    }

    #[test]
    fn a_verdict_from_elsewhere_skips_the_step_and_backs_off() {
        let (w, mut opt, mut sc) = setup();
        assert!(sc.set_found_inf(&opt, true).is_err(), "before unscale_ there is no verdict to replace");
        sc.scale(&w.square().unwrap().sum().unwrap()).unwrap().backward().unwrap();
        sc.unscale_(&mut opt).unwrap();
        assert_eq!(sc.found_inf(&opt), Some(false));
        // Another process saw an inf in its shard: this one skips too.
        sc.set_found_inf(&opt, true).unwrap();
        assert!(!sc.step(&mut opt).unwrap());
        assert_eq!(w.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
        assert!(sc.set_found_inf(&opt, false).is_err(), "after step() it is too late");
        sc.update().unwrap();
        assert_eq!(sc.get_scale(), 512.0);
    }

    #[test]
    fn unscale_divides_and_step_updates() {
        let (w, mut opt, mut sc) = setup();
        sc.scale(&w.square().unwrap().sum().unwrap()).unwrap().backward().unwrap();
        assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), vec![2048.0, 4096.0]);
        sc.unscale_(&mut opt).unwrap();
        assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
        assert_eq!(sc.stage(&opt), OptState::Unscaled);
        assert!(sc.step(&mut opt).unwrap());
        assert_eq!(w.to_vec::<f32>().unwrap(), vec![0.0, 0.0]);
        sc.update().unwrap();
        assert_eq!(sc.stage(&opt), OptState::Ready);
        assert_eq!(sc.growth_tracker(), 1);
    }

    #[test]
    fn inf_gradient_skips_the_step_and_backs_off() {
        let (w, mut opt, mut sc) = setup();
        sc.scale(&w.sum().unwrap()).unwrap();
        w.set_grad(Some(Tensor::from_vec(vec![f32::INFINITY, 1.0], &[2], &Device::Cpu).unwrap())).unwrap();
        assert!(!sc.step(&mut opt).unwrap());
        assert_eq!(w.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
        assert_eq!(sc.found_inf(&opt), Some(true));
        sc.update().unwrap();
        assert_eq!(sc.get_scale(), 512.0);
    }

    #[test]
    fn state_machine_errors_have_pytorch_texts() {
        let (w, mut opt, mut sc) = setup();
        let e = sc.unscale_(&mut opt).unwrap_err().to_string();
        assert_eq!(e, format!("Attempted unscale_ but _scale is None.  {FIX}"));
        assert!(sc.update().unwrap_err().to_string().starts_with("Attempted update but _scale is None."));
        sc.scale(&w.sum().unwrap()).unwrap().backward().unwrap();
        assert_eq!(sc.update().unwrap_err().to_string(), "No inf checks were recorded prior to update.");
        sc.unscale_(&mut opt).unwrap();
        assert_eq!(
            sc.unscale_(&mut opt).unwrap_err().to_string(),
            "unscale_() has already been called on this optimizer since the last update()."
        );
        sc.step(&mut opt).unwrap();
        assert_eq!(
            sc.step(&mut opt).unwrap_err().to_string(),
            "step() has already been called since the last update()."
        );
        assert_eq!(sc.unscale_(&mut opt).unwrap_err().to_string(), "unscale_() is being called after step().");
        sc.update().unwrap();
        // No gradients at all: nothing was checked.
        opt.zero_grad().unwrap();
        assert_eq!(sc.step(&mut opt).unwrap_err().to_string(), "No inf checks were recorded for this optimizer.");
    }

    #[test]
    fn fp16_gradients_are_refused() {
        let w =
            Tensor::from_vec(vec![half::f16::from_f32(1.0)], &[1], &Device::Cpu).unwrap().requires_grad_(true).unwrap();
        let mut opt = Sgd::new(vec![w.clone()], SgdConfig::new(0.1)).unwrap();
        let mut sc = GradScaler::new(GradScalerConfig::default()).unwrap();
        sc.scale(&Tensor::scalar(1.0f32, &Device::Cpu).unwrap()).unwrap();
        w.set_grad(Some(Tensor::from_vec(vec![half::f16::from_f32(1.0)], &[1], &Device::Cpu).unwrap())).unwrap();
        assert_eq!(sc.unscale_(&mut opt).unwrap_err().to_string(), "Attempting to unscale FP16 gradients.");
    }

    #[test]
    fn disabled_is_a_pass_through_and_config_is_checked() {
        let (w, mut opt, _) = setup();
        let mut sc = GradScaler::new(GradScalerConfig { enabled: false, ..Default::default() }).unwrap();
        let l = w.sum().unwrap();
        let s = sc.scale(&l).unwrap();
        assert_eq!(s.item().unwrap(), 3.0);
        s.backward().unwrap();
        assert!(sc.step(&mut opt).unwrap());
        sc.update().unwrap();
        assert_eq!(sc.get_scale(), 1.0);
        assert!(sc.state_dict().is_none());
        assert!(
            GradScaler::new(GradScalerConfig { growth_factor: 1.0, ..Default::default() })
                .unwrap_err()
                .to_string()
                .contains("growth factor")
        );
        assert!(
            GradScaler::new(GradScalerConfig { backoff_factor: 1.0, ..Default::default() })
                .unwrap_err()
                .to_string()
                .contains("backoff factor")
        );
    }

    #[test]
    fn state_dict_round_trip() {
        let (w, mut opt, mut sc) = setup();
        for _ in 0..3 {
            sc.scale(&w.sum().unwrap()).unwrap().backward().unwrap();
            sc.step(&mut opt).unwrap();
            sc.update().unwrap();
            opt.zero_grad().unwrap();
        }
        let s = sc.state_dict().unwrap();
        assert_eq!(s.growth_tracker, 3);
        let mut fresh = GradScaler::new(GradScalerConfig::default()).unwrap();
        fresh.load_state_dict(Some(&s)).unwrap();
        assert_eq!(fresh.state_dict().unwrap(), s);
        assert!(fresh.load_state_dict(None).unwrap_err().to_string().contains("empty"));
    }
}
