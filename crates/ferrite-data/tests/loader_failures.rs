//! Failures and shutdown of the map-style loader: a failing or panicking dataset becomes an error
//! naming the worker and the index (never a hang); dropping the loader joins its workers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use ferrite_data::{BoxError, DataError, DataLoader, Dataset, Generator, InMemory, Origin, ToDevice, collate_fn};
use ferrite_memory::Device;

/// Run `f` on another thread and fail the test if it has not finished within `limit` — so a hang
/// is a failure, not a stuck CI job.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).unwrap_or_else(|_| panic!("did not finish within {limit:?}: the loader hangs"))
}

struct PanicsAt(usize);

impl Dataset for PanicsAt {
    type Sample = usize;

    fn len(&self) -> usize {
        1000
    }

    fn get(&self, index: usize, _rng: &mut Generator) -> Result<usize, BoxError> {
        if index == self.0 {
            panic!("corrupt record {index}");
        }
        std::thread::sleep(Duration::from_micros(50));
        Ok(index)
    }
}

#[test]
fn a_panicking_dataset_produces_an_error_naming_worker_and_index_quickly() {
    for workers in [0, 2] {
        let (elapsed, outcome) = within(Duration::from_secs(20), move || {
            let start = Instant::now();
            let mut loader = DataLoader::builder(PanicsAt(37)).batch_size(8).num_workers(workers).build().unwrap();
            let mut ok_batches = 0;
            let mut error = None;
            for batch in &mut loader {
                match batch {
                    Ok(_) => ok_batches += 1,
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            (start.elapsed(), (ok_batches, error))
        });
        let (ok_batches, error) = outcome;
        let error = error.expect("the panic must surface as an error");
        assert_eq!(ok_batches, 4, "batches before the failing one are delivered in order");
        assert!(matches!(error, DataError::SamplePanicked { index: 37, batch: 4, .. }), "{error}");
        assert_eq!(error.sample_index(), Some(37));
        match (workers, error.origin()) {
            (0, Some(Origin::MainThread)) => {}
            (_, Some(Origin::Worker(w))) if w < workers => {}
            other => panic!("wrong origin {other:?}"),
        }
        let msg = error.to_string();
        assert!(msg.contains("index 37") && msg.contains("corrupt record 37"), "{msg}");
        // Loose bound (the issue asks for "within a second"; CI machines are shared and slow).
        assert!(elapsed < Duration::from_secs(5), "error took {elapsed:?}");
    }
}

#[test]
fn an_error_from_get_names_worker_and_index_and_ends_the_epoch() {
    let data = (0..40)
        .collect::<InMemory<u32>>()
        .map(|x, _| if x == 21 { Err(format!("cannot decode {x}").into()) } else { Ok(x) });
    let mut loader = DataLoader::builder(data).batch_size(5).num_workers(3).build().unwrap();
    let results: Vec<Result<Vec<u32>, DataError>> = within(Duration::from_secs(20), move || loader.epoch().collect());
    assert_eq!(results.len(), 5, "four good batches, then the error, then the epoch ends");
    let err = results[4].as_ref().unwrap_err();
    assert!(matches!(err, DataError::SampleFailed { index: 21, batch: 4, origin: Origin::Worker(_), .. }), "{err}");
    assert!(err.to_string().contains("cannot decode 21"));
}

#[test]
fn a_panicking_collate_is_reported_for_its_batch() {
    let collate = collate_fn(|s: Vec<u32>, _: &mut Generator| if s.contains(&7) { panic!("bad batch") } else { Ok(s) });
    let mut loader = DataLoader::builder((0..12).collect::<InMemory<u32>>())
        .batch_size(4)
        .num_workers(2)
        .collate(collate)
        .build()
        .unwrap();
    let results: Vec<_> = within(Duration::from_secs(20), move || loader.epoch().collect::<Vec<_>>());
    assert_eq!(results.len(), 2);
    let err = results[1].as_ref().unwrap_err();
    assert!(matches!(err, DataError::BatchPanicked { batch: 1, .. }), "{err}");
}

#[test]
fn a_stuck_dataset_hits_the_timeout() {
    let data = InMemory::new(vec![0u8; 4]).map(|x, _| {
        std::thread::sleep(Duration::from_millis(600));
        Ok(x)
    });
    let mut loader =
        DataLoader::builder(data).batch_size(4).num_workers(1).timeout(Duration::from_millis(100)).build().unwrap();
    let first = within(Duration::from_secs(20), move || loader.epoch().next());
    assert!(matches!(first, Some(Err(DataError::Timeout { batch: 0, .. }))), "{first:?}");
}

/// Records every `get` call and holds an `Arc` that only the loader's threads share.
struct Slow {
    calls: Arc<AtomicUsize>,
}

impl Dataset for Slow {
    type Sample = usize;

    fn len(&self) -> usize {
        10_000
    }

    fn get(&self, index: usize, _rng: &mut Generator) -> Result<usize, BoxError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(2));
        Ok(index)
    }
}

