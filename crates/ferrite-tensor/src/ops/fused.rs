//! Fused multi-tensor updates: one pass over several same-shaped tensors.
//!
//! An optimizer step written op by op (`mul_`, `add_`, `sqrt`, `div`, …) reads and writes every
//! state buffer several times and allocates a temporary per op. Optimizers, gradient unscaling
//! and norm computations instead name a [`FusedKernel`] and hand it to [`Tensor::fused`], which
//! validates the operands once and lets the device's kernel backend run the whole update in a
//! single pass without allocating. The kernels are named values, not closures, because a GPU
//! cannot run a closure over host memory: every backend implements each named kernel.
//!
//! Each kernel reproduces the *sequence* of PyTorch ops it replaces (e.g. Adam's `lerp_`, `mul_`,
//! `addcmul_`, `sqrt`, `div`, `add_`, `addcdiv_`): the same operations in the same order in the
//! same compute type, rounding to the element type wherever PyTorch stores a tensor. Scalars are
//! given in f64 exactly as PyTorch computes them on the host; backends convert them to the
//! compute type.

use crate::Tensor;
use crate::error::{Result, TensorError};
use crate::ops::check_same_device;
use crate::ops::copy::check_inplace;

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

impl Tensor {
    /// Run a named fused kernel: `outputs` are updated in place, `inputs` read.
    ///
    /// Every operand must be floating point with the same dtype, the same shape, the same device
    /// and a contiguous layout; outputs must not overlap each other or any input. Outputs get
    /// their version counter bumped, like any in-place op; outputs that require grad must be
    /// updated under `no_grad()`. Returns the kernel's scalar result (see [`FusedKernel`]); on a
    /// device that computes asynchronously, a kernel with a result is a synchronisation point.
    pub fn fused(kernel: &FusedKernel, outputs: &[&Tensor], inputs: &[&Tensor]) -> Result<f64> {
        let op = kernel.name();
        let (no, ni) = kernel.arity();
        if outputs.len() != no || inputs.len() != ni {
            return Err(TensorError::invalid(
                op,
                format!("this kernel takes {no} outputs and {ni} inputs, got {} and {}", outputs.len(), inputs.len()),
            ));
        }
        let Some(first) = outputs.first().or(inputs.first()) else {
            return Err(TensorError::invalid(op, "a fused kernel needs at least one tensor"));
        };
        if !first.dtype().is_floating_point() {
            return Err(TensorError::UnsupportedDType { op, dtype: first.dtype() });
        }
        for t in outputs.iter().chain(inputs) {
            if t.dtype() != first.dtype() {
                return Err(TensorError::DTypeMismatch { op, lhs: first.dtype(), rhs: t.dtype() });
            }
            if t.shape() != first.shape() {
                return Err(TensorError::ShapeMismatch { op, lhs: first.shape().to_vec(), rhs: t.shape().to_vec() });
            }
            check_same_device(op, first, t)?;
            if !t.is_contiguous() {
                return Err(TensorError::NotContiguous {
                    op,
                    shape: t.shape().to_vec(),
                    strides: t.strides().to_vec(),
                });
            }
        }
        for o in outputs {
            check_inplace(op, o, inputs)?;
        }
        for (i, a) in outputs.iter().enumerate() {
            for b in outputs[i + 1..].iter().chain(inputs) {
                if overlaps(a, b) {
                    return Err(TensorError::invalid(
                        op,
                        "an output overlaps another operand in memory; fused updates need distinct buffers for every output",
                    ));
                }
            }
        }
        let result =
            if first.numel() == 0 { kernel.empty_result() } else { first.kernels().fused(kernel, outputs, inputs)? };
        for o in outputs {
            o.storage().bump_version();
        }
        Ok(result)
    }
}

