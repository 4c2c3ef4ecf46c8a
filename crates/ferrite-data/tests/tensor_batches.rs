//! Tensor collation and background device staging, seen from outside: batches arrive as tensors
//! on the training device, identical for every worker count, and staged batches are accounted by
//! the device's allocator.

mod common;

use ferrite_data::{DataLoader, Dataset, DatasetKind, InMemory, StackCollate, Tensor, builtin_dataset};
use ferrite_memory::Device;

fn digits_epoch(workers: usize, device: &Device) -> Vec<(Vec<f32>, Vec<i64>)> {
    common::staged_digits_epoch(300, 64, 11, workers, device)
}

#[test]
fn staged_tensor_batches_are_identical_for_any_worker_count() {
    let sim = Device::parse("sim:t4-16gb:3").unwrap();
    let reference = digits_epoch(0, &sim);
    assert_eq!(reference.len(), 5); // ceil(300 / 64)
    assert_eq!(reference[4].1.len(), 300 - 4 * 64);
    for workers in [1, 2, 4] {
        assert_eq!(digits_epoch(workers, &sim), reference, "{workers} workers");
    }
}

#[test]
fn staged_batches_live_in_the_device_allocator_until_dropped() {
    let sim = Device::parse("sim:t4-16gb:5").unwrap();
    let alloc = ferrite_memory::allocator(&sim);
    let before = alloc.memory_allocated();
    let splits = builtin_dataset(DatasetKind::Digits).unwrap();
    let mut loader = splits.test.tensor_loader(32).num_workers(2).stage_to(sim.clone()).build().unwrap();
    let mut epoch = loader.epoch();
    let (x, y) = epoch.next().unwrap().unwrap();
    assert!(alloc.memory_allocated() >= before + (32 * 64 * 4 + 32 * 8) as u64);
    drop((x, y));
    drop(epoch); // prefetched batches are dropped with the epoch
    drop(loader);
    assert_eq!(alloc.memory_allocated(), before, "staged batches must return their device memory");
}

#[test]
fn tensor_samples_stack_through_the_loader() {
    let cpu = Device::Cpu;
    let data =
        (0..10).map(|i| (i as f32, i as usize % 3)).collect::<InMemory<(f32, usize)>>().map(move |(v, label), rng| {
            let noise = rng.uniform_f32();
            Ok((Tensor::from_vec(vec![v, v + noise], &[2], &Device::Cpu)?, label))
        });
    assert_eq!(data.len(), 10);
    let mut loader = DataLoader::builder(data).batch_size(4).num_workers(2).collate(StackCollate).build().unwrap();
    let batches: Vec<(Tensor, Tensor)> = loader.epoch().map(|b| b.unwrap()).collect();
    assert_eq!(batches.iter().map(|(x, _)| x.shape()[0]).collect::<Vec<_>>(), [4, 4, 2]);
    assert_eq!(batches[0].0.device(), &cpu);
    assert_eq!(batches[2].1.to_vec::<i64>().unwrap(), [2, 0]);
}
