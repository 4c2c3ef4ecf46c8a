//! Checkpoint and resume: optimizer + schedule + GradScaler state restored into fresh objects
//! continue bit-identically; bad states are refused without touching the optimizer; optimizer
//! memory is what the allocator sees.

use ferrite_memory::allocator;
use ferrite_optim::{
    Adam, AdamConfig, GradScaler, GradScalerConfig, LrScheduler, Optimizer, OptimizerState, ParamGroup, Sgd, SgdConfig,
    StateValue, clip_grad_norm_, warmup_cosine,
};
use ferrite_tensor::functional::{CrossEntropyOptions, cross_entropy};
use ferrite_tensor::{DType, Device, Generator, Tensor};
use ferrite_test_support::params::bits_of as bits;

fn init_params(seed: u64) -> Vec<Tensor> {
    let mut g = Generator::new(seed);
    let mut mk = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| (g.normal_f64() * 0.3) as f32).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap().requires_grad_(true).unwrap()
    };
    vec![mk(&[16, 8]), mk(&[16]), mk(&[3, 16]), mk(&[3])]
}

fn batch(step: usize) -> (Tensor, Tensor) {
    let mut g = Generator::new(1000 + step as u64);
    let x: Vec<f32> = (0..6 * 8).map(|_| g.normal_f64() as f32).collect();
    let y: Vec<i64> = (0..6).map(|_| g.below(3) as i64).collect();
    (Tensor::from_vec(x, &[6, 8], &Device::Cpu).unwrap(), Tensor::from_vec(y, &[6], &Device::Cpu).unwrap())
}

fn loss(p: &[Tensor], step: usize) -> Tensor {
    let (x, y) = batch(step);
    let h = x.linear(&p[0], Some(&p[1])).unwrap().tanh().unwrap();
    cross_entropy(&h.linear(&p[2], Some(&p[3])).unwrap(), &y, &CrossEntropyOptions::default()).unwrap()
}

struct Run {
    params: Vec<Tensor>,
    opt: Box<dyn Optimizer>,
    sched: Box<dyn LrScheduler>,
    scaler: GradScaler,
}

fn new_run(params: Vec<Tensor>, adam: bool) -> Run {
    let mut opt: Box<dyn Optimizer> = if adam {
        // Two groups: no weight decay on biases, as recipes do.
        Box::new(
            Adam::with_groups(vec![
                ParamGroup::new(vec![params[0].clone(), params[2].clone()], AdamConfig::adamw(0.05)),
                ParamGroup::new(vec![params[1].clone(), params[3].clone()], AdamConfig::adamw(0.05).weight_decay(0.0)),
            ])
            .unwrap(),
        )
    } else {
        Box::new(Sgd::new(params.clone(), SgdConfig::new(0.1).momentum(0.9).nesterov(true).weight_decay(1e-3)).unwrap())
    };
    let sched: Box<dyn LrScheduler> = Box::new(warmup_cosine(opt.as_mut(), 2, 8, 0.2, 0.001).unwrap());
    let scaler =
        GradScaler::new(GradScalerConfig { init_scale: 256.0, growth_interval: 2, ..Default::default() }).unwrap();
    Run { params, opt, sched, scaler }
}

fn train(r: &mut Run, steps: std::ops::Range<usize>) {
    for s in steps {
        r.scaler.scale(&loss(&r.params, s)).unwrap().backward().unwrap();
        r.scaler.unscale_(r.opt.as_mut()).unwrap();
        clip_grad_norm_(&r.opt.params(), 0.5).unwrap();
        r.scaler.step(r.opt.as_mut()).unwrap();
        r.scaler.update().unwrap();
        r.opt.zero_grad().unwrap();
        r.sched.step(r.opt.as_mut()).unwrap();
    }
}

