//! The loss modules (`BCELoss`, `BCEWithLogitsLoss`, `SmoothL1Loss`, `HuberLoss`, `KLDivLoss`,
//! `NLLLoss`, `CrossEntropyLoss`) on the loss cases of the PyTorch reference fixtures' `models/`
//! folder, configured from each case's attributes: loss and input gradients within the case's
//! rtol/atol (the kernels themselves run on every device in ferrite-conformance's check).
//! Every value is read from the fixture files; `attrs.applied_to` is applied to `input.0` first.

mod common;

use common::{assert_close, get, load_safetensors};
use ferrite_nn::{
    BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, HuberLoss, KLDivLoss, KlDivReduction, NLLLoss, Reduction,
    SmoothL1Loss,
};
use ferrite_tensor::{Device, Tensor};
use ferrite_test_support::fixtures::{model_cases, nested};
use serde_json::Value;

fn floats(v: &Value) -> Tensor {
    let (d, s) = nested(v);
    Tensor::from_vec(d.into_iter().map(|x| x as f32).collect(), &s, &Device::Cpu).unwrap()
}

fn classes(v: &Value) -> Tensor {
    let (d, s) = nested(v);
    Tensor::from_vec(d.into_iter().map(|x| x as i64).collect(), &s, &Device::Cpu).unwrap()
}

fn reduction(a: &Value) -> Reduction {
    match a["reduction"].as_str().unwrap_or("mean") {
        "sum" => Reduction::Sum,
        "none" => Reduction::None,
        _ => Reduction::Mean,
    }
}

fn applied(a: &Value, x: &Tensor) -> Tensor {
    match a.get("applied_to").and_then(Value::as_str) {
        None => x.clone(),
        Some("log_softmax(input)") => x.log_softmax(-1).unwrap(),
        Some("sigmoid(input)") => x.sigmoid().unwrap(),
        Some(other) => panic!("unknown applied_to {other}"),
    }
}

#[test]
fn loss_modules_match_pytorch() {
    let Some((dir, cases)) = model_cases(&[]) else { return };
    let mut checked = 0;
    for c in &cases {
        let (op, a, name) = (c["op"].as_str().unwrap(), &c["attrs"], c["name"].as_str().unwrap());
        let fx = load_safetensors(&dir.join(format!("{name}.safetensors")));
        let x0 = get(&fx, "input.0").detach().requires_grad_(true).unwrap();
        let x1 = (c["inputs"].as_u64() == Some(2)).then(|| get(&fx, "input.1").detach().requires_grad_(true).unwrap());
        let input = applied(a, &x0);
        let loss = match op {
            "nll_loss" => NLLLoss::new().reduction(reduction(a)).forward(&input, &classes(&a["target"])),
            "cross_entropy" => CrossEntropyLoss::new()
                .ignore_index(a["ignore_index"].as_i64().unwrap_or(-100))
                .label_smoothing(a["label_smoothing"].as_f64().unwrap_or(0.0))
                .unwrap()
                .reduction(reduction(a))
                .forward(&input, &classes(&a["target"])),
            "bce_with_logits" => {
                let mut m = BCEWithLogitsLoss::new().reduction(reduction(a));
                if let Some(pw) = a.get("pos_weight") {
                    m = m.pos_weight(floats(pw));
                }
                m.forward(&input, &floats(&a["target"]))
            }
            "binary_cross_entropy" => BCELoss::new().reduction(reduction(a)).forward(&input, &floats(&a["target"])),
            "smooth_l1_loss" => SmoothL1Loss::new()
                .beta(a["beta"].as_f64().unwrap_or(1.0))
                .unwrap()
                .reduction(reduction(a))
                .forward(&input, x1.as_ref().unwrap()),
            "huber_loss" => HuberLoss::new()
                .delta(a["delta"].as_f64().unwrap_or(1.0))
                .unwrap()
                .reduction(reduction(a))
                .forward(&input, x1.as_ref().unwrap()),
            "kl_div" => {
                let red = match a["reduction"].as_str() {
                    Some("batchmean") => KlDivReduction::BatchMean,
                    Some("sum") => KlDivReduction::Sum,
                    Some("none") => KlDivReduction::None,
                    _ => KlDivReduction::Mean,
                };
                KLDivLoss::new()
                    .reduction(red)
                    .log_target(a.get("log_target").and_then(Value::as_bool).unwrap_or(false))
                    .forward(&input, &floats(&a["target"]))
            }
            _ => continue,
        }
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let (rtol, atol) = (c["rtol"].as_f64().unwrap(), c["atol"].as_f64().unwrap());
        assert_close(&format!("{name} output"), &loss, get(&fx, "output"), rtol, atol);
        loss.backward_with(get(&fx, "grad_output"), false).unwrap();
        assert_close(&format!("{name} grad_input.0"), &x0.grad().unwrap(), get(&fx, "grad_input.0"), rtol, atol);
        if let Some(x1) = &x1 {
            assert_close(&format!("{name} grad_input.1"), &x1.grad().unwrap(), get(&fx, "grad_input.1"), rtol, atol);
        }
        println!("loss module parity {name} ok");
        checked += 1;
    }
    assert_eq!(checked, 7, "the seven loss cases of models/ (nll, ce, bce, bce_with_logits, smooth_l1, huber, kl_div)");
}
