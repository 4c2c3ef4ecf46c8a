//! Normalisation layers' functional forms. Layer norm runs as one kernel of the device's backend
//! (`KernelBackend::layer_norm`) that also writes the per-row mean and rstd, which the backward saves
//! instead of recomputing them; a composition of ops would keep `[rows, cols]` temporaries alive.

use std::borrow::Cow;

use crate::autograd::{BackwardFn, SavedTensor};
use crate::error::{ExpectedShape, Result, TensorError};
use crate::layout::Shape;
use crate::ops::copy::materialize;
use crate::{DType, Tensor};

struct LayerNormBackward {
    x: SavedTensor,
    mean: SavedTensor,
    rstd: SavedTensor,
    weight: Option<SavedTensor>,
    has_bias: bool,
    cols: usize,
    need: [bool; 3],
}

impl BackwardFn for LayerNormBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("NativeLayerNormBackward0")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let n_in = 1 + self.weight.is_some() as usize + self.has_bias as usize;
        let Some(g) = &g[0] else { return Ok(vec![None; n_in]) };
        let x = self.x.get("NativeLayerNormBackward0")?;
        let mean = self.mean.get("NativeLayerNormBackward0")?;
        let rstd = self.rstd.get("NativeLayerNormBackward0")?;
        let w = match &self.weight {
            Some(w) => Some(w.get("NativeLayerNormBackward0")?.clone()),
            None => None,
        };
        let cols = self.cols;
        let rows = x.numel().checked_div(cols).unwrap_or(0);
        let g = materialize(g, x.dtype())?;
        let xc = if x.is_contiguous() { x.clone() } else { materialize(x, x.dtype())? };
        // xhat = (x - mean) * rstd, rows x cols
        let x2 = xc.reshape_usize(&[rows, cols])?;
        let xhat = x2.sub(&mean.reshape_usize(&[rows, 1])?)?.mul(&rstd.reshape_usize(&[rows, 1])?)?;
        let g2 = g.reshape_usize(&[rows, cols])?;
        let mut out: Vec<Option<Tensor>> = Vec::with_capacity(n_in);
        if self.need[0] {
            let dyw = match &w {
                Some(w) => g2.mul(&w.reshape_usize(&[cols])?)?,
                None => g2.clone(),
            };
            // dx = rstd * (dyw - mean(dyw) - xhat * mean(dyw * xhat))
            let m1 = dyw.mean_dims(&[1], true)?;
            let m2 = dyw.mul(&xhat)?.mean_dims(&[1], true)?;
            let dx = dyw.sub(&m1)?.sub(&xhat.mul(&m2)?)?.mul(&rstd.reshape_usize(&[rows, 1])?)?;
            out.push(Some(dx.reshape_usize(x.shape())?));
        } else {
            out.push(None);
        }
        if let Some(w) = &w {
            out.push(if self.need[1] {
                Some(g2.mul(&xhat)?.sum_dims(&[0], false)?.reshape_usize(w.shape())?)
            } else {
                None
            });
        }
        if self.has_bias {
            let shape: Shape = match &w {
                Some(w) => w.shape_vec(),
                None => Shape::from_slice(&[cols]),
            };
            out.push(if self.need[2] { Some(g2.sum_dims(&[0], false)?.reshape_usize(&shape)?) } else { None });
        }
        Ok(out)
    }
}

/// Layer normalisation over the trailing `normalized_shape` dims (PyTorch's `F.layer_norm`),
/// computed in f32 under autocast.
pub fn layer_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    if normalized_shape.is_empty() {
        return Err(TensorError::InvalidShape {
            op: "layer_norm",
            arg: "normalized_shape",
            shape: Vec::new(),
            expected: ExpectedShape::MinRank(1),
        });
    }
    let trailing = ExpectedShape::Trailing(normalized_shape.to_vec());
    if !trailing.admits(x.shape()) {
        return Err(TensorError::InvalidShape {
            op: "layer_norm",
            arg: "input",
            shape: x.shape().to_vec(),
            expected: trailing,
        });
    }
    for (arg, p) in [("weight", weight), ("bias", bias)] {
        if let Some(p) = p
            && p.shape() != normalized_shape
        {
            return Err(TensorError::InvalidShape {
                op: "layer_norm",
                arg,
                shape: p.shape().to_vec(),
                expected: ExpectedShape::Exact(normalized_shape.to_vec()),
            });
        }
    }
    let dtype = crate::autocast::upper(x.dtype());
    let x = x.to_dtype(dtype)?;
    if !dtype.is_floating_point() {
        return Err(TensorError::UnsupportedDType { op: "layer_norm", dtype });
    }
    let cols: usize = normalized_shape.iter().product();
    let rows = x.numel().checked_div(cols).unwrap_or(0);
    let xc = if x.is_contiguous() { x.clone() } else { materialize(&x, dtype)? };
    let y = xc.empty_like_shape(x.shape(), dtype)?;
    let mean = xc.empty_like_shape(&[rows], DType::F32)?;
    let rstd = xc.empty_like_shape(&[rows], DType::F32)?;
    let wt = weight.map(|w| w.to_dtype(dtype)).transpose()?;
    let bt = bias.map(|b| b.to_dtype(dtype)).transpose()?;
    if rows > 0 {
        // The kernels see `[rows, cols]` views of the contiguous input and output.
        let rows_view = |t: &Tensor| t.contiguous_view_as(&[rows, cols]);
        let flat = |t: &Tensor| -> Result<Tensor> {
            let c = if t.is_contiguous() { t.clone() } else { materialize(t, t.dtype())? };
            Ok(c.contiguous_view_as(&[cols]))
        };
        let w2 = wt.as_ref().map(flat).transpose()?;
        let b2 = bt.as_ref().map(flat).transpose()?;
        y.kernels().layer_norm(&rows_view(&y), &mean, &rstd, &rows_view(&xc), w2.as_ref(), b2.as_ref(), eps)?;
    }
    let mut inputs: Vec<&Tensor> = vec![&x];
    if let Some(w) = &wt {
        inputs.push(w);
    }
    if let Some(b) = &bt {
        inputs.push(b);
    }
    if !Tensor::needs_graph(&inputs) {
        return Ok(y);
    }
    let f = LayerNormBackward {
        x: SavedTensor::new(&xc),
        mean: SavedTensor::new(&mean),
        rstd: SavedTensor::new(&rstd),
        weight: wt.as_ref().map(SavedTensor::new),
        has_bias: bt.is_some(),
        cols,
        need: [
            x.requires_grad(),
            wt.as_ref().is_some_and(|w| w.requires_grad()),
            bt.as_ref().is_some_and(|b| b.requires_grad()),
        ],
    };
    Ok(Tensor::from_op1(y, &inputs, f))
}
