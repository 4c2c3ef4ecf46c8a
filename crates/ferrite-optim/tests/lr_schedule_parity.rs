//! Learning-rate schedules against PyTorch: `tests/data/lr_reference.json` holds the rates
//! PyTorch 2.15 produced (`tests/data/gen_lr_reference.py`); ours must be identical to the bit.
//! Also: resuming a schedule from its state continues the same sequence.

use ferrite_optim::{
    CosineAnnealingLr, LinearLr, LrScheduler, Optimizer, ParamGroup, Sgd, SgdConfig, StepLr, warmup_cosine,
};
use ferrite_tensor::{DType, Device, Tensor};
use serde_json::Value;

fn two_group_sgd() -> Sgd {
    let p = || Tensor::zeros(&[2], DType::F32, &Device::Cpu).unwrap().requires_grad_(true).unwrap();
    Sgd::with_groups(vec![
        ParamGroup::new(vec![p()], SgdConfig::new(0.1).momentum(0.9)),
        ParamGroup::new(vec![p()], SgdConfig::new(0.03).momentum(0.9)),
    ])
    .unwrap()
}

type Make = fn(&mut Sgd) -> Box<dyn LrScheduler>;

fn cases() -> Vec<(&'static str, Make)> {
    vec![
        ("step_lr", |o| Box::new(StepLr::new(o, 3, 0.5).unwrap())),
        ("linear_lr", |o| Box::new(LinearLr::new(o, 0.25, 1.0, 4).unwrap())),
        ("cosine", |o| Box::new(CosineAnnealingLr::new(o, 5, 0.001).unwrap())),
        ("warmup_cosine", |o| Box::new(warmup_cosine(o, 3, 10, 0.1, 0.0).unwrap())),
    ]
}

fn reference() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/lr_reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn schedules_match_pytorch_bit_for_bit() {
    let r = reference();
    for (name, make) in cases() {
        let want: Vec<Vec<f64>> = serde_json::from_value(r["cases"][name].clone()).unwrap();
        let mut opt = two_group_sgd();
        let mut s = make(&mut opt);
        let mut got = vec![opt.lrs()];
        for _ in 1..want.len() {
            opt.step().unwrap();
            s.step(&mut opt).unwrap();
            assert_eq!(s.get_last_lr(), opt.lrs());
            got.push(opt.lrs());
        }
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{name}: learning rates after {i} steps");
        }
        println!("{name}: {} learning rates identical to PyTorch", want.len());
    }
}

#[test]
fn resumed_schedule_continues_the_same_sequence() {
    for (name, make) in cases() {
        let mut opt = two_group_sgd();
        let mut s = make(&mut opt);
        for _ in 0..4 {
            s.step(&mut opt).unwrap();
        }
        let (opt_state, sched_state) = (opt.state_dict().unwrap(), s.state_dict());
        let mut expected = Vec::new();
        for _ in 0..5 {
            s.step(&mut opt).unwrap();
            expected.push(opt.lrs());
        }
        // Resume as PyTorch users do: build both afresh, then load both states.
        let mut opt2 = two_group_sgd();
        let mut s2 = make(&mut opt2);
        opt2.load_state_dict(&opt_state).unwrap();
        s2.load_state_dict(&sched_state).unwrap();
        let mut got = Vec::new();
        for _ in 0..5 {
            s2.step(&mut opt2).unwrap();
            got.push(opt2.lrs());
        }
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn schedule_errors() {
    let mut opt = two_group_sgd();
    assert!(StepLr::new(&mut opt, 0, 0.1).is_err());
    assert!(LinearLr::new(&mut opt, 0.0, 1.0, 3).unwrap_err().to_string().contains("Starting multiplicative factor"));
    assert!(LinearLr::new(&mut opt, 0.5, 1.5, 3).unwrap_err().to_string().contains("Ending multiplicative factor"));
    assert!(warmup_cosine(&mut opt, 5, 5, 0.1, 0.0).is_err());
    // A schedule stepped with another optimizer is refused.
    let mut s = StepLr::new(&mut opt, 2, 0.5).unwrap();
    let mut other = two_group_sgd();
    assert!(s.step(&mut other).unwrap_err().to_string().contains("different optimizer"));
    // Loading the state of another kind of schedule is refused.
    let c = CosineAnnealingLr::new(&mut opt, 3, 0.0).unwrap();
    assert!(s.load_state_dict(&c.state_dict()).unwrap_err().to_string().contains("CosineAnnealingLR"));
}
