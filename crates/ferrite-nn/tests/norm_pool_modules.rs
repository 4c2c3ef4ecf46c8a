//! The normalisation and pooling layers (`BatchNorm1d`, `BatchNorm2d`, `GroupNorm`, `RMSNorm`,
//! `MaxPool2d`, `AvgPool2d`, `AdaptiveAvgPool2d`) against the PyTorch reference fixtures'
//! `models/` cases, configured from each case's attributes with the fixture's weights loaded
//! through `load_state_dict` under PyTorch's key names, on every device under test: output,
//! every gradient in `grad_inputs` (the input's and the module's `weight`/`bias`), and the running
//! statistics the module holds after one training-mode forward (`extra.*`). Then the state-dict
//! behaviour PyTorch users rely on: keys, `num_batches_tracked` counting, eval mode using the
//! running statistics, the cumulative average of `momentum=None`, batch statistics without
//! tracking, and a round trip through a state dict. Last, a model of every one of these layers
//! runs on `meta` with the shapes and peak allocation of the same step on a real device.

mod common;

use common::{assert_close, get, load_safetensors};
use ferrite_nn::{
    AdaptiveAvgPool2d, AvgPool2d, BatchNorm1d, BatchNorm2d, BatchNormConfig, Flatten, GroupNorm, Linear, MaxPool2d,
    Module, RMSNorm, Sequential, StateDict,
};
use ferrite_tensor::functional::{AvgPool2dOptions, MaxPool2dOptions};
use ferrite_tensor::{DType, Device, Generator, Tensor};
use serde_json::Value;

