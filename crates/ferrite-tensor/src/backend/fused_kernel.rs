//! The named multi-tensor kernels of fused updates ([`FusedKernel`], with [`NormKind`] and the
//! chunk size [`FUSED_CHUNK`] that fixes the CPU backend's summation order): the operand of
//! [`KernelBackend::fused`](super::KernelBackend::fused). They were defined beside the op
//! (`ops/fused.rs`) while the backend trait took them, which made `ops/` and `backend/` import
//! each other; the trait's operands now live on the backend side and `ops/fused.rs` (validation,
//! `Tensor::fused`) re-exports them under their old paths.

/// Elements per chunk of the CPU backend's parallel passes (fixed, not derived from the thread
/// count, so per-chunk partial results combine in the same order on every machine).
pub const FUSED_CHUNK: usize = 1 << 15;

/// Which reduction a vector norm needs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NormKind {
    /// max |x|
    Inf,
    /// min |x|
    NegInf,
    /// count of non-zeros
    Zero,
    /// sum |x|
    One,
    /// sum x²
    Two,
    /// sum |x|^p
    P(f64),
}

impl NormKind {
    /// The kind of PyTorch's `vector_norm(ord=p)`.
    pub fn of(p: f64) -> NormKind {
        if p == f64::INFINITY {
            NormKind::Inf
        } else if p == f64::NEG_INFINITY {
            NormKind::NegInf
        } else if p == 0.0 {
            NormKind::Zero
        } else if p == 1.0 {
            NormKind::One
        } else if p == 2.0 {
            NormKind::Two
        } else {
            NormKind::P(p)
        }
    }

    /// Identity of the partial reduction.
    pub fn identity(self) -> f64 {
        match self {
            NormKind::NegInf => f64::INFINITY,
            _ => 0.0,
        }
    }

    /// Combine two partial reductions.
    #[inline(always)]
    pub fn combine(self, a: f64, b: f64) -> f64 {
        match self {
            NormKind::Inf => nan_max(a, b),
            NormKind::NegInf => nan_min(a, b),
            _ => a + b,
        }
    }

    /// From a complete partial reduction to the norm.
    pub fn finish(self, acc: f64) -> f64 {
        match self {
            NormKind::Two => acc.sqrt(),
            NormKind::P(p) => acc.powf(1.0 / p),
            _ => acc,
        }
    }

    /// The norm of already-computed norms (for the total norm of several tensors).
    pub fn reduce_values(self, values: &[f64]) -> f64 {
        let acc = values.iter().fold(self.identity(), |acc, &x| self.combine(acc, self.elem(x)));
        self.finish(acc)
    }

    /// One element's contribution to the partial reduction.
    #[inline(always)]
    pub fn elem(self, x: f64) -> f64 {
        match self {
            NormKind::Inf | NormKind::NegInf | NormKind::One => x.abs(),
            NormKind::Zero => (x != 0.0) as u8 as f64,
            NormKind::Two => x * x,
            NormKind::P(p) => x.abs().powf(p),
        }
    }
}

#[inline(always)]
fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) }
}

#[inline(always)]
fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() { f64::NAN } else { a.min(b) }
}

