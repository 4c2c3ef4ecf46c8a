//! The DataLoader for map-style datasets: batches in sampler order, loaded by background worker
//! threads with bounded prefetch, and randomness that is distinct per sample and reproducible for
//! any number of workers.
//!
//! ```
//! use ferrite_data::{DataLoader, Dataset, InMemory};
//!
//! // A dataset of 10 numbers with a random augmentation drawn from the per-sample generator.
//! let data = (0..10).map(|i| i as f64).collect::<InMemory<f64>>().map(|x, rng| Ok(x + rng.uniform_f64()));
//! let mut loader = DataLoader::builder(data).batch_size(4).shuffle(true).seed(42).num_workers(2).build()?;
//! for epoch in 0..2 {
//!     for batch in &mut loader {
//!         let batch: Vec<f64> = batch?;
//!         assert!(batch.len() <= 4);
//!     }
//! }
//! # Ok::<(), ferrite_data::DataError>(())
//! ```
//!
//! # Seeding (see [`seeding`](crate::seeding) for the exact derivation)
//! Each epoch draws one base seed from the loader's generator (also with `num_workers == 0`).
//! Sample `k` of the epoch (in sampler order) receives stream `Sample(k)` of that epoch's
//! keystream, batch `b`'s collate receives stream `Batch(b)`, and the sampler shuffles with stream
//! `Sampler`. None of these depend on which worker runs the code, so the same seed gives
//! bit-identical epochs with 0, 1, 2 or 4 workers, while no two samples or workers share random
//! numbers.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use ferrite_tensor::{Generator, GeneratorState};

use crate::collate::{Collate, VecCollate};
use crate::dataset::Dataset;
use crate::error::{DataError, Origin};
use crate::fetch::{Pipeline, Task};
use crate::loader_builder::{LoaderBuilder, LoaderSource, generator_or_default};
use crate::sampler::{BatchSampler, Batching, RandomSampler, Sampler, SequentialSampler};
use crate::seeding::{EpochSeed, MAX_BATCHES_PER_EPOCH, MAX_SAMPLES_PER_EPOCH, Stream};
use crate::worker_pool::WorkerPool;

/// Batches from a map-style dataset, one epoch per iteration. Build with [`DataLoader::builder`].
pub struct DataLoader<D: Dataset, C: Collate<D::Sample> = VecCollate> {
    pipeline: Arc<Pipeline<D, C>>,
    batch_sampler: Box<dyn BatchSampler>,
    generator: Generator,
    num_workers: usize,
    prefetch: usize,
    timeout: Option<Duration>,
    epochs_started: u64,
}

/// Options of a [`DataLoader`] (see [`LoaderBuilder`] for the ones every loader has); defaults
/// follow PyTorch (batch size 1, no shuffle, no workers, two batches prefetched per worker).
pub type DataLoaderBuilder<D, C = VecCollate> = LoaderBuilder<MapStyleSource<D>, C>;

/// What a [`DataLoader`] reads: a map-style dataset, and how to sample it.
pub struct MapStyleSource<D> {
    dataset: D,
    shuffle: bool,
    sampler: Option<Box<dyn Sampler>>,
    batch_sampler: Option<Box<dyn BatchSampler>>,
}

impl<D: Dataset> LoaderSource for MapStyleSource<D> {
    type Sample = D::Sample;
}

impl<D: Dataset> DataLoader<D, VecCollate> {
    /// Start configuring a loader over `dataset` (pass an `Arc<D>` to keep sharing it).
    pub fn builder(dataset: D) -> DataLoaderBuilder<D, VecCollate> {
        let source = MapStyleSource { dataset, shuffle: false, sampler: None, batch_sampler: None };
        LoaderBuilder::new(source, VecCollate)
    }
}

