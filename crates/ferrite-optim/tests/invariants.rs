//! Invariants checked over random inputs (proptest), plus dtype/device coverage: low-precision
//! parameters and shape-only (`meta`) planning runs.

use ferrite_memory::allocator;
use ferrite_optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig, clip_grad_norm_, get_total_norm};
use ferrite_tensor::{DType, Device, Tensor};
use proptest::prelude::*;

fn with_grad(p: &[f32], g: &[f32]) -> Tensor {
    let t = Tensor::from_slice(p, &[p.len()], &Device::Cpu).unwrap().requires_grad_(true).unwrap();
    t.set_grad(Some(Tensor::from_slice(g, &[g.len()], &Device::Cpu).unwrap())).unwrap();
    t
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// After clipping, the total norm is at most max_norm (up to float rounding), and gradients
    /// already inside the ball are untouched.
    #[test]
    fn clipping_bounds_the_norm(g1 in prop::collection::vec(-100.0f32..100.0, 1..300), g2 in prop::collection::vec(-1.0f32..1.0, 1..50), max_norm in 0.01f64..50.0) {
        let a = with_grad(&vec![0.0; g1.len()], &g1);
        let b = with_grad(&vec![0.0; g2.len()], &g2);
        let ps = [a.clone(), b.clone()];
        let before = get_total_norm(&[a.grad().unwrap(), b.grad().unwrap()], 2.0).unwrap();
        let reported = clip_grad_norm_(&ps, max_norm).unwrap();
        prop_assert_eq!(reported, before);
        let after = get_total_norm(&[a.grad().unwrap(), b.grad().unwrap()], 2.0).unwrap();
        prop_assert!(after <= max_norm * (1.0 + 1e-5), "after {} > max {}", after, max_norm);
        if before + 1e-6 <= max_norm {
            prop_assert_eq!(a.grad().unwrap().to_vec::<f32>().unwrap(), g1);
        }
    }

    /// A zero gradient leaves SGD without weight decay where it was, and one Adam step moves
    /// every coordinate by at most lr (|m̂/(sqrt(v̂)+eps)| <= 1 on the first step).
    #[test]
    fn step_bounds(p in prop::collection::vec(-10.0f32..10.0, 1..100), g in prop::collection::vec(-10.0f32..10.0, 1..100), lr in 1e-4f64..0.5) {
        let n = p.len().min(g.len());
        let (p, g) = (&p[..n], &g[..n]);
        let t = with_grad(p, &vec![0.0; n]);
        let mut sgd = Sgd::new(vec![t.clone()], SgdConfig::new(lr).momentum(0.9)).unwrap();
        sgd.step().unwrap();
        prop_assert_eq!(t.to_vec::<f32>().unwrap(), p.to_vec());
        let t = with_grad(p, g);
        let mut adam = Adam::new(vec![t.clone()], AdamConfig::adam(lr)).unwrap();
        adam.step().unwrap();
        for (new, old) in t.to_vec::<f32>().unwrap().iter().zip(p) {
            prop_assert!(((new - old).abs() as f64) <= lr * (1.0 + 1e-5) + 1e-6);
        }
    }
}

#[test]
fn bf16_parameters_follow_pytorchs_rounding() {
    // SGD on bf16: each op's result is stored in bf16, as PyTorch's tensors would be.
    let v = [1.0f32, -2.5, 0.3];
    let g = [0.5f32, 0.25, -1.0];
    let to_bf = |x: &[f32]| x.iter().map(|v| half::bf16::from_f32(*v)).collect::<Vec<_>>();
    let p = Tensor::from_vec(to_bf(&v), &[3], &Device::Cpu).unwrap().requires_grad_(true).unwrap();
    p.set_grad(Some(Tensor::from_vec(to_bf(&g), &[3], &Device::Cpu).unwrap())).unwrap();
    let mut opt = Sgd::new(vec![p.clone()], SgdConfig::new(0.1)).unwrap();
    opt.step().unwrap();
    let got: Vec<f32> = p.to_vec::<half::bf16>().unwrap().iter().map(|x| x.to_f32()).collect();
    let want: Vec<f32> =
        v.iter().zip(&g).map(|(p, g)| half::bf16::from_f32(g.mul_add(-0.1f64 as f32, *p)).to_f32()).collect();
    assert_eq!(got, want);
}

#[test]
fn meta_device_accounts_optimizer_state_without_computing() {
    // A planning run on `meta`: Adam's state is allocated exactly as on a real device.
    let dev = Device::Meta;
    let alloc = allocator(&dev);
    let p = Tensor::zeros(&[1024, 1024], DType::F32, &dev).unwrap().requires_grad_(true).unwrap();
    p.set_grad(Some(Tensor::zeros(&[1024, 1024], DType::F32, &dev).unwrap())).unwrap();
    let mut opt = Adam::new(vec![p.clone()], AdamConfig::adamw(1e-3)).unwrap();
    let before = alloc.memory_allocated();
    opt.step().unwrap();
    assert_eq!(alloc.memory_allocated() - before, 2 * 4 * 1024 * 1024);
    assert_eq!(clip_grad_norm_(&[p], 1.0).unwrap(), 0.0);
}