const OPS: [&str; 7] =
    ["batch_norm1d", "batch_norm2d", "group_norm", "rms_norm", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"];

fn cases() -> Option<(std::path::PathBuf, Vec<Value>)> {
    let dir = ferrite_test_support::reference_or_skip("models/manifest.json")?.join("models");
    let m: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let cases = m["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| OPS.contains(&c["op"].as_str().unwrap_or("")))
        .cloned()
        .collect();
    Some((dir, cases))
}

fn pair(a: &Value, key: &str, default: [usize; 2]) -> [usize; 2] {
    match a.get(key) {
        Some(Value::Array(v)) => [v[0].as_u64().unwrap() as usize, v[1].as_u64().unwrap() as usize],
        Some(Value::Number(n)) => [n.as_u64().unwrap() as usize; 2],
        _ => default,
    }
}

fn floats(a: &Value, key: &str) -> Option<Tensor> {
    let v: Vec<f32> = a.get(key)?.as_array()?.iter().map(|x| x.as_f64().unwrap() as f32).collect();
    let n = v.len();
    Some(Tensor::from_vec(v, &[n], &Device::Cpu).unwrap())
}

/// The module of a case, with the fixture's parameters (and running statistics) loaded.
fn module_for(op: &str, a: &Value, fx: &StateDict, dev: &Device) -> Box<dyn Module> {
    let x = get(fx, "input.0");
    let input = |i: usize| get(fx, &format!("input.{i}")).clone();
    let mut m: Box<dyn Module> = match op {
        "batch_norm1d" | "batch_norm2d" => {
            let c = x.shape()[1];
            let cfg = BatchNormConfig::default()
                .eps(a["eps"].as_f64().unwrap_or(1e-5))
                .momentum(Some(a["momentum"].as_f64().unwrap_or(0.1)));
            let mut bn: Box<dyn Module> = if op == "batch_norm1d" {
                Box::new(BatchNorm1d::with_config(c, &cfg, &Device::Cpu).unwrap())
            } else {
                Box::new(BatchNorm2d::with_config(c, &cfg, &Device::Cpu).unwrap())
            };
            let train = a["training"].as_bool().unwrap_or(false);
            let (mk, vk) =
                if train { ("running_mean_before", "running_var_before") } else { ("running_mean", "running_var") };
            let mut sd: StateDict =
                [("weight", input(1)), ("bias", input(2))].into_iter().map(|(k, t)| (k.to_string(), t)).collect();
            // Statistics the case does not list stay at PyTorch's initial zeros/ones.
            for (key, attr) in [("running_mean", mk), ("running_var", vk)] {
                if let Some(t) = floats(a, attr) {
                    sd.insert(key.to_string(), t);
                }
            }
            bn.load_state_dict(&sd, false).unwrap();
            bn.train(train);
            bn
        }
        "group_norm" => {
            let g = a["num_groups"].as_u64().unwrap() as usize;
            let mut gn =
                GroupNorm::with_config(g, x.shape()[1], a["eps"].as_f64().unwrap_or(1e-5), true, &Device::Cpu).unwrap();
            let sd: StateDict =
                [("weight".to_string(), input(1)), ("bias".to_string(), input(2))].into_iter().collect();
            gn.load_state_dict(&sd, true).unwrap();
            Box::new(gn)
        }
        "rms_norm" => {
            let shape: Vec<usize> =
                a["normalized_shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
            let mut n = RMSNorm::with_config(&shape, a.get("eps").and_then(Value::as_f64), true, &Device::Cpu).unwrap();
            n.load_state_dict(&[("weight".to_string(), input(1))].into_iter().collect(), true).unwrap();
            Box::new(n)
        }
        "max_pool2d" => {
            let k = pair(a, "kernel_size", [1, 1]);
            let opts = MaxPool2dOptions {
                stride: Some(pair(a, "stride", k)),
                padding: pair(a, "padding", [0, 0]),
                dilation: pair(a, "dilation", [1, 1]),
                ceil_mode: a["ceil_mode"].as_bool().unwrap_or(false),
                ..MaxPool2dOptions::new(k)
            };
            Box::new(MaxPool2d::with_options(opts).unwrap())
        }
        "avg_pool2d" => {
            let k = pair(a, "kernel_size", [1, 1]);
            let opts = AvgPool2dOptions {
                stride: Some(pair(a, "stride", k)),
                padding: pair(a, "padding", [0, 0]),
                ceil_mode: a["ceil_mode"].as_bool().unwrap_or(false),
                count_include_pad: a["count_include_pad"].as_bool().unwrap_or(true),
                divisor_override: a["divisor_override"].as_u64().map(|d| d as usize),
                ..AvgPool2dOptions::new(k)
            };
            Box::new(AvgPool2d::with_options(opts).unwrap())
        }
        "adaptive_avg_pool2d" => {
            let s = pair(a, "output_size", [1, 1]);
            Box::new(AdaptiveAvgPool2d::with_size([Some(s[0]), Some(s[1])]))
        }
        other => panic!("no module for {other}"),
    };
    m.to_device(dev).unwrap();
    m
}

#[test]
fn modules_match_pytorch_on_every_device() {
    let Some((dir, cases)) = cases() else { return };
    ferrite_test_support::for_each_device_where(
        |d| !matches!(d, Device::Meta),
        |dev| {
            for c in &cases {
                let (op, a, name) = (c["op"].as_str().unwrap(), &c["attrs"], c["name"].as_str().unwrap());
                let (rtol, atol) = (c["rtol"].as_f64().unwrap(), c["atol"].as_f64().unwrap());
                let fx = load_safetensors(&dir.join(format!("{name}.safetensors")));
                let m = module_for(op, a, &fx, dev);
                let x = get(&fx, "input.0").to_device(dev).unwrap().requires_grad_(true).unwrap();
                let y = m.forward(&x).unwrap_or_else(|e| panic!("{dev} {name}: {e}"));
                assert_close(&format!("{dev} {name} output"), &y, get(&fx, "output"), rtol, atol);
                let buffers = m.state_dict();
                for extra in c["extra_outputs"].as_array().unwrap() {
                    let extra = extra.as_str().unwrap();
                    let got =
                        buffers.get(extra).unwrap_or_else(|| panic!("{name}: the module has no buffer `{extra}`"));
                    assert_close(
                        &format!("{dev} {name} {extra}"),
                        got,
                        get(&fx, &format!("extra.{extra}")),
                        rtol,
                        atol,
                    );
                }
                y.backward_with(&get(&fx, "grad_output").to_device(dev).unwrap(), false).unwrap();
                let params = m.named_parameters();
                for i in c["grad_inputs"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize) {
                    // Input 0 is the layer's input; the others are its parameters in PyTorch's
                    // argument order (weight, then bias).
                    let t = if i == 0 { x.clone() } else { params[i - 1].1.clone() };
                    let g = t.grad().unwrap_or_else(|| panic!("{dev} {name}: input {i} has no gradient"));
                    assert_close(
                        &format!("{dev} {name} grad_input.{i}"),
                        &g,
                        get(&fx, &format!("grad_input.{i}")),
                        rtol,
                        atol,
                    );
                }
                println!("module parity {dev:<6} {name} ok");
            }
        },
    );
}

fn randn(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn_with(shape, DType::F32, &Device::Cpu, &mut Generator::new(seed)).unwrap()
}

/// Per-channel mean and biased variance of `(N, C, H, W)` (by tensor ops, as the reference).
fn channel_stats(x: &Tensor) -> (Vec<f64>, Vec<f64>) {
    let mean = x.mean_dims(&[0, 2, 3], false).unwrap().to_vec_f64().unwrap();
    let var = x.var_dims(&[0, 2, 3], 0, false).unwrap().to_vec_f64().unwrap();
    (mean, var)
}

fn close_vec(what: &str, got: &[f64], want: &[f64]) {
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= 1e-5 + 1e-5 * b.abs(), "{what}[{i}]: {a} vs {b}");
    }
}

#[test]
fn batch_norm_state_dict_counts_batches_and_eval_uses_running_stats() {
    let bn = BatchNorm2d::new(3).unwrap();
    let keys: Vec<String> = bn.state_dict().keys().map(String::from).collect();
    assert_eq!(keys, ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]);
    let x = randn(&[4, 3, 5, 5], 1).mul_scalar(2.0).unwrap().add_scalar(1.0).unwrap();
    bn.forward(&x).unwrap();
    bn.forward(&x).unwrap();
    let sd = bn.state_dict();
    assert_eq!(get(&sd, "num_batches_tracked").to_vec::<i64>().unwrap(), vec![2]);
    // Two updates with momentum 0.1 from zeros/ones.
    let (mean, var) = channel_stats(&x);
    let n = (4 * 5 * 5) as f64;
    let m1: Vec<f64> = mean.iter().map(|m| 0.1 * m).collect();
    let m2: Vec<f64> = m1.iter().zip(&mean).map(|(p, m)| 0.9 * p + 0.1 * m).collect();
    close_vec("running_mean", &get(&sd, "running_mean").to_vec_f64().unwrap(), &m2);
    let unbiased: Vec<f64> = var.iter().map(|v| v * n / (n - 1.0)).collect();
    let v1: Vec<f64> = unbiased.iter().map(|u| 0.9 + 0.1 * u).collect();
    let v2: Vec<f64> = v1.iter().zip(&unbiased).map(|(p, u)| 0.9 * p + 0.1 * u).collect();
    close_vec("running_var", &get(&sd, "running_var").to_vec_f64().unwrap(), &v2);

    // Round trip into a fresh layer; eval mode normalises with the loaded running statistics
    // and changes nothing.
    let mut fresh = BatchNorm2d::new(3).unwrap();
    fresh.load_state_dict(&sd, true).unwrap();
    fresh.eval();
    let z = randn(&[2, 3, 4, 4], 2);
    let y = fresh.forward(&z).unwrap();
    let rm = get(&sd, "running_mean").reshape(&[1, 3, 1, 1]).unwrap();
    let rv = get(&sd, "running_var").reshape(&[1, 3, 1, 1]).unwrap();
    let want = z.sub(&rm).unwrap().div(&rv.add_scalar(1e-5).unwrap().sqrt().unwrap()).unwrap();
    assert_close("eval output", &y, &want, 1e-5, 1e-5);
    let after = fresh.state_dict();
    assert_eq!(get(&after, "num_batches_tracked").to_vec::<i64>().unwrap(), vec![2], "eval does not count");
    assert_close("eval keeps running_mean", get(&after, "running_mean"), get(&sd, "running_mean"), 0.0, 0.0);
}

