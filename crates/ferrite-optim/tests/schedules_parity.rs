//! RMSprop, Adagrad and the OneCycle / warm-restart / plateau schedules against PyTorch: every
//! trajectory of the reference fixtures' `models/schedules.json` (or of
//! `$FERRITE_PYTORCH_REFERENCE/models/schedules.json`), every expected value read from the file.
//!
//! - Optimizers: the stated loss `sum((w - 0.3*k)^2) + sum(|w|)` at step k from `init`; the
//!   parameter after each step must be within `|diff| <= 1e-6 + 1e-6 * |want|` of PyTorch's on
//!   every device under test (`FERRITE_TEST_DEVICES`, default cpu and every GPU adapter). The
//!   updates are PyTorch's op sequence in f32, so the CPU differs only where PyTorch's own
//!   vectorised and scalar paths round differently; GPUs add 1-ulp differences of sqrt/division.
//! - Schedules: an SGD(lr 0.1, momentum 0.9) group stepped as PyTorch did; the learning rate and
//!   momentum after each step within 1e-12 relative (the formulas are PyTorch's, in f64).

mod common;

use common::models_schedules;
use ferrite_optim::{
    Adagrad, AdagradConfig, AnnealStrategy, CosineAnnealingWarmRestarts, LrScheduler, OneCycleConfig, OneCycleLr,
    Optimizer, PlateauConfig, PlateauMode, ReduceLrOnPlateau, Rmsprop, RmspropConfig, Sgd, SgdConfig, ThresholdMode,
};
use ferrite_tensor::{DType, Device, Tensor};
use serde_json::Value;

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap_or_else(|| panic!("expected a list, found {v}")).iter().map(|x| x.as_f64().unwrap()).collect()
}

/// Hyperparameters from a case's `config`, PyTorch's defaults for keys it leaves out.
fn build(name: &str, config: &Value, w: Tensor) -> Box<dyn Optimizer> {
    if name.starts_with("rmsprop") {
        let d = RmspropConfig::default();
        let c = RmspropConfig::new(num(config, "lr").unwrap_or(d.lr))
            .alpha(num(config, "alpha").unwrap_or(d.alpha))
            .eps(num(config, "eps").unwrap_or(d.eps))
            .weight_decay(num(config, "weight_decay").unwrap_or(d.weight_decay))
            .momentum(num(config, "momentum").unwrap_or(d.momentum))
            .centered(config.get("centered").and_then(Value::as_bool).unwrap_or(d.centered));
        Box::new(Rmsprop::new(vec![w], c).unwrap())
    } else if name.starts_with("adagrad") {
        let d = AdagradConfig::default();
        let c = AdagradConfig::new(num(config, "lr").unwrap_or(d.lr))
            .lr_decay(num(config, "lr_decay").unwrap_or(d.lr_decay))
            .eps(num(config, "eps").unwrap_or(d.eps))
            .weight_decay(num(config, "weight_decay").unwrap_or(d.weight_decay))
            .initial_accumulator_value(num(config, "initial_accumulator_value").unwrap_or(d.initial_accumulator_value));
        Box::new(Adagrad::new(vec![w], c).unwrap())
    } else {
        panic!("no optimizer for fixture case {name}")
    }
}

