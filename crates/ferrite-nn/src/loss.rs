//! Loss modules: thin, configurable wrappers over `ferrite_tensor::functional`, computed in f32
//! under autocast. They take two inputs, so they are not `Module`s; call `forward(input, target)`.
//! Settings are checked when they are set (a negative `beta`, a `label_smoothing` above 1 are
//! errors at construction), so a loss that was built always runs.

use ferrite_tensor::Tensor;
use ferrite_tensor::functional::{self, CrossEntropyOptions};

pub use ferrite_tensor::functional::{KlDivReduction, Reduction};

use crate::error::{NnError, Result};

/// Cross-entropy between logits `[N, C]` (or `[N, C, d…]`) and class indices `[N]` (or
/// `[N, d…]`), PyTorch's `nn.CrossEntropyLoss`.
#[derive(Clone, Debug, Default)]
pub struct CrossEntropyLoss {
    pub options: CrossEntropyOptions,
}

impl CrossEntropyLoss {
    /// Mean reduction, no smoothing, ignore_index −100.
    pub fn new() -> CrossEntropyLoss {
        CrossEntropyLoss::default()
    }
    /// Targets equal to `index` contribute nothing and are not counted in the mean.
    pub fn ignore_index(mut self, index: i64) -> Self {
        self.options.ignore_index = index;
        self
    }
    /// Mix the one-hot target with a uniform distribution; `eps` in [0, 1].
    pub fn label_smoothing(mut self, eps: f64) -> Result<Self> {
        if !(0.0..=1.0).contains(&eps) {
            return Err(NnError::config(
                "CrossEntropyLoss",
                format!("label_smoothing must be between 0.0 and 1.0, got {eps}"),
            ));
        }
        self.options.label_smoothing = eps;
        Ok(self)
    }
    pub fn reduction(mut self, reduction: Reduction) -> Self {
        self.options.reduction = reduction;
        self
    }
    /// Per-class weights `[C]`.
    pub fn weight(mut self, weight: Tensor) -> Self {
        self.options.weight = Some(weight);
        self
    }
    pub fn forward(&self, logits: &Tensor, target: &Tensor) -> Result<Tensor> {
        Ok(functional::cross_entropy(logits, target, &self.options)?)
    }
}

/// Negative log-likelihood of log-probabilities (PyTorch's `nn.NLLLoss`). Label smoothing in
/// the options is not applied (PyTorch's NLLLoss has none).
#[derive(Clone, Debug, Default)]
pub struct NLLLoss {
    pub options: CrossEntropyOptions,
}

impl NLLLoss {
    pub fn new() -> NLLLoss {
        NLLLoss::default()
    }
    pub fn ignore_index(mut self, index: i64) -> Self {
        self.options.ignore_index = index;
        self
    }
    pub fn reduction(mut self, reduction: Reduction) -> Self {
        self.options.reduction = reduction;
        self
    }
    pub fn weight(mut self, weight: Tensor) -> Self {
        self.options.weight = Some(weight);
        self
    }
    pub fn forward(&self, log_probs: &Tensor, target: &Tensor) -> Result<Tensor> {
        let opts = CrossEntropyOptions { label_smoothing: 0.0, ..self.options.clone() };
        Ok(functional::nll_loss(log_probs, target, &opts)?)
    }
}

/// Mean squared error (PyTorch's `nn.MSELoss`).
#[derive(Clone, Copy, Debug, Default)]
pub struct MSELoss {
    pub reduction: Reduction,
}

impl MSELoss {
    pub fn new() -> MSELoss {
        MSELoss::default()
    }
    pub fn reduction(mut self, reduction: Reduction) -> Self {
        self.reduction = reduction;
        self
    }
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        Ok(functional::mse_loss_with(input, target, self.reduction)?)
    }
}

/// Binary cross-entropy on probabilities (PyTorch's `nn.BCELoss`): `-w (t ln x + (1 - t) ln(1 - x))`
/// with each log floored at -100. For raw scores use [`BCEWithLogitsLoss`], the stable form.
///
/// ```
/// use ferrite_nn::BCELoss;
/// use ferrite_tensor::{Device, Tensor};
/// # fn main() -> Result<(), ferrite_nn::NnError> {
/// let p = Tensor::from_vec(vec![0.8f32, 0.3], &[2], &Device::Cpu)?;
/// let y = Tensor::from_vec(vec![1.0f32, 0.0], &[2], &Device::Cpu)?;
/// let loss = BCELoss::new().forward(&p, &y)?.item()?;
/// assert!((loss - (-(0.8f64.ln()) - 0.7f64.ln()) / 2.0).abs() < 1e-6);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct BCELoss {
    pub reduction: Reduction,
    /// Rescaling of each element, broadcast to the input's shape.
    pub weight: Option<Tensor>,
}