#[test]
fn resume_is_bit_identical() {
    for adam in [true, false] {
        let mut a = new_run(init_params(3), adam);
        train(&mut a, 0..3);
        // The checkpoint: what ferrite-io would write.
        let saved_params: Vec<Tensor> = a.params.iter().map(|p| p.detach().deep_clone().unwrap()).collect();
        let saved_opt = a.opt.state_dict().unwrap().deep_clone().unwrap();
        let saved_sched = a.sched.state_dict();
        let saved_scaler = a.scaler.state_dict();
        train(&mut a, 3..7);

        let params: Vec<Tensor> =
            saved_params.iter().map(|p| p.deep_clone().unwrap().requires_grad_(true).unwrap()).collect();
        let mut b = new_run(params, adam);
        b.opt.load_state_dict(&saved_opt).unwrap();
        b.sched.load_state_dict(&saved_sched).unwrap();
        b.scaler.load_state_dict(saved_scaler.as_ref()).unwrap();
        train(&mut b, 3..7);

        assert_eq!(bits(&a.params), bits(&b.params), "adam={adam}: resumed parameters differ");
        assert_eq!(a.opt.lrs(), b.opt.lrs());
        assert_eq!(a.scaler.get_scale(), b.scaler.get_scale());
        let (sa, sb) = (a.opt.state_dict().unwrap(), b.opt.state_dict().unwrap());
        for ((ia, ea), (ib, eb)) in sa.state.iter().zip(&sb.state) {
            assert_eq!(ia, ib);
            for ((ka, va), (kb, vb)) in ea.iter().zip(eb) {
                assert_eq!(ka, kb);
                match (va, vb) {
                    (StateValue::Tensor(x), StateValue::Tensor(y)) => {
                        assert_eq!(bits(std::slice::from_ref(x)), bits(std::slice::from_ref(y)), "{ka}")
                    }
                    _ => panic!("unexpected state value for {ka}"),
                }
            }
        }
    }
}

#[test]
fn state_dict_has_pytorchs_structure() {
    let p = init_params(1);
    let mut opt = Adam::new(p.clone(), AdamConfig::adam(1e-3)).unwrap();
    loss(&p, 0).backward().unwrap();
    opt.step().unwrap();
    let sd = opt.state_dict().unwrap();
    assert_eq!(sd.param_groups.len(), 1);
    let g = &sd.param_groups[0];
    assert_eq!(g.params, vec![0, 1, 2, 3]);
    let keys: Vec<&str> = g.hyper.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "lr",
            "betas",
            "eps",
            "weight_decay",
            "amsgrad",
            "maximize",
            "foreach",
            "capturable",
            "differentiable",
            "fused",
            "decoupled_weight_decay"
        ]
    );
    for (i, (idx, entries)) in sd.state.iter().enumerate() {
        assert_eq!(*idx, i);
        let k: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(k, ["step", "exp_avg", "exp_avg_sq"]);
        let StateValue::Tensor(step) = &entries[0].1 else { panic!("step is a tensor like PyTorch's") };
        assert_eq!((step.dtype(), step.shape().len(), step.item().unwrap()), (DType::F32, 0, 1.0));
    }
}

#[test]
fn bad_states_are_refused_and_leave_the_optimizer_untouched() {
    let p = init_params(2);
    let mut opt = Sgd::new(p.clone(), SgdConfig::new(0.1).momentum(0.9)).unwrap();
    loss(&p, 0).backward().unwrap();
    opt.step().unwrap();
    let good = opt.state_dict().unwrap().deep_clone().unwrap();

    let mut fewer = good.clone();
    fewer.param_groups[0].params.pop();
    assert!(opt.load_state_dict(&fewer).unwrap_err().to_string().contains("doesn't match the size"));

    let mut two = good.clone();
    two.param_groups.push(two.param_groups[0].clone());
    assert!(opt.load_state_dict(&two).unwrap_err().to_string().contains("different number of parameter groups"));

    let mut bad_shape = good.clone();
    bad_shape.state[3].1[0].1 = StateValue::Tensor(Tensor::zeros(&[7], DType::F32, &Device::Cpu).unwrap());
    let before = opt.state_dict().unwrap().deep_clone().unwrap();
    let e = opt.load_state_dict(&bad_shape).unwrap_err().to_string();
    assert!(e.contains("shape [7]") && e.contains("parameter 3"), "{e}");
    assert_state_eq(&before, &opt.state_dict().unwrap());

    let mut bad_lr = good.clone();
    bad_lr.param_groups[0].hyper[0].1 = ferrite_optim::HyperValue::Float(-1.0);
    assert!(opt.load_state_dict(&bad_lr).unwrap_err().to_string().contains("Invalid learning rate"));
    opt.load_state_dict(&good).unwrap();
}

