//! A gradient bucket's memory: two flat f32 buffers that take turns as the all-reduce's send and
//! receive side, and the parameters' gradients left as views into the receive side afterwards
//! (PyTorch's `gradient_as_bucket_view`).
//!
//! Why views: averaging a bucket used to copy every gradient into a send buffer and every average
//! back out, two passes over all gradient bytes around a collective that moves them once: the
//! bucketed all-reduce reached 66–93 % of one plain `MPI_Allreduce` of the same bytes. With the
//! gradients viewing the buffer the all-reduce wrote, the copy out is gone; and when the gradients
//! are still those views at the next synchronisation ([`synchronize`](super::GradientSync::synchronize),
//! or a `zero_grad(set_to_none=false)` loop), so is the copy in. Why two buffers: MPI's in-place
//! all-reduce needs `MPI_IN_PLACE`, which rsmpi does not expose and whose value differs between
//! MPI libraries.
//!
//! The buffers live on the parameters' device when its memory is host memory (`cpu`, `sim:`), so
//! the device's allocator accounts for them as PyTorch's accounts for its buckets; parameters
//! elsewhere (a GPU) use host buffers and copy, as do gradients that are not f32.
//!
//! Caveat, as in PyTorch: a gradient held across steps (a clone of `p.grad()` handle, not of its
//! values) sees the next step's averages once the bucket's buffer is reused.

use std::time::Instant;

use ferrite_memory::Device;
use ferrite_tensor::{DType, Tensor, no_grad};

use super::error::Result;

/// One bucket's buffers: `[values of every parameter…, one "used" flag per parameter]`, twice.
pub(crate) struct BucketBuffers {
    flat: [Tensor; 2],
    /// Each parameter's slice of `flat[i]`, in the parameter's shape.
    views: [Vec<Tensor>; 2],
    /// Gradient values (the flags follow them).
    numel: usize,
    /// Which of the two is this step's send side; the other receives.
    send: usize,
    /// When the collective ran (for the overlap figures).
    pub(crate) started: Option<Instant>,
    pub(crate) finished: Option<Instant>,
}

/// Whether `a` is exactly the tensor `b` views (same storage, place, shape and strides).
fn same_view(a: &Tensor, b: &Tensor) -> bool {
    a.shares_storage(b)
        && a.storage_offset() == b.storage_offset()
        && a.dtype() == b.dtype()
        && a.shape() == b.shape()
        && a.strides() == b.strides()
}

impl BucketBuffers {
    /// Buffers for the gradients of `params` (in bucket order).
    pub(crate) fn new(params: &[&Tensor]) -> Result<BucketBuffers> {
        let numel: usize = params.iter().map(|p| p.numel()).sum();
        let len = numel + params.len();
        let home = params.first().map(|p| p.device().clone()).unwrap_or(Device::Cpu);
        let mut a = Tensor::zeros(&[len], DType::F32, &home)?;
        if a.host_data_ptr().is_none() {
            a = Tensor::zeros(&[len], DType::F32, &Device::Cpu)?;
        }
        let b = Tensor::zeros(&[len], DType::F32, a.device())?;
        let views = |flat: &Tensor| -> Result<Vec<Tensor>> {
            let mut off = 0;
            let mut out = Vec::with_capacity(params.len());
            for p in params {
                out.push(flat.narrow(0, off, p.numel())?.reshape_usize(p.shape())?);
                off += p.numel();
            }
            Ok(out)
        };
        let views = [views(&a)?, views(&b)?];
        Ok(BucketBuffers { flat: [a, b], views, numel, send: 0, started: None, finished: None })
    }

    /// Elements of one buffer (values and flags): the collective's count.
    pub(crate) fn len(&self) -> usize {
        self.flat[0].numel()
    }

    /// Put this rank's gradients of `params` and their "used" flags into the send side. A
    /// gradient that already is its view there is not copied; a missing one sends zeros.
    pub(crate) fn fill(&mut self, params: &[&Tensor]) -> Result<()> {
        let _g = no_grad();
        let s = self.send;
        let mut used = Vec::with_capacity(params.len());
        for (p, view) in params.iter().zip(&self.views[s]) {
            match p.grad() {
                Some(g) if same_view(&g, view) => used.push(1.0f32),
                Some(g) => {
                    if g.device() == view.device() {
                        view.copy_(&g)?;
                    } else {
                        view.copy_(&g.to_device(view.device())?)?;
                    }
                    used.push(1.0);
                }
                None => {
                    view.zero_()?;
                    used.push(0.0);
                }
            }
        }
        self.flat[s].narrow(0, self.numel, params.len())?.copy_from_slice(&used)?;
        Ok(())
    }

    /// Zeros in the send side (a rank that failed locally still pairs with its peers' collective).
    pub(crate) fn fill_zeros(&mut self) -> Result<()> {
        let _g = no_grad();
        self.flat[self.send].zero_()?;
        Ok(())
    }

    /// `(send, receive, count)` for the collective. The two are distinct allocations of `count`
    /// contiguous f32 in host memory, alive as long as `self`.
    /// `None` only if a buffer is not in host memory, which [`new`](Self::new) rules out.
    pub(crate) fn raw(&self) -> Option<(*const f32, *mut f32, usize)> {
        let send = self.flat[self.send].host_data_ptr()?;
        let recv = self.flat[1 - self.send].host_data_ptr()?;
        Some((send.as_ptr().cast::<f32>().cast_const(), recv.as_ptr().cast::<f32>(), self.len()))
    }

    /// After the all-reduce: scale the sums by `scale` (1 / world size) and make every parameter
    /// some rank used hold the average — as a view into the receive side when it lives there and
    /// is f32, else by a copy. The receive side becomes the next step's send side.
    pub(crate) fn write_back(&mut self, params: &[&Tensor], scale: f32) -> Result<()> {
        let _g = no_grad();
        let r = 1 - self.send;
        let used = self.flat[r].narrow(0, self.numel, params.len())?.to_vec::<f32>()?;
        if scale != 1.0 {
            self.flat[r].narrow(0, 0, self.numel)?.mul_scalar_(f64::from(scale))?;
        }
        for ((p, view), used) in params.iter().zip(&self.views[r]).zip(used) {
            if used <= 0.0 {
                continue;
            }
            if p.device() == view.device() && p.dtype() == DType::F32 {
                p.set_grad(Some(view.clone()))?;
                continue;
            }
            let avg = view.to_device(p.device())?;
            match p.grad() {
                Some(g) => g.copy_(&avg)?,
                None => p.set_grad(Some(avg.to_dtype(p.dtype())?))?,
            }
        }
        self.send = r;
        Ok(())
    }
}
