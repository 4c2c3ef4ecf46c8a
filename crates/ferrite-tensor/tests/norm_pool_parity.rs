//! The normalisation and pooling cases of the PyTorch reference fixtures' `models/` folder
//! (`batch_norm1d`, `batch_norm2d`, `group_norm`, `rms_norm`, `max_pool2d`, `avg_pool2d`,
//! `adaptive_avg_pool2d`) through `ferrite_tensor::functional`, on every device under test
//! (`FERRITE_TEST_DEVICES`, default cpu and every GPU adapter): the output, every gradient listed
//! in `grad_inputs` and every `extra_outputs` tensor (batch norm's running statistics after one
//! training-mode forward) within the case's rtol/atol. Every value — inputs, attributes, running
//! statistics before the forward, expected results, tolerances — is read from the fixture files
//! (running statistics default to PyTorch's initial zeros/ones when a case does not list them).
//! A case of these ops without a runner fails the test, so new fixture cases cannot be skipped.

use std::path::{Path, PathBuf};

use ferrite_tensor::functional::{
    AvgPool2dOptions, BatchNormOptions, MaxPool2dOptions, adaptive_avg_pool2d, avg_pool2d, batch_norm, group_norm,
    max_pool2d, rms_norm,
};
use ferrite_tensor::{DType, Device, Tensor};
use serde_json::Value;

const OPS: [&str; 7] =
    ["batch_norm1d", "batch_norm2d", "group_norm", "rms_norm", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"];

fn cases() -> Option<(PathBuf, Vec<Value>)> {
    let dir = ferrite_test_support::reference_or_skip("models/manifest.json")?.join("models");
    let text = std::fs::read_to_string(dir.join("manifest.json")).expect("models/manifest.json");
    let m: Value = serde_json::from_str(&text).expect("models/manifest.json is valid JSON");
    let cases = m["cases"].as_array().expect("cases").iter().filter(|c| OPS.contains(&c["op"].as_str().unwrap_or(""))).cloned().collect();
    Some((dir, cases))
}

fn load(path: &Path) -> Vec<(String, Tensor)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid safetensors");
    st.tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
            let data: Vec<f32> = view.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            (name, Tensor::from_vec(data, view.shape(), &Device::Cpu).unwrap())
        })
        .collect()
}

fn get<'a>(fx: &'a [(String, Tensor)], name: &str) -> &'a Tensor {
    &fx.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("fixture lacks `{name}`")).1
}

fn usizes(v: &Value) -> Vec<usize> {
    match v {
        Value::Array(a) => a.iter().map(|x| x.as_u64().expect("a size") as usize).collect(),
        Value::Number(n) => vec![n.as_u64().expect("a size") as usize; 2],
        other => panic!("expected sizes, got {other}"),
    }
}

fn pair(a: &Value, key: &str, default: [usize; 2]) -> [usize; 2] {
    match a.get(key) {
        None | Some(Value::Null) => default,
        Some(v) => {
            let s = usizes(v);
            [s[0], s[1]]
        }
    }
}

fn floats(a: &Value, key: &str, dev: &Device) -> Option<Tensor> {
    let v: Vec<f32> = a.get(key)?.as_array()?.iter().map(|x| x.as_f64().expect("a number") as f32).collect();
    let n = v.len();
    Some(Tensor::from_vec(v, &[n], dev).unwrap())
}

/// Running statistics before the forward: from the case's attributes, else PyTorch's initial
/// zeros (mean) and ones (variance) for the input's channels.
fn running_before(a: &Value, x: &Tensor, dev: &Device) -> (Tensor, Tensor) {
    let c = x.shape()[1];
    let train = a["training"].as_bool().unwrap_or(false);
    let (mk, vk) = if train { ("running_mean_before", "running_var_before") } else { ("running_mean", "running_var") };
    (
        floats(a, mk, dev).unwrap_or_else(|| Tensor::zeros(&[c], DType::F32, dev).unwrap()),
        floats(a, vk, dev).unwrap_or_else(|| Tensor::ones(&[c], DType::F32, dev).unwrap()),
    )
}

