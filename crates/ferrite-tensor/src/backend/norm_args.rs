//! The operand sets of the normalisation kernels (layer, batch, group and RMS norm), one value
//! per kernel so that every backend takes them the same way.
//!
//! Why the shapes are what they are: every kernel sees its input as a contiguous `[N, C, S]`
//! (batch, channels, everything after the channels flattened; `S = 1` for `(N, C)` input) or, for
//! RMS norm, as `[rows, cols]`, so one kernel serves every rank. Statistics (`mean`, `invstd`,
//! `rstd`) are in the *statistics dtype*: f64 for f64 input, f32 otherwise (PyTorch's
//! accumulation type); the op layer allocates them and saves them for backward, so backward never
//! recomputes a reduction the forward already did. Weights, biases and gradients have the input's
//! dtype. Every gradient output is optional: a kernel writes only what autograd asked for.

use crate::Tensor;

/// Where batch norm's per-channel statistics come from.
#[derive(Clone, Copy)]
pub enum BatchNormStats<'a> {
    /// Training (or no running statistics): the kernel computes each channel's mean and biased
    /// variance over `N·S` values, writes `mean` and `invstd = 1/√(var + eps)`, and, when
    /// `running` is given, updates the running statistics in place.
    Batch { eps: f64, running: Option<RunningStats<'a>> },
    /// Evaluation: `mean` and `invstd` are inputs (the op derived them from the running
    /// statistics); the kernel only normalises.
    Given,
}

/// Running statistics updated in place by a training-mode batch norm:
/// `mean = (1 - factor)·mean + factor·batch_mean` and
/// `var = (1 - factor)·var + factor·batch_var·n/(n - 1)` (the unbiased batch variance, as
/// PyTorch). Both `[C]`, contiguous, any floating dtype.
#[derive(Clone, Copy)]
pub struct RunningStats<'a> {
    pub mean: &'a Tensor,
    pub var: &'a Tensor,
    /// PyTorch's `exponential_average_factor`: the momentum, or `1/num_batches_tracked`.
    pub factor: f64,
}

/// Operands of a normalisation kernel's forward — layer, batch and group norm take the same
/// tensors and differ only in `params`: normalise the contiguous `x` into `y` (same shape and
/// dtype), with the statistics `mean` and `rstd = 1/√(var + eps)` (statistics dtype; written, or
/// read by batch norm in evaluation), scaled by `weight` and shifted by `bias` when present.
/// See [`LayerNormArgs`], [`BatchNormArgs`], [`GroupNormArgs`].
#[derive(Clone, Copy)]
pub struct NormArgs<'a, P> {
    pub y: &'a Tensor,
    pub x: &'a Tensor,
    pub mean: &'a Tensor,
    pub rstd: &'a Tensor,
    pub weight: Option<&'a Tensor>,
    pub bias: Option<&'a Tensor>,
    /// What this kind of norm adds (eps, groups, where the statistics come from).
    pub params: P,
}

/// Operands of a normalisation kernel's backward — batch and group norm take the same tensors
/// and differ only in `params`: from `grad_output` (`[N, C, S]`, contiguous, the input's
/// dtype), the saved `x`, `mean`, `rstd` and `weight`, write the gradients that are asked for
/// (each optional). See [`BatchNormBackwardArgs`], [`GroupNormBackwardArgs`].
#[derive(Clone, Copy)]
pub struct NormBackwardArgs<'a, P> {
    pub grad_input: Option<&'a Tensor>,
    pub grad_weight: Option<&'a Tensor>,
    pub grad_bias: Option<&'a Tensor>,
    pub grad_output: &'a Tensor,
    pub x: &'a Tensor,
    pub mean: &'a Tensor,
    pub rstd: &'a Tensor,
    pub weight: Option<&'a Tensor>,
    /// What this kind of norm adds.
    pub params: P,
}

impl<'a, P> NormBackwardArgs<'a, P> {
    /// The same operands with the parameters of one kind of norm (the backward node builds the
    /// operands once and then calls batch or group norm's kernel).
    pub fn with_params<Q>(self, params: Q) -> NormBackwardArgs<'a, Q> {
        let NormBackwardArgs { grad_input, grad_weight, grad_bias, grad_output, x, mean, rstd, weight, params: _ } =
            self;
        NormBackwardArgs { grad_input, grad_weight, grad_bias, grad_output, x, mean, rstd, weight, params }
    }
}

/// Operands of [`KernelBackend::batch_norm`](super::KernelBackend::batch_norm):
/// `y = (x - mean[c])·rstd[c]·weight[c] + bias[c]` over `x [N, C, S]`; `mean` and `rstd`
/// (PyTorch's `invstd`) are `[C]`, written or read as [`BatchNormStats`] says.
pub type BatchNormArgs<'a> = NormArgs<'a, BatchNormStats<'a>>;

/// Operands of [`KernelBackend::batch_norm_backward`](super::KernelBackend::batch_norm_backward).
/// With `batch_stats` (training) the gradient flows through the batch mean and variance:
/// `dx = (dy - Σdy/n - (x - mean)·rstd²·Σdy(x - mean)/n)·rstd·w`; without it (evaluation)
/// `dx = dy·rstd·w`. Always `grad_weight = rstd·Σdy(x - mean)`, `grad_bias = Σdy` (sums over
/// `N·S` per channel).
pub type BatchNormBackwardArgs<'a> = NormBackwardArgs<'a, BatchNormBackwardParams>;

