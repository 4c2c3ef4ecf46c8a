//! The normalisation and pooling cases of the PyTorch reference fixtures' `models/` folder
//! (`batch_norm1d`, `batch_norm2d`, `group_norm`, `rms_norm`, `max_pool2d`, `avg_pool2d`,
//! `adaptive_avg_pool2d`) through `ferrite_tensor::functional`, on every device under test
//! (`FERRITE_TEST_DEVICES`, default cpu and every GPU adapter): the output, every gradient listed
//! in `grad_inputs` and every `extra_outputs` tensor (batch norm's running statistics after one
//! training-mode forward) within the case's rtol/atol. Every value — inputs, attributes, running
//! statistics before the forward, expected results, tolerances — is read from the fixture files
//! (running statistics default to PyTorch's initial zeros/ones when a case does not list them).
//! A case of these ops without a runner fails the test, so new fixture cases cannot be skipped.
//!
//! Options the fixtures do not exercise (ceil_mode, dilation, count_include_pad, divisor_override,
//! non-dividing adaptive windows, batch norm without affine or running statistics, half
//! precision) are checked across devices instead: every device under test must agree with the
//! CPU backend, whose window arithmetic the unit tests check by hand.

use ferrite_tensor::functional::{
    AvgPool2dOptions, BatchNormOptions, MaxPool2dOptions, adaptive_avg_pool2d, avg_pool2d, batch_norm, group_norm,
    max_pool2d, rms_norm,
};
use ferrite_tensor::{DType, Device, Tensor};
use ferrite_test_support::assert_close;
use ferrite_test_support::fixtures::{get, load_f32, model_cases};
use serde_json::Value;

