//! Seeding and ordering of the map-style loader, seen from outside: distinct worker randomness,
//! bit-identical epochs across runs and worker counts, epochs that differ, sampler order.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ferrite_data::{
    BoxError, DataLoader, Dataset, Generator, InMemory, SubsetRandomSampler, WeightedRandomSampler, collate_fn,
};

/// Every sample has the same underlying value; only the random augmentation tells them apart.
/// It reports which thread loaded it.
struct ConstantWithNoise;

impl Dataset for ConstantWithNoise {
    type Sample = (String, f64);

    fn len(&self) -> usize {
        64
    }

    fn get(&self, _index: usize, rng: &mut Generator) -> Result<(String, f64), BoxError> {
        let thread = std::thread::current().name().unwrap_or("unnamed").to_string();
        // Slow enough that both workers get a share of the epoch.
        std::thread::sleep(Duration::from_micros(200));
        Ok((thread, 1.0 + rng.normal_f64()))
    }
}

#[test]
fn two_workers_applying_a_random_augmentation_produce_different_values() {
    let mut loader = DataLoader::builder(ConstantWithNoise).batch_size(4).num_workers(2).seed(7).build().unwrap();
    let samples: Vec<(String, f64)> = loader.epoch().flat_map(|b| b.unwrap()).collect();
    assert_eq!(samples.len(), 64);
    let by = |w: &str| samples.iter().filter(|(t, _)| t == w).map(|(_, v)| *v).collect::<Vec<f64>>();
    let w0 = by("ferrite-data-worker-0");
    let w1 = by("ferrite-data-worker-1");
    assert!(!w0.is_empty() && !w1.is_empty(), "both workers should have loaded samples: {} / {}", w0.len(), w1.len());
    // The PyTorch bug would make worker 1 repeat worker 0's draws; here no value repeats at all.
    for a in &w0 {
        assert!(!w1.contains(a), "worker 0 and worker 1 drew the same augmentation {a}");
    }
    let mut all: Vec<u64> = samples.iter().map(|(_, v)| v.to_bits()).collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 64, "every sample must get its own augmentation");
}

/// A dataset whose samples draw a varying number of random words, so any coupling between the
/// streams of different samples would show up as a difference between worker counts.
struct Augmented {
    n: usize,
}

impl Dataset for Augmented {
    type Sample = (usize, Vec<u64>);

    fn len(&self) -> usize {
        self.n
    }

    fn get(&self, index: usize, rng: &mut Generator) -> Result<(usize, Vec<u64>), BoxError> {
        // Uneven cost: batches finish out of order with several workers.
        if index.is_multiple_of(7) {
            std::thread::sleep(Duration::from_micros(300));
        }
        let draws = 1 + index % 5;
        Ok((index, (0..draws).map(|_| rng.next_u64()).collect()))
    }
}

type Batch = (Vec<(usize, Vec<u64>)>, u64);

fn run_epochs(seed: u64, workers: usize, epochs: usize) -> Vec<Vec<Batch>> {
    // The collate step adds a batch-level random draw (e.g. a mixup coefficient).
    let collate = collate_fn(|samples: Vec<(usize, Vec<u64>)>, rng: &mut Generator| Ok((samples, rng.next_u64())));
    let mut loader = DataLoader::builder(Augmented { n: 103 })
        .batch_size(8)
        .shuffle(true)
        .seed(seed)
        .num_workers(workers)
        .prefetch(3 * workers.max(1))
        .collate(collate)
        .build()
        .unwrap();
    (0..epochs).map(|_| loader.epoch().map(|b| b.unwrap()).collect()).collect()
}

#[test]
fn same_seed_gives_identical_batches_across_runs_and_worker_counts() {
    let reference = run_epochs(1234, 0, 3);
    assert_eq!(reference.len(), 3);
    assert_eq!(reference[0].len(), 13); // ceil(103 / 8)
    assert_eq!(run_epochs(1234, 0, 3), reference, "two runs with 0 workers differ");
    for workers in [1, 2, 4] {
        assert_eq!(run_epochs(1234, workers, 3), reference, "{workers} workers differ from 0 workers");
    }
    assert_ne!(run_epochs(1235, 2, 1)[0], reference[0], "a different seed must give a different epoch");
}

#[test]
fn successive_epochs_differ_in_order_and_augmentation() {
    let epochs = run_epochs(99, 2, 3);
    let order = |e: &Vec<Batch>| e.iter().flat_map(|(s, _)| s.iter().map(|(i, _)| *i)).collect::<Vec<usize>>();
    let (o0, o1, o2) = (order(&epochs[0]), order(&epochs[1]), order(&epochs[2]));
    assert_ne!(o0, o1);
    assert_ne!(o1, o2);
    for o in [&o0, &o1, &o2] {
        let mut s = o.clone();
        s.sort_unstable();
        assert_eq!(s, (0..103).collect::<Vec<_>>(), "each epoch visits every sample once");
    }
    // The same index gets a fresh augmentation in the next epoch.
    let draw_for = |e: &Vec<Batch>, idx: usize| {
        e.iter().flat_map(|(s, _)| s.iter()).find(|(i, _)| *i == idx).map(|(_, d)| d.clone())
    };
    assert_ne!(draw_for(&epochs[0], 5), draw_for(&epochs[1], 5));
}

