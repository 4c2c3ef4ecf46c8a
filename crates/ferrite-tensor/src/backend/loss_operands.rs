//! The operands of the pointwise-loss kernels ([`KernelBackend::pointwise_loss`] and its
//! backward): which loss, its tensors, and which gradient. The trait takes them, so they live on
//! the backend side; `functional/loss.rs` builds them.
//!
//! [`KernelBackend::pointwise_loss`]: super::KernelBackend::pointwise_loss

use crate::Tensor;

/// An elementwise loss computed in one pass by [`KernelBackend::pointwise_loss`] (reductions are
/// the ordinary differentiable `sum`/`mean` on its output). Formulas are PyTorch's, in the compute
/// type of the element (f32 for f16/bf16/f32, f64 for f64); `w` is the optional `weight`
/// (1 when absent), `pw` the optional `pos_weight`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PointwiseLoss {
    /// `F.binary_cross_entropy` of probabilities `x`:
    /// `w ((t - 1) max(ln(1 - x), -100) - t max(ln x, -100))`. The CPU backend refuses inputs or
    /// targets outside [0, 1]; the GPU backend gives NaN for them (no device-side assert).
    Bce,
    /// `F.binary_cross_entropy_with_logits`: `w ((1 - t) x - (1 + (pw - 1) t) logsigmoid(x))`,
    /// with the stable `logsigmoid(x) = min(x, 0) - ln(1 + e^-|x|)`.
    BceWithLogits,
    /// `F.smooth_l1_loss`: `|d| < beta ? 0.5 d² / beta : |d| - 0.5 beta` (L1 when `beta` is 0).
    SmoothL1 { beta: f64 },
    /// `F.huber_loss`: `|d| < delta ? 0.5 d² : delta (|d| - 0.5 delta)`.
    Huber { delta: f64 },
    /// `F.kl_div` (elementwise, before reduction): `t ln t - t x` (0 where t is 0), or
    /// `e^t (t - x)` with `log_target`.
    KlDiv { log_target: bool },
}

impl PointwiseLoss {
    /// PyTorch's name of the op.
    pub fn name(self) -> &'static str {
        match self {
            PointwiseLoss::Bce => "binary_cross_entropy",
            PointwiseLoss::BceWithLogits => "binary_cross_entropy_with_logits",
            PointwiseLoss::SmoothL1 { .. } => "smooth_l1_loss",
            PointwiseLoss::Huber { .. } => "huber_loss",
            PointwiseLoss::KlDiv { .. } => "kl_div",
        }
    }

    /// PyTorch's name of the backward node (what `grad_fn` shows).
    pub fn backward_name(self) -> &'static str {
        match self {
            PointwiseLoss::Bce => "BinaryCrossEntropyBackward0",
            PointwiseLoss::BceWithLogits => "BinaryCrossEntropyWithLogitsBackward0",
            PointwiseLoss::SmoothL1 { .. } => "SmoothL1LossBackward0",
            PointwiseLoss::Huber { .. } => "HuberLossBackward0",
            PointwiseLoss::KlDiv { .. } => "KlDivBackward0",
        }
    }
}

/// The operands of a [`PointwiseLoss`]: `input` and `target` have the output's shape and dtype
/// (they may be strided); `weight` and `pos_weight` have its dtype and broadcast to its shape.
#[derive(Clone, Copy, Debug)]
pub struct LossOperands<'a> {
    pub input: &'a Tensor,
    pub target: &'a Tensor,
    pub weight: Option<&'a Tensor>,
    /// Only for [`PointwiseLoss::BceWithLogits`].
    pub pos_weight: Option<&'a Tensor>,
}

/// Which operand a loss gradient is taken with respect to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossGrad {
    Input,
    Target,
}