impl<D: Dataset, C: Collate<D::Sample>> LoaderBuilder<MapStyleSource<D>, C> {
    /// Visit the dataset in a fresh random order every epoch (seeded by the loader's generator).
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.source.shuffle = shuffle;
        self
    }

    /// Use a custom sampler (incompatible with `shuffle(true)` and with `batch_sampler`).
    pub fn sampler(mut self, sampler: impl Sampler + 'static) -> Self {
        self.source.sampler = Some(Box::new(sampler));
        self
    }

    /// Use a custom batch sampler; `batch_size`, `shuffle`, `sampler` and `drop_last` must then
    /// be left at their defaults.
    pub fn batch_sampler(mut self, batch_sampler: impl BatchSampler + 'static) -> Self {
        self.source.batch_sampler = Some(Box::new(batch_sampler));
        self
    }

    /// Most batches in flight or waiting at once (default `2 * num_workers`; at least
    /// `num_workers`, so every worker can be busy). Ignored with `num_workers == 0`.
    pub fn prefetch(mut self, batches: usize) -> Self {
        self.prefetch = Some(batches);
        self
    }

    pub fn build(mut self) -> Result<DataLoader<D, C>, DataError> {
        self.check_shared_options()?;
        let MapStyleSource { dataset, shuffle, sampler, batch_sampler } = self.source;
        let batch_sampler: Box<dyn BatchSampler> = match batch_sampler {
            Some(bs) => {
                if self.batch_size != 1 || shuffle || sampler.is_some() || self.drop_last {
                    return Err(DataError::InvalidConfig(
                        "batch_sampler is mutually exclusive with batch_size, shuffle, sampler and drop_last".into(),
                    ));
                }
                bs
            }
            None => {
                let sampler: Box<dyn Sampler> = match (sampler, shuffle) {
                    (Some(_), true) => {
                        return Err(DataError::InvalidConfig(
                            "sampler is mutually exclusive with shuffle(true); shuffle inside the sampler".into(),
                        ));
                    }
                    (Some(s), false) => s,
                    (None, true) => Box::new(RandomSampler::new()),
                    (None, false) => Box::new(SequentialSampler),
                };
                Box::new(Batching::new(sampler, self.batch_size, self.drop_last)?)
            }
        };
        let prefetch = self.prefetch.unwrap_or(2 * self.num_workers).max(self.num_workers).max(1);
        let generator = generator_or_default(self.generator);
        Ok(DataLoader {
            pipeline: Arc::new(Pipeline { dataset, collate: self.collate, stage: self.stage }),
            batch_sampler,
            generator,
            num_workers: self.num_workers,
            prefetch,
            timeout: self.timeout,
            epochs_started: 0,
        })
    }
}

impl<D: Dataset, C: Collate<D::Sample>> DataLoader<D, C> {
    /// Start the next epoch: draws its base seed, plans its batches and starts prefetching.
    pub fn epoch(&mut self) -> Epoch<'_, D, C> {
        let seed = EpochSeed::draw(&mut self.generator);
        self.epochs_started += 1;
        let len = self.pipeline.dataset.len();
        let plan = plan_epoch(self.batch_sampler.epoch_batches(len, &mut seed.generator(Stream::Sampler)), len);
        let mut epoch = Epoch {
            pipeline: Arc::clone(&self.pipeline),
            seed,
            tasks: Vec::new().into_iter(),
            num_batches: 0,
            next_yield: 0,
            dispatched: 0,
            pool: None,
            prefetch: self.prefetch,
            timeout: self.timeout,
            pending_error: None,
            done: false,
            _loader: PhantomData,
        };
        match plan {
            Err(e) => epoch.pending_error = Some(e),
            Ok(tasks) => {
                epoch.num_batches = tasks.len();
                epoch.tasks = tasks.into_iter();
                if self.num_workers > 0 && epoch.num_batches > 0 {
                    match WorkerPool::spawn(
                        Arc::clone(&self.pipeline),
                        &epoch.seed,
                        self.num_workers.min(epoch.num_batches),
                    ) {
                        Ok(pool) => {
                            epoch.pool = Some(pool);
                            epoch.top_up();
                        }
                        Err(e) => epoch.pending_error = Some(e),
                    }
                }
            }
        }
        epoch
    }

    /// Batches per epoch.
    pub fn len(&self) -> usize {
        self.batch_sampler.num_batches(self.pipeline.dataset.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dataset(&self) -> &D {
        &self.pipeline.dataset
    }

    pub fn num_workers(&self) -> usize {
        self.num_workers
    }

    /// Epochs started so far.
    pub fn epochs_started(&self) -> u64 {
        self.epochs_started
    }

    /// State of the loader's generator; restoring it (with [`set_generator_state`](Self::set_generator_state))
    /// makes the next epoch repeat exactly — how a checkpoint resumes the data order.
    pub fn generator_state(&self) -> GeneratorState {
        self.generator.state()
    }

    pub fn set_generator_state(&mut self, state: GeneratorState) {
        self.generator.set_state(state);
    }
}

impl<'a, D: Dataset, C: Collate<D::Sample>> IntoIterator for &'a mut DataLoader<D, C> {
    type Item = Result<C::Batch, DataError>;
    type IntoIter = Epoch<'a, D, C>;

    fn into_iter(self) -> Epoch<'a, D, C> {
        self.epoch()
    }
}

