//! Data parallelism across devices (see `docs/architecture.md` in the repository, "The map of crates").
//!
//! - [`DataParallel`]: one process, one replica per device, the batch split between them, the loss
//!   computed on every replica (balanced memory), each gradient reduced onto its parameter's owner
//!   replica (balanced optimizer state).
//! - [`distributed`]: several processes (MPI ranks, feature `mpi`): `DistributedDataParallel`,
//!   bucketed gradient all-reduce overlapping backward, `no_sync`, rank-0 checkpoints.
//! - Devices are chosen with `ferrite_memory::select_devices` (`--devices`, `FERRITE_VISIBLE_DEVICES`).

pub mod data_parallel;
/// Several processes (MPI ranks), one replica each: `DistributedDataParallel` (feature `mpi`).
pub mod distributed;
mod error;

pub use data_parallel::{DataParallel, DeviceMemory, MemoryReport, OwnerPolicy, Piece, Shard, StepLoss, split_sizes};
pub use error::{ParallelError, Result};
