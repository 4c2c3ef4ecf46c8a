//! Device memory for ferrite.
//!
//! Every byte a tensor holds comes from one [`CachingAllocator`] per [`Device`]; the allocator's
//! statistics are therefore the truth about what tensors hold. See `../shared/DESIGN.md`,
//! "The memory spine".
//!
//! NOTE (interim): this file fixes the public contract that `ferrite-tensor` builds on. The
//! allocator internals behind it are being replaced by the full PyTorch-semantics implementation
//! (issue 2); the signatures below stay.

mod device;
mod error;
mod gpu_catalogue;
mod caching_allocator;
mod registry;

pub use caching_allocator::{Block, CachingAllocator};
pub use device::{Device, DeviceKind};
pub use error::MemoryError;
pub use gpu_catalogue::{GpuProfile, GPU_CATALOGUE};
pub use registry::allocator;

/// Convenience result alias for this crate.
pub type Result<T, E = MemoryError> = std::result::Result<T, E>;
