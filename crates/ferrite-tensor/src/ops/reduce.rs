//! Reductions over dimensions: sum, mean, max/min with indices, argmax/argmin, var.
//!
//! The op layer plans the reduction (which dims, the output shape) and the device's backend sums.
//! On the CPU backend floating-point sums accumulate in f64 and round once, so results match
//! PyTorch's cascaded f32 sums within 1 ulp-ish tolerances regardless of how the work is split
//! across threads; the GPU backend accumulates in f32 (`backend/gpu/reduce.rs`).

use std::borrow::Cow;

use smallvec::SmallVec;

use crate::autograd::{BackwardFn, SavedTensor};
use crate::error::{Result, TensorError};
use crate::layout::{Shape, normalize_dim};
use crate::ops::copy::materialize;
use crate::{DType, Tensor};

pub use crate::backend::Plan;

pub(crate) fn plan(x: &Tensor, dims: &[i64], keepdim: bool, op: &'static str) -> Result<Plan> {
    let rank = x.rank();
    let mut reduced: SmallVec<[bool; 6]> = SmallVec::from_elem(false, rank);
    if dims.is_empty() {
        reduced.iter_mut().for_each(|r| *r = true);
    }
    for &d in dims {
        let d = normalize_dim(d, rank, op)?;
        if rank == 0 {
            continue;
        }
        if reduced[d] {
            return Err(TensorError::invalid(op, format!("dim {d} appears multiple times in the list of dims")));
        }
        reduced[d] = true;
    }
    let l = x.layout();
    let mut order: SmallVec<[usize; 6]> = (0..rank).filter(|&d| !reduced[d]).collect();
    order.extend((0..rank).filter(|&d| reduced[d]));
    let permuted = l.permute(&order, op)?;
    let mut out_shape = Shape::new();
    let mut keep_shape = Shape::new();
    let mut rn = 1usize;
    for d in 0..rank {
        if reduced[d] {
            rn *= l.shape[d];
            keep_shape.push(1);
            if keepdim {
                out_shape.push(1);
            }
        } else {
            keep_shape.push(l.shape[d]);
            out_shape.push(l.shape[d]);
        }
    }
    Ok(Plan { out_shape, keep_shape, permuted, rn, reduced })
}

/// Sum (scaled) over `dims` without autograd. Integer and bool inputs sum to int64.
pub(crate) fn sum_raw(x: &Tensor, dims: &[i64], keepdim: bool, scale: f64, op: &'static str) -> Result<(Tensor, Plan)> {
    let p = plan(x, dims, keepdim, op)?;
    let out_dtype = if x.dtype().is_floating_point() { x.dtype() } else { DType::I64 };
    let out = x.empty_like_shape(&p.out_shape, out_dtype)?;
    if !x.dtype().is_floating_point() && scale != 1.0 {
        return Err(TensorError::UnsupportedDType { op, dtype: x.dtype() });
    }
    out.kernels().sum(&out, x, &p, scale)?;
    Ok((out, p))
}

struct SumBackward {
    in_shape: Shape,
    keep_shape: Shape,
    scale: f64,
    dtype: DType,
    name: &'static str,
}
impl BackwardFn for SumBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(self.name)
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None]) };
        let g = g.reshape_usize(&self.keep_shape)?;
        let g = if self.scale != 1.0 { g.mul_scalar(self.scale)? } else { g };
        let g = g.to_dtype(self.dtype)?;
        Ok(vec![Some(g.expand(&self.in_shape)?)])
    }
}

struct IndexReduceBackward {
    indices: SavedTensor,
    in_shape: Shape,
    dim: usize,
    keepdim: bool,
    dtype: DType,
    name: &'static str,
}
impl BackwardFn for IndexReduceBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(self.name)
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None]) };
        let idx = self.indices.get(self.name)?;
        let (g, idx) = if self.keepdim {
            (g.clone(), idx.clone())
        } else {
            (g.unsqueeze(self.dim as i64)?, idx.unsqueeze(self.dim as i64)?)
        };
        let z = crate::ops::creation::full_on(g.storage().allocator(), &self.in_shape, self.dtype, 0.0)?;
        let r = z.scatter_raw(self.dim, &idx, &g.to_dtype(self.dtype)?)?;
        Ok(vec![Some(r)])
    }
}

