//! Autograd behaviour seen from outside: in-place detection, no_grad, memory returning to the
//! allocator, retain_graph, accumulation. Each test uses its own `sim:` device so the allocator
//! statistics it reads are its own even though tests run in parallel threads.

use ferrite_memory::allocator;
use ferrite_tensor::{DType, Device, Tensor, TensorError, no_grad};

fn dev(i: usize) -> Device {
    Device::parse(&format!("sim:1GiB:{i}")).unwrap()
}

#[test]
fn inplace_on_saved_tensor_is_an_error_naming_the_op() {
    let d = dev(1);
    let w = Tensor::randn(&[4, 4], DType::F32, &d).unwrap().requires_grad_(true).unwrap();
    let x = Tensor::randn(&[4, 4], DType::F32, &d).unwrap();
    let y = w.mul(&x).unwrap();
    x.mul_scalar_(2.0).unwrap(); // x was saved by MulBackward0 for w's gradient
    let err = y.sum().unwrap().backward().unwrap_err();
    match &err {
        TensorError::ModifiedByInplace { op, current, saved, .. } => {
            assert_eq!(op, "MulBackward0");
            assert_eq!((*saved, *current), (0, 1));
        }
        other => panic!("expected ModifiedByInplace, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("modified by an inplace operation") && msg.contains("MulBackward0"), "{msg}");
}

/// `copy_from_slice` writes host values in place like any in-place op: it bumps the version (a
/// graph that saved the tensor refuses backward), refuses a leaf that requires grad, and checks
/// dtype, contiguity and length with typed errors.
#[test]
fn copy_from_slice_is_an_inplace_write_with_version_and_checks() {
    let d = dev(40);
    let w = Tensor::randn(&[2, 3], DType::F32, &d).unwrap().requires_grad_(true).unwrap();
    let x = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    let y = w.mul(&x).unwrap();
    x.copy_from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert!(matches!(y.sum().unwrap().backward(), Err(TensorError::ModifiedByInplace { .. })));
    assert!(matches!(w.copy_from_slice(&[0.0f32; 6]), Err(TensorError::InplaceOnLeaf { .. })));
    assert!(matches!(x.copy_from_slice(&[0.0f64; 6]), Err(TensorError::DTypeMismatch { .. })));
    assert!(matches!(x.copy_from_slice(&[0.0f32; 5]), Err(TensorError::DataLength { .. })));
    let t = x.transpose(0, 1).unwrap();
    assert!(matches!(t.copy_from_slice(&[0.0f32; 6]), Err(TensorError::NotContiguous { .. })));
}

#[test]
fn inplace_on_leaf_requiring_grad_is_refused_outside_no_grad() {
    let d = dev(2);
    let w = Tensor::ones(&[3], DType::F32, &d).unwrap().requires_grad_(true).unwrap();
    assert!(matches!(w.add_scalar_(1.0), Err(TensorError::InplaceOnLeaf { .. })));
    let _g = no_grad();
    w.add_scalar_(1.0).unwrap();
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![2.0; 3]);
}

#[test]
fn no_grad_records_no_graph_and_keeps_no_activations() {
    let d = dev(3);
    let a = allocator(&d);
    let w = Tensor::randn(&[256, 256], DType::F32, &d).unwrap().requires_grad_(true).unwrap();
    let x = Tensor::randn(&[64, 256], DType::F32, &d).unwrap();
    let base = a.memory_allocated();
    {
        let _g = no_grad();
        let h = x.matmul(&w).unwrap().relu().unwrap();
        let y = h.matmul(&w).unwrap().tanh().unwrap();
        assert!(y.grad_fn().is_none() && !y.requires_grad());
        drop(h);
        // Only y itself is alive: intermediates were freed as soon as they went out of use.
        assert_eq!(a.memory_allocated() - base, (64 * 256 * 4) as u64);
    }
    let h = x.matmul(&w).unwrap().relu().unwrap();
    let y = h.matmul(&w).unwrap().tanh().unwrap();
    assert!(y.grad_fn().is_some());
    assert!(a.memory_allocated() - base > (64 * 256 * 4) as u64, "with grad the graph holds activations");
}

#[test]
fn dropping_the_graph_returns_memory_to_baseline() {
    let d = dev(4);
    let a = allocator(&d);
    let w1 = Tensor::randn(&[64, 128], DType::F32, &d).unwrap().requires_grad_(true).unwrap();
    let w2 = Tensor::randn(&[128, 10], DType::F32, &d).unwrap().requires_grad_(true).unwrap();
    let base = a.memory_allocated();
    for _ in 0..3 {
        let x = Tensor::randn(&[32, 64], DType::F32, &d).unwrap();
        let loss = x.matmul(&w1).unwrap().gelu().unwrap().matmul(&w2).unwrap().log_softmax(1).unwrap().mean().unwrap();
        let total = loss.item().unwrap(); // a plain f64: cannot hold the graph
        assert!(total.is_finite());
        loss.backward().unwrap();
        assert!(w1.grad().is_some() && w2.grad().is_some());
        drop((loss, x));
        w1.set_grad(None).unwrap();
        w2.set_grad(None).unwrap();
        assert_eq!(a.memory_allocated(), base, "graph, activations and grads must all be returned");
    }
}

#[test]
fn saved_tensors_are_released_during_backward_and_second_backward_needs_retain_graph() {
    let d = dev(5);
    let x = Tensor::randn(&[8], DType::F32, &d).unwrap().requires_grad_(true).unwrap();
    let y = x.exp().unwrap().sum().unwrap();
    y.backward_retain().unwrap();
    y.backward().unwrap();
    let g = x.grad().unwrap().to_vec::<f32>().unwrap();
    let e = x.exp().unwrap().to_vec::<f32>().unwrap();
    for (g, e) in g.iter().zip(&e) {
        assert!((g - 2.0 * e).abs() < 1e-5, "gradients accumulate across backward calls");
    }
    let err = y.backward().unwrap_err();
    assert!(matches!(err, TensorError::GraphReleased { .. }), "{err}");
}

#[test]
fn grads_accumulate_and_non_leaf_grads_need_retain_grad() {
    let d = dev(6);
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3], &d).unwrap().requires_grad_(true).unwrap();
    let h = x.mul_scalar(2.0).unwrap();
    h.retain_grad();
    let y = h.mul(&h).unwrap().sum().unwrap();
    y.backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), vec![8.0, 16.0, 24.0]);
    assert_eq!(h.grad().unwrap().to_vec::<f32>().unwrap(), vec![4.0, 8.0, 12.0]);
    let z = x.mul_scalar(2.0).unwrap();
    z.sum().unwrap().backward().unwrap();
    assert!(z.grad().is_none());
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), vec![10.0, 18.0, 26.0]);
}

