//! The `Tensor` handle.
//!
//! A `Tensor` is a cheap-to-clone reference (an `Arc`) to a view of a [`Storage`]. Cloning the
//! handle never copies data (use [`Tensor::deep_clone`] for that). Everything that can fail
//! returns a [`Result`]: ops on user input never panic.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use ferrite_memory::{Device, allocator};
use smallvec::SmallVec;

use crate::DType;
use crate::autograd::{self, BackwardFn, Edge, GradSlot, Node};
use crate::element::{Element, HostElement};
use crate::error::{Result, TensorError};
use crate::layout::{Layout, Shape, checked_numel};
use crate::storage::Storage;

/// A multi-dimensional array on a device, with optional autograd history.
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<TensorImpl>);

pub(crate) struct TensorImpl {
    pub(crate) storage: Arc<Storage>,
    pub(crate) layout: Layout,
    pub(crate) dtype: DType,
    /// `layout.is_contiguous()`, computed once (it is asked on every op's fast path).
    contiguous: bool,
    /// Leaves only: whether gradients are wanted.
    requires_grad: AtomicBool,
    grad_fn: Option<Arc<Node>>,
    output_nr: u32,
    /// Leaves: their gradient. Non-leaves: present after `retain_grad`.
    grad_slot: OnceLock<Arc<GradSlot>>,
}

impl Drop for TensorImpl {
    fn drop(&mut self) {
        // Dropping the last handle to a long graph's output frees the graph; Node's own Drop
        // unlinks iteratively so this cannot overflow the stack.
        let _ = self.grad_fn.take();
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor(shape={:?}, dtype={}, device={}", self.shape(), self.dtype(), self.device())?;
        if let Some(n) = self.grad_fn() {
            write!(f, ", grad_fn={}", n.name())?;
        } else if self.requires_grad() {
            write!(f, ", requires_grad=true")?;
        }
        if self.numel() <= 16
            && !self.is_meta()
            && let Ok(v) = self.to_vec_f64()
        {
            write!(f, ", values={v:?}")?;
        }
        write!(f, ")")
    }
}

impl Tensor {
    // ---------------------------------------------------------------- construction (internal)

    pub(crate) fn from_parts(storage: Arc<Storage>, layout: Layout, dtype: DType) -> Tensor {
        let contiguous = layout.is_contiguous();
        Tensor(Arc::new(TensorImpl {
            storage,
            layout,
            dtype,
            contiguous,
            requires_grad: AtomicBool::new(false),
            grad_fn: None,
            output_nr: 0,
            grad_slot: OnceLock::new(),
        }))
    }

    /// A new view of this tensor's storage (no autograd history).
    pub(crate) fn view_with_layout(&self, layout: Layout) -> Tensor {
        Tensor::from_parts(self.0.storage.clone(), layout, self.0.dtype)
    }

    /// The contiguous `self` viewed with another shape of the same element count (storage offset
    /// kept; no autograd history), for handing kernels a flattened operand.
    pub(crate) fn contiguous_view_as(&self, shape: &[usize]) -> Tensor {
        debug_assert!(self.is_contiguous() && crate::layout::checked_numel(shape) == Some(self.numel()));
        let mut l = Layout::contiguous(shape);
        l.offset = self.storage_offset();
        self.view_with_layout(l)
    }

