//! The loader for iterable datasets (streams): each worker reads its own shard, batches it, and
//! the iterator takes batches from the workers in turn.
//!
//! Order and seeding follow PyTorch: worker `w` of `N` calls `dataset.iter` with a [`WorkerInfo`]
//! whose generator is stream `Worker(w)` of the epoch keystream (derived from the epoch's base
//! seed and the worker id); batches are yielded round-robin — worker 0's first batch, worker 1's
//! first batch, ... — skipping workers whose stream has ended. With `num_workers == 0` the stream
//! is read on the calling thread as worker 0 of 1, so 0 and 1 workers give identical epochs. How a
//! stream is sharded depends on `N`, so (unlike the map-style loader) an iterable dataset's epoch
//! is reproducible for a fixed number of workers, not across worker counts. The collate function
//! of worker `w`'s `j`-th batch receives stream `Batch(j * N + w)`.

use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use ferrite_tensor::{Generator, GeneratorState};

use crate::collate::{Collate, VecCollate};
use crate::dataset::{IterableDataset, WorkerInfo, set_worker_info};
use crate::error::{BoxError, DataError, Origin, panic_message};
use crate::fetch::collate_and_stage;
use crate::loader_builder::{LoaderBuilder, LoaderSource, generator_or_default};
use crate::seeding::{EpochSeed, MAX_BATCHES_PER_EPOCH, Stream};
use crate::staging::Stager;
use crate::worker_pool::LIVENESS_POLL;

/// Batches from an [`IterableDataset`]. Build with [`IterableLoader::builder`].
pub struct IterableLoader<D: IterableDataset, C: Collate<D::Sample> = VecCollate> {
    shared: Arc<Shared<D, C>>,
    generator: Generator,
    num_workers: usize,
    prefetch: usize,
    timeout: Option<Duration>,
}

struct Shared<D: IterableDataset, C: Collate<D::Sample>> {
    dataset: D,
    collate: C,
    stage: Option<Stager<C::Batch>>,
    batch_size: usize,
    drop_last: bool,
}

/// Options of an [`IterableLoader`] (see [`LoaderBuilder`] for the ones every loader has).
pub type IterableLoaderBuilder<D, C = VecCollate> = LoaderBuilder<IterableSource<D>, C>;

/// What an [`IterableLoader`] reads: an iterable dataset (each worker reads its own shard).
pub struct IterableSource<D>(D);

impl<D: IterableDataset> LoaderSource for IterableSource<D> {
    type Sample = D::Sample;
}

impl<D: IterableDataset> IterableLoader<D, VecCollate> {
    pub fn builder(dataset: D) -> IterableLoaderBuilder<D, VecCollate> {
        LoaderBuilder::new(IterableSource(dataset), VecCollate)
    }
}

impl<D: IterableDataset, C: Collate<D::Sample>> LoaderBuilder<IterableSource<D>, C> {
    /// Batches each worker may have finished ahead of the iterator (default 2, at least 1).
    pub fn prefetch_per_worker(mut self, batches: usize) -> Self {
        self.prefetch = Some(batches);
        self
    }

    pub fn build(mut self) -> Result<IterableLoader<D, C>, DataError> {
        self.check_shared_options()?;
        if self.batch_size == 0 {
            return Err(DataError::InvalidConfig("batch_size must be at least 1".into()));
        }
        Ok(IterableLoader {
            shared: Arc::new(Shared {
                dataset: self.source.0,
                collate: self.collate,
                stage: self.stage,
                batch_size: self.batch_size,
                drop_last: self.drop_last,
            }),
            generator: generator_or_default(self.generator),
            num_workers: self.num_workers,
            prefetch: self.prefetch.unwrap_or(2).max(1),
            timeout: self.timeout,
        })
    }
}

/// What a worker sends: a batch (or the error that ended its stream), or the end of its stream.
enum Msg<B> {
    Batch(Result<B, DataError>),
    End,
}

/// Reads one worker's stream into batches.
struct StreamReader<'a, D: IterableDataset, C: Collate<D::Sample>> {
    shared: &'a Shared<D, C>,
    seed: EpochSeed,
    origin: Origin,
    worker: usize,
    num_workers: usize,
    iter: Option<Box<dyn Iterator<Item = Result<D::Sample, BoxError>> + 'a>>,
    items: usize,
    batches: usize,
    failed: bool,
}

