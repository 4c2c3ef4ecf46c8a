//! Adam and AdamW — the update of PyTorch's `torch.optim.Adam` / `AdamW` (single-tensor path,
//! the CPU default), op for op, fused into one pass per parameter:
//!
//! ```text
//! step += 1
//! g = maximize ? -grad : grad
//! if weight_decay != 0:
//!     AdamW (decoupled):  param = param * (1 - lr * weight_decay)
//!     Adam (L2):          g = g + weight_decay * param
//! exp_avg    = lerp(exp_avg, g, 1 - beta1)
//! exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * g * g
//! v          = amsgrad ? (max_exp_avg_sq = max(max_exp_avg_sq, exp_avg_sq)) : exp_avg_sq
//! denom      = sqrt(v) / sqrt(1 - beta2^step) + eps
//! param      = param - (lr / (1 - beta1^step)) * exp_avg / denom
//! ```
//! Scalars are computed in f64 like Python's floats and rounded once to the compute type.
//! AdamW is Adam with `decoupled_weight_decay` (as in PyTorch, where `AdamW` subclasses `Adam`).

use ferrite_tensor::Tensor;
use ferrite_tensor::backend::FusedKernel;

use crate::config_setters::config_setters;
use crate::error::{OptimError, Result, bad_hyper, non_negative};
use crate::optimizer::{GroupConfig, Optim, ParamState, UpdateRule};
use crate::state_dict::{
    GroupState, HyperValue, StateValue, entry, load_hyper_bool, load_hyper_f64, load_optional_tensor, load_tensor,
    state_entries, step_count,
};
use crate::update_target::{grad_like, with_contiguous};

/// Adam/AdamW hyperparameters of one parameter group.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamConfig {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    pub amsgrad: bool,
    pub maximize: bool,
    /// AdamW: decay the parameters directly instead of adding an L2 term to the gradient.
    pub decoupled_weight_decay: bool,
}

impl Default for AdamConfig {
    /// `torch.optim.Adam`'s defaults.
    fn default() -> Self {
        AdamConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            amsgrad: false,
            maximize: false,
            decoupled_weight_decay: false,
        }
    }
}

impl AdamConfig {
    /// Adam's defaults with learning rate `lr`.
    pub fn adam(lr: f64) -> Self {
        AdamConfig { lr, ..Default::default() }
    }
    /// `torch.optim.AdamW`'s defaults (weight decay 0.01, decoupled) with learning rate `lr`.
    pub fn adamw(lr: f64) -> Self {
        AdamConfig { lr, weight_decay: 1e-2, decoupled_weight_decay: true, ..Default::default() }
    }
    pub fn betas(mut self, beta1: f64, beta2: f64) -> Self {
        self.betas = (beta1, beta2);
        self
    }
}

config_setters!(AdamConfig { eps: f64, weight_decay: f64, amsgrad: bool, maximize: bool });

impl GroupConfig for AdamConfig {
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn momentum(&self) -> Option<f64> {
        Some(self.betas.0)
    }
    fn set_momentum(&mut self, beta1: f64) -> bool {
        self.betas.0 = beta1;
        true
    }
    fn validate(&self) -> Result<()> {
        non_negative(&[("learning rate", self.lr), ("epsilon value", self.eps)])?;
        if !(0.0..1.0).contains(&self.betas.0) {
            return Err(bad_hyper("beta parameter at index 0", self.betas.0, "0 <= beta < 1"));
        }
        if !(0.0..1.0).contains(&self.betas.1) {
            return Err(bad_hyper("beta parameter at index 1", self.betas.1, "0 <= beta < 1"));
        }
        non_negative(&[("weight_decay value", self.weight_decay)])
    }
    fn to_hyper(&self) -> Vec<(String, HyperValue)> {
        vec![
            ("lr".into(), HyperValue::Float(self.lr)),
            ("betas".into(), HyperValue::Floats(vec![self.betas.0, self.betas.1])),
            ("eps".into(), HyperValue::Float(self.eps)),
            ("weight_decay".into(), HyperValue::Float(self.weight_decay)),
            ("amsgrad".into(), HyperValue::Bool(self.amsgrad)),
            ("maximize".into(), HyperValue::Bool(self.maximize)),
            ("foreach".into(), HyperValue::None),
            ("capturable".into(), HyperValue::Bool(false)),
            ("differentiable".into(), HyperValue::Bool(false)),
            ("fused".into(), HyperValue::None),
            ("decoupled_weight_decay".into(), HyperValue::Bool(self.decoupled_weight_decay)),
        ]
    }
    fn load_hyper(&mut self, g: &GroupState, group: usize) -> Result<()> {
        load_hyper_f64(g, "lr", group, &mut self.lr)?;
        match g.get("betas") {
            None => {}
            Some(HyperValue::Floats(b)) if b.len() == 2 => self.betas = (b[0], b[1]),
            Some(other) => {
                return Err(OptimError::StateDict(format!(
                    "`betas` of parameter group {group} must be two floats, found {other:?}"
                )));
            }
        }
        load_hyper_f64(g, "eps", group, &mut self.eps)?;
        load_hyper_f64(g, "weight_decay", group, &mut self.weight_decay)?;
        load_hyper_bool(g, "amsgrad", group, &mut self.amsgrad)?;
        load_hyper_bool(g, "maximize", group, &mut self.maximize)?;
        load_hyper_bool(g, "decoupled_weight_decay", group, &mut self.decoupled_weight_decay)
    }
}

