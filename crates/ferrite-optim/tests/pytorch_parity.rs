//! Optimizer and GradScaler parity with PyTorch: every trajectory of the reference fixtures
//! (`train/manifest.json`, `train/grad_scaler.json`) reproduced from real PyTorch output.

mod common;

use common::*;
use ferrite_optim::{Adam, AdamConfig, GradScaler, GradScalerConfig, Optimizer, Sgd, SgdConfig};
use ferrite_tensor::Tensor;
use serde_json::Value;

fn f(v: &Value, key: &str, default: f64) -> f64 {
    v.get(key).and_then(Value::as_f64).unwrap_or(default)
}

fn build_optimizer(spec: &Value, params: Vec<Tensor>) -> Box<dyn Optimizer> {
    let kind = spec["kind"].as_str().expect("optimizer kind");
    let betas = |d: (f64, f64)| {
        spec.get("betas")
            .and_then(Value::as_array)
            .map(|b| (b[0].as_f64().unwrap(), b[1].as_f64().unwrap()))
            .unwrap_or(d)
    };
    match kind {
        "sgd" => {
            let c = SgdConfig::new(f(spec, "lr", 1e-3))
                .momentum(f(spec, "momentum", 0.0))
                .dampening(f(spec, "dampening", 0.0))
                .weight_decay(f(spec, "weight_decay", 0.0))
                .nesterov(spec.get("nesterov").and_then(Value::as_bool).unwrap_or(false));
            Box::new(Sgd::new(params, c).unwrap())
        }
        "adam" | "adamw" => {
            let base = if kind == "adam" {
                AdamConfig::adam(f(spec, "lr", 1e-3))
            } else {
                AdamConfig::adamw(f(spec, "lr", 1e-3))
            };
            let (b1, b2) = betas(base.betas);
            let c = base.clone().betas(b1, b2).eps(f(spec, "eps", base.eps)).weight_decay(f(
                spec,
                "weight_decay",
                base.weight_decay,
            ));
            Box::new(Adam::new(params, c).unwrap())
        }
        other => panic!("unknown optimizer kind {other}"),
    }
}

#[test]
fn optimizer_trajectories_match_pytorch() {
    let Some(dir) = train_dir() else { return };
    let manifest: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let cases = manifest["cases"].as_array().expect("cases");
    assert!(cases.len() >= 3, "expected the SGD, Adam and AdamW trajectories");
    ferrite_test_support::for_each_device(|dev| {
        println!("optimizer trajectories on {dev}");
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let steps = case["steps"].as_u64().unwrap() as usize;
            let accum = case["accum"].as_u64().unwrap() as usize;
            let batch = case["batch"].as_u64().unwrap() as usize;
            let ts = load_safetensors(&dir.join(format!("{name}.safetensors")), dev);
            let (x, y) = (get(&ts, "X"), get(&ts, "Y"));
            let want_losses = get(&ts, "losses").to_vec::<f32>().unwrap();
            let params = leaf_params(&ts, "init");
            let mut opt = build_optimizer(&case["optimizer"], params.clone());
            let mut worst_loss = 0.0f64;
            for s in 0..steps {
                let mut total = 0.0f32;
                for a in 0..accum {
                    let start = (s * accum + a) * batch;
                    let xb = x.narrow(0, start, batch).unwrap();
                    let yb = y.narrow(0, start, batch).unwrap();
                    let loss = mlp_loss(&params, &xb, &yb).div_scalar(accum as f64).unwrap();
                    loss.backward().unwrap();
                    total += loss.item().unwrap() as f32;
                }
                opt.step().unwrap();
                opt.zero_grad().unwrap();
                let d = (total as f64 - want_losses[s] as f64).abs();
                worst_loss = worst_loss.max(d);
                assert!(d <= 1e-5, "{dev} {name}: step {s} loss {total} vs PyTorch {} (diff {d:e})", want_losses[s]);
            }
            let mut worst = 0.0f64;
            for (p, n) in params.iter().zip(PARAM_NAMES) {
                let d = max_abs_diff(p, get(&ts, &format!("final.{n}")));
                assert!(d <= 1e-5, "{dev} {name}: final.{n} differs from PyTorch by {d:e}");
                worst = worst.max(d);
            }
            println!(
                "{dev} {name}: {steps} steps x {accum} micro-batches; max |param diff| {worst:.2e}, max |loss diff| {worst_loss:.2e}"
            );
        }
    });
}

#[test]
fn grad_scaler_trajectory_matches_pytorch_exactly() {
    let Some(dir) = train_dir() else { return };
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("grad_scaler.json")).unwrap()).unwrap();
    let cfg = GradScalerConfig {
        init_scale: spec["init_scale"].as_f64().unwrap(),
        growth_factor: spec["growth_factor"].as_f64().unwrap(),
        backoff_factor: spec["backoff_factor"].as_f64().unwrap(),
        growth_interval: spec["growth_interval"].as_i64().unwrap(),
        enabled: true,
    };
    ferrite_test_support::for_each_device(|dev| {
        let mut scaler = GradScaler::new(cfg.clone()).unwrap();
        let w = Tensor::from_vec(vec![0.5f32, -0.25], &[2], dev).unwrap().requires_grad_(true).unwrap();
        let mut opt = Sgd::new(vec![w.clone()], SgdConfig::new(0.01)).unwrap();
        let steps = spec["steps"].as_array().unwrap();
        for (i, st) in steps.iter().enumerate() {
            let found_inf = st["found_inf"].as_bool().unwrap();
            // A real overflow: the scaled loss's gradient is infinite when found_inf is expected.
            let factor = if found_inf { f64::INFINITY } else { 1.0 };
            let loss = w.mul_scalar(factor).unwrap().sum().unwrap();
            scaler.scale(&loss).unwrap().backward().unwrap();
            let before = w.to_vec::<f32>().unwrap();
            let stepped = scaler.step(&mut opt).unwrap();
            scaler.update().unwrap();
            opt.zero_grad().unwrap();
            assert_eq!(stepped, !found_inf, "{dev} step {i}");
            if found_inf {
                assert_eq!(
                    w.to_vec::<f32>().unwrap(),
                    before,
                    "step {i}: a step with inf gradients must not touch the parameters"
                );
            }
            let want = st["scale_after"].as_f64().unwrap();
            assert_eq!(scaler.get_scale(), want, "step {i}: scale after update");
        }
        println!("grad_scaler on {dev}: {} steps, scale trajectory identical to PyTorch", steps.len());
    });
}