/// What batch norm's backward adds to [`NormBackwardArgs`].
#[derive(Clone, Copy)]
pub struct BatchNormBackwardParams {
    /// The forward normalised with the batch's statistics (training).
    pub batch_stats: bool,
}

/// Operands of [`KernelBackend::group_norm`](super::KernelBackend::group_norm): the channels of
/// `x [N, C, S]` split into `groups` consecutive groups; each `(n, g)` is normalised over its
/// `C/groups · S` values, writing `mean` and `rstd` `[N, groups]`, then scaled per channel.
pub type GroupNormArgs<'a> = NormArgs<'a, GroupNormParams>;

/// Operands of [`KernelBackend::group_norm_backward`](super::KernelBackend::group_norm_backward)
/// (PyTorch's `native_group_norm_backward`); `params.eps` is not used.
pub type GroupNormBackwardArgs<'a> = NormBackwardArgs<'a, GroupNormParams>;

/// What group norm adds to [`NormArgs`] and [`NormBackwardArgs`].
#[derive(Clone, Copy)]
pub struct GroupNormParams {
    pub groups: usize,
    pub eps: f64,
}

/// Operands of [`KernelBackend::rms_norm`](super::KernelBackend::rms_norm): each row of
/// `x [rows, cols]` times `rstd = 1/√(mean(x²) + eps)` (written, `[rows]`), times `weight [cols]`.
#[derive(Clone, Copy)]
pub struct RmsNormArgs<'a> {
    pub y: &'a Tensor,
    pub rstd: &'a Tensor,
    pub x: &'a Tensor,
    pub weight: Option<&'a Tensor>,
    pub eps: f64,
}

/// Operands of [`KernelBackend::rms_norm_backward`](super::KernelBackend::rms_norm_backward):
/// `dx = rstd·(w·dy) - x·rstd³·Σ(w·dy·x)/cols` per row, `grad_weight = Σrows dy·x·rstd`.
#[derive(Clone, Copy)]
pub struct RmsNormBackwardArgs<'a> {
    pub grad_input: Option<&'a Tensor>,
    pub grad_weight: Option<&'a Tensor>,
    pub grad_output: &'a Tensor,
    pub x: &'a Tensor,
    pub rstd: &'a Tensor,
    pub weight: Option<&'a Tensor>,
}

/// Operands of [`KernelBackend::layer_norm_backward`](super::KernelBackend::layer_norm_backward):
/// the contiguous `grad_output` and `x` `[rows, cols]` (`x`'s dtype), the statistics the forward
/// pass saved, `mean` and `rstd` `[rows]` (f32; f64 for f64 input), the `weight` `[cols]` when
/// present, and which gradients are wanted (`need`: input, weight, bias). With `x̂ = (x - mean)·rstd`
/// and `g = dy·w`: `dx = rstd·(g - mean(g) - x̂·mean(g·x̂))` per row, `grad_weight = Σrows dy·x̂`,
/// `grad_bias = Σrows dy`.
#[derive(Clone, Copy)]
pub struct LayerNormBackwardArgs<'a> {
    pub grad_output: &'a Tensor,
    pub x: &'a Tensor,
    pub mean: &'a Tensor,
    pub rstd: &'a Tensor,
    pub weight: Option<&'a Tensor>,
    pub need: [bool; 3],
}

impl LayerNormBackwardArgs<'_> {
    /// The uninitialised outputs of the gradients asked for, on `x`'s device and dtype (every
    /// backend allocates the same ones, so memory plans agree).
    pub fn outputs(&self) -> crate::error::Result<LayerNormGrads> {
        // `rows_cols`'s bookkeeping, spelled out: `kernel_backend.rs` depends on this file.
        let cols = self.x.shape().last().copied().unwrap_or(1);
        let rows = self.x.numel().checked_div(cols).unwrap_or(0);
        let dtype = self.x.dtype();
        let alloc = |on: bool, shape: &[usize]| on.then(|| self.x.empty_like_shape(shape, dtype)).transpose();
        Ok(LayerNormGrads {
            input: alloc(self.need[0], &[rows, cols])?,
            weight: alloc(self.need[1], &[cols])?,
            bias: alloc(self.need[2], &[cols])?,
        })
    }
}

/// The gradients a fused [`KernelBackend::layer_norm_backward`](super::KernelBackend::layer_norm_backward)
/// returns: `input` `[rows, cols]`, `weight` and `bias` `[cols]`, each present when asked for.
pub struct LayerNormGrads {
    pub input: Option<Tensor>,
    pub weight: Option<Tensor>,
    pub bias: Option<Tensor>,
}

/// The `(N, C, S)` a channel kernel sees in its contiguous `[N, C, S]` operand.
pub fn ncs(t: &Tensor) -> (usize, usize, usize) {
    match *t.shape() {
        [n, c, s] => (n, c, s),
        _ => (0, 0, 0),
    }
}

/// The operands of [`KernelBackend::layer_norm`](super::KernelBackend::layer_norm): normalise
/// each row of the contiguous `x` `[rows, cols]` (see [`rows_cols`](super::rows_cols)) into `y`,
/// writing the f32 statistics `mean` and `rstd` `[rows]`, scaled by `weight` and shifted by
/// `bias` (`[cols]`, `x`'s dtype) when present.
pub type LayerNormArgs<'a> = NormArgs<'a, LayerNormParams>;

/// What layer norm adds to [`NormArgs`].
#[derive(Clone, Copy)]
pub struct LayerNormParams {
    pub eps: f64,
}
