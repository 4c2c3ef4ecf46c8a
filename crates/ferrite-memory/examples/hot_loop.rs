//! A tight cached alloc+free loop, for profilers: `cargo run --release --example hot_loop`.
use std::hint::black_box;
use std::time::Instant;

use ferrite_memory::Device;

fn main() {
    let size: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let a = ferrite_memory::allocator(&Device::Cpu);
    drop(a.allocate(size).unwrap());
    let n = 20_000_000u32;
    let t = Instant::now();
    for _ in 0..n {
        let b = a.allocate(black_box(size)).unwrap();
        black_box(b.addr());
    }
    println!("{size} bytes: {:.1} ns per cached alloc+free", t.elapsed().as_nanos() as f64 / n as f64);
}
