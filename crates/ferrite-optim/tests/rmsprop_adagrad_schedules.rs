//! RMSprop, Adagrad, OneCycleLR, CosineAnnealingWarmRestarts and ReduceLROnPlateau beyond the
//! PyTorch trajectories (`schedules_parity.rs`): state in PyTorch's layout, resuming from saved
//! states bit-identically, memory on the allocator, meta runs, and typed errors for bad settings
//! (including a OneCycleLR stepped past its end, which must leave everything unchanged).

use ferrite_memory::allocator;
use ferrite_optim::{
    Adagrad, AdagradConfig, Adam, AdamConfig, CosineAnnealingWarmRestarts, HyperValue, LrScheduler, OneCycleConfig,
    OneCycleLr, OptimError, Optimizer, PlateauConfig, PlateauMode, ReduceLrOnPlateau, Rmsprop, RmspropConfig,
    SchedulerState, Sgd, SgdConfig, StateValue, ThresholdMode,
};
use ferrite_tensor::{DType, Device, Generator, Tensor};
use ferrite_test_support::params::bits_of as bits;

fn params(seed: u64, device: &Device) -> Vec<Tensor> {
    let mut g = Generator::new(seed);
    [&[6usize, 5][..], &[5], &[3, 6]]
        .iter()
        .map(|s| Tensor::randn_with(s, DType::F32, device, &mut g).unwrap().requires_grad_(true).unwrap())
        .collect()
}

/// A fixed, step-dependent loss (so every step sees other gradients).
fn loss(p: &[Tensor], step: usize) -> Tensor {
    let mut g = Generator::new(100 + step as u64);
    let x = Tensor::randn_with(&[4, 5], DType::F32, p[0].device(), &mut g).unwrap();
    let h = x.matmul(&p[0].t().unwrap()).unwrap().tanh().unwrap();
    let y = h.sum_dims(&[1], false).unwrap().add(&p[1].sum().unwrap()).unwrap();
    y.square().unwrap().sum().unwrap().add(&p[2].abs().unwrap().sum().unwrap()).unwrap()
}

/// The optimizer / schedule pairs under test.
#[derive(Clone, Copy, Debug)]
enum Kind {
    RmspropOneCycle,
    AdagradWarmRestarts,
    AdamPlateau,
}

enum Sched {
    Plain(Box<dyn LrScheduler>),
    Plateau(ReduceLrOnPlateau),
}

struct Run {
    p: Vec<Tensor>,
    opt: Box<dyn Optimizer>,
    sched: Sched,
}

fn new_run(kind: Kind, p: Vec<Tensor>) -> Run {
    let (opt, sched): (Box<dyn Optimizer>, Sched) = match kind {
        Kind::RmspropOneCycle => {
            let mut o = Box::new(
                Rmsprop::new(p.clone(), RmspropConfig::new(0.01).momentum(0.3).centered(true).weight_decay(0.01))
                    .unwrap(),
            );
            let s = OneCycleLr::new(o.as_mut(), OneCycleConfig::new(0.05, 12).three_phase(true)).unwrap();
            (o as Box<dyn Optimizer>, Sched::Plain(Box::new(s)))
        }
        Kind::AdagradWarmRestarts => {
            let mut o = Box::new(Adagrad::new(p.clone(), AdagradConfig::new(0.1).lr_decay(0.01)).unwrap());
            let s = CosineAnnealingWarmRestarts::new(o.as_mut(), 2, 2, 0.001).unwrap();
            (o as Box<dyn Optimizer>, Sched::Plain(Box::new(s)))
        }
        Kind::AdamPlateau => {
            let mut o = Box::new(Adam::new(p.clone(), AdamConfig::adam(0.05)).unwrap());
            let cfg = PlateauConfig::default().factor(0.5).patience(0).cooldown(1).min_lr(0.001);
            let s = ReduceLrOnPlateau::new(o.as_mut(), cfg).unwrap();
            (o as Box<dyn Optimizer>, Sched::Plateau(s))
        }
    };
    Run { p, opt, sched }
}

