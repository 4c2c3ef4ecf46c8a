//! What the CUDA kernels compute, checked without a GPU: every kernel source of `kernels/` is
//! compiled for the CPU with `emulator/cuda_on_host.h` (blocks one after another, a block's threads
//! on OS threads sharing `__shared__` memory and a `__syncthreads` barrier) and run on the PyTorch
//! reference cases — elementwise ops with broadcasting, row reductions, softmax and its backward,
//! cross entropy, layer norm (forward, input and affine gradients), RMS norm, embedding and its
//! gradient — within each case's tolerances, plus the device-side error flags (a class or an
//! index out of range) and the fused optimizer steps against PyTorch's update rules written out
//! in f64. Launches use small grids and blocks so the grid-stride loops run more than once.
//!
//! Skips loudly without a C++20 compiler (fails under `FERRITE_REQUIRE_SYSTEM_DEPS=1`; CI
//! installs g++) and without the fixtures.

mod emulator;

use std::path::{Path, PathBuf};

use emulator::{HostKernels, Launch, Shared};
use ferrite_tensor::Tensor;
use ferrite_test_support::assert_slices_close;
use ferrite_test_support::fixtures::{get, load};
use serde_json::Value;

/// The fixture folder, or `None` after the skip rule (also when there is no C++ compiler).
fn setup() -> Option<PathBuf> {
    if !emulator::compiler_or_skip() {
        return None;
    }
    ferrite_test_support::reference_or_skip("ops/manifest.json")
}

/// The `ops/` case `name`: its tensors, attributes and tolerances.
struct Case {
    fx: Vec<(String, Tensor)>,
    attrs: Value,
    rtol: f32,
    atol: f32,
}

fn case(dir: &Path, folder: &str, name: &str) -> Case {
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(folder).join("manifest.json")).unwrap()).unwrap();
    let c =
        m["cases"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no case {name}"));
    Case {
        fx: load(&dir.join(folder).join(format!("{name}.safetensors"))),
        attrs: c["attrs"].clone(),
        rtol: c["rtol"].as_f64().unwrap() as f32,
        atol: c["atol"].as_f64().unwrap() as f32,
    }
}

impl Case {
    fn f32s(&self, name: &str) -> Vec<f32> {
        get(&self.fx, name).to_vec::<f32>().unwrap()
    }
    fn shape(&self, name: &str) -> Vec<usize> {
        get(&self.fx, name).shape().to_vec()
    }
    fn check(&self, what: &str, got: &[f32], name: &str) {
        assert_slices_close(what, got, &self.f32s(name), self.rtol, self.atol);
    }
}

fn p<T>(v: &[T]) -> Shared<T> {
    Shared(v.as_ptr() as *mut T)
}
fn pm<T>(v: &mut [T]) -> Shared<T> {
    Shared(v.as_mut_ptr())
}

const GRID_STRIDE: Launch = Launch { grid: 2, block: 32 };
/// The row kernels' block (`FERRITE_BLOCK` in the sources), two blocks so rows stride too.
const ROWS: Launch = Launch { grid: 2, block: 256 };

type Unary = unsafe extern "C" fn(i64, *const f32, *mut f32);

#[test]
fn unary_kernels_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = HostKernels::compile("elementwise.cu");
    for (name, kernel) in [
        ("neg", "neg_f32"),
        ("exp", "exp_f32"),
        ("log", "log_f32"),
        ("sqrt", "sqrt_f32"),
        ("relu", "relu_f32"),
        ("sigmoid", "sigmoid_f32"),
        ("tanh", "tanh_f32"),
        ("silu", "silu_f32"),
        ("gelu__erf", "gelu_f32"),
        ("gelu__tanh", "gelu_tanh_f32"),
    ] {
        let c = case(&dir, "ops", name);
        let x = c.f32s("input.0");
        let mut y = vec![f32::NAN; x.len()];
        // SAFETY: the kernel's signature; the buffers hold n elements.
        let f: Unary = unsafe { k.kernel(kernel) };
        let (xp, yp, n) = (p(&x), pm(&mut y), x.len() as i64);
        // SAFETY: as above.
        k.launch(GRID_STRIDE, || unsafe { f(n, xp.get(), yp.get()) });
        c.check(name, &y, "output");
        println!("{kernel:<14} on {name}: ok ({} elements)", x.len());
    }
}

/// `Broadcast` of elementwise.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct Broadcast {
    ndim: i32,
    shape: [i64; 6],
    a_stride: [i64; 6],
    b_stride: [i64; 6],
}

/// Element strides of `shape` read through broadcasting to `out` (0 where it broadcasts).
fn broadcast_strides(shape: &[usize], out: &[usize]) -> [i64; 6] {
    let mut strides = [0i64; 6];
    let offset = out.len() - shape.len();
    let mut stride = 1i64;
    for d in (0..shape.len()).rev() {
        strides[offset + d] = if shape[d] == 1 { 0 } else { stride };
        stride *= shape[d] as i64;
    }
    strides
}

fn broadcast(a: &[usize], b: &[usize], out: &[usize]) -> Broadcast {
    let mut shape = [1i64; 6];
    for (d, s) in out.iter().enumerate() {
        shape[d] = *s as i64;
    }
    Broadcast {
        ndim: out.len() as i32,
        shape,
        a_stride: broadcast_strides(a, out),
        b_stride: broadcast_strides(b, out),
    }
}

type Binary = unsafe extern "C" fn(i64, Broadcast, *const f32, *const f32, *mut f32);

#[test]
fn binary_kernels_broadcast_as_pytorch_does() {
    let Some(dir) = setup() else { return };
    let k = HostKernels::compile("elementwise.cu");
    for (name, kernel) in [
        ("add__bcast", "add_f32"),
        ("sub__bcast", "sub_f32"),
        ("mul__bcast", "mul_f32"),
        ("div__bcast", "div_f32"),
        ("pow__scalar", "pow_f32"),
    ] {
        let c = case(&dir, "ops", name);
        let a = c.f32s("input.0");
        let (b, b_shape) = match c.attrs.get("exponent") {
            Some(e) => (vec![e.as_f64().unwrap() as f32], vec![1]),
            None => (c.f32s("input.1"), c.shape("input.1")),
        };
        let out_shape = c.shape("output");
        let g = broadcast(&c.shape("input.0"), &b_shape, &out_shape);
        let n: usize = out_shape.iter().product();
        let mut y = vec![f32::NAN; n];
        // SAFETY: the kernel's signature; the strides stay inside both inputs.
        let f: Binary = unsafe { k.kernel(kernel) };
        let (ap, bp, yp) = (p(&a), p(&b), pm(&mut y));
        // SAFETY: as above.
        k.launch(GRID_STRIDE, || unsafe { f(n as i64, g, ap.get(), bp.get(), yp.get()) });
        c.check(name, &y, "output");
        println!("{kernel:<14} on {name}: ok ({:?} with {:?} -> {out_shape:?})", c.shape("input.0"), b_shape);
    }
}

type Rows = unsafe extern "C" fn(i64, i64, *const f32, *mut f32);

/// (rows, cols) of a buffer reduced over its last dimension.
fn rows_cols(shape: &[usize]) -> (usize, usize) {
    let cols = *shape.last().unwrap_or(&1);
    (shape.iter().product::<usize>() / cols.max(1), cols)
}

#[test]
fn row_reductions_and_softmax_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = HostKernels::compile("reduce.cu");
    // SAFETY: the kernels' signatures.
    let (sum_rows, max_rows, softmax): (Rows, Rows, Rows) =
        unsafe { (k.kernel("sum_rows_f32"), k.kernel("max_rows_f32"), k.kernel("softmax_rows_f32")) };
    let run = |f: Rows, x: &[f32], rows: usize, cols: usize, out_len: usize| {
        let mut y = vec![f32::NAN; out_len];
        let (xp, yp) = (p(x), pm(&mut y));
        // SAFETY: the buffers hold rows·cols inputs and out_len outputs.
        k.launch(ROWS, || unsafe { f(rows as i64, cols as i64, xp.get(), yp.get()) });
        y
    };
    // sum over everything: one row.
    let c = case(&dir, "ops", "sum__all");
    let x = c.f32s("input.0");
    c.check("sum__all", &run(sum_rows, &x, 1, x.len(), 1), "output");
    // mean over the last dimension: row sums / cols.
    let c = case(&dir, "ops", "mean__dim_last");
    let (rows, cols) = rows_cols(&c.shape("input.0"));
    let sums = run(sum_rows, &c.f32s("input.0"), rows, cols, rows);
    c.check("mean__dim_last", &sums.iter().map(|s| s / cols as f32).collect::<Vec<_>>(), "output");
    // max over the last dimension (exact): against the host's max of the same rows.
    let want: Vec<f32> =
        c.f32s("input.0").chunks(cols).map(|r| r.iter().copied().fold(f32::NEG_INFINITY, f32::max)).collect();
    assert_eq!(run(max_rows, &c.f32s("input.0"), rows, cols, rows), want);
    // A row longer than the block: 300 columns, each thread sums two.
    let long: Vec<f32> = (0..3 * 300).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
    let want: Vec<f32> = long.chunks(300).map(|r| r.iter().map(|v| *v as f64).sum::<f64>() as f32).collect();
    assert_slices_close("sum of 300-column rows", &run(sum_rows, &long, 3, 300, 3), &want, 1e-5, 1e-4);

    // softmax and its backward.
    let c = case(&dir, "ops", "softmax__dim_last");
    let (rows, cols) = rows_cols(&c.shape("input.0"));
    let y = run(softmax, &c.f32s("input.0"), rows, cols, rows * cols);
    c.check("softmax", &y, "output");
    // SAFETY: the kernel's signature.
    let backward: unsafe extern "C" fn(i64, i64, *const f32, *const f32, *mut f32) =
        unsafe { k.kernel("softmax_rows_backward_f32") };
    let dy = c.f32s("grad_output");
    let mut dx = vec![f32::NAN; rows * cols];
    let (yp, dyp, dxp) = (p(&y), p(&dy), pm(&mut dx));
    // SAFETY: rows·cols elements in each buffer.
    k.launch(ROWS, || unsafe { backward(rows as i64, cols as i64, yp.get(), dyp.get(), dxp.get()) });
    c.check("softmax backward", &dx, "grad_input.0");
    println!("sum_rows, max_rows, softmax_rows and its backward: ok");
}

type CrossEntropy = unsafe extern "C" fn(i64, i64, *const f32, *const i64, i64, *mut f32, *mut u64);

