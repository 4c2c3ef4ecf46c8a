//! Background staging into a real GPU: the loader's workers upload each collated batch to `gpu:N`
//! (through the GPU allocator, overlapping the training step), the batches are the ones staged to
//! the CPU, and every byte returns to the GPU allocator when the epoch ends. Skips loudly without
//! an adapter (Debian: `mesa-vulkan-drivers` + `libvulkan1`), fails under
//! `FERRITE_REQUIRE_SYSTEM_DEPS=1`.

use ferrite_data::{DataLoader, DatasetKind, builtin_dataset};
use ferrite_memory::Device;

fn epoch(workers: usize, device: &Device) -> Vec<(Vec<f32>, Vec<i64>)> {
    let splits = builtin_dataset(DatasetKind::Digits).unwrap();
    let train = ferrite_data::Subset::first(splits.train, 200);
    let mut loader = DataLoader::builder(train)
        .batch_size(48)
        .shuffle(true)
        .seed(5)
        .num_workers(workers)
        .collate(ferrite_data::Tensors(ferrite_data::ImageCollate::new([1, 8, 8])))
        .stage_to(device.clone())
        .build()
        .unwrap();
    loader
        .epoch()
        .map(|b| {
            let (x, y) = b.unwrap();
            assert_eq!(x.device(), device);
            assert_eq!(y.device(), device);
            (x.to_vec::<f32>().unwrap(), y.to_vec::<i64>().unwrap())
        })
        .collect()
}

#[test]
fn batches_staged_to_a_gpu_equal_the_cpu_batches_and_return_their_memory() {
    let gpus: Vec<Device> = ferrite_memory::gpu::devices_under_test()
        .unwrap()
        .into_iter()
        .filter(|d| matches!(d, Device::Gpu { .. }))
        .collect();
    if gpus.is_empty() {
        eprintln!("SKIPPED: no GPU adapter (install mesa-vulkan-drivers and libvulkan1)");
        assert_ne!(
            std::env::var("FERRITE_REQUIRE_SYSTEM_DEPS").as_deref(),
            Ok("1"),
            "FERRITE_REQUIRE_SYSTEM_DEPS=1 but no GPU adapter was found"
        );
        return;
    }
    let want = epoch(0, &Device::Cpu);
    assert_eq!(want.len(), 5); // ceil(200 / 48)
    for d in &gpus {
        let alloc = ferrite_memory::allocator(d);
        let before = alloc.memory_allocated();
        let allocs_before = alloc.memory_stats_flat().get("allocation.all.allocated").copied().unwrap_or(0);
        for workers in [0, 2] {
            assert_eq!(epoch(workers, d), want, "{d}, {workers} workers");
        }
        assert_eq!(alloc.memory_allocated(), before, "{d}: staged batches return their memory");
        let allocs = alloc.memory_stats_flat().get("allocation.all.allocated").copied().unwrap_or(0) - allocs_before;
        assert!(
            allocs >= 20,
            "{d}: 2 epochs × 5 batches × 2 tensors go through the GPU allocator, saw {allocs} allocations"
        );
        println!("staged digits batches to {d}: equal to cpu, memory returned");
    }
}
