//! Background staging into a real GPU: the loader's workers upload each collated batch to `gpu:N`
//! (through the GPU allocator, overlapping the training step), the batches are the ones staged to
//! the CPU, and every byte returns to the GPU allocator when the epoch ends. Skips loudly without
//! an adapter (Debian: `mesa-vulkan-drivers` + `libvulkan1`), fails under
//! `FERRITE_REQUIRE_SYSTEM_DEPS=1`.

mod common;

use ferrite_memory::Device;

fn epoch(workers: usize, device: &Device) -> Vec<(Vec<f32>, Vec<i64>)> {
    common::staged_digits_epoch(200, 48, 5, workers, device)
}

#[test]
fn batches_staged_to_a_gpu_equal_the_cpu_batches_and_return_their_memory() {
    let gpus = ferrite_test_support::gpus_or_skip();
    if gpus.is_empty() {
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