#[test]
fn cross_entropy_matches_pytorch_and_flags_the_first_bad_class() {
    let Some(dir) = setup() else { return };
    let k = HostKernels::compile("reduce.cu");
    // SAFETY: the kernel's signature.
    let f: CrossEntropy = unsafe { k.kernel("cross_entropy_rows_f32") };
    let c = case(&dir, "ops", "cross_entropy");
    let (rows, cols) = rows_cols(&c.shape("input.0"));
    let logits = c.f32s("input.0");
    let run = |target: &[i64], ignore: i64| {
        let mut loss = vec![f32::NAN; rows];
        let mut bad = vec![0u64; 1];
        let (lp, tp, op, bp) = (p(&logits), p(target), pm(&mut loss), pm(&mut bad));
        // SAFETY: rows·cols logits, rows targets and losses, one flag word.
        k.launch(ROWS, || unsafe { f(rows as i64, cols as i64, lp.get(), tp.get(), ignore, op.get(), bp.get()) });
        (loss, bad[0])
    };
    let target: Vec<i64> = c.attrs["target"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    let (loss, bad) = run(&target, -100);
    assert_eq!(bad, 0);
    let mean = (loss.iter().map(|l| *l as f64).sum::<f64>() / rows as f64) as f32;
    c.check("cross_entropy (mean of the rows)", &[mean], "output");
    // ignore_index: that row's loss is 0; a class out of range: its row + 1 is flagged, the
    // first such row when several are.
    let mut t = target.clone();
    t[1] = 7777;
    let (loss, bad) = run(&t, 7777);
    assert_eq!((loss[1], bad), (0.0, 0));
    t[1] = cols as i64;
    t[3] = -1;
    let (_, bad) = run(&t, -100);
    assert!(bad == 2 || bad == 4, "flag {bad}: row 1 or row 3, + 1");
    let mut only = target.clone();
    only[rows - 1] = -5;
    assert_eq!(run(&only, -100).1, rows as u64);
}

#[test]
fn layer_norm_forward_and_both_gradients_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = HostKernels::compile("layer_norm.cu");
    let c = case(&dir, "ops", "layer_norm");
    let (rows, cols) = rows_cols(&c.shape("input.0"));
    let eps = c.attrs["eps"].as_f64().unwrap() as f32;
    let (x, w, b) = (c.f32s("input.0"), c.f32s("input.1"), c.f32s("input.2"));
    let (mut y, mut mean, mut rstd) = (vec![f32::NAN; rows * cols], vec![f32::NAN; rows], vec![f32::NAN; rows]);
    type Forward =
        unsafe extern "C" fn(i64, i64, f32, *const f32, *const f32, *const f32, *mut f32, *mut f32, *mut f32);
    // SAFETY: the kernel's signature.
    let forward: Forward = unsafe { k.kernel("layer_norm_f32") };
    let (xp, wp, bp, yp, mp, rp) = (p(&x), p(&w), p(&b), pm(&mut y), pm(&mut mean), pm(&mut rstd));
    // SAFETY: rows·cols inputs and outputs, cols weights, rows statistics.
    k.launch(ROWS, || unsafe {
        forward(rows as i64, cols as i64, eps, xp.get(), wp.get(), bp.get(), yp.get(), mp.get(), rp.get())
    });
    c.check("layer_norm", &y, "output");

    let dy = c.f32s("grad_output");
    let mut dx = vec![f32::NAN; rows * cols];
    type Input = unsafe extern "C" fn(i64, i64, *const f32, *const f32, *const f32, *const f32, *const f32, *mut f32);
    // SAFETY: the kernel's signature.
    let input: Input = unsafe { k.kernel("layer_norm_backward_input_f32") };
    let (mp, rp, dyp, dxp) = (p(&mean), p(&rstd), p(&dy), pm(&mut dx));
    // SAFETY: as above.
    k.launch(ROWS, || unsafe {
        input(rows as i64, cols as i64, xp.get(), wp.get(), mp.get(), rp.get(), dyp.get(), dxp.get())
    });
    c.check("layer_norm grad input", &dx, "grad_input.0");

    let (mut dw, mut db) = (vec![f32::NAN; cols], vec![f32::NAN; cols]);
    type Affine = unsafe extern "C" fn(i64, i64, *const f32, *const f32, *const f32, *const f32, *mut f32, *mut f32);
    // SAFETY: the kernel's signature.
    let affine: Affine = unsafe { k.kernel("layer_norm_backward_affine_f32") };
    let (dwp, dbp) = (pm(&mut dw), pm(&mut db));
    // A grid-stride launch: one thread per column.
    // SAFETY: as above.
    k.launch(Launch { grid: 2, block: 4 }, || unsafe {
        affine(rows as i64, cols as i64, xp.get(), mp.get(), rp.get(), dyp.get(), dwp.get(), dbp.get())
    });
    c.check("layer_norm grad weight", &dw, "grad_input.1");
    c.check("layer_norm grad bias", &db, "grad_input.2");

    // elementwise_affine=False: null weight and bias give the normalised input (PyTorch's
    // output minus the bias, divided by the weight).
    let mut plain = vec![f32::NAN; rows * cols];
    let pp = pm(&mut plain);
    let null = std::ptr::null::<f32>();
    let nullp = Shared(null as *mut f32);
    // SAFETY: null weight and bias are the kernel's "no affine".
    k.launch(ROWS, || unsafe {
        forward(rows as i64, cols as i64, eps, xp.get(), nullp.get(), nullp.get(), pp.get(), mp.get(), rp.get())
    });
    let want: Vec<f32> = c.f32s("output").iter().enumerate().map(|(i, o)| (o - b[i % cols]) / w[i % cols]).collect();
    assert_slices_close("layer_norm without affine", &plain, &want, 1e-3, 1e-4);
    println!("layer_norm forward, input and affine gradients, without affine: ok");
}

#[test]
fn rms_norm_matches_pytorch() {
    let Some(dir) = setup() else { return };
    let k = HostKernels::compile("layer_norm.cu");
    let c = case(&dir, "models", "rms_norm");
    let (rows, cols) = rows_cols(&c.shape("input.0"));
    let eps = c.attrs["eps"].as_f64().unwrap() as f32;
    let (x, w) = (c.f32s("input.0"), c.f32s("input.1"));
    let (mut y, mut rstd) = (vec![f32::NAN; rows * cols], vec![f32::NAN; rows]);
    type Rms = unsafe extern "C" fn(i64, i64, f32, *const f32, *const f32, *mut f32, *mut f32);
    // SAFETY: the kernel's signature.
    let f: Rms = unsafe { k.kernel("rms_norm_f32") };
    let (xp, wp, yp, rp) = (p(&x), p(&w), pm(&mut y), pm(&mut rstd));
    // SAFETY: rows·cols inputs and outputs, cols weights, rows statistics.
    k.launch(ROWS, || unsafe { f(rows as i64, cols as i64, eps, xp.get(), wp.get(), yp.get(), rp.get()) });
    c.check("rms_norm", &y, "output");
}

#[test]
fn embedding_and_its_gradient_match_pytorch_and_a_bad_index_is_flagged() {
    let Some(dir) = setup() else { return };
    let k = HostKernels::compile("embedding.cu");
    let c = case(&dir, "ops", "embedding");
    let table = c.f32s("input.0");
    let (rows, dim) = (c.shape("input.0")[0], c.shape("input.0")[1]);
    let mut indices: Vec<i64> = c.attrs["indices"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect::<Vec<_>>())
        .collect();
    let count = indices.len();
    type Forward = unsafe extern "C" fn(i64, i64, i64, *const i64, *const f32, *mut f32, *mut u64);
    // SAFETY: the kernel's signature.
    let forward: Forward = unsafe { k.kernel("embedding_f32") };
    let run = |indices: &[i64]| {
        let mut out = vec![f32::NAN; count * dim];
        let mut bad = vec![0u64];
        let (ip, tp, op, bp) = (p(indices), p(&table), pm(&mut out), pm(&mut bad));
        // SAFETY: count indices, rows·dim table, count·dim outputs, one flag word.
        k.launch(GRID_STRIDE, || unsafe {
            forward(count as i64, rows as i64, dim as i64, ip.get(), tp.get(), op.get(), bp.get())
        });
        (out, bad[0])
    };
    let (out, bad) = run(&indices);
    assert_eq!(bad, 0);
    c.check("embedding", &out, "output");

    let go = c.f32s("grad_output");
    let mut grad = vec![0.0f32; rows * dim];
    type Backward = unsafe extern "C" fn(i64, i64, i64, *const i64, *const f32, *mut f32);
    // SAFETY: the kernel's signature.
    let backward: Backward = unsafe { k.kernel("embedding_backward_f32") };
    let (ip, gp, tp) = (p(&indices), p(&go), pm(&mut grad));
    // SAFETY: count indices and gradient rows, a zeroed rows·dim table gradient.
    k.launch(Launch { grid: 1, block: 4 }, || unsafe {
        backward(count as i64, rows as i64, dim as i64, ip.get(), gp.get(), tp.get())
    });
    c.check("embedding grad", &grad, "grad_input.0");

    indices[4] = rows as i64;
    let (out, bad) = run(&indices);
    assert_eq!(bad, 5, "position 4 + 1");
    assert!(out[4 * dim..5 * dim].iter().all(|v| *v == 0.0), "the bad position's row is zero");
}

type Adamw =
    unsafe extern "C" fn(i64, *mut f32, *const f32, *mut f32, *mut f32, f32, f32, f32, f32, f32, f32, f32, *const f32);