    /// Uninitialised contiguous tensor from `alloc`. Kernels must write every element.
    #[track_caller]
    pub(crate) fn empty_with(
        alloc: &Arc<ferrite_memory::CachingAllocator>,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor> {
        let n =
            checked_numel(shape).ok_or_else(|| TensorError::ShapeTooLarge { op: "empty", shape: shape.to_vec() })?;
        let nbytes = n
            .checked_mul(dtype.size_in_bytes())
            .ok_or_else(|| TensorError::ShapeTooLarge { op: "empty", shape: shape.to_vec() })?;
        let storage = Storage::new(alloc, nbytes)?;
        Ok(Tensor::from_parts(storage, Layout::contiguous(shape), dtype))
    }

    /// Uninitialised contiguous tensor on the same device as `self`.
    #[track_caller]
    pub(crate) fn empty_like_shape(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::empty_with(self.0.storage.allocator(), shape, dtype)
    }

    /// Uninitialised contiguous tensor on `device`.
    #[track_caller]
    pub(crate) fn empty(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::empty_with(&allocator(device), shape, dtype)
    }

    // ---------------------------------------------------------------- public construction

    /// A tensor holding `data` with `shape` on `device` (any [`HostElement`]: f32, f64, f16,
    /// bf16, i64, i32, u8, bool).
    #[track_caller]
    pub fn from_vec<T: HostElement>(data: Vec<T>, shape: &[usize], device: &Device) -> Result<Tensor> {
        Tensor::from_slice(&data, shape, device)
    }

    /// A tensor holding a copy of `data` with `shape` on `device`.
    #[track_caller]
    pub fn from_slice<T: HostElement>(data: &[T], shape: &[usize], device: &Device) -> Result<Tensor> {
        let n = checked_numel(shape)
            .ok_or_else(|| TensorError::ShapeTooLarge { op: "from_slice", shape: shape.to_vec() })?;
        if n != data.len() {
            return Err(TensorError::DataLength { op: "from_slice", len: data.len(), shape: shape.to_vec(), numel: n });
        }
        let t = Tensor::empty(shape, <T::Stored as Element>::DTYPE, device)?;
        match T::as_stored_slice(data) {
            Some(stored) => t.kernels().write_from_host(&t, bytemuck::cast_slice(stored))?,
            None => {
                let stored: Vec<T::Stored> = data.iter().map(|&v| v.to_stored()).collect();
                t.kernels().write_from_host(&t, bytemuck::cast_slice(&stored))?;
            }
        }
        Ok(t)
    }

    /// A 0-dim tensor.
    #[track_caller]
    pub fn scalar<T: HostElement>(v: T, device: &Device) -> Result<Tensor> {
        Tensor::from_slice(&[v], &[], device)
    }

    /// Bool tensor from Rust bools.
    #[track_caller]
    pub fn from_bools(data: &[bool], shape: &[usize], device: &Device) -> Result<Tensor> {
        let v: Vec<crate::element::Bool8> = data.iter().map(|&b| crate::element::Bool8(b as u8)).collect();
        Tensor::from_slice(&v, shape, device)
    }

    // ---------------------------------------------------------------- accessors

    pub fn shape(&self) -> &[usize] {
        &self.0.layout.shape
    }

    /// Alias of [`shape`](Self::shape) (PyTorch's `size()`).
    pub fn dims(&self) -> &[usize] {
        self.shape()
    }

    /// Size of dimension `dim` (negative counts from the end).
    pub fn size(&self, dim: i64) -> Result<usize> {
        let d = crate::layout::normalize_dim(dim, self.rank(), "size")?;
        Ok(self.shape().get(d).copied().unwrap_or(1))
    }

    pub fn rank(&self) -> usize {
        self.0.layout.shape.len()
    }

    pub fn numel(&self) -> usize {
        self.0.layout.numel()
    }

    pub fn dtype(&self) -> DType {
        self.0.dtype
    }

    pub fn device(&self) -> &Device {
        self.0.storage.device()
    }

    /// The kernel backend that computes on this tensor's device (see [`crate::backend`]).
    #[inline]
    pub(crate) fn kernels(&self) -> &'static dyn crate::backend::KernelBackend {
        self.0.storage.kernels()
    }

    pub fn is_meta(&self) -> bool {
        matches!(self.device(), Device::Meta)
    }

    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }

    pub fn strides(&self) -> &[usize] {
        &self.0.layout.strides
    }

    pub fn storage_offset(&self) -> usize {
        self.0.layout.offset
    }

    pub fn is_contiguous(&self) -> bool {
        self.0.contiguous
    }

    pub fn storage(&self) -> &Arc<Storage> {
        &self.0.storage
    }