impl<'a, D: IterableDataset, C: Collate<D::Sample>> StreamReader<'a, D, C> {
    fn new(shared: &'a Shared<D, C>, seed: EpochSeed, origin: Origin, worker: usize, num_workers: usize) -> Self {
        StreamReader { shared, seed, origin, worker, num_workers, iter: None, items: 0, batches: 0, failed: false }
    }

    fn stream_error(&mut self, message: String, source: Option<BoxError>) -> Option<Result<C::Batch, DataError>> {
        self.failed = true;
        self.iter = None;
        Some(Err(DataError::StreamFailed { origin: self.origin, item: self.items, message, source }))
    }

    /// The next batch of this worker's stream; `None` at its end.
    fn next_batch(&mut self, cancel: &AtomicBool) -> Option<Result<C::Batch, DataError>> {
        if self.failed {
            return None;
        }
        if self.iter.is_none() {
            let info = WorkerInfo::new(self.worker, self.num_workers, self.seed.clone());
            let shared = self.shared;
            match catch_unwind(AssertUnwindSafe(|| shared.dataset.iter(&info))) {
                Ok(it) => self.iter = Some(it),
                Err(p) => return self.stream_error(format!("`iter` panicked: {}", panic_message(&*p)), None),
            }
        }
        let mut samples = Vec::with_capacity(self.shared.batch_size);
        while samples.len() < self.shared.batch_size {
            if cancel.load(Ordering::Relaxed) {
                return None;
            }
            let it = self.iter.as_mut()?;
            match catch_unwind(AssertUnwindSafe(|| it.next())) {
                Ok(Some(Ok(s))) => {
                    samples.push(s);
                    self.items += 1;
                }
                Ok(Some(Err(e))) => return self.stream_error(e.to_string(), Some(e)),
                Ok(None) => break,
                Err(p) => return self.stream_error(format!("panicked: {}", panic_message(&*p)), None),
            }
        }
        if samples.is_empty() || (self.shared.drop_last && samples.len() < self.shared.batch_size) {
            self.iter = None;
            self.failed = true; // stream over
            return None;
        }
        let global = (self.batches * self.num_workers + self.worker) as u64;
        if global >= MAX_BATCHES_PER_EPOCH {
            self.failed = true;
            return Some(Err(DataError::InvalidConfig(format!(
                "an epoch of more than {MAX_BATCHES_PER_EPOCH} batches exhausts the batch random streams; use a larger batch size"
            ))));
        }
        let stream = Stream::Batch(global);
        let batch_number = self.batches;
        self.batches += 1;
        let shared = self.shared;
        let result = collate_and_stage(
            &shared.collate,
            shared.stage.as_ref(),
            &self.seed,
            stream,
            batch_number,
            samples,
            self.origin,
        );
        if result.is_err() {
            self.failed = true;
        }
        Some(result)
    }
}

impl<D: IterableDataset, C: Collate<D::Sample>> IterableLoader<D, C> {
    /// Start the next epoch (draws one base seed from the loader's generator).
    pub fn epoch(&mut self) -> IterableEpoch<'_, D, C> {
        let seed = EpochSeed::draw(&mut self.generator);
        let this: &IterableLoader<D, C> = self;
        let mode = if this.num_workers == 0 {
            Mode::Inline(Box::new(StreamReader::new(&this.shared, seed.clone(), Origin::MainThread, 0, 1)))
        } else {
            match spawn_workers(&this.shared, &seed, this.num_workers, this.prefetch) {
                Ok(w) => Mode::Workers(w),
                Err(e) => Mode::Failed(Some(e)),
            }
        };
        IterableEpoch { mode, seed, timeout: this.timeout, done: false, _loader: PhantomData }
    }

    pub fn dataset(&self) -> &D {
        &self.shared.dataset
    }

    pub fn generator_state(&self) -> GeneratorState {
        self.generator.state()
    }

    pub fn set_generator_state(&mut self, state: GeneratorState) {
        self.generator.set_state(state);
    }
}

impl<'a, D: IterableDataset, C: Collate<D::Sample>> IntoIterator for &'a mut IterableLoader<D, C> {
    type Item = Result<C::Batch, DataError>;
    type IntoIter = IterableEpoch<'a, D, C>;

    fn into_iter(self) -> IterableEpoch<'a, D, C> {
        self.epoch()
    }
}

struct Workers<B> {
    receivers: Vec<Receiver<Msg<B>>>,
    handles: Vec<JoinHandle<()>>,
    /// Worker ids whose stream has not ended, in round-robin order, and whose turn it is.
    active: Vec<usize>,
    cursor: usize,
    /// Batches handed to the iterator so far (for error messages).
    yielded: usize,
    cancel: Arc<AtomicBool>,
}