/// Whether two contiguous tensors of the same dtype share any element.
fn overlaps(a: &Tensor, b: &Tensor) -> bool {
    if !a.shares_storage(b) || a.numel() == 0 || b.numel() == 0 {
        return false;
    }
    let (a0, b0) = (a.storage_offset(), b.storage_offset());
    a0 < b0 + b.numel() && b0 < a0 + a.numel()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{DType, Device, no_grad};

    fn t(v: &[f32]) -> Tensor {
        Tensor::from_slice(v, &[v.len()], &Device::Cpu).unwrap()
    }

    #[test]
    fn sgd_updates_outputs_and_bumps_versions() {
        let p = t(&[1.0, 2.0, 3.0]);
        let g = t(&[0.5, 0.5, 1.0]);
        let v0 = p.storage().version();
        let k = FusedKernel::Sgd {
            lr: 0.5,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            maximize: false,
            first_step: true,
        };
        Tensor::fused(&k, &[&p], &[&g]).unwrap();
        assert_eq!(p.to_vec::<f32>().unwrap(), vec![0.75, 1.75, 2.5]);
        assert_eq!(p.storage().version(), v0 + 1);
    }

    #[test]
    fn norm_partials_combine_over_chunks() {
        let n = FUSED_CHUNK * 3 + 7;
        let v: Vec<f32> = (0..n).map(|i| (i % 5) as f32 - 2.0).collect();
        let x = Tensor::from_slice(&v, &[n], &Device::Cpu).unwrap();
        let want: f64 = v.iter().map(|&x| (x as f64).abs()).sum();
        let got = Tensor::fused(&FusedKernel::NormPartial { kind: NormKind::One }, &[], &[&x]).unwrap();
        assert_eq!(got, want);
        let inf = Tensor::fused(&FusedKernel::NormPartial { kind: NormKind::Inf }, &[], &[&x]).unwrap();
        assert_eq!(inf, 2.0);
    }

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

    #[test]
    fn rejects_bad_operands() {
        let a = t(&[1.0, 2.0]);
        let b = t(&[1.0, 2.0, 3.0]);
        let sgd = FusedKernel::Sgd {
            lr: 0.1,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            maximize: false,
            first_step: true,
        };
        assert!(matches!(Tensor::fused(&sgd, &[&a], &[&b]), Err(TensorError::ShapeMismatch { .. })));
        let d = Tensor::from_slice(&[1.0f64, 2.0], &[2], &Device::Cpu).unwrap();
        assert!(matches!(Tensor::fused(&sgd, &[&a], &[&d]), Err(TensorError::DTypeMismatch { .. })));
        // Wrong arity.
        assert!(Tensor::fused(&sgd, &[&a], &[]).unwrap_err().to_string().contains("takes 1 outputs and 1 inputs"));
        // An output aliasing an input.
        let e = Tensor::fused(&sgd, &[&a], &[&a.detach()]).unwrap_err();
        assert!(e.to_string().contains("overlaps"), "{e}");
        // Non-contiguous operand.
        let m = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &Device::Cpu).unwrap();
        let mt = m.t().unwrap();
        let m2 = m.deep_clone().unwrap();
        assert!(Tensor::fused(&sgd, &[&m2], &[&mt]).unwrap_err().to_string().contains("contiguous"));
        // Integer operands.
        let i = Tensor::from_slice(&[1i64, 2], &[2], &Device::Cpu).unwrap();
        assert!(matches!(
            Tensor::fused(&FusedKernel::Scale { coef: 2.0 }, &[&i], &[]),
            Err(TensorError::UnsupportedDType { .. })
        ));
    }

    #[test]
    fn disjoint_views_of_one_storage_are_fine() {
        let m = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &Device::Cpu).unwrap();
        let r0 = m.select(0, 0).unwrap();
        let r1 = m.select(0, 1).unwrap();
        let sgd = FusedKernel::Sgd {
            lr: 1.0,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            maximize: false,
            first_step: true,
        };
        Tensor::fused(&sgd, &[&r0], &[&r1]).unwrap();
        assert_eq!(m.to_vec::<f32>().unwrap(), vec![-2.0, -2.0, 3.0, 4.0]);
    }

    #[test]
    fn leaf_requiring_grad_needs_no_grad() {
        let p = t(&[1.0]).requires_grad_(true).unwrap();
        let k = FusedKernel::Scale { coef: 2.0 };
        assert!(matches!(Tensor::fused(&k, &[&p], &[]), Err(TensorError::InplaceOnLeaf { .. })));
        let _g = no_grad();
        Tensor::fused(&k, &[&p], &[]).unwrap();
        assert_eq!(p.to_vec::<f32>().unwrap(), vec![2.0]);
    }

    #[test]
    fn meta_tensors_compute_nothing() {
        let p = Tensor::zeros(&[4], DType::F32, &Device::Meta).unwrap();
        assert_eq!(Tensor::fused(&FusedKernel::Unscale { inv_scale: 0.5 }, &[&p], &[]).unwrap(), 0.0);
        let inf = Tensor::fused(&FusedKernel::NormPartial { kind: NormKind::NegInf }, &[], &[&p]).unwrap();
        assert_eq!(inf, f64::INFINITY);
    }
}
