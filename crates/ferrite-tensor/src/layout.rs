//! Shape, strides and offset: how a tensor's elements sit in its storage.
//!
//! Views (transpose, permute, narrow, expand, …) are new layouts over the same storage, so they
//! cost no memory. Besides arguments that are wrong on their own (a dim out of range, a size that
//! does not broadcast), only [`Layout::view`] can refuse a view, when the strides cannot express
//! the new shape without a copy (then `reshape` copies, like PyTorch).

use smallvec::SmallVec;

use crate::error::{Result, TensorError};

pub use crate::extent::strided_extent;

/// Dimension sizes. Inline up to 6 dims, so typical shapes never touch the heap.
pub type Shape = SmallVec<[usize; 6]>;

/// A view of storage: `element(i0..in) = storage[offset + Σ ik * strides[k]]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub shape: Shape,
    /// Element strides (not bytes). Zero for broadcast (expanded) dimensions.
    pub strides: Shape,
    /// Element offset into the storage.
    pub offset: usize,
}

/// Row-major strides of a contiguous tensor of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Shape {
    let mut strides: Shape = SmallVec::from_elem(0, shape.len());
    let mut acc = 1usize;
    for i in (0..shape.len()).rev() {
        strides[i] = acc;
        acc = acc.saturating_mul(shape[i].max(1));
    }
    strides
}

/// Number of elements of a shape (1 for a scalar).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Checked element count: `None` if it overflows `usize`.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

/// Resolve a possibly negative dimension index (PyTorch's wrap-around).
pub fn normalize_dim(dim: i64, rank: usize, op: &'static str) -> Result<usize> {
    let r = rank.max(1) as i64;
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r {
        return Err(TensorError::DimOutOfRange { op, dim, rank });
    }
    Ok(d as usize)
}

/// Resolve a possibly negative index into a dimension of `size` (PyTorch's wrap-around); `None`
/// when it is out of range. Inlined into the index kernels' inner loops.
#[inline(always)]
pub fn wrap_index(index: i64, size: usize) -> Option<usize> {
    let i = if index < 0 { index + size as i64 } else { index };
    (i >= 0 && (i as usize) < size).then_some(i as usize)
}

/// Broadcast two shapes (NumPy/PyTorch rules).
pub fn broadcast_shapes(a: &[usize], b: &[usize], op: &'static str) -> Result<Shape> {
    let n = a.len().max(b.len());
    let mut out: Shape = SmallVec::from_elem(0, n);
    for i in 0..n {
        let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(TensorError::BroadcastMismatch { op, lhs: a.to_vec(), rhs: b.to_vec() });
        };
    }
    Ok(out)
}

/// Resolve a shape with at most one `-1` against an element count.
pub fn infer_shape(spec: &[i64], numel_in: usize, op: &'static str) -> Result<Shape> {
    let mut out: Shape = SmallVec::with_capacity(spec.len());
    let mut infer = None;
    let mut known = 1usize;
    for (i, &d) in spec.iter().enumerate() {
        if d == -1 {
            if infer.is_some() {
                return Err(TensorError::InvalidReshape { op, spec: spec.to_vec(), numel: numel_in });
            }
            infer = Some(i);
            out.push(1);
        } else if d < 0 {
            return Err(TensorError::InvalidReshape { op, spec: spec.to_vec(), numel: numel_in });
        } else {
            known = known.checked_mul(d as usize).ok_or_else(|| TensorError::InvalidReshape {
                op,
                spec: spec.to_vec(),
                numel: numel_in,
            })?;
            out.push(d as usize);
        }
    }
    match infer {
        Some(i) => {
            if known == 0 || !numel_in.is_multiple_of(known) {
                return Err(TensorError::InvalidReshape { op, spec: spec.to_vec(), numel: numel_in });
            }
            out[i] = numel_in / known;
        }
        None => {
            if known != numel_in {
                return Err(TensorError::InvalidReshape { op, spec: spec.to_vec(), numel: numel_in });
            }
        }
    }
    Ok(out)
}

