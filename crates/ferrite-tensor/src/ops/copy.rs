//! Copies and conversions: contiguous, deep clone, dtype and device changes, reading data back.

use std::borrow::Cow;

use ferrite_memory::{Device, allocator};

use crate::autograd::{BackwardFn, is_grad_enabled};
use crate::element::{Bool8, Element, HostElement};
use crate::error::{ExpectedShape, Result, TensorError};
use crate::{DType, Tensor, dispatch_all};

/// Write `src` (broadcast to dst's shape, any dtype) into `dst` (any non-overlapping layout).
pub(crate) fn copy_into(dst: &Tensor, src: &Tensor) -> Result<()> {
    if dst.is_meta() || dst.numel() == 0 {
        return Ok(());
    }
    if src.is_meta() {
        return Err(TensorError::MetaHasNoData { op: "copy" });
    }
    dst.kernels().copy(dst, src)
}

/// A contiguous copy with the given dtype on the same device, no autograd.
pub(crate) fn materialize(t: &Tensor, dtype: DType) -> Result<Tensor> {
    let out = t.empty_like_shape(t.shape(), dtype)?;
    copy_into(&out, t)?;
    Ok(out)
}

struct IdentityBackward(&'static str);
impl BackwardFn for IdentityBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(self.0)
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![g[0].clone()])
    }
}

struct ToDTypeBackward(DType);
impl BackwardFn for ToDTypeBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("ToCopyBackward0")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![match &g[0] {
            Some(g) => Some(g.to_dtype(self.0)?),
            None => None,
        }])
    }
}

struct ToDeviceBackward(Device);
impl BackwardFn for ToDeviceBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("ToCopyBackward0")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![match &g[0] {
            Some(g) => Some(g.to_device(&self.0)?),
            None => None,
        }])
    }
}

/// Refuse in-place writes that autograd cannot track.
pub(crate) fn check_inplace(op: &'static str, dst: &Tensor, others: &[&Tensor]) -> Result<()> {
    if !dst.is_contiguous() && dst.shape().iter().zip(dst.strides()).any(|(&d, &s)| d > 1 && s == 0) {
        return Err(TensorError::OverlappingWrite { op, shape: dst.shape().to_vec(), strides: dst.strides().to_vec() });
    }
    if !is_grad_enabled() {
        return Ok(());
    }
    if dst.requires_grad() {
        if dst.is_leaf() {
            return Err(TensorError::InplaceOnLeaf { op });
        }
        return Err(TensorError::invalid(
            op,
            "in-place operations on tensors that require grad are not recorded by autograd; use the out-of-place form",
        ));
    }
    if others.iter().any(|t| t.requires_grad()) {
        return Err(TensorError::invalid(
            op,
            "an in-place operation cannot take an operand that requires grad while grad mode is on; use the out-of-place form or no_grad()",
        ));
    }
    Ok(())
}

impl Tensor {
    /// Overwrite this contiguous tensor with host values, in place (one copy, no temporary
    /// tensor): what a gradient all-reduce or a loader writing into a preallocated buffer needs.
    /// Bumps the version counter like every in-place op, so a graph that saved this tensor
    /// refuses to run backward on the stale values.
    pub fn copy_from_slice<T: HostElement>(&self, data: &[T]) -> Result<()> {
        const OP: &str = "copy_from_slice";
        check_inplace(OP, self, &[])?;
        let want = <T::Stored as Element>::DTYPE;
        if self.dtype() != want {
            return Err(TensorError::DTypeMismatch { op: OP, lhs: self.dtype(), rhs: want });
        }
        if !self.is_contiguous() {
            return Err(TensorError::NotContiguous {
                op: OP,
                shape: self.shape().to_vec(),
                strides: self.strides().to_vec(),
            });
        }
        if data.len() != self.numel() {
            return Err(TensorError::DataLength {
                op: OP,
                len: data.len(),
                shape: self.shape().to_vec(),
                numel: self.numel(),
            });
        }
        match T::as_stored_slice(data) {
            Some(stored) => self.kernels().write_from_host(self, bytemuck::cast_slice(stored))?,
            None => {
                let stored: Vec<T::Stored> = data.iter().map(|&v| v.to_stored()).collect();
                self.kernels().write_from_host(self, bytemuck::cast_slice(&stored))?;
            }
        }
        self.storage().bump_version();
        Ok(())
    }

