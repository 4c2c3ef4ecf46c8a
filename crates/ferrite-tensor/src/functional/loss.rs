//! Losses of `torch.nn.functional`: cross-entropy (class indices, ignore_index, label smoothing,
//! class weights), negative log-likelihood, mean squared error, binary cross-entropy (on
//! probabilities and on logits, with `weight` and `pos_weight`), smooth L1, Huber and KL
//! divergence. They share one [`Reduction`], so `ferrite-nn`'s loss modules are thin wrappers
//! over them.
//!
//! Why two shapes of implementation: cross-entropy and NLL are compositions of differentiable ops
//! (`log_softmax`, `gather`, `index_select`) because their work is a row-wise softmax the ops
//! already do in one pass. The elementwise losses (BCE, smooth L1, Huber, KL) would need three to
//! six ops each as a composition, with a temporary per op and PyTorch's clamps and stable forms
//! lost in between, so each is one backend kernel ([`PointwiseLoss`]) for its forward and one
//! for its gradient; the reduction is the ordinary `sum`/`mean`. Every loss computes in f32
//! under autocast.

use std::borrow::Cow;

use crate::autograd::{BackwardFn, SavedTensor};
use crate::backend::{LossGrad, LossOperands, PointwiseLoss};
use crate::error::{ExpectedShape, Result, TensorError};
use crate::ops::check_same_device;
use crate::{DType, Tensor};

/// How a loss reduces over the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Reduction {
    None,
    #[default]
    Mean,
    Sum,
}

/// Options of [`cross_entropy`] (PyTorch's defaults).
#[derive(Clone, Debug)]
pub struct CrossEntropyOptions {
    /// Targets equal to this contribute nothing (and do not count in the mean).
    pub ignore_index: i64,
    /// Mix the one-hot target with a uniform distribution (0 = off).
    pub label_smoothing: f64,
    pub reduction: Reduction,
    /// Per-class weights `[C]`.
    pub weight: Option<Tensor>,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        CrossEntropyOptions { ignore_index: -100, label_smoothing: 0.0, reduction: Reduction::Mean, weight: None }
    }
}

/// Cross-entropy between logits `[N, C]` (or `[N, C, d1, …]`) and class indices `[N]`
/// (or `[N, d1, …]`), computed in f32 under autocast.
pub fn cross_entropy(logits: &Tensor, target: &Tensor, opts: &CrossEntropyOptions) -> Result<Tensor> {
    if !(0.0..=1.0).contains(&opts.label_smoothing) {
        return Err(TensorError::invalid(
            "cross_entropy",
            format!("label_smoothing must be between 0.0 and 1.0, got {}", opts.label_smoothing),
        ));
    }
    let logp = logits_to_logp(logits)?;
    nll_core(&logp, target, opts, "cross_entropy")
}

/// Negative log-likelihood of log-probabilities `[N, C]` (or `[N, C, d…]`).
pub fn nll_loss(logp: &Tensor, target: &Tensor, opts: &CrossEntropyOptions) -> Result<Tensor> {
    let lp = move_class_last(logp)?;
    nll_core(&lp, target, opts, "nll_loss")
}

fn move_class_last(x: &Tensor) -> Result<Tensor> {
    if x.rank() < 2 {
        return Err(TensorError::InvalidShape {
            op: "cross_entropy",
            arg: "input",
            shape: x.shape().to_vec(),
            expected: ExpectedShape::MinRank(2),
        });
    }
    let c = x.shape()[1];
    if x.rank() == 2 {
        return Ok(x.clone());
    }
    let mut perm: Vec<i64> = vec![0];
    perm.extend(2..x.rank() as i64);
    perm.push(1);
    x.permute(&perm)?.reshape(&[-1, c as i64])
}

fn logits_to_logp(logits: &Tensor) -> Result<Tensor> {
    let x = move_class_last(logits)?;
    let x = x.to_dtype(crate::autocast::upper(x.dtype()))?;
    x.log_softmax(1)
}

/// The dtypes class-index targets may have.
const CLASS_INDEX_DTYPES: &[DType] = &[DType::I64, DType::I32, DType::U8];