impl Layout {
    pub fn contiguous(shape: &[usize]) -> Layout {
        Layout { shape: SmallVec::from_slice(shape), strides: contiguous_strides(shape), offset: 0 }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// Row-major contiguous (size-1 dims may have any stride, like PyTorch).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1usize;
        for i in (0..self.shape.len()).rev() {
            let d = self.shape[i];
            if d == 1 {
                continue;
            }
            if self.strides[i] != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// Largest storage element index touched + 1 (0 for empty tensors).
    pub fn storage_span(&self) -> usize {
        if self.shape.contains(&0) {
            return 0;
        }
        self.offset + self.shape.iter().zip(&self.strides).map(|(&d, &s)| (d - 1) * s).sum::<usize>() + 1
    }

    pub fn transpose(&self, d0: usize, d1: usize) -> Layout {
        let mut l = self.clone();
        l.shape.swap(d0, d1);
        l.strides.swap(d0, d1);
        l
    }

    pub fn permute(&self, dims: &[usize], op: &'static str) -> Result<Layout> {
        let r = self.rank();
        if dims.len() != r {
            return Err(TensorError::InvalidPermutation { op, dims: dims.to_vec(), rank: r });
        }
        let mut seen: SmallVec<[bool; 6]> = SmallVec::from_elem(false, r);
        let mut l = Layout { shape: SmallVec::new(), strides: SmallVec::new(), offset: self.offset };
        for &d in dims {
            if d >= r || seen[d] {
                return Err(TensorError::InvalidPermutation { op, dims: dims.to_vec(), rank: r });
            }
            seen[d] = true;
            l.shape.push(self.shape[d]);
            l.strides.push(self.strides[d]);
        }
        Ok(l)
    }

    pub fn narrow(&self, dim: usize, start: usize, len: usize, op: &'static str) -> Result<Layout> {
        let size = self.shape[dim];
        if start > size || len > size - start {
            return Err(TensorError::RangeOutOfBounds { op, dim, start, len, step: 1, size });
        }
        let mut l = self.clone();
        if len > 0 {
            l.offset += start * self.strides[dim];
        }
        l.shape[dim] = len;
        Ok(l)
    }

    /// Remove dimension `dim` by fixing its index.
    pub fn select(&self, dim: usize, index: usize) -> Layout {
        let mut l = self.clone();
        l.offset += index * self.strides[dim];
        l.shape.remove(dim);
        l.strides.remove(dim);
        l
    }

    pub fn unsqueeze(&self, dim: usize) -> Layout {
        let mut l = self.clone();
        let stride = if dim < self.rank() { self.strides[dim] * self.shape[dim] } else { 1 };
        l.shape.insert(dim, 1);
        l.strides.insert(dim, stride.max(1));
        l
    }

    /// Broadcast to `shape` (must be broadcast-compatible; new leading dims get stride 0).
    pub fn broadcast_to(&self, shape: &[usize], op: &'static str) -> Result<Layout> {
        let n = shape.len();
        if self.rank() > n {
            return Err(TensorError::ExpandMismatch { op, shape: self.shape.to_vec(), target: shape.to_vec() });
        }
        let mut l =
            Layout { shape: SmallVec::from_slice(shape), strides: SmallVec::from_elem(0, n), offset: self.offset };
        let lead = n - self.rank();
        for i in 0..self.rank() {
            let (d, s) = (self.shape[i], self.strides[i]);
            let t = shape[lead + i];
            if d == t {
                l.strides[lead + i] = s;
            } else if d == 1 {
                l.strides[lead + i] = 0;
            } else {
                return Err(TensorError::ExpandMismatch { op, shape: self.shape.to_vec(), target: shape.to_vec() });
            }
        }
        Ok(l)
    }

    /// A view with a new shape over the same elements, if the strides allow it without a copy
    /// (PyTorch's `computeStride`).
    pub fn view(&self, new_shape: &[usize]) -> Option<Layout> {
        let old_numel = self.numel();
        if numel(new_shape) != old_numel {
            return None;
        }
        if old_numel == 0 || self.is_contiguous() {
            return Some(Layout {
                shape: SmallVec::from_slice(new_shape),
                strides: contiguous_strides(new_shape),
                offset: self.offset,
            });
        }
        let mut new_strides: Shape = SmallVec::from_elem(0, new_shape.len());
        let mut view_d = new_shape.len() as isize - 1;
        let mut chunk_base_stride = *self.strides.last().unwrap_or(&1);
        let mut tensor_numel = 1usize;
        let mut view_numel = 1usize;
        for tensor_d in (0..self.rank()).rev() {
            tensor_numel *= self.shape[tensor_d];
            if tensor_d == 0
                || (self.shape[tensor_d - 1] != 1 && self.strides[tensor_d - 1] != tensor_numel * chunk_base_stride)
            {
                while view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d as usize] == 1) {
                    new_strides[view_d as usize] = view_numel * chunk_base_stride;
                    view_numel *= new_shape[view_d as usize];
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if tensor_d > 0 {
                    chunk_base_stride = self.strides[tensor_d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        if view_d != -1 {
            return None;
        }
        Some(Layout { shape: SmallVec::from_slice(new_shape), strides: new_strides, offset: self.offset })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_rules() {
        assert_eq!(broadcast_shapes(&[3, 1], &[4], "t").unwrap().as_slice(), &[3, 4]);
        assert_eq!(broadcast_shapes(&[], &[2, 2], "t").unwrap().as_slice(), &[2, 2]);
        assert!(broadcast_shapes(&[3], &[4], "t").is_err());
    }

    #[test]
    fn view_of_transposed_needs_copy() {
        let l = Layout::contiguous(&[2, 3]).transpose(0, 1);
        assert!(l.view(&[6]).is_none());
        assert!(l.view(&[3, 2]).is_some());
        let n = Layout::contiguous(&[4, 6]).narrow(1, 0, 3, "t").unwrap();
        let v = n.view(&[4, 3, 1]).unwrap();
        assert_eq!(v.strides.as_slice(), &[6, 1, 1]);
        assert!(n.view(&[12]).is_none());
    }

    #[test]
    fn infer() {
        assert_eq!(infer_shape(&[-1, 4], 12, "t").unwrap().as_slice(), &[3, 4]);
        assert!(infer_shape(&[-1, 5], 12, "t").is_err());
        assert!(infer_shape(&[-1, -1], 12, "t").is_err());
    }

    #[test]
    fn contiguity() {
        assert!(Layout::contiguous(&[2, 1, 3]).is_contiguous());
        assert!(!Layout::contiguous(&[2, 3]).transpose(0, 1).is_contiguous());
        assert_eq!(Layout::contiguous(&[2, 3]).storage_span(), 6);
    }
}