#[test]
fn backward_without_grad_is_a_clear_error() {
    let d = dev(7);
    let x = Tensor::ones(&[2], DType::F32, &d).unwrap();
    let err = x.sum().unwrap().backward().unwrap_err();
    assert!(err.to_string().contains("does not require grad"), "{err}");
    let y = x.requires_grad_(true).unwrap().mul_scalar(3.0).unwrap();
    assert!(y.backward().unwrap_err().to_string().contains("scalar outputs"));
}

#[test]
fn shape_and_device_errors_name_the_op_and_shapes() {
    let a = Tensor::ones(&[2, 3], DType::F32, &dev(8)).unwrap();
    let b = Tensor::ones(&[4, 5], DType::F32, &dev(8)).unwrap();
    let e = a.add(&b).unwrap_err().to_string();
    assert!(e.contains("add") && e.contains("[2, 3]") && e.contains("[4, 5]"), "{e}");
    let e = a.matmul(&b).unwrap_err().to_string();
    assert!(e.contains("2x3") && e.contains("4x5"), "{e}");
    let c = Tensor::ones(&[2, 3], DType::F32, &Device::Cpu).unwrap();
    let e = a.add(&c).unwrap_err().to_string();
    assert!(e.contains("cpu") && e.contains("sim:"), "{e}");
    let e = a.sum_dims(&[5], false).unwrap_err().to_string();
    assert!(e.contains("out of range"), "{e}");
}

