//! Data parallelism across devices (see `docs/architecture.md` in the repository, "The map of crates").
//!
//! Intentionally empty: no open issue asks for it yet. It exists so the workspace has the layout
//! of the design and the facade crate can re-export it once it is filled.

/// Several processes (MPI ranks), one replica each: `DistributedDataParallel` (feature `mpi`).
pub mod distributed;