#[test]
fn fused_adamw_and_sgd_follow_pytorchs_update_rules_and_skip_on_inf() {
    if !emulator::compiler_or_skip() {
        return;
    }
    let k = HostKernels::compile("optimizer.cu");
    let n = 70;
    let grads: Vec<Vec<f32>> =
        (0..3).map(|s| (0..n).map(|i| ((i * 13 + s * 7) % 17) as f32 / 17.0 - 0.4).collect()).collect();
    let init: Vec<f32> = (0..n).map(|i| (i % 9) as f32 / 9.0 - 0.5).collect();

    // torch.optim.AdamW (amsgrad=False), _single_tensor_adamw, in f64.
    let (lr, b1, b2, eps, wd) = (1e-2f64, 0.9f64, 0.999f64, 1e-8f64, 0.01f64);
    let mut want: Vec<f64> = init.iter().map(|v| *v as f64).collect();
    let (mut m, mut v) = (vec![0.0f64; n], vec![0.0f64; n]);
    // SAFETY: the kernel's signature.
    let adamw: Adamw = unsafe { k.kernel("adamw_step_f32") };
    let mut param = init.clone();
    let (mut em, mut ev) = (vec![0.0f32; n], vec![0.0f32; n]);
    for (s, g) in grads.iter().enumerate() {
        let step = (s + 1) as i32;
        for i in 0..n {
            want[i] *= 1.0 - lr * wd;
            m[i] += (g[i] as f64 - m[i]) * (1.0 - b1);
            v[i] = v[i] * b2 + (g[i] as f64) * (g[i] as f64) * (1.0 - b2);
            let bc1 = 1.0 - b1.powi(step);
            let bc2 = 1.0 - b2.powi(step);
            want[i] -= lr / bc1 * m[i] / (v[i].sqrt() / bc2.sqrt() + eps);
        }
        let (bc1, bc2s) = ((1.0 - b1.powi(step)) as f32, (1.0 - b2.powi(step)).sqrt() as f32);
        let (pp, gp, mp, vp) = (pm(&mut param), p(g), pm(&mut em), pm(&mut ev));
        let nf = Shared(std::ptr::null_mut::<f32>());
        // SAFETY: n elements in every buffer; no found_inf flag.
        k.launch(GRID_STRIDE, || unsafe {
            adamw(
                n as i64,
                pp.get(),
                gp.get(),
                mp.get(),
                vp.get(),
                lr as f32,
                b1 as f32,
                b2 as f32,
                eps as f32,
                wd as f32,
                bc1,
                bc2s,
                nf.get(),
            )
        });
    }
    let want32: Vec<f32> = want.iter().map(|v| *v as f32).collect();
    assert_slices_close("adamw after 3 steps", &param, &want32, 1e-5, 1e-6);

    // A set found_inf flag skips the step entirely.
    let before = param.clone();
    let flag = vec![1.0f32];
    let (pp, gp, mp, vp, fp) = (pm(&mut param), p(&grads[0]), pm(&mut em), pm(&mut ev), p(&flag));
    // SAFETY: as above, with a flag word.
    k.launch(GRID_STRIDE, || unsafe {
        adamw(n as i64, pp.get(), gp.get(), mp.get(), vp.get(), 0.1, 0.9, 0.999, 1e-8, 0.0, 0.1, 0.1, fp.get())
    });
    assert_eq!(param, before);

    // torch.optim.SGD with momentum, dampening, weight decay, nesterov: the first step copies the
    // gradient into the buffer.
    type SgdStep = unsafe extern "C" fn(i64, *mut f32, *const f32, *mut f32, f32, f32, f32, f32, i32, i32, *const f32);
    // SAFETY: the kernel's signature.
    let sgd: SgdStep = unsafe { k.kernel("sgd_step_f32") };
    for nesterov in [false, true] {
        let (lr, mom, damp, wd) = (0.1f64, 0.9f64, 0.1f64, 1e-3f64);
        let mut want: Vec<f64> = init.iter().map(|v| *v as f64).collect();
        let mut buf = vec![0.0f64; n];
        let mut param = init.clone();
        let mut kbuf = vec![0.0f32; n];
        for (s, g) in grads.iter().enumerate() {
            for i in 0..n {
                let gi = g[i] as f64 + wd * want[i];
                buf[i] = if s == 0 { gi } else { buf[i] * mom + (1.0 - damp) * gi };
                want[i] -= lr * if nesterov { gi + mom * buf[i] } else { buf[i] };
            }
            let (pp, gp, bp) = (pm(&mut param), p(g), pm(&mut kbuf));
            let nf = Shared(std::ptr::null_mut::<f32>());
            // SAFETY: n elements in every buffer; no found_inf flag.
            k.launch(GRID_STRIDE, || unsafe {
                sgd(
                    n as i64,
                    pp.get(),
                    gp.get(),
                    bp.get(),
                    lr as f32,
                    mom as f32,
                    damp as f32,
                    wd as f32,
                    nesterov as i32,
                    (s == 0) as i32,
                    nf.get(),
                )
            });
        }
        let want32: Vec<f32> = want.iter().map(|v| *v as f32).collect();
        assert_slices_close(&format!("sgd (nesterov {nesterov}) after 3 steps"), &param, &want32, 1e-5, 1e-6);
    }

    // GradScaler's unscale-and-check: grads *= 1/scale, the flag set by an inf.
    type Unscale = unsafe extern "C" fn(i64, *mut f32, f32, *mut f32);
    // SAFETY: the kernel's signature.
    let unscale: Unscale = unsafe { k.kernel("unscale_and_check_f32") };
    for (poison, expect_flag) in [(None, 0.0f32), (Some(f32::INFINITY), 1.0), (Some(f32::NAN), 1.0)] {
        let mut g: Vec<f32> = grads[0].iter().map(|v| v * 1024.0).collect();
        if let Some(x) = poison {
            g[n - 1] = x;
        }
        let mut flag = vec![0.0f32];
        let (gp, fp) = (pm(&mut g), pm(&mut flag));
        // SAFETY: n gradients and one flag.
        k.launch(GRID_STRIDE, || unsafe { unscale(n as i64, gp.get(), 1.0 / 1024.0, fp.get()) });
        assert_eq!(flag[0], expect_flag, "{poison:?}");
        assert_slices_close("unscaled", &g[..n - 1], &grads[0][..n - 1], 0.0, 0.0);
    }
}

type ActBackward = unsafe extern "C" fn(i64, *const f32, *const f32, *mut f32);

#[test]
fn activation_gradients_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = HostKernels::compile("activation_backward.cu");
    // The case, the kernel, and what the forward saved for it (its input or its output).
    for (name, kernel, saved) in [
        ("relu", "relu_backward_f32", "input.0"),
        ("sigmoid", "sigmoid_backward_f32", "output"),
        ("tanh", "tanh_backward_f32", "output"),
        ("silu", "silu_backward_f32", "input.0"),
        ("gelu__erf", "gelu_backward_f32", "input.0"),
        ("gelu__tanh", "gelu_tanh_backward_f32", "input.0"),
    ] {
        let c = case(&dir, "ops", name);
        let (s, dy) = (c.f32s(saved), c.f32s("grad_output"));
        let mut dx = vec![f32::NAN; s.len()];
        // SAFETY: the kernel's signature; n elements in each buffer.
        let f: ActBackward = unsafe { k.kernel(kernel) };
        let (sp, gp, dp) = (p(&s), p(&dy), pm(&mut dx));
        // SAFETY: as above.
        k.launch(GRID_STRIDE, || unsafe { f(s.len() as i64, sp.get(), gp.get(), dp.get()) });
        c.check(&format!("{name} backward"), &dx, "grad_input.0");
        println!("{kernel:<24} on {name}: ok");
    }
}

/// `Strided` of copy.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct Strided {
    ndim: i32,
    offset: i64,
    shape: [i64; 8],
    stride: [i64; 8],
}

fn strided(offset: usize, shape: &[usize], stride: &[i64]) -> Strided {
    let mut s = Strided { ndim: shape.len() as i32, offset: offset as i64, shape: [1; 8], stride: [0; 8] };
    for d in 0..shape.len() {
        s.shape[d] = shape[d] as i64;
        s.stride[d] = stride[d];
    }
    s
}

fn contiguous_strides(shape: &[usize]) -> Vec<i64> {
    let mut out = vec![1i64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        out[d] = out[d + 1] * shape[d + 1] as i64;
    }
    out
}

#[test]
fn strided_copies_materialise_views_as_pytorch_does() {
    let Some(dir) = setup() else { return };
    let k = HostKernels::compile("copy.cu");
    type Copy = unsafe extern "C" fn(i64, Strided, *const f32, *mut f32);
    // SAFETY: the kernel's signature.
    let f: Copy = unsafe { k.kernel("strided_copy_f32") };
    let copy = |src: Strided, input: &[f32], n: usize| {
        let mut out = vec![f32::NAN; n];
        let (ip, op) = (p(input), pm(&mut out));
        // SAFETY: every offset the view names lies inside `input`; n outputs.
        k.launch(GRID_STRIDE, || unsafe { f(n as i64, src, ip.get(), op.get()) });
        out
    };
    let dims = |c: &Case, key: &str| -> Vec<usize> {
        c.attrs[key].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect()
    };
    // permute and transpose: the output's dimension d reads the input's dimension perm[d].
    for (name, perm) in [("permute__2_0_1", None), ("transpose__0_1", Some([1usize, 0]))] {
        let c = case(&dir, "ops", name);
        let (shape, strides) = (c.shape("input.0"), contiguous_strides(&c.shape("input.0")));
        let perm: Vec<usize> = match perm {
            None => dims(&c, "dims"),
            Some(p) => {
                let mut all: Vec<usize> = (0..shape.len()).collect();
                all.swap(p[0], p[1]);
                all
            }
        };
        let out_shape: Vec<usize> = perm.iter().map(|d| shape[*d]).collect();
        let out_strides: Vec<i64> = perm.iter().map(|d| strides[*d]).collect();
        let n = out_shape.iter().product();
        c.check(name, &copy(strided(0, &out_shape, &out_strides), &c.f32s("input.0"), n), "output");
    }
    // narrow: an offset and a shorter dimension.
    let c = case(&dir, "ops", "narrow__dim1");
    let (dim, start, len) = (
        c.attrs["dim"].as_u64().unwrap() as usize,
        c.attrs["start"].as_u64().unwrap() as usize,
        c.attrs["length"].as_u64().unwrap() as usize,
    );
    let strides = contiguous_strides(&c.shape("input.0"));
    let mut shape = c.shape("input.0");
    shape[dim] = len;
    let n = shape.iter().product();
    c.check(
        "narrow__dim1",
        &copy(strided(start * strides[dim] as usize, &shape, &strides), &c.f32s("input.0"), n),
        "output",
    );
    // expand: a stride of 0 repeats [4, 1, 4] along the middle dimension five times.
    let x: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let got = copy(strided(0, &[4, 5, 4], &[4, 0, 1]), &x, 80);
    let want: Vec<f32> = (0..80).map(|i| x[(i / 20) * 4 + i % 4]).collect();
    assert_eq!(got, want);
}