fn train(r: &mut Run, steps: std::ops::Range<usize>) {
    for s in steps {
        let l = loss(&r.p, s);
        let value = l.item().unwrap();
        l.backward().unwrap();
        r.opt.step().unwrap();
        r.opt.zero_grad().unwrap();
        match &mut r.sched {
            Sched::Plain(s) => s.step(r.opt.as_mut()).unwrap(),
            // A metric that plateaus now and then, so the plateau logic acts.
            Sched::Plateau(p) => p.step(r.opt.as_mut(), (value * 1e3).round() / 1e3 + (s % 3) as f64).unwrap(),
        }
    }
}

fn sched_state(s: &Sched) -> SchedulerState {
    match s {
        Sched::Plain(s) => s.state_dict(),
        Sched::Plateau(p) => p.state_dict(),
    }
}

fn load_sched(s: &mut Sched, st: &SchedulerState) {
    match s {
        Sched::Plain(s) => s.load_state_dict(st).unwrap(),
        Sched::Plateau(p) => p.load_state_dict(st).unwrap(),
    }
}

#[test]
fn resume_from_saved_states_is_bit_identical() {
    ferrite_test_support::for_each_device(|dev| {
        for kind in [Kind::RmspropOneCycle, Kind::AdagradWarmRestarts, Kind::AdamPlateau] {
            let mut a = new_run(kind, params(7, dev));
            train(&mut a, 0..5);
            let saved_p: Vec<Tensor> = a.p.iter().map(|p| p.detach().deep_clone().unwrap()).collect();
            let saved_opt = a.opt.state_dict().unwrap().deep_clone().unwrap();
            let saved_sched = sched_state(&a.sched);
            train(&mut a, 5..11);

            let p: Vec<Tensor> =
                saved_p.iter().map(|t| t.deep_clone().unwrap().requires_grad_(true).unwrap()).collect();
            let mut b = new_run(kind, p);
            b.opt.load_state_dict(&saved_opt).unwrap();
            load_sched(&mut b.sched, &saved_sched);
            train(&mut b, 5..11);
            assert_eq!(bits(&a.p), bits(&b.p), "{dev} {kind:?}: resumed parameters differ");
            assert_eq!(a.opt.lrs(), b.opt.lrs(), "{dev} {kind:?}");
            assert_eq!(a.opt.momentum(0).unwrap(), b.opt.momentum(0).unwrap(), "{dev} {kind:?}");
            assert_eq!(sched_state(&a.sched), sched_state(&b.sched), "{dev} {kind:?}");
            println!("{dev} {kind:?}: resumed after 5 steps, 6 more steps bit-identical");
        }
    });
}

#[test]
fn state_dicts_have_pytorchs_keys() {
    let p = params(1, &Device::Cpu);
    let mut rms = Rmsprop::new(p.clone(), RmspropConfig::new(0.01).momentum(0.5).centered(true)).unwrap();
    loss(&p, 0).backward().unwrap();
    rms.step().unwrap();
    let sd = rms.state_dict().unwrap();
    let hyper: Vec<&str> = sd.param_groups[0].hyper.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        hyper,
        [
            "lr",
            "momentum",
            "alpha",
            "eps",
            "centered",
            "weight_decay",
            "capturable",
            "foreach",
            "maximize",
            "differentiable"
        ]
    );
    for (_, entries) in &sd.state {
        let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["step", "square_avg", "momentum_buffer", "grad_avg"]);
        let StateValue::Tensor(step) = &entries[0].1 else { panic!("step is a tensor like PyTorch's") };
        assert_eq!((step.dtype(), step.shape().len(), step.item().unwrap()), (DType::F32, 0, 1.0));
    }
    let mut ada = Adagrad::new(p.clone(), AdagradConfig::new(0.01)).unwrap();
    ada.step().unwrap();
    let sd = ada.state_dict().unwrap();
    let hyper: Vec<&str> = sd.param_groups[0].hyper.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        hyper,
        [
            "lr",
            "lr_decay",
            "eps",
            "weight_decay",
            "initial_accumulator_value",
            "foreach",
            "maximize",
            "differentiable",
            "fused"
        ]
    );
    for (_, entries) in &sd.state {
        let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["step", "sum"]);
    }
    // A plain RMSprop keeps only square_avg.
    let mut plain = Rmsprop::new(p.clone(), RmspropConfig::new(0.01)).unwrap();
    plain.step().unwrap();
    let keys: Vec<String> = plain.state_dict().unwrap().state[0].1.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(keys, ["step", "square_avg"]);
}

