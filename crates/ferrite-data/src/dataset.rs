//! What a loader reads from: map-style datasets (length + get by index) and iterable datasets
//! (a stream per worker).
//!
//! `get` receives its random generator as an argument. Augmentation code therefore never reaches
//! for a global RNG — the one thing that made PyTorch workers return identical "random"
//! augmentations — and the loader decides which stream each call draws from (see
//! [`seeding`](crate::seeding)).

use std::sync::Arc;

use ferrite_tensor::Generator;

use crate::error::BoxError;
use crate::seeding::{EpochSeed, Stream};

/// A dataset addressed by index, like PyTorch's map-style `Dataset`.
///
/// Workers share one dataset through an `Arc`, hence `Send + Sync + 'static`.
pub trait Dataset: Send + Sync + 'static {
    type Sample: Send + 'static;

    /// Number of samples.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Load sample `index` (`0 <= index < len()`).
    ///
    /// `rng` is this sample's own generator for the current epoch: draw every random decision
    /// (crop offset, flip, noise) from it and the epoch is reproducible for any number of workers.
    fn get(&self, index: usize, rng: &mut Generator) -> Result<Self::Sample, BoxError>;

    /// A dataset whose samples are `f(sample, rng)` — the place for per-sample transforms and
    /// random augmentation. `rng` is the same per-sample generator `get` received, continued.
    fn map<T, F>(self, f: F) -> Mapped<Self, F>
    where
        Self: Sized,
        T: Send + 'static,
        F: Fn(Self::Sample, &mut Generator) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        Mapped { inner: self, f }
    }
}

impl<D: Dataset + ?Sized> Dataset for Arc<D> {
    type Sample = D::Sample;

    fn len(&self) -> usize {
        (**self).len()
    }

    fn get(&self, index: usize, rng: &mut Generator) -> Result<D::Sample, BoxError> {
        (**self).get(index, rng)
    }
}

/// A list of samples held in memory; `get` clones the sample.
///
/// (A wrapper rather than `impl Dataset for Vec<T>`, which would make every `vec.get(i)` in code
/// that imports [`Dataset`] resolve to the trait method.)
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InMemory<T>(pub Vec<T>);

impl<T> InMemory<T> {
    pub fn new(samples: Vec<T>) -> InMemory<T> {
        InMemory(samples)
    }
}

impl<T> From<Vec<T>> for InMemory<T> {
    fn from(samples: Vec<T>) -> InMemory<T> {
        InMemory(samples)
    }
}

impl<T> FromIterator<T> for InMemory<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> InMemory<T> {
        InMemory(iter.into_iter().collect())
    }
}

impl<T: Clone + Send + Sync + 'static> Dataset for InMemory<T> {
    type Sample = T;

    fn len(&self) -> usize {
        self.0.len()
    }

    fn get(&self, index: usize, _rng: &mut Generator) -> Result<T, BoxError> {
        self.0
            .get(index)
            .cloned()
            .ok_or_else(|| format!("index {index} out of range for a dataset of {} samples", self.0.len()).into())
    }
}

/// The dataset returned by [`Dataset::map`].
pub struct Mapped<D, F> {
    inner: D,
    f: F,
}

impl<D, F, T> Dataset for Mapped<D, F>
where
    D: Dataset,
    T: Send + 'static,
    F: Fn(D::Sample, &mut Generator) -> Result<T, BoxError> + Send + Sync + 'static,
{
    type Sample = T;

    fn len(&self) -> usize {
        self.inner.len()
    }

    fn get(&self, index: usize, rng: &mut Generator) -> Result<T, BoxError> {
        let sample = self.inner.get(index, rng)?;
        (self.f)(sample, rng)
    }
}

/// A view of some samples of a dataset, in the given order (PyTorch's `Subset`).
pub struct Subset<D> {
    dataset: D,
    indices: Vec<usize>,
}

impl<D: Dataset> Subset<D> {
    /// `indices` must be valid indices of `dataset`; an out-of-range one is an error.
    pub fn new(dataset: D, indices: Vec<usize>) -> Result<Subset<D>, crate::DataError> {
        let len = dataset.len();
        if let Some(&bad) = indices.iter().find(|&&i| i >= len) {
            return Err(crate::DataError::IndexOutOfRange { index: bad, len });
        }
        Ok(Subset { dataset, indices })
    }

    /// The first `n` samples (or all, if fewer) — for quick runs on a slice of a dataset.
    pub fn first(dataset: D, n: usize) -> Subset<D> {
        let n = n.min(dataset.len());
        Subset { dataset, indices: (0..n).collect() }
    }

    pub fn indices(&self) -> &[usize] {
        &self.indices
    }

    pub fn inner(&self) -> &D {
        &self.dataset
    }
}

impl<D: Dataset> Dataset for Subset<D> {
    type Sample = D::Sample;

    fn len(&self) -> usize {
        self.indices.len()
    }

    fn get(&self, index: usize, rng: &mut Generator) -> Result<D::Sample, BoxError> {
        let inner = *self
            .indices
            .get(index)
            .ok_or_else(|| format!("index {index} out of range for a subset of {} samples", self.indices.len()))?;
        self.dataset.get(inner, rng)
    }
}

