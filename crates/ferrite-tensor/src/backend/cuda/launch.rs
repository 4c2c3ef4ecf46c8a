//! How the `cuda:N` backend talks to its [`CudaRuntime`]: tensors become device addresses,
//! layouts become the kernels' `Strided`/`Broadcast` records (dimensions merged where the strides
//! allow, so more ranks fit the records' fixed arrays), and launches get their geometry here —
//! small grids on the host emulator, where each GPU thread is an OS thread.
use ferrite_cuda::{CudaError, CudaRuntime, KERNEL_SOURCES, KernelArg, KernelSource};

use super::deferred::{Check, Deferred};
use crate::error::{Result, TensorError};
use crate::{DType, Tensor};

/// The threads of the row kernels' blocks (`FERRITE_BLOCK` in `block_reduce.cuh`).
pub(super) const ROW_BLOCK: u32 = 256;
/// `Broadcast`'s dimension limit (`FERRITE_MAX_DIMS` in elementwise.cu).
pub(super) const MAX_DIMS: usize = 6;
/// `Strided`'s dimension limit (`FERRITE_COPY_MAX_DIMS` in copy.cu).
pub(super) const COPY_MAX_DIMS: usize = 8;

/// One device's runtime with the name used in errors, and its queue of device-side checks.
#[derive(Clone, Copy)]
pub(super) struct Ctx<'a> {
    pub rt: &'a dyn CudaRuntime,
    pub device: &'a str,
    pub deferred: &'a Deferred,
}

/// `Strided` of copy.cu.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct Strided {
    ndim: i32,
    _pad: i32,
    offset: i64,
    shape: [i64; COPY_MAX_DIMS],
    stride: [i64; COPY_MAX_DIMS],
}

/// `Broadcast` of elementwise.cu.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct Broadcast {
    ndim: i32,
    _pad: i32,
    shape: [i64; MAX_DIMS],
    a_stride: [i64; MAX_DIMS],
    b_stride: [i64; MAX_DIMS],
}

/// `Broadcast3` of elementwise.cu.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct Broadcast3 {
    ndim: i32,
    _pad: i32,
    shape: [i64; MAX_DIMS],
    c_stride: [i64; MAX_DIMS],
    a_stride: [i64; MAX_DIMS],
    b_stride: [i64; MAX_DIMS],
}

impl<'a> Ctx<'a> {
    /// A runtime failure of `op` as the tensor crate's error.
    pub fn fail(&self, op: &'static str, e: CudaError) -> TensorError {
        TensorError::Cuda { op, device: self.device.to_string(), detail: e.to_string() }
    }

    /// An operand the records cannot describe.
    pub fn too_many_dims(&self, op: &'static str, rank: usize, max: usize) -> TensorError {
        TensorError::Cuda {
            op,
            device: self.device.to_string(),
            detail: format!(
                "an operand of rank {rank} whose layout does not merge into {max} dimensions; make it contiguous first"
            ),
        }
    }

    /// Launches `kernel` of `source` with `grid` blocks of `block` threads.
    ///
    /// Every caller in this backend builds `args` from live tensors of this device (their
    /// addresses, and shapes and strides that stay within their storages, which the op layer
    /// validated) in the order and types of the kernel's parameters.
    pub fn launch(
        &self,
        op: &'static str,
        source: &'static str,
        kernel: &str,
        grid: u32,
        block: u32,
        args: &[KernelArg],
    ) -> Result<()> {
        let src = source_named(source).ok_or_else(|| {
            self.fail(op, CudaError::NoSuchKernel { kernel: kernel.to_string(), source_name: source.to_string() })
        })?;
        // SAFETY: see the method's note: the arguments come from this device's live tensors in
        // the kernel's parameter order, and the op layer validated every extent they describe.
        unsafe { self.rt.launch(src, kernel, grid, block, args) }.map_err(|e| self.fail(op, e))
    }

    /// A grid-stride kernel over `n` work items (nothing to do for `n == 0`).
    pub fn launch_n(
        &self,
        op: &'static str,
        source: &'static str,
        kernel: &str,
        n: usize,
        args: &[KernelArg],
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let (block, cap) = if self.rt.is_emulated() { (64u32, 2usize) } else { (256u32, 65_535usize) };
        let grid = n.div_ceil(block as usize).clamp(1, cap) as u32;
        self.launch(op, source, kernel, grid, block, args)
    }

    /// A row kernel (one block of [`ROW_BLOCK`] threads per row, grid-stride over rows).
    pub fn launch_rows(
        &self,
        op: &'static str,
        source: &'static str,
        kernel: &str,
        rows: usize,
        args: &[KernelArg],
    ) -> Result<()> {
        if rows == 0 {
            return Ok(());
        }
        let cap = if self.rt.is_emulated() { 2usize } else { 65_535 };
        self.launch(op, source, kernel, rows.clamp(1, cap) as u32, ROW_BLOCK, args)
    }

    /// Runs `launch` with the device address of a fresh flag slot queued for `op` with `check`,
    /// reported at the next synchronisation (see `deferred.rs`).
    pub fn flagged(
        &self,
        like: &Tensor,
        op: &'static str,
        check: Check,
        launch: impl FnOnce(u64) -> Result<()>,
    ) -> Result<()> {
        self.deferred.flagged(self.rt, self.device, like, op, check, launch)
    }

