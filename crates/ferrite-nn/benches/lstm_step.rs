//! One training step of one LSTM layer, batch 32, input 256 → hidden 512: forward over a short
//! sequence of `SEQ` time steps (default 16; `1` is a single time step), `y.square().mean()`,
//! backward into the input, every parameter and nothing else, `zero_grad` — the issue's
//! side-by-side benchmark with `benches/lstm_step.py` (PyTorch `nn.LSTM`, same shapes, loss and
//! threads).
//!
//! `cargo bench -p ferrite-nn --bench lstm_step [-- STEPS SEQ]` prints the median step time and
//! the allocator's peak above the parameters. `FERRITE_BENCH_DEVICE=gpu:0` runs it elsewhere.

use std::time::Instant;

use ferrite_memory::allocator;
use ferrite_nn::{LSTM, Module};
use ferrite_tensor::{DType, Device, Generator, Tensor};

fn main() -> ferrite_nn::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let steps: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(20);
    let seq: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(16);
    // `FERRITE_BENCH_LSTM_HIDDEN=H` changes the hidden width (input 256 and batch 32 stay).
    let h: usize = std::env::var("FERRITE_BENCH_LSTM_HIDDEN").ok().and_then(|v| v.parse().ok()).unwrap_or(512);
    let (b, i) = (32, 256);
    let dev: Device = match std::env::var("FERRITE_BENCH_DEVICE") {
        Ok(s) => s.parse::<Device>()?,
        Err(_) => Device::Cpu,
    };
    let mut g = Generator::new(0);
    let lstm = LSTM::new_with(i, h, 1, true, false, &dev, &mut g)?;
    let x = Tensor::randn_with(&[seq, b, i], DType::F32, &dev, &mut g)?.requires_grad_(true)?;
    let alloc = allocator(&dev);
    let step = || -> ferrite_nn::Result<f64> {
        let y = lstm.forward(&x)?;
        let loss = y.square()?.mean()?;
        loss.backward()?;
        lstm.zero_grad()?;
        x.set_grad(None)?;
        Ok(loss.item()?) // `item` waits for the device: the step is timed to completion
    };
    for _ in 0..3 {
        step()?;
    }
    alloc.reset_peak_memory_stats();
    let base = alloc.memory_allocated();
    let mut times = Vec::with_capacity(steps);
    for _ in 0..steps {
        let t = Instant::now();
        step()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    println!(
        "ferrite lstm step on {dev} (B{b} I{i} H{h} SEQ{seq}, SIMD {}): median {:.3} ms (min {:.3}) over {steps} steps; allocator peak above params {:.2} MiB",
        ferrite_tensor::simd_level(),
        times[times.len() / 2],
        times[0],
        (alloc.max_memory_allocated() - base) as f64 / (1 << 20) as f64,
    );
    Ok(())
}
