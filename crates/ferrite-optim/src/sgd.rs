//! Stochastic gradient descent with momentum, dampening, Nesterov and weight decay — the update
//! of PyTorch's `torch.optim.SGD` (single-tensor path, the CPU default), op for op:
//!
//! ```text
//! g = maximize ? -grad : grad
//! if weight_decay != 0:  g = g + weight_decay * param
//! if momentum != 0:
//!     buf = first step ? g : momentum * buf + (1 - dampening) * g
//!     g = nesterov ? g + momentum * buf : buf
//! param = param - lr * g
//! ```

use ferrite_tensor::Tensor;
use ferrite_tensor::backend::FusedKernel;

use crate::config_setters::config_setters;
use crate::error::{OptimError, Result, bad_hyper, non_negative};
use crate::optimizer::{GroupConfig, Optim, ParamState, UpdateRule};
use crate::state_dict::{
    GroupState, HyperValue, StateValue, load_hyper_bool, load_hyper_f64, load_optional_tensor, state_entries,
};
use crate::update_target::{grad_like, with_contiguous};

/// SGD hyperparameters of one parameter group (PyTorch's defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct SgdConfig {
    pub lr: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
    pub maximize: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig { lr: 1e-3, momentum: 0.0, dampening: 0.0, weight_decay: 0.0, nesterov: false, maximize: false }
    }
}

impl SgdConfig {
    /// Defaults with learning rate `lr`.
    pub fn new(lr: f64) -> Self {
        SgdConfig { lr, ..Default::default() }
    }
}

config_setters!(SgdConfig { momentum: f64, dampening: f64, weight_decay: f64, nesterov: bool, maximize: bool });

impl GroupConfig for SgdConfig {
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
            ("momentum value", self.momentum),
            ("weight_decay value", self.weight_decay),
        ])?;
        if !self.dampening.is_finite() {
            return Err(bad_hyper("dampening value", self.dampening, "a finite number"));
        }
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(OptimError::InvalidConfig("Nesterov momentum requires a momentum and zero dampening".into()));
        }
        Ok(())
    }
    fn to_hyper(&self) -> Vec<(String, HyperValue)> {
        vec![
            ("lr".into(), HyperValue::Float(self.lr)),
            ("momentum".into(), HyperValue::Float(self.momentum)),
            ("dampening".into(), HyperValue::Float(self.dampening)),
            ("weight_decay".into(), HyperValue::Float(self.weight_decay)),
            ("nesterov".into(), HyperValue::Bool(self.nesterov)),
            ("maximize".into(), HyperValue::Bool(self.maximize)),
            ("foreach".into(), HyperValue::None),
            ("differentiable".into(), HyperValue::Bool(false)),
            ("fused".into(), HyperValue::None),
        ]
    }
    fn load_hyper(&mut self, g: &GroupState, group: usize) -> Result<()> {
        load_hyper_f64(g, "lr", group, &mut self.lr)?;
        load_hyper_f64(g, "momentum", group, &mut self.momentum)?;
        load_hyper_f64(g, "dampening", group, &mut self.dampening)?;
        load_hyper_f64(g, "weight_decay", group, &mut self.weight_decay)?;
        load_hyper_bool(g, "nesterov", group, &mut self.nesterov)?;
        load_hyper_bool(g, "maximize", group, &mut self.maximize)
    }
}

/// Per-parameter SGD state: the momentum buffer (only when momentum is used).
#[derive(Debug, Clone)]
pub struct SgdState {
    pub momentum_buffer: Option<Tensor>,
}

impl ParamState for SgdState {
    fn to_entries(&self) -> Result<Vec<(String, StateValue)>> {
        state_entries(None, &[("momentum_buffer", self.momentum_buffer.as_ref())])
    }
    fn from_entries(entries: &[(String, StateValue)], index: usize, param: &Tensor) -> Result<Self> {
        Ok(SgdState { momentum_buffer: load_optional_tensor(entries, "momentum_buffer", index, param)? })
    }
}

/// The SGD update rule.
pub struct SgdRule;

/// Stochastic gradient descent (PyTorch's `torch.optim.SGD`).
///
/// ```
/// use ferrite_optim::{Optimizer, Sgd, SgdConfig};
/// use ferrite_tensor::{Device, Tensor};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let w = Tensor::from_vec(vec![1.0f32, 2.0], &[2], &Device::Cpu)?.requires_grad_(true)?;
/// let mut opt = Sgd::new(vec![w.clone()], SgdConfig::new(0.1).momentum(0.9))?;
/// w.mul(&w)?.sum()?.backward()?; // grad = 2w
/// opt.step()?;
/// opt.zero_grad()?;
/// assert_eq!(w.to_vec::<f32>()?, vec![0.8, 1.6]);
/// # Ok(()) }
/// ```
pub type Sgd = Optim<SgdRule>;

impl UpdateRule for SgdRule {
    type Config = SgdConfig;
    type State = SgdState;
    const NAME: &'static str = "SGD";

    fn update(c: &SgdConfig, param: &Tensor, grad: &Tensor, state: &mut Option<SgdState>) -> Result<()> {
        let grad = grad_like(grad, param)?;
        let kernel = |first_step| FusedKernel::Sgd {
            lr: c.lr,
            momentum: c.momentum,
            dampening: c.dampening,
            nesterov: c.nesterov,
            weight_decay: c.weight_decay,
            maximize: c.maximize,
            first_step,
        };
        if c.momentum == 0.0 {
            return with_contiguous(param, |p| {
                Tensor::fused(&kernel(true), &[p], &[&grad])?;
                Ok(())
            });
        }
        let (buf, first) = match state.as_ref().and_then(|s| s.momentum_buffer.clone()) {
            Some(b) => (b, false),
            None => (Tensor::zeros(param.shape(), param.dtype(), param.device())?, true),
        };
        with_contiguous(param, |p| {
            Tensor::fused(&kernel(first), &[p, &buf], &[&grad])?;
            Ok(())
        })?;
        *state = Some(SgdState { momentum_buffer: Some(buf) });
        Ok(())
    }
}