    /// The first device-side error queued since the last synchronisation point, if any (reads the
    /// flags, a wait for the device, only when some are queued).
    pub fn drain(&self) -> Result<()> {
        self.deferred.drain(self.rt, self.device)
    }

    /// A tensor of `shape` and `dtype` on the same device as `like` (scratch for a kernel).
    pub fn scratch(&self, like: &Tensor, shape: &[usize], dtype: DType) -> Result<Tensor> {
        like.empty_like_shape(shape, dtype)
    }
}

/// The kernel source called `name`.
fn source_named(name: &str) -> Option<&'static KernelSource> {
    KERNEL_SOURCES.iter().find(|s| s.name == name)
}

/// The device address of `t`'s first element (its storage's block plus the view's offset).
pub(super) fn addr(t: &Tensor, op: &'static str) -> Result<u64> {
    Ok(base(t, op)? + (t.storage_offset() * t.dtype().size_in_bytes()) as u64)
}

/// The device address of `t`'s storage (the view's offset not applied).
pub(super) fn base(t: &Tensor, op: &'static str) -> Result<u64> {
    if t.is_storage_released() {
        return Err(TensorError::StorageReleased { op });
    }
    Ok(t.storage().addr())
}

/// A pointer argument for `t` (its first element).
pub(super) fn ptr(t: &Tensor, op: &'static str) -> Result<KernelArg> {
    Ok(KernelArg::Ptr(addr(t, op)?))
}

/// An optional pointer argument (null when absent).
pub(super) fn opt_ptr(t: Option<&Tensor>, op: &'static str) -> Result<KernelArg> {
    match t {
        Some(t) => ptr(t, op),
        None => Ok(KernelArg::Ptr(0)),
    }
}

/// A size argument (`long long`).
pub(super) fn n_arg(v: usize) -> KernelArg {
    KernelArg::I64(v as i64)
}

/// `shape` and the strides of each operand over it with size-1 dimensions dropped and adjacent
/// dimensions merged wherever every operand allows (`stride[d] == stride[d+1]·shape[d+1]`).
pub(super) fn merge_dims(shape: &[usize], strides: &[&[usize]]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut out_shape: Vec<usize> = Vec::new();
    let mut out_strides: Vec<Vec<usize>> = vec![Vec::new(); strides.len()];
    for d in 0..shape.len() {
        if shape[d] == 1 {
            continue;
        }
        let mergeable = !out_shape.is_empty()
            && strides.iter().zip(&out_strides).all(|(s, o)| o.last().copied() == Some(s[d] * shape[d]));
        if mergeable {
            if let Some(last) = out_shape.last_mut() {
                *last *= shape[d];
            }
            for (o, s) in out_strides.iter_mut().zip(strides) {
                if let Some(l) = o.last_mut() {
                    *l = s[d];
                }
            }
        } else {
            out_shape.push(shape[d]);
            for (o, s) in out_strides.iter_mut().zip(strides) {
                o.push(s[d]);
            }
        }
    }
    (out_shape, out_strides)
}

/// The `Strided` record of `shape` with `strides` from element `offset`.
pub(super) fn strided(shape: &[usize], strides: &[usize], offset: usize) -> Strided {
    let mut s = Strided {
        ndim: shape.len() as i32,
        _pad: 0,
        offset: offset as i64,
        shape: [1; COPY_MAX_DIMS],
        stride: [0; COPY_MAX_DIMS],
    };
    for d in 0..shape.len().min(COPY_MAX_DIMS) {
        s.shape[d] = shape[d] as i64;
        s.stride[d] = strides[d] as i64;
    }
    s
}

/// The `Broadcast` record of `shape` with the strides of `a` and `b`.
pub(super) fn broadcast(shape: &[usize], a: &[usize], b: &[usize]) -> Broadcast {
    let mut g = Broadcast {
        ndim: shape.len() as i32,
        _pad: 0,
        shape: [1; MAX_DIMS],
        a_stride: [0; MAX_DIMS],
        b_stride: [0; MAX_DIMS],
    };
    for d in 0..shape.len().min(MAX_DIMS) {
        g.shape[d] = shape[d] as i64;
        g.a_stride[d] = a[d] as i64;
        g.b_stride[d] = b[d] as i64;
    }
    g
}

/// The `Broadcast3` record of `shape` with the strides of `c`, `a` and `b`.
pub(super) fn broadcast3(shape: &[usize], c: &[usize], a: &[usize], b: &[usize]) -> Broadcast3 {
    let mut g = Broadcast3 {
        ndim: shape.len() as i32,
        _pad: 0,
        shape: [1; MAX_DIMS],
        c_stride: [0; MAX_DIMS],
        a_stride: [0; MAX_DIMS],
        b_stride: [0; MAX_DIMS],
    };
    for d in 0..shape.len().min(MAX_DIMS) {
        g.shape[d] = shape[d] as i64;
        g.c_stride[d] = c[d] as i64;
        g.a_stride[d] = a[d] as i64;
        g.b_stride[d] = b[d] as i64;
    }
    g
}