#[test]
fn cross_entropy_gradient_and_broadcast_sums_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = HostKernels::compile("reduce.cu");
    // Cross entropy, mean over the rows: scale = grad_output / rows.
    let c = case(&dir, "ops", "cross_entropy");
    let (rows, cols) = rows_cols(&c.shape("input.0"));
    let logits = c.f32s("input.0");
    let target: Vec<i64> = c.attrs["target"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    let scale = vec![c.f32s("grad_output")[0] / rows as f32; rows];
    let mut d = vec![f32::NAN; rows * cols];
    type Backward = unsafe extern "C" fn(i64, i64, *const f32, *const i64, *const f32, *mut f32);
    // SAFETY: the kernel's signature.
    let f: Backward = unsafe { k.kernel("cross_entropy_rows_backward_f32") };
    let (lp, tp, sp, dp) = (p(&logits), p(&target), p(&scale), pm(&mut d));
    // SAFETY: rows·cols logits and gradients, rows targets and scales.
    k.launch(ROWS, || unsafe { f(rows as i64, cols as i64, lp.get(), tp.get(), sp.get(), dp.get()) });
    c.check("cross_entropy backward", &d, "grad_input.0");

    // Sums over a middle dimension: sum(dim=1, keepdim) and both gradients of a broadcast add.
    type Middle = unsafe extern "C" fn(i64, i64, i64, *const f32, *mut f32);
    // SAFETY: the kernel's signature.
    let middle: Middle = unsafe { k.kernel("sum_middle_f32") };
    let sum = |x: &[f32], outer: usize, rows: usize, cols: usize| {
        let mut out = vec![f32::NAN; outer * cols];
        let (xp, op) = (p(x), pm(&mut out));
        // SAFETY: outer·rows·cols inputs, outer·cols outputs.
        k.launch(GRID_STRIDE, || unsafe { middle(outer as i64, rows as i64, cols as i64, xp.get(), op.get()) });
        out
    };
    let c = case(&dir, "ops", "sum__dim1_keepdim");
    let s = c.shape("input.0");
    c.check("sum__dim1_keepdim", &sum(&c.f32s("input.0"), s[0], s[1], s[2]), "output");
    let c = case(&dir, "ops", "add__bcast");
    let (a, b, out) = (c.shape("input.0"), c.shape("input.1"), c.shape("output"));
    assert_eq!(
        (a.as_slice(), b.as_slice(), out.as_slice()),
        ([4, 1, 4].as_slice(), [5, 4].as_slice(), [4, 5, 4].as_slice()),
        "the case's shapes"
    );
    let g = c.f32s("grad_output");
    c.check("add__bcast grad a", &sum(&g, 4, 5, 4), "grad_input.0");
    c.check("add__bcast grad b", &sum(&g, 1, 4, 20), "grad_input.1");
}

/// `ChachaKey` of random.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct ChachaKey {
    k: [u32; 8],
}

/// The ChaCha8 key `Generator::new(seed)` runs on: rand_core's `seed_from_u64`, PCG32 outputs as
/// the key's eight words.
fn chacha_key(mut state: u64) -> ChachaKey {
    let mut k = [0u32; 8];
    for w in &mut k {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(11634580027462260723);
        let xorshifted = (((state >> 18) ^ state) >> 27) as u32;
        *w = xorshifted.rotate_right((state >> 59) as u32);
    }
    ChachaKey { k }
}

#[test]
fn random_kernels_draw_the_cpu_generators_values_bit_for_bit() {
    if !emulator::compiler_or_skip() {
        return;
    }
    use ferrite_tensor::{DType, Device, Generator};
    let k = HostKernels::compile("random.cu");
    type Uniform = unsafe extern "C" fn(i64, ChachaKey, u64, u32, f64, f64, *mut f32);
    type Bernoulli = unsafe extern "C" fn(i64, ChachaKey, u64, u32, f64, *mut f32);
    type Dropout = unsafe extern "C" fn(i64, ChachaKey, u64, u32, f64, f32, *const f32, *mut f32, *mut f32);
    // SAFETY: the kernels' signatures.
    let (uniform, bernoulli, dropout, normal): (Uniform, Bernoulli, Dropout, Uniform) = unsafe {
        (k.kernel("uniform_f32"), k.kernel("bernoulli_f32"), k.kernel("dropout_f32"), k.kernel("normal_f32"))
    };
    let n = 333;
    // Seeds, and words drawn before: an odd position makes 64-bit draws straddle ChaCha blocks.
    for (seed, skip) in [(0u64, 0u32), (42, 1), (0x5eed_f00d, 37)] {
        let mut g = Generator::new(seed);
        for _ in 0..skip {
            g.next_u32();
        }
        let pos = g.state().word_pos;
        let (key, block, word) = (chacha_key(seed), (pos >> 4) as u64, (pos & 15) as u32);
        let run = |f: &dyn Fn(Shared<f32>)| {
            let mut out = vec![f32::NAN; n];
            let op = pm(&mut out);
            f(op);
            out
        };
        let want = Tensor::uniform_with(&[n], -2.0, 3.0, DType::F32, &Device::Cpu, &mut g.clone()).unwrap();
        let got =
            run(&|o| k.launch(GRID_STRIDE, || unsafe { uniform(n as i64, key, block, word, -2.0, 3.0, o.get()) }));
        assert_eq!(got, want.to_vec::<f32>().unwrap(), "uniform, seed {seed}, {skip} words drawn before");
        let want = Tensor::bernoulli_with(&[n], 0.3, DType::F32, &Device::Cpu, &mut g.clone()).unwrap();
        let got = run(&|o| k.launch(GRID_STRIDE, || unsafe { bernoulli(n as i64, key, block, word, 0.3, o.get()) }));
        assert_eq!(got, want.to_vec::<f32>().unwrap(), "bernoulli, seed {seed}");
        // Dropout as ferrite_tensor::functional::dropout computes it on the CPU.
        let x: Vec<f32> = (0..n).map(|i| (i as f32 - 150.0) / 37.0).collect();
        let xt = Tensor::from_vec(x.clone(), &[n], &Device::Cpu).unwrap();
        let drop = 0.1;
        let want =
            ferrite_tensor::functional::dropout(&xt, drop, true, &mut g.clone()).unwrap().to_vec::<f32>().unwrap();
        let mut mask = vec![f32::NAN; n];
        let (xp, mp) = (p(&x), pm(&mut mask));
        let got = run(&|o| {
            k.launch(GRID_STRIDE, || unsafe {
                dropout(
                    n as i64,
                    key,
                    block,
                    word,
                    1.0 - drop,
                    (1.0 / (1.0 - drop)) as f32,
                    xp.get(),
                    o.get(),
                    mp.get(),
                )
            })
        });
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "dropout, seed {seed} (signed zeros included)");
        // Normal: Box-Muller in double through the C library's log and cos, as Rust's; the GPU's
        // may differ in the last bit of the double, so within one float ulp.
        let want = Tensor::normal_with(&[n], 0.5, 2.0, DType::F32, &Device::Cpu, &mut g.clone()).unwrap();
        let got = run(&|o| k.launch(GRID_STRIDE, || unsafe { normal(n as i64, key, block, word, 0.5, 2.0, o.get()) }));
        assert_slices_close(
            &format!("normal, seed {seed}"),
            &got,
            &want.to_vec::<f32>().unwrap(),
            2.0 * f32::EPSILON,
            0.0,
        );
    }
}

#[test]
fn log_softmax_and_max_with_index_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = HostKernels::compile("reduce.cu");
    let c = case(&dir, "ops", "log_softmax__dim_last");
    let (rows, cols) = rows_cols(&c.shape("input.0"));
    let x = c.f32s("input.0");
    let mut y = vec![f32::NAN; rows * cols];
    // SAFETY: the kernels' signatures.
    let (forward, backward): (Rows, unsafe extern "C" fn(i64, i64, *const f32, *const f32, *mut f32)) =
        unsafe { (k.kernel("log_softmax_rows_f32"), k.kernel("log_softmax_rows_backward_f32")) };
    let (xp, yp) = (p(&x), pm(&mut y));
    // SAFETY: rows·cols elements each.
    k.launch(ROWS, || unsafe { forward(rows as i64, cols as i64, xp.get(), yp.get()) });
    c.check("log_softmax", &y, "output");
    let dy = c.f32s("grad_output");
    let mut dx = vec![f32::NAN; rows * cols];
    let (yp, dyp, dxp) = (p(&y), p(&dy), pm(&mut dx));
    // SAFETY: as above.
    k.launch(ROWS, || unsafe { backward(rows as i64, cols as i64, yp.get(), dyp.get(), dxp.get()) });
    c.check("log_softmax backward", &dx, "grad_input.0");

    type MaxIndex = unsafe extern "C" fn(i64, i64, *const f32, *mut f32, *mut i64);
    // SAFETY: the kernel's signature.
    let max: MaxIndex = unsafe { k.kernel("max_rows_with_index_f32") };
    let run = |x: &[f32], rows: usize, cols: usize| {
        let (mut v, mut i) = (vec![f32::NAN; rows], vec![-1i64; rows]);
        let (xp, vp, ip) = (p(x), pm(&mut v), pm(&mut i));
        // SAFETY: rows·cols inputs, rows values and indices.
        k.launch(ROWS, || unsafe { max(rows as i64, cols as i64, xp.get(), vp.get(), ip.get()) });
        (v, i)
    };
    // max(dim=0) of the fixture: the rows of the transposed input.
    let c = case(&dir, "ops", "max__dim0");
    let s = c.shape("input.0");
    let (d0, rest) = (s[0], s[1..].iter().product::<usize>());
    let x = c.f32s("input.0");
    let xt: Vec<f32> = (0..rest * d0).map(|i| x[(i % d0) * rest + i / d0]).collect();
    let (v, _) = run(&xt, rest, d0);
    c.check("max__dim0", &v, "output");
    // Ties keep the first index, a NaN is the max (its first occurrence), and a row longer than
    // the block reduces across threads.
    let mut long = vec![0.0f32; 600];
    long[450] = 9.0;
    long[301] = 9.0;
    let rows_in = [vec![1.0, 3.0, 3.0, 2.0], vec![1.0, f32::NAN, 5.0, f32::NAN], vec![f32::NEG_INFINITY; 4]];
    for (row, (want_v, want_i)) in rows_in.iter().zip([(3.0f32, 1i64), (f32::NAN, 1), (f32::NEG_INFINITY, 0)]) {
        let (v, i) = run(row, 1, 4);
        assert!(v[0] == want_v || (v[0].is_nan() && want_v.is_nan()), "{row:?}: {}", v[0]);
        assert_eq!(i[0], want_i, "{row:?}");
    }
    assert_eq!(run(&long, 1, 600), (vec![9.0], vec![301]));
}