fn assert_state_eq(a: &OptimizerState, b: &OptimizerState) {
    assert_eq!(a.param_groups, b.param_groups);
    assert_eq!(a.state.len(), b.state.len());
    for ((ia, ea), (ib, eb)) in a.state.iter().zip(&b.state) {
        assert_eq!(ia, ib);
        for ((_, va), (_, vb)) in ea.iter().zip(eb) {
            if let (StateValue::Tensor(x), StateValue::Tensor(y)) = (va, vb) {
                assert_eq!(bits(std::slice::from_ref(x)), bits(std::slice::from_ref(y)));
            }
        }
    }
}

#[test]
fn named_parameters_are_recorded_and_checked() {
    let p = init_params(4);
    let names = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"];
    let named: Vec<(String, Tensor)> = names.iter().map(|s| s.to_string()).zip(p.iter().cloned()).collect();
    let opt = Sgd::named(named.clone(), SgdConfig::new(0.1)).unwrap();
    let sd = opt.state_dict().unwrap();
    assert_eq!(sd.param_groups[0].param_names.as_deref(), Some(&names.map(String::from)[..]));
    let mut renamed = named.clone();
    renamed[2].0 = "head.weight".into();
    let mut other = Sgd::named(renamed, SgdConfig::new(0.1)).unwrap();
    let e = other.load_state_dict(&sd).unwrap_err().to_string();
    assert!(e.contains("fc2.weight") && e.contains("head.weight"), "{e}");
}

#[test]
fn construction_errors() {
    let p = init_params(5);
    assert!(Sgd::new(vec![], SgdConfig::new(0.1)).unwrap_err().to_string().contains("empty parameter list"));
    assert!(
        Sgd::new(vec![p[0].clone(), p[0].clone()], SgdConfig::new(0.1))
            .unwrap_err()
            .to_string()
            .contains("more than once")
    );
    assert!(
        Sgd::with_groups(vec![
            ParamGroup::new(vec![p[0].clone()], SgdConfig::new(0.1)),
            ParamGroup::new(vec![p[1].clone(), p[0].clone()], SgdConfig::new(0.1))
        ])
        .is_err()
    );
    let non_leaf = p[0].mul_scalar(2.0).unwrap();
    assert!(Sgd::new(vec![non_leaf], SgdConfig::new(0.1)).unwrap_err().to_string().contains("non-leaf"));
    assert_eq!(
        Sgd::new(p.clone(), SgdConfig::new(-1.0)).unwrap_err().to_string(),
        "Invalid learning rate: -1 (expected a number >= 0)"
    );
    assert!(
        Sgd::new(p.clone(), SgdConfig::new(0.1).nesterov(true))
            .unwrap_err()
            .to_string()
            .contains("Nesterov momentum requires a momentum and zero dampening")
    );
    assert!(
        Adam::new(p.clone(), AdamConfig::adam(0.1).betas(1.0, 0.9))
            .unwrap_err()
            .to_string()
            .contains("beta parameter at index 0")
    );
    assert!(Adam::new(p.clone(), AdamConfig::adam(0.1).eps(-1.0)).unwrap_err().to_string().contains("epsilon"));
}

#[test]
fn optimizer_memory_is_on_the_allocator() {
    let dev = Device::parse("sim:1GiB:43").unwrap();
    let alloc = allocator(&dev);
    let w = Tensor::zeros(&[256, 1024], DType::F32, &dev).unwrap().requires_grad_(true).unwrap();
    let bytes = (256 * 1024 * 4) as u64;
    let mut opt = Adam::new(vec![w.clone()], AdamConfig::adamw(1e-3)).unwrap();
    let base = alloc.memory_allocated();
    w.sum().unwrap().backward().unwrap();
    let with_grad = alloc.memory_allocated();
    assert_eq!(with_grad - base, bytes, "one gradient");
    opt.step().unwrap();
    let with_state = alloc.memory_allocated();
    assert_eq!(with_state - with_grad, 2 * bytes, "Adam keeps exp_avg and exp_avg_sq");
    opt.zero_grad().unwrap();
    assert_eq!(with_state - alloc.memory_allocated(), bytes, "zero_grad (set to none) frees the gradient");
    // zero_grad_with(false) keeps the memory and zeroes it.
    w.sum().unwrap().backward().unwrap();
    opt.zero_grad_with(false).unwrap();
    assert_eq!(alloc.memory_allocated(), with_state);
    assert!(w.grad().unwrap().to_vec::<f32>().unwrap().iter().all(|v| *v == 0.0));
    println!("param {bytes} B: +grad {bytes} B, +Adam state {} B, zero_grad frees {bytes} B", 2 * bytes);
}
