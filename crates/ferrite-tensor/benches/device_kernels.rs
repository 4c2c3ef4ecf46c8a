//! GPU-side figures next to PyTorch CUDA (`bench/gpu_vs_pytorch_cuda.py`): f32 matmul GFLOP/s at
//! n³ for n in 1024, 4096, 8192 (PyTorch with TF32 disabled, so both sides do f32 arithmetic), and
//! the cost of one allocate + free through the device's caching allocator (a cache hit: the
//! figure every op pays for its output), and layer norm forward and forward + backward (affine,
//! f32) at a few `[rows, cols]` — the backward is one fused kernel pair where the backend has one.
//!
//! `FERRITE_BENCH_DEVICE=gpu:0 cargo bench -p ferrite-tensor --bench device_kernels [-- SIZES…]
//! [layer_norm]` (default device `gpu:0`; `cpu` works too; the word `layer_norm` runs only the
//! layer norm rows). Kernels run asynchronously on a GPU, so each timed
//! loop ends by reading one element back, which waits for the queue.

use std::time::Instant;

use ferrite_memory::allocator;
use ferrite_tensor::{DType, Device, Generator, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device: Device = std::env::var("FERRITE_BENCH_DEVICE").unwrap_or_else(|_| "gpu:0".into()).parse()?;
    let sizes: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let only_layer_norm = std::env::args().skip(1).any(|a| a == "layer_norm");
    let sizes = if sizes.is_empty() { vec![1024, 4096, 8192] } else { sizes };
    println!("device {device}");
    let mut g = Generator::new(0);
    if only_layer_norm {
        return layer_norm(&device, &mut g);
    }
    for n in sizes {
        let a = match Tensor::randn_with(&[n, n], DType::F32, &device, &mut g) {
            Ok(t) => t,
            Err(e) => {
                println!("matmul {n}: skipped ({e})");
                continue;
            }
        };
        let b = Tensor::randn_with(&[n, n], DType::F32, &device, &mut g)?;
        let wait = |t: &Tensor| t.narrow(0, 0, 1).and_then(|r| r.narrow(1, 0, 1)).and_then(|r| r.to_vec::<f32>());
        match a.matmul(&b) {
            Ok(c) => wait(&c)?,
            Err(e) => {
                println!("matmul {n}: skipped ({e})");
                continue;
            }
        };
        let flops = 2.0 * (n as f64).powi(3);
        let iters = ((2e11 / flops).ceil() as usize).clamp(1, 50);
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t = Instant::now();
            let mut last = None;
            for _ in 0..iters {
                last = Some(a.matmul(&b)?);
            }
            if let Some(c) = last {
                wait(&c)?;
            }
            best = best.min(t.elapsed().as_secs_f64() / iters as f64);
        }
        println!("matmul {n} {:.1} GFLOP/s ({:.3} ms per product)", flops / best / 1e9, best * 1e3);
    }
    let alloc = allocator(&device);
    for size in [4usize << 10, 1 << 20, 64 << 20] {
        drop(alloc.allocate(size)?); // warm the cache: later requests are hits
        let iters = 100_000;
        let t = Instant::now();
        for _ in 0..iters {
            drop(alloc.allocate(size)?);
        }
        println!("alloc+free {size} B {:.0} ns", t.elapsed().as_secs_f64() / iters as f64 * 1e9);
    }
    layer_norm(&device, &mut g)
}

/// Best-of-3 milliseconds per layer norm forward, and per forward + backward (x, weight and bias
/// gradients), at a transformer's `[tokens, width]` and a wide one (on lavapipe, Mesa's software
/// Vulkan, `[65536, 64]` takes minutes: a workgroup per row costs far more than its 64 values).
fn layer_norm(device: &Device, g: &mut Generator) -> Result<(), Box<dyn std::error::Error>> {
    use ferrite_tensor::functional::layer_norm;
    for (rows, cols) in [(4096usize, 256usize), (512, 4096)] {
        let x = Tensor::randn_with(&[rows, cols], DType::F32, device, g)?.requires_grad_(true)?;
        let w = Tensor::randn_with(&[cols], DType::F32, device, g)?.requires_grad_(true)?;
        let b = Tensor::randn_with(&[cols], DType::F32, device, g)?.requires_grad_(true)?;
        let dy = Tensor::randn_with(&[rows, cols], DType::F32, device, g)?;
        let wait = |t: &Tensor| t.narrow(0, 0, 1).and_then(|r| r.to_vec::<f32>());
        let time = |backward: bool| -> Result<f64, Box<dyn std::error::Error>> {
            let iters = 5;
            let mut best = f64::INFINITY;
            for round in 0..4 {
                let t = Instant::now();
                for _ in 0..iters {
                    let y = layer_norm(&x, &[cols], Some(&w), Some(&b), 1e-5)?;
                    if backward {
                        for t in [&x, &w, &b] {
                            t.set_grad(None)?; // no accumulation op: each backward writes fresh grads
                        }
                        y.backward_with(&dy, false)?;
                    } else {
                        wait(&y)?;
                    }
                }
                if let Some(gx) = x.grad() {
                    wait(&gx)?;
                }
                if round > 0 {
                    best = best.min(t.elapsed().as_secs_f64() / iters as f64); // round 0 warms up
                }
            }
            Ok(best * 1e3)
        };
        let (f, fb) = (time(false)?, time(true)?);
        println!(
            "layer_norm [{rows}, {cols}] forward {f:.3} ms, forward+backward {fb:.3} ms (backward ≈ {:.3} ms)",
            fb - f
        );
    }
    Ok(())
}