fn nll_core(logp: &Tensor, target: &Tensor, opts: &CrossEntropyOptions, op: &'static str) -> Result<Tensor> {
    let n = logp.shape()[0];
    let c = logp.shape()[1];
    if target.numel() != n {
        return Err(TensorError::InvalidShape {
            op,
            arg: "target",
            shape: target.shape().to_vec(),
            expected: ExpectedShape::Numel(n),
        });
    }
    if !CLASS_INDEX_DTYPES.contains(&target.dtype()) {
        return Err(TensorError::InvalidDType {
            op,
            arg: "target (class indices)",
            dtype: target.dtype(),
            expected: CLASS_INDEX_DTYPES,
        });
    }
    let t = target.reshape_usize(&[n])?.to_dtype(DType::I64)?;
    let valid = t.ne_scalar(opts.ignore_index as f64)?;
    t.kernels().check_indices(&t, c, Some(opts.ignore_index), 1, op)?;
    let zero_i = Tensor::zeros(&[], DType::I64, t.device())?;
    let safe_t = Tensor::where_cond(&valid, &t, &zero_i)?;
    let picked = logp.gather(1, &safe_t.unsqueeze(1)?)?.squeeze(1)?;
    let validf = valid.to_dtype(logp.dtype())?;
    let w_rows = match &opts.weight {
        Some(w) => {
            if w.shape() != [c] {
                return Err(TensorError::InvalidShape {
                    op,
                    arg: "weight",
                    shape: w.shape().to_vec(),
                    expected: ExpectedShape::Exact(vec![c]),
                });
            }
            w.to_dtype(logp.dtype())?.index_select(0, &safe_t)?.mul(&validf)?
        }
        None => validf.clone(),
    };
    let mut loss = picked.mul(&w_rows)?.neg()?;
    if opts.label_smoothing > 0.0 {
        let eps = opts.label_smoothing;
        let smooth = match &opts.weight {
            Some(w) => logp.mul(&w.to_dtype(logp.dtype())?)?.sum_dims(&[1], false)?,
            None => logp.sum_dims(&[1], false)?,
        };
        let smooth = smooth.mul(&validf)?.neg()?;
        loss = loss.mul_scalar(1.0 - eps)?.add(&smooth.mul_scalar(eps / c as f64)?)?;
    }
    match opts.reduction {
        Reduction::None => Ok(loss),
        Reduction::Sum => loss.sum(),
        Reduction::Mean => loss.sum()?.div(&w_rows.sum()?),
    }
}

/// Mean squared error (PyTorch's `F.mse_loss`, reduction mean), f32 under autocast.
pub fn mse_loss(input: &Tensor, target: &Tensor) -> Result<Tensor> {
    mse_loss_with(input, target, Reduction::Mean)
}

/// Mean squared error with an explicit reduction.
pub fn mse_loss_with(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    if input.shape() != target.shape() {
        return Err(TensorError::ShapeMismatch {
            op: "mse_loss",
            lhs: input.shape().to_vec(),
            rhs: target.shape().to_vec(),
        });
    }
    let up = crate::autocast::upper(input.dtype());
    let d = input.to_dtype(up)?.sub(&target.to_dtype(up)?)?;
    let sq = d.square()?;
    match reduction {
        Reduction::None => Ok(sq),
        Reduction::Sum => sq.sum(),
        Reduction::Mean => sq.mean(),
    }
}

// ------------------------------------------------------------------------ elementwise losses

/// Reductions of [`kl_div`]: PyTorch's `reduction` strings, including `"batchmean"` (the sum
/// divided by the batch size, the mathematically correct KL divergence per sample).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KlDivReduction {
    None,
    /// The mean over every element (PyTorch's default, which it warns about).
    #[default]
    Mean,
    Sum,
    /// The sum divided by `input.shape()[0]`.
    BatchMean,
}

/// Binary cross-entropy between probabilities `input` and targets in [0, 1] of the same shape
/// (PyTorch's `F.binary_cross_entropy`): `-w (t ln x + (1 - t) ln(1 - x))`, each log floored at
/// -100 as PyTorch does, so a saturated prediction gives a large finite loss rather than `inf`.
/// `weight` rescales each element and broadcasts to the input's shape; it gets no gradient.
///
/// On `cpu`/`sim`, an input or target outside [0, 1] is a [`TensorError::InvalidArgument`]
/// naming the value (on `cuda:N` the same error, at the next synchronisation); `gpu:N` gives NaN
/// for it instead. Prefer [`binary_cross_entropy_with_logits`] on raw scores: it is the
/// numerically stable form.
///
/// ```
/// use ferrite_tensor::functional::{binary_cross_entropy, Reduction};
/// use ferrite_tensor::{Device, Tensor};
/// # fn main() -> Result<(), ferrite_tensor::TensorError> {
/// let p = Tensor::from_vec(vec![0.9f32, 0.2], &[2], &Device::Cpu)?;
/// let y = Tensor::from_vec(vec![1.0f32, 0.0], &[2], &Device::Cpu)?;
/// let loss = binary_cross_entropy(&p, &y, None, Reduction::Mean)?.item()?;
/// assert!((loss - (-(0.9f64.ln()) - 0.8f64.ln()) / 2.0).abs() < 1e-6);
/// # Ok(()) }
/// ```
pub fn binary_cross_entropy(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    let loss = pointwise(PointwiseLoss::Bce, input, target, weight, None)?;
    reduce(loss, reduction)
}