#[test]
fn rms_norm_gradients_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = HostKernels::compile("layer_norm.cu");
    let c = case(&dir, "models", "rms_norm");
    let (rows, cols) = rows_cols(&c.shape("input.0"));
    let eps = c.attrs["eps"].as_f64().unwrap() as f32;
    let (x, w, dy) = (c.f32s("input.0"), c.f32s("input.1"), c.f32s("grad_output"));
    let (mut y, mut rstd) = (vec![f32::NAN; rows * cols], vec![f32::NAN; rows]);
    type Rms = unsafe extern "C" fn(i64, i64, f32, *const f32, *const f32, *mut f32, *mut f32);
    type Input = unsafe extern "C" fn(i64, i64, *const f32, *const f32, *const f32, *const f32, *mut f32);
    type Weight = unsafe extern "C" fn(i64, i64, *const f32, *const f32, *const f32, *mut f32);
    // SAFETY: the kernels' signatures.
    let (forward, input, weight): (Rms, Input, Weight) = unsafe {
        (k.kernel("rms_norm_f32"), k.kernel("rms_norm_backward_input_f32"), k.kernel("rms_norm_backward_weight_f32"))
    };
    let (xp, wp, yp, rp) = (p(&x), p(&w), pm(&mut y), pm(&mut rstd));
    // SAFETY: rows·cols inputs and outputs, cols weights, rows statistics.
    k.launch(ROWS, || unsafe { forward(rows as i64, cols as i64, eps, xp.get(), wp.get(), yp.get(), rp.get()) });
    let (mut dx, mut dw) = (vec![f32::NAN; rows * cols], vec![f32::NAN; cols]);
    let (rp, dyp, dxp, dwp) = (p(&rstd), p(&dy), pm(&mut dx), pm(&mut dw));
    // SAFETY: as above.
    k.launch(ROWS, || unsafe { input(rows as i64, cols as i64, xp.get(), wp.get(), rp.get(), dyp.get(), dxp.get()) });
    // SAFETY: as above; one thread per column.
    k.launch(Launch { grid: 2, block: 4 }, || unsafe {
        weight(rows as i64, cols as i64, xp.get(), rp.get(), dyp.get(), dwp.get())
    });
    c.check("rms_norm grad input", &dx, "grad_input.0");
    c.check("rms_norm grad weight", &dw, "grad_input.1");
}

#[test]
fn casts_to_and_from_bf16_and_f16_give_the_cpu_backends_bits() {
    if !emulator::compiler_or_skip() {
        return;
    }
    use ferrite_tensor::{DType, Device};
    let k = HostKernels::compile("cast.cu");
    // Every kind of f32: zeros, subnormals, normals around each rounding boundary, the f16 range's
    // edges, infinities, NaNs (quiet and signalling); then a sweep of bit patterns.
    let mut bits: Vec<u32> = vec![
        0,
        0x8000_0000,
        1,
        0x0000_1000,
        0x33000000,
        0x33000001,
        0x337f_ffff,
        0x3380_0000,
        0x3880_0000,
        0x387f_ffff,
        0x3f80_0000,
        0x3f80_8000,
        0x3f81_8000,
        0x3f80_1000,
        0x3f80_3000,
        0x477f_e000,
        0x477f_efff,
        0x477f_f000,
        0x4780_0000,
        0x7f7f_ffff,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0x7f80_0001,
        0xffc0_1234,
    ];
    let mut s = 0x1234_5678u32;
    for _ in 0..20_000 {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        bits.push(s);
    }
    let x: Vec<f32> = bits.iter().map(|b| f32::from_bits(*b)).collect();
    let n = x.len();
    let xt = Tensor::from_vec(x.clone(), &[n], &Device::Cpu).unwrap();
    type Down = unsafe extern "C" fn(i64, *const f32, *mut u16);
    type Up = unsafe extern "C" fn(i64, *const u16, *mut f32);
    let wide_launch = Launch { grid: 4, block: 64 };
    for (dtype, down, up) in [(DType::BF16, "f32_to_bf16", "bf16_to_f32"), (DType::F16, "f32_to_f16", "f16_to_f32")] {
        // SAFETY: the kernels' signatures.
        let (down_k, up_k): (Down, Up) = unsafe { (k.kernel(down), k.kernel(up)) };
        let mut h = vec![0u16; n];
        let (xp, hp) = (p(&x), pm(&mut h));
        // SAFETY: n elements each.
        k.launch(wide_launch, || unsafe { down_k(n as i64, xp.get(), hp.get()) });
        let want_half = xt.to_dtype(dtype).unwrap();
        let want_bits: Vec<u16> = match dtype {
            DType::BF16 => want_half.to_vec::<half::bf16>().unwrap().iter().map(|v| v.to_bits()).collect(),
            _ => want_half.to_vec::<half::f16>().unwrap().iter().map(|v| v.to_bits()).collect(),
        };
        for i in 0..n {
            assert_eq!(
                h[i], want_bits[i],
                "{down} of {:#010x}: {:#06x}, ferrite's {:#06x}",
                bits[i], h[i], want_bits[i]
            );
        }
        let mut back = vec![f32::NAN; n];
        let (hp, bp) = (p(&h), pm(&mut back));
        // SAFETY: as above.
        k.launch(wide_launch, || unsafe { up_k(n as i64, hp.get(), bp.get()) });
        let want_back = want_half.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        for i in 0..n {
            assert_eq!(back[i].to_bits(), want_back[i].to_bits(), "{up} of {:#06x}", h[i]);
        }
        println!("{down} / {up}: {n} values bit for bit");
    }
}

/// `Pool2d` of pool.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Pool2d {
    planes: i64,
    h: i64,
    w: i64,
    out_h: i64,
    out_w: i64,
    kh: i32,
    kw: i32,
    sh: i32,
    sw: i32,
    ph: i32,
    pw: i32,
    dh: i32,
    dw: i32,
    count_include_pad: i32,
    divisor_override: i32,
}

#[test]
fn pooling_and_its_gradients_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = HostKernels::compile("pool.cu");
    type MaxF = unsafe extern "C" fn(Pool2d, *const f32, *mut f32, *mut i64);
    type MaxB = unsafe extern "C" fn(Pool2d, *const i64, *const f32, *mut f32);
    type AvgF = unsafe extern "C" fn(Pool2d, *const f32, *mut f32);
    type AvgB = unsafe extern "C" fn(Pool2d, *const f32, *mut f32);
    // SAFETY: the kernels' signatures.
    let (max_f, max_b, avg_f, avg_b, ada_f, ada_b): (MaxF, MaxB, AvgF, AvgB, AvgF, AvgB) = unsafe {
        (
            k.kernel("max_pool2d_f32"),
            k.kernel("max_pool2d_backward_f32"),
            k.kernel("avg_pool2d_f32"),
            k.kernel("avg_pool2d_backward_f32"),
            k.kernel("adaptive_avg_pool2d_f32"),
            k.kernel("adaptive_avg_pool2d_backward_f32"),
        )
    };
    let pair = |a: &Value, key: &str, default: i32| -> [i32; 2] {
        match a.get(key) {
            Some(Value::Array(v)) => [v[0].as_i64().unwrap() as i32, v[1].as_i64().unwrap() as i32],
            Some(Value::Number(n)) => [n.as_i64().unwrap() as i32; 2],
            _ => [default; 2],
        }
    };
    for name in [
        "max_pool2d__k2_s2",
        "max_pool2d__k3_s2_p1",
        "avg_pool2d__k2_s2",
        "adaptive_avg_pool2d__1x1",
        "adaptive_avg_pool2d__3x3",
    ] {
        let c = case(&dir, "models", name);
        let (s, o) = (c.shape("input.0"), c.shape("output"));
        let a = &c.attrs;
        let (ks, st, pd) = (pair(a, "kernel_size", 1), pair(a, "stride", 0), pair(a, "padding", 0));
        let st = if st == [0, 0] { ks } else { st };
        let g = Pool2d {
            planes: (s[0] * s[1]) as i64,
            h: s[2] as i64,
            w: s[3] as i64,
            out_h: o[2] as i64,
            out_w: o[3] as i64,
            kh: ks[0],
            kw: ks[1],
            sh: st[0],
            sw: st[1],
            ph: pd[0],
            pw: pd[1],
            dh: 1,
            dw: 1,
            count_include_pad: a.get("count_include_pad").and_then(Value::as_bool).unwrap_or(true) as i32,
            divisor_override: a.get("divisor_override").and_then(Value::as_i64).unwrap_or(0) as i32,
        };
        let (x, dy) = (c.f32s("input.0"), c.f32s("grad_output"));
        let mut y = vec![f32::NAN; dy.len()];
        let mut dx = vec![0.0f32; x.len()];
        let mut arg = vec![-1i64; dy.len()];
        let (xp, yp, dyp, dxp, ap) = (p(&x), pm(&mut y), p(&dy), pm(&mut dx), pm(&mut arg));
        // SAFETY: every buffer has the size its shape names (planes · h · w, planes · out_h · out_w).
        match name.split("__").next().unwrap() {
            "max_pool2d" => {
                k.launch(GRID_STRIDE, || unsafe { max_f(g, xp.get(), yp.get(), ap.get()) });
                k.launch(Launch { grid: 2, block: 2 }, || unsafe { max_b(g, ap.get(), dyp.get(), dxp.get()) });
            }
            "avg_pool2d" => {
                k.launch(GRID_STRIDE, || unsafe { avg_f(g, xp.get(), yp.get()) });
                k.launch(Launch { grid: 2, block: 2 }, || unsafe { avg_b(g, dyp.get(), dxp.get()) });
            }
            _ => {
                k.launch(GRID_STRIDE, || unsafe { ada_f(g, xp.get(), yp.get()) });
                k.launch(Launch { grid: 2, block: 2 }, || unsafe { ada_b(g, dyp.get(), dxp.get()) });
            }
        }
        c.check(name, &y, "output");
        c.check(&format!("{name} backward"), &dx, "grad_input.0");
        println!("{name}: forward and backward ok ({s:?} -> {o:?})");
    }
}

