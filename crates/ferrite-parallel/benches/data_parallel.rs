//! DataParallel over 2 simulated devices vs one device: step time and per-device peaks of an MLP
//! training step (SGD, mean cross-entropy), then AdamW over 1, 2 and 4 devices with the three
//! owner policies (PyTorch's layout: device 0 owns everything; whole parameters balanced by
//! bytes; parameters sharded), the figures of BENCHMARKS.md "DataParallel".
//!
//! `cargo bench -p ferrite-parallel --bench data_parallel` (a plain timing loop: each figure is the
//! median of 7 timed steps after 2 warm-up steps).

use std::time::Instant;

use ferrite_memory::{Device, select_devices};
use ferrite_nn::{Linear, Module, ReLU, Sequential};
use ferrite_optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use ferrite_parallel::{DataParallel, OwnerPolicy};
use ferrite_tensor::functional::{CrossEntropyOptions, cross_entropy};
use ferrite_tensor::{DType, Generator, Tensor};

fn model() -> Sequential {
    let mut g = Generator::new(0);
    Sequential::new()
        .append(Linear::new_with(512, 1024, true, &Device::Cpu, &mut g).expect("linear"))
        .append(ReLU::new())
        .append(Linear::new_with(1024, 1024, true, &Device::Cpu, &mut g).expect("linear"))
        .append(ReLU::new())
        .append(Linear::new_with(1024, 10, true, &Device::Cpu, &mut g).expect("linear"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Nine steps (2 warm-up, 7 timed) of `dp` with `opt`: the median step time.
fn time_steps(dp: &DataParallel<Sequential>, opt: &mut dyn Optimizer, x: &Tensor, y: &Tensor) -> (f64, usize) {
    let opts = CrossEntropyOptions::default();
    let mut times = Vec::new();
    for i in 0..9 {
        dp.reset_peak_memory_stats();
        let t = Instant::now();
        opt.zero_grad().expect("zero_grad");
        dp.forward_backward(&[x, y], |m, s| Ok(cross_entropy(&m.forward(&s.tensors[0])?, &s.tensors[1], &opts)?))
            .expect("step");
        dp.step(opt).expect("optimizer step");
        if i >= 2 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    let n = times.len();
    (median(times), n)
}

fn adamw_rows(x: &Tensor, y: &Tensor) {
    let batch = x.shape()[0];
    println!("\n---- AdamW (lr 1e-3, weight decay 0.01), same model and batch ----");
    for (n, policy) in [
        (1usize, OwnerPolicy::Balanced),
        (2, OwnerPolicy::Primary),
        (2, OwnerPolicy::Balanced),
        (2, OwnerPolicy::Sharded),
        (4, OwnerPolicy::Primary),
        (4, OwnerPolicy::Balanced),
        (4, OwnerPolicy::Sharded),
    ] {
        let list: Vec<String> = (0..n).map(|i| i.to_string()).collect();
        // The previous row's model is dropped and every step resets the peaks, so rows can share
        // the devices.
        let devices =
            select_devices(&Device::parse("sim:a100-40gb").expect("device"), Some(&list.join(","))).expect("devices");
        let dp = DataParallel::with_owners(model(), &devices, policy).expect("replicate");
        let mut opt = Adam::new(dp.parameters(), AdamConfig::adamw(1e-3).weight_decay(0.01)).expect("adamw");
        let (step, timed) = time_steps(&dp, &mut opt, x, y);
        let report = dp.memory_report();
        let peaks: Vec<String> = report.devices.iter().map(|d| ferrite_memory::format_size(d.peak_allocated)).collect();
        println!(
            "{n} device(s), owners {policy:?}: step {:.1} ms (median of {timed}), {:.0} samples/s; peak allocated {} (spread {:.1} %)",
            1e3 * step,
            batch as f64 / step,
            peaks.join(" / "),
            100.0 * report.peak_imbalance()
        );
    }
}

fn main() {
    let batch = 1024;
    let mut g = Generator::new(1);
    let x = Tensor::randn_with(&[batch, 512], DType::F32, &Device::Cpu, &mut g).expect("x");
    let y = Tensor::from_vec((0..batch as i64).map(|i| i % 10).collect::<Vec<_>>(), &[batch], &Device::Cpu).expect("y");
    let opts = CrossEntropyOptions::default();
    println!("MLP 512-1024-1024-10, batch {batch}, SGD; threads per replica: ferrite's default");
    for n in [1usize, 2] {
        let list: Vec<String> = (0..n).map(|i| i.to_string()).collect();
        let devices =
            select_devices(&Device::parse("sim:a100-40gb").expect("device"), Some(&list.join(","))).expect("devices");
        let dp = DataParallel::new(model(), &devices).expect("replicate");
        let mut opt = Sgd::new(dp.parameters(), SgdConfig::new(0.01)).expect("sgd");
        let mut times = Vec::new();
        for i in 0..9 {
            dp.reset_peak_memory_stats();
            let t = Instant::now();
            opt.zero_grad().expect("zero_grad");
            dp.forward_backward(&[&x, &y], |m, s| Ok(cross_entropy(&m.forward(&s.tensors[0])?, &s.tensors[1], &opts)?))
                .expect("step");
            dp.step(&mut opt).expect("optimizer step");
            if i >= 2 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        let report = dp.memory_report();
        println!(
            "\n{n} device(s): step {:.1} ms (median of {}), {:.0} samples/s",
            1e3 * median(times.clone()),
            times.len(),
            batch as f64 / median(times)
        );
        println!("{report}");
    }
    adamw_rows(&x, &y);
}