/// Per-parameter Adam state (PyTorch's keys).
#[derive(Debug, Clone)]
pub struct AdamState {
    /// Steps taken, kept as float32 like PyTorch's `step` tensor.
    pub step: f32,
    pub exp_avg: Tensor,
    pub exp_avg_sq: Tensor,
    pub max_exp_avg_sq: Option<Tensor>,
}

impl ParamState for AdamState {
    fn to_entries(&self) -> Result<Vec<(String, StateValue)>> {
        state_entries(
            Some(self.step),
            &[
                ("exp_avg", Some(&self.exp_avg)),
                ("exp_avg_sq", Some(&self.exp_avg_sq)),
                ("max_exp_avg_sq", self.max_exp_avg_sq.as_ref()),
            ],
        )
    }
    fn from_entries(entries: &[(String, StateValue)], index: usize, param: &Tensor) -> Result<Self> {
        Ok(AdamState {
            step: step_count(entry(entries, "step", index)?, index)?,
            exp_avg: load_tensor(entries, "exp_avg", index, param)?,
            exp_avg_sq: load_tensor(entries, "exp_avg_sq", index, param)?,
            max_exp_avg_sq: load_optional_tensor(entries, "max_exp_avg_sq", index, param)?,
        })
    }
}

/// The Adam/AdamW update rule.
pub struct AdamRule;

/// Adam, and AdamW with [`AdamConfig::adamw`] (PyTorch's `torch.optim.Adam` / `AdamW`).
///
/// ```
/// use ferrite_optim::{Adam, AdamConfig, Optimizer};
/// use ferrite_tensor::{Device, Tensor};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let w = Tensor::from_vec(vec![1.0f32, -1.0], &[2], &Device::Cpu)?.requires_grad_(true)?;
/// let mut opt = Adam::new(vec![w.clone()], AdamConfig::adamw(0.1))?;
/// w.mul(&w)?.sum()?.backward()?;
/// opt.step()?; // the first Adam step moves each weight by about lr against its gradient's sign
/// opt.zero_grad()?;
/// let v = w.to_vec::<f32>()?;
/// assert!((v[0] - 0.899).abs() < 1e-5 && (v[1] + 0.899).abs() < 1e-5);
/// # Ok(()) }
/// ```
pub type Adam = Optim<AdamRule>;

impl UpdateRule for AdamRule {
    type Config = AdamConfig;
    type State = AdamState;
    const NAME: &'static str = "Adam";

    fn update(c: &AdamConfig, param: &Tensor, grad: &Tensor, state: &mut Option<AdamState>) -> Result<()> {
        let grad = grad_like(grad, param)?;
        if state.is_none() {
            let z = || Tensor::zeros(param.shape(), param.dtype(), param.device());
            *state = Some(AdamState { step: 0.0, exp_avg: z()?, exp_avg_sq: z()?, max_exp_avg_sq: None });
        }
        let Some(st) = state.as_mut() else { unreachable!("state was created above") };
        if c.amsgrad && st.max_exp_avg_sq.is_none() {
            st.max_exp_avg_sq = Some(Tensor::zeros(param.shape(), param.dtype(), param.device())?);
        }
        st.step += 1.0;
        let step = st.step as f64;
        let (beta1, beta2) = c.betas;
        let bias_correction1 = 1.0 - beta1.powf(step);
        let bias_correction2 = 1.0 - beta2.powf(step);
        let step_size = c.lr / bias_correction1;
        let bias_correction2_sqrt = bias_correction2.powf(0.5);
        let decay = c.weight_decay != 0.0;
        let kernel = FusedKernel::Adam {
            l2: (decay && !c.decoupled_weight_decay).then_some(c.weight_decay),
            decay: (decay && c.decoupled_weight_decay).then_some(1.0 - c.lr * c.weight_decay),
            beta1,
            beta2,
            eps: c.eps,
            bias_correction2_sqrt,
            step_size,
            maximize: c.maximize,
            amsgrad: st.max_exp_avg_sq.is_some(),
        };
        with_contiguous(param, |p| {
            match &st.max_exp_avg_sq {
                None => Tensor::fused(&kernel, &[p, &st.exp_avg, &st.exp_avg_sq], &[&grad])?,
                Some(vmax) => Tensor::fused(&kernel, &[p, &st.exp_avg, &st.exp_avg_sq, vmax], &[&grad])?,
            };
            Ok(())
        })
    }
}
