//! Data parallelism across devices (see `docs/architecture.md` in the repository, "The map of crates").
//!
//! - [`DataParallel`]: one process, one replica per device, the batch split between them, the loss
//!   computed on every replica (balanced memory), gradients reduced onto the primary.
//! - Devices are chosen with `ferrite_memory::select_devices` (`--devices`, `FERRITE_VISIBLE_DEVICES`).

pub mod data_parallel;
mod error;

pub use data_parallel::{DataParallel, DeviceMemory, MemoryReport, Shard, StepLoss, split_sizes};
pub use error::{ParallelError, Result};