/// The forward of case `op`, and the extra outputs it produced by name.
fn forward(op: &str, a: &Value, x: &[Tensor], dev: &Device) -> (Tensor, Vec<(String, Tensor)>) {
    let ctx = |e: ferrite_tensor::TensorError| panic!("{op} on {dev}: {e}");
    match op {
        "batch_norm1d" | "batch_norm2d" => {
            let (rm, rv) = running_before(a, &x[0], dev);
            let opts = BatchNormOptions {
                training: a["training"].as_bool().unwrap_or(false),
                momentum: a["momentum"].as_f64().unwrap_or(0.1),
                eps: a["eps"].as_f64().unwrap_or(1e-5),
            };
            let y = batch_norm(&x[0], Some(&rm), Some(&rv), x.get(1), x.get(2), &opts).unwrap_or_else(ctx);
            (y, vec![("running_mean".into(), rm), ("running_var".into(), rv)])
        }
        "group_norm" => {
            let g = a["num_groups"].as_u64().expect("num_groups") as usize;
            (group_norm(&x[0], g, x.get(1), x.get(2), a["eps"].as_f64().unwrap_or(1e-5)).unwrap_or_else(ctx), vec![])
        }
        "rms_norm" => {
            let shape = usizes(&a["normalized_shape"]);
            (rms_norm(&x[0], &shape, x.get(1), a.get("eps").and_then(Value::as_f64)).unwrap_or_else(ctx), vec![])
        }
        "max_pool2d" => {
            let kernel = pair(a, "kernel_size", [0, 0]);
            let opts = MaxPool2dOptions {
                kernel_size: kernel,
                stride: Some(pair(a, "stride", kernel)),
                padding: pair(a, "padding", [0, 0]),
                dilation: pair(a, "dilation", [1, 1]),
                ceil_mode: a["ceil_mode"].as_bool().unwrap_or(false),
            };
            (max_pool2d(&x[0], &opts).unwrap_or_else(ctx), vec![])
        }
        "avg_pool2d" => {
            let kernel = pair(a, "kernel_size", [0, 0]);
            let opts = AvgPool2dOptions {
                kernel_size: kernel,
                stride: Some(pair(a, "stride", kernel)),
                padding: pair(a, "padding", [0, 0]),
                ceil_mode: a["ceil_mode"].as_bool().unwrap_or(false),
                count_include_pad: a["count_include_pad"].as_bool().unwrap_or(true),
                divisor_override: a["divisor_override"].as_u64().map(|d| d as usize),
            };
            (avg_pool2d(&x[0], &opts).unwrap_or_else(ctx), vec![])
        }
        "adaptive_avg_pool2d" => {
            let size = pair(a, "output_size", [0, 0]);
            (adaptive_avg_pool2d(&x[0], [Some(size[0]), Some(size[1])]).unwrap_or_else(ctx), vec![])
        }
        other => panic!("no runner for `{other}`"),
    }
}

fn assert_close(what: &str, got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> f64 {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (g, w) = (got.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
    let mut worst = 0.0f64;
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let d = (a - b).abs();
        assert!(d <= atol + rtol * b.abs(), "{what}: element {i} is {a}, PyTorch {b} (diff {d:e})");
        worst = worst.max(d);
    }
    worst
}

#[test]
fn norm_and_pool_cases_match_pytorch_on_every_device() {
    let Some((dir, cases)) = cases() else { return };
    for op in OPS {
        assert!(cases.iter().any(|c| c["op"] == op), "no fixture case for {op}");
    }
    let devices = ferrite_memory::gpu::devices_under_test().expect("FERRITE_TEST_DEVICES");
    for dev in devices.iter().filter(|d| !matches!(d, Device::Meta)) {
        for c in &cases {
            let name = c["name"].as_str().unwrap();
            let (rtol, atol) = (c["rtol"].as_f64().unwrap(), c["atol"].as_f64().unwrap());
            let fx = load(&dir.join(format!("{name}.safetensors")));
            let grads: Vec<u64> = c["grad_inputs"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
            let inputs: Vec<Tensor> = (0..c["inputs"].as_u64().unwrap())
                .map(|i| {
                    let t = get(&fx, &format!("input.{i}")).to_device(dev).unwrap();
                    if grads.contains(&i) { t.requires_grad_(true).unwrap() } else { t }
                })
                .collect();
            let (out, extras) = forward(c["op"].as_str().unwrap(), &c["attrs"], &inputs, dev);
            let mut worst = assert_close(&format!("{dev} {name} output"), &out, get(&fx, "output"), rtol, atol);
            for extra in c["extra_outputs"].as_array().unwrap() {
                let extra = extra.as_str().unwrap();
                let got = &extras.iter().find(|(n, _)| n == extra).unwrap_or_else(|| panic!("{name}: no `{extra}`")).1;
                let want = get(&fx, &format!("extra.{extra}"));
                worst = worst.max(assert_close(&format!("{dev} {name} extra.{extra}"), got, want, rtol, atol));
            }
            out.backward_with(&get(&fx, "grad_output").to_device(dev).unwrap(), false).unwrap();
            for i in &grads {
                let g = inputs[*i as usize].grad().unwrap_or_else(|| panic!("{dev} {name}: input {i} has no gradient"));
                let want = get(&fx, &format!("grad_input.{i}"));
                worst = worst.max(assert_close(&format!("{dev} {name} grad_input.{i}"), &g, want, rtol, atol));
            }
            println!("norm/pool parity {dev:<6} {name:<28} ok (max |diff| {worst:.2e}, rtol {rtol}, atol {atol})");
        }
    }
}
