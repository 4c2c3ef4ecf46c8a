//! Joining and indexing: cat, stack, index_select, gather, scatter_add, where_cond, masked_fill,
//! one_hot. Index values are checked by the device's backend: the CPU as it reads them, the GPU
//! through its error flag, reported at the next synchronisation.

use std::borrow::Cow;

use crate::autograd::{BackwardFn, SavedTensor};
use crate::backend::INDEX_DTYPES;
use crate::error::{ExpectedShape, Result, TensorError};
use crate::layout::{Shape, broadcast_shapes, normalize_dim};
use crate::ops::copy::{copy_into, materialize};
use crate::ops::{check_same_device, promote_types};
use crate::{DType, Tensor};

/// The dtypes an index tensor of `gather`/`scatter_add` may have (PyTorch's: no uint8).
const GATHER_INDEX_DTYPES: &[DType] = &[DType::I64, DType::I32];

/// Error unless `index` holds integers a kernel can index with.
pub(crate) fn check_index_dtype(index: &Tensor, op: &'static str) -> Result<()> {
    if INDEX_DTYPES.contains(&index.dtype()) {
        Ok(())
    } else {
        Err(TensorError::InvalidDType { op, arg: "index", dtype: index.dtype(), expected: INDEX_DTYPES })
    }
}

/// An index tensor as int64 (a handle clone when it already is).
fn as_i64(index: &Tensor) -> Result<Tensor> {
    if index.dtype() == DType::I64 { Ok(index.clone()) } else { materialize(index, DType::I64) }
}

struct CatBackward {
    dim: usize,
    sizes: Vec<usize>,
}
impl BackwardFn for CatBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("CatBackward0")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None; self.sizes.len()]) };
        let mut out = Vec::with_capacity(self.sizes.len());
        let mut s = 0;
        for &n in &self.sizes {
            out.push(Some(g.narrow(self.dim as i64, s, n)?));
            s += n;
        }
        Ok(out)
    }
}

struct IndexSelectBackward {
    dim: usize,
    index: SavedTensor,
    in_shape: Shape,
}
impl BackwardFn for IndexSelectBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("IndexSelectBackward0")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None]) };
        let idx = self.index.get("IndexSelectBackward0")?;
        let z = crate::ops::creation::full_on(g.storage().allocator(), &self.in_shape, g.dtype(), 0.0)?;
        z.index_add_raw(self.dim, idx, g)?;
        Ok(vec![Some(z)])
    }
}

struct GatherBackward {
    dim: usize,
    index: SavedTensor,
    in_shape: Shape,
}
impl BackwardFn for GatherBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("GatherBackward0")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None]) };
        let idx = self.index.get("GatherBackward0")?;
        let z = crate::ops::creation::full_on(g.storage().allocator(), &self.in_shape, g.dtype(), 0.0)?;
        Ok(vec![Some(z.scatter_raw(self.dim, idx, g)?)])
    }
}

struct WhereBackward {
    cond: SavedTensor,
    a: (Shape, DType),
    b: (Shape, DType),
    /// Which of `a`, `b` need a gradient (a constant fill value gets none).
    need: [bool; 2],
}
impl BackwardFn for WhereBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("WhereBackward0")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None, None]) };
        let c = self.cond.get("WhereBackward0")?;
        let zero = crate::ops::creation::full_on(g.storage().allocator(), &[], g.dtype(), 0.0)?;
        let ga = if self.need[0] {
            let ga = Tensor::where_raw(c, g, &zero)?;
            Some(crate::ops::binary::reduce_grad(&ga, &self.a.0, self.a.1)?)
        } else {
            None
        };
        let gb = if self.need[1] {
            let gb = Tensor::where_raw(c, &zero, g)?;
            Some(crate::ops::binary::reduce_grad(&gb, &self.b.0, self.b.1)?)
        } else {
            None
        };
        Ok(vec![ga, gb])
    }
}

impl Tensor {
    /// Concatenate along `dim`. All tensors must agree on the other dims and the device.
    pub fn cat(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
        let first =
            tensors.first().ok_or_else(|| TensorError::invalid("cat", "expected a non-empty list of tensors"))?;
        let rank = first.rank();
        if rank == 0 {
            return Err(TensorError::InvalidShape {
                op: "cat",
                arg: "tensors[0]",
                shape: Vec::new(),
                expected: ExpectedShape::MinRank(1),
            });
        }
        let d = normalize_dim(dim, rank, "cat")?;
        let mut dtype = first.dtype();
        let mut shape: Shape = first.shape_vec();
        shape[d] = 0;
        for (i, t) in tensors.iter().enumerate() {
            check_same_device("cat", first, t)?;
            if t.rank() != rank || (0..rank).any(|k| k != d && t.shape()[k] != first.shape()[k]) {
                return Err(TensorError::CatShapeMismatch {
                    op: "cat",
                    dim: Some(d),
                    first: first.shape().to_vec(),
                    index: i,
                    shape: t.shape().to_vec(),
                });
            }
            shape[d] += t.shape()[d];
            dtype = promote_types(dtype, t.dtype());
        }
        let out = first.empty_like_shape(&shape, dtype)?;
        let mut s = 0;
        for t in tensors {
            let n = t.shape()[d];
            if n > 0 {
                let region = out.view_with_layout(out.layout().narrow(d, s, n, "cat")?);
                copy_into(&region, t)?;
            }
            s += n;
        }
        if !Tensor::needs_graph(tensors) {
            return Ok(out);
        }
        let sizes = tensors.iter().map(|t| t.shape()[d]).collect();
        Ok(Tensor::from_op1(out, tensors, CatBackward { dim: d, sizes }))
    }

