//! Loss modules: thin, configurable wrappers over `ferrite_tensor::functional`, computed in f32
//! under autocast. They take two inputs, so they are not `Module`s; call `forward(input, target)`.

use ferrite_tensor::Tensor;
use ferrite_tensor::functional::{self, CrossEntropyOptions};

pub use ferrite_tensor::functional::Reduction;

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