impl BCELoss {
    /// Mean reduction, no weight.
    pub fn new() -> BCELoss {
        BCELoss::default()
    }
    pub fn reduction(mut self, reduction: Reduction) -> Self {
        self.reduction = reduction;
        self
    }
    /// Per-element weights (broadcast to the input's shape, e.g. `[C]` per class).
    pub fn weight(mut self, weight: Tensor) -> Self {
        self.weight = Some(weight);
        self
    }
    /// `probabilities` in [0, 1] and `target` of the same shape.
    pub fn forward(&self, probabilities: &Tensor, target: &Tensor) -> Result<Tensor> {
        Ok(functional::binary_cross_entropy(probabilities, target, self.weight.as_ref(), self.reduction)?)
    }
}

/// Sigmoid and binary cross-entropy in one numerically stable loss (PyTorch's
/// `nn.BCEWithLogitsLoss`), with `pos_weight` for imbalanced positives.
///
/// ```
/// use ferrite_nn::BCEWithLogitsLoss;
/// use ferrite_tensor::{Device, Tensor};
/// # fn main() -> Result<(), ferrite_nn::NnError> {
/// let logits = Tensor::from_vec(vec![1.5f32, -0.5, 0.2, 2.0], &[2, 2], &Device::Cpu)?;
/// let y = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], &[2, 2], &Device::Cpu)?;
/// // Class 1's positives are rare: count each three times.
/// let pos_weight = Tensor::from_vec(vec![1.0f32, 3.0], &[2], &Device::Cpu)?;
/// let loss = BCEWithLogitsLoss::new().pos_weight(pos_weight).forward(&logits, &y)?;
/// assert!(loss.item()? > 0.0);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct BCEWithLogitsLoss {
    pub reduction: Reduction,
    pub weight: Option<Tensor>,
    /// Weight of the positive term, broadcast to the input's shape (`[C]`: one per class).
    pub pos_weight: Option<Tensor>,
}

impl BCEWithLogitsLoss {
    /// Mean reduction, no weights.
    pub fn new() -> BCEWithLogitsLoss {
        BCEWithLogitsLoss::default()
    }
    pub fn reduction(mut self, reduction: Reduction) -> Self {
        self.reduction = reduction;
        self
    }
    pub fn weight(mut self, weight: Tensor) -> Self {
        self.weight = Some(weight);
        self
    }
    pub fn pos_weight(mut self, pos_weight: Tensor) -> Self {
        self.pos_weight = Some(pos_weight);
        self
    }
    pub fn forward(&self, logits: &Tensor, target: &Tensor) -> Result<Tensor> {
        Ok(functional::binary_cross_entropy_with_logits(
            logits,
            target,
            self.weight.as_ref(),
            self.pos_weight.as_ref(),
            self.reduction,
        )?)
    }
}

/// Smooth L1 loss (PyTorch's `nn.SmoothL1Loss`): quadratic below `beta`, linear above.
///
/// ```
/// use ferrite_nn::{Reduction, SmoothL1Loss};
/// use ferrite_tensor::{Device, Tensor};
/// # fn main() -> Result<(), ferrite_nn::NnError> {
/// let x = Tensor::from_vec(vec![0.25f32, 2.0], &[2], &Device::Cpu)?;
/// let y = Tensor::from_vec(vec![0.0f32, 0.0], &[2], &Device::Cpu)?;
/// let l = SmoothL1Loss::new().beta(0.5)?.reduction(Reduction::None).forward(&x, &y)?;
/// assert_eq!(l.to_vec::<f32>()?, vec![0.0625, 1.75]);
/// assert!(SmoothL1Loss::new().beta(-1.0).is_err());
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct SmoothL1Loss {
    pub reduction: Reduction,
    pub beta: f64,
}

impl Default for SmoothL1Loss {
    fn default() -> Self {
        SmoothL1Loss { reduction: Reduction::Mean, beta: 1.0 }
    }
}

impl SmoothL1Loss {
    /// Mean reduction, beta 1.
    pub fn new() -> SmoothL1Loss {
        SmoothL1Loss::default()
    }
    pub fn reduction(mut self, reduction: Reduction) -> Self {
        self.reduction = reduction;
        self
    }
    /// Where the loss turns from quadratic to linear; `>= 0` (0 gives the L1 loss).
    pub fn beta(mut self, beta: f64) -> Result<Self> {
        if !beta.is_finite() || beta < 0.0 {
            return Err(NnError::config("SmoothL1Loss", format!("beta must be a finite number >= 0, got {beta}")));
        }
        self.beta = beta;
        Ok(self)
    }
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        Ok(functional::smooth_l1_loss(input, target, self.beta, self.reduction)?)
    }
}

/// Huber loss (PyTorch's `nn.HuberLoss`): quadratic below `delta`, `delta`-sloped linear above.
///
/// ```
/// use ferrite_nn::{HuberLoss, Reduction};
/// use ferrite_tensor::{Device, Tensor};
/// # fn main() -> Result<(), ferrite_nn::NnError> {
/// let x = Tensor::from_vec(vec![1.0f32, 5.0], &[2], &Device::Cpu)?;
/// let y = Tensor::from_vec(vec![0.0f32, 0.0], &[2], &Device::Cpu)?;
/// let l = HuberLoss::new().delta(2.0)?.reduction(Reduction::Sum).forward(&x, &y)?;
/// assert_eq!(l.item()?, 0.5 + 2.0 * (5.0 - 1.0));
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct HuberLoss {
    pub reduction: Reduction,
    pub delta: f64,
}

