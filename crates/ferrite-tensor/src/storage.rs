//! A tensor's bytes: one allocator block, shared by every view of it, plus the version counter
//! that lets autograd notice in-place writes to something backward still needs.
//!
//! The block can be *released* and later *refilled* while the storage (and every handle and
//! saved-for-backward alias of it) stays alive: PyTorch's `storage.resize_(0)` / re-allocation
//! that FSDP (ZeRO-3) uses to free a unit's gathered parameters between its forward and its
//! backward. A released storage keeps its size but has no bytes; kernels touching it get
//! [`crate::TensorError::StorageReleased`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ferrite_memory::{Block, CachingAllocator, Device};
use parking_lot::RwLock;

use crate::backend::{KernelBackend, kernels_for};
use crate::error::Result;

pub struct Storage {
    /// `None` once released (see the module docs).
    block: RwLock<Option<Block>>,
    /// Bytes asked for at allocation (kept while released).
    nbytes: usize,
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
        let block = allocator.allocate(nbytes)?;
        if let Device::Cuda { index } = allocator.device() {
            // The memory exists; so must the kernels that compute on it (the driver's runtime, or
            // the host emulator under FERRITE_CUDA_EMULATOR=1): never a storage nothing can use.
            crate::backend::cuda::backend(*index).check_usable()?;
        }
        let kernels = kernels_for(allocator.device());
        Ok(Arc::new(Storage {
            nbytes: block.requested_size(),
            block: RwLock::new(Some(block)),
            allocator: allocator.clone(),
            kernels,
            version: AtomicU64::new(0),
        }))
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
        self.nbytes
    }

    /// Host pointer to the first byte; `None` on `meta`, for empty and for released storages.
    pub(crate) fn ptr(&self) -> Option<*mut u8> {
        self.block.read().as_ref().and_then(|b| b.host_ptr()).map(|p| p.as_ptr())
    }

    /// Whether [`release`](Self::release) gave the bytes back (and nothing refilled them yet).
    pub fn is_released(&self) -> bool {
        self.block.read().is_none()
    }

    /// Give the bytes back to the allocator now; the storage keeps its size and every handle to
    /// it stays valid, but reading or writing it is an error until it is refilled.
    pub(crate) fn release(&self) {
        let block = self.block.write().take();
        drop(block);
    }

    /// Take `other`'s bytes (same size, same device) as this storage's, leaving `other`
    /// released. The version is not bumped: the caller puts back the values the storage held.
    pub(crate) fn take_bytes_of(&self, other: &Storage) -> bool {
        if other.nbytes != self.nbytes || !same_device(self, other) {
            return false;
        }
        let Some(block) = other.block.write().take() else { return false };
        *self.block.write() = Some(block);
        true
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
        self.block.read().as_ref().map_or(0, Block::size)
    }

    /// The device address (distinct per live block, also on meta).
    /// `0` while released.
    pub fn addr(&self) -> u64 {
        self.block.read().as_ref().map_or(0, Block::addr)
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

    #[test]
    fn a_released_storage_errors_when_used_and_a_refill_restores_it_without_a_version_bump() {
        let w = crate::Tensor::from_vec(vec![1f32, 2.0, 3.0], &[3], &ferrite_memory::Device::Cpu).unwrap();
        let version = w.storage().version();
        w.release_storage();
        assert!(w.is_storage_released());
        let e = w.to_vec::<f32>().unwrap_err();
        assert!(matches!(e, crate::error::TensorError::StorageReleased { .. }), "{e:?}");
        let wrong = crate::Tensor::from_vec(vec![1f32, 2.0], &[2], &ferrite_memory::Device::Cpu).unwrap();
        assert!(matches!(w.refill_storage_from(wrong), Err(crate::error::TensorError::StorageRefill { .. })));
        w.refill_storage_from(
            crate::Tensor::from_vec(vec![4f32, 5.0, 6.0], &[3], &ferrite_memory::Device::Cpu).unwrap(),
        )
        .unwrap();
        assert_eq!(w.to_vec::<f32>().unwrap(), vec![4.0, 5.0, 6.0]);
        assert_eq!(w.storage().version(), version);
    }

    /// Without the emulator (`FERRITE_CUDA_EMULATOR`) and without an NVIDIA driver, a tensor on
    /// `cuda:N` is one typed error naming the driver and what to use instead (never a panic, never
    /// a storage that pretends to compute); through an allocator that backs nothing, the kernels'
    /// runtime refuses it with a typed error too. (With a driver or the emulator there is nothing
    /// to check here: `tests/cuda_backend.rs` runs the device.)
    #[test]
    fn a_tensor_on_cuda_without_a_driver_is_one_typed_error() {
        use ferrite_memory::{AllocatorConfig, CachingAllocator, Device, MemoryError};

        use crate::error::TensorError;
        use crate::{DType, Tensor};

        if ferrite_memory::cuda::emulator_enabled() || ferrite_memory::cuda::driver().is_ok() {
            return;
        }
        for index in [0, 3] {
            let cuda = Device::Cuda { index };
            let e = Tensor::zeros(&[4], DType::F32, &cuda).unwrap_err();
            assert!(
                matches!(&e, TensorError::Memory(MemoryError::CudaDriverNotFound { device, .. }) if *device == cuda.to_string()),
                "{e:?}"
            );
            let msg = e.to_string();
            assert!(msg.contains("`gpu:N`") && msg.contains("`cpu`"), "{msg}");
            let unbacked = std::sync::Arc::new(CachingAllocator::unbacked(cuda.clone(), AllocatorConfig::default()));
            match super::Storage::new(&unbacked, 16) {
                Err(TensorError::Cuda { device, detail, .. }) => {
                    assert_eq!(device, cuda.to_string());
                    assert!(detail.contains("driver"), "{detail}");
                }
                Err(e) => panic!("{e:?}"),
                Ok(_) => panic!("a storage on {cuda} without a driver"),
            }
        }
    }
}
