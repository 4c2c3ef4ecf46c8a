//! The optimizer's helpers on DataParallel's parameter list, whose tensors live on their owners'
//! devices (several devices in one list): gradient clipping, an LR schedule and the GradScaler
//! behave as on one device, and an inf gradient on a non-primary owner skips the step — with
//! whole parameters as owners and with parameters split into pieces (`OwnerPolicy::Sharded`).

use ferrite_memory::{Device, select_devices};
use ferrite_nn::Module;
use ferrite_optim::{Adam, AdamConfig, GradScaler, GradScalerConfig, LrScheduler, Optimizer, StepLr, clip_grad_norm_};
use ferrite_parallel::{DataParallel, OwnerPolicy};
use ferrite_tensor::functional::mse_loss;
use ferrite_tensor::{DType, Generator, Tensor};
use ferrite_test_support::models::mlp;

fn batches() -> Vec<(Tensor, Tensor)> {
    let mut g = Generator::new(42);
    [8, 8, 8, 5, 8, 7]
        .into_iter()
        .map(|n| {
            let x = Tensor::randn_with(&[n, 6], DType::F32, &Device::Cpu, &mut g).unwrap();
            let y = Tensor::randn_with(&[n, 3], DType::F32, &Device::Cpu, &mut g).unwrap();
            (x, y)
        })
        .collect()
}

fn values(params: &[Tensor]) -> Vec<Vec<f32>> {
    params.iter().map(|p| p.to_vec::<f32>().unwrap()).collect()
}

/// Parameters equal within f32 reduction tolerance (the replicas sum their gradients in another
/// order).
fn assert_close(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    ferrite_test_support::assert_all_close(what, a, b, 2e-5, 2e-5);
}

fn adamw(params: Vec<Tensor>) -> Adam {
    Adam::new(params, AdamConfig::adamw(0.02).weight_decay(0.01)).unwrap()
}

#[test]
fn clipping_a_schedule_and_the_grad_scaler_work_on_the_owners_devices() {
    helpers_match_one_device("sim:14GiB", OwnerPolicy::Balanced);
}

#[test]
fn clipping_a_schedule_and_the_grad_scaler_work_on_sharded_pieces() {
    helpers_match_one_device("sim:15GiB", OwnerPolicy::Sharded);
}

fn helpers_match_one_device(profile: &str, policy: OwnerPolicy) {
    let single_dev = Device::parse(&format!("{profile}:7")).unwrap();
    let mut single = mlp(3);
    single.to_device(&single_dev).unwrap();
    let mut single_opt = adamw(single.parameters());
    let mut single_sched = StepLr::new(&mut single_opt, 2, 0.5).unwrap();
    let mut single_scaler = GradScaler::new(GradScalerConfig::default()).unwrap();

    let devices = select_devices(&Device::parse(profile).unwrap(), Some("0,1,2")).unwrap();
    let dp = DataParallel::with_owners(mlp(3), &devices, policy).unwrap();
    let mut owner_devices: Vec<Device> = dp.parameters().iter().map(|p| p.device().clone()).collect();
    owner_devices.dedup();
    assert!(owner_devices.len() >= 2, "the optimizer's parameters span several devices: {owner_devices:?}");
    let mut dp_opt = adamw(dp.parameters());
    let mut dp_sched = StepLr::new(&mut dp_opt, 2, 0.5).unwrap();
    let mut dp_scaler = GradScaler::new(GradScalerConfig::default()).unwrap();

    for (step, (x, y)) in batches().iter().enumerate() {
        single_opt.zero_grad().unwrap();
        let loss =
            mse_loss(&single.forward(&x.to_device(&single_dev).unwrap()).unwrap(), &y.to_device(&single_dev).unwrap())
                .unwrap();
        single_scaler.scale(&loss).unwrap().backward().unwrap();
        single_scaler.unscale_(&mut single_opt).unwrap();
        let single_norm = clip_grad_norm_(&single.parameters(), 0.5).unwrap();
        assert!(single_scaler.step(&mut single_opt).unwrap());
        single_scaler.update().unwrap();
        single_sched.step(&mut single_opt).unwrap();

        dp_opt.zero_grad().unwrap();
        // The scale is created by the first `scale` call; each replica scales its own loss.
        dp_scaler.scale(&Tensor::ones(&[1], DType::F32, &Device::Cpu).unwrap()).unwrap();
        let scale = dp_scaler.get_scale();
        dp.forward_backward(
            &[x, y],
            |m, s| Ok(mse_loss(&m.forward(&s.tensors[0])?, &s.tensors[1])?.mul_scalar(scale)?),
        )
        .unwrap();
        dp_scaler.unscale_(&mut dp_opt).unwrap();
        let dp_norm = clip_grad_norm_(&dp.parameters(), 0.5).unwrap();
        assert!(
            (dp_norm - single_norm).abs() <= 1e-5 * single_norm.max(1.0),
            "step {step}: norm {dp_norm} vs {single_norm}"
        );
        assert!(dp_scaler.step(&mut dp_opt).unwrap());
        // The scaler stepped the optimizer itself: bring the other replicas up to date.
        dp.sync_from_owners().unwrap();
        dp_scaler.update().unwrap();
        dp_sched.step(&mut dp_opt).unwrap();

        assert_eq!(dp_opt.lr(0).unwrap(), single_opt.lr(0).unwrap(), "step {step}: learning rate");
        assert_close(&values(&dp.module().parameters()), &values(&single.parameters()), &format!("step {step}"));
        for r in &dp.replicas()[1..] {
            assert_close(&values(&r.parameters()), &values(&single.parameters()), &format!("replica, step {step}"));
        }
    }

    // An inf gradient on a parameter owned by a device other than the primary skips the step
    // and backs the scale off.
    let before = values(&dp.module().parameters());
    let scale = dp_scaler.get_scale();
    let (x, y) = &batches()[0];
    dp_opt.zero_grad().unwrap();
    dp.forward_backward(&[x, y], |m, s| Ok(mse_loss(&m.forward(&s.tensors[0])?, &s.tensors[1])?.mul_scalar(scale)?))
        .unwrap();
    let params = dp.parameters();
    let (j, p) = params.iter().enumerate().find(|(_, p)| p.device() != &devices[0]).unwrap();
    assert_ne!(dp.owners()[j], 0);
    p.grad().unwrap().fill_(f64::INFINITY).unwrap();
    assert!(!dp_scaler.step(&mut dp_opt).unwrap(), "an inf gradient on {} must skip the step", p.device());
    dp.sync_from_owners().unwrap();
    dp_scaler.update().unwrap();
    assert_eq!(dp_scaler.get_scale(), scale * 0.5);
    assert_close(&values(&dp.module().parameters()), &before, "skipped step");
}
