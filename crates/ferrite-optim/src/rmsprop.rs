//! RMSprop — the update of PyTorch's `torch.optim.RMSprop` (single-tensor path, the CPU
//! default), op for op, fused into one pass per parameter:
//!
//! ```text
//! step += 1
//! g = maximize ? -grad : grad
//! if weight_decay != 0:  g = g + weight_decay * param
//! square_avg = square_avg * alpha + (1 - alpha) * g * g
//! if centered:
//!     grad_avg = lerp(grad_avg, g, 1 - alpha)
//!     avg = sqrt(square_avg - grad_avg * grad_avg) + eps
//! else:
//!     avg = sqrt(square_avg) + eps
//! if momentum > 0:
//!     buf = buf * momentum + g / avg
//!     param = param - lr * buf
//! else:
//!     param = param - lr * g / avg
//! ```
//! The state buffers start at zero, as PyTorch's `zeros_like`; `momentum_buffer` exists only
//! with momentum, `grad_avg` only when centered (both are created when a later change of the
//! group's settings first needs them, e.g. a OneCycleLR that cycles the momentum).

use ferrite_tensor::Tensor;
use ferrite_tensor::backend::FusedKernel;

use crate::config_setters::config_setters;
use crate::error::{Result, bad_hyper, non_negative};
use crate::optimizer::{GroupConfig, Optim, ParamState, UpdateRule};
use crate::state_dict::{
    GroupState, HyperValue, StateValue, entry, load_hyper_bool, load_hyper_f64, load_optional_tensor, load_tensor,
    state_entries, step_count,
};
use crate::update_target::{grad_like, with_contiguous};

/// RMSprop hyperparameters of one parameter group (PyTorch's defaults: lr 0.01, alpha 0.99,
/// eps 1e-8, no weight decay, no momentum, not centered).
#[derive(Debug, Clone, PartialEq)]
pub struct RmspropConfig {
    pub lr: f64,
    /// Smoothing constant of the running averages, in `[0, 1]`.
    pub alpha: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub momentum: f64,
    /// Normalise by the variance of the gradient (running mean of squares minus square of the
    /// running mean) instead of the uncentered second moment.
    pub centered: bool,
    pub maximize: bool,
}

impl Default for RmspropConfig {
    fn default() -> Self {
        RmspropConfig {
            lr: 1e-2,
            alpha: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            momentum: 0.0,
            centered: false,
            maximize: false,
        }
    }
}

impl RmspropConfig {
    /// Defaults with learning rate `lr`.
    pub fn new(lr: f64) -> Self {
        RmspropConfig { lr, ..Default::default() }
    }
}

config_setters!(RmspropConfig {
    alpha: f64,
    eps: f64,
    weight_decay: f64,
    momentum: f64,
    centered: bool,
    maximize: bool,
});

impl GroupConfig for RmspropConfig {
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn momentum(&self) -> Option<f64> {
        Some(self.momentum)
    }
    fn set_momentum(&mut self, momentum: f64) -> bool {
        self.momentum = momentum;
        true
    }
    fn validate(&self) -> Result<()> {
        non_negative(&[
            ("learning rate", self.lr),
            ("epsilon value", self.eps),
            ("momentum value", self.momentum),
            ("weight_decay value", self.weight_decay),
        ])?;
        // PyTorch checks only alpha >= 0; above 1 the running average of squares turns negative
        // and every step is NaN, so ferrite refuses it too.
        if !(0.0..=1.0).contains(&self.alpha) {
            return Err(bad_hyper("alpha value", self.alpha, "0 <= alpha <= 1"));
        }
        Ok(())
    }
    fn to_hyper(&self) -> Vec<(String, HyperValue)> {
        vec![
            ("lr".into(), HyperValue::Float(self.lr)),
            ("momentum".into(), HyperValue::Float(self.momentum)),
            ("alpha".into(), HyperValue::Float(self.alpha)),
            ("eps".into(), HyperValue::Float(self.eps)),
            ("centered".into(), HyperValue::Bool(self.centered)),
            ("weight_decay".into(), HyperValue::Float(self.weight_decay)),
            ("capturable".into(), HyperValue::Bool(false)),
            ("foreach".into(), HyperValue::None),
            ("maximize".into(), HyperValue::Bool(self.maximize)),
            ("differentiable".into(), HyperValue::Bool(false)),
        ]
    }
    fn load_hyper(&mut self, g: &GroupState, group: usize) -> Result<()> {
        load_hyper_f64(g, "lr", group, &mut self.lr)?;
        load_hyper_f64(g, "momentum", group, &mut self.momentum)?;
        load_hyper_f64(g, "alpha", group, &mut self.alpha)?;
        load_hyper_f64(g, "eps", group, &mut self.eps)?;
        load_hyper_bool(g, "centered", group, &mut self.centered)?;
        load_hyper_f64(g, "weight_decay", group, &mut self.weight_decay)?;
        load_hyper_bool(g, "maximize", group, &mut self.maximize)
    }
}

