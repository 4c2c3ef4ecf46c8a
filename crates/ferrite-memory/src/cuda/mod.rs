//! NVIDIA GPUs through the CUDA driver API: the part of the caching allocator that talks to the
//! driver.
//!
//! Why a trait between the allocator and the driver: the bookkeeping that PyTorch users rely on
//! — segments from `cuMemAlloc`, expandable segments through the virtual-memory API, events
//! that hold back a block used on another stream — must be right before any GPU runs it, and a
//! machine without a GPU (CI, every developer laptop) must be able to check it. [`CudaDriver`]
//! is the handful of driver calls the allocator makes; [`CudaMemory`] is the allocator's
//! [`crate::raw_memory::RawMemory`] backend over any driver. The real driver (libcuda, loaded
//! at run time) implements the trait in the CUDA backend; tests implement it with a fake driver
//! that checks every call sequence (no double free, no memory returned while a stream may use it,
//! mappings balanced).
mod driver;
mod memory;

pub use driver::{CudaDriver, CudaDriverError};
pub use memory::CudaMemory;
