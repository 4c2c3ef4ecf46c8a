//! softmax and log_softmax over a dimension (f32 under autocast).

use std::borrow::Cow;

use crate::Tensor;
use crate::autograd::{BackwardFn, SavedTensor};
use crate::error::Result;
use crate::layout::normalize_dim;
use crate::ops::copy::materialize;

/// Move `dim` last and make contiguous; returns the prepared tensor and the permutation used.
fn to_rows(x: &Tensor, dim: usize) -> Result<(Tensor, Option<Vec<usize>>)> {
    let r = x.rank();
    if r == 0 || dim == r - 1 {
        let c = if x.is_contiguous() { x.clone() } else { materialize(x, x.dtype())? };
        return Ok((c, None));
    }
    let mut perm: Vec<usize> = (0..r).filter(|&d| d != dim).collect();
    perm.push(dim);
    let p = x.view_with_layout(x.layout().permute(&perm, "softmax")?);
    Ok((materialize(&p, x.dtype())?, Some(perm)))
}

fn from_rows(y: Tensor, perm: Option<Vec<usize>>) -> Result<Tensor> {
    match perm {
        None => Ok(y),
        Some(p) => {
            let mut inv = vec![0; p.len()];
            for (i, &d) in p.iter().enumerate() {
                inv[d] = i;
            }
            Ok(y.view_with_layout(y.layout().permute(&inv, "softmax")?))
        }
    }
}

pub(crate) fn softmax_raw(x: &Tensor, dim: usize, log: bool) -> Result<Tensor> {
    let (xc, perm) = to_rows(x, dim)?;
    let out = xc.empty_like_shape(xc.shape(), xc.dtype())?;
    out.kernels().softmax(&out, &xc, log)?;
    from_rows(out, perm)
}

/// Backward rows: softmax: y*(g - Σ g*y); log_softmax: g - exp(y)*Σ g.
fn softmax_grad_raw(g: &Tensor, y: &Tensor, dim: usize, log: bool) -> Result<Tensor> {
    let g = if g.dtype() != y.dtype() { materialize(g, y.dtype())? } else { g.clone() };
    let (gc, perm) = to_rows(&g, dim)?;
    let (yc, _) = to_rows(y, dim)?;
    let out = gc.empty_like_shape(gc.shape(), gc.dtype())?;
    out.kernels().softmax_backward(&out, &gc, &yc, log)?;
    from_rows(out, perm)
}

struct SoftmaxBackward {
    y: SavedTensor,
    dim: usize,
    log: bool,
}
impl BackwardFn for SoftmaxBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(if self.log { "LogSoftmaxBackward0" } else { "SoftmaxBackward0" })
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None]) };
        let y = self.y.get(self.name())?;
        Ok(vec![Some(softmax_grad_raw(g, y, self.dim, self.log)?)])
    }
}

fn apply(x: &Tensor, dim: i64, log: bool) -> Result<Tensor> {
    let d = normalize_dim(dim, x.rank(), if log { "log_softmax" } else { "softmax" })?;
    let up = crate::autocast::upper(x.dtype());
    let x = if up != x.dtype() { x.to_dtype(up)? } else { x.clone() };
    let x = if x.dtype().is_floating_point() { x } else { x.to_dtype(crate::DType::F32)? };
    let out = softmax_raw(&x, d, log)?;
    if !Tensor::needs_graph(&[&x]) {
        return Ok(out);
    }
    Ok(Tensor::from_op1(out.clone(), &[&x], SoftmaxBackward { y: SavedTensor::new(&out), dim: d, log }))
}

impl Tensor {
    /// Softmax over `dim` (computed in f32 under autocast).
    pub fn softmax(&self, dim: i64) -> Result<Tensor> {
        apply(self, dim, false)
    }

    /// Log-softmax over `dim`, numerically stable (computed in f32 under autocast).
    pub fn log_softmax(&self, dim: i64) -> Result<Tensor> {
        apply(self, dim, true)
    }
}
