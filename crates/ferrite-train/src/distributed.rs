//! `ferrite train --distributed`: one rank per process under `mpirun`, gradients averaged over
//! MPI (feature `mpi`; without it the flag is an error that says how to build with it).
//!
//! Every rank builds the same model (rank 0's weights are broadcast), reads its own share of the
//! training set through a `DistributedSampler`, evaluates its share of the test set
//! ([`EvalShare`]; the counts are summed over the ranks), and steps the same optimizer on the same
//! averaged gradients, so the replicas stay identical. Rank 0 alone prints
//! (the other ranks' stdout goes to /dev/null; their errors still reach stderr), draws the
//! progress bar and writes checkpoints, weights and the `--snapshot` (rank 0's allocator); the
//! closing summary lists every rank's peak memory.
//!
//! The image models read their share through a `DistributedSampler` over the images. The language
//! models read text streams, whose rows must continue from chunk to chunk (truncated BPTT), so the
//! unit shared out is a stream, not a chunk: [`StreamShare`] cuts the text into `ranks × batch`
//! streams and gives each rank a disjoint `batch` of them, reshuffled per epoch. One step of 2
//! ranks × `--batch-size B` then averages the same gradients as one process with `--batch-size 2B`.

use ferrite_data::{DistributedSampler, Sampler};
use ferrite_memory::{Device, allocator, format_size};
use ferrite_nn::Module;
use ferrite_optim::{GradScaler, Optim, Optimizer, UpdateRule};
use ferrite_parallel::distributed::CommDtype;
use ferrite_tensor::{Generator, Tensor};

use crate::error::TrainError;

#[cfg(feature = "mpi")]
use ferrite_parallel::distributed::{
    DdpOptions, FullySharded, GradientSync, ProcessGroup, ZeroOptions, ZeroRedundancy, ZeroStage,
};

/// This process's rank in a `--distributed` run.
pub struct Distributed {
    #[cfg(feature = "mpi")]
    group: ProcessGroup,
    rank: usize,
    world_size: usize,
}

/// Gradient averaging for the trainer's step (see `Stepper`): DDP's all-reduce, or ZeRO-1/2/3
/// (optimizer state, at stage 2 gradients and at stage 3 parameters too, sharded over the
/// ranks; the step itself then goes
/// through [`ZeroRedundancy::step`]: global-norm clipping, the inf verdict of every rank, the
/// all-gather of the updated parameters).
#[cfg(feature = "mpi")]
pub struct StepSync(SyncKind);