/// Who is reading an iterable dataset, and its own generator for this epoch.
#[derive(Clone, Debug)]
pub struct WorkerInfo {
    id: usize,
    num_workers: usize,
    epoch: EpochSeed,
}

impl WorkerInfo {
    pub(crate) fn new(id: usize, num_workers: usize, epoch: EpochSeed) -> WorkerInfo {
        WorkerInfo { id, num_workers, epoch }
    }

    /// This worker's id, `0..num_workers()`. With `num_workers == 0` the loader reads the
    /// dataset on the calling thread as worker 0 of 1.
    pub fn id(&self) -> usize {
        self.id
    }

    /// How many workers share the stream (at least 1).
    pub fn num_workers(&self) -> usize {
        self.num_workers
    }

    /// The epoch's base seed (the same for every worker).
    pub fn base_seed(&self) -> u64 {
        self.epoch.base_seed()
    }

    /// This worker's generator for this epoch: stream `Worker(id)` of the epoch keystream.
    /// Distinct workers and distinct epochs get disjoint streams.
    pub fn generator(&self) -> Generator {
        self.epoch.generator(Stream::Worker(self.id as u64))
    }

    /// True if this worker should produce item `i` of a stream split round-robin between
    /// workers (`i % num_workers == id`) — the usual way to shard an iterable dataset.
    pub fn owns(&self, i: usize) -> bool {
        i % self.num_workers == self.id
    }
}

thread_local! {
    static CURRENT_WORKER: std::cell::RefCell<Option<WorkerInfo>> = const { std::cell::RefCell::new(None) };
}

/// The worker the calling thread is, if it is a loader worker (PyTorch's `get_worker_info()`);
/// `None` on any other thread, including the iterating thread when `num_workers == 0`.
///
/// For per-worker resources (a file handle, a cache). Draw augmentation from the generator `get`
/// receives instead: the worker generator's draws depend on which samples this worker happens to
/// load, which depends on the number of workers.
pub fn worker_info() -> Option<WorkerInfo> {
    CURRENT_WORKER.with(|w| w.borrow().clone())
}

pub(crate) fn set_worker_info(info: Option<WorkerInfo>) {
    CURRENT_WORKER.with(|w| *w.borrow_mut() = info);
}

/// A dataset read as a stream, like PyTorch's `IterableDataset`.
///
/// Each worker calls [`iter`](Self::iter) once per epoch and must yield only its share of the
/// data (use [`WorkerInfo::owns`] or `WorkerInfo::id`); otherwise every worker yields the whole
/// stream and samples repeat, exactly as in PyTorch.
pub trait IterableDataset: Send + Sync + 'static {
    type Sample: Send + 'static;

    fn iter<'a>(&'a self, worker: &WorkerInfo) -> Box<dyn Iterator<Item = Result<Self::Sample, BoxError>> + 'a>;
}

impl<D: IterableDataset> IterableDataset for Arc<D> {
    type Sample = D::Sample;

    fn iter<'a>(&'a self, worker: &WorkerInfo) -> Box<dyn Iterator<Item = Result<D::Sample, BoxError>> + 'a> {
        (**self).iter(worker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vec_dataset_and_out_of_range() {
        let d = InMemory::new(vec![1, 2, 3]);
        let mut g = Generator::new(0);
        assert_eq!(d.len(), 3);
        assert_eq!(d.get(2, &mut g).unwrap(), 3);
        assert!(d.get(3, &mut g).is_err());
    }

    #[test]
    fn map_sees_the_same_generator_stream() {
        let d = InMemory::new(vec![10.0f64; 4]).map(|x, rng| Ok(x + rng.uniform_f64()));
        let mut a = Generator::new(3);
        let mut b = Generator::new(3);
        assert_eq!(d.get(0, &mut a).unwrap(), 10.0 + b.uniform_f64());
    }

    #[test]
    fn subset_checks_indices() {
        let s = Subset::new(InMemory::new(vec!['a', 'b', 'c']), vec![2, 0]).unwrap();
        let mut g = Generator::new(0);
        assert_eq!(s.len(), 2);
        assert_eq!(s.get(0, &mut g).unwrap(), 'c');
        assert!(Subset::new(InMemory::new(vec!['a']), vec![1]).is_err());
        assert_eq!(Subset::first(InMemory::new(vec![1, 2, 3]), 10).len(), 3);
    }

    #[test]
    fn worker_generators_differ_and_owns_partitions() {
        let e = EpochSeed::new(1);
        let w0 = WorkerInfo::new(0, 2, e.clone());
        let w1 = WorkerInfo::new(1, 2, e);
        assert_ne!(w0.generator().next_u64(), w1.generator().next_u64());
        let owned: Vec<bool> = (0..4).map(|i| w1.owns(i)).collect();
        assert_eq!(owned, [false, true, false, true]);
        assert!(worker_info().is_none());
        set_worker_info(Some(w1));
        assert_eq!(worker_info().map(|w| w.id()), Some(1));
        set_worker_info(None);
    }
}
