//! Views: new layouts over the same storage (no copy), each with its backward.

use std::borrow::Cow;

use smallvec::SmallVec;

use crate::Tensor;
use crate::autograd::BackwardFn;
use crate::error::{ExpectedShape, Result, TensorError};
use crate::layout::{Shape, infer_shape, normalize_dim};
use crate::ops::copy::{copy_into, materialize};

enum ViewKind {
    Reshape(Shape),
    Permute(SmallVec<[usize; 6]>),
    Expand(Shape),
    /// The input's shape and the region (dim, start, len, step) this view selected.
    Slice {
        in_shape: Shape,
        dim: usize,
        start: usize,
        len: usize,
        step: usize,
    },
    Select {
        in_shape: Shape,
        dim: usize,
        index: usize,
    },
}

struct ViewBackward {
    kind: ViewKind,
    name: &'static str,
}

impl BackwardFn for ViewBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(self.name)
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None]) };
        let r = match &self.kind {
            ViewKind::Reshape(s) => g.reshape_usize(s)?,
            ViewKind::Permute(p) => {
                let mut inv: SmallVec<[usize; 6]> = SmallVec::from_elem(0, p.len());
                for (i, &d) in p.iter().enumerate() {
                    inv[d] = i;
                }
                g.permute_usize(&inv)?
            }
            ViewKind::Expand(s) => g.sum_to_shape(s)?,
            ViewKind::Slice { in_shape, dim, start, len, step } => {
                let z = crate::ops::creation::full_on(g.storage().allocator(), in_shape, g.dtype(), 0.0)?;
                let region = z.slice_layout(*dim, *start, *len, *step)?;
                copy_into(&region, g)?;
                z
            }
            ViewKind::Select { in_shape, dim, index } => {
                let z = crate::ops::creation::full_on(g.storage().allocator(), in_shape, g.dtype(), 0.0)?;
                let region = z.view_with_layout(z.layout().select(*dim, *index));
                copy_into(&region, g)?;
                z
            }
        };
        Ok(vec![Some(r)])
    }
}

impl Tensor {
    fn record_view(&self, out: Tensor, kind: ViewKind, name: &'static str) -> Tensor {
        if !Tensor::needs_graph(&[self]) {
            return out;
        }
        Tensor::from_op1(out, &[self], ViewBackward { kind, name })
    }

    /// Swap two dimensions (a view).
    pub fn transpose(&self, d0: i64, d1: i64) -> Result<Tensor> {
        let r = self.rank();
        if r == 0 {
            return Ok(self.clone());
        }
        let a = normalize_dim(d0, r, "transpose")?;
        let b = normalize_dim(d1, r, "transpose")?;
        let mut perm: SmallVec<[usize; 6]> = (0..r).collect();
        perm.swap(a, b);
        let out = self.view_with_layout(self.layout().transpose(a, b));
        Ok(self.record_view(out, ViewKind::Permute(perm), "TransposeBackward0"))
    }

    /// Transpose of a matrix (rank ≤ 2).
    pub fn t(&self) -> Result<Tensor> {
        match self.rank() {
            0 | 1 => Ok(self.clone()),
            2 => self.transpose(0, 1),
            _ => Err(TensorError::InvalidShape {
                op: "t",
                arg: "self",
                shape: self.shape().to_vec(),
                expected: ExpectedShape::MaxRank(2),
            }),
        }
    }

    /// Reorder dimensions (a view). Negative dims allowed.
    pub fn permute(&self, dims: &[i64]) -> Result<Tensor> {
        let r = self.rank();
        let d: Result<SmallVec<[usize; 6]>> = dims.iter().map(|&d| normalize_dim(d, r, "permute")).collect();
        self.permute_usize(&d?)
    }

    pub(crate) fn permute_usize(&self, dims: &[usize]) -> Result<Tensor> {
        let l = self.layout().permute(dims, "permute")?;
        let out = self.view_with_layout(l);
        Ok(self.record_view(out, ViewKind::Permute(SmallVec::from_slice(dims)), "PermuteBackward0"))
    }

    /// Elements `start..start+len` of `dim` (a view).
    pub fn narrow(&self, dim: i64, start: usize, len: usize) -> Result<Tensor> {
        let d = normalize_dim(dim, self.rank(), "narrow")?;
        if self.rank() == 0 {
            return Err(TensorError::InvalidShape {
                op: "narrow",
                arg: "self",
                shape: Vec::new(),
                expected: ExpectedShape::MinRank(1),
            });
        }
        let l = self.layout().narrow(d, start, len, "narrow")?;
        let out = self.view_with_layout(l);
        Ok(self.record_view(
            out,
            ViewKind::Slice { in_shape: self.shape_vec(), dim: d, start, len, step: 1 },
            "NarrowBackward0",
        ))
    }