/// Forward and backward of `f` on the CPU backend (whose window rules `norm_pool_parity` checks
/// across devices): the output and the input gradient for a fixed upstream gradient.
fn cpu_pool(x: &[f32], shape: &[usize], f: &dyn Fn(&Tensor) -> Tensor) -> (Vec<f32>, Vec<usize>, Vec<f32>, Vec<f32>) {
    let cpu = ferrite_tensor::Device::Cpu;
    let xt = Tensor::from_vec(x.to_vec(), shape, &cpu).unwrap().requires_grad_(true).unwrap();
    let y = f(&xt);
    let dy: Vec<f32> = (0..y.numel()).map(|i| ((i * 7) % 11) as f32 / 11.0 - 0.3).collect();
    y.backward_with(&Tensor::from_vec(dy.clone(), y.shape(), &cpu).unwrap(), false).unwrap();
    (y.to_vec::<f32>().unwrap(), y.shape().to_vec(), dy, xt.grad().unwrap().to_vec::<f32>().unwrap())
}

#[test]
fn pooling_options_beyond_the_fixtures_agree_with_the_cpu_backend() {
    if !emulator::compiler_or_skip() {
        return;
    }
    use ferrite_tensor::functional::{AvgPool2dOptions, MaxPool2dOptions, avg_pool2d, max_pool2d};
    let k = HostKernels::compile("pool.cu");
    type MaxF = unsafe extern "C" fn(Pool2d, *const f32, *mut f32, *mut i64);
    type MaxB = unsafe extern "C" fn(Pool2d, *const i64, *const f32, *mut f32);
    type AvgF = unsafe extern "C" fn(Pool2d, *const f32, *mut f32);
    type AvgB = unsafe extern "C" fn(Pool2d, *const f32, *mut f32);
    // SAFETY: the kernels' signatures.
    let (max_f, max_b, avg_f, avg_b): (MaxF, MaxB, AvgF, AvgB) = unsafe {
        (
            k.kernel("max_pool2d_f32"),
            k.kernel("max_pool2d_backward_f32"),
            k.kernel("avg_pool2d_f32"),
            k.kernel("avg_pool2d_backward_f32"),
        )
    };
    let shape = [2usize, 3, 9, 8];
    let mut x: Vec<f32> = (0..shape.iter().product::<usize>()).map(|i| ((i * 29 % 53) as f32 - 26.0) / 9.0).collect();
    x[17] = f32::NAN; // a NaN is its windows' maximum
    let geometry =
        |o: &[usize], k: [usize; 2], s: [usize; 2], p: [usize; 2], d: [usize; 2], cip: bool, div: usize| Pool2d {
            planes: 6,
            h: 9,
            w: 8,
            out_h: o[2] as i64,
            out_w: o[3] as i64,
            kh: k[0] as i32,
            kw: k[1] as i32,
            sh: s[0] as i32,
            sw: s[1] as i32,
            ph: p[0] as i32,
            pw: p[1] as i32,
            dh: d[0] as i32,
            dw: d[1] as i32,
            count_include_pad: cip as i32,
            divisor_override: div as i32,
        };
    let bits = |v: &[f32]| v.iter().map(|f| if f.is_nan() { u32::MAX } else { f.to_bits() }).collect::<Vec<_>>();
    for ceil_mode in [false, true] {
        let opts = MaxPool2dOptions {
            kernel_size: [3, 2],
            stride: Some([2, 3]),
            padding: [1, 1],
            dilation: [2, 1],
            ceil_mode,
        };
        let (want_y, o, dy, want_dx) = cpu_pool(&x, &shape, &|t| max_pool2d(t, &opts).unwrap());
        let g = geometry(&o, [3, 2], [2, 3], [1, 1], [2, 1], true, 0);
        let (mut y, mut arg, mut dx) = (vec![0.0f32; want_y.len()], vec![0i64; want_y.len()], vec![0.0f32; x.len()]);
        let (xp, yp, ap, dyp, dxp) = (p(&x), pm(&mut y), pm(&mut arg), p(&dy), pm(&mut dx));
        // SAFETY: buffers sized by the CPU's output shape.
        k.launch(GRID_STRIDE, || unsafe { max_f(g, xp.get(), yp.get(), ap.get()) });
        // SAFETY: as above.
        k.launch(Launch { grid: 2, block: 2 }, || unsafe { max_b(g, ap.get(), dyp.get(), dxp.get()) });
        assert_eq!(bits(&y), bits(&want_y), "max_pool2d dilated, ceil_mode {ceil_mode}");
        assert_slices_close(&format!("max_pool2d backward, ceil_mode {ceil_mode}"), &dx, &want_dx, 1e-6, 1e-6);
        for (cip, div) in [(true, None), (false, None), (true, Some(3usize))] {
            let opts = AvgPool2dOptions {
                kernel_size: [3, 3],
                stride: Some([2, 2]),
                padding: [1, 1],
                ceil_mode,
                count_include_pad: cip,
                divisor_override: div,
            };
            let finite: Vec<f32> = x.iter().map(|v| if v.is_nan() { 0.5 } else { *v }).collect();
            let (want_y, o, dy, want_dx) = cpu_pool(&finite, &shape, &|t| avg_pool2d(t, &opts).unwrap());
            let g = geometry(&o, [3, 3], [2, 2], [1, 1], [1, 1], cip, div.unwrap_or(0));
            let (mut y, mut dx) = (vec![0.0f32; want_y.len()], vec![0.0f32; x.len()]);
            let (xp, yp, dyp, dxp) = (p(&finite), pm(&mut y), p(&dy), pm(&mut dx));
            // SAFETY: buffers sized by the CPU's output shape.
            k.launch(GRID_STRIDE, || unsafe { avg_f(g, xp.get(), yp.get()) });
            // SAFETY: as above.
            k.launch(Launch { grid: 2, block: 2 }, || unsafe { avg_b(g, dyp.get(), dxp.get()) });
            let what = format!("avg_pool2d ceil_mode {ceil_mode} count_include_pad {cip} divisor {div:?}");
            assert_slices_close(&what, &y, &want_y, 1e-6, 1e-6);
            assert_slices_close(&format!("{what} backward"), &dx, &want_dx, 1e-6, 1e-6);
        }
    }
}

#[test]
fn batch_norm_train_and_eval_and_group_norm_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = HostKernels::compile("batch_norm.cu");
    type Stats = unsafe extern "C" fn(i64, i64, i64, *const f32, f32, f32, *mut f32, *mut f32, *mut f32, *mut f32);
    type EvalStats = unsafe extern "C" fn(i64, *const f32, *const f32, f32, *mut f32, *mut f32);
    type Apply =
        unsafe extern "C" fn(i64, i64, i64, *const f32, *const f32, *const f32, *const f32, *const f32, *mut f32);
    type Reduce =
        unsafe extern "C" fn(i64, i64, i64, *const f32, *const f32, *const f32, *const f32, *mut f32, *mut f32);
    type Input = unsafe extern "C" fn(
        i64,
        i64,
        i64,
        i32,
        *const f32,
        *const f32,
        *const f32,
        *const f32,
        *const f32,
        *const f32,
        *const f32,
        *mut f32,
    );
    // SAFETY: the kernels' signatures.
    let (stats, eval_stats, apply, reduce, input): (Stats, EvalStats, Apply, Reduce, Input) = unsafe {
        (
            k.kernel("batch_norm_stats_f32"),
            k.kernel("batch_norm_eval_stats_f32"),
            k.kernel("batch_norm_apply_f32"),
            k.kernel("batch_norm_backward_reduce_f32"),
            k.kernel("batch_norm_backward_input_f32"),
        )
    };
    let floats = |a: &Value, key: &str, c: usize, default: f32| -> Vec<f32> {
        a.get(key)
            .and_then(Value::as_array)
            .map(|v| v.iter().map(|x| x.as_f64().unwrap() as f32).collect())
            .unwrap_or(vec![default; c])
    };
    for name in ["batch_norm2d__train", "batch_norm1d__train", "batch_norm2d__eval"] {
        let case = case(&dir, "models", name);
        let s = case.shape("input.0");
        let (n, ch, l) = (s[0], s[1], s[2..].iter().product::<usize>());
        let a = &case.attrs;
        let training = a["training"].as_bool().unwrap();
        let eps = a["eps"].as_f64().unwrap() as f32;
        let momentum = a.get("momentum").and_then(Value::as_f64).unwrap_or(0.1) as f32;
        let (x, w, b, dy) =
            (case.f32s("input.0"), case.f32s("input.1"), case.f32s("input.2"), case.f32s("grad_output"));
        let (mut mean, mut invstd) = (vec![f32::NAN; ch], vec![f32::NAN; ch]);
        let (mut rm, mut rv) = if training {
            (floats(a, "running_mean_before", ch, 0.0), floats(a, "running_var_before", ch, 1.0))
        } else {
            (floats(a, "running_mean", ch, 0.0), floats(a, "running_var", ch, 1.0))
        };
        let (xp, mp, ip, rmp, rvp) = (p(&x), pm(&mut mean), pm(&mut invstd), pm(&mut rm), pm(&mut rv));
        let (ni, ci, li) = (n as i64, ch as i64, l as i64);
        if training {
            // SAFETY: n·c·l inputs, c statistics each.
            k.launch(Launch { grid: 2, block: 256 }, || unsafe {
                stats(ni, ci, li, xp.get(), eps, momentum, mp.get(), ip.get(), rmp.get(), rvp.get())
            });
        } else {
            // SAFETY: c running statistics and outputs.
            k.launch(GRID_STRIDE, || unsafe { eval_stats(ci, rmp.get(), rvp.get(), eps, mp.get(), ip.get()) });
        }
        let mut y = vec![f32::NAN; x.len()];
        let (wp, bp, yp) = (p(&w), p(&b), pm(&mut y));
        // SAFETY: as above.
        k.launch(GRID_STRIDE, || unsafe {
            apply(ni, ci, li, xp.get(), mp.get(), ip.get(), wp.get(), bp.get(), yp.get())
        });
        case.check(name, &y, "output");
        if training {
            case.check(&format!("{name} running_mean"), &rm, "extra.running_mean");
            case.check(&format!("{name} running_var"), &rv, "extra.running_var");
        }
        let (mut sdy, mut sdx) = (vec![f32::NAN; ch], vec![f32::NAN; ch]);
        let mut dx = vec![f32::NAN; x.len()];
        let (dyp, sp, sxp, dxp) = (p(&dy), pm(&mut sdy), pm(&mut sdx), pm(&mut dx));
        // SAFETY: as above.
        k.launch(Launch { grid: 2, block: 256 }, || unsafe {
            reduce(ni, ci, li, xp.get(), dyp.get(), mp.get(), ip.get(), sp.get(), sxp.get())
        });
        // SAFETY: as above.
        k.launch(GRID_STRIDE, || unsafe {
            input(
                ni,
                ci,
                li,
                training as i32,
                xp.get(),
                dyp.get(),
                mp.get(),
                ip.get(),
                wp.get(),
                sp.get(),
                sxp.get(),
                dxp.get(),
            )
        });
        case.check(&format!("{name} grad input"), &dx, "grad_input.0");
        case.check(&format!("{name} grad weight"), &sdx, "grad_input.1");
        case.check(&format!("{name} grad bias"), &sdy, "grad_input.2");
        println!("{name}: forward, running statistics and gradients ok");
    }

    // Group norm: layer_norm.cu over [N·G, C/G·L] rows, the affine and its gradients here.
    let ln = HostKernels::compile("layer_norm.cu");
    let case = case(&dir, "models", "group_norm__g3");
    let s = case.shape("input.0");
    let (n, ch, l) = (s[0], s[1], s[2..].iter().product::<usize>());
    let groups = case.attrs["num_groups"].as_u64().unwrap() as usize;
    let eps = case.attrs["eps"].as_f64().unwrap() as f32;
    let (rows, cols) = (n * groups, ch / groups * l);
    let (x, w, b, dy) = (case.f32s("input.0"), case.f32s("input.1"), case.f32s("input.2"), case.f32s("grad_output"));
    type LnForward =
        unsafe extern "C" fn(i64, i64, f32, *const f32, *const f32, *const f32, *mut f32, *mut f32, *mut f32);
    type LnInput = unsafe extern "C" fn(i64, i64, *const f32, *const f32, *const f32, *const f32, *const f32, *mut f32);
    type Affine = unsafe extern "C" fn(i64, i64, i64, *const f32, *const f32, *const f32, *mut f32);
    type AffineGrad =
        unsafe extern "C" fn(i64, i64, i64, i64, *const f32, *const f32, *const f32, *const f32, *mut f32, *mut f32);
    // SAFETY: the kernels' signatures.
    let (ln_f, ln_in, affine, affine_grad): (LnForward, LnInput, Affine, AffineGrad) = unsafe {
        (
            ln.kernel("layer_norm_f32"),
            ln.kernel("layer_norm_backward_input_f32"),
            k.kernel("channel_affine_f32"),
            k.kernel("group_norm_backward_affine_f32"),
        )
    };
    let (mut xhat, mut mean, mut rstd, mut y) =
        (vec![f32::NAN; x.len()], vec![f32::NAN; rows], vec![f32::NAN; rows], vec![f32::NAN; x.len()]);
    let null = Shared(std::ptr::null_mut::<f32>());
    let (xp, hp, mp, rp, wp, bp, yp) = (p(&x), pm(&mut xhat), pm(&mut mean), pm(&mut rstd), p(&w), p(&b), pm(&mut y));
    let (ni, ci, li, gi) = (n as i64, ch as i64, l as i64, groups as i64);
    // SAFETY: rows·cols = n·c·l values, rows statistics, c weights.
    k.launch(ROWS, || unsafe {
        ln_f(rows as i64, cols as i64, eps, xp.get(), null.get(), null.get(), hp.get(), mp.get(), rp.get())
    });
    // SAFETY: as above.
    k.launch(GRID_STRIDE, || unsafe { affine(ni, ci, li, hp.get(), wp.get(), bp.get(), yp.get()) });
    case.check("group_norm", &y, "output");
    let (mut g, mut dx, mut dw, mut db) =
        (vec![f32::NAN; x.len()], vec![f32::NAN; x.len()], vec![f32::NAN; ch], vec![f32::NAN; ch]);
    let (dyp, gp, dxp, dwp, dbp) = (p(&dy), pm(&mut g), pm(&mut dx), pm(&mut dw), pm(&mut db));
    // SAFETY: as above.
    k.launch(GRID_STRIDE, || unsafe { affine(ni, ci, li, dyp.get(), wp.get(), null.get(), gp.get()) });
    // SAFETY: as above.
    k.launch(ROWS, || unsafe {
        ln_in(rows as i64, cols as i64, xp.get(), null.get(), mp.get(), rp.get(), gp.get(), dxp.get())
    });
    // SAFETY: as above.
    k.launch(GRID_STRIDE, || unsafe {
        affine_grad(ni, ci, li, gi, xp.get(), mp.get(), rp.get(), dyp.get(), dwp.get(), dbp.get())
    });
    case.check("group_norm grad input", &dx, "grad_input.0");
    case.check("group_norm grad weight", &dw, "grad_input.1");
    case.check("group_norm grad bias", &db, "grad_input.2");
}

