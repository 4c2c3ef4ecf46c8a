//! Gradient clipping — PyTorch's `torch.nn.utils.clip_grad_norm_` / `clip_grad_value_`.
//!
//! Clipping by norm rescales all gradients together so their joint norm is at most
//! `max_norm`, keeping the update's direction; it is the usual cure for loss spikes. With a
//! [`GradScaler`](crate::GradScaler), call `unscale_` first so the norm is of the true
//! gradients. As in PyTorch: the total norm is the norm of the per-tensor norms, each computed
//! (and rounded) in its gradient's dtype; the coefficient is `max_norm / (total + 1e-6)`
//! clamped to 1, and every gradient is multiplied by it.

use ferrite_tensor::backend::{FusedKernel, NormKind};
use ferrite_tensor::ops::promote_types;
use ferrite_tensor::{DType, Tensor, no_grad};

use crate::error::{OptimError, Result};
use crate::update_target::{unsupported, with_contiguous};

/// Clip the gradients of `params` to a total 2-norm of `max_norm`; returns the total norm
/// before clipping. Parameters without a gradient are ignored.
pub fn clip_grad_norm_(params: &[Tensor], max_norm: f64) -> Result<f64> {
    clip_grad_norm_with(params, max_norm, 2.0, false)
}

/// [`clip_grad_norm_`] with PyTorch's options: `norm_type` (any p, `f64::INFINITY` for the max
/// norm) and `error_if_nonfinite` (refuse to clip when the total norm is inf or NaN).
pub fn clip_grad_norm_with(params: &[Tensor], max_norm: f64, norm_type: f64, error_if_nonfinite: bool) -> Result<f64> {
    let grads: Vec<Tensor> = params.iter().filter_map(|p| p.grad()).collect();
    if grads.is_empty() {
        return Ok(0.0);
    }
    let total = get_total_norm(&grads, norm_type)?;
    if error_if_nonfinite && !total.is_finite() {
        return Err(OptimError::NonFiniteNorm { norm_type });
    }
    clip_grads_with_norm_(params, max_norm, total)?;
    Ok(total)
}

/// The `norm_type` norm of all `tensors` together (e.g. gradients), PyTorch's `get_total_norm`.
pub fn get_total_norm(tensors: &[Tensor], norm_type: f64) -> Result<f64> {
    if norm_type.is_nan() {
        return Err(OptimError::InvalidConfig(format!("norm_type must be a number or ±inf, got {norm_type}")));
    }
    let Some(first) = tensors.first() else { return Ok(0.0) };
    let kind = NormKind::of(norm_type);
    let _g = no_grad();
    let mut norms = Vec::with_capacity(tensors.len());
    let mut dtype = first.dtype();
    for t in tensors {
        dtype = promote_types(dtype, t.dtype());
        let t = if t.is_contiguous() { t.detach() } else { t.detach().contiguous()? };
        if !t.dtype().is_floating_point() {
            return Err(unsupported("clip_grad_norm_", t.dtype()));
        }
        let n = kind.finish(Tensor::fused(&FusedKernel::NormPartial { kind }, &[], &[&t])?);
        // vector_norm returns a tensor of the input's dtype.
        norms.push(round_to(t.dtype(), n));
    }
    Ok(round_to(dtype, kind.reduce_values(&norms)))
}

/// Scale the gradients of `params` by `min(1, max_norm / (total_norm + 1e-6))`, PyTorch's
/// `clip_grads_with_norm_` (for a total norm computed separately, e.g. across processes).
pub fn clip_grads_with_norm_(params: &[Tensor], max_norm: f64, total_norm: f64) -> Result<()> {
    let _g = no_grad();
    // The arithmetic of `clamp(max_norm / (total_norm + 1e-6), max=1.0)` on a float32 tensor.
    let denom = (total_norm as f32) + (1e-6f64 as f32);
    let raw = (max_norm as f32) / denom;
    // clamp propagates NaN (f32::min would drop it).
    let coef = if raw.is_nan() { f32::NAN } else { raw.min(1.0) };
    for p in params {
        let Some(g) = p.grad() else { continue };
        with_contiguous(&g, |g| {
            // The f32 coefficient meets the gradient's dtype first (a 0-dim tensor does not
            // promote): the kernel rounds it to the element type.
            Tensor::fused(&FusedKernel::Scale { coef: coef as f64 }, &[g], &[])?;
            Ok(())
        })?;
    }
    Ok(())
}

