//! Data parallelism across processes over MPI (PyTorch's `DistributedDataParallel`).
//!
//! Needs the `mpi` cargo feature (off by default: it builds against the system's OpenMPI, from
//! Debian's `libopenmpi-dev`, `openmpi-bin` and `libclang-dev`). Without it only the error type
//! exists, so a program can say how to get it ([`DistributedError::NotBuiltWithMpi`]).
//!
//! Launch the same program once per rank with `mpirun -np 2 prog` (one machine) or
//! `mpirun -H host1,host2 -np 2 prog` (several): [`ProcessGroup::init`] finds its rank and world
//! size; [`DistributedDataParallel`] keeps the replicas identical; each rank reads its share of
//! the data through `ferrite_data::DistributedSampler`. [`ZeroRedundancy`] shards the optimizer
//! state (ZeRO-1) and the gradients too (ZeRO-2) over the same ranks; each rank's pieces go into
//! a sharded checkpoint and come back at any world size (`zero_checkpoint.rs`).

#[cfg(feature = "mpi")]
mod bucket;
mod comm_dtype;
#[cfg(feature = "mpi")]
mod ddp;
mod error;
#[cfg(feature = "mpi")]
mod fully_sharded;
#[cfg(feature = "mpi")]
mod grad_reduce_scatter;
#[cfg(feature = "mpi")]
mod host_values;
#[cfg(feature = "mpi")]
mod liveness;
#[cfg(feature = "mpi")]
mod process_group;
#[cfg(feature = "mpi")]
mod reducer;
#[cfg(feature = "mpi")]
mod zero;
#[cfg(feature = "mpi")]
mod zero_checkpoint;

pub use comm_dtype::CommDtype;
#[cfg(feature = "mpi")]
pub use ddp::{DdpOptions, DistributedDataParallel, GradientSync, NoSync};
pub use error::{DistributedError, Result};
#[cfg(feature = "mpi")]
pub use fully_sharded::FullySharded;
#[cfg(feature = "mpi")]
pub use process_group::{Comm, DEFAULT_TIMEOUT_S, Pending, ProcessGroup, RankStatus};
#[cfg(feature = "mpi")]
pub use reducer::StepTimings;
#[cfg(feature = "mpi")]
pub use zero::{ZeroOptions, ZeroRedundancy, ZeroStage, ZeroStepOutcome};
#[cfg(feature = "mpi")]
pub use zero_checkpoint::ShardPieceState;

/// Whether this build can train over MPI (the `mpi` feature).
pub const MPI_ENABLED: bool = cfg!(feature = "mpi");

/// The MPI library this process is linked against, as it describes itself
/// (`MPI_Get_library_version`, e.g. `Open MPI v4.1.4, package: Debian OpenMPI, ...`); the first
/// line, trimmed. The MPI standard allows the call before `MPI_Init` and rsmpi documents it so:
/// it neither initializes MPI nor needs `mpirun`. `None` when the description is not UTF-8.
#[cfg(feature = "mpi")]
pub fn mpi_library_version() -> Option<String> {
    let text = mpi::environment::library_version().ok()?;
    let first = text.trim_matches(|c: char| c == '\0' || c.is_whitespace()).lines().next()?.trim().to_string();
    (!first.is_empty()).then_some(first)
}