struct VarBackward {
    x: SavedTensor,
    dims: Vec<i64>,
    keep_shape: Shape,
    denom: f64,
}
impl BackwardFn for VarBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("VarBackward0")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None]) };
        let x = self.x.get("VarBackward0")?;
        let mean = x.mean_dims(&self.dims, true)?;
        let d = x.sub(&mean)?;
        let g = g.reshape_usize(&self.keep_shape)?;
        let r = d.mul(&g)?.mul_scalar(2.0 / self.denom)?;
        Ok(vec![Some(r)])
    }
}

impl Tensor {
    /// Sum of all elements (0-dim).
    pub fn sum(&self) -> Result<Tensor> {
        self.sum_dims(&[], false)
    }

    /// Sum over `dims` (empty = all).
    pub fn sum_dims(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        let (out, p) = sum_raw(self, dims, keepdim, 1.0, "sum")?;
        if !Tensor::needs_graph(&[self]) {
            return Ok(out);
        }
        Ok(Tensor::from_op1(
            out,
            &[self],
            SumBackward {
                in_shape: self.shape_vec(),
                keep_shape: p.keep_shape,
                scale: 1.0,
                dtype: self.dtype(),
                name: "SumBackward1",
            },
        ))
    }

    /// Mean of all elements (0-dim).
    pub fn mean(&self) -> Result<Tensor> {
        self.mean_dims(&[], false)
    }

    /// Mean over `dims` (empty = all). Floating-point only, like PyTorch.
    pub fn mean_dims(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        if !self.dtype().is_floating_point() {
            return Err(TensorError::UnsupportedDType { op: "mean", dtype: self.dtype() });
        }
        let p = plan(self, dims, keepdim, "mean")?;
        let scale = if p.rn == 0 { f64::NAN } else { 1.0 / p.rn as f64 };
        let (out, p) = sum_raw(self, dims, keepdim, scale, "mean")?;
        if !Tensor::needs_graph(&[self]) {
            return Ok(out);
        }
        Ok(Tensor::from_op1(
            out,
            &[self],
            SumBackward {
                in_shape: self.shape_vec(),
                keep_shape: p.keep_shape,
                scale,
                dtype: self.dtype(),
                name: "MeanBackward1",
            },
        ))
    }

