//! A `meta` run makes exactly the allocations of a real run: the peak allocated bytes of an MLP's
//! forward + backward on `meta` equal those on a real (sim) device. Its own test binary, so no
//! other test touches the process-wide meta allocator meanwhile.

use ferrite_memory::allocator;
use ferrite_tensor::functional::{CrossEntropyOptions, cross_entropy};
use ferrite_tensor::{DType, Device, Generator, Tensor};

fn mlp_step_peak(d: &Device) -> (u64, u64) {
    let a = allocator(d);
    let mut g = Generator::new(0);
    let w1 = Tensor::randn_with(&[100, 64], DType::F32, d, &mut g).unwrap().requires_grad_(true).unwrap();
    let b1 = Tensor::zeros(&[100], DType::F32, d).unwrap().requires_grad_(true).unwrap();
    let w2 = Tensor::randn_with(&[10, 100], DType::F32, d, &mut g).unwrap().requires_grad_(true).unwrap();
    let x = Tensor::randn_with(&[32, 64], DType::F32, d, &mut g).unwrap();
    let target = Tensor::from_vec((0..32).map(|i| i % 10).collect::<Vec<i64>>(), &[32], d).unwrap();
    let base = a.memory_allocated();
    a.reset_peak_memory_stats();
    let h = x.linear(&w1, Some(&b1)).unwrap().relu().unwrap();
    let logits = h.linear(&w2, None).unwrap();
    let loss = cross_entropy(&logits, &target, &CrossEntropyOptions::default()).unwrap();
    loss.backward().unwrap();
    let peak = a.max_memory_allocated() - base;
    drop((h, logits, loss));
    let after = a.memory_allocated() - base;
    (peak, after)
}

#[test]
fn meta_run_reports_the_same_peak_as_a_real_run() {
    let real = mlp_step_peak(&Device::parse("sim:1GiB:0").unwrap());
    let meta = mlp_step_peak(&Device::Meta);
    println!(
        "peak allocated during an MLP step: sim {} B, meta {} B (grads held after: {} / {} B)",
        real.0, meta.0, real.1, meta.1
    );
    assert!(real.0 > 0);
    assert_eq!(real, meta);
}
