//! What can go wrong when several processes train one model.

use thiserror::Error;

/// Errors of multi-process (MPI) data parallelism.
#[derive(Debug, Error)]
pub enum DistributedError {
    #[error(
        "distributed training needs MPI, and this ferrite was built without it: install libopenmpi-dev, openmpi-bin and libclang-dev, rebuild with `cargo build --release --features mpi`, and launch with `mpirun -np 2 target/release/ferrite train --distributed ...`"
    )]
    NotBuiltWithMpi,
    #[error("MPI is already initialized in this process: create one ProcessGroup per process and pass it around")]
    AlreadyInitialized,
    #[error(
        "the MPI library provides thread level {provided}, but ferrite's communication thread needs at least MPI_THREAD_SERIALIZED: use an MPI built with thread support (Debian's OpenMPI has it)"
    )]
    ThreadSupport { provided: String },
    #[error("rank {rank}: {detail}; every rank must build the same model (same code, same configuration)")]
    ParameterMismatch { rank: usize, detail: String },
    #[error(
        "rank {rank}: parameter(s) {names:?} received no gradient in this backward pass; if the model really leaves them unused, build the wrapper with DdpOptions::find_unused_parameters(true), otherwise make the loss depend on them"
    )]
    UnusedParameters { rank: usize, names: Vec<String> },
    #[error("rank {rank} failed, so every rank stops: {message}")]
    PeerFailed { rank: usize, message: String },
    #[error(
        "rank {rank}: no answer from the other ranks within {waited_s} s during {op}: a rank probably died or hangs (mpirun's output names it); if a step legitimately takes longer, raise FERRITE_DDP_TIMEOUT_S"
    )]
    Timeout { rank: usize, op: &'static str, waited_s: u64 },
    #[error("rank {rank}: the MPI communication thread is gone ({detail}); the process group cannot be used any more")]
    CommunicationStopped { rank: usize, detail: String },
    #[error("rank {rank}: this DistributedDataParallel already stopped after an error and cannot run more steps")]
    AlreadyFailed { rank: usize },
    #[error(transparent)]
    Tensor(#[from] ferrite_tensor::TensorError),
    #[error(transparent)]
    Nn(#[from] ferrite_nn::NnError),
}

pub type Result<T, E = DistributedError> = std::result::Result<T, E>;