    /// Stack along a new dimension `dim`.
    pub fn stack(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
        let first =
            tensors.first().ok_or_else(|| TensorError::invalid("stack", "expected a non-empty list of tensors"))?;
        let d = normalize_dim(dim, first.rank() + 1, "stack")?;
        for (i, t) in tensors.iter().enumerate() {
            if t.shape() != first.shape() {
                return Err(TensorError::CatShapeMismatch {
                    op: "stack",
                    dim: None,
                    first: first.shape().to_vec(),
                    index: i,
                    shape: t.shape().to_vec(),
                });
            }
        }
        let u: Vec<Tensor> = tensors.iter().map(|t| t.unsqueeze(d as i64)).collect::<Result<_>>()?;
        let r: Vec<&Tensor> = u.iter().collect();
        Tensor::cat(&r, d as i64)
    }

    /// Rows (entries of `dim`) picked by a 1-D index tensor.
    pub fn index_select(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        let d = normalize_dim(dim, self.rank(), "index_select")?;
        if self.rank() == 0 {
            // A 0-dim tensor indexes like a 1-element vector (through a recorded reshape, so
            // backward sees ordinary shapes).
            return self.reshape_usize(&[1])?.index_select(0, index);
        }
        if index.rank() > 1 {
            return Err(TensorError::InvalidShape {
                op: "index_select",
                arg: "index",
                shape: index.shape().to_vec(),
                expected: ExpectedShape::MaxRank(1),
            });
        }
        check_same_device("index_select", self, index)?;
        check_index_dtype(index, "index_select")?;
        let mut shape = self.shape_vec();
        shape[d] = index.numel();
        let out = self.empty_like_shape(&shape, self.dtype())?;
        out.kernels().index_select(&out, self, d, index)?;
        if !Tensor::needs_graph(&[self]) {
            return Ok(out);
        }
        Ok(Tensor::from_op1(
            out,
            &[self],
            IndexSelectBackward { dim: d, index: SavedTensor::new(index), in_shape: self.shape_vec() },
        ))
    }

    /// In place: `self.select(dim, index[i]) += src.select(dim, i)` (no autograd).
    pub(crate) fn index_add_raw(&self, dim: usize, index: &Tensor, src: &Tensor) -> Result<()> {
        check_index_dtype(index, "index_add")?;
        let src = if src.dtype() != self.dtype() { materialize(src, self.dtype())? } else { src.clone() };
        self.kernels().index_add(self, dim, index, &src)
    }

    fn check_gather_shapes(&self, dim: usize, index: &Tensor, op: &'static str) -> Result<()> {
        let expected = ExpectedShape::NoLargerThan { shape: self.shape().to_vec(), except_dim: Some(dim) };
        if !expected.admits(index.shape()) {
            return Err(TensorError::InvalidShape { op, arg: "index", shape: index.shape().to_vec(), expected });
        }
        if !GATHER_INDEX_DTYPES.contains(&index.dtype()) {
            return Err(TensorError::InvalidDType {
                op,
                arg: "index",
                dtype: index.dtype(),
                expected: GATHER_INDEX_DTYPES,
            });
        }
        Ok(())
    }

    /// `out[..i..] = self[.. index[..i..] ..]` along `dim` (PyTorch's `gather`).
    pub fn gather(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        let d = normalize_dim(dim, self.rank(), "gather")?;
        self.check_gather_shapes(d, index, "gather")?;
        check_same_device("gather", self, index)?;
        if self.rank() == 0 {
            // 0-dim input and index: index like 1-element vectors.
            return self.reshape_usize(&[1])?.gather(0, &index.reshape_usize(&[1])?)?.reshape_usize(&[]);
        }
        let out = self.empty_like_shape(index.shape(), self.dtype())?;
        let idx = as_i64(index)?;
        if out.numel() > 0 {
            out.kernels().gather(&out, self, d, &idx)?;
        }
        if !Tensor::needs_graph(&[self]) {
            return Ok(out);
        }
        Ok(Tensor::from_op1(
            out,
            &[self],
            GatherBackward { dim: d, index: SavedTensor::new(index), in_shape: self.shape_vec() },
        ))
    }