/// Validate a batch plan and number its samples by epoch position.
fn plan_epoch(batches: Vec<Vec<usize>>, len: usize) -> Result<Vec<Task>, DataError> {
    if batches.len() as u64 > MAX_BATCHES_PER_EPOCH {
        return Err(DataError::InvalidConfig(format!(
            "{} batches in one epoch exceed the limit of {MAX_BATCHES_PER_EPOCH}",
            batches.len()
        )));
    }
    let mut position = 0u64;
    let mut tasks = Vec::with_capacity(batches.len());
    for (batch, indices) in batches.into_iter().enumerate() {
        if let Some(&index) = indices.iter().find(|&&i| i >= len) {
            return Err(DataError::IndexOutOfRange { index, len });
        }
        let first_position = position;
        position += indices.len() as u64;
        tasks.push(Task { batch, first_position, indices });
    }
    if position > MAX_SAMPLES_PER_EPOCH {
        return Err(DataError::InvalidConfig(format!(
            "{position} samples in one epoch exceed the limit of {MAX_SAMPLES_PER_EPOCH}"
        )));
    }
    Ok(tasks)
}

/// One pass over the data; yields batches in sampler order. Dropping it mid-epoch stops and
/// joins the workers (an in-flight `get` call finishes first). After an error the epoch ends.
pub struct Epoch<'a, D: Dataset, C: Collate<D::Sample>> {
    pipeline: Arc<Pipeline<D, C>>,
    seed: EpochSeed,
    tasks: std::vec::IntoIter<Task>,
    num_batches: usize,
    next_yield: usize,
    dispatched: usize,
    pool: Option<WorkerPool<C::Batch>>,
    prefetch: usize,
    timeout: Option<Duration>,
    pending_error: Option<DataError>,
    done: bool,
    _loader: PhantomData<&'a mut DataLoader<D, C>>,
}

impl<D: Dataset, C: Collate<D::Sample>> Epoch<'_, D, C> {
    /// This epoch's base seed.
    pub fn base_seed(&self) -> u64 {
        self.seed.base_seed()
    }

    /// Batches in this epoch.
    pub fn num_batches(&self) -> usize {
        self.num_batches
    }

    fn top_up(&mut self) {
        if let Some(pool) = &self.pool {
            while self.dispatched < self.next_yield + self.prefetch {
                let Some(task) = self.tasks.next() else { break };
                pool.submit(task);
                self.dispatched += 1;
            }
        }
    }

    fn finish(&mut self) {
        self.done = true;
        if let Some(mut pool) = self.pool.take() {
            pool.shutdown();
        }
    }
}

impl<D: Dataset, C: Collate<D::Sample>> Iterator for Epoch<'_, D, C> {
    type Item = Result<C::Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if let Some(e) = self.pending_error.take() {
            self.finish();
            return Some(Err(e));
        }
        if self.next_yield >= self.num_batches {
            self.finish();
            return None;
        }
        let batch = self.next_yield;
        let result = match &mut self.pool {
            Some(pool) => pool.wait_for(batch, self.timeout),
            None => {
                // Tasks are in batch order, so the next task is this batch.
                let task = self.tasks.next()?;
                let never = std::sync::atomic::AtomicBool::new(false);
                match self.pipeline.fetch(&self.seed, task, Origin::MainThread, &never) {
                    Some(r) => r,
                    None => unreachable!("the cancel flag of the calling thread is never raised"),
                }
            }
        };
        self.next_yield += 1;
        match result {
            Ok(b) => {
                self.top_up();
                if self.next_yield >= self.num_batches {
                    self.finish();
                }
                Some(Ok(b))
            }
            Err(e) => {
                self.finish();
                Some(Err(e))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.done {
            (0, Some(0))
        } else {
            (0, Some(self.num_batches - self.next_yield + usize::from(self.pending_error.is_some())))
        }
    }
}
