//! A tour of ferrite's memory layer: `cargo run --release -p ferrite-memory --example memory_tour`.
use ferrite_memory::{AllocatorConfig, CachingAllocator, Device, MemoryError};

fn main() -> Result<(), MemoryError> {
    // A private allocator on a simulated 100 MiB GPU (use `ferrite_memory::allocator(&device)` for
    // the process-wide one that tensors use).
    let gpu = Device::parse("sim:100MiB")?;
    let alloc = CachingAllocator::with_config(gpu, AllocatorConfig::parse("garbage_collection_threshold:0.8")?);
    alloc.record_memory_history(Some(10_000));

    let x = alloc.allocate(600 * 1024)?; // small pool: one 2 MiB segment
    println!("allocated {} B, reserved {} B", alloc.memory_allocated(), alloc.memory_reserved());
    drop(x);

    // Fill the device with 5 MiB blocks, free every other one: 50 MiB free, in 5 MiB holes.
    let mut blocks: Vec<_> = (0..20).map(|_| alloc.allocate(5 << 20).map(Some)).collect::<Result<_, _>>()?;
    blocks.iter_mut().step_by(2).for_each(|b| *b = None);
    match alloc.allocate(12 << 20) {
        Err(e @ MemoryError::OutOfMemory { .. }) => println!("\n{e}\n"),
        other => println!("unexpected: {other:?}"),
    }
    println!("{}", alloc.memory_summary(true));
    println!("peak reserved: {} B", alloc.memory_stats_flat()["reserved_bytes.all.peak"]);
    println!(
        "history: {} events, snapshot: {} segments",
        alloc.memory_history().len(),
        alloc.snapshot().segments.len()
    );
    Ok(())
}