#[test]
fn state_lives_on_the_allocator_and_meta_computes_nothing() {
    let dev = Device::parse("sim:1GiB:44").unwrap();
    let alloc = allocator(&dev);
    let w = Tensor::zeros(&[128, 1024], DType::F32, &dev).unwrap().requires_grad_(true).unwrap();
    let bytes = (128 * 1024 * 4) as u64;
    let mut opt = Rmsprop::new(vec![w.clone()], RmspropConfig::new(0.01).momentum(0.9).centered(true)).unwrap();
    w.sum().unwrap().backward().unwrap();
    let before = alloc.memory_allocated();
    opt.step().unwrap();
    assert_eq!(alloc.memory_allocated() - before, 3 * bytes, "square_avg, momentum_buffer, grad_avg");
    let mut ada = Adagrad::new(vec![w.clone()], AdagradConfig::new(0.01)).unwrap();
    let before = alloc.memory_allocated();
    ada.step().unwrap();
    assert_eq!(alloc.memory_allocated() - before, bytes, "sum");

    // On meta: the same state allocations, no arithmetic.
    let m = Tensor::zeros(&[64, 64], DType::F32, &Device::Meta).unwrap().requires_grad_(true).unwrap();
    m.sum().unwrap().backward().unwrap();
    let mut opt = Rmsprop::new(vec![m.clone()], RmspropConfig::new(0.01).centered(true)).unwrap();
    opt.step().unwrap();
    let st = opt.param_state(0, 0).unwrap();
    assert!(st.square_avg.is_meta() && st.grad_avg.as_ref().unwrap().is_meta());
    let mut ada = Adagrad::new(vec![m], AdagradConfig::new(0.01)).unwrap();
    ada.step().unwrap();
    assert!(ada.param_state(0, 0).unwrap().sum.is_meta());
}

#[test]
fn invalid_hyperparameters_are_typed_errors_with_the_values() {
    let p = params(2, &Device::Cpu);
    let hyper = |e: OptimError| match e {
        OptimError::InvalidHyperparameter { name, value, .. } => (name, value),
        other => panic!("expected InvalidHyperparameter, got {other}"),
    };
    let rms = |c: RmspropConfig| hyper(Rmsprop::new(p.clone(), c).unwrap_err());
    assert_eq!(rms(RmspropConfig::new(-0.1)), ("learning rate", -0.1));
    assert_eq!(rms(RmspropConfig::new(0.1).alpha(1.5)), ("alpha value", 1.5));
    assert_eq!(rms(RmspropConfig::new(0.1).alpha(-0.5)), ("alpha value", -0.5));
    assert_eq!(rms(RmspropConfig::new(0.1).momentum(-1.0)), ("momentum value", -1.0));
    assert_eq!(rms(RmspropConfig::new(0.1).eps(-1e-8)), ("epsilon value", -1e-8));
    assert_eq!(rms(RmspropConfig::new(0.1).weight_decay(-2.0)), ("weight_decay value", -2.0));
    let (name, value) = rms(RmspropConfig::new(f64::NAN));
    assert!(name == "learning rate" && value.is_nan());
    let e = Rmsprop::new(p.clone(), RmspropConfig::new(0.1).alpha(1.5)).unwrap_err().to_string();
    assert_eq!(e, "Invalid alpha value: 1.5 (expected 0 <= alpha <= 1)");

    let ada = |c: AdagradConfig| hyper(Adagrad::new(p.clone(), c).unwrap_err());
    assert_eq!(ada(AdagradConfig::new(-1.0)), ("learning rate", -1.0));
    assert_eq!(ada(AdagradConfig::new(0.1).lr_decay(-0.1)), ("lr_decay value", -0.1));
    assert_eq!(ada(AdagradConfig::new(0.1).initial_accumulator_value(-1.0)), ("initial_accumulator_value value", -1.0));
    assert_eq!(ada(AdagradConfig::new(0.1).eps(-1.0)), ("epsilon value", -1.0));
    assert_eq!(ada(AdagradConfig::new(0.1).weight_decay(-1.0)), ("weight_decay value", -1.0));

    // A setting changed after construction is refused at the next step, before any update.
    let mut opt = Rmsprop::new(p.clone(), RmspropConfig::new(0.1)).unwrap();
    opt.config_mut(0).unwrap().alpha = 2.0;
    loss(&p, 0).backward().unwrap();
    let before = bits(&p);
    assert!(matches!(opt.step(), Err(OptimError::InvalidHyperparameter { name: "alpha value", .. })));
    assert_eq!(bits(&p), before);
}

