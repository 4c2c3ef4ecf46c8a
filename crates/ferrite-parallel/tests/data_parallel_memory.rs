//! Balanced memory: with the loss computed on every replica and only scalars gathered, four
//! simulated A100s reach peaks within 10 % of each other in a training step (PyTorch gathers all
//! outputs on GPU 0, whose peak then grows with the batch).
//!
//! With a stateful optimizer (AdamW: two moments per parameter) the state lives beside the
//! parameters it updates: each parameter's owner replica. Owners spread by bytes keep the four
//! devices within 10 %; PyTorch's layout (device 0 owns everything) does not. A model whose
//! largest parameter outweighs a device's share needs its parameters split between owners
//! (`OwnerPolicy::Sharded`).

use ferrite_memory::{Device, select_devices};
use ferrite_nn::{Linear, Module, ReLU, Sequential};
use ferrite_optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use ferrite_parallel::{DataParallel, MemoryReport, OwnerPolicy};
use ferrite_tensor::functional::{CrossEntropyOptions, cross_entropy};
use ferrite_tensor::{DType, Generator, Tensor};

/// Linear layers of `widths[i] -> widths[i + 1]` with a ReLU between each two, drawn from `g`.
fn relu_mlp(widths: &[usize], g: &mut Generator) -> Sequential {
    let mut model = Sequential::new();
    for (i, w) in widths.windows(2).enumerate() {
        if i > 0 {
            model = model.append(ReLU::new());
        }
        model = model.append(Linear::new_with(w[0], w[1], true, &Device::Cpu, g).unwrap());
    }
    model
}

#[test]
fn four_simulated_devices_have_peaks_within_ten_percent() {
    let devices = select_devices(&Device::parse("sim:a100-40gb").unwrap(), Some("0,1,2,3")).unwrap();
    assert_eq!(devices.len(), 4);
    let mut g = Generator::new(0);
    let model = relu_mlp(&[256, 512, 512, 10], &mut g);
    let dp = DataParallel::new(model, &devices).unwrap();
    let mut opt = Sgd::new(dp.parameters(), SgdConfig::new(0.01)).unwrap();
    // 1022 samples: shards of 256, 256, 255, 255.
    let x = Tensor::randn_with(&[1022, 256], DType::F32, &Device::Cpu, &mut g).unwrap();
    let labels: Vec<i64> = (0..1022).map(|i| i % 10).collect();
    let y = Tensor::from_vec(labels, &[1022], &Device::Cpu).unwrap();
    let opts = CrossEntropyOptions::default();
    for step in 0..3 {
        dp.reset_peak_memory_stats();
        opt.zero_grad().unwrap();
        dp.forward_backward(&[&x, &y], |m, s| Ok(cross_entropy(&m.forward(&s.tensors[0])?, &s.tensors[1], &opts)?))
            .unwrap();
        dp.step(&mut opt).unwrap();
        let report = dp.memory_report();
        println!("step {step}\n{report}");
        assert_eq!(report.devices.len(), 4);
        assert!(report.devices.iter().all(|d| d.peak_allocated > 0));
        assert!(report.peak_imbalance() <= 0.10, "step {step}: peaks not within 10 %:\n{report}");
    }
    // Each device really holds its own replica: the report's devices are the four allocators.
    for (d, r) in dp.memory_report().devices.iter().zip(dp.replicas()) {
        assert_eq!(r.parameters()[0].device(), &d.device);
        assert!(d.allocated >= r.parameter_bytes() as u64);
    }
}