/// Per-parameter RMSprop state (PyTorch's keys).
#[derive(Debug, Clone)]
pub struct RmspropState {
    /// Steps taken, kept as float32 like PyTorch's `step` tensor.
    pub step: f32,
    pub square_avg: Tensor,
    /// Present once a step ran with momentum > 0.
    pub momentum_buffer: Option<Tensor>,
    /// Present once a step ran centered.
    pub grad_avg: Option<Tensor>,
}

impl ParamState for RmspropState {
    fn to_entries(&self) -> Result<Vec<(String, StateValue)>> {
        state_entries(
            Some(self.step),
            &[
                ("square_avg", Some(&self.square_avg)),
                ("momentum_buffer", self.momentum_buffer.as_ref()),
                ("grad_avg", self.grad_avg.as_ref()),
            ],
        )
    }
    fn from_entries(entries: &[(String, StateValue)], index: usize, param: &Tensor) -> Result<Self> {
        let step = step_count(entry(entries, "step", index)?, index)?;
        Ok(RmspropState {
            step,
            square_avg: load_tensor(entries, "square_avg", index, param)?,
            momentum_buffer: load_optional_tensor(entries, "momentum_buffer", index, param)?,
            grad_avg: load_optional_tensor(entries, "grad_avg", index, param)?,
        })
    }
}

/// The RMSprop update rule.
pub struct RmspropRule;

/// RMSprop (PyTorch's `torch.optim.RMSprop`), with momentum and the centered variant.
///
/// ```
/// use ferrite_optim::{Optimizer, Rmsprop, RmspropConfig};
/// use ferrite_tensor::{Device, Tensor};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let w = Tensor::from_vec(vec![1.0f32, -2.0], &[2], &Device::Cpu)?.requires_grad_(true)?;
/// let mut opt = Rmsprop::new(vec![w.clone()], RmspropConfig::new(0.01).momentum(0.9).centered(true))?;
/// w.mul(&w)?.sum()?.backward()?;
/// opt.step()?;
/// opt.zero_grad()?;
/// // The first step divides the gradient by sqrt((1-alpha) g² - (1-alpha)² g²): about lr/0.0995 per weight.
/// let v = w.to_vec::<f32>()?;
/// assert!((v[0] - 0.8995).abs() < 1e-3 && (v[1] + 1.8995).abs() < 1e-3);
/// # Ok(()) }
/// ```
pub type Rmsprop = Optim<RmspropRule>;

impl UpdateRule for RmspropRule {
    type Config = RmspropConfig;
    type State = RmspropState;
    const NAME: &'static str = "RMSprop";

    fn update(c: &RmspropConfig, param: &Tensor, grad: &Tensor, state: &mut Option<RmspropState>) -> Result<()> {
        let grad = grad_like(grad, param)?;
        let zeros = || Tensor::zeros(param.shape(), param.dtype(), param.device());
        if state.is_none() {
            *state = Some(RmspropState { step: 0.0, square_avg: zeros()?, momentum_buffer: None, grad_avg: None });
        }
        let Some(st) = state.as_mut() else { unreachable!("state was created above") };
        if c.momentum > 0.0 && st.momentum_buffer.is_none() {
            st.momentum_buffer = Some(zeros()?);
        }
        if c.centered && st.grad_avg.is_none() {
            st.grad_avg = Some(zeros()?);
        }
        st.step += 1.0;
        let kernel = FusedKernel::Rmsprop {
            lr: c.lr,
            alpha: c.alpha,
            eps: c.eps,
            weight_decay: c.weight_decay,
            momentum: c.momentum,
            centered: c.centered,
            maximize: c.maximize,
        };
        with_contiguous(param, |p| {
            let mut outs: Vec<&Tensor> = vec![p, &st.square_avg];
            if c.momentum > 0.0 {
                outs.extend(st.momentum_buffer.as_ref());
            }
            if c.centered {
                outs.extend(st.grad_avg.as_ref());
            }
            Tensor::fused(&kernel, &outs, &[&grad])?;
            Ok(())
        })
    }
}
