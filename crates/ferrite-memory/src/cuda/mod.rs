//! NVIDIA GPUs through the CUDA driver API: the part of the caching allocator that talks to the
//! driver.
//!
//! Why a trait between the allocator and the driver: the bookkeeping that PyTorch users rely on
//! — segments from `cuMemAlloc`, expandable segments through the virtual-memory API, events
//! that hold back a block used on another stream — must be right before any GPU runs it, and a
//! machine without a GPU (CI, every developer laptop) must be able to check it. [`CudaDriver`]
//! is the handful of driver calls the allocator makes; [`CudaMemory`] is the allocator's
//! [`crate::raw_memory::RawMemory`] backend over any driver. The real driver ([`LibCuda`]:
//! libcuda through cudarc, loaded at run time, so nothing CUDA is needed to build) implements
//! the trait; tests implement it with a fake driver that checks every call sequence (no double
//! free, no memory returned while a stream may use it, mappings balanced).
//!
//! Around the driver: [`library`] finds and checks libcuda once per process (a typed error for
//! no driver, an old one, a failed initialisation — never cudarc's panic), [`system`] numbers
//! the `cuda:N` devices (after `CUDA_VISIBLE_DEVICES`, then `FERRITE_VISIBLE_DEVICES`) and
//! describes them, [`visible`] reads `CUDA_VISIBLE_DEVICES` as CUDA does, to explain a list
//! that hides every GPU. [`PinnedHostAllocator`] caches page-locked host memory for staging
//! copies (PyTorch's `CachingHostAllocator`), over [`PinnedHostDriver`]. [`emulator`] is the
//! host-memory `cuda:0` of `FERRITE_CUDA_EMULATOR=1` (tests without a GPU).
mod driver;
pub mod emulator;
mod libcuda;
pub mod library;
mod memory;
mod pinned;
pub mod system;
pub mod visible;

pub use driver::{CudaDriver, CudaDriverError};
pub use emulator::{CUDA_EMULATOR_ENV, EMULATED_CAPACITY, EmulatedCuda, emulator_enabled};
pub(crate) use libcuda::open_raw_memory;
pub use libcuda::{LibCuda, open_memory, open_pinned};
pub use library::{CudaDriverInfo, DriverProblem, MIN_DRIVER_VERSION, driver};
pub use memory::CudaMemory;
pub use pinned::{PinnedBlock, PinnedHostAllocator, PinnedHostDriver, PinnedStats, pinned_round_size};
pub use system::{CUDA_VISIBLE_DEVICES_ENV, CudaDeviceInfo, context, cuda_device_count, cuda_devices, cuda_ordinal};
pub use visible::{CudaVisible, parse_cuda_visible_devices};