fn sgd() -> Sgd {
    let p = Tensor::zeros(&[2], DType::F32, &Device::Cpu).unwrap().requires_grad_(true).unwrap();
    Sgd::new(vec![p], SgdConfig::new(0.1).momentum(0.9)).unwrap()
}

#[test]
fn one_cycle_past_its_end_is_a_typed_error_that_changes_nothing() {
    let mut opt = sgd();
    let mut s = OneCycleLr::new(&mut opt, OneCycleConfig::new(1.0, 5)).unwrap();
    for _ in 0..5 {
        s.step(&mut opt).unwrap();
    }
    let (lr, m, state) = (opt.lr(0).unwrap(), opt.momentum(0).unwrap(), s.state_dict());
    let e = s.step(&mut opt).unwrap_err();
    assert!(matches!(e, OptimError::ScheduleFinished { steps: 6, total_steps: 5 }), "{e}");
    assert!(e.to_string().starts_with("Tried to step 6 times. The specified number of total steps is 5"), "{e}");
    assert_eq!((opt.lr(0).unwrap(), opt.momentum(0).unwrap(), s.state_dict()), (lr, m, state));

    let bad = |c: OneCycleConfig| OneCycleLr::new(&mut sgd(), c).unwrap_err().to_string();
    assert!(bad(OneCycleConfig::new(1.0, 0)).contains("Expected positive integer total_steps, but got 0"));
    assert!(bad(OneCycleConfig::new(1.0, 10).pct_start(1.5)).contains("pct_start, but got 1.5"));
    assert!(bad(OneCycleConfig::new(-1.0, 10)).contains("max_lr must be a number >= 0, got -1"));
    assert!(bad(OneCycleConfig::new(1.0, 10).div_factor(0.0)).contains("div_factor must be a positive number, got 0"));
    assert!(bad(OneCycleConfig::new(1.0, 10).max_lrs(vec![1.0, 2.0])).contains("expected 1 values for max_lr, got 2"));
    assert!(OneCycleConfig::with_epochs(1.0, 0, 10).unwrap_err().to_string().contains("epochs, but got 0"));
    // Adagrad has no momentum to cycle.
    let w = Tensor::zeros(&[2], DType::F32, &Device::Cpu).unwrap().requires_grad_(true).unwrap();
    let mut ada = Adagrad::new(vec![w], AdagradConfig::new(0.1)).unwrap();
    let e = OneCycleLr::new(&mut ada, OneCycleConfig::new(1.0, 10)).unwrap_err().to_string();
    assert!(e.contains("optimizer must support momentum or beta1"), "{e}");
    OneCycleLr::new(&mut ada, OneCycleConfig::new(1.0, 10).cycle_momentum(false)).unwrap();
}

#[test]
fn one_cycle_cycles_adam_beta1_and_linear_three_phase_ends_at_min_lr() {
    let w = Tensor::zeros(&[2], DType::F32, &Device::Cpu).unwrap().requires_grad_(true).unwrap();
    let mut adam = Adam::new(vec![w], AdamConfig::adam(0.1)).unwrap();
    let cfg = OneCycleConfig::new(2.0, 10)
        .anneal_strategy(ferrite_optim::AnnealStrategy::Linear)
        .three_phase(true)
        .div_factor(10.0)
        .final_div_factor(100.0);
    let mut s = OneCycleLr::new(&mut adam, cfg).unwrap();
    assert_eq!((adam.lr(0).unwrap(), adam.param_groups()[0].config.betas.0), (0.2, 0.95));
    for _ in 0..9 {
        s.step(&mut adam).unwrap();
    }
    // Phase 3 ends (step total_steps - 1) at initial_lr / final_div_factor, beta1 at max_momentum.
    assert!((adam.lr(0).unwrap() - 0.2 / 100.0).abs() < 1e-15, "{}", adam.lr(0).unwrap());
    assert_eq!(adam.param_groups()[0].config.betas, (0.95, 0.999));
}