    /// Python-style slice `start..end` with `step` on `dim` (a view). Bounds are clamped like
    /// Python's; negative start/end count from the end.
    pub fn slice(&self, dim: i64, start: i64, end: i64, step: usize) -> Result<Tensor> {
        if step == 0 {
            return Err(TensorError::invalid("slice", "slice step must be positive"));
        }
        let d = normalize_dim(dim, self.rank(), "slice")?;
        if self.rank() == 0 {
            return Err(TensorError::InvalidShape {
                op: "slice",
                arg: "self",
                shape: Vec::new(),
                expected: ExpectedShape::MinRank(1),
            });
        }
        let size = self.shape()[d] as i64;
        let clamp = |v: i64| -> usize { (if v < 0 { v + size } else { v }).clamp(0, size) as usize };
        let (s, e) = (clamp(start), clamp(end));
        let len = if e > s { (e - s).div_ceil(step) } else { 0 };
        let out = self.slice_layout(d, s, len, step)?;
        Ok(self.record_view(
            out,
            ViewKind::Slice { in_shape: self.shape_vec(), dim: d, start: s, len, step },
            "SliceBackward0",
        ))
    }

    /// Raw strided slice view (no autograd).
    pub(crate) fn slice_layout(&self, dim: usize, start: usize, len: usize, step: usize) -> Result<Tensor> {
        let mut l = self.layout().clone();
        let size = l.shape[dim];
        if len > 0 && (start >= size || start + (len - 1) * step >= size) {
            return Err(TensorError::RangeOutOfBounds { op: "slice", dim, start, len, step, size });
        }
        if len > 0 {
            l.offset += start * l.strides[dim];
        }
        l.shape[dim] = len;
        l.strides[dim] *= step;
        Ok(self.view_with_layout(l))
    }

    /// Index `index` of `dim`, removing that dimension (a view).
    pub fn select(&self, dim: i64, index: i64) -> Result<Tensor> {
        let d = normalize_dim(dim, self.rank(), "select")?;
        if self.rank() == 0 {
            return Err(TensorError::InvalidShape {
                op: "select",
                arg: "self",
                shape: Vec::new(),
                expected: ExpectedShape::MinRank(1),
            });
        }
        let size = self.shape()[d];
        let i = if index < 0 { index + size as i64 } else { index };
        if i < 0 || i as usize >= size {
            return Err(TensorError::IndexOutOfRange { op: "select", index, dim: d, size });
        }
        let out = self.view_with_layout(self.layout().select(d, i as usize));
        Ok(self.record_view(
            out,
            ViewKind::Select { in_shape: self.shape_vec(), dim: d, index: i as usize },
            "SelectBackward0",
        ))
    }

    /// Broadcast to `shape` without copying (stride-0 dims).
    pub fn expand(&self, shape: &[usize]) -> Result<Tensor> {
        if shape == self.shape() {
            return Ok(self.clone());
        }
        let l = self.layout().broadcast_to(shape, "expand")?;
        let out = self.view_with_layout(l);
        Ok(self.record_view(out, ViewKind::Expand(self.shape_vec()), "ExpandBackward0"))
    }

    /// Insert a size-1 dimension at `dim` (`-1` appends).
    pub fn unsqueeze(&self, dim: i64) -> Result<Tensor> {
        let d = normalize_dim(dim, self.rank() + 1, "unsqueeze")?;
        let out = self.view_with_layout(self.layout().unsqueeze(d));
        Ok(self.record_view(out, ViewKind::Reshape(self.shape_vec()), "UnsqueezeBackward0"))
    }

    /// Remove dimension `dim` if it has size 1 (otherwise unchanged, like PyTorch).
    pub fn squeeze(&self, dim: i64) -> Result<Tensor> {
        if self.rank() == 0 {
            return Ok(self.clone());
        }
        let d = normalize_dim(dim, self.rank(), "squeeze")?;
        if self.shape()[d] != 1 {
            return Ok(self.clone());
        }
        let out = self.view_with_layout(self.layout().select(d, 0));
        Ok(self.record_view(out, ViewKind::Reshape(self.shape_vec()), "SqueezeBackward1"))
    }

    /// Remove all size-1 dimensions.
    pub fn squeeze_all(&self) -> Result<Tensor> {
        let s: Vec<usize> = self.shape().iter().copied().filter(|&d| d != 1).collect();
        self.reshape_usize(&s)
    }