/// Binary cross-entropy on logits (PyTorch's `F.binary_cross_entropy_with_logits`), computed
/// in the stable form `(1 - t) x - (1 + (pw - 1) t) logsigmoid(x)`, which never overflows:
/// use it instead of `sigmoid` followed by [`binary_cross_entropy`]. `pos_weight` weighs the
/// positive term (e.g. `negatives / positives` per class for imbalanced labels) and `weight`
/// each element; both broadcast to the input's shape (a `pos_weight` of shape `[C]` applies per
/// class along the last dim) and get no gradient.
///
/// ```
/// use ferrite_tensor::functional::{binary_cross_entropy_with_logits, Reduction};
/// use ferrite_tensor::{Device, Tensor};
/// # fn main() -> Result<(), ferrite_tensor::TensorError> {
/// let logits = Tensor::from_vec(vec![0.0f32, 300.0], &[2], &Device::Cpu)?;
/// let y = Tensor::from_vec(vec![1.0f32, 0.0], &[2], &Device::Cpu)?;
/// let pos_weight = Tensor::from_vec(vec![2.0f32], &[1], &Device::Cpu)?;
/// let l = binary_cross_entropy_with_logits(&logits, &y, None, Some(&pos_weight), Reduction::None)?;
/// let v = l.to_vec::<f32>()?;
/// assert!((v[0] as f64 - 2.0 * 2f64.ln()).abs() < 1e-6); // 2 × ln 2 at logit 0
/// assert_eq!(v[1], 300.0); // finite where sigmoid(300) would round to 1
/// # Ok(()) }
/// ```
pub fn binary_cross_entropy_with_logits(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    pos_weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    let loss = pointwise(PointwiseLoss::BceWithLogits, input, target, weight, pos_weight)?;
    reduce(loss, reduction)
}

/// Smooth L1 loss (PyTorch's `F.smooth_l1_loss`): `0.5 d² / beta` where `|d| < beta`, else
/// `|d| - 0.5 beta`, with `d = input - target` (same shapes). `beta` 0 is the L1 loss; a
/// negative or non-finite `beta` is an error. Both `input` and `target` get gradients.
pub fn smooth_l1_loss(input: &Tensor, target: &Tensor, beta: f64, reduction: Reduction) -> Result<Tensor> {
    if !beta.is_finite() || beta < 0.0 {
        return Err(TensorError::invalid(
            "smooth_l1_loss",
            format!(
                "beta must be a finite number >= 0 (smooth_l1_loss does not support negative values for beta), got {beta}"
            ),
        ));
    }
    let loss = pointwise(PointwiseLoss::SmoothL1 { beta }, input, target, None, None)?;
    reduce(loss, reduction)
}

/// Huber loss (PyTorch's `F.huber_loss`): `0.5 d²` where `|d| < delta`, else
/// `delta (|d| - 0.5 delta)`. `delta` must be positive and finite. Equals
/// `delta * smooth_l1_loss(beta = delta)`.
///
/// ```
/// use ferrite_tensor::functional::{huber_loss, Reduction};
/// use ferrite_tensor::{Device, Tensor};
/// # fn main() -> Result<(), ferrite_tensor::TensorError> {
/// let x = Tensor::from_vec(vec![0.5f32, 3.0], &[2], &Device::Cpu)?;
/// let y = Tensor::from_vec(vec![0.0f32, 0.0], &[2], &Device::Cpu)?;
/// let l = huber_loss(&x, &y, 1.0, Reduction::None)?;
/// assert_eq!(l.to_vec::<f32>()?, vec![0.125, 2.5]); // quadratic near 0, linear beyond delta
/// assert!(huber_loss(&x, &y, 0.0, Reduction::Mean).is_err());
/// # Ok(()) }
/// ```
pub fn huber_loss(input: &Tensor, target: &Tensor, delta: f64, reduction: Reduction) -> Result<Tensor> {
    if !delta.is_finite() || delta <= 0.0 {
        return Err(TensorError::invalid(
            "huber_loss",
            format!(
                "delta must be a finite number > 0 (huber_loss does not support non-positive values for delta), got {delta}"
            ),
        ));
    }
    let loss = pointwise(PointwiseLoss::Huber { delta }, input, target, None, None)?;
    reduce(loss, reduction)
}

