//! Optimizer-step micro-benchmark: AdamW and SGD-with-momentum over ~4.2M float32 parameters
//! (8 tensors of 512x1024), the same setup as `adamw_step_torch.py` for PyTorch.
//!
//!     cargo bench -p ferrite-optim --bench adamw_step
//!
//! Prints the median and min of 30 timed steps after 5 warm-up steps.

use std::time::Instant;

use ferrite_optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use ferrite_tensor::{Device, Generator, Tensor};

fn params(n_tensors: usize, rows: usize, cols: usize) -> Vec<Tensor> {
    let mut g = Generator::new(0);
    (0..n_tensors)
        .map(|_| {
            let v: Vec<f32> = (0..rows * cols).map(|_| g.normal_f64() as f32).collect();
            let p = Tensor::from_vec(v, &[rows, cols], &Device::Cpu).unwrap().requires_grad_(true).unwrap();
            let gv: Vec<f32> = (0..rows * cols).map(|_| (g.normal_f64() * 1e-3) as f32).collect();
            p.set_grad(Some(Tensor::from_vec(gv, &[rows, cols], &Device::Cpu).unwrap())).unwrap();
            p
        })
        .collect()
}

fn time(name: &str, numel: usize, opt: &mut dyn Optimizer) {
    for _ in 0..5 {
        opt.step().unwrap();
    }
    let mut t: Vec<f64> = (0..30)
        .map(|_| {
            let s = Instant::now();
            opt.step().unwrap();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    println!("{name:<28} {numel} params: median {:.2} ms, min {:.2} ms", t[t.len() / 2], t[0]);
}

fn main() {
    let threads = rayon::current_num_threads();
    println!("ferrite-optim optimizer step, {threads} rayon threads");
    let ps = params(8, 512, 1024);
    let numel: usize = ps.iter().map(|p| p.numel()).sum();
    time("AdamW (lr 1e-3, wd 1e-2)", numel, &mut Adam::new(ps.clone(), AdamConfig::adamw(1e-3)).unwrap());
    time("SGD (momentum 0.9)", numel, &mut Sgd::new(ps, SgdConfig::new(1e-3).momentum(0.9)).unwrap());
}
