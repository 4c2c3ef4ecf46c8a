//! CPU indexing kernels: row selection and its scatter-add backward, gather/scatter along a dim,
//! one-hot. Indices are validated as they are read; a bad one is an `IndexOutOfRange` error that
//! names the op, the index, the dimension and its size.

use crate::backend::INDEX_DTYPES;
use crate::element::Element;
use crate::error::{Result, TensorError};
use crate::kernels::strided::{SendPtr, Walk};
use crate::layout::{Shape, wrap_index};
use crate::{DType, Tensor, dispatch_all, dispatch_bits};

/// Read an integer index tensor as i64s, negative indices wrapped, validated against `size`.
pub(super) fn read_indices(idx: &Tensor, size: usize, dim: usize, op: &'static str) -> Result<Vec<i64>> {
    let v: Vec<i64> = match idx.dtype() {
        DType::I64 => idx.to_vec::<i64>()?,
        DType::I32 => idx.to_vec::<i32>()?.into_iter().map(|x| x as i64).collect(),
        DType::U8 => idx.to_vec::<u8>()?.into_iter().map(|x| x as i64).collect(),
        d => {
            return Err(TensorError::InvalidDType { op, arg: "index", dtype: d, expected: INDEX_DTYPES });
        }
    };
    v.into_iter()
        .map(|i| match wrap_index(i, size) {
            Some(j) => Ok(j as i64),
            None => Err(TensorError::IndexOutOfRange { op, index: i, dim, size }),
        })
        .collect()
}

pub(super) fn index_select(out: &Tensor, x: &Tensor, d: usize, index: &Tensor) -> Result<()> {
    let size = x.shape()[d];
    let idx = read_indices(index, size, d, "index_select")?;
    if d == 0 && x.is_contiguous() {
        let row = x.numel() / size.max(1) * x.dtype().size_in_bytes();
        let src = x.ptr::<u8>("index_select")?;
        let dst = out.ptr::<u8>("index_select")?;
        for (i, &j) in idx.iter().enumerate() {
            // SAFETY: j < size (validated); rows of `row` bytes in a contiguous source,
            // distinct destination rows in the fresh output.
            unsafe { std::ptr::copy_nonoverlapping(src.add(j as usize * row), dst.add(i * row), row) };
        }
    } else {
        for (i, &j) in idx.iter().enumerate() {
            let dst = out.view_with_layout(out.layout().select(d, i));
            let src = x.view_with_layout(x.layout().select(d, j as usize));
            super::elementwise::copy(&dst, &src)?;
        }
    }
    Ok(())
}

pub(super) fn index_add(dst: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<()> {
    let size = dst.shape()[dim];
    let idx = read_indices(index, size, dim, "index_add")?;
    if dim == 0 && dst.is_contiguous() && src.is_contiguous() && dst.dtype() == DType::F32 {
        let row = dst.numel() / size.max(1);
        let d = dst.ptr::<f32>("index_add")?;
        let s = src.ptr::<f32>("index_add")?;
        for (i, &j) in idx.iter().enumerate() {
            // SAFETY: validated row indices into contiguous buffers of matching row length.
            unsafe {
                let d = std::slice::from_raw_parts_mut(d.add(j as usize * row), row);
                let s = std::slice::from_raw_parts(s.add(i * row), row);
                for (d, &s) in d.iter_mut().zip(s) {
                    *d += s;
                }
            }
        }
        return Ok(());
    }
    for (i, &j) in idx.iter().enumerate() {
        let d = dst.view_with_layout(dst.layout().select(dim, j as usize));
        let s = src.view_with_layout(src.layout().select(dim, i));
        super::elementwise::binary_inplace(crate::backend::BinaryOp::Add, &d, &s)?;
    }
    Ok(())
}

pub(super) fn gather(out: &Tensor, x: &Tensor, d: usize, idx: &Tensor) -> Result<()> {
    let size = x.shape()[d];
    let mut xs: Shape = x.layout().strides.clone();
    let dim_stride = xs[d];
    xs[d] = 0;
    let w = Walk::new(idx.shape(), [idx.strides(), xs.as_slice()], [idx.storage_offset(), x.storage_offset()]);
    let [si, sx] = w.inner_strides();
    let ip = idx.storage_base_ptr::<i64>("gather")?;
    dispatch_bits!(x.dtype(), T => {
        let xp = x.storage_base_ptr::<T>("gather")?;
        let op = out.ptr::<T>("gather")?;
        let mut bad: Option<i64> = None;
        w.rows(0, out.numel(), |[oi, ox], len, lin| {
            for k in 0..len {
                // SAFETY: offsets from validated layouts; j checked against `size`.
                unsafe {
                    let j = *ip.add(oi + k * si);
                    let Some(jj) = wrap_index(j, size) else {
                        bad.get_or_insert(j);
                        continue;
                    };
                    *op.add(lin + k) = *xp.add(ox + k * sx + jj * dim_stride);
                }
            }
        });
        if let Some(j) = bad {
            return Err(TensorError::IndexOutOfRange { op: "gather", index: j, dim: d, size });
        }
    });
    Ok(())
}

pub(super) fn scatter_add(out: &Tensor, dim: usize, idx: &Tensor, src: &Tensor) -> Result<()> {
    let size = out.shape()[dim];
    let mut os: Shape = out.layout().strides.clone();
    let dim_stride = os[dim];
    os[dim] = 0;
    let w = Walk::new(
        idx.shape(),
        [idx.strides(), src.strides(), os.as_slice()],
        [idx.storage_offset(), src.storage_offset(), 0],
    );
    let [si, ss, so] = w.inner_strides();
    let ip = idx.storage_base_ptr::<i64>("scatter_add")?;
    let mut bad: Option<i64> = None;
    dispatch_all!(out.dtype(), T => {
        let sp = src.storage_base_ptr::<T>("scatter_add")?;
        let op = SendPtr(out.ptr::<T>("scatter_add")?);
        w.rows(0, idx.numel(), |[oi, os_, oo], len, _| {
            for k in 0..len {
                // SAFETY: offsets from validated layouts; j checked against `size`.
                unsafe {
                    let j = *ip.add(oi + k * si);
                    let Some(jj) = wrap_index(j, size) else {
                        bad.get_or_insert(j);
                        continue;
                    };
                    let p = op.0.add(oo + k * so + jj * dim_stride);
                    *p = T::from_f64((*p).to_f64() + (*sp.add(os_ + k * ss)).to_f64());
                }
            }
        });
    });
    if let Some(j) = bad {
        return Err(TensorError::IndexOutOfRange { op: "scatter_add", index: j, dim, size });
    }
    Ok(())
}

pub(super) fn one_hot(out: &Tensor, index: &Tensor) -> Result<()> {
    let classes = out.shape().last().copied().unwrap_or(0);
    let dim = out.rank().saturating_sub(1);
    let idx = read_indices(index, classes, dim, "one_hot")?;
    let p = out.ptr::<i64>("one_hot")?;
    for (i, &j) in idx.iter().enumerate() {
        // SAFETY: i < numel of the index, j < classes: inside the [numel, classes] buffer.
        unsafe { *p.add(i * classes + j as usize) = 1 };
    }
    Ok(())
}