#[cfg(feature = "mpi")]
enum SyncKind {
    Ddp(GradientSync),
    // Boxed: ZeroRedundancy is several times GradientSync's size.
    Zero(Box<ZeroRedundancy>),
    /// ZeRO-3: the units' parameters gathered around their forward and backward.
    Fsdp(FullySharded),
}

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

    /// Every rank must run the same ZeRO stage (`0`: DDP): a rank started with another `--zero`
    /// would pair its collectives with the wrong ones. Every rank gets the same error, naming the
    /// first rank that differs from rank 0. So must `--zero-comm-dtype` (a bf16 block paired
    /// with an f32 one is garbage).
    #[cfg(feature = "mpi")]
    fn same_zero_stage(&self, stage: u32, comm: CommDtype) -> Result<(), TrainError> {
        let wire = |d: CommDtype| f64::from(d.size_in_bytes() as u32);
        let all = self.group.comm().all_gather_f64(vec![f64::from(stage), wire(comm)])?;
        let stage_name: fn(f64) -> String = |v| if v == 0.0 { "not given (DDP)".into() } else { format!("{v}") };
        let dtype_name: fn(f64) -> String = |v| if v == 2.0 { "bf16".into() } else { "f32".into() };
        // The stage first: a rank on another stage is named for that, whatever its dtype.
        for (k, (setting, say)) in [("--zero", stage_name), ("--zero-comm-dtype", dtype_name)].into_iter().enumerate() {
            if let Some((rank, v)) = all.chunks(2).enumerate().find(|(_, v)| v[k] != all[k]) {
                return Err(ferrite_parallel::ParallelError::SettingMismatch {
                    rank,
                    setting,
                    value: say(v[k]),
                    rank0: say(all[k]),
                }
                .into());
            }
        }
        Ok(())
    }

    /// Broadcast rank 0's weights into `model` and arm gradient averaging for it.
    pub fn sync_for(&self, model: &dyn Module) -> Result<StepSync, TrainError> {
        #[cfg(feature = "mpi")]
        {
            self.same_zero_stage(0, CommDtype::F32)?;
            Ok(StepSync(SyncKind::Ddp(GradientSync::new(model, self.group.comm(), DdpOptions::default())?)))
        }
        #[cfg(not(feature = "mpi"))]
        {
            let _ = model;
            Err(ferrite_parallel::distributed::DistributedError::NotBuiltWithMpi.into())
        }
    }

    /// As [`sync_for`](Self::sync_for), with ZeRO stage `stage` (1, 2 or 3; anything else is a
    /// typed error naming `--zero`): build the optimizer through [`StepSync::optimizer`]. Stage 3
    /// needs a model with wrappable units (repeated blocks); the error names the model otherwise.
    /// `comm` is what the collectives carry (`--zero-comm-dtype`); with bf16 the caller builds
    /// the model's parameters in bf16 (the shards keep f32 masters of them).
    pub fn zero_for(&self, model: &dyn Module, stage: u32, comm: CommDtype) -> Result<StepSync, TrainError> {
        #[cfg(feature = "mpi")]
        {
            // Agree first, so a rank given another (even an invalid) --zero is named on every rank.
            self.same_zero_stage(stage, comm)?;
            let Some(stage) = ZeroStage::from_number(stage) else {
                return Err(TrainError::InvalidArgument {
                    flag: "zero",
                    value: stage.to_string(),
                    expected: "1 (optimizer state sharded), 2 (and gradients) or 3 (and parameters)",
                });
            };
            let options = ZeroOptions::new(stage).comm_dtype(comm);
            if stage == ZeroStage::Three {
                let fsdp = FullySharded::new(model, model.type_name(), self.group.comm(), options)?;
                return Ok(StepSync(SyncKind::Fsdp(fsdp)));
            }
            let zero = ZeroRedundancy::new(model, self.group.comm(), options)?;
            Ok(StepSync(SyncKind::Zero(Box::new(zero))))
        }
        #[cfg(not(feature = "mpi"))]
        {
            let _ = (model, stage, comm);
            Err(ferrite_parallel::distributed::DistributedError::NotBuiltWithMpi.into())
        }
    }

    /// End of a distributed run: the last status exchange of `sync` (a rank that failed after its
    /// last step is reported here), then every rank's memory on `device`, printed by rank 0.
    pub fn finish_and_report(&self, sync: Option<StepSync>, device: &Device) -> Result<(), TrainError> {
        if let Some(sync) = sync {
            sync.finish()?;
        }
        println!("memory of every rank ({} ranks):", self.world_size());
        for line in self.memory_lines(device)? {
            println!("  {line}");
        }
        Ok(())
    }

    /// `(correct, seen)` summed over the ranks (an evaluation over [`EvalShare`]s). A rank whose
    /// own count failed still takes part, so no rank waits for it, and returns its own error; the
    /// others return an error naming it.
    pub fn sum_counts(&self, local: Result<(usize, usize), TrainError>) -> Result<(usize, usize), TrainError> {
        let (correct, seen) = self.sum_pairs(local.map(|(c, s)| (c as f64, s as f64)))?;
        Ok((correct as usize, seen as usize))
    }

    /// Two figures summed over the ranks (e.g. a loss summed over characters, and the characters),
    /// as [`sum_counts`](Self::sum_counts) sums counts: a rank whose own figures failed still takes
    /// part and returns its error; the others return an error naming it.
    pub fn sum_pairs(&self, local: Result<(f64, f64), TrainError>) -> Result<(f64, f64), TrainError> {
        let mine = match &local {
            Ok((a, b)) => vec![*a, *b, 0.0],
            Err(_) => vec![0.0, 0.0, 1.0],
        };
        #[cfg(feature = "mpi")]
        let all = self.group.comm().all_gather_f64(mine)?;
        #[cfg(not(feature = "mpi"))]
        let all = mine;
        // This rank's own error first.
        local?;
        if let Some(rank) = all.chunks(3).position(|c| c[2] != 0.0) {
            return Err(ferrite_parallel::ParallelError::PeerFailed {
                rank,
                message: "its evaluation failed (its own error is on its stderr)".into(),
            }
            .into());
        }
        Ok(all.chunks(3).fold((0.0, 0.0), |(a, b), v| (a + v[0], b + v[1])))
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

/// One rank's share of an evaluation set: indices `rank, rank + ranks, …` in order, with no
/// padding — unlike [`DistributedSampler`], which repeats samples so every share has the same
/// length, and so would count some test images twice. Evaluation needs no equal shares: the ranks
/// only meet once, to sum their counts ([`Distributed::sum_counts`]).
#[derive(Debug, Clone, Copy)]
pub struct EvalShare {
    ranks: usize,
    rank: usize,
}

impl EvalShare {
    /// Rank `rank`'s share among `ranks` (at least 1).
    pub fn new(ranks: usize, rank: usize) -> EvalShare {
        EvalShare { ranks: ranks.max(1), rank }
    }
}

impl Sampler for EvalShare {
    fn epoch_indices(&mut self, dataset_len: usize, _rng: &mut Generator) -> Vec<usize> {
        (self.rank..dataset_len).step_by(self.ranks).collect()
    }

    fn num_indices(&self, dataset_len: usize) -> usize {
        dataset_len.saturating_sub(self.rank).div_ceil(self.ranks)
    }
}

/// One rank's share of a language model's validation streams: streams `rank, rank + ranks, …` of
/// the `streams` the validation text is cut into, batch `c` being chunk `c` of those rows — so the
/// ranks together evaluate exactly the streams one process would, each stream's state carried from
/// chunk to chunk on the rank that owns it, and [`Distributed::sum_pairs`] adds up the losses.
#[derive(Debug, Clone, Copy)]
pub struct ValidationShare {
    ranks: usize,
    rank: usize,
    streams: usize,
}

impl ValidationShare {
    /// Rank `rank`'s share among `ranks` (at least 1) of `streams` validation streams.
    pub fn new(ranks: usize, rank: usize, streams: usize) -> ValidationShare {
        ValidationShare { ranks: ranks.max(1), rank, streams }
    }

    /// The streams this rank evaluates (0 when there are fewer streams than ranks and this rank
    /// has none: it then adds nothing to the sums).
    pub fn rows(&self) -> usize {
        self.streams.saturating_sub(self.rank).div_ceil(self.ranks)
    }
}

impl Sampler for ValidationShare {
    fn epoch_indices(&mut self, dataset_len: usize, _rng: &mut Generator) -> Vec<usize> {
        let total = self.streams.max(1);
        let mine: Vec<usize> = (self.rank..self.streams).step_by(self.ranks).collect();
        (0..dataset_len / total).flat_map(|c| mine.iter().map(move |&s| c * total + s)).collect()
    }

    fn num_indices(&self, dataset_len: usize) -> usize {
        dataset_len / self.streams.max(1) * self.rows()
    }
}

/// One rank's share of a language model's text streams (see the module docs): a
/// [`DistributedSampler`] over the `ranks × per_rank` streams of a `TextStreams` dataset, expanded
/// so that batch `c` is chunk `c` of this rank's streams and row `b` stays stream `b` of the share
/// for the whole epoch. Clones share the epoch: keep one to call [`set_epoch`](Self::set_epoch).
#[derive(Debug, Clone)]
pub struct StreamShare {
    streams: DistributedSampler,
    per_rank: usize,
    total: usize,
}

impl StreamShare {
    /// Rank `rank` of `ranks`, `per_rank` streams each, shuffled with `seed` (the same on every rank).
    pub fn new(ranks: usize, rank: usize, per_rank: usize, seed: u64) -> Result<StreamShare, TrainError> {
        let total = ranks.checked_mul(per_rank).filter(|t| *t > 0).ok_or(TrainError::InvalidArgument {
            flag: "batch-size",
            value: format!("{per_rank} on {ranks} ranks"),
            expected: "at least 1 stream per rank, and ranks x streams must fit in memory",
        })?;
        Ok(StreamShare { streams: DistributedSampler::new(ranks, rank)?.seed(seed), per_rank, total })
    }

    /// Streams over all ranks: the `TextStreams` dataset must be cut into this many.
    pub fn total_streams(&self) -> usize {
        self.total
    }

    /// The epoch whose assignment of streams to ranks the next pass uses.
    pub fn set_epoch(&self, epoch: u64) {
        self.streams.set_epoch(epoch);
    }
}

impl Sampler for StreamShare {
    fn epoch_indices(&mut self, dataset_len: usize, rng: &mut Generator) -> Vec<usize> {
        // `total` divides evenly over the ranks: no padding, no repeated stream.
        let mine = self.streams.epoch_indices(self.total, rng);
        let chunks = dataset_len / self.total;
        let total = self.total;
        (0..chunks).flat_map(|c| mine.iter().map(move |&s| c * total + s)).collect()
    }

    fn num_indices(&self, dataset_len: usize) -> usize {
        dataset_len / self.total * self.per_rank
    }
}

impl StepSync {
    /// The optimizer the trainer steps, from `opt` built over the model's parameters: `opt`
    /// itself for DDP; for ZeRO the same optimizer over this rank's shards.
    pub fn optimizer<R: UpdateRule>(&self, opt: Optim<R>) -> Result<Box<dyn Optimizer>, TrainError> {
        #[cfg(feature = "mpi")]
        match &self.0 {
            SyncKind::Ddp(_) => Ok(Box::new(opt)),
            SyncKind::Zero(z) => Ok(Box::new(z.shard_optimizer(&opt)?)),
            SyncKind::Fsdp(f) => Ok(Box::new(f.shard_optimizer(&opt)?)),
        }
        #[cfg(not(feature = "mpi"))]
        {
            let _ = opt;
            match *self {}
        }
    }

    /// The ZeRO sharding, if this is a ZeRO run.
    #[cfg(feature = "mpi")]
    pub(crate) fn zero(&self) -> Option<&ZeroRedundancy> {
        match &self.0 {
            SyncKind::Ddp(_) => None,
            SyncKind::Zero(z) => Some(z),
            SyncKind::Fsdp(f) => Some(f.zero()),
        }
    }

    /// ZeRO-3: gather every unit (`true`) to read or write the whole model, or release them
    /// again (`false`). Nothing for the other kinds. After training, call
    /// [`gather_whole_model`](Self::gather_whole_model) before saving, evaluating or sampling.
    #[cfg(feature = "mpi")]
    pub(crate) fn whole_model(&self, gathered: bool) -> Result<(), TrainError> {
        if let SyncKind::Fsdp(f) = &self.0 {
            if gathered {
                f.gather_all()?;
            } else {
                f.release_all();
            }
        }
        Ok(())
    }

    /// The end of training under ZeRO-3: every unit gathered and kept so (weights can be saved,
    /// the model evaluated), on every rank. Nothing for DDP or ZeRO-1/2.
    pub fn gather_whole_model(&self) -> Result<(), TrainError> {
        #[cfg(feature = "mpi")]
        {
            self.whole_model(true)
        }
        #[cfg(not(feature = "mpi"))]
        match *self {}
    }

    /// Shard the model again after [`gather_whole_model`](Self::gather_whole_model) (ZeRO-3;
    /// nothing otherwise).
    pub fn release_whole_model(&self) -> Result<(), TrainError> {
        #[cfg(feature = "mpi")]
        {
            self.whole_model(false)
        }
        #[cfg(not(feature = "mpi"))]
        match *self {}
    }

    /// The ZeRO stage (`None` for DDP).
    pub fn zero_stage(&self) -> Option<u32> {
        #[cfg(feature = "mpi")]
        match &self.0 {
            SyncKind::Ddp(_) => None,
            SyncKind::Zero(z) => Some(z.stage().number()),
            SyncKind::Fsdp(_) => Some(3),
        }
        #[cfg(not(feature = "mpi"))]
        match *self {}
    }

    /// Under ZeRO, the whole optimizer step of the trainer (unscale, global inf verdict, clipping
    /// by the global norm, the step, the scaler's update, the all-gather, clearing gradients):
    /// `Some(applied)`. `None` for DDP, whose step is the optimizer's own.
    pub(crate) fn zero_step(
        &self,
        opt: &mut dyn Optimizer,
        clip: Option<f64>,
        scaler: &mut GradScaler,
    ) -> Result<Option<bool>, TrainError> {
        #[cfg(feature = "mpi")]
        match &self.0 {
            SyncKind::Ddp(_) => Ok(None),
            SyncKind::Zero(z) => {
                let out = z.step(opt, clip, Some(&mut *scaler))?;
                scaler.update()?;
                z.zero_grad(opt)?;
                Ok(Some(out.stepped))
            }
            SyncKind::Fsdp(f) => {
                let out = f.step(opt, clip, Some(&mut *scaler))?;
                scaler.update()?;
                f.zero_grad(opt)?;
                Ok(Some(out.stepped))
            }
        }
        #[cfg(not(feature = "mpi"))]
        {
            let _ = (opt, clip, scaler);
            match *self {}
        }
    }

    /// Backward of one micro-batch; gradients are averaged over ranks when `last_micro_step`
    /// (the accumulation group is complete), else only accumulated locally (`no_sync`).
    pub fn backward(&self, loss: &Tensor, last_micro_step: bool) -> Result<(), TrainError> {
        #[cfg(feature = "mpi")]
        {
            match &self.0 {
                SyncKind::Ddp(d) if last_micro_step => d.backward(loss)?,
                SyncKind::Ddp(d) => {
                    let _local = d.no_sync();
                    d.backward(loss)?;
                }
                SyncKind::Zero(z) if last_micro_step => z.backward(loss)?,
                SyncKind::Zero(z) => {
                    let _local = z.no_sync();
                    z.backward(loss)?;
                }
                SyncKind::Fsdp(f) if last_micro_step => f.backward(loss)?,
                SyncKind::Fsdp(f) => {
                    let _local = f.no_sync();
                    f.backward(loss)?;
                }
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
            match &self.0 {
                SyncKind::Ddp(d) => d.synchronize()?,
                SyncKind::Zero(z) => z.synchronize()?,
                SyncKind::Fsdp(f) => f.synchronize()?,
            }
            Ok(())
        }
        #[cfg(not(feature = "mpi"))]
        match *self {}
    }

    /// End of training: the last status exchange (reports a rank that failed after its last step).
    pub fn finish(self) -> Result<(), TrainError> {
        #[cfg(feature = "mpi")]
        {
            match self.0 {
                SyncKind::Ddp(d) => d.finish()?,
                SyncKind::Zero(z) => z.finish()?,
                SyncKind::Fsdp(f) => f.finish()?,
            }
            Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eval_shares_are_disjoint_and_cover_every_index_once() {
        for (len, ranks) in [(355, 2), (355, 3), (10, 4), (2, 3), (0, 2)] {
            let mut all = Vec::new();
            for rank in 0..ranks {
                let mut s = EvalShare::new(ranks, rank);
                let mine = s.epoch_indices(len, &mut Generator::new(1));
                assert_eq!(mine.len(), s.num_indices(len), "len {len}, rank {rank}/{ranks}");
                all.extend(mine);
            }
            all.sort_unstable();
            assert_eq!(all, (0..len).collect::<Vec<_>>(), "len {len} over {ranks} ranks");
        }
    }

    /// (chunk, stream) of every index rank `rank` of `ranks` reads in `epoch`, over `chunks` chunks.
    fn read(ranks: usize, rank: usize, per_rank: usize, chunks: usize, epoch: u64) -> Vec<(usize, usize)> {
        let mut share = StreamShare::new(ranks, rank, per_rank, 42).unwrap();
        share.set_epoch(epoch);
        let total = share.total_streams();
        let len = chunks * total;
        let idx = share.epoch_indices(len, &mut Generator::new(0));
        assert_eq!(idx.len(), share.num_indices(len));
        idx.into_iter().map(|i| (i / total, i % total)).collect()
    }

    #[test]
    fn ranks_read_disjoint_equal_shares_of_whole_streams() {
        let (ranks, per_rank, chunks) = (3, 4, 5);
        let mut seen = Vec::new();
        for rank in 0..ranks {
            let got = read(ranks, rank, per_rank, chunks, 0);
            assert_eq!(got.len(), per_rank * chunks);
            // Batch c (per_rank consecutive indices) is chunk c; row b keeps its stream.
            let rows: Vec<usize> = got[..per_rank].iter().map(|&(_, s)| s).collect();
            for (c, batch) in got.chunks(per_rank).enumerate() {
                assert!(batch.iter().all(|&(chunk, _)| chunk == c));
                assert_eq!(batch.iter().map(|&(_, s)| s).collect::<Vec<_>>(), rows);
            }
            seen.extend(rows);
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..ranks * per_rank).collect::<Vec<_>>(), "every stream read by exactly one rank");
    }

    #[test]
    fn the_streams_are_reshuffled_per_epoch_alike_on_every_rank() {
        let streams = |rank, epoch| -> Vec<usize> { read(2, rank, 8, 1, epoch).into_iter().map(|(_, s)| s).collect() };
        assert_ne!(streams(0, 0), streams(0, 1), "epoch 1 reassigns the streams");
        for epoch in 0..3 {
            let (a, b) = (streams(0, epoch), streams(1, epoch));
            assert!(a.iter().all(|s| !b.contains(s)), "epoch {epoch}: shares overlap");
        }
    }

    #[test]
    fn no_streams_is_a_typed_error() {
        let e = StreamShare::new(2, 0, 0, 0).unwrap_err().to_string();
        assert!(e.contains("--batch-size") && e.contains("at least 1"), "{e}");
        assert!(StreamShare::new(2, 2, 4, 0).is_err(), "rank out of range");
    }
}