/// Kullback–Leibler divergence (PyTorch's `F.kl_div`): `input` holds log-probabilities, `target`
/// probabilities (or log-probabilities with `log_target`), same shapes; elementwise
/// `t (ln t - x)` (0 where t is 0). Use [`KlDivReduction::BatchMean`] for the divergence per
/// sample; `Mean` divides by every element, as PyTorch's default does.
///
/// ```
/// use ferrite_tensor::functional::{kl_div, KlDivReduction};
/// use ferrite_tensor::{Device, Tensor};
/// # fn main() -> Result<(), ferrite_tensor::TensorError> {
/// let q = Tensor::from_vec(vec![0.5f32, 0.5, 0.9, 0.1], &[2, 2], &Device::Cpu)?;
/// let kl = kl_div(&q.log()?, &q, KlDivReduction::BatchMean, false)?.item()?;
/// assert!(kl.abs() < 1e-7); // a distribution is at divergence 0 from itself
/// # Ok(()) }
/// ```
pub fn kl_div(input: &Tensor, target: &Tensor, reduction: KlDivReduction, log_target: bool) -> Result<Tensor> {
    let loss = pointwise(PointwiseLoss::KlDiv { log_target }, input, target, None, None)?;
    match reduction {
        KlDivReduction::None => Ok(loss),
        KlDivReduction::Mean => loss.mean(),
        KlDivReduction::Sum => loss.sum(),
        KlDivReduction::BatchMean => {
            let batch = input.shape().first().copied().unwrap_or(1);
            loss.sum()?.div_scalar(batch as f64)
        }
    }
}

fn reduce(loss: Tensor, reduction: Reduction) -> Result<Tensor> {
    match reduction {
        Reduction::None => Ok(loss),
        Reduction::Sum => loss.sum(),
        Reduction::Mean => loss.mean(),
    }
}

/// Validate, convert to the compute dtype, run the kernel and record the backward.
fn pointwise(
    op: PointwiseLoss,
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    pos_weight: Option<&Tensor>,
) -> Result<Tensor> {
    let name = op.name();
    if !input.dtype().is_floating_point() {
        return Err(TensorError::UnsupportedDType { op: name, dtype: input.dtype() });
    }
    if input.shape() != target.shape() {
        // As in PyTorch, the target's size must be the input's (loss targets are not broadcast).
        return Err(TensorError::InvalidShape {
            op: name,
            arg: "target",
            shape: target.shape().to_vec(),
            expected: ExpectedShape::Exact(input.shape().to_vec()),
        });
    }
    check_same_device(name, input, target)?;
    let dtype = crate::autocast::upper(input.dtype());
    let x = input.to_dtype(dtype)?;
    let t = target.to_dtype(dtype)?;
    let constant = |w: Option<&Tensor>, arg: &'static str| -> Result<Option<Tensor>> {
        let Some(w) = w else { return Ok(None) };
        check_same_device(name, input, w)?;
        let expected = ExpectedShape::BroadcastsTo(input.shape().to_vec());
        if !expected.admits(w.shape()) || w.layout().broadcast_to(input.shape(), name).is_err() {
            return Err(TensorError::InvalidShape { op: name, arg, shape: w.shape().to_vec(), expected });
        }
        Ok(Some(w.detach().to_dtype(dtype)?))
    };
    let w = constant(weight, "weight")?;
    let pw = constant(pos_weight, "pos_weight")?;
    let out = x.empty_like_shape(x.shape(), dtype)?;
    let operands = LossOperands { input: &x, target: &t, weight: w.as_ref(), pos_weight: pw.as_ref() };
    out.kernels().pointwise_loss(op, &out, operands)?;
    if !Tensor::needs_graph(&[&x, &t]) {
        return Ok(out);
    }
    let f = PointwiseLossBackward {
        op,
        x: SavedTensor::new(&x),
        t: SavedTensor::new(&t),
        w: w.as_ref().map(SavedTensor::new),
        pw: pw.as_ref().map(SavedTensor::new),
        need: [x.requires_grad(), t.requires_grad()],
    };
    Ok(Tensor::from_op1(out, &[&x, &t], f))
}

struct PointwiseLossBackward {
    op: PointwiseLoss,
    x: SavedTensor,
    t: SavedTensor,
    w: Option<SavedTensor>,
    pw: Option<SavedTensor>,
    need: [bool; 2],
}

impl BackwardFn for PointwiseLossBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(self.op.backward_name())
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None, None]) };
        let name = self.op.backward_name();
        let x = self.x.get(name)?;
        let t = self.t.get(name)?;
        let w = self.w.as_ref().map(|w| w.get(name)).transpose()?;
        let pw = self.pw.as_ref().map(|w| w.get(name)).transpose()?;
        let g = if g.dtype() == x.dtype() { g.clone() } else { g.to_dtype(x.dtype())? };
        let operands = LossOperands { input: x, target: t, weight: w, pos_weight: pw };
        let mut grads = Vec::with_capacity(2);
        for (need, wrt) in self.need.into_iter().zip([LossGrad::Input, LossGrad::Target]) {
            grads.push(if need {
                let out = x.empty_like_shape(x.shape(), x.dtype())?;
                out.kernels().pointwise_loss_backward(self.op, wrt, &out, &g, operands)?;
                Some(out)
            } else {
                None
            });
        }
        Ok(grads)
    }
}
