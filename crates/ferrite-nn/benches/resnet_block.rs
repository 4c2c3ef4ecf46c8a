//! One training step of a ResNet basic block (He et al. 2016, torchvision's `BasicBlock`):
//! conv3x3 → batch norm → ReLU → conv3x3 → batch norm, plus the identity, → ReLU; 64 channels on
//! 32×32 maps, batch 32 (a CIFAR ResNet's first stage). Forward, `y.square().mean()`, backward into
//! the input and every parameter, `zero_grad`. `benches/resnet_block.py` is the PyTorch twin (same
//! shapes, loss and threads); `bench/models_vs_pytorch.py` runs both side by side.
//!
//! `cargo bench -p ferrite-nn --bench resnet_block [-- STEPS]` prints the median step time.

use std::time::Instant;

use ferrite_nn::{BatchNorm2d, BatchNormConfig, Conv2d, Conv2dConfig, Module, ReLU, Sequential};
use ferrite_tensor::{DType, Device, Generator, Tensor};

fn main() -> ferrite_nn::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let steps: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(20);
    let dev: Device = match std::env::var("FERRITE_BENCH_DEVICE") {
        Ok(s) => s.parse::<Device>()?,
        Err(_) => Device::Cpu,
    };
    let (b, c, hw) = (32, 64, 32);
    let mut g = Generator::new(0);
    let conv = |g: &mut Generator| Conv2d::new_with(Conv2dConfig::new(c, c, 3).padding(1).bias(false), &dev, g);
    let bn = || BatchNorm2d::with_config(c, &BatchNormConfig::default(), &dev);
    let body =
        Sequential::new().append(conv(&mut g)?).append(bn()?).append(ReLU::new()).append(conv(&mut g)?).append(bn()?);
    let x = Tensor::randn_with(&[b, c, hw, hw], DType::F32, &dev, &mut g)?.requires_grad_(true)?;
    let step = || -> ferrite_nn::Result<f64> {
        let y = body.forward(&x)?.add(&x)?.relu()?;
        let loss = y.square()?.mean()?;
        loss.backward()?;
        body.zero_grad()?;
        x.set_grad(None)?;
        Ok(loss.item()?)
    };
    for _ in 0..3 {
        step()?;
    }
    let mut times = Vec::with_capacity(steps);
    for _ in 0..steps {
        let t = Instant::now();
        step()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    println!(
        "ferrite resnet basic block step on {dev} (B{b} C{c} {hw}x{hw}): median {:.2} ms (min {:.2}) over {steps} steps; RAYON_NUM_THREADS={}",
        times[times.len() / 2],
        times[0],
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "unset (all cores)".into())
    );
    Ok(())
}
