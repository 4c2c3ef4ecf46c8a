//! DataParallel over 2 simulated devices vs one device: step time and per-device peaks of an MLP
//! training step (SGD, mean cross-entropy), the figures of BENCHMARKS.md "DataParallel".
//!
//! `cargo bench -p ferrite-parallel --bench data_parallel` (a plain timing loop: each figure is the
//! median of 7 timed steps after 2 warm-up steps).

use std::time::Instant;

use ferrite_memory::{Device, select_devices};
use ferrite_nn::{Linear, Module, ReLU, Sequential};
use ferrite_optim::{Optimizer, Sgd, SgdConfig};
use ferrite_parallel::DataParallel;
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
}
