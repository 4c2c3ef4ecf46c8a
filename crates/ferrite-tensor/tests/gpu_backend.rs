//! The wgpu backend seen from outside: memory accounting on `gpu:N`, dtypes, random streams equal
//! to the CPU's, fused kernels, and every bad input as a typed error. Runs on every GPU adapter
//! this machine has (Mesa's lavapipe in CI); without one the tests skip loudly, and fail when
//! `FERRITE_REQUIRE_SYSTEM_DEPS=1` (CI installs the driver).

use ferrite_memory::{allocator, gpu};
use ferrite_tensor::backend::FusedKernel;
use ferrite_tensor::{DType, Device, Generator, Tensor, TensorError, no_grad};

/// Tests share one device (its allocator statistics, its error flag): they run one at a time.
static DEVICE_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The GPU devices under test, or `None` (after ferrite-test-support's skip-or-fail message)
/// when there are none.
fn gpus() -> Option<Vec<Device>> {
    let devices = ferrite_test_support::gpus_or_skip();
    if devices.is_empty() {
        return None;
    }
    eprintln!("gpu_backend devices: {}", devices.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "));
    Some(devices)
}

fn seq(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect()
}

#[test]
fn memory_is_accounted_returned_and_released() {
    let _serial = DEVICE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let Some(devices) = gpus() else { return };
    for d in &devices {
        let a = allocator(d);
        a.empty_cache();
        let base = a.memory_allocated();
        {
            let x = Tensor::from_slice(&seq(1000), &[10, 100], d).unwrap();
            let y = x.exp().unwrap().sum().unwrap();
            assert!(y.item().unwrap().is_finite());
            assert!(a.memory_allocated() > base, "{d}: tensors on the GPU are counted");
            assert!(a.memory_reserved() >= 2 << 20, "{d}: a small-pool segment (2 MiB) is reserved");
            assert!(gpu::context(d.index()).unwrap().live_buffers() > 0);
        }
        assert_eq!(a.memory_allocated(), base, "{d}: every block is returned when the tensors drop");
        a.empty_cache();
        assert_eq!(a.memory_reserved(), 0, "{d}: empty_cache releases every segment");
        assert_eq!(gpu::context(d.index()).unwrap().live_buffers(), 0, "{d}: and every wgpu buffer with it");
    }
}

#[test]
fn half_precision_storage_rounds_like_the_cpu() {
    let _serial = DEVICE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let Some(devices) = gpus() else { return };
    let x = Tensor::from_slice(&seq(999), &[999], &Device::Cpu).unwrap();
    for dtype in [DType::F16, DType::BF16] {
        let want = x
            .to_dtype(dtype)
            .unwrap()
            .mul(&x.to_dtype(dtype).unwrap())
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        for d in &devices {
            let g = x.to_device(d).unwrap().to_dtype(dtype).unwrap();
            let got = g.mul(&g).unwrap().to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(got, want, "{d} {dtype}: products of {dtype} values round to the same {dtype} as on the CPU");
        }
    }
}

#[test]
fn seeded_random_numbers_and_dropout_masks_equal_the_cpus() {
    let _serial = DEVICE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let Some(devices) = gpus() else { return };
    let cpu_u =
        Tensor::rand_with(&[4097], DType::F32, &Device::Cpu, &mut Generator::new(7)).unwrap().to_vec::<f32>().unwrap();
    let ones = Tensor::ones(&[3, 1001], DType::F32, &Device::Cpu).unwrap();
    let cpu_mask = ferrite_tensor::functional::dropout(&ones, 0.3, true, &mut Generator::new(11))
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for d in &devices {
        let u = Tensor::rand_with(&[4097], DType::F32, d, &mut Generator::new(7)).unwrap();
        assert_eq!(u.to_vec::<f32>().unwrap(), cpu_u, "{d}: uniform draws");
        let m = ferrite_tensor::functional::dropout(&ones.to_device(d).unwrap(), 0.3, true, &mut Generator::new(11))
            .unwrap();
        assert_eq!(m.to_vec::<f32>().unwrap(), cpu_mask, "{d}: dropout mask");
    }
}

#[test]
fn fused_optimizer_and_scaler_kernels_match_the_cpu() {
    let _serial = DEVICE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let Some(devices) = gpus() else { return };
    let p0 = seq(3000);
    let g0: Vec<f32> = seq(3000).iter().map(|v| v * 0.01).collect();
    let adam = FusedKernel::Adam {
        l2: None,
        decay: Some(1.0 - 1e-3 * 0.01),
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        bias_correction2_sqrt: (1.0f64 - 0.999).sqrt(),
        step_size: 1e-3 / (1.0 - 0.9),
        maximize: false,
        amsgrad: false,
    };
    let run = |d: &Device| -> Vec<Vec<f32>> {
        let p = Tensor::from_slice(&p0, &[3000], d).unwrap();
        let m = Tensor::zeros(&[3000], DType::F32, d).unwrap();
        let v = Tensor::zeros(&[3000], DType::F32, d).unwrap();
        let g = Tensor::from_slice(&g0, &[3000], d).unwrap();
        let _guard = no_grad();
        for _ in 0..3 {
            Tensor::fused(&adam, &[&p, &m, &v], &[&g]).unwrap();
        }
        [p, m, v].iter().map(|t| t.to_vec::<f32>().unwrap()).collect()
    };
    let want = run(&Device::Cpu);
    for d in &devices {
        let got = run(d);
        for (k, (a, b)) in got.iter().zip(&want).enumerate() {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert!((x - y).abs() <= 1e-6 + 1e-5 * y.abs(), "{d}: Adam operand {k} element {i}: {x} vs CPU {y}");
            }
        }
        // The GradScaler's check finds an inf and unscales the rest.
        let mut v = seq(5000);
        v[4321] = f32::INFINITY;
        let g = Tensor::from_slice(&v, &[5000], d).unwrap();
        let found = Tensor::fused(&FusedKernel::Unscale { inv_scale: 0.5 }, &[&g], &[]).unwrap();
        assert_eq!(found, 1.0, "{d}: inf found");
        assert_eq!(g.to_vec::<f32>().unwrap()[10], v[10] * 0.5);
        let clean = Tensor::from_slice(&seq(5000), &[5000], d).unwrap();
        assert_eq!(
            Tensor::fused(&FusedKernel::Unscale { inv_scale: 1.0 }, &[&clean], &[]).unwrap(),
            0.0,
            "{d}: nothing to find"
        );
        // A 2-norm, as clip_grad_norm_ computes it.
        let kind = ferrite_tensor::backend::NormKind::Two;
        let got = kind.finish(Tensor::fused(&FusedKernel::NormPartial { kind }, &[], &[&clean]).unwrap());
        let want = kind.finish(
            Tensor::fused(&FusedKernel::NormPartial { kind }, &[], &[&clean.to_device(&Device::Cpu).unwrap()]).unwrap(),
        );
        assert!((got - want).abs() <= 1e-5 * want, "{d}: norm {got} vs CPU {want}");
    }
}

#[test]
fn bad_input_gets_typed_errors() {
    let _serial = DEVICE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let Some(devices) = gpus() else { return };
    let n = gpu::list_adapters().len();
    // A GPU index past the last adapter.
    let missing = Device::Gpu { index: n + 6 };
    let err = Tensor::zeros(&[4], DType::F32, &missing).unwrap_err().to_string();
    assert!(
        err.contains(&format!("gpu:{}", n + 6)) && err.contains("gpu:0"),
        "names the missing device and what exists: {err}"
    );
    for d in &devices {
        // f64 has no WGSL type.
        let x = Tensor::from_slice(&[1.0f64, 2.0], &[2], d).unwrap();
        let e = x.exp().unwrap_err();
        assert!(matches!(e, TensorError::UnsupportedDType { dtype: DType::F64, .. }), "{d}: {e}");
        // An index out of range: kernels run asynchronously, so (as a CUDA device-side assert)
        // the error surfaces at the next synchronisation, with the numbers, and is then cleared.
        let table = Tensor::from_slice(&seq(12), &[4, 3], d).unwrap();
        let idx = Tensor::from_slice(&[0i64, 9], &[2], d).unwrap();
        let e = ferrite_tensor::functional::embedding(&idx, &table).and_then(|t| t.to_vec::<f32>()).unwrap_err();
        assert!(matches!(e, TensorError::IndexOutOfRange { index: 9, size: 4, .. }), "{d}: {e}");
        let total = table.sum().unwrap().item().unwrap();
        assert!(
            (total - seq(12).iter().map(|&v| v as f64).sum::<f64>()).abs() < 1e-4,
            "{d}: the device works on after the error ({total})"
        );
        // A tensor larger than one storage binding.
        let max = gpu::context(d.index()).unwrap().limits().max_storage_buffer_binding_size as usize;
        let max_buf = gpu::context(d.index()).unwrap().limits().max_buffer_size as usize;
        if max + 4096 <= max_buf && max < (1 << 31) {
            // The allocation itself succeeds (a buffer may exceed a binding); the first kernel
            // that would bind it refuses with the numbers.
            let e = Tensor::zeros(&[max / 4 + 1024], DType::F32, d).unwrap_err();
            assert!(matches!(e, TensorError::BindingTooLarge { .. }), "{d}: {e}");
            assert!(e.to_string().contains("max_storage_buffer_binding_size"), "{e}");
        }
        // A memory fraction needs a capacity; wgpu cannot tell one, so the error says how to give it.
        if std::env::var_os(gpu::GPU_MEMORY_ENV).is_none() && gpu::context(d.index()).unwrap().capacity().is_none() {
            let e = ferrite_memory::allocator(d).set_per_process_memory_fraction(0.5).unwrap_err().to_string();
            assert!(e.contains("FERRITE_GPU_MEMORY"), "{d}: {e}");
        }
    }
}

/// The gradients `[dx, dw, db]` of `layer_norm` over the last dim of `x [rows, cols]` on `device`,
/// through autograd (weight and bias where given; `dtype` the compute dtype).
fn layer_norm_grads(
    device: &Device,
    dtype: DType,
    x: &Tensor,
    w: Option<&Tensor>,
    b: Option<&Tensor>,
    dy: &Tensor,
) -> [Option<Tensor>; 3] {
    // Fresh leaves (detached copies), so a CPU run never marks the caller's tensors.
    let on = |t: &Tensor| t.detach().to_device(device).unwrap().to_dtype(dtype).unwrap().requires_grad_(true).unwrap();
    let (x, w, b) = (on(x), w.map(on), b.map(on));
    let cols = *x.shape().last().unwrap();
    let y = ferrite_tensor::functional::layer_norm(&x, &[cols], w.as_ref(), b.as_ref(), 1e-5).unwrap();
    y.backward_with(&dy.to_device(device).unwrap().to_dtype(dtype).unwrap(), false).unwrap();
    [x.grad(), w.and_then(|w| w.grad()), b.and_then(|b| b.grad())]
}

/// The backend's fused layer norm gradients on `device` for the 2-D `x`, `dy` (f32), with the
/// statistics from the backend's own forward kernel; `None` when the backend has no fused kernel.
fn fused_layer_norm_grads(
    device: &Device,
    x: &Tensor,
    w: Option<&Tensor>,
    dy: &Tensor,
    need: [bool; 3],
) -> Option<ferrite_tensor::backend::LayerNormGrads> {
    use ferrite_tensor::backend::{LayerNormArgs, LayerNormBackwardArgs, LayerNormParams, kernels_for};
    let (rows, cols) = (x.shape()[0], x.shape()[1]);
    let on = |t: &Tensor| t.to_device(device).unwrap();
    let (x, w, dy) = (on(x), w.map(on), on(dy));
    let y = Tensor::zeros(&[rows, cols], DType::F32, device).unwrap();
    let mean = Tensor::zeros(&[rows], DType::F32, device).unwrap();
    let rstd = Tensor::zeros(&[rows], DType::F32, device).unwrap();
    let kernels = kernels_for(device);
    let params = LayerNormParams { eps: 1e-5 };
    let args = LayerNormArgs { y: &y, x: &x, mean: &mean, rstd: &rstd, weight: w.as_ref(), bias: None, params };
    kernels.layer_norm(&args).unwrap();
    let need = [need[0], need[1] && w.is_some(), need[2]];
    let args = LayerNormBackwardArgs { grad_output: &dy, x: &x, mean: &mean, rstd: &rstd, weight: w.as_ref(), need };
    kernels.layer_norm_backward(&args).unwrap()
}

fn f32_bits(t: &Tensor) -> Vec<u32> {
    t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Layer norm's backward on a GPU is the backend's fused kernels — autograd gets the very bits
/// the backend's `layer_norm_backward` returns — and its gradients are PyTorch's (the
/// `layer_norm` case of the reference fixtures, at the case's tolerance).
#[test]
fn layer_norm_backward_is_fused_on_the_gpu_and_matches_pytorch() {
    let _serial = DEVICE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let Some(devices) = gpus() else { return };
    let Some(dir) = ferrite_test_support::reference_or_skip("ops/manifest.json") else { return };
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("ops/manifest.json")).unwrap()).unwrap();
    let case =
        manifest["cases"].as_array().unwrap().iter().find(|c| c["op"] == "layer_norm").expect("a layer_norm case");
    let (rtol, atol) = (case["rtol"].as_f64().unwrap(), case["atol"].as_f64().unwrap());
    assert_eq!(case["attrs"]["eps"].as_f64(), Some(1e-5), "the helpers above run eps 1e-5");
    let fx = ferrite_test_support::fixtures::load(&dir.join("ops/layer_norm.safetensors"));
    let get = |n: &str| ferrite_test_support::fixtures::get(&fx, n).clone();
    let (x, w, b, dy) = (get("input.0"), get("input.1"), get("input.2"), get("grad_output"));
    let cols = *x.shape().last().unwrap();
    let rows = x.numel() / cols;
    let flat = |t: &Tensor| t.reshape_usize(&[rows, cols]).unwrap();
    for d in &devices {
        let [gx, gw, gb] = layer_norm_grads(d, DType::F32, &x, Some(&w), Some(&b), &dy);
        let (gx, gw, gb) = (gx.unwrap(), gw.unwrap(), gb.unwrap());
        for (what, got, want) in [("dx", &gx, "grad_input.0"), ("dw", &gw, "grad_input.1"), ("db", &gb, "grad_input.2")]
        {
            ferrite_test_support::assert_close(&format!("{d} {what}"), got, &get(want), rtol, atol);
        }
        let fused = fused_layer_norm_grads(d, &flat(&x), Some(&w), &flat(&dy), [true; 3])
            .unwrap_or_else(|| panic!("{d}: the backend has no fused layer_norm_backward"));
        assert_eq!(f32_bits(&gx), f32_bits(fused.input.as_ref().unwrap()), "{d}: autograd took the fused dx");
        assert_eq!(f32_bits(&gw), f32_bits(fused.weight.as_ref().unwrap()), "{d}: autograd took the fused dw");
        assert_eq!(f32_bits(&gb), f32_bits(fused.bias.as_ref().unwrap()), "{d}: autograd took the fused db");
    }
}

