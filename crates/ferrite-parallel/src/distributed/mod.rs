//! Data parallelism across processes over MPI (PyTorch's `DistributedDataParallel`).
//!
//! Needs the `mpi` cargo feature (off by default: it builds against the system's OpenMPI, from
//! Debian's `libopenmpi-dev`, `openmpi-bin` and `libclang-dev`). Without it only the error type
//! exists, so a program can say how to get it ([`DistributedError::NotBuiltWithMpi`]).
//!
//! Launch the same program once per rank with `mpirun -np 2 prog` (one machine) or
//! `mpirun -H host1,host2 -np 2 prog` (several): [`ProcessGroup::init`] finds its rank and world
//! size; [`DistributedDataParallel`] keeps the replicas identical; each rank reads its share of
//! the data through `ferrite_data::DistributedSampler`.

#[cfg(feature = "mpi")]
mod bucket;
#[cfg(feature = "mpi")]
mod ddp;
mod error;
#[cfg(feature = "mpi")]
mod process_group;
#[cfg(feature = "mpi")]
mod reducer;

#[cfg(feature = "mpi")]
pub use ddp::{DdpOptions, DistributedDataParallel, GradientSync, NoSync};
pub use error::{DistributedError, Result};
#[cfg(feature = "mpi")]
pub use process_group::{Comm, DEFAULT_TIMEOUT_S, Pending, ProcessGroup, RankStatus};
#[cfg(feature = "mpi")]
pub use reducer::StepTimings;

/// Whether this build can train over MPI (the `mpi` feature).
pub const MPI_ENABLED: bool = cfg!(feature = "mpi");