impl<B> Workers<B> {
    fn shutdown(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        // Dropping the receivers wakes workers blocked on a full channel.
        self.receivers.clear();
        for h in self.handles.drain(..) {
            // Worker threads run user code under catch_unwind and cannot panic themselves.
            let _ = h.join();
        }
    }
}

impl<B> Drop for Workers<B> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn spawn_workers<D: IterableDataset, C: Collate<D::Sample>>(
    shared: &Arc<Shared<D, C>>,
    seed: &EpochSeed,
    n: usize,
    prefetch: usize,
) -> Result<Workers<C::Batch>, DataError> {
    let cancel = Arc::new(AtomicBool::new(false));
    let mut workers = Workers {
        receivers: Vec::with_capacity(n),
        handles: Vec::with_capacity(n),
        active: (0..n).collect(),
        cursor: 0,
        yielded: 0,
        cancel,
    };
    for id in 0..n {
        let (tx, rx) = crossbeam_channel::bounded::<Msg<C::Batch>>(prefetch);
        let shared = Arc::clone(shared);
        let seed = seed.clone();
        let cancel = Arc::clone(&workers.cancel);
        let info = WorkerInfo::new(id, n, seed.clone());
        let spawned = std::thread::Builder::new().name(format!("ferrite-data-worker-{id}")).spawn(move || {
            set_worker_info(Some(info));
            let mut reader = StreamReader::new(&shared, seed, Origin::Worker(id), id, n);
            loop {
                match reader.next_batch(&cancel) {
                    Some(r) => {
                        let failed = r.is_err();
                        if tx.send(Msg::Batch(r)).is_err() || failed {
                            return;
                        }
                    }
                    None => {
                        if !cancel.load(Ordering::Relaxed) {
                            let _ = tx.send(Msg::End);
                        }
                        return;
                    }
                }
            }
        });
        match spawned {
            Ok(h) => {
                workers.receivers.push(rx);
                workers.handles.push(h);
            }
            Err(source) => {
                return Err(DataError::InvalidConfig(format!(
                    "could not start data-loader worker {id} of {n}: {source}"
                )));
            }
        }
    }
    Ok(workers)
}

enum Mode<'a, D: IterableDataset, C: Collate<D::Sample>> {
    Inline(Box<StreamReader<'a, D, C>>),
    Workers(Workers<C::Batch>),
    Failed(Option<DataError>),
}

/// One pass over an iterable dataset. Dropping it stops and joins the workers.
pub struct IterableEpoch<'a, D: IterableDataset, C: Collate<D::Sample>> {
    mode: Mode<'a, D, C>,
    seed: EpochSeed,
    timeout: Option<Duration>,
    done: bool,
    _loader: PhantomData<&'a mut IterableLoader<D, C>>,
}

impl<D: IterableDataset, C: Collate<D::Sample>> IterableEpoch<'_, D, C> {
    pub fn base_seed(&self) -> u64 {
        self.seed.base_seed()
    }

    fn next_from_workers(w: &mut Workers<C::Batch>, timeout: Option<Duration>) -> Option<Result<C::Batch, DataError>> {
        let start = Instant::now();
        loop {
            if w.active.is_empty() {
                return None;
            }
            let id = w.active[w.cursor];
            match w.receivers[id].recv_timeout(LIVENESS_POLL) {
                Ok(Msg::Batch(r)) => {
                    w.cursor = (w.cursor + 1) % w.active.len();
                    w.yielded += 1;
                    return Some(r);
                }
                Ok(Msg::End) => {
                    w.active.remove(w.cursor);
                    if w.cursor >= w.active.len() {
                        w.cursor = 0;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(t) = timeout
                        && start.elapsed() >= t
                    {
                        return Some(Err(DataError::Timeout { batch: w.yielded, waited: start.elapsed() }));
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Some(Err(DataError::WorkerDied { worker: id, batch: w.yielded }));
                }
            }
        }
    }
}

impl<D: IterableDataset, C: Collate<D::Sample>> Iterator for IterableEpoch<'_, D, C> {
    type Item = Result<C::Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let never = AtomicBool::new(false);
        let item = match &mut self.mode {
            Mode::Inline(reader) => reader.next_batch(&never),
            Mode::Workers(w) => Self::next_from_workers(w, self.timeout),
            Mode::Failed(e) => e.take().map(Err),
        };
        if !matches!(item, Some(Ok(_))) {
            self.done = true;
            if let Mode::Workers(w) = &mut self.mode {
                w.shutdown();
            }
        }
        item
    }
}
