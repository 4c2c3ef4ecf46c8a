//! The one error type of the parallel layer.
use thiserror::Error;

/// Every failure `ferrite-parallel` reports, for one process over several devices (`DataParallel`)
/// and for several processes over MPI (`distributed`, where it is also named `DistributedError`).
/// Errors of the layers below (a tensor op, an OOM on one replica's device, a bad device list) pass
/// through unchanged, so a trainer can still ask for the allocator's OOM diagnosis.
#[derive(Debug, Error)]
pub enum ParallelError {
    /// `DataParallel` was given no device.
    #[error("DataParallel needs at least one device; pass e.g. `--device sim:a100-40gb --devices 0,1`")]
    NoDevices,
    /// The same device listed twice: two replicas would share one allocator and one copy of the
    /// parameters.
    #[error("DataParallel: device {device} is listed twice (devices: {devices}); list each device once")]
    DuplicateDevice { device: String, devices: String },
    /// A batch whose tensors disagree on dim 0, or have no dim 0 to scatter along.
    #[error(
        "DataParallel: cannot scatter the batch along dim 0: tensor {index} has shape {shape:?}, the first has {batch} samples; every tensor of a batch needs the same dim 0"
    )]
    BatchMismatch { index: usize, shape: Vec<usize>, batch: usize },
    /// An empty batch (nothing to scatter) or no tensor at all.
    #[error("DataParallel: the batch is empty (0 samples or no tensors); there is nothing to run")]
    EmptyBatch,
    /// Sequence lengths that do not match the batch.
    #[error("DataParallel: {lengths} sequence lengths for a batch of {batch}; give one length per sample")]
    LengthsMismatch { lengths: usize, batch: usize },
    /// A replica's thread panicked (a bug in the model code); the step is abandoned.
    #[error("DataParallel: the replica on {device} panicked: {message}")]
    ReplicaPanicked { device: String, message: String },
    /// A loss that is not a single number.
    #[error(
        "DataParallel: the loss of the replica on {device} has shape {shape:?}; the loss function must return one number (a mean over its samples)"
    )]
    LossNotScalar { device: String, shape: Vec<usize> },
    /// `DataParallel::step` was given an optimizer that updates a tensor which is not one of
    /// `DataParallel::parameters()`: its gradient is never reduced there, so it would silently
    /// never train.
    #[error(
        "DataParallel::step: the optimizer updates a tensor of shape {shape:?} on {device} that is not one of DataParallel::parameters() (each parameter's owner replica, or its pieces under OwnerPolicy::Sharded), so it never receives the reduced gradient; build the optimizer from dp.parameters(), not dp.module().parameters()"
    )]
    OptimizerNotOnOwners { shape: Vec<usize>, device: String },
    // ---- several processes (MPI ranks; `crate::distributed`) ----
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
    /// A collective missed its deadline and the peers' liveness probe found rank(s) `dead` gone
    /// (their process no longer exists: killed, crashed, out of memory).
    #[error(
        "rank {rank}: {} died during {op} (no answer within {waited_s} s, and its process is gone); this rank stops too: restart the job, with --resume from the last checkpoint",
        rank_list(dead)
    )]
    PeerDied { rank: usize, dead: Vec<usize>, op: &'static str, waited_s: u64 },
    #[error("rank {rank}: the MPI communication thread is gone ({detail}); the process group cannot be used any more")]
    CommunicationStopped { rank: usize, detail: String },
    /// `ZeroRedundancy::shard_optimizer` was given an optimizer over a tensor that is not a
    /// trainable parameter of the model ZeRO wraps: it would never receive a gradient there.
    #[error(
        "rank {rank}: parameter {index} of the optimizer's group {group} (shape {shape:?}) is not a trainable parameter of the model wrapped by ZeRO; build the optimizer from that model's parameters()"
    )]
    ZeroUnknownParameter { rank: usize, group: usize, index: usize, shape: Vec<usize> },
    /// ZeRO-3 over a model whose parameters form no wrappable unit (no `name.<i>.…` blocks).
    #[error(
        "--zero 3: model {model} has no wrappable units (ZeRO-3 gathers and frees the parameters of each repeated block, found from parameter names like `blocks.3.…`, and this model has none); use --zero 2 (gradients and optimizer state sharded) or a model with blocks"
    )]
    ZeroNoUnits { model: String },
    /// A sharded checkpoint's state cannot be put into this rank's ZeRO shards.
    #[error("rank {rank}: the checkpoint's ZeRO state does not fit this run: {detail}")]
    ZeroState { rank: usize, detail: String },
    /// A setting every rank must share differs between ranks (e.g. `--zero` given to some ranks
    /// only): their collectives would not pair up.
    #[error(
        "rank {rank} has {setting} = {value} but rank 0 has {rank0}; every rank of the job must be started with the same {setting} (one mpirun command line for all ranks)"
    )]
    SettingMismatch { rank: usize, setting: &'static str, value: String, rank0: String },
    #[error("rank {rank}: this DistributedDataParallel already stopped after an error and cannot run more steps")]
    AlreadyFailed { rank: usize },
    /// A layer, loss or tensor op failed on a replica.
    #[error(transparent)]
    Nn(#[from] ferrite_nn::NnError),
    /// A tensor op failed (shapes, devices, out of memory).
    #[error(transparent)]
    Tensor(#[from] ferrite_tensor::TensorError),
    /// The optimizer refused its step.
    #[error(transparent)]
    Optim(#[from] ferrite_optim::OptimError),
    /// A checkpoint file that cannot be read.
    #[error(transparent)]
    Io(#[from] ferrite_io::IoError),
    /// A device or device list that cannot be used.
    #[error(transparent)]
    Memory(#[from] ferrite_memory::MemoryError),
}

impl ParallelError {
    /// Whether this rank stops because of another rank (one that failed, died or hangs, or a
    /// collective that can no longer finish), not because of its own work: it then has nothing
    /// to tell the others and no reason to linger before exiting.
    pub fn is_peer_failure(&self) -> bool {
        matches!(
            self,
            ParallelError::PeerFailed { .. }
                | ParallelError::PeerDied { .. }
                | ParallelError::Timeout { .. }
                | ParallelError::CommunicationStopped { .. }
        )
    }

    /// The allocator's out-of-memory report, if this error is an OOM on some replica.
    pub fn oom_report(&self) -> Option<&ferrite_memory::OutOfMemoryReport> {
        match self {
            ParallelError::Nn(e) => e.oom_report(),
            ParallelError::Tensor(e) => e.oom_report(),
            ParallelError::Memory(e) => e.oom_report(),
            _ => None,
        }
    }
}

/// `rank 1` or `ranks 1, 2`.
fn rank_list(ranks: &[usize]) -> String {
    let list: Vec<String> = ranks.iter().map(ToString::to_string).collect();
    match ranks.len() {
        1 => format!("rank {}", list[0]),
        _ => format!("ranks {}", list.join(", ")),
    }
}

/// Result alias of this crate.
pub type Result<T, E = ParallelError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::ParallelError;

    #[test]
    fn a_dead_peer_is_named() {
        let one = ParallelError::PeerDied { rank: 0, dead: vec![1], op: "all-reduce", waited_s: 3 }.to_string();
        assert!(one.starts_with("rank 0: rank 1 died during all-reduce (no answer within 3 s"), "{one}");
        let two = ParallelError::PeerDied { rank: 2, dead: vec![0, 1], op: "broadcast", waited_s: 30 }.to_string();
        assert!(two.starts_with("rank 2: ranks 0, 1 died during broadcast"), "{two}");
    }
}
