//! A tensor's bytes: one allocator block, shared by every view of it, plus the version counter
//! that lets autograd notice in-place writes to something backward still needs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ferrite_memory::{Block, CachingAllocator, Device};

use crate::backend::{KernelBackend, kernels_for};
use crate::error::Result;

pub struct Storage {
    block: Block,
    allocator: Arc<CachingAllocator>,
    /// The kernels that compute on this storage's device (resolved once, at allocation).
    kernels: &'static dyn KernelBackend,
    version: AtomicU64,
}

impl Storage {
    /// Allocate `nbytes` (uninitialised) from `allocator`.
    #[track_caller]
    pub(crate) fn new(allocator: &Arc<CachingAllocator>, nbytes: usize) -> Result<Arc<Storage>> {
        #[cfg(not(feature = "gpu"))]
        if let Device::Gpu { .. } = allocator.device() {
            // Whatever its raw memory, no kernels compute on a GPU in this build.
            return Err(ferrite_memory::gpu::not_compiled(&allocator.device().to_string()).into());
        }
        if let Device::Cuda { .. } = allocator.device() {
            // The allocator works on a CUDA device; no kernels compute on it yet.
            return Err(
                ferrite_memory::MemoryError::CudaTensorsUnavailable { device: allocator.device().to_string() }.into()
            );
        }
        let block = allocator.allocate(nbytes)?;
        let kernels = kernels_for(allocator.device());
        Ok(Arc::new(Storage { block, allocator: allocator.clone(), kernels, version: AtomicU64::new(0) }))
    }

    pub fn device(&self) -> &Device {
        self.allocator.device()
    }

    /// The kernel backend of this storage's device.
    pub(crate) fn kernels(&self) -> &'static dyn KernelBackend {
        self.kernels
    }

    pub(crate) fn allocator(&self) -> &Arc<CachingAllocator> {
        &self.allocator
    }

    /// Bytes the allocator accounts for this storage.
    pub fn nbytes(&self) -> usize {
        self.block.requested_size()
    }

    /// Host pointer to the first byte; `None` on `meta` (and for empty storages).
    pub(crate) fn ptr(&self) -> Option<*mut u8> {
        self.block.host_ptr().map(|p| p.as_ptr())
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    pub(crate) fn bump_version(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// Bytes of the allocator block (the request rounded up; kernels may touch the padding).
    #[cfg(feature = "gpu")]
    pub(crate) fn block_size(&self) -> usize {
        self.block.size()
    }

    /// The device address (distinct per live block, also on meta).
    pub fn addr(&self) -> u64 {
        self.block.addr()
    }
}

/// Whether two storages live on the same device (cheap pointer test first).
pub(crate) fn same_device(a: &Storage, b: &Storage) -> bool {
    Arc::ptr_eq(&a.allocator, &b.allocator) || a.device() == b.device()
}

#[cfg(test)]
mod tests {
    /// The no-GPU build: a tensor on `gpu:N` — even through an allocator that hands out blocks
    /// without a context (`unbacked`) — is the typed error naming the `gpu` feature.
    #[cfg(not(feature = "gpu"))]
    #[test]
    fn no_tensor_lives_on_a_gpu_without_the_gpu_feature() {
        use ferrite_memory::{AllocatorConfig, CachingAllocator, Device, MemoryError};

        use crate::error::TensorError;
        use crate::{DType, Tensor};

        let gpu = Device::Gpu { index: 0 };
        let e = Tensor::zeros(&[4], DType::F32, &gpu).unwrap_err();
        assert!(matches!(e, TensorError::Memory(MemoryError::GpuNotCompiled { .. })), "{e:?}");
        assert!(e.to_string().contains("--features gpu"), "{e}");
        let unbacked = std::sync::Arc::new(CachingAllocator::unbacked(gpu, AllocatorConfig::default()));
        let e = match super::Storage::new(&unbacked, 16) {
            Ok(_) => panic!("a storage on gpu:0 in a build without the gpu feature"),
            Err(e) => e,
        };
        assert!(matches!(e, TensorError::Memory(MemoryError::GpuNotCompiled { .. })), "{e:?}");
    }

    /// Until CUDA kernels exist, a tensor on `cuda:N` is the typed error saying so and naming the
    /// devices to use instead — whether or not this machine has the driver, and whatever
    /// allocator backs the device (never a storage that pretends to compute).
    #[test]
    fn a_tensor_on_cuda_is_a_typed_error_naming_the_devices_to_use() {
        use ferrite_memory::{AllocatorConfig, CachingAllocator, Device, MemoryError};

        use crate::error::TensorError;
        use crate::{DType, Tensor};

        for index in [0, 3] {
            let cuda = Device::Cuda { index };
            let e = Tensor::zeros(&[4], DType::F32, &cuda).unwrap_err();
            assert!(
                matches!(&e, TensorError::Memory(MemoryError::CudaTensorsUnavailable { device }) if *device == cuda.to_string()),
                "{e:?}"
            );
            let msg = e.to_string();
            assert!(msg.contains(&format!("tensors on cuda:{index} are not available yet")), "{msg}");
            assert!(msg.contains("`gpu:N`") && msg.contains("`cpu`"), "{msg}");
            let unbacked = std::sync::Arc::new(CachingAllocator::unbacked(cuda, AllocatorConfig::default()));
            assert!(matches!(
                super::Storage::new(&unbacked, 16),
                Err(TensorError::Memory(MemoryError::CudaTensorsUnavailable { .. }))
            ));
        }
    }
}