/// A named multi-tensor kernel with its host-computed scalars.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FusedKernel {
    /// `torch.optim.SGD` for one parameter. Outputs `[param]` without momentum, `[param,
    /// momentum_buffer]` with; inputs `[grad]`. `first_step` initialises the buffer with the
    /// (decayed) gradient, as PyTorch does when it creates it.
    Sgd {
        lr: f64,
        /// 0 = no momentum (one output).
        momentum: f64,
        dampening: f64,
        nesterov: bool,
        /// 0 = no decay.
        weight_decay: f64,
        maximize: bool,
        first_step: bool,
    },
    /// `torch.optim.Adam`/`AdamW` for one parameter. Outputs `[param, exp_avg, exp_avg_sq]`, plus
    /// `max_exp_avg_sq` with `amsgrad`; inputs `[grad]`.
    Adam {
        /// Adam's L2 term `grad += wd * param` (`None` for AdamW or no decay).
        l2: Option<f64>,
        /// AdamW's decoupled decay factor `1 - lr * wd` (`None` for Adam or no decay).
        decay: Option<f64>,
        beta1: f64,
        beta2: f64,
        eps: f64,
        /// `sqrt(1 - beta2^step)`.
        bias_correction2_sqrt: f64,
        /// `lr / (1 - beta1^step)`.
        step_size: f64,
        maximize: bool,
        amsgrad: bool,
    },
    /// `_amp_foreach_non_finite_check_and_unscale_` on one gradient: outputs `[grad]`, scaled by
    /// `inv_scale` (skipped when it is 1). Result 1.0 if any element was inf or NaN, else 0.0.
    Unscale { inv_scale: f64 },
    /// A vector norm's partial reduction of inputs `[x]` (combine across tensors with
    /// [`NormKind::combine`], then [`NormKind::finish`]).
    NormPartial { kind: NormKind },
    /// `clamp_(-clip, clip)` on outputs `[grad]` (NaN stays NaN).
    ClampAbs { clip: f64 },
    /// `mul_(coef)` on outputs `[grad]`, with `coef` first rounded to the element type (a 0-dim
    /// f32 tensor meeting the gradient's dtype, as in `clip_grad_norm_`).
    Scale { coef: f64 },

    // ---------------------------------------------------------------- RMSprop, Adagrad (lossopt)
    /// `torch.optim.RMSprop` for one parameter. Outputs `[param, square_avg]`, then
    /// `momentum_buffer` when `momentum > 0`, then `grad_avg` when `centered`; inputs `[grad]`.
    /// The buffers start at zero (PyTorch's `zeros_like`), so there is no first-step special case.
    Rmsprop {
        lr: f64,
        alpha: f64,
        eps: f64,
        /// 0 = no decay.
        weight_decay: f64,
        /// 0 = no momentum buffer.
        momentum: f64,
        centered: bool,
        maximize: bool,
    },
    /// `torch.optim.Adagrad` for one parameter. Outputs `[param, sum]`; inputs `[grad]`.
    Adagrad {
        /// The step's decayed rate `lr / (1 + (step - 1) * lr_decay)`, computed on the host.
        clr: f64,
        eps: f64,
        /// 0 = no decay.
        weight_decay: f64,
        maximize: bool,
    },
}

impl FusedKernel {
    /// Op name for messages.
    pub fn name(&self) -> &'static str {
        match self {
            FusedKernel::Sgd { .. } => "sgd_step",
            FusedKernel::Adam { .. } => "adam_step",
            FusedKernel::Unscale { .. } => "unscale_",
            FusedKernel::NormPartial { .. } => "vector_norm",
            FusedKernel::ClampAbs { .. } => "clip_grad_value_",
            FusedKernel::Scale { .. } => "clip_grad_norm_",
            FusedKernel::Rmsprop { .. } => "rmsprop_step",
            FusedKernel::Adagrad { .. } => "adagrad_step",
        }
    }

    /// (outputs, inputs) the kernel takes.
    pub fn arity(&self) -> (usize, usize) {
        match *self {
            FusedKernel::Sgd { momentum, .. } => (if momentum == 0.0 { 1 } else { 2 }, 1),
            FusedKernel::Adam { amsgrad, .. } => (if amsgrad { 4 } else { 3 }, 1),
            FusedKernel::Unscale { .. } | FusedKernel::ClampAbs { .. } | FusedKernel::Scale { .. } => (1, 0),
            FusedKernel::NormPartial { .. } => (0, 1),
            FusedKernel::Rmsprop { momentum, centered, .. } => (2 + (momentum > 0.0) as usize + centered as usize, 1),
            FusedKernel::Adagrad { .. } => (2, 1),
        }
    }

    /// The result over zero elements (and on `meta`, which has no values).
    pub fn empty_result(&self) -> f64 {
        match self {
            FusedKernel::NormPartial { kind } => kind.identity(),
            _ => 0.0,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `(p, ‖[3, -4, 0]‖_p)` for every kind of norm: the cases the op layer's and each backend's
    /// norm tests share.
    pub(crate) fn norm_cases() -> [(f64, f64); 6] {
        [
            (2.0, 5.0),
            (1.0, 7.0),
            (f64::INFINITY, 4.0),
            (f64::NEG_INFINITY, 0.0),
            (0.0, 2.0),
            (3.0, (27.0f64 + 64.0).powf(1.0 / 3.0)),
        ]
    }

    #[test]
    fn norm_kinds() {
        let x = [3.0f64, -4.0, 0.0];
        for (p, want) in norm_cases() {
            let k = NormKind::of(p);
            let got = k.reduce_values(&x);
            assert!((got - want).abs() < 1e-12, "p={p}: {got} vs {want}");
        }
        assert!(NormKind::Inf.reduce_values(&[1.0, f64::NAN]).is_nan());
    }
}