#[test]
fn momentum_none_is_a_cumulative_average_and_untracked_stats_use_the_batch() {
    let cfg = BatchNormConfig::default().momentum(None);
    let bn = BatchNorm2d::with_config(2, &cfg, &Device::Cpu).unwrap();
    let (a, b) = (randn(&[3, 2, 4, 4], 3), randn(&[3, 2, 4, 4], 4).add_scalar(5.0).unwrap());
    bn.forward(&a).unwrap();
    bn.forward(&b).unwrap();
    let (ma, _) = channel_stats(&a);
    let (mb, _) = channel_stats(&b);
    let want: Vec<f64> = ma.iter().zip(&mb).map(|(x, y)| (x + y) / 2.0).collect();
    close_vec("cumulative running_mean", &bn.running_mean.as_ref().unwrap().to_vec_f64().unwrap(), &want);

    let mut untracked =
        BatchNorm2d::with_config(2, &BatchNormConfig::default().track_running_stats(false), &Device::Cpu).unwrap();
    assert_eq!(untracked.state_dict().keys().collect::<Vec<_>>(), ["weight", "bias"]);
    let train = untracked.forward(&b).unwrap();
    untracked.eval();
    assert_close("eval without tracking = batch statistics", &untracked.forward(&b).unwrap(), &train, 0.0, 0.0);
}