/// Three AdamW steps of a 512-512-512-512-512-10 MLP over four devices of `profile` with the
/// owners chosen by `policy`; the report of each step (peaks reset before it).
fn adamw_steps(profile: &str, policy: OwnerPolicy) -> (Vec<MemoryReport>, Vec<usize>) {
    let devices = select_devices(&Device::parse(profile).unwrap(), Some("0,1,2,3")).unwrap();
    let mut g = Generator::new(1);
    let model = relu_mlp(&[512, 512, 512, 512, 512, 10], &mut g);
    let dp = DataParallel::with_owners(model, &devices, policy).unwrap();
    let mut opt = Adam::new(dp.parameters(), AdamConfig::adamw(1e-3).weight_decay(0.01)).unwrap();
    let x = Tensor::randn_with(&[510, 512], DType::F32, &Device::Cpu, &mut g).unwrap();
    let y = Tensor::from_vec((0..510).map(|i| i % 10).collect::<Vec<i64>>(), &[510], &Device::Cpu).unwrap();
    let opts = CrossEntropyOptions::default();
    let mut reports = Vec::new();
    for _ in 0..3 {
        dp.reset_peak_memory_stats();
        opt.zero_grad().unwrap();
        dp.forward_backward(&[&x, &y], |m, s| Ok(cross_entropy(&m.forward(&s.tensors[0])?, &s.tensors[1], &opts)?))
            .unwrap();
        dp.step(&mut opt).unwrap();
        reports.push(dp.memory_report());
    }
    (reports, dp.owned_bytes())
}

#[test]
fn adamw_over_four_devices_keeps_peaks_within_ten_percent_with_spread_owners() {
    let (reports, owned) = adamw_steps("sim:a100-80gb", OwnerPolicy::Balanced);
    println!("owned bytes per device: {owned:?}");
    let (max, min) = (owned.iter().max().copied().unwrap_or(0), owned.iter().min().copied().unwrap_or(0));
    assert!(min > 0 && (max - min) * 10 <= max, "owned bytes not balanced: {owned:?}");
    for (step, report) in reports.iter().enumerate() {
        println!("balanced owners, step {step}\n{report}");
        assert!(report.peak_imbalance() <= 0.10, "step {step}: peaks not within 10 %:\n{report}");
    }
    // PyTorch's layout: device 0 holds all of AdamW's state (twice the parameters) and every
    // reduced gradient, so the spread is large — the comparison above can fail.
    let (reports, owned) = adamw_steps("sim:h100-80gb", OwnerPolicy::Primary);
    assert_eq!(owned[1..], [0, 0, 0]);
    let last = reports.last().unwrap();
    println!("primary owns everything\n{last}");
    assert!(last.peak_imbalance() > 0.25, "expected a large spread with device 0 owning everything:\n{last}");
    assert!(last.devices[0].peak_allocated > last.devices[1].peak_allocated);
}

/// Three AdamW steps of a 256-1024-1024-10 MLP (the 1024x1024 weight is 80 % of the parameters)
/// over four devices of `profile`; the last step's report.
fn dominant_parameter_steps(profile: &str, policy: OwnerPolicy) -> MemoryReport {
    let devices = select_devices(&Device::parse(profile).unwrap(), Some("0,1,2,3")).unwrap();
    let mut g = Generator::new(2);
    let model = relu_mlp(&[256, 1024, 1024, 10], &mut g);
    let dp = DataParallel::with_owners(model, &devices, policy).unwrap();
    let mut opt = Adam::new(dp.parameters(), AdamConfig::adamw(1e-3).weight_decay(0.01)).unwrap();
    let x = Tensor::randn_with(&[128, 256], DType::F32, &Device::Cpu, &mut g).unwrap();
    let y = Tensor::from_vec((0..128).map(|i| i % 10).collect::<Vec<i64>>(), &[128], &Device::Cpu).unwrap();
    let opts = CrossEntropyOptions::default();
    for _ in 0..3 {
        dp.reset_peak_memory_stats();
        opt.zero_grad().unwrap();
        dp.forward_backward(&[&x, &y], |m, s| Ok(cross_entropy(&m.forward(&s.tensors[0])?, &s.tensors[1], &opts)?))
            .unwrap();
        dp.step(&mut opt).unwrap();
    }
    dp.memory_report()
}

#[test]
fn a_dominant_parameter_needs_sharded_owners_to_stay_within_ten_percent() {
    let sharded = dominant_parameter_steps("sim:rtx3090-24gb", OwnerPolicy::Sharded);
    println!("sharded\n{sharded}");
    assert!(sharded.peak_imbalance() <= 0.10, "sharded owners: peaks not within 10 %:\n{sharded}");
    // Whole parameters: the device owning the 1024x1024 weight holds 8 MiB of AdamW state.
    let whole = dominant_parameter_steps("sim:rtx4090-24gb", OwnerPolicy::Balanced);
    println!("whole parameters\n{whole}");
    assert!(whole.peak_imbalance() > 0.25, "{whole}");
}
