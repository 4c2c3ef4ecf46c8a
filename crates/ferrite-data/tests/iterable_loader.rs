//! The loader for iterable datasets: per-worker generators, round-robin order, failures, shutdown.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use ferrite_data::{BoxError, DataError, IterableDataset, IterableLoader, Origin, WorkerInfo};

fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).unwrap_or_else(|_| panic!("did not finish within {limit:?}: the loader hangs"))
}

/// Items `0..n`, sharded round-robin between workers; each item carries a draw from its worker's
/// generator and the worker id.
struct Numbers {
    n: usize,
    panic_at: Option<usize>,
    produced: Arc<AtomicUsize>,
}

impl Numbers {
    fn new(n: usize) -> Numbers {
        Numbers { n, panic_at: None, produced: Arc::new(AtomicUsize::new(0)) }
    }
}

impl IterableDataset for Numbers {
    type Sample = (usize, usize, u64);

    fn iter<'a>(&'a self, worker: &WorkerInfo) -> Box<dyn Iterator<Item = Result<Self::Sample, BoxError>> + 'a> {
        let mut rng = worker.generator();
        let id = worker.id();
        let w = worker.clone();
        Box::new((0..self.n).filter(move |i| w.owns(*i)).map(move |i| {
            if Some(i) == self.panic_at {
                panic!("bad item {i}");
            }
            self.produced.fetch_add(1, Ordering::SeqCst);
            Ok((i, id, rng.next_u64()))
        }))
    }
}

fn collect(loader: &mut IterableLoader<Numbers>) -> Vec<Vec<(usize, usize, u64)>> {
    loader.epoch().map(|b| b.unwrap()).collect()
}

#[test]
fn zero_and_one_worker_give_the_same_epoch_and_seeds_reproduce() {
    let mut a = IterableLoader::builder(Numbers::new(23)).batch_size(4).seed(8).build().unwrap();
    let mut b = IterableLoader::builder(Numbers::new(23)).batch_size(4).seed(8).num_workers(1).build().unwrap();
    let ea = collect(&mut a);
    assert_eq!(ea.len(), 6);
    assert_eq!(ea, collect(&mut b));
    // Next epoch: new base seed, new draws.
    let ea2 = collect(&mut a);
    assert_ne!(ea, ea2);
    assert_eq!(ea2, collect(&mut b));
}

#[test]
fn workers_have_distinct_generators_and_batches_come_round_robin() {
    let mut loader = IterableLoader::builder(Numbers::new(20)).batch_size(3).num_workers(2).seed(1).build().unwrap();
    let batches = collect(&mut loader);
    // Worker 0 owns 10 even items → batches of 3,3,3,1; worker 1 likewise.
    assert_eq!(batches.len(), 8);
    for (j, b) in batches.iter().enumerate() {
        assert!(b.iter().all(|(_, w, _)| *w == j % 2), "batch {j} should come from worker {}", j % 2);
    }
    let mut items: Vec<usize> = batches.iter().flatten().map(|(i, _, _)| *i).collect();
    items.sort_unstable();
    assert_eq!(items, (0..20).collect::<Vec<_>>());
    let draws =
        |w: usize| batches.iter().flatten().filter(|(_, id, _)| *id == w).map(|(_, _, d)| *d).collect::<Vec<u64>>();
    let (d0, d1) = (draws(0), draws(1));
    assert!(d0.iter().all(|x| !d1.contains(x)), "the two workers drew the same random numbers");
    let again =
        collect(&mut IterableLoader::builder(Numbers::new(20)).batch_size(3).num_workers(2).seed(1).build().unwrap());
    assert_eq!(again, batches, "same seed and worker count must reproduce the epoch");

    let mut dl =
        IterableLoader::builder(Numbers::new(20)).batch_size(3).num_workers(2).drop_last(true).seed(1).build().unwrap();
    assert!(collect(&mut dl).iter().all(|b| b.len() == 3));
}

#[test]
fn a_panicking_stream_is_reported_with_its_worker() {
    for workers in [0, 2] {
        let start = Instant::now();
        let results = within(Duration::from_secs(20), move || {
            let mut ds = Numbers::new(50);
            ds.panic_at = Some(13);
            let mut loader = IterableLoader::builder(ds).batch_size(2).num_workers(workers).build().unwrap();
            loader.epoch().collect::<Vec<_>>()
        });
        let err = results.last().unwrap().as_ref().unwrap_err();
        assert!(matches!(err, DataError::StreamFailed { .. }), "{err}");
        let expected = if workers == 0 { Origin::MainThread } else { Origin::Worker(1) };
        assert_eq!(err.origin(), Some(expected));
        assert!(err.to_string().contains("bad item 13"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}

#[test]
fn dropping_an_iterable_epoch_stops_its_workers() {
    let ds = Arc::new(Numbers::new(usize::MAX));
    let produced = Arc::clone(&ds.produced);
    let probe = Arc::clone(&ds);
    within(Duration::from_secs(20), move || {
        let mut loader =
            IterableLoader::builder(ds).batch_size(4).num_workers(2).prefetch_per_worker(2).build().unwrap();
        let mut e = loader.epoch();
        e.next().unwrap().unwrap();
        drop(e);
    });
    assert_eq!(Arc::strong_count(&probe), 1, "a worker outlived the loader");
    let n = produced.load(Ordering::SeqCst);
    // Each worker may have finished `prefetch` batches, one in its hands, and the one taken.
    assert!(n <= 2 * (2 + 1) * 4 + 4, "{n} items produced for an endless stream");
}