/// Layer norm's fused GPU gradients agree with the CPU's (itself checked against PyTorch by the
/// parity suite) at widths below, at and past one workgroup (256) and not a multiple of it, at a
/// row count spanning many 64-row chunks of the parameter sums with a partial last one, with and
/// without weight or bias, in bf16 too; each gradient asked for alone has the bits of the full
/// call, and a second run has the bits of the first (fixed reduction orders).
#[test]
fn layer_norm_backward_on_the_gpu_matches_the_cpu_and_repeats_bit_for_bit() {
    let _serial = DEVICE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let Some(devices) = gpus() else { return };
    let mut g = Generator::new(11);
    // (rows, cols, weight, bias, dtype)
    let shapes = [
        (3usize, 1usize, true, true, DType::F32),
        (37, 300, true, true, DType::F32),
        (5000, 64, true, true, DType::F32),
        (8, 1000, false, false, DType::F32),
        (130, 70, true, false, DType::F32),
        (130, 70, false, true, DType::F32),
        (65, 256, true, true, DType::BF16),
    ];
    for (rows, cols, has_w, has_b, dtype) in shapes {
        let randn =
            |shape: &[usize], g: &mut Generator| Tensor::randn_with(shape, DType::F32, &Device::Cpu, g).unwrap();
        // A per-row offset and scale, so the statistics differ from 0 and 1.
        let x = randn(&[rows, cols], &mut g).mul(&randn(&[rows, 1], &mut g).exp().unwrap()).unwrap();
        let x = x.add(&randn(&[rows, 1], &mut g)).unwrap();
        let (w, b, dy) = (randn(&[cols], &mut g), randn(&[cols], &mut g), randn(&[rows, cols], &mut g));
        let (w, b) = (has_w.then_some(&w), has_b.then_some(&b));
        let what = format!("[{rows}, {cols}] weight {has_w} bias {has_b} {dtype:?}");
        let want = layer_norm_grads(&Device::Cpu, dtype, &x, w, b, &dy);
        let (rtol, atol) = if dtype == DType::F32 { (1e-4, 1e-3) } else { (2e-2, 5e-2) };
        for d in &devices {
            let got = layer_norm_grads(d, dtype, &x, w, b, &dy);
            let again = layer_norm_grads(d, dtype, &x, w, b, &dy);
            for (k, name) in ["dx", "dw", "db"].iter().enumerate() {
                assert_eq!(got[k].is_some(), want[k].is_some(), "{d} {what}: {name} present");
                if let (Some(got), Some(want), Some(again)) = (&got[k], &want[k], &again[k]) {
                    let (got32, want32) = (got.to_dtype(DType::F32).unwrap(), want.to_dtype(DType::F32).unwrap());
                    ferrite_test_support::assert_close(&format!("{d} {what} {name}"), &got32, &want32, rtol, atol);
                    assert_eq!(f32_bits(got), f32_bits(again), "{d} {what}: {name} repeats bit for bit");
                }
            }
            if dtype != DType::F32 {
                continue;
            }
            let full = fused_layer_norm_grads(d, &x, w, &dy, [true, true, has_b])
                .unwrap_or_else(|| panic!("{d} {what}: the backend has no fused layer_norm_backward"));
            assert_eq!(f32_bits(full.input.as_ref().unwrap()), f32_bits(got[0].as_ref().unwrap()), "{d} {what}: fused");
            for (k, need) in [[true, false, false], [false, true, false], [false, false, true]].into_iter().enumerate()
            {
                let one = fused_layer_norm_grads(d, &x, w, &dy, [need[0], need[1], need[2] && has_b]).unwrap();
                let (a, f) = match k {
                    0 => (one.input, &full.input),
                    1 => (one.weight, &full.weight),
                    _ => (one.bias, &full.bias),
                };
                assert_eq!(a.is_some(), f.is_some(), "{d} {what}: gradient {k} alone");
                if let (Some(a), Some(f)) = (a, f) {
                    assert_eq!(f32_bits(&a), f32_bits(f), "{d} {what}: gradient {k} alone has the full call's bits");
                }
            }
        }
    }
}