    /// Bytes of this tensor's elements (not of its whole storage).
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype().size_in_bytes()
    }

    /// Whether two handles view the same storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
    }

    /// True when no other handle or view references this tensor or its storage.
    pub(crate) fn is_exclusively_owned(&self) -> bool {
        Arc::strong_count(&self.0) == 1 && Arc::strong_count(&self.0.storage) == 1
    }

    /// Base pointer (storage offset applied) for kernels. Errors on meta tensors.
    /// The offset is applied in elements of the tensor's dtype, so byte-typed callers (`T = u8`,
    /// for raw row copies) get the same address as element-typed ones.
    pub(crate) fn ptr<T>(&self, op: &'static str) -> Result<*mut T> {
        match self.0.storage.ptr() {
            // SAFETY: offset is within the storage (layouts are only built by checked view ops).
            Some(p) => Ok(unsafe { p.add(self.0.layout.offset * self.0.dtype.size_in_bytes()) as *mut T }),
            None if self.numel() == 0 => Ok(std::ptr::NonNull::dangling().as_ptr()),
            None if self.0.storage.is_released() => Err(TensorError::StorageReleased { op }),
            None => Err(TensorError::MetaHasNoData { op }),
        }
    }

    /// Give this tensor's bytes back to its allocator now, keeping the tensor (shape, autograd
    /// identity, every view and every alias saved for backward) alive: what PyTorch's FSDP does
    /// with `storage.resize_(0)` to free a unit's gathered parameters after its forward. Using
    /// the tensor is then an error ([`TensorError::StorageReleased`]) until
    /// [`refill_storage_from`](Self::refill_storage_from). Releasing twice is a no-op.
    pub fn release_storage(&self) {
        self.0.storage.release();
    }

    /// Whether this tensor's storage is released (see [`release_storage`](Self::release_storage)).
    pub fn is_storage_released(&self) -> bool {
        self.0.storage.is_released()
    }

    /// Make `src`'s bytes this tensor's storage (replacing what it held, e.g. refilling a released
    /// one): `src` must be a contiguous tensor of the same dtype, device and storage size that
    /// nothing else references (a fresh result). No copy is made and the storage's version is not
    /// bumped: the caller puts back the values the storage held when autograd saved it (FSDP's
    /// gather before a unit's backward), so saved tensors stay valid.
    pub fn refill_storage_from(&self, src: Tensor) -> Result<()> {
        let refuse = |detail: String| Err(TensorError::StorageRefill { detail });
        if src.dtype() != self.dtype() || src.storage_offset() != 0 || !src.is_contiguous() {
            return refuse(format!(
                "source must be a contiguous {} tensor at offset 0 (got {} at offset {})",
                self.dtype(),
                src.dtype(),
                src.storage_offset()
            ));
        }
        if !src.is_exclusively_owned() {
            return refuse("source is referenced elsewhere; pass a fresh tensor".into());
        }
        if !self.0.storage.take_bytes_of(&src.0.storage) {
            return refuse(format!(
                "source holds {} bytes on {}, the storage {} bytes on {}",
                src.0.storage.nbytes(),
                src.device(),
                self.0.storage.nbytes(),
                self.device()
            ));
        }
        Ok(())
    }

    /// Where this contiguous tensor's first element sits in host memory, so a library that moves
    /// buffers itself (MPI's all-reduce of a gradient bucket) can work on the tensor without a
    /// copy in and a copy out. `None` when the elements are not in host memory (meta, a GPU) or
    /// the tensor is not contiguous; an empty tensor gives a dangling, well-aligned address.
    ///
    /// The address stays valid while any handle to this storage is alive. Reading or writing
    /// through it is `unsafe` and outside the version counter and the in-place checks: the caller
    /// must make sure nothing writes these elements while it reads them, and nothing else reads
    /// or writes them while it writes.
    pub fn host_data_ptr(&self) -> Option<std::ptr::NonNull<u8>> {
        if !self.is_contiguous() || self.is_meta() {
            return None;
        }
        if self.numel() == 0 {
            return Some(std::ptr::NonNull::dangling());
        }
        self.0.storage.ptr()?;
        self.ptr::<u8>("host_data_ptr").ok().and_then(std::ptr::NonNull::new)
    }

    /// Pointer to the first element of the storage (layout offset NOT applied).
    pub(crate) fn storage_base_ptr<T>(&self, op: &'static str) -> Result<*mut T> {
        match self.0.storage.ptr() {
            Some(p) => Ok(p as *mut T),
            None if self.numel() == 0 => Ok(std::ptr::NonNull::dangling().as_ptr()),
            None if self.0.storage.is_released() => Err(TensorError::StorageReleased { op }),
            None => Err(TensorError::MetaHasNoData { op }),
        }
    }

    // ---------------------------------------------------------------- autograd accessors

    /// Whether ops on this tensor record a graph.
    #[inline]
    pub fn requires_grad(&self) -> bool {
        self.0.grad_fn.is_some() || self.0.requires_grad.load(Ordering::Relaxed)
    }

    /// Mark a leaf as requiring gradients (returns the same handle for chaining).
    pub fn requires_grad_(&self, requires: bool) -> Result<Tensor> {
        if self.0.grad_fn.is_some() {
            if !requires {
                return Err(TensorError::Autograd {
                    detail: "you can only change requires_grad flags of leaf variables; use detach() to get a tensor without history".into(),
                });
            }
            return Ok(self.clone());
        }
        if requires && !self.dtype().is_floating_point() {
            return Err(TensorError::Autograd {
                detail: format!("only tensors of floating point dtype can require gradients (got {})", self.dtype()),
            });
        }
        self.0.requires_grad.store(requires, Ordering::Relaxed);
        Ok(self.clone())
    }

    /// A leaf is a tensor not produced by a recorded op.
    pub fn is_leaf(&self) -> bool {
        self.0.grad_fn.is_none()
    }

    /// The node that produced this tensor, if recorded.
    pub fn grad_fn(&self) -> Option<Arc<Node>> {
        self.0.grad_fn.clone()
    }

    pub(crate) fn output_nr(&self) -> usize {
        self.0.output_nr as usize
    }

    pub(crate) fn grad_slot(&self) -> Arc<GradSlot> {
        self.0.grad_slot.get_or_init(|| Arc::new(GradSlot::default())).clone()
    }

    /// The accumulated gradient (leaves, or non-leaves after [`retain_grad`](Self::retain_grad)).
    pub fn grad(&self) -> Option<Tensor> {
        self.0.grad_slot.get().and_then(|s| s.get())
    }

    /// Replace the gradient (`None` frees it — PyTorch's `zero_grad(set_to_none=True)`).
    pub fn set_grad(&self, grad: Option<Tensor>) -> Result<()> {
        if let Some(g) = &grad
            && g.shape() != self.shape()
        {
            return Err(TensorError::ShapeMismatch {
                op: "set_grad",
                lhs: g.shape().to_vec(),
                rhs: self.shape().to_vec(),
            });
        }
        if grad.is_none() && self.0.grad_slot.get().is_none() {
            return Ok(());
        }
        self.grad_slot().set(grad);
        Ok(())
    }

    /// Run `hook` once per backward pass, right after this leaf's gradient for the pass is
    /// complete (`None` removes it). The hook reads the gradient with [`grad`](Self::grad).
    pub fn set_grad_ready_hook(&self, hook: Option<autograd::GradReadyHook>) {
        *self.grad_slot().ready_hook.lock() = hook;
    }

    /// Keep this non-leaf's gradient after backward.
    pub fn retain_grad(&self) {
        let slot = self.grad_slot();
        if let Some(node) = &self.0.grad_fn {
            let mut r = node.retained.lock();
            if !r.iter().any(|(nr, s)| *nr == self.output_nr() && Arc::ptr_eq(s, &slot)) {
                r.push((self.output_nr(), slot));
            }
        }
    }

    /// The same data without autograd history (shares storage and version counter).
    pub fn detach(&self) -> Tensor {
        Tensor::from_parts(self.0.storage.clone(), self.0.layout.clone(), self.0.dtype)
    }

    /// Backward from a scalar (PyTorch's `loss.backward()`).
    pub fn backward(&self) -> Result<()> {
        if self.numel() != 1 {
            return Err(TensorError::Autograd {
                detail: format!(
                    "grad can be implicitly created only for scalar outputs (this tensor has shape {:?}); use backward_with(grad, ...)",
                    self.shape()
                ),
            });
        }
        let one = crate::ops::creation::full_on(self.0.storage.allocator(), self.shape(), self.dtype(), 1.0)?;
        autograd::backward(&[(self.clone(), one)], false)
    }

    /// Backward with an explicit gradient of this tensor.
    pub fn backward_with(&self, grad: &Tensor, retain_graph: bool) -> Result<()> {
        autograd::backward(&[(self.clone(), grad.clone())], retain_graph)
    }

    /// Backward from a scalar, keeping the graph for another backward.
    pub fn backward_retain(&self) -> Result<()> {
        if self.numel() != 1 {
            return Err(TensorError::Autograd {
                detail: format!("grad can be implicitly created only for scalar outputs (shape {:?})", self.shape()),
            });
        }
        let one = crate::ops::creation::full_on(self.0.storage.allocator(), self.shape(), self.dtype(), 1.0)?;
        autograd::backward(&[(self.clone(), one)], true)
    }

    /// Record an op: `outputs` were computed from `inputs` by an op whose backward is `f`.
    /// Returns the outputs wired into the graph when grad mode is on and an input requires grad;
    /// otherwise returns them unchanged (and drops `f`, releasing whatever it saved).
    pub fn from_op(outputs: Vec<Tensor>, inputs: &[&Tensor], f: Box<dyn BackwardFn>) -> Vec<Tensor> {
        if !autograd::is_grad_enabled() || !inputs.iter().any(|t| t.requires_grad()) {
            return outputs;
        }
        let edges: Vec<Option<Edge>> = inputs.iter().map(|t| t.edge()).collect();
        let node = Node::new(f, edges, outputs.len());
        outputs
            .into_iter()
            .enumerate()
            .map(|(i, o)| {
                let can_grad = o.dtype().is_floating_point();
                Tensor(Arc::new(TensorImpl {
                    storage: o.0.storage.clone(),
                    layout: o.0.layout.clone(),
                    dtype: o.0.dtype,
                    contiguous: o.0.contiguous,
                    requires_grad: AtomicBool::new(false),
                    grad_fn: if can_grad { Some(node.clone()) } else { None },
                    output_nr: i as u32,
                    grad_slot: OnceLock::new(),
                }))
            })
            .collect()
    }

    /// Single-output convenience for [`from_op`](Self::from_op).
    pub fn from_op1(output: Tensor, inputs: &[&Tensor], f: impl BackwardFn + 'static) -> Tensor {
        if !autograd::is_grad_enabled() || !inputs.iter().any(|t| t.requires_grad()) {
            return output;
        }
        Tensor::from_op(vec![output], inputs, Box::new(f)).pop().expect("from_op returns one output per input output")
    }

    /// Whether recording an op on these inputs would build a graph.
    #[inline]
    pub fn needs_graph(inputs: &[&Tensor]) -> bool {
        autograd::is_grad_enabled() && inputs.iter().any(|t| t.requires_grad())
    }

    fn edge(&self) -> Option<Edge> {
        if let Some(n) = &self.0.grad_fn {
            return Some(Edge::Node { node: n.clone(), output_nr: self.output_nr() });
        }
        if self.0.requires_grad.load(Ordering::Relaxed) {
            return Some(Edge::Leaf(self.grad_slot()));
        }
        None
    }

    /// Shape as an owned small vector.
    pub(crate) fn shape_vec(&self) -> Shape {
        SmallVec::from_slice(self.shape())
    }
}