#[test]
fn optimizer_trajectories_match_pytorch() {
    let Some(fx) = models_schedules() else { return };
    let cases = fx["optimizers"].as_object().expect("`optimizers` in schedules.json");
    for name in ["rmsprop", "rmsprop__centered_momentum", "adagrad"] {
        assert!(cases.contains_key(name), "schedules.json lacks the `{name}` trajectory");
    }
    ferrite_test_support::for_each_device(|dev| {
        for (name, case) in cases {
            let shape: Vec<usize> =
                case["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
            let init: Vec<f32> = floats(&case["init"]).into_iter().map(|v| v as f32).collect();
            let w = Tensor::from_vec(init, &shape, dev).unwrap().requires_grad_(true).unwrap();
            let mut opt = build(name, &case["config"], w.clone());
            let steps = case["after_each_step"].as_array().unwrap();
            let mut worst = 0.0f64;
            for (k, want) in steps.iter().enumerate() {
                let loss = w.sub_scalar(0.3 * k as f64).unwrap().square().unwrap().sum().unwrap();
                let loss = loss.add(&w.abs().unwrap().sum().unwrap()).unwrap();
                loss.backward().unwrap();
                opt.step().unwrap();
                opt.zero_grad().unwrap();
                let got = w.to_vec_f64().unwrap();
                for (i, (g, e)) in got.iter().zip(floats(want)).enumerate() {
                    let d = (g - e).abs();
                    assert!(
                        d <= 1e-6 + 1e-6 * e.abs(),
                        "{dev} {name}: step {k} element {i} is {g}, PyTorch {e} (diff {d:e})"
                    );
                    worst = worst.max(d);
                }
            }
            println!("{dev} {name}: {} steps, max |param diff| {worst:.2e}", steps.len());
        }
    });
}

/// `SGD(lr=base_lr, momentum=base_momentum)` on one parameter, as the fixture generator built it.
fn sgd(case: &Value) -> Sgd {
    let p = Tensor::zeros(&[1], DType::F32, &Device::Cpu).unwrap().requires_grad_(true).unwrap();
    Sgd::new(vec![p], SgdConfig::new(num(case, "base_lr").unwrap()).momentum(num(case, "base_momentum").unwrap()))
        .unwrap()
}

fn close(what: &str, got: f64, want: f64) {
    assert!((got - want).abs() <= 1e-12 * want.abs().max(1e-300), "{what}: {got} vs PyTorch {want}");
}

fn check_step(name: &str, k: usize, case: &Value, opt: &Sgd) {
    close(&format!("{name} lr after step {k}"), opt.lr(0).unwrap(), case["lr_after_each_step"][k].as_f64().unwrap());
    close(
        &format!("{name} momentum after step {k}"),
        opt.momentum(0).unwrap().unwrap(),
        case["momentum_after_each_step"][k].as_f64().unwrap(),
    );
}

fn steps(case: &Value) -> usize {
    case["lr_after_each_step"].as_array().unwrap().len()
}

fn one_cycle_config(c: &Value) -> OneCycleConfig {
    let strategy = match c["anneal_strategy"].as_str().unwrap_or("cos") {
        "cos" => AnnealStrategy::Cos,
        "linear" => AnnealStrategy::Linear,
        other => panic!("unknown anneal_strategy {other}"),
    };
    let d = OneCycleConfig::new(num(c, "max_lr").unwrap(), c["total_steps"].as_i64().unwrap());
    OneCycleConfig::new(num(c, "max_lr").unwrap(), c["total_steps"].as_i64().unwrap())
        .pct_start(num(c, "pct_start").unwrap_or(d.pct_start))
        .anneal_strategy(strategy)
        .div_factor(num(c, "div_factor").unwrap_or(d.div_factor))
        .final_div_factor(num(c, "final_div_factor").unwrap_or(d.final_div_factor))
        .cycle_momentum(c.get("cycle_momentum").and_then(Value::as_bool).unwrap_or(true))
        .momentum_range(
            num(c, "base_momentum").unwrap_or(d.base_momentum[0]),
            num(c, "max_momentum").unwrap_or(d.max_momentum[0]),
        )
        .three_phase(c.get("three_phase").and_then(Value::as_bool).unwrap_or(false))
}

#[test]
fn one_cycle_matches_pytorch() {
    let Some(fx) = models_schedules() else { return };
    let case = &fx["schedules"]["one_cycle__cos"];
    let mut opt = sgd(case);
    let mut s = OneCycleLr::new(&mut opt, one_cycle_config(&case["config"])).unwrap();
    for k in 0..steps(case) {
        opt.step().unwrap();
        s.step(&mut opt).unwrap();
        check_step("one_cycle__cos", k, case, &opt);
    }
    println!("one_cycle__cos: {} steps of lr and momentum match PyTorch", steps(case));
}

#[test]
fn cosine_warm_restarts_matches_pytorch() {
    let Some(fx) = models_schedules() else { return };
    let case = &fx["schedules"]["cosine_warm_restarts"];
    let c = &case["config"];
    let mut opt = sgd(case);
    let mut s = CosineAnnealingWarmRestarts::new(
        &mut opt,
        c["T_0"].as_i64().unwrap(),
        c.get("T_mult").and_then(Value::as_i64).unwrap_or(1),
        num(c, "eta_min").unwrap_or(0.0),
    )
    .unwrap();
    for k in 0..steps(case) {
        opt.step().unwrap();
        s.step(&mut opt).unwrap();
        check_step("cosine_warm_restarts", k, case, &opt);
    }
    println!("cosine_warm_restarts: {} steps match PyTorch", steps(case));
}

#[test]
fn reduce_on_plateau_matches_pytorch() {
    let Some(fx) = models_schedules() else { return };
    let case = &fx["schedules"]["reduce_on_plateau"];
    let c = &case["config"];
    let d = PlateauConfig::default();
    let mode = match c["mode"].as_str().unwrap_or("min") {
        "min" => PlateauMode::Min,
        "max" => PlateauMode::Max,
        other => panic!("unknown mode {other}"),
    };
    let threshold_mode = match c["threshold_mode"].as_str().unwrap_or("rel") {
        "rel" => ThresholdMode::Rel,
        "abs" => ThresholdMode::Abs,
        other => panic!("unknown threshold_mode {other}"),
    };
    let config = PlateauConfig::default()
        .mode(mode)
        .factor(num(c, "factor").unwrap_or(d.factor))
        .patience(c.get("patience").and_then(Value::as_u64).unwrap_or(d.patience))
        .threshold(num(c, "threshold").unwrap_or(d.threshold), threshold_mode)
        .cooldown(c.get("cooldown").and_then(Value::as_u64).unwrap_or(d.cooldown))
        .min_lr(num(c, "min_lr").unwrap_or(0.0))
        .eps(num(c, "eps").unwrap_or(d.eps));
    let mut opt = sgd(case);
    let mut s = ReduceLrOnPlateau::new(&mut opt, config).unwrap();
    let metrics = floats(&case["metrics"]);
    assert_eq!(metrics.len(), steps(case));
    for (k, m) in metrics.iter().enumerate() {
        opt.step().unwrap();
        s.step(&mut opt, *m).unwrap();
        check_step("reduce_on_plateau", k, case, &opt);
    }
    println!("reduce_on_plateau: {} metrics, lr and momentum match PyTorch", metrics.len());
}
