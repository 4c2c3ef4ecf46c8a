//! One training step (forward, mean loss, backward, zero_grad) of a pre-norm transformer block,
//! batch 32 × seq 128 × width 256, 4 heads, feed-forward 1024, dropout 0.1 — the issue's
//! side-by-side benchmark with `benches/transformer_step.py` (PyTorch, same shapes and threads).
//!
//! `cargo bench -p ferrite-nn --bench transformer_step [-- STEPS [math|chunked|auto] [ckpt]]`
//! prints the median step time, the allocator's peak and the process's peak RSS.
//! `FERRITE_BENCH_DEVICE=gpu:0` runs it on another device (`.py … cuda` is PyTorch's side).

use std::time::Instant;

use ferrite_memory::allocator;
use ferrite_nn::{AttentionBackend, Checkpointed, Module, TransformerBlock, TransformerConfig};
use ferrite_tensor::{DType, Device, Generator, Tensor};

fn peak_rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() -> ferrite_nn::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let steps: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(10);
    let backend = match args.get(1).map(String::as_str) {
        Some("math") => AttentionBackend::Math,
        Some("chunked") => AttentionBackend::Chunked { chunk: 128 },
        _ => AttentionBackend::Auto,
    };
    let ckpt = args.get(2).map(String::as_str) == Some("ckpt");
    let (b, l, d, h, ff) = (32, 128, 256, 4, 1024);
    let dev: Device = match std::env::var("FERRITE_BENCH_DEVICE") {
        Ok(s) => s.parse::<Device>()?,
        Err(_) => Device::Cpu,
    };
    let mut g = Generator::new(0);
    let cfg = TransformerConfig::new(d, h).dim_feedforward(ff).dropout(0.1).attention_backend(backend);
    let block = TransformerBlock::new_with(cfg, &dev, &mut g)?;
    let model: Box<dyn Module> = if ckpt { Box::new(Checkpointed::new(block)) } else { Box::new(block) };
    let x = Tensor::randn_with(&[b, l, d], DType::F32, &dev, &mut g)?;
    let alloc = allocator(&dev);
    let step = || -> ferrite_nn::Result<f64> {
        let y = model.forward(&x)?;
        let loss = y.square()?.mean()?;
        loss.backward()?;
        model.zero_grad()?;
        Ok(loss.item()?) // `item` waits for the device: the step is timed to completion
    };
    for _ in 0..2 {
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
        "ferrite transformer step on {dev} (B{b} L{l} D{d} H{h} FF{ff}, {backend:?}{}): median {:.1} ms (min {:.1}) over {steps} steps, {} rayon threads; allocator peak above params {:.1} MiB; peak RSS {:.1} MiB",
        if ckpt { ", checkpointed" } else { "" },
        times[times.len() / 2],
        times[0],
        rayon_threads(),
        (alloc.max_memory_allocated() - base) as f64 / (1 << 20) as f64,
        peak_rss_kib().unwrap_or(0) as f64 / 1024.0
    );
    Ok(())
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
