//! Loading one batch: per-sample generators, the dataset's `get`, collation and staging, with
//! every call into user code guarded so a panic becomes an error that names its origin.
//!
//! The same function runs on the calling thread (`num_workers == 0`) and in workers, which is why
//! the number of workers cannot change what a batch contains.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::collate::Collate;
use crate::dataset::Dataset;
use crate::error::{BatchStep, DataError, Origin, panic_message};
use crate::seeding::{EpochSeed, Stream};
use crate::staging::Stager;

/// What a loader runs for every batch, shared by its workers.
pub(crate) struct Pipeline<D: Dataset, C: Collate<D::Sample>> {
    pub dataset: D,
    pub collate: C,
    pub stage: Option<Stager<C::Batch>>,
}

/// One batch to load: its number in the epoch, the epoch position of its first sample, and the
/// dataset indices in order.
#[derive(Debug, Clone)]
pub(crate) struct Task {
    pub batch: usize,
    pub first_position: u64,
    pub indices: Vec<usize>,
}

impl<D: Dataset, C: Collate<D::Sample>> Pipeline<D, C> {
    /// Load `task`. Returns `None` if `cancel` was raised before it finished (the loader is
    /// shutting down and nobody will read the result).
    pub fn fetch(
        &self,
        epoch: &EpochSeed,
        task: Task,
        origin: Origin,
        cancel: &AtomicBool,
    ) -> Option<Result<C::Batch, DataError>> {
        let mut samples = Vec::with_capacity(task.indices.len());
        for (j, &index) in task.indices.iter().enumerate() {
            if cancel.load(Ordering::Relaxed) {
                return None;
            }
            let stream = Stream::Sample(task.first_position + j as u64);
            let mut rng = epoch.generator(stream);
            let loaded = catch_unwind(AssertUnwindSafe(|| self.dataset.get(index, &mut rng)));
            let sample = match loaded {
                Ok(Ok(s)) => s,
                Ok(Err(source)) => {
                    return Some(Err(DataError::SampleFailed { origin, index, batch: task.batch, source }));
                }
                Err(p) => {
                    let message = panic_message(&*p);
                    return Some(Err(DataError::SamplePanicked { origin, index, batch: task.batch, message }));
                }
            };
            if let Err(e) = epoch.check_within(stream, &rng) {
                return Some(Err(e));
            }
            samples.push(sample);
        }
        if cancel.load(Ordering::Relaxed) {
            return None;
        }
        let stream = Stream::Batch(task.batch as u64);
        Some(collate_and_stage(&self.collate, self.stage.as_ref(), epoch, stream, task.batch, samples, origin))
    }
}

/// Collate and stage the loaded samples of batch `batch`; collate randomness comes from `stream`.
pub(crate) fn collate_and_stage<S, C: Collate<S>>(
    collate: &C,
    stage: Option<&Stager<C::Batch>>,
    epoch: &EpochSeed,
    stream: Stream,
    batch: usize,
    samples: Vec<S>,
    origin: Origin,
) -> Result<C::Batch, DataError> {
    let mut rng = epoch.generator(stream);
    let collated = guard(origin, batch, BatchStep::Collate, || collate.collate(samples, &mut rng))?;
    epoch.check_within(stream, &rng)?;
    match stage {
        None => Ok(collated),
        Some(stage) => guard(origin, batch, BatchStep::StageToDevice, || stage(collated)),
    }
}

fn guard<T>(
    origin: Origin,
    batch: usize,
    step: BatchStep,
    f: impl FnOnce() -> Result<T, crate::BoxError>,
) -> Result<T, DataError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(DataError::BatchFailed { origin, batch, step, source }),
        Err(p) => Err(DataError::BatchPanicked { origin, batch, step, message: panic_message(&*p) }),
    }
}
