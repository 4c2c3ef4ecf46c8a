//! Adagrad — the update of PyTorch's `torch.optim.Adagrad` (single-tensor path, dense
//! gradients), op for op, fused into one pass per parameter:
//!
//! ```text
//! step += 1
//! g = maximize ? -grad : grad
//! if weight_decay != 0:  g = g + weight_decay * param
//! clr = lr / (1 + (step - 1) * lr_decay)
//! sum = sum + g * g
//! param = param - clr * g / (sqrt(sum) + eps)
//! ```
//! `sum` starts at `initial_accumulator_value`. PyTorch creates the state when the optimizer is
//! built; ferrite creates it at a parameter's first step (the values are the same, and a
//! parameter that never receives a gradient costs no memory).

use ferrite_tensor::Tensor;
use ferrite_tensor::backend::FusedKernel;

use crate::config_setters::config_setters;
use crate::error::{Result, non_negative};
use crate::optimizer::{GroupConfig, Optim, ParamState, UpdateRule};
use crate::state_dict::{
    GroupState, HyperValue, StateValue, entry, load_hyper_bool, load_hyper_f64, load_tensor, state_entries, step_count,
};
use crate::update_target::{grad_like, with_contiguous};

/// Adagrad hyperparameters of one parameter group (PyTorch's defaults: lr 0.01, no decay,
/// accumulator 0, eps 1e-10).
#[derive(Debug, Clone, PartialEq)]
pub struct AdagradConfig {
    pub lr: f64,
    /// The step size decays as `lr / (1 + (step - 1) * lr_decay)`.
    pub lr_decay: f64,
    pub weight_decay: f64,
    /// Starting value of the sum of squared gradients.
    pub initial_accumulator_value: f64,
    pub eps: f64,
    pub maximize: bool,
}

impl Default for AdagradConfig {
    fn default() -> Self {
        AdagradConfig {
            lr: 1e-2,
            lr_decay: 0.0,
            weight_decay: 0.0,
            initial_accumulator_value: 0.0,
            eps: 1e-10,
            maximize: false,
        }
    }
}

impl AdagradConfig {
    /// Defaults with learning rate `lr`.
    pub fn new(lr: f64) -> Self {
        AdagradConfig { lr, ..Default::default() }
    }
}

config_setters!(AdagradConfig {
    lr_decay: f64,
    weight_decay: f64,
    initial_accumulator_value: f64,
    eps: f64,
    maximize: bool,
});

impl GroupConfig for AdagradConfig {
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn validate(&self) -> Result<()> {
        non_negative(&[
            ("learning rate", self.lr),
            ("lr_decay value", self.lr_decay),
            ("weight_decay value", self.weight_decay),
            ("initial_accumulator_value value", self.initial_accumulator_value),
            ("epsilon value", self.eps),
        ])
    }
    fn to_hyper(&self) -> Vec<(String, HyperValue)> {
        vec![
            ("lr".into(), HyperValue::Float(self.lr)),
            ("lr_decay".into(), HyperValue::Float(self.lr_decay)),
            ("eps".into(), HyperValue::Float(self.eps)),
            ("weight_decay".into(), HyperValue::Float(self.weight_decay)),
            ("initial_accumulator_value".into(), HyperValue::Float(self.initial_accumulator_value)),
            ("foreach".into(), HyperValue::None),
            ("maximize".into(), HyperValue::Bool(self.maximize)),
            ("differentiable".into(), HyperValue::Bool(false)),
            ("fused".into(), HyperValue::None),
        ]
    }
    fn load_hyper(&mut self, g: &GroupState, group: usize) -> Result<()> {
        load_hyper_f64(g, "lr", group, &mut self.lr)?;
        load_hyper_f64(g, "lr_decay", group, &mut self.lr_decay)?;
        load_hyper_f64(g, "eps", group, &mut self.eps)?;
        load_hyper_f64(g, "weight_decay", group, &mut self.weight_decay)?;
        load_hyper_f64(g, "initial_accumulator_value", group, &mut self.initial_accumulator_value)?;
        load_hyper_bool(g, "maximize", group, &mut self.maximize)
    }
}

/// Per-parameter Adagrad state (PyTorch's keys).
#[derive(Debug, Clone)]
pub struct AdagradState {
    /// Steps taken, kept as float32 like PyTorch's `step` tensor.
    pub step: f32,
    /// Sum of squared gradients.
    pub sum: Tensor,
}

impl ParamState for AdagradState {
    fn to_entries(&self) -> Result<Vec<(String, StateValue)>> {
        state_entries(Some(self.step), &[("sum", Some(&self.sum))])
    }
    fn from_entries(entries: &[(String, StateValue)], index: usize, param: &Tensor) -> Result<Self> {
        Ok(AdagradState {
            step: step_count(entry(entries, "step", index)?, index)?,
            sum: load_tensor(entries, "sum", index, param)?,
        })
    }
}

/// The Adagrad update rule.
pub struct AdagradRule;

/// Adagrad (PyTorch's `torch.optim.Adagrad`, dense gradients).
///
/// ```
/// use ferrite_optim::{Adagrad, AdagradConfig, Optimizer};
/// use ferrite_tensor::{Device, Tensor};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let w = Tensor::from_vec(vec![1.0f32, -2.0], &[2], &Device::Cpu)?.requires_grad_(true)?;
/// let mut opt = Adagrad::new(vec![w.clone()], AdagradConfig::new(0.1))?;
/// w.mul(&w)?.sum()?.backward()?;
/// opt.step()?; // the first step moves each weight by lr against its gradient's sign
/// opt.zero_grad()?;
/// let v = w.to_vec::<f32>()?;
/// assert!((v[0] - 0.9).abs() < 1e-6 && (v[1] + 1.9).abs() < 1e-6);
/// # Ok(()) }
/// ```
pub type Adagrad = Optim<AdagradRule>;

impl UpdateRule for AdagradRule {
    type Config = AdagradConfig;
    type State = AdagradState;
    const NAME: &'static str = "Adagrad";

    fn update(c: &AdagradConfig, param: &Tensor, grad: &Tensor, state: &mut Option<AdagradState>) -> Result<()> {
        let grad = grad_like(grad, param)?;
        if state.is_none() {
            let sum = Tensor::full(param.shape(), c.initial_accumulator_value, param.dtype(), param.device())?;
            *state = Some(AdagradState { step: 0.0, sum });
        }
        let Some(st) = state.as_mut() else { unreachable!("state was created above") };
        st.step += 1.0;
        let step = st.step as f64;
        let kernel = FusedKernel::Adagrad {
            clr: c.lr / (1.0 + (step - 1.0) * c.lr_decay),
            eps: c.eps,
            weight_decay: c.weight_decay,
            maximize: c.maximize,
        };
        with_contiguous(param, |p| {
            Tensor::fused(&kernel, &[p, &st.sum], &[&grad])?;
            Ok(())
        })
    }
}