/// Clamp every gradient element of `params` into `[-clip_value, clip_value]`.
pub fn clip_grad_value_(params: &[Tensor], clip_value: f64) -> Result<()> {
    if !(clip_value >= 0.0) {
        return Err(OptimError::InvalidHyperparameter {
            name: "clip_value",
            value: clip_value,
            expected: "a number >= 0",
        });
    }
    let _g = no_grad();
    for p in params {
        let Some(g) = p.grad() else { continue };
        with_contiguous(&g, |g| {
            Tensor::fused(&FusedKernel::ClampAbs { clip: clip_value }, &[g], &[])?;
            Ok(())
        })?;
    }
    Ok(())
}

/// Round `x` to `dtype` (the value a tensor of that dtype would hold).
fn round_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F64 => x,
        DType::F16 => half::f16::from_f64(x).to_f64(),
        DType::BF16 => half::bf16::from_f64(x).to_f64(),
        _ => x as f32 as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_tensor::Device;

    fn param_with_grad(v: &[f32]) -> Tensor {
        let p = Tensor::zeros(&[v.len()], DType::F32, &Device::Cpu).unwrap().requires_grad_(true).unwrap();
        p.set_grad(Some(Tensor::from_slice(v, &[v.len()], &Device::Cpu).unwrap())).unwrap();
        p
    }

    #[test]
    fn clips_to_max_norm_and_returns_the_norm_before() {
        let a = param_with_grad(&[3.0, 0.0]);
        let b = param_with_grad(&[0.0, 4.0]);
        let n = clip_grad_norm_(&[a.clone(), b.clone()], 1.0).unwrap();
        assert_eq!(n, 5.0);
        let ga = a.grad().unwrap().to_vec::<f32>().unwrap();
        let gb = b.grad().unwrap().to_vec::<f32>().unwrap();
        let coef = 1.0f32 / (5.0f32 + 1e-6f32);
        assert_eq!(ga, vec![3.0 * coef, 0.0]);
        assert_eq!(gb, vec![0.0, 4.0 * coef]);
        // Below the threshold gradients are left as they are (coefficient clamped to 1).
        let c = param_with_grad(&[0.3, 0.4]);
        assert!((clip_grad_norm_(std::slice::from_ref(&c), 1.0).unwrap() - 0.5).abs() < 1e-7);
        assert_eq!(c.grad().unwrap().to_vec::<f32>().unwrap(), vec![0.3, 0.4]);
    }

    #[test]
    fn inf_norm_and_nonfinite_error() {
        let a = param_with_grad(&[1.0, -7.0, 2.0]);
        assert_eq!(clip_grad_norm_with(std::slice::from_ref(&a), 100.0, f64::INFINITY, false).unwrap(), 7.0);
        let bad = param_with_grad(&[1.0, f32::NAN]);
        let e = clip_grad_norm_with(std::slice::from_ref(&bad), 1.0, 2.0, true).unwrap_err();
        assert!(e.to_string().contains("non-finite"), "{e}");
        // Without the check, PyTorch scales by the NaN coefficient.
        assert!(clip_grad_norm_with(std::slice::from_ref(&bad), 1.0, 2.0, false).unwrap().is_nan());
        assert!(bad.grad().unwrap().to_vec::<f32>().unwrap()[0].is_nan());
    }

    #[test]
    fn no_grads_gives_zero() {
        let p = Tensor::zeros(&[2], DType::F32, &Device::Cpu).unwrap().requires_grad_(true).unwrap();
        assert_eq!(clip_grad_norm_(&[p], 1.0).unwrap(), 0.0);
    }

    #[test]
    fn clip_value_clamps() {
        let a = param_with_grad(&[-3.0, 0.5, 2.0, f32::NAN]);
        clip_grad_value_(std::slice::from_ref(&a), 1.0).unwrap();
        let g = a.grad().unwrap().to_vec::<f32>().unwrap();
        assert_eq!(&g[..3], &[-1.0, 0.5, 1.0]);
        assert!(g[3].is_nan());
        assert!(clip_grad_value_(&[a], -1.0).is_err());
    }
}
