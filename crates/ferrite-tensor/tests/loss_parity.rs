//! The losses of the PyTorch reference fixtures' `models/` cases (`nll_loss`,
//! `cross_entropy__ignore_smooth`, `bce_with_logits__pos_weight`, `binary_cross_entropy`,
//! `smooth_l1_loss__beta0.5`, `huber_loss__delta2`, `kl_div__batchmean`) through
//! `ferrite_tensor::functional`, on every device under test (`FERRITE_TEST_DEVICES`, default cpu
//! and every GPU adapter): the loss and every input gradient within the case's rtol/atol, every
//! value — inputs, targets, weights, attributes, expected outputs — read from the fixture files.
//!
//! `attrs.applied_to` names the function of `input.0` the loss received in PyTorch
//! (`log_softmax(input)`, `sigmoid(input)`); the test applies the same function, so
//! `grad_input.0` is checked through it. A loss case of the manifest without a runner here fails
//! the test, so new fixture cases cannot be skipped silently.

use ferrite_tensor::functional::{
    CrossEntropyOptions, KlDivReduction, Reduction, binary_cross_entropy, binary_cross_entropy_with_logits,
    cross_entropy, huber_loss, kl_div, nll_loss, smooth_l1_loss,
};
use ferrite_tensor::{DType, Device, Tensor};
use ferrite_test_support::assert_close;
use ferrite_test_support::fixtures::{get, load_f32, model_cases, nested};
use serde_json::Value;

const LOSSES: [&str; 7] =
    ["nll_loss", "cross_entropy", "bce_with_logits", "binary_cross_entropy", "smooth_l1_loss", "huber_loss", "kl_div"];

fn float_attr(a: &Value, key: &str, device: &Device) -> Tensor {
    let (v, shape) = nested(&a[key]);
    Tensor::from_vec(v.into_iter().map(|x| x as f32).collect(), &shape, device).unwrap()
}

fn class_attr(a: &Value, key: &str, device: &Device) -> Tensor {
    let (v, shape) = nested(&a[key]);
    Tensor::from_vec(v.into_iter().map(|x| x as i64).collect(), &shape, device).unwrap()
}

fn reduction(a: &Value) -> Reduction {
    match a["reduction"].as_str().unwrap_or("mean") {
        "mean" => Reduction::Mean,
        "sum" => Reduction::Sum,
        "none" => Reduction::None,
        other => panic!("unknown reduction {other}"),
    }
}

/// What PyTorch applied to `input.0` before the loss.
fn applied(a: &Value, x: &Tensor) -> Tensor {
    match a.get("applied_to").and_then(Value::as_str) {
        None => x.clone(),
        Some("log_softmax(input)") => x.log_softmax(-1).unwrap(),
        Some("sigmoid(input)") => x.sigmoid().unwrap(),
        Some(other) => panic!("unknown applied_to `{other}`"),
    }
}

fn forward(op: &str, a: &Value, x: &[Tensor], dev: &Device) -> Tensor {
    let r = match op {
        "nll_loss" => {
            let opts = CrossEntropyOptions { reduction: reduction(a), ..Default::default() };
            nll_loss(&applied(a, &x[0]), &class_attr(a, "target", dev), &opts)
        }
        "cross_entropy" => {
            let opts = CrossEntropyOptions {
                ignore_index: a["ignore_index"].as_i64().unwrap_or(-100),
                label_smoothing: a["label_smoothing"].as_f64().unwrap_or(0.0),
                reduction: reduction(a),
                weight: None,
            };
            cross_entropy(&applied(a, &x[0]), &class_attr(a, "target", dev), &opts)
        }
        "bce_with_logits" => {
            let pw = a.get("pos_weight").map(|_| float_attr(a, "pos_weight", dev));
            let w = a.get("weight").map(|_| float_attr(a, "weight", dev));
            binary_cross_entropy_with_logits(
                &applied(a, &x[0]),
                &float_attr(a, "target", dev),
                w.as_ref(),
                pw.as_ref(),
                reduction(a),
            )
        }
        "binary_cross_entropy" => {
            let w = a.get("weight").map(|_| float_attr(a, "weight", dev));
            binary_cross_entropy(&applied(a, &x[0]), &float_attr(a, "target", dev), w.as_ref(), reduction(a))
        }
        "smooth_l1_loss" => smooth_l1_loss(&x[0], &x[1], a["beta"].as_f64().unwrap_or(1.0), reduction(a)),
        "huber_loss" => huber_loss(&x[0], &x[1], a["delta"].as_f64().unwrap_or(1.0), reduction(a)),
        "kl_div" => {
            let red = match a["reduction"].as_str().unwrap_or("mean") {
                "batchmean" => KlDivReduction::BatchMean,
                "mean" => KlDivReduction::Mean,
                "sum" => KlDivReduction::Sum,
                "none" => KlDivReduction::None,
                other => panic!("unknown reduction {other}"),
            };
            let log_target = a.get("log_target").and_then(Value::as_bool).unwrap_or(false);
            kl_div(&applied(a, &x[0]), &float_attr(a, "target", dev), red, log_target)
        }
        other => panic!("no runner for loss `{other}`"),
    };
    r.unwrap_or_else(|e| panic!("{op} on {dev}: {e}"))
}

#[test]
fn loss_cases_match_pytorch_on_every_device() {
    let Some((dir, cases)) = model_cases(&LOSSES) else { return };
    assert!(cases.len() >= LOSSES.len(), "expected at least one fixture case per loss, found {}", cases.len());
    ferrite_test_support::for_each_device(|dev| {
        for c in &cases {
            let name = c["name"].as_str().unwrap();
            let (rtol, atol) = (c["rtol"].as_f64().unwrap(), c["atol"].as_f64().unwrap());
            let fx = load_f32(&dir.join(format!("{name}.safetensors")));
            let grads: Vec<u64> = c["grad_inputs"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
            let inputs: Vec<Tensor> = (0..c["inputs"].as_u64().unwrap())
                .map(|i| {
                    let t = get(&fx, &format!("input.{i}")).to_device(dev).unwrap();
                    if grads.contains(&i) { t.requires_grad_(true).unwrap() } else { t }
                })
                .collect();
            let out = forward(c["op"].as_str().unwrap(), &c["attrs"], &inputs, dev);
            assert_eq!(out.dtype(), DType::F32);
            let mut worst = assert_close(&format!("{dev} {name} output"), &out, get(&fx, "output"), rtol, atol);
            out.backward_with(&get(&fx, "grad_output").to_device(dev).unwrap(), false).unwrap();
            for i in &grads {
                let g = inputs[*i as usize].grad().unwrap_or_else(|| panic!("{dev} {name}: input {i} has no gradient"));
                let want = get(&fx, &format!("grad_input.{i}"));
                worst = worst.max(assert_close(&format!("{dev} {name} grad_input.{i}"), &g, want, rtol, atol));
            }
            println!("loss parity {dev:<6} {name:<28} ok (max |diff| {worst:.2e}, rtol {rtol}, atol {atol})");
        }
    });
}