#[test]
fn oom_is_a_typed_error_not_a_panic() {
    let d = Device::parse("sim:64MiB:9").unwrap();
    let err = Tensor::zeros(&[1 << 30], DType::F32, &d).unwrap_err();
    assert!(err.oom_report().is_some(), "{err}");
    assert!(err.to_string().contains("out of memory"), "{err}");
    // The device keeps working.
    Tensor::zeros(&[16], DType::F32, &d).unwrap();
}

#[test]
fn chunked_attention_matches_naive_attention_and_its_gradients() {
    use ferrite_tensor::functional::{scaled_dot_product_attention, scaled_dot_product_attention_chunked};
    let d = dev(10);
    let mk = || Tensor::randn(&[2, 3, 40, 8], DType::F64, &d).unwrap().requires_grad_(true).unwrap();
    let (q, k, v) = (mk(), mk(), mk());
    let naive = scaled_dot_product_attention(&q, &k, &v, None, true, None).unwrap();
    let go = Tensor::randn(naive.shape(), DType::F64, &d).unwrap();
    naive.backward_with(&go, false).unwrap();
    let grads: Vec<Vec<f64>> = [&q, &k, &v].iter().map(|t| t.grad().unwrap().to_vec::<f64>().unwrap()).collect();
    for t in [&q, &k, &v] {
        t.set_grad(None).unwrap();
    }
    let chunked = scaled_dot_product_attention_chunked(&q, &k, &v, None, true, None, 7).unwrap();
    chunked.backward_with(&go, false).unwrap();
    let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9);
    assert!(close(&naive.to_vec::<f64>().unwrap(), &chunked.to_vec::<f64>().unwrap()));
    for (t, g) in [&q, &k, &v].iter().zip(&grads) {
        assert!(close(&t.grad().unwrap().to_vec::<f64>().unwrap(), g));
    }
}

#[test]
fn copy_across_devices_converts_and_broadcasts_on_the_source_side() {
    // PyTorch's `dst.copy_(src)` with src on another device: what `load_state_dict` does with
    // weights read on the CPU.
    let d = dev(30);
    let a = allocator(&d);
    let dst = Tensor::zeros(&[3, 4], DType::F32, &d).unwrap();
    let (held, allocs) = (a.memory_allocated(), a.memory_stats().allocation.all.allocated);
    a.reset_peak_memory_stats();
    let src = Tensor::arange(0.0, 12.0, 1.0, DType::F64, &Device::Cpu).unwrap().reshape(&[3, 4]).unwrap();
    dst.copy_(&src).unwrap();
    assert_eq!(dst.to_vec::<f32>().unwrap(), (0..12).map(|v| v as f32).collect::<Vec<_>>());
    assert_eq!((a.max_memory_allocated(), a.memory_stats().allocation.all.allocated), (held, allocs));
    // Broadcast from a row on the host.
    let row = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4], &Device::Cpu).unwrap();
    dst.copy_(&row).unwrap();
    assert_eq!(dst.to_vec::<f32>().unwrap(), [1.0f32, 2.0, 3.0, 4.0].repeat(3));
    // A strided destination (a transposed view) on the device, and back to the host.
    let t = Tensor::zeros(&[4, 3], DType::F32, &d).unwrap();
    t.t().unwrap().copy_(&src).unwrap();
    assert_eq!(
        t.t().unwrap().contiguous().unwrap().to_vec::<f32>().unwrap(),
        src.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
    );
    dst.copy_(&src).unwrap();
    let host = Tensor::zeros(&[3, 4], DType::F64, &Device::Cpu).unwrap();
    host.copy_(&dst).unwrap();
    assert_eq!(host.to_vec::<f64>().unwrap(), src.to_vec::<f64>().unwrap());
    // The version moves as for any in-place write; a shape that does not broadcast is an error.
    let v = dst.storage().version();
    dst.copy_(&src).unwrap();
    assert_eq!(dst.storage().version(), v + 1);
    let bad = Tensor::zeros(&[5], DType::F32, &Device::Cpu).unwrap();
    assert!(dst.copy_(&bad).is_err());
}