    /// This tensor if already contiguous, else a contiguous copy (gradient flows through).
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let out = materialize(self, self.dtype())?;
        Ok(Tensor::from_op1(out, &[self], IdentityBackward("CloneBackward0")))
    }

    /// A copy with its own storage (PyTorch's `clone()`; gradient flows through).
    pub fn deep_clone(&self) -> Result<Tensor> {
        let out = materialize(self, self.dtype())?;
        Ok(Tensor::from_op1(out, &[self], IdentityBackward("CloneBackward0")))
    }

    /// Convert to `dtype` (a no-op handle clone if already that dtype).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let out = materialize(self, dtype)?;
        if !dtype.is_floating_point() {
            return Ok(out);
        }
        Ok(Tensor::from_op1(out, &[self], ToDTypeBackward(self.dtype())))
    }

    /// Copy to `device` (both devices' allocators account the bytes). To `meta` keeps the shape
    /// only; from `meta` to a real device is an error (there is no data to copy).
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        if self.is_meta() && !matches!(device, Device::Meta) && self.numel() > 0 {
            return Err(TensorError::MetaHasNoData { op: "to_device" });
        }
        let src = if self.is_contiguous() { self.clone() } else { self.detach().contiguous()? };
        let out = Tensor::empty_with(&allocator(device), self.shape(), self.dtype())?;
        crate::backend::transfer(&out, &src)?;
        Ok(Tensor::from_op1(out, &[self], ToDeviceBackward(self.device().clone())))
    }

    /// The elements in row-major order. `T` must match the dtype (`bool` for Bool tensors; see
    /// [`to_vec_f64`](Self::to_vec_f64) for any dtype).
    pub fn to_vec<T: HostElement>(&self) -> Result<Vec<T>> {
        let want = <T::Stored as Element>::DTYPE;
        if want != self.dtype() {
            return Err(TensorError::DTypeMismatch { op: "to_vec", lhs: self.dtype(), rhs: want });
        }
        if self.is_meta() {
            return Err(TensorError::MetaHasNoData { op: "to_vec" });
        }
        let _g = crate::autograd::no_grad();
        let c = self.contiguous()?;
        let mut stored: Vec<T::Stored> = vec![<T::Stored as bytemuck::Zeroable>::zeroed(); c.numel()];
        c.kernels().read_to_host(&c, bytemuck::cast_slice_mut(&mut stored))?;
        Ok(stored.into_iter().map(T::from_stored).collect())
    }

    /// The elements converted to f64, for any dtype.
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        dispatch_all!(self.dtype(), T => {
            Ok(self.to_vec::<T>()?.into_iter().map(|v| v.to_f64()).collect())
        })
    }

    /// Bool tensors as Rust bools.
    pub fn to_vec_bool(&self) -> Result<Vec<bool>> {
        Ok(self.to_vec::<Bool8>()?.into_iter().map(|b| b.0 != 0).collect())
    }

    /// The single value of a one-element tensor as f64. A plain number: it carries no graph.
    pub fn item(&self) -> Result<f64> {
        if self.numel() != 1 {
            return Err(TensorError::InvalidShape {
                op: "item",
                arg: "self",
                shape: self.shape().to_vec(),
                expected: ExpectedShape::Numel(1),
            });
        }
        Ok(self.to_vec_f64()?[0])
    }

    /// Copy `src` into this tensor in place (broadcast, dtype-converted). Bumps the version.
    ///
    /// `src` may live on another device (PyTorch's cross-device `copy_`, what
    /// `load_state_dict` does with weights read on the CPU): the data is converted and
    /// broadcast on `src`'s side and written straight into this tensor's memory, so when this
    /// tensor is contiguous its device allocates nothing — loading a checkpoint onto a GPU never
    /// holds a second device copy of the largest weight.
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        check_inplace("copy_", self, &[src])?;
        if !self.is_meta() && !crate::storage::same_device(self.storage(), src.storage()) {
            return self.copy_across_devices(src);
        }
        copy_into(self, src)?;
        self.storage().bump_version();
        Ok(())
    }

    /// [`copy_`](Self::copy_) from another device.
    fn copy_across_devices(&self, src: &Tensor) -> Result<()> {
        if self.numel() == 0 {
            return Ok(());
        }
        if src.is_meta() {
            return Err(TensorError::MetaHasNoData { op: "copy_" });
        }
        // On src's device: broadcast to this shape, this dtype, contiguous (no copy when src
        // already is all three).
        let staged = src.detach().expand(self.shape())?;
        let staged = if staged.dtype() == self.dtype() && staged.is_contiguous() {
            staged
        } else {
            materialize(&staged, self.dtype())?
        };
        if self.is_contiguous() {
            crate::backend::transfer(self, &staged)?;
        } else {
            // A strided destination: one contiguous block on this device, then the strided
            // write.
            let block = Tensor::empty_with(self.storage().allocator(), self.shape(), self.dtype())?;
            crate::backend::transfer(&block, &staged)?;
            copy_into(self, &block)?;
        }
        self.storage().bump_version();
        Ok(())
    }

    /// Fill with `value` in place.
    pub fn fill_(&self, value: f64) -> Result<()> {
        check_inplace("fill_", self, &[])?;
        let v = crate::ops::creation::full_on(self.storage().allocator(), &[], self.dtype(), value)?;
        copy_into(self, &v)?;
        self.storage().bump_version();
        Ok(())
    }

    /// Zero in place.
    pub fn zero_(&self) -> Result<()> {
        self.fill_(0.0)
    }
}