/// `ConvGeometry` of conv.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct ConvGeometry {
    channels: i64,
    h: i64,
    w: i64,
    out_h: i64,
    out_w: i64,
    kh: i32,
    kw: i32,
    sh: i32,
    sw: i32,
    ph: i32,
    pw: i32,
    dh: i32,
    dw: i32,
}

/// The matrix products a backend hands to cuBLAS, on the host in f64: `c[m×n] = a[m×k] · b[k×n]`
/// with each operand given by (data, row stride, column stride).
fn gemm(m: usize, n: usize, k: usize, a: (&[f32], usize, usize), b: (&[f32], usize, usize)) -> Vec<f32> {
    let mut c = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f64;
            for t in 0..k {
                acc += a.0[i * a.1 + t * a.2] as f64 * b.0[t * b.1 + j * b.2] as f64;
            }
            c[i * n + j] = acc as f32;
        }
    }
    c
}

#[test]
fn convolutions_through_im2col_and_col2im_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = HostKernels::compile("conv.cu");
    type Fold = unsafe extern "C" fn(ConvGeometry, *const f32, *mut f32);
    // SAFETY: the kernels' signatures.
    let (im2col, col2im): (Fold, Fold) = unsafe { (k.kernel("im2col_f32"), k.kernel("col2im_f32")) };
    let run = |f: Fold, g: ConvGeometry, input: &[f32], out_len: usize| {
        let mut out = vec![f32::NAN; out_len];
        let (ip, op) = (p(input), pm(&mut out));
        // SAFETY: `input` and `out` hold the image and the columns the geometry names.
        k.launch(GRID_STRIDE, || unsafe { f(g, ip.get(), op.get()) });
        out
    };
    let list = |a: &Value, key: &str, default: i32| -> Vec<i32> {
        a.get(key)
            .and_then(Value::as_array)
            .map(|v| v.iter().map(|x| x.as_i64().unwrap() as i32).collect())
            .unwrap_or(vec![default; 2])
    };
    for name in [
        "conv2d__s1_p1",
        "conv2d__s2_p2_d2",
        "conv2d__groups2_nobias",
        "conv2d__depthwise_5x5",
        "conv1d__k4",
        "conv_transpose2d__s2",
    ] {
        let c = case(&dir, "models", name);
        let a = &c.attrs;
        // conv1d is a conv2d of height 1.
        let as2d = |s: Vec<usize>| if s.len() == 3 { vec![s[0], s[1], 1, s[2]] } else { s };
        let pad2 = |v: Vec<i32>, d: i32| if v.len() == 1 { vec![d, v[0]] } else { v };
        let (xs, ws, ys) = (as2d(c.shape("input.0")), as2d(c.shape("input.1")), as2d(c.shape("output")));
        let (st, pd, dl) =
            (pad2(list(a, "stride", 1), 1), pad2(list(a, "padding", 0), 0), pad2(list(a, "dilation", 1), 1));
        let groups = a.get("groups").and_then(Value::as_u64).unwrap_or(1) as usize;
        let transposed = name.starts_with("conv_transpose");
        let (x, w, dy) = (c.f32s("input.0"), c.f32s("input.1"), c.f32s("grad_output"));
        let bias = (c.attrs.get("bias") != Some(&Value::Bool(false))).then(|| c.f32s("input.2"));
        let (n, kh, kw) = (xs[0], ws[2], ws[3]);
        let kk = kh * kw;
        let (cin, cout) = (xs[1], ys[1]);
        // The image the columns are cut from: the input (conv) or the output (transposed conv).
        let (img_c, img_h, img_w, grid_h, grid_w) =
            if transposed { (cout, ys[2], ys[3], xs[2], xs[3]) } else { (cin, xs[2], xs[3], ys[2], ys[3]) };
        let g = ConvGeometry {
            channels: img_c as i64,
            h: img_h as i64,
            w: img_w as i64,
            out_h: grid_h as i64,
            out_w: grid_w as i64,
            kh: kh as i32,
            kw: kw as i32,
            sh: st[0],
            sw: st[1],
            ph: pd[0],
            pw: pd[1],
            dh: dl[0],
            dw: dl[1],
        };
        let (img_len, plane) = (img_c * img_h * img_w, grid_h * grid_w);
        let col_rows = img_c * kk;
        let (in_len, out_len) = (cin * xs[2] * xs[3], cout * ys[2] * ys[3]);
        let (mut y, mut dx, mut dw) = (vec![0.0f32; n * out_len], vec![0.0f32; n * in_len], vec![0.0f32; w.len()]);
        for s in 0..n {
            let (xn, dyn_) = (&x[s * in_len..(s + 1) * in_len], &dy[s * out_len..(s + 1) * out_len]);
            if !transposed {
                // y = W · im2col(x); dW += dy · colsᵀ; dx = col2im(Wᵀ · dy); per group.
                let cols = run(im2col, g, xn, col_rows * plane);
                let (ci_g, co_g) = (cin / groups, cout / groups);
                let mut dcols = vec![0.0f32; col_rows * plane];
                for gi in 0..groups {
                    let r0 = gi * ci_g * kk;
                    let wg = &w[gi * co_g * ci_g * kk..(gi + 1) * co_g * ci_g * kk];
                    let colg = &cols[r0 * plane..(r0 + ci_g * kk) * plane];
                    let yg = gemm(co_g, plane, ci_g * kk, (wg, ci_g * kk, 1), (colg, plane, 1));
                    y[s * out_len + gi * co_g * plane..s * out_len + (gi + 1) * co_g * plane].copy_from_slice(&yg);
                    let dyg = &dyn_[gi * co_g * plane..(gi + 1) * co_g * plane];
                    let dwg = gemm(co_g, ci_g * kk, plane, (dyg, plane, 1), (colg, 1, plane));
                    for (d, v) in dw[gi * co_g * ci_g * kk..].iter_mut().zip(&dwg) {
                        *d += v;
                    }
                    let dcg = gemm(ci_g * kk, plane, co_g, (wg, 1, ci_g * kk), (dyg, plane, 1));
                    dcols[r0 * plane..(r0 + ci_g * kk) * plane].copy_from_slice(&dcg);
                }
                dx[s * in_len..(s + 1) * in_len].copy_from_slice(&run(col2im, g, &dcols, img_len));
            } else {
                // y = col2im(Wᵀ · x); dx = W · im2col(dy); dW += x · im2col(dy)ᵀ (one group).
                assert_eq!(groups, 1);
                let cols = gemm(cout * kk, plane, cin, (&w, 1, cout * kk), (xn, plane, 1));
                y[s * out_len..(s + 1) * out_len].copy_from_slice(&run(col2im, g, &cols, img_len));
                let dcols = run(im2col, g, dyn_, col_rows * plane);
                let dxn = gemm(cin, plane, cout * kk, (&w, cout * kk, 1), (&dcols, plane, 1));
                dx[s * in_len..(s + 1) * in_len].copy_from_slice(&dxn);
                let dwn = gemm(cin, cout * kk, plane, (xn, plane, 1), (&dcols, 1, plane));
                for (d, v) in dw.iter_mut().zip(&dwn) {
                    *d += v;
                }
            }
        }
        let per_channel = ys[2] * ys[3];
        if let Some(b) = &bias {
            for (i, v) in y.iter_mut().enumerate() {
                *v += b[(i / per_channel) % cout];
            }
        }
        c.check(name, &y, "output");
        c.check(&format!("{name} grad input"), &dx, "grad_input.0");
        c.check(&format!("{name} grad weight"), &dw, "grad_input.1");
        println!("{name}: forward, input and weight gradients ok (x {xs:?}, w {ws:?}, groups {groups})");
    }
}

