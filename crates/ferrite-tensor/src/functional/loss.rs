//! Losses of `torch.nn.functional`: cross-entropy (class indices, ignore_index, label smoothing,
//! class weights), negative log-likelihood and mean squared error. They share one [`Reduction`]
//! and one options type, so `ferrite-nn`'s loss modules are thin wrappers over them.

use crate::error::{ExpectedShape, Result, TensorError};
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