const OPS: [&str; 7] =
    ["batch_norm1d", "batch_norm2d", "group_norm", "rms_norm", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"];

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

#[test]
fn norm_and_pool_cases_match_pytorch_on_every_device() {
    let Some((dir, cases)) = model_cases(&OPS) else { return };
    for op in OPS {
        assert!(cases.iter().any(|c| c["op"] == op), "no fixture case for {op}");
    }
    ferrite_test_support::for_each_device_where(
        |d| !matches!(d, Device::Meta),
        |dev| {
            for c in &cases {
                let name = c["name"].as_str().unwrap();
                let (rtol, atol) = (c["rtol"].as_f64().unwrap(), c["atol"].as_f64().unwrap());
                let fx = load_f32(&dir.join(format!("{name}.safetensors")));
                let grads: Vec<u64> =
                    c["grad_inputs"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
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
                    let got =
                        &extras.iter().find(|(n, _)| n == extra).unwrap_or_else(|| panic!("{name}: no `{extra}`")).1;
                    let want = get(&fx, &format!("extra.{extra}"));
                    worst = worst.max(assert_close(&format!("{dev} {name} extra.{extra}"), got, want, rtol, atol));
                }
                out.backward_with(&get(&fx, "grad_output").to_device(dev).unwrap(), false).unwrap();
                for i in &grads {
                    let g =
                        inputs[*i as usize].grad().unwrap_or_else(|| panic!("{dev} {name}: input {i} has no gradient"));
                    let want = get(&fx, &format!("grad_input.{i}"));
                    worst = worst.max(assert_close(&format!("{dev} {name} grad_input.{i}"), &g, want, rtol, atol));
                }
                println!("norm/pool parity {dev:<6} {name:<28} ok (max |diff| {worst:.2e}, rtol {rtol}, atol {atol})");
            }
        },
    );
}

/// One forward + backward on `dev` of `f` applied to copies of `inputs` (all requiring grad):
/// the output and every input's gradient, read back to the CPU as f64.
fn run_on(name: &str, dev: &Device, inputs: &[Tensor], f: &dyn Fn(&[Tensor]) -> Tensor) -> Vec<Vec<f64>> {
    // Fresh leaves on every device (never the caller's handles, which would share the grads).
    let xs: Vec<Tensor> = inputs
        .iter()
        .map(|t| t.detach().deep_clone().unwrap().to_device(dev).unwrap().requires_grad_(true).unwrap())
        .collect();
    let y = f(&xs);
    // A fixed, non-uniform upstream gradient so every route through the op is weighted.
    let n = y.numel();
    let g: Vec<f32> = (0..n).map(|i| ((i * 7) % 11) as f32 / 11.0 - 0.3).collect();
    let gt = Tensor::from_vec(g, y.shape(), &Device::Cpu).unwrap().to_dtype(y.dtype()).unwrap().to_device(dev).unwrap();
    y.backward_with(&gt, false).unwrap();
    let mut out = vec![y.to_vec_f64().unwrap()];
    out.extend(xs.iter().enumerate().map(|(i, x)| {
        x.grad().unwrap_or_else(|| panic!("{dev} {name}: input {i} has no gradient")).to_vec_f64().unwrap()
    }));
    out
}

#[test]
fn options_beyond_the_fixtures_agree_across_devices() {
    type Op = Box<dyn Fn(&[Tensor]) -> Tensor>;
    let mut g = ferrite_tensor::Generator::new(7);
    let mut rand = |shape: &[usize], dtype: DType| {
        Tensor::randn_with(shape, DType::F32, &Device::Cpu, &mut g).unwrap().to_dtype(dtype).unwrap()
    };
    let dilated = MaxPool2dOptions {
        stride: Some([2, 1]),
        padding: [1, 1],
        dilation: [2, 2],
        ceil_mode: true,
        ..MaxPool2dOptions::new([3, 3])
    };
    let overlapping = MaxPool2dOptions { stride: Some([1, 1]), ..MaxPool2dOptions::new([2, 3]) };
    let avg_ceil = AvgPool2dOptions {
        stride: Some([2, 2]),
        padding: [1, 1],
        ceil_mode: true,
        count_include_pad: false,
        ..AvgPool2dOptions::new([3, 3])
    };
    let avg_div = AvgPool2dOptions {
        stride: Some([1, 2]),
        padding: [1, 1],
        divisor_override: Some(5),
        ..AvgPool2dOptions::new([2, 3])
    };
    let cases: Vec<(&str, Vec<Tensor>, Op, f64)> = vec![
        (
            "max_pool2d dilated ceil",
            vec![rand(&[2, 3, 9, 10], DType::F32)],
            Box::new(move |x| max_pool2d(&x[0], &dilated).unwrap()),
            1e-6,
        ),
        (
            "max_pool2d overlapping",
            vec![rand(&[3, 7, 6], DType::F32)],
            Box::new(move |x| max_pool2d(&x[0], &overlapping).unwrap()),
            1e-6,
        ),
        (
            "max_pool2d f16",
            vec![rand(&[2, 2, 6, 6], DType::F16)],
            Box::new(move |x| max_pool2d(&x[0], &overlapping).unwrap()),
            1e-3,
        ),
        (
            "avg_pool2d ceil no pad count",
            vec![rand(&[2, 3, 9, 8], DType::F32)],
            Box::new(move |x| avg_pool2d(&x[0], &avg_ceil).unwrap()),
            1e-5,
        ),
        (
            "avg_pool2d divisor_override",
            vec![rand(&[2, 3, 7, 8], DType::F32)],
            Box::new(move |x| avg_pool2d(&x[0], &avg_div).unwrap()),
            1e-5,
        ),
        (
            "adaptive_avg_pool2d 7x9->4x5",
            vec![rand(&[2, 3, 7, 9], DType::F32)],
            Box::new(|x| adaptive_avg_pool2d(&x[0], [Some(4), Some(5)]).unwrap()),
            1e-5,
        ),
        (
            "adaptive_avg_pool2d keep height",
            vec![rand(&[3, 5, 6], DType::F32)],
            Box::new(|x| adaptive_avg_pool2d(&x[0], [None, Some(4)]).unwrap()),
            1e-5,
        ),
        (
            "batch_norm (N, C, L) train, running stats, affine",
            vec![rand(&[4, 3, 5], DType::F32), rand(&[3], DType::F32), rand(&[3], DType::F32)],
            Box::new(|x| {
                let dev = x[0].device();
                let (rm, rv) =
                    (Tensor::zeros(&[3], DType::F32, dev).unwrap(), Tensor::ones(&[3], DType::F32, dev).unwrap());
                let opts = BatchNormOptions { training: true, momentum: 0.3, eps: 1e-3 };
                let y = batch_norm(&x[0], Some(&rm), Some(&rv), Some(&x[1]), Some(&x[2]), &opts).unwrap();
                // The running statistics join the compared values through the output.
                y.add(&rm.unsqueeze(1).unwrap()).unwrap().add(&rv.unsqueeze(1).unwrap()).unwrap()
            }),
            1e-4,
        ),
        (
            "batch_norm (N, C) eval, no affine",
            vec![rand(&[6, 4], DType::F32)],
            Box::new(|x| {
                let dev = x[0].device();
                let rm = Tensor::from_vec(vec![0.5f32, -1.0, 0.0, 2.0], &[4], dev).unwrap();
                let rv = Tensor::from_vec(vec![1.5f32, 0.25, 1.0, 4.0], &[4], dev).unwrap();
                batch_norm(&x[0], Some(&rm), Some(&rv), None, None, &BatchNormOptions::default()).unwrap()
            }),
            1e-5,
        ),
        (
            "batch_norm train without running stats",
            vec![rand(&[3, 2, 4, 4], DType::F32), rand(&[2], DType::F32)],
            Box::new(|x| {
                batch_norm(
                    &x[0],
                    None,
                    None,
                    Some(&x[1]),
                    None,
                    &BatchNormOptions { training: true, ..Default::default() },
                )
                .unwrap()
            }),
            1e-4,
        ),
        (
            "group_norm G=1 no affine",
            vec![rand(&[2, 6, 3, 3], DType::F32)],
            Box::new(|x| group_norm(&x[0], 1, None, None, 1e-5).unwrap()),
            1e-4,
        ),
        (
            "group_norm G=C (N, C, L)",
            vec![rand(&[3, 4, 7], DType::F32), rand(&[4], DType::F32), rand(&[4], DType::F32)],
            Box::new(|x| group_norm(&x[0], 4, Some(&x[1]), Some(&x[2]), 1e-5).unwrap()),
            1e-4,
        ),
        (
            "group_norm f16",
            vec![rand(&[2, 4, 5], DType::F16)],
            Box::new(|x| group_norm(&x[0], 2, None, None, 1e-5).unwrap()),
            2e-2,
        ),
        (
            "rms_norm 2-D shape no weight",
            vec![rand(&[3, 4, 5], DType::F32)],
            Box::new(|x| rms_norm(&x[0], &[4, 5], None, None).unwrap()),
            1e-5,
        ),
        (
            "rms_norm bf16 weight",
            vec![rand(&[5, 8], DType::BF16), rand(&[8], DType::BF16)],
            Box::new(|x| rms_norm(&x[0], &[8], Some(&x[1]), Some(1e-5)).unwrap()),
            5e-2,
        ),
    ];
    let wants: Vec<_> =
        cases.iter().map(|(name, inputs, op, _)| run_on(name, &Device::Cpu, inputs, op.as_ref())).collect();
    ferrite_test_support::for_each_device_where(
        |d| !matches!(d, Device::Cpu | Device::Meta),
        |dev| {
            for ((name, inputs, op, tol), want) in cases.iter().zip(&wants) {
                let got = run_on(name, dev, inputs, op.as_ref());
                for (k, (g, w)) in got.iter().zip(want).enumerate() {
                    assert_eq!(g.len(), w.len(), "{dev} {name}: result {k} length");
                    for (i, (a, b)) in g.iter().zip(w).enumerate() {
                        let ok = (a - b).abs() <= tol + tol * b.abs() || (a.is_nan() && b.is_nan());
                        assert!(ok, "{dev} {name}: result {k} element {i} is {a}, cpu {b}");
                    }
                }
                println!("{dev} agrees with cpu: {name}");
            }
        },
    );
}
