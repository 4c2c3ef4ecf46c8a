//! Optimizer options beyond the shared fixtures (nesterov, dampening, maximize, AMSGrad, L2 vs
//! decoupled decay, beta1 >= 0.5) against PyTorch 2.15: `tests/data/optim_reference.json` was
//! written by `tests/data/gen_optim_reference.py`. Each case: 6 steps on a 37-element parameter
//! (vector body plus scalar tail) with given gradients; every intermediate parameter and the
//! final state must match.

use ferrite_optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig, StateValue};
use ferrite_tensor::{Device, Tensor};
use serde_json::Value;

fn t(v: &Value) -> Tensor {
    let v: Vec<f32> = serde_json::from_value(v.clone()).unwrap();
    let n = v.len();
    Tensor::from_vec(v, &[n], &Device::Cpu).unwrap()
}

fn make(name: &str, p: Tensor) -> Box<dyn Optimizer> {
    let ps = vec![p];
    match name {
        "sgd_plain" => Box::new(Sgd::new(ps, SgdConfig::new(0.05)).unwrap()),
        "sgd_plain_wd_maximize" => {
            Box::new(Sgd::new(ps, SgdConfig::new(0.05).weight_decay(0.1).maximize(true)).unwrap())
        }
        "sgd_dampening" => {
            Box::new(Sgd::new(ps, SgdConfig::new(0.05).momentum(0.8).dampening(0.3).weight_decay(0.01)).unwrap())
        }
        "sgd_nesterov" => {
            Box::new(Sgd::new(ps, SgdConfig::new(0.05).momentum(0.9).nesterov(true).weight_decay(0.02)).unwrap())
        }
        "adam_l2" => {
            Box::new(Adam::new(ps, AdamConfig::adam(0.02).betas(0.8, 0.99).eps(1e-6).weight_decay(0.05)).unwrap())
        }
        "adam_amsgrad_maximize" => {
            Box::new(Adam::new(ps, AdamConfig::adam(0.02).amsgrad(true).maximize(true)).unwrap())
        }
        "adamw_amsgrad" => Box::new(Adam::new(ps, AdamConfig::adamw(0.03).weight_decay(0.1).amsgrad(true)).unwrap()),
        "adamw_beta1_large" => Box::new(Adam::new(ps, AdamConfig::adamw(0.01).betas(0.3, 0.9)).unwrap()),
        other => panic!("no constructor for case {other}"),
    }
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    assert_eq!(a.len(), b.len());
    a.iter().zip(&b).map(|(x, y)| (*x as f64 - *y as f64).abs()).fold(0.0, f64::max)
}

#[test]
fn variants_match_pytorch() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/optim_reference.json");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let grads: Vec<Tensor> = r["grads"].as_array().unwrap().iter().map(t).collect();
    let cases = r["cases"].as_object().unwrap();
    assert_eq!(cases.len(), 8);
    for (name, case) in cases {
        let p = t(&r["init"]).requires_grad_(true).unwrap();
        let mut opt = make(name, p.clone());
        let mut worst = 0.0f64;
        for (i, (g, want)) in grads.iter().zip(case["trajectory"].as_array().unwrap()).enumerate() {
            p.set_grad(Some(g.deep_clone().unwrap())).unwrap();
            opt.step().unwrap();
            let d = max_diff(&p, &t(want));
            assert!(d <= 1e-6, "{name}: step {i} differs from PyTorch by {d:e}");
            worst = worst.max(d);
        }
        let sd = opt.state_dict().unwrap();
        let saved = sd.param_state(0).unwrap_or(&[]);
        let want_state = case["state"].as_object().unwrap();
        assert_eq!(
            saved.len(),
            want_state.len(),
            "{name}: state keys {:?}",
            saved.iter().map(|(k, _)| k).collect::<Vec<_>>()
        );
        for (k, v) in saved {
            match (k.as_str(), v) {
                ("step", v) => assert_eq!(v.as_f64().unwrap(), want_state["step"].as_f64().unwrap(), "{name}: step"),
                (k, StateValue::Tensor(s)) => {
                    let d = max_diff(s, &t(&want_state[k]));
                    assert!(d <= 1e-6, "{name}: state {k} differs by {d:e}");
                    worst = worst.max(d);
                }
                (k, other) => panic!("{name}: unexpected state {k} = {other:?}"),
            }
        }
        println!("{name}: max |diff| vs PyTorch {worst:.2e}");
    }
}