#[test]
fn worker_info_names_the_worker_and_its_generator_differs_per_worker() {
    let data = (0..32).collect::<InMemory<u32>>().map(|_, _| {
        std::thread::sleep(Duration::from_micros(300));
        let w = ferrite_data::worker_info().expect("running in a worker");
        Ok((w.id(), w.num_workers(), w.generator().next_u64()))
    });
    let mut loader = DataLoader::builder(data).batch_size(2).num_workers(2).seed(4).build().unwrap();
    let seen: Vec<(usize, usize, u64)> = loader.epoch().flat_map(|b| b.unwrap()).collect();
    assert!(seen.iter().all(|&(id, n, _)| id < 2 && n == 2));
    let first_draw = |w: usize| seen.iter().find(|s| s.0 == w).map(|s| s.2);
    assert!(first_draw(0).is_some() && first_draw(1).is_some());
    assert_ne!(first_draw(0), first_draw(1), "the two workers' own generators must differ");
    assert!(ferrite_data::worker_info().is_none(), "the test thread is not a worker");
}

#[test]
fn batches_arrive_in_sampler_order_without_shuffle() {
    let mut loader = DataLoader::builder(Augmented { n: 50 }).batch_size(3).num_workers(4).seed(0).build().unwrap();
    assert_eq!(loader.len(), 17);
    let indices: Vec<usize> = loader.epoch().flat_map(|b| b.unwrap()).map(|(i, _)| i).collect();
    assert_eq!(indices, (0..50).collect::<Vec<_>>());
}

#[test]
fn drop_last_and_custom_samplers() {
    let mut loader =
        DataLoader::builder((0..10).collect::<InMemory<u32>>()).batch_size(4).drop_last(true).build().unwrap();
    let batches: Vec<Vec<u32>> = loader.epoch().map(|b| b.unwrap()).collect();
    assert_eq!(batches, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);

    let mut loader = DataLoader::builder((0..10).collect::<InMemory<u32>>())
        .batch_size(2)
        .sampler(SubsetRandomSampler::new(vec![1, 3, 5]))
        .num_workers(2)
        .seed(3)
        .build()
        .unwrap();
    let mut seen: Vec<u32> = loader.epoch().flat_map(|b| b.unwrap()).collect();
    seen.sort_unstable();
    assert_eq!(seen, [1, 3, 5]);

    let weighted = WeightedRandomSampler::new(vec![0.0, 0.0, 1.0], 6, true).unwrap();
    let mut loader = DataLoader::builder(InMemory::new(vec!['a', 'b', 'c']))
        .batch_size(6)
        .sampler(weighted)
        .seed(1)
        .build()
        .unwrap();
    assert_eq!(loader.epoch().next().unwrap().unwrap(), vec!['c'; 6]);

    let err = DataLoader::builder(InMemory::new(vec![1]))
        .shuffle(true)
        .sampler(SubsetRandomSampler::new(vec![0]))
        .build()
        .err()
        .unwrap();
    assert!(err.to_string().contains("mutually exclusive"), "{err}");
    assert!(DataLoader::builder(InMemory::new(vec![1])).batch_size(0).build().is_err());
}

#[test]
fn restoring_the_generator_state_repeats_the_next_epoch() {
    let data = (0..20).collect::<InMemory<u32>>().map(|x, rng| Ok((x, rng.next_u32())));
    let mut loader = DataLoader::builder(data).batch_size(5).shuffle(true).seed(5).num_workers(2).build().unwrap();
    let _first: Vec<_> = loader.epoch().collect();
    let state = loader.generator_state();
    let second: Vec<Vec<(u32, u32)>> = loader.epoch().map(|b| b.unwrap()).collect();
    loader.set_generator_state(state);
    let again: Vec<Vec<(u32, u32)>> = loader.epoch().map(|b| b.unwrap()).collect();
    assert_eq!(second, again);
    assert_eq!(loader.epochs_started(), 3);
}

#[test]
fn prefetch_depth_bounds_the_work_ahead_of_the_consumer() {
    struct Counting(Arc<AtomicUsize>);
    impl Dataset for Counting {
        type Sample = usize;
        fn len(&self) -> usize {
            400
        }
        fn get(&self, index: usize, _rng: &mut Generator) -> Result<usize, BoxError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(index)
        }
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let mut loader =
        DataLoader::builder(Counting(Arc::clone(&calls))).batch_size(4).num_workers(2).prefetch(2).build().unwrap();
    let mut epoch = loader.epoch();
    assert_eq!(epoch.next().unwrap().unwrap(), vec![0, 1, 2, 3]);
    // After one batch was taken, at most batches 1 and 2 may be loaded ahead: 3 batches in total.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while calls.load(Ordering::SeqCst) < 12 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(calls.load(Ordering::SeqCst), 12, "workers must prefetch exactly the configured depth");
    drop(epoch);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
    /// For any configuration, every worker count yields exactly what 0 workers yield.
    #[test]
    fn worker_count_never_changes_an_epoch(n in 0usize..60, bs in 1usize..9, workers in 1usize..4, prefetch in 1usize..6, shuffle: bool, drop_last: bool, seed: u64) {
        let run = |w: usize| {
            let data = (0..n as u32).collect::<InMemory<u32>>().map(|x, rng| Ok((x, rng.next_u32())));
            let mut loader = DataLoader::builder(data).batch_size(bs).shuffle(shuffle).drop_last(drop_last)
                .seed(seed).num_workers(w).prefetch(prefetch).build().unwrap();
            (0..2).map(|_| loader.epoch().map(|b| b.unwrap()).collect::<Vec<_>>()).collect::<Vec<_>>()
        };
        let reference = run(0);
        let expected = if drop_last { n / bs } else { n.div_ceil(bs) };
        proptest::prop_assert_eq!(reference[0].len(), expected);
        proptest::prop_assert_eq!(run(workers), reference);
    }
}