    /// Sum a (broadcast) gradient down to `shape`: sums leading dims and dims where `shape` is 1.
    pub fn sum_to_shape(&self, shape: &[usize]) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        // Summing to `shape` undoes broadcasting `shape` to ours, so the error is the expand's.
        let not_summable =
            || TensorError::ExpandMismatch { op: "sum_to_shape", shape: shape.to_vec(), target: self.shape().to_vec() };
        let lead = self.rank().checked_sub(shape.len()).ok_or_else(not_summable)?;
        let mut dims: Vec<i64> = (0..lead as i64).collect();
        for (i, &d) in shape.iter().enumerate() {
            let s = self.shape()[lead + i];
            if d == 1 && s != 1 {
                dims.push((lead + i) as i64);
            } else if d != s {
                return Err(not_summable());
            }
        }
        let r = if dims.is_empty() { self.clone() } else { self.sum_dims(&dims, true)? };
        r.reshape_usize(shape)
    }

    fn index_reduce(
        &self,
        dim: i64,
        keepdim: bool,
        is_max: bool,
        with_values: bool,
        op: &'static str,
    ) -> Result<(Option<Tensor>, Tensor)> {
        let d = normalize_dim(dim, self.rank(), op)?;
        if self.rank() > 0 && self.shape()[d] == 0 {
            return Err(TensorError::EmptyReduction { op, dim: d, shape: self.shape().to_vec() });
        }
        let p = plan(self, &[dim], keepdim, op)?;
        let idx = self.empty_like_shape(&p.out_shape, DType::I64)?;
        let vals = if with_values { Some(self.empty_like_shape(&p.out_shape, self.dtype())?) } else { None };
        idx.kernels().arg_extreme(self, &p, vals.as_ref(), &idx, is_max)?;
        Ok((vals, idx))
    }

    /// Maximum over `dim`: (values, int64 indices), like `torch.max(x, dim)`.
    pub fn max_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        self.minmax_dim(dim, keepdim, true)
    }

    /// Minimum over `dim`: (values, int64 indices).
    pub fn min_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        self.minmax_dim(dim, keepdim, false)
    }

    fn minmax_dim(&self, dim: i64, keepdim: bool, is_max: bool) -> Result<(Tensor, Tensor)> {
        let op = if is_max { "max" } else { "min" };
        if self.rank() == 0 {
            // PyTorch: the value itself and index 0.
            normalize_dim(dim, 0, op)?;
            let idx = crate::ops::creation::full_on(self.storage().allocator(), &[], DType::I64, 0.0)?;
            return Ok((self.deep_clone()?, idx));
        }
        let (vals, idx) = self.index_reduce(dim, keepdim, is_max, true, op)?;
        let vals = vals.ok_or_else(|| TensorError::invalid(op, "internal: values missing"))?;
        if !Tensor::needs_graph(&[self]) {
            return Ok((vals, idx));
        }
        let d = normalize_dim(dim, self.rank(), op)?;
        let f = IndexReduceBackward {
            indices: SavedTensor::new(&idx),
            in_shape: self.shape_vec(),
            dim: d,
            keepdim,
            dtype: self.dtype(),
            name: if is_max { "MaxBackward0" } else { "MinBackward0" },
        };
        let vals = Tensor::from_op1(vals, &[self], f);
        Ok((vals, idx))
    }

    /// Maximum of all elements (0-dim).
    pub fn max(&self) -> Result<Tensor> {
        let flat = self.reshape(&[-1])?;
        Ok(flat.max_dim(0, false)?.0)
    }

    /// Minimum of all elements (0-dim).
    pub fn min(&self) -> Result<Tensor> {
        let flat = self.reshape(&[-1])?;
        Ok(flat.min_dim(0, false)?.0)
    }

    /// Index of the maximum over `dim` (int64).
    pub fn argmax(&self, dim: i64, keepdim: bool) -> Result<Tensor> {
        Ok(self.index_reduce(dim, keepdim, true, false, "argmax")?.1)
    }

    /// Index of the minimum over `dim` (int64).
    pub fn argmin(&self, dim: i64, keepdim: bool) -> Result<Tensor> {
        Ok(self.index_reduce(dim, keepdim, false, false, "argmin")?.1)
    }

    /// Variance over `dims` with Bessel's `correction` (1 = unbiased, PyTorch's default).
    pub fn var_dims(&self, dims: &[i64], correction: usize, keepdim: bool) -> Result<Tensor> {
        if !self.dtype().is_floating_point() {
            return Err(TensorError::UnsupportedDType { op: "var", dtype: self.dtype() });
        }
        let p = plan(self, dims, keepdim, "var")?;
        let denom = p.rn as f64 - correction as f64;
        let out = self.empty_like_shape(&p.out_shape, self.dtype())?;
        out.kernels().var(&out, self, &p, denom)?;
        if !Tensor::needs_graph(&[self]) {
            return Ok(out);
        }
        let f = VarBackward { x: SavedTensor::new(self), dims: dims.to_vec(), keep_shape: p.keep_shape, denom };
        Ok(Tensor::from_op1(out, &[self], f))
    }

    /// Materialise as `dtype` without autograd (helper for kernels in other crates).
    pub fn to_dtype_detached(&self, dtype: DType) -> Result<Tensor> {
        materialize(self, dtype)
    }
}
