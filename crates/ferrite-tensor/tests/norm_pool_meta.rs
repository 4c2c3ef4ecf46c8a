//! Normalisation and pooling on `meta`: every `models/` fixture case of batch, group and RMS
//! norm and of the 2-D poolings runs forward and backward on `meta`, giving the fixture's output
//! and gradient shapes, and the peak allocated bytes of the step equal those of the same step on
//! a real (sim) device — so the planner's prediction for a model with these layers is exact. Its
//! own test binary, so no other test touches the process-wide meta allocator meanwhile.

use ferrite_memory::allocator;
use ferrite_tensor::functional::{
    AvgPool2dOptions, BatchNormOptions, MaxPool2dOptions, adaptive_avg_pool2d, avg_pool2d, batch_norm, group_norm,
    max_pool2d, rms_norm,
};
use ferrite_tensor::{DType, Device, Tensor};
use ferrite_test_support::fixtures::{get, load_f32};
use serde_json::Value;

const OPS: [&str; 7] =
    ["batch_norm1d", "batch_norm2d", "group_norm", "rms_norm", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"];

fn pair(a: &Value, key: &str, default: [usize; 2]) -> [usize; 2] {
    match a.get(key).and_then(Value::as_array) {
        Some(v) => [v[0].as_u64().unwrap() as usize, v[1].as_u64().unwrap() as usize],
        None => a.get(key).and_then(Value::as_u64).map_or(default, |k| [k as usize; 2]),
    }
}

/// Forward + backward of one case on `dev`; returns (output shape, gradient shapes, peak bytes
/// allocated during the step above what the inputs hold).
fn step(c: &Value, fx: &[(String, Tensor)], dev: &Device) -> (Vec<usize>, Vec<Vec<usize>>, u64) {
    let a = &c["attrs"];
    let grads: Vec<u64> = c["grad_inputs"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    let x: Vec<Tensor> = (0..c["inputs"].as_u64().unwrap())
        .map(|i| {
            let t = get(fx, &format!("input.{i}")).to_device(dev).unwrap();
            if grads.contains(&i) { t.requires_grad_(true).unwrap() } else { t }
        })
        .collect();
    let go = get(fx, "grad_output").to_device(dev).unwrap();
    let ch = x[0].shape().get(1).copied().unwrap_or(1);
    let rm = Tensor::zeros(&[ch], DType::F32, dev).unwrap();
    let rv = Tensor::ones(&[ch], DType::F32, dev).unwrap();
    let alloc = allocator(dev);
    let base = alloc.memory_allocated();
    alloc.reset_peak_memory_stats();
    let kernel = pair(a, "kernel_size", [1, 1]);
    let out = match c["op"].as_str().unwrap() {
        "batch_norm1d" | "batch_norm2d" => {
            let opts = BatchNormOptions { training: a["training"].as_bool().unwrap_or(false), ..Default::default() };
            batch_norm(&x[0], Some(&rm), Some(&rv), x.get(1), x.get(2), &opts)
        }
        "group_norm" => group_norm(&x[0], a["num_groups"].as_u64().unwrap() as usize, x.get(1), x.get(2), 1e-5),
        "rms_norm" => {
            let shape: Vec<usize> =
                a["normalized_shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
            rms_norm(&x[0], &shape, x.get(1), None)
        }
        "max_pool2d" => {
            let opts = MaxPool2dOptions {
                stride: Some(pair(a, "stride", kernel)),
                padding: pair(a, "padding", [0, 0]),
                ..MaxPool2dOptions::new(kernel)
            };
            max_pool2d(&x[0], &opts)
        }
        "avg_pool2d" => {
            let opts = AvgPool2dOptions {
                stride: Some(pair(a, "stride", kernel)),
                padding: pair(a, "padding", [0, 0]),
                ..AvgPool2dOptions::new(kernel)
            };
            avg_pool2d(&x[0], &opts)
        }
        "adaptive_avg_pool2d" => {
            let s = pair(a, "output_size", [1, 1]);
            adaptive_avg_pool2d(&x[0], [Some(s[0]), Some(s[1])])
        }
        other => panic!("no runner for {other}"),
    }
    .unwrap_or_else(|e| panic!("{dev}: {e}"));
    out.backward_with(&go, false).unwrap();
    let peak = alloc.max_memory_allocated() - base;
    let grad_shapes = grads.iter().map(|&i| x[i as usize].grad().expect("a gradient").shape().to_vec()).collect();
    (out.shape().to_vec(), grad_shapes, peak)
}

#[test]
fn meta_gives_pytorch_shapes_and_the_real_allocations() {
    let Some((dir, cases)) = ferrite_test_support::fixtures::model_cases(&OPS) else { return };
    let sim = Device::parse("sim:1GiB:0").unwrap();
    let mut checked = 0;
    for c in &cases {
        let name = c["name"].as_str().unwrap();
        let fx = load_f32(&dir.join(format!("{name}.safetensors")));
        let (meta_out, meta_grads, meta_peak) = step(c, &fx, &Device::Meta);
        let (sim_out, sim_grads, sim_peak) = step(c, &fx, &sim);
        assert_eq!(meta_out, get(&fx, "output").shape(), "{name}: meta output shape");
        for (g, i) in meta_grads.iter().zip(c["grad_inputs"].as_array().unwrap()) {
            assert_eq!(g.as_slice(), get(&fx, &format!("grad_input.{i}")).shape(), "{name}: meta grad_input.{i} shape");
        }
        assert_eq!((meta_out, meta_grads), (sim_out, sim_grads), "{name}");
        assert_eq!(meta_peak, sim_peak, "{name}: peak allocated bytes, meta vs sim");
        println!("meta {name:<28} shapes ok, peak {meta_peak} B (sim {sim_peak} B)");
        checked += 1;
    }
    assert!(checked >= OPS.len(), "expected a case per op, ran {checked}");
}
