//! `ferrite train --distributed`: one rank per process under `mpirun`, gradients averaged over
//! MPI (feature `mpi`; without it the flag is an error that says how to build with it).
//!
//! Every rank builds the same model (rank 0's weights are broadcast), reads its own share of the
//! training set through a `DistributedSampler`, evaluates the whole test set, and steps the same
//! optimizer on the same averaged gradients, so the replicas stay identical. Rank 0 alone prints
//! (the other ranks' stdout goes to /dev/null; their errors still reach stderr), draws the
//! progress bar and writes checkpoints and weights; the closing summary lists every rank's peak
//! memory.

use ferrite_memory::{Device, allocator, format_size};
use ferrite_nn::Module;
use ferrite_tensor::Tensor;

use super::TrainError;

#[cfg(feature = "mpi")]
use ferrite_parallel::distributed::{DdpOptions, GradientSync, ProcessGroup};

/// This process's rank in a `--distributed` run.
pub struct Distributed {
    #[cfg(feature = "mpi")]
    group: ProcessGroup,
    rank: usize,
    world_size: usize,
}

/// Gradient averaging for the trainer's step (see `Stepper`).
#[cfg(feature = "mpi")]
pub struct StepSync(GradientSync);

/// Never built without MPI.
#[cfg(not(feature = "mpi"))]
pub enum StepSync {}

impl Distributed {
    /// Join the MPI job (`--distributed`), or the typed error of a build without MPI.
    pub fn init() -> Result<Distributed, TrainError> {
        #[cfg(feature = "mpi")]
        {
            let group = ProcessGroup::init()?;
            let (rank, world_size) = (group.rank(), group.world_size());
            if rank != 0 {
                silence_stdout();
            }
            Ok(Distributed { group, rank, world_size })
        }
        #[cfg(not(feature = "mpi"))]
        Err(ferrite_parallel::distributed::DistributedError::NotBuiltWithMpi.into())
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Broadcast rank 0's weights into `model` and arm gradient averaging for it.
    pub fn sync_for(&self, model: &dyn Module) -> Result<StepSync, TrainError> {
        #[cfg(feature = "mpi")]
        {
            Ok(StepSync(GradientSync::new(model, self.group.comm(), DdpOptions::default())?))
        }
        #[cfg(not(feature = "mpi"))]
        {
            let _ = model;
            Err(ferrite_parallel::distributed::DistributedError::NotBuiltWithMpi.into())
        }
    }

    /// Every rank's peak allocated and reserved bytes on `device`, one line per rank.
    pub fn memory_lines(&self, device: &Device) -> Result<Vec<String>, TrainError> {
        let stats = allocator(device).memory_stats();
        let mine = vec![stats.allocated_bytes.all.peak as f64, stats.reserved_bytes.all.peak as f64];
        #[cfg(feature = "mpi")]
        let all = self.group.comm().all_gather_f64(mine)?;
        #[cfg(not(feature = "mpi"))]
        let all = mine;
        Ok(all
            .chunks(2)
            .enumerate()
            .map(|(rank, v)| {
                format!(
                    "rank {rank}: peak allocated {}, peak reserved {} on {device}",
                    format_size(v[0] as u64),
                    format_size(v[1] as u64)
                )
            })
            .collect())
    }
}

impl StepSync {
    /// Backward of one micro-batch; gradients are averaged over ranks when `last_micro_step`
    /// (the accumulation group is complete), else only accumulated locally (`no_sync`).
    pub fn backward(&self, loss: &Tensor, last_micro_step: bool) -> Result<(), TrainError> {
        #[cfg(feature = "mpi")]
        {
            if last_micro_step {
                self.0.backward(loss)?;
            } else {
                let _local = self.0.no_sync();
                self.0.backward(loss)?;
            }
            Ok(())
        }
        #[cfg(not(feature = "mpi"))]
        {
            let _ = (loss, last_micro_step);
            match *self {}
        }
    }

    /// Average the gradients accumulated so far (a partial accumulation group at epoch end).
    pub fn synchronize(&self) -> Result<(), TrainError> {
        #[cfg(feature = "mpi")]
        {
            Ok(self.0.synchronize()?)
        }
        #[cfg(not(feature = "mpi"))]
        match *self {}
    }

    /// End of training: the last status exchange (reports a rank that failed after its last step).
    pub fn finish(self) -> Result<(), TrainError> {
        #[cfg(feature = "mpi")]
        {
            Ok(self.0.finish()?)
        }
        #[cfg(not(feature = "mpi"))]
        match self {}
    }
}

/// Ranks other than 0 print nothing: their stdout goes to /dev/null.
#[cfg(all(feature = "mpi", unix))]
fn silence_stdout() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let _ = std::io::stdout().flush();
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: dup2 on two descriptors this process owns (the open /dev/null and stdout);
        // stdout's buffer was flushed above, and `null` stays valid for the duration of the call.
        unsafe {
            libc::dup2(null.as_raw_fd(), 1);
        }
    }
}

#[cfg(all(feature = "mpi", not(unix)))]
fn silence_stdout() {}