    /// Out of place: a copy of `self` with `src` added at `index` along `dim` (scatter_add, no
    /// autograd). Used by gather/max backward.
    pub(crate) fn scatter_raw(&self, dim: usize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        self.check_gather_shapes(dim, index, "scatter_add")?;
        check_same_device("scatter_add", self, index)?;
        check_same_device("scatter_add", self, src)?;
        let expected = ExpectedShape::NoLargerThan { shape: src.shape().to_vec(), except_dim: None };
        if !expected.admits(index.shape()) {
            return Err(TensorError::InvalidShape {
                op: "scatter_add",
                arg: "index",
                shape: index.shape().to_vec(),
                expected,
            });
        }
        if self.rank() == 0 {
            let one = |t: &Tensor| t.reshape_usize(&[1]);
            return self.reshape_usize(&[1])?.scatter_raw(0, &one(index)?, &one(src)?)?.reshape_usize(&[]);
        }
        let out = materialize(self, self.dtype())?;
        let idx = as_i64(index)?;
        let src = if src.dtype() != self.dtype() { materialize(src, self.dtype())? } else { src.clone() };
        if index.numel() > 0 {
            out.kernels().scatter_add(&out, dim, &idx, &src)?;
        }
        Ok(out)
    }

    /// Differentiable scatter-add along `dim` (out of place).
    pub fn scatter_add(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        let d = normalize_dim(dim, self.rank(), "scatter_add")?;
        let out = self.scatter_raw(d, index, src)?;
        if !Tensor::needs_graph(&[self, src]) {
            return Ok(out);
        }
        struct ScatterAddBackward {
            dim: usize,
            index: SavedTensor,
        }
        impl BackwardFn for ScatterAddBackward {
            fn name(&self) -> Cow<'static, str> {
                Cow::Borrowed("ScatterAddBackward0")
            }
            fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
                let Some(g) = &g[0] else { return Ok(vec![None, None]) };
                let idx = self.index.get("ScatterAddBackward0")?;
                Ok(vec![Some(g.clone()), Some(g.gather(self.dim as i64, idx)?)])
            }
        }
        Ok(Tensor::from_op1(out, &[self, src], ScatterAddBackward { dim: d, index: SavedTensor::new(index) }))
    }

    pub(crate) fn where_raw(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        check_same_device("where", a, b)?;
        check_same_device("where", cond, a)?;
        let shape = broadcast_shapes(cond.shape(), a.shape(), "where")?;
        let shape = broadcast_shapes(&shape, b.shape(), "where")?;
        let dtype = promote_types(a.dtype(), b.dtype());
        let a = if a.dtype() != dtype { materialize(a, dtype)? } else { a.clone() };
        let b = if b.dtype() != dtype { materialize(b, dtype)? } else { b.clone() };
        let c = if cond.dtype() != DType::Bool { cond.ne_scalar(0.0)? } else { cond.clone() };
        let out = a.empty_like_shape(&shape, dtype)?;
        out.kernels().where_cond(&out, &c, &a, &b)?;
        Ok(out)
    }

    /// `cond ? a : b` elementwise with broadcasting: PyTorch's `torch.where` (`where` is a Rust
    /// keyword, and a trailing `_` means in place here).
    pub fn where_cond(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let out = Tensor::where_raw(cond, a, b)?;
        if !Tensor::needs_graph(&[a, b]) {
            return Ok(out);
        }
        let f = WhereBackward {
            cond: SavedTensor::new(cond),
            a: (a.shape_vec(), a.dtype()),
            b: (b.shape_vec(), b.dtype()),
            need: [a.requires_grad(), b.requires_grad()],
        };
        Ok(Tensor::from_op1(out, &[a, b], f))
    }

    /// `value` where `mask` is true, else `self` (out of place).
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Result<Tensor> {
        let v = crate::ops::creation::full_on(self.storage().allocator(), &[], self.dtype(), value)?;
        let out = Tensor::where_raw(mask, &v, self)?;
        if out.shape() != self.shape() {
            return Err(TensorError::ExpandMismatch {
                op: "masked_fill",
                shape: mask.shape().to_vec(),
                target: self.shape().to_vec(),
            });
        }
        if !Tensor::needs_graph(&[self]) {
            return Ok(out);
        }
        struct MaskedFillBackward {
            mask: SavedTensor,
        }
        impl BackwardFn for MaskedFillBackward {
            fn name(&self) -> Cow<'static, str> {
                Cow::Borrowed("MaskedFillBackward0")
            }
            fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
                let Some(g) = &g[0] else { return Ok(vec![None]) };
                let m = self.mask.get("MaskedFillBackward0")?;
                let zero = crate::ops::creation::full_on(g.storage().allocator(), &[], g.dtype(), 0.0)?;
                Ok(vec![Some(Tensor::where_raw(m, &zero, g)?)])
            }
        }
        Ok(Tensor::from_op1(out, &[self], MaskedFillBackward { mask: SavedTensor::new(mask) }))
    }

    /// One-hot encoding of an integer tensor (int64 output with a trailing class dim).
    pub fn one_hot(&self, num_classes: usize) -> Result<Tensor> {
        check_index_dtype(self, "one_hot")?;
        let mut shape = self.shape_vec();
        shape.push(num_classes);
        let out = crate::ops::creation::full_on(self.storage().allocator(), &shape, DType::I64, 0.0)?;
        out.kernels().one_hot(&out, &self.reshape_usize(&[self.numel()])?)?;
        Ok(out)
    }
}
