//! Device memory for ferrite.
//!
//! Every byte a tensor holds comes from one [`CachingAllocator`] per [`Device`]; the allocator's
//! statistics are therefore the truth about what tensors hold. See `docs/architecture.md` in the
//! repository, "The memory spine".
//!
//! - [`raw_memory`]: backends that obtain segments — host memory, a simulated GPU with a real
//!   card's capacity ([`GPU_CATALOGUE`]), address-only `meta` memory, and real GPUs' buffers
//!   through wgpu ([`gpu`]).
//! - [`CachingAllocator`]: PyTorch's caching-allocator semantics (rounding, pools, best fit,
//!   split/merge, `max_split_size`, the OOM ladder, garbage collection, memory fraction),
//!   configured with [`AllocatorConfig`] in `PYTORCH_CUDA_ALLOC_CONF` syntax.
//! - [`MemoryStats`], [`memory_summary`], history ([`TraceEntry`]) and [`MemorySnapshot`]s.
//! - [`OutOfMemoryReport`]: an OOM is a value that says *exhausted* or *fragmented* and what to do.
//! - [`replay`]: run a recorded allocation trace through an allocator.
//!
//! ```
//! use ferrite_memory::{CachingAllocator, Device};
//! let alloc = CachingAllocator::new(Device::parse("sim:a100-40gb").unwrap());
//! let b = alloc.allocate(600 * 1024).unwrap();
//! assert_eq!(alloc.memory_allocated(), 600 * 1024);
//! assert_eq!(alloc.memory_reserved(), 2 << 20); // one 2 MiB small-pool segment
//! drop(b);
//! alloc.empty_cache();
//! assert_eq!(alloc.memory_reserved(), 0);
//! ```

mod allocator_core;
mod block_pool;
mod caching_allocator;
mod capacity;
mod config;
pub mod cuda;
mod device;
mod device_kind;
mod error;
pub mod gpu;
mod gpu_catalogue;
pub mod history;
mod memory_scope;
pub mod memory_summary;
pub mod oom;
pub mod raw_memory;
mod registry;
pub mod replay;
pub mod size_rules;
pub mod snapshot;
pub mod stats;
pub mod visible_devices;

pub use caching_allocator::{Block, CachingAllocator};
pub use config::{ALLOC_CONF_ENV, AllocatorConfig};
pub use device::Device;
pub use device_kind::DeviceKind;
pub use error::MemoryError;
pub use gpu_catalogue::{GPU_CATALOGUE, GpuProfile};
pub use history::{Frame, TraceAction, TraceEntry};
pub use memory_scope::{MemoryScope, ScopeReport};
pub use oom::{
    OomDiagnosis, OutOfMemoryReport, PlannedRemedies, PlannedRemedy, Suggestion, SuggestionKind, format_size,
};
pub use registry::{allocator, configure, env_alloc_config, registered_devices};
pub use snapshot::{BlockSnapshot, BlockState, MemorySnapshot, SegmentSnapshot};
pub use stats::{MemoryStats, Stat, StatArray, StatType};
pub use visible_devices::{
    DeviceInfo, SIM_BOX_GPUS, VISIBLE_DEVICES_ENV, devices, list_devices, parse_device_list, select_devices,
    set_visible_devices,
};

/// Convenience result alias for this crate.
pub type Result<T, E = MemoryError> = std::result::Result<T, E>;