/// `m` rows of `a[m×n]` plus `bias[n]` on each.
fn add_bias(mut a: Vec<f32>, bias: &[f32]) -> Vec<f32> {
    let n = bias.len();
    for (i, v) in a.iter_mut().enumerate() {
        *v += bias[i % n];
    }
    a
}

/// Column sums of `a[m×n]`, added into `acc`.
fn add_col_sums(acc: &mut [f32], a: &[f32]) {
    let n = acc.len();
    for (i, v) in a.iter().enumerate() {
        acc[i % n] += v;
    }
}

fn add_into(acc: &mut [f32], a: &[f32]) {
    for (x, y) in acc.iter_mut().zip(a) {
        *x += y;
    }
}

#[test]
fn lstm_and_gru_cells_over_whole_sequences_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = HostKernels::compile("recurrent.cu");
    let null = Shared(std::ptr::null_mut::<f32>());
    for (folder, name, gates) in [("ops", "lstm__batch_first", 4usize), ("models", "gru__batch_first", 3)] {
        let c = case(&dir, folder, name);
        let (xs, hid) = (c.shape("input.0"), c.attrs["hidden_size"].as_u64().unwrap() as usize);
        let (b, t_len, inp) = (xs[0], xs[1], xs[2]);
        let gh_w = gates * hid;
        let (x, w_ih, w_hh, b_ih, b_hh) =
            (c.f32s("input.0"), c.f32s("input.1"), c.f32s("input.2"), c.f32s("input.3"), c.f32s("input.4"));
        let dy = c.f32s("grad_output");
        // Every step's input projection at once: [B·T, G·H].
        let gx_all = add_bias(gemm(b * t_len, gh_w, inp, (&x, inp, 1), (&w_ih, 1, inp)), &b_ih);
        let mut out = vec![f32::NAN; b * t_len * hid];
        let mut hs: Vec<Vec<f32>> = vec![vec![0.0; b * hid]]; // h before each step
        let mut cs: Vec<Vec<f32>> = vec![vec![0.0; b * hid]];
        let mut acts: Vec<Vec<f32>> = Vec::new();
        let (gxp, outp) = (p(&gx_all), pm(&mut out));
        for t in 0..t_len {
            let gh = add_bias(gemm(b, gh_w, hid, (&hs[t], hid, 1), (&w_hh, 1, hid)), &b_hh);
            let mut act = vec![f32::NAN; b * 4 * hid];
            let mut cnew = vec![f32::NAN; b * hid];
            let (ghp, ap, cp, cpp) = (p(&gh), pm(&mut act), pm(&mut cnew), p(&cs[t]));
            let hp = p(&hs[t]);
            let (bi, hi) = (b as i64, hid as i64);
            if gates == 4 {
                // SAFETY: the kernel's signature; strided rows stay inside gx_all and out.
                let f: unsafe extern "C" fn(
                    i64,
                    i64,
                    *const f32,
                    i64,
                    *const f32,
                    *const f32,
                    *mut f32,
                    i64,
                    *mut f32,
                    *mut f32,
                ) = unsafe { k.kernel("lstm_cell_f32") };
                let prev = if t == 0 { null } else { cpp };
                // SAFETY: as above.
                k.launch(GRID_STRIDE, || unsafe {
                    f(
                        bi,
                        hi,
                        gxp.get().add(t * gh_w),
                        (t_len * gh_w) as i64,
                        ghp.get(),
                        prev.get(),
                        outp.get().add(t * hid),
                        (t_len * hid) as i64,
                        cp.get(),
                        ap.get(),
                    )
                });
            } else {
                // SAFETY: as above.
                let f: unsafe extern "C" fn(
                    i64,
                    i64,
                    *const f32,
                    i64,
                    *const f32,
                    *const f32,
                    *mut f32,
                    i64,
                    *mut f32,
                ) = unsafe { k.kernel("gru_cell_f32") };
                let prev = if t == 0 { null } else { hp };
                // SAFETY: as above.
                k.launch(GRID_STRIDE, || unsafe {
                    f(
                        bi,
                        hi,
                        gxp.get().add(t * gh_w),
                        (t_len * gh_w) as i64,
                        ghp.get(),
                        prev.get(),
                        outp.get().add(t * hid),
                        (t_len * hid) as i64,
                        ap.get(),
                    )
                });
            }
            let h: Vec<f32> = (0..b * hid).map(|i| out[(i / hid) * t_len * hid + t * hid + i % hid]).collect();
            hs.push(h);
            cs.push(cnew);
            acts.push(act);
        }
        c.check(name, &out, "output");
        if gates == 3 {
            c.check(&format!("{name} h_n"), &hs[t_len], "extra.h_n");
        }
        // Backpropagation through time.
        let mut dgx_all = vec![0.0f32; b * t_len * gh_w];
        let (mut dw_hh, mut db_hh) = (vec![0.0f32; gh_w * hid], vec![0.0f32; gh_w]);
        let mut dh_next = vec![0.0f32; b * hid];
        let mut dc_next: Option<Vec<f32>> = None;
        for t in (0..t_len).rev() {
            let dh: Vec<f32> =
                (0..b * hid).map(|i| dy[(i / hid) * t_len * hid + t * hid + i % hid] + dh_next[i]).collect();
            let (bi, hi) = (b as i64, hid as i64);
            let (ap, dhp) = (p(&acts[t]), p(&dh));
            let (dgx, dgh, direct) = if gates == 4 {
                let mut dg = vec![f32::NAN; b * gh_w];
                let mut dcp = vec![f32::NAN; b * hid];
                let (cprev, cnow) = (if t == 0 { null } else { p(&cs[t]) }, p(&cs[t + 1]));
                let dcn = dc_next.as_deref().map(p).unwrap_or(null);
                let (dgp, dcpp) = (pm(&mut dg), pm(&mut dcp));
                // SAFETY: the kernel's signature; [B, 4H] and [B, H] buffers.
                let f: unsafe extern "C" fn(
                    i64,
                    i64,
                    *const f32,
                    *const f32,
                    *const f32,
                    *const f32,
                    i64,
                    *const f32,
                    *mut f32,
                    *mut f32,
                ) = unsafe { k.kernel("lstm_cell_backward_f32") };
                // SAFETY: as above.
                k.launch(GRID_STRIDE, || unsafe {
                    f(bi, hi, ap.get(), cprev.get(), cnow.get(), dhp.get(), hi, dcn.get(), dgp.get(), dcpp.get())
                });
                dc_next = Some(dcp);
                (dg.clone(), dg, vec![0.0f32; b * hid])
            } else {
                let (mut dgx, mut dgh, mut direct) =
                    (vec![f32::NAN; b * gh_w], vec![f32::NAN; b * gh_w], vec![f32::NAN; b * hid]);
                let hprev = if t == 0 { null } else { p(&hs[t]) };
                let (xp, hp, dp) = (pm(&mut dgx), pm(&mut dgh), pm(&mut direct));
                // SAFETY: the kernel's signature; [B, 3H] and [B, H] buffers.
                let f: unsafe extern "C" fn(
                    i64,
                    i64,
                    *const f32,
                    *const f32,
                    *const f32,
                    i64,
                    *mut f32,
                    *mut f32,
                    *mut f32,
                ) = unsafe { k.kernel("gru_cell_backward_f32") };
                // SAFETY: as above.
                k.launch(GRID_STRIDE, || unsafe {
                    f(bi, hi, ap.get(), hprev.get(), dhp.get(), hi, xp.get(), hp.get(), dp.get())
                });
                (dgx, dgh, direct)
            };
            for row in 0..b {
                dgx_all[(row * t_len + t) * gh_w..(row * t_len + t + 1) * gh_w]
                    .copy_from_slice(&dgx[row * gh_w..(row + 1) * gh_w]);
            }
            add_into(&mut dw_hh, &gemm(gh_w, hid, b, (&dgh, 1, gh_w), (&hs[t], hid, 1)));
            add_col_sums(&mut db_hh, &dgh);
            dh_next = gemm(b, hid, gh_w, (&dgh, gh_w, 1), (&w_hh, hid, 1));
            add_into(&mut dh_next, &direct);
        }
        let dx = gemm(b * t_len, inp, gh_w, (&dgx_all, gh_w, 1), (&w_ih, inp, 1));
        let dw_ih = gemm(gh_w, inp, b * t_len, (&dgx_all, 1, gh_w), (&x, inp, 1));
        let mut db_ih = vec![0.0f32; gh_w];
        add_col_sums(&mut db_ih, &dgx_all);
        for (i, got) in [&dx, &dw_ih, &dw_hh, &db_ih, &db_hh].into_iter().enumerate() {
            c.check(&format!("{name} grad_input.{i}"), got, &format!("grad_input.{i}"));
        }
        println!("{name}: {t_len} steps forward and back, every gradient ok");
    }
}