    /// A view with a new shape (one dim may be -1). Errors when the strides cannot express it
    /// without a copy — use [`reshape`](Self::reshape) then.
    pub fn view(&self, shape: &[i64]) -> Result<Tensor> {
        let s = infer_shape(shape, self.numel(), "view")?;
        match self.layout().view(&s) {
            Some(l) => {
                let out = self.view_with_layout(l);
                Ok(self.record_view(out, ViewKind::Reshape(self.shape_vec()), "ViewBackward0"))
            }
            None => Err(TensorError::NotViewable {
                op: "view",
                shape: s.to_vec(),
                input: self.shape().to_vec(),
                strides: self.strides().to_vec(),
            }),
        }
    }

    /// New shape (one dim may be -1); a view when possible, else a contiguous copy.
    pub fn reshape(&self, shape: &[i64]) -> Result<Tensor> {
        let s = infer_shape(shape, self.numel(), "reshape")?;
        self.reshape_usize(&s)
    }

    /// [`reshape`](Self::reshape) with an explicit shape.
    pub fn reshape_usize(&self, shape: &[usize]) -> Result<Tensor> {
        if shape == self.shape() {
            return Ok(self.clone());
        }
        if crate::layout::numel(shape) != self.numel() {
            return Err(TensorError::InvalidReshape {
                op: "reshape",
                spec: shape.iter().map(|&d| i64::try_from(d).unwrap_or(i64::MAX)).collect(),
                numel: self.numel(),
            });
        }
        let out = match self.layout().view(shape) {
            Some(l) => self.view_with_layout(l),
            None => {
                let c = materialize(self, self.dtype())?;
                c.view_with_layout(crate::layout::Layout::contiguous(shape))
            }
        };
        Ok(self.record_view(out, ViewKind::Reshape(self.shape_vec()), "ReshapeAliasBackward0"))
    }

    /// Flatten dims `start..=end` into one.
    pub fn flatten(&self, start: i64, end: i64) -> Result<Tensor> {
        if self.rank() == 0 {
            return self.reshape_usize(&[1]);
        }
        let s = normalize_dim(start, self.rank(), "flatten")?;
        let e = normalize_dim(end, self.rank(), "flatten")?;
        if s > e {
            return Err(TensorError::invalid("flatten", "start_dim cannot come after end_dim"));
        }
        let mut shape: Vec<usize> = self.shape()[..s].to_vec();
        shape.push(self.shape()[s..=e].iter().product());
        shape.extend_from_slice(&self.shape()[e + 1..]);
        self.reshape_usize(&shape)
    }

    /// Split `dim` into chunks of `size` (the last may be smaller); views.
    pub fn split(&self, size: usize, dim: i64) -> Result<Vec<Tensor>> {
        if size == 0 {
            return Err(TensorError::invalid("split", "split size must be positive"));
        }
        let d = normalize_dim(dim, self.rank(), "split")?;
        let n = self.shape().get(d).copied().unwrap_or(0);
        let mut out = Vec::new();
        let mut s = 0;
        while s < n {
            let len = size.min(n - s);
            out.push(self.narrow(d as i64, s, len)?);
            s += len;
        }
        Ok(out)
    }

    /// Split `dim` into `chunks` nearly equal views (PyTorch's `chunk`).
    pub fn chunk(&self, chunks: usize, dim: i64) -> Result<Vec<Tensor>> {
        if chunks == 0 {
            return Err(TensorError::invalid("chunk", "chunk expects `chunks` to be greater than 0"));
        }
        let d = normalize_dim(dim, self.rank(), "chunk")?;
        let n = self.shape().get(d).copied().unwrap_or(0);
        self.split(n.div_ceil(chunks).max(1), d as i64)
    }

    /// A view of this tensor's storage with an explicit layout (PyTorch's `as_strided`), for code
    /// that rebuilds saved views, e.g. a checkpoint reader restoring tensors that shared one
    /// storage. The layout must stay inside the storage. Such views are not recorded by autograd,
    /// so a tensor that requires grad is refused while grad mode is on.
    pub fn as_strided(&self, shape: &[usize], strides: &[usize], offset: usize) -> Result<Tensor> {
        let available = self.storage().nbytes() / self.dtype().size_in_bytes();
        let invalid = || TensorError::InvalidStrides {
            op: "as_strided",
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset,
            storage_elems: available,
        };
        if shape.len() != strides.len() {
            return Err(invalid());
        }
        if Tensor::needs_graph(&[self]) {
            return Err(TensorError::invalid(
                "as_strided",
                "as_strided views are not recorded by autograd; call it on a detached tensor or under no_grad()",
            ));
        }
        if crate::layout::strided_extent(shape, strides, offset) > available as u128 {
            return Err(invalid());
        }
        let layout = crate::layout::Layout {
            shape: SmallVec::from_slice(shape),
            strides: SmallVec::from_slice(strides),
            offset,
        };
        Ok(self.view_with_layout(layout))
    }
}