impl Default for HuberLoss {
    fn default() -> Self {
        HuberLoss { reduction: Reduction::Mean, delta: 1.0 }
    }
}

impl HuberLoss {
    /// Mean reduction, delta 1.
    pub fn new() -> HuberLoss {
        HuberLoss::default()
    }
    pub fn reduction(mut self, reduction: Reduction) -> Self {
        self.reduction = reduction;
        self
    }
    /// Where the loss turns linear; `> 0`.
    pub fn delta(mut self, delta: f64) -> Result<Self> {
        if !delta.is_finite() || delta <= 0.0 {
            return Err(NnError::config("HuberLoss", format!("delta must be a finite number > 0, got {delta}")));
        }
        self.delta = delta;
        Ok(self)
    }
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        Ok(functional::huber_loss(input, target, self.delta, self.reduction)?)
    }
}

/// KL divergence (PyTorch's `nn.KLDivLoss`): `input` is log-probabilities, `target`
/// probabilities (log-probabilities with `log_target`). Use `KlDivReduction::BatchMean` for the
/// divergence per sample (PyTorch's default `Mean` divides by every element).
///
/// ```
/// use ferrite_nn::{KLDivLoss, KlDivReduction};
/// use ferrite_tensor::{Device, Tensor};
/// # fn main() -> Result<(), ferrite_nn::NnError> {
/// let logits = Tensor::from_vec(vec![1.0f32, 2.0, 0.5, 0.5], &[2, 2], &Device::Cpu)?;
/// let teacher = Tensor::from_vec(vec![0.3f32, 0.7, 0.5, 0.5], &[2, 2], &Device::Cpu)?;
/// let kl = KLDivLoss::new().reduction(KlDivReduction::BatchMean).forward(&logits.log_softmax(1)?, &teacher)?;
/// assert!(kl.item()? >= 0.0);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct KLDivLoss {
    pub reduction: KlDivReduction,
    pub log_target: bool,
}

impl KLDivLoss {
    /// Mean reduction (PyTorch's default), target as probabilities.
    pub fn new() -> KLDivLoss {
        KLDivLoss::default()
    }
    pub fn reduction(mut self, reduction: KlDivReduction) -> Self {
        self.reduction = reduction;
        self
    }
    /// The target holds log-probabilities.
    pub fn log_target(mut self, log_target: bool) -> Self {
        self.log_target = log_target;
        self
    }
    pub fn forward(&self, log_probs: &Tensor, target: &Tensor) -> Result<Tensor> {
        Ok(functional::kl_div(log_probs, target, self.reduction, self.log_target)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_tensor::Device;

    #[test]
    fn ignore_index_and_smoothing_reach_the_functional() {
        let d = Device::Cpu;
        let logits = Tensor::from_vec(vec![2.0f32, 0.0, 0.0, 0.0, 2.0, 0.0], &[2, 3], &d).unwrap();
        let t = Tensor::from_vec(vec![0i64, -100], &[2], &d).unwrap();
        let plain = CrossEntropyLoss::new().forward(&logits, &t).unwrap().item().unwrap();
        // Only row 0 counts: -log softmax([2,0,0])[0].
        let want = -(2f64.exp() / (2f64.exp() + 2.0)).ln();
        assert!((plain - want).abs() < 1e-6);
        let t2 = Tensor::from_vec(vec![0i64, 1], &[2], &d).unwrap();
        let ign = CrossEntropyLoss::new().ignore_index(1).forward(&logits, &t2).unwrap().item().unwrap();
        assert!((ign - want).abs() < 1e-6);
        let sm = CrossEntropyLoss::new().label_smoothing(0.3).unwrap().forward(&logits, &t).unwrap().item().unwrap();
        let lp = [2.0 - (2f64.exp() + 2.0).ln(), -(2f64.exp() + 2.0).ln(), -(2f64.exp() + 2.0).ln()];
        let want_sm = 0.7 * -lp[0] + 0.3 * -(lp.iter().sum::<f64>()) / 3.0;
        assert!((sm - want_sm).abs() < 1e-6, "{sm} vs {want_sm}");
        assert!(CrossEntropyLoss::new().label_smoothing(1.5).is_err());
        let nll = NLLLoss::new().forward(&logits.log_softmax(1).unwrap(), &t).unwrap().item().unwrap();
        assert!((nll - want).abs() < 1e-6);
        let mse = MSELoss::new()
            .reduction(Reduction::Sum)
            .forward(&logits, &logits.zeros_like().unwrap())
            .unwrap()
            .item()
            .unwrap();
        assert!((mse - 8.0).abs() < 1e-6);
    }
}