/// `clamp` at its edges, as PyTorch documents it: `min(max(x, min), max)` — a `min` above `max`
/// sets every element to `max` — a NaN element stays NaN, a NaN bound makes the result NaN, and
/// the gradient passes only where `min <= x <= max` (nowhere when `min > max`). On every device.
#[test]
fn clamp_follows_pytorchs_rules_at_the_edges_on_every_device() {
    ferrite_test_support::for_each_device(|dev| {
        let x = Tensor::from_vec(vec![1.0f32, -2.0, f32::NAN, 3.0, 0.5, 5.0], &[6], dev).unwrap();
        let same = |got: Vec<f32>, want: [f32; 6], what: &str| {
            let ok = got.iter().zip(&want).all(|(a, b)| a == b || (a.is_nan() && b.is_nan()));
            assert!(ok, "{dev} {what}: {got:?}, expected {want:?}");
        };
        let nan = f32::NAN;
        same(x.clamp(Some(0.0), Some(2.0)).unwrap().to_vec().unwrap(), [1.0, 0.0, nan, 2.0, 0.5, 2.0], "clamp(0, 2)");
        same(x.clamp(Some(3.0), Some(1.0)).unwrap().to_vec().unwrap(), [1.0, 1.0, nan, 1.0, 1.0, 1.0], "clamp(3, 1)");
        same(x.clamp(Some(f64::NAN), None).unwrap().to_vec().unwrap(), [nan; 6], "clamp(min=nan)");
        same(x.clamp(Some(0.0), Some(f64::NAN)).unwrap().to_vec().unwrap(), [nan; 6], "clamp(0, nan)");
        let leaf = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, 0.5], &[4], dev).unwrap().requires_grad_(true).unwrap();
        leaf.clamp(Some(3.0), Some(1.0)).unwrap().sum().unwrap().backward().unwrap();
        assert_eq!(leaf.grad().unwrap().to_vec::<f32>().unwrap(), vec![0.0; 4], "{dev}: no gradient when min > max");
        let ints = Tensor::from_vec(vec![1i64, 5, 9], &[3], dev).unwrap();
        assert_eq!(ints.clamp(Some(6.0), Some(2.0)).unwrap().to_vec::<i64>().unwrap(), vec![2, 2, 2], "{dev}: ints");
    });
}

/// PyTorch's softmax and log_softmax at the edges: a NaN or a +inf anywhere in a row makes the
/// whole row NaN, a row of -inf is NaN, and an element far below the row's maximum gives exactly
/// 0 (softmax) and a finite value (log_softmax). Rows of 37 elements run the kernels' vector lanes
/// and their tails. On every device.
#[test]
fn softmax_follows_pytorchs_rules_for_nan_inf_and_tiny_values_on_every_device() {
    ferrite_test_support::for_each_device(|dev| {
        let cols = 37;
        let mut rows = vec![0.25f32; 5 * cols];
        rows[20] = f32::NAN; // row 0: a NaN in the lanes
        rows[cols + 36] = f32::INFINITY; // row 1: +inf in the tail
        rows[2 * cols..3 * cols].fill(f32::NEG_INFINITY); // row 2: all -inf
        rows[3 * cols + 3] = -1000.0; // row 3: exp underflows to 0
        rows[4 * cols + 30] = -90.0; // row 4: exp is subnormal
        let x = Tensor::from_vec(rows.clone(), &[5, cols], dev).unwrap();
        for log in [false, true] {
            let y = if log { x.log_softmax(1) } else { x.softmax(1) }.unwrap().to_vec::<f32>().unwrap();
            let what = if log { "log_softmax" } else { "softmax" };
            for r in 0..3 {
                assert!(y[r * cols..(r + 1) * cols].iter().all(|v| v.is_nan()), "{dev} {what}: row {r} must be NaN");
            }
            for r in 3..5 {
                let row = &rows[r * cols..(r + 1) * cols];
                let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
                let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
                for (c, &got) in y[r * cols..(r + 1) * cols].iter().enumerate() {
                    let want = if log { row[c] as f64 - lse } else { (row[c] as f64 - lse).exp() };
                    let tol = 1e-6 * want.abs().max(1.0);
                    assert!((got as f64 - want).abs() <= tol, "{dev} {what} [{r}, {c}]: {got} vs {want}");
                }
            }
            if !log {
                assert_eq!(y[3 * cols + 3], 0.0, "{dev}: e^-1000 underflows to exactly 0");
            }
        }
    });
}
