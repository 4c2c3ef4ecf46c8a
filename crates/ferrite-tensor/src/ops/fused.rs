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

pub use crate::backend::{FUSED_CHUNK, FusedKernel, NormKind};

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
mod tests {
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