#[test]
fn a_small_cnn_head_trains_through_every_layer() {
    let mut g = Generator::new(0);
    let cpu = Device::Cpu;
    let model = Sequential::new()
        .append(BatchNorm2d::new(3).unwrap())
        .append(GroupNorm::new(3, 3).unwrap())
        .append(MaxPool2d::new(2).unwrap())
        .append(AvgPool2d::new(2).unwrap().padding(1).unwrap())
        .append(AdaptiveAvgPool2d::new(2))
        .append(Flatten::new())
        .append(RMSNorm::new(&[12]).unwrap())
        .append(Linear::new_with(12, 4, true, &cpu, &mut g).unwrap());
    let keys: Vec<String> = model.state_dict().keys().map(String::from).collect();
    assert_eq!(
        keys,
        [
            "0.weight",
            "0.bias",
            "0.running_mean",
            "0.running_var",
            "0.num_batches_tracked",
            "1.weight",
            "1.bias",
            "6.weight",
            "7.weight",
            "7.bias"
        ]
    );
    let x = randn(&[4, 3, 8, 8], 5);
    let y = model.forward(&x).unwrap();
    assert_eq!(y.shape(), &[4, 4]);
    y.square().unwrap().mean().unwrap().backward().unwrap();
    for (name, p) in model.named_parameters() {
        let g = p.grad().unwrap_or_else(|| panic!("{name} has no gradient"));
        assert!(g.to_vec_f64().unwrap().iter().all(|v| v.is_finite()), "{name}");
    }
}

/// The layers on `meta`: a model of all of them runs forward and backward with the shapes and
/// the peak allocated bytes of the same step on a real (sim) device, so the planner predicts it.
#[test]
fn every_layer_runs_on_meta_with_the_real_allocations() {
    let step = |dev: &Device| {
        let mut g = Generator::new(0);
        let mut model = Sequential::new()
            .append(BatchNorm2d::with_config(3, &BatchNormConfig::default().momentum(None), &Device::Cpu).unwrap())
            .append(GroupNorm::new(3, 3).unwrap())
            .append(MaxPool2d::new(2).unwrap())
            .append(AvgPool2d::new(2).unwrap().padding(1).unwrap())
            .append(AdaptiveAvgPool2d::new(2))
            .append(Flatten::new())
            .append(BatchNorm1d::new(12).unwrap())
            .append(RMSNorm::new(&[12]).unwrap())
            .append(Linear::new_with(12, 4, true, &Device::Cpu, &mut g).unwrap());
        model.to_device(dev).unwrap();
        let x = randn(&[4, 3, 8, 8], 6).to_device(dev).unwrap();
        let alloc = ferrite_memory::allocator(dev);
        let base = alloc.memory_allocated();
        alloc.reset_peak_memory_stats();
        let y = model.forward(&x).unwrap();
        y.sum().unwrap().backward().unwrap();
        let peak = alloc.max_memory_allocated() - base;
        let grads: Vec<Vec<usize>> = model.parameters().iter().map(|p| p.grad().unwrap().shape().to_vec()).collect();
        (y.shape().to_vec(), grads, peak)
    };
    let real = step(&Device::parse("sim:1GiB:0").unwrap());
    let meta = step(&Device::Meta);
    println!("peak allocated of the step: sim {} B, meta {} B", real.2, meta.2);
    assert_eq!(meta.0, [4, 4]);
    assert_eq!(real, meta);
}
