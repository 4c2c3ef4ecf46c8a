//! One training step of a `Conv2d` layer — forward, mean-square loss, backward, `zero_grad` — on
//! PyTorch's classic first-layer shape: batch 32, 3 → 64 channels, 32×32, kernel 3, padding 1.
//! `benches/conv_step.py` is the PyTorch twin (same shapes, loss and thread count);
//! `bench/conv_vs_pytorch.py` runs both side by side and prints the ratio.
//!
//! `FERRITE_BENCH_CONV=CIN,COUT,HW` plans another shape (e.g. `1,32,28`, `64,64,56`).
//! `cargo bench -p ferrite-nn --bench conv_step [-- STEPS [input-grad]]` prints the median and
//! minimum step time and the median forward time (no graph). With `input-grad` the input also
//! requires grad, so backward computes the input gradient (a layer inside a network) as well as
//! the weight and bias gradients (a first layer). `FERRITE_BENCH_DEVICE=gpu:0` runs it elsewhere.

use std::time::Instant;

use ferrite_nn::{Conv2d, Conv2dConfig, Module};
use ferrite_tensor::{DType, Device, Generator, Tensor, no_grad};

fn median(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0])
}

fn conv_shape() -> ferrite_nn::Result<(usize, usize, usize)> {
    let Ok(spec) = std::env::var("FERRITE_BENCH_CONV") else { return Ok((3, 64, 32)) };
    let v: Vec<usize> = spec.split(',').filter_map(|x| x.trim().parse().ok()).collect();
    match v[..] {
        [cin, cout, hw] if cin > 0 && cout > 0 && hw > 0 => Ok((cin, cout, hw)),
        _ => Err(ferrite_nn::NnError::InvalidConfig {
            layer: "conv_step bench",
            detail: format!("FERRITE_BENCH_CONV={spec}: expected CIN,COUT,HW"),
        }),
    }
}

fn main() -> ferrite_nn::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let steps: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(30);
    let input_grad = args.iter().any(|a| a == "input-grad");
    let dev: Device = match std::env::var("FERRITE_BENCH_DEVICE") {
        Ok(s) => s.parse::<Device>()?,
        Err(_) => Device::Cpu,
    };
    // `FERRITE_BENCH_CONV=CIN,COUT,HW` changes the shape (batch 32, kernel 3, padding 1 stay).
    let (cin, cout, hw) = conv_shape()?;
    let (b, k) = (32, 3);
    let mut g = Generator::new(0);
    let conv = Conv2d::new_with(Conv2dConfig::new(cin, cout, k).padding(1), &dev, &mut g)?;
    let x = Tensor::randn_with(&[b, cin, hw, hw], DType::F32, &dev, &mut g)?.requires_grad_(input_grad)?;
    let step = || -> ferrite_nn::Result<f64> {
        let y = conv.forward(&x)?;
        let loss = y.square()?.mean()?;
        loss.backward()?;
        conv.zero_grad()?;
        x.set_grad(None)?;
        Ok(loss.item()?) // waits for the device: the step is timed to completion
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
    let mut fwd = Vec::with_capacity(steps);
    for _ in 0..steps {
        let _g = no_grad();
        let t = Instant::now();
        let y = conv.forward(&x)?;
        if !matches!(dev, Device::Cpu) {
            y.max()?.item()?; // wait for the device
        }
        std::hint::black_box(y);
        fwd.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let ((med, min), (fmed, _)) = (median(times), median(fwd));
    println!(
        "ferrite conv2d step on {dev} (B{b} {cin}->{cout} {hw}x{hw} k{k} p1, input grad {input_grad}): median {med:.2} ms (min {min:.2}) over {steps} steps; forward median {fmed:.2} ms; RAYON_NUM_THREADS={}",
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "unset (all cores)".into())
    );
    Ok(())
}