#[test]
fn dropping_the_loader_mid_epoch_joins_its_workers() {
    let calls = Arc::new(AtomicUsize::new(0));
    let dataset = Arc::new(Slow { calls: Arc::clone(&calls) });
    let probe = Arc::clone(&dataset);
    let drop_time = within(Duration::from_secs(20), move || {
        let mut loader = DataLoader::builder(dataset).batch_size(16).num_workers(2).prefetch(8).build().unwrap();
        let mut epoch = loader.epoch();
        epoch.next().unwrap().unwrap();
        let start = Instant::now();
        drop(epoch);
        drop(loader);
        start.elapsed()
    });
    // Every worker held a clone of the dataset; after the join only the probe is left.
    assert_eq!(Arc::strong_count(&probe), 1, "a worker thread outlived the loader");
    let after = calls.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(calls.load(Ordering::SeqCst), after, "workers kept loading after the loader was dropped");
    assert!(after < 10_000, "the epoch must not have been run to completion");
    // Only in-flight `get` calls (2 ms each) are waited for.
    assert!(drop_time < Duration::from_secs(2), "dropping took {drop_time:?}");
}

#[test]
fn a_dropped_epoch_leaves_the_loader_usable() {
    let mut loader =
        DataLoader::builder((0..100).collect::<InMemory<u32>>()).batch_size(10).num_workers(2).build().unwrap();
    let mut e = loader.epoch();
    assert_eq!(e.next().unwrap().unwrap()[0], 0);
    drop(e);
    let all: Vec<u32> = loader.epoch().flat_map(|b| b.unwrap()).collect();
    assert_eq!(all, (0..100).collect::<Vec<_>>());
}

/// A batch that records which thread moved it to which device.
#[derive(Debug)]
struct Recorded {
    staged_on: Option<String>,
    device: Option<Device>,
}

impl ToDevice for Recorded {
    fn to_device(self, device: &Device) -> Result<Self, BoxError> {
        Ok(Recorded { staged_on: std::thread::current().name().map(str::to_string), device: Some(device.clone()) })
    }
}

#[test]
fn staging_moves_batches_to_the_device_in_the_workers() {
    let collate = collate_fn(|_s: Vec<u32>, _: &mut Generator| Ok(Recorded { staged_on: None, device: None }));
    let mut loader = DataLoader::builder((0..20).collect::<InMemory<u32>>())
        .batch_size(5)
        .num_workers(2)
        .collate(collate)
        .stage_to(Device::Meta)
        .build()
        .unwrap();
    for batch in &mut loader {
        let b = batch.unwrap();
        assert_eq!(b.device, Some(Device::Meta));
        let thread = b.staged_on.unwrap_or_default();
        assert!(thread.starts_with("ferrite-data-worker-"), "staged on {thread}, not in the background");
    }
    let failing = collate_fn(|_s: Vec<u32>, _: &mut Generator| Ok(1u8));
    let mut loader = DataLoader::builder((0..4).collect::<InMemory<u32>>())
        .batch_size(2)
        .collate(failing)
        .stage_with(|_| Err("device full".into()))
        .build()
        .unwrap();
    let err = loader.epoch().next().unwrap().unwrap_err();
    assert!(err.to_string().contains("move to the device batch 0: device full"), "{err}");
    // Staging must be configured after the collate function it applies to.
    let misordered = DataLoader::builder(InMemory::new(vec![1u8]))
        .stage_with(Ok)
        .collate(collate_fn(|s: Vec<u8>, _: &mut Generator| Ok(s)));
    assert!(misordered.build().is_err());
}