#[test]
fn warm_restarts_refuse_bad_settings_and_epochs() {
    let bad = |t0, tm, eta| CosineAnnealingWarmRestarts::new(&mut sgd(), t0, tm, eta).unwrap_err().to_string();
    assert!(bad(0, 1, 0.0).contains("Expected positive integer T_0, but got 0"));
    assert!(bad(2, 0, 0.0).contains("Expected integer T_mult >= 1, but got 0"));
    assert!(bad(2, 1, f64::NAN).contains("eta_min"));
    let mut opt = sgd();
    let mut s = CosineAnnealingWarmRestarts::new(&mut opt, 3, 1, 0.0).unwrap();
    assert!(s.step_to(&mut opt, -1.0).unwrap_err().to_string().contains("Expected non-negative epoch, but got -1"));
    assert!(s.step_to(&mut opt, f64::INFINITY).is_err());
    // Fractional epochs: T_mult 1 wraps with the period.
    s.step_to(&mut opt, 4.5).unwrap();
    assert_eq!((s.t_cur(), s.t_i(), s.last_epoch()), (1.5, 3, 4));
}

#[test]
fn plateau_refuses_bad_settings_and_restores_its_counters() {
    let bad = |c: PlateauConfig| ReduceLrOnPlateau::new(&mut sgd(), c).unwrap_err().to_string();
    assert!(bad(PlateauConfig::default().factor(1.0)).contains("factor should be < 1.0"));
    assert!(bad(PlateauConfig::default().factor(0.0)).contains("got 0"));
    assert!(bad(PlateauConfig::default().threshold(-1.0, ThresholdMode::Abs)).contains("threshold"));
    assert!(bad(PlateauConfig::default().min_lrs(vec![0.1, 0.2])).contains("expected 1 min_lrs, got 2"));
    assert!(bad(PlateauConfig::default().min_lr(-0.1)).contains("min_lr must be >= 0"));

    // Mode max with an absolute threshold: accuracy must rise by more than 0.01 to count.
    let mut opt = sgd();
    let cfg = PlateauConfig::default().mode(PlateauMode::Max).threshold(0.01, ThresholdMode::Abs).patience(1);
    let mut s = ReduceLrOnPlateau::new(&mut opt, cfg.clone()).unwrap();
    for acc in [0.5, 0.505, 0.509] {
        s.step(&mut opt, acc).unwrap();
    }
    assert_eq!((s.best(), s.num_bad_epochs()), (0.5, 0), "two bad epochs > patience 1: cut, counter reset");
    assert!((opt.lr(0).unwrap() - 0.01).abs() < 1e-15);
    let saved = s.state_dict();
    assert_eq!(saved.params.iter().find(|(k, _)| k == "mode").map(|(_, v)| v), Some(&HyperValue::Str("max".into())));
    let mut opt2 = sgd();
    let mut s2 = ReduceLrOnPlateau::new(&mut opt2, PlateauConfig::default()).unwrap();
    s2.load_state_dict(&saved).unwrap();
    assert_eq!(s2.state_dict(), saved);
    // A state of another kind, or with a bad mode, is refused and changes nothing.
    let mut wrong = saved.clone();
    wrong.params.iter_mut().for_each(|(k, v)| {
        if k == "mode" {
            *v = HyperValue::Str("sideways".into());
        }
    });
    assert!(s2.load_state_dict(&wrong).unwrap_err().to_string().contains("mode sideways is unknown"));
    assert_eq!(s2.state_dict(), saved);
    let mut other = saved.clone();
    other.kind = "StepLR".into();
    assert!(s2.load_state_dict(&other).is_err());
}
