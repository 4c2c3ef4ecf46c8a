//! What the CUDA kernels compute, checked without a GPU: every kernel source of `kernels/` runs on
//! the CPU through ferrite-cuda's host emulator ([`HostModule`]: the source compiled unchanged as
//! C++20 with `emulator/cuda_on_host.h`, blocks one after another, a block's threads on OS threads
//! sharing `__shared__` memory and a `__syncthreads` barrier), launched by name with the argument
//! arrays a GPU launch takes ([`KernelArg`]). Checked against the PyTorch reference cases within
//! each case's tolerances — elementwise ops with broadcasting and their gradients, strided copies,
//! row reductions, softmax and log_softmax, cross entropy, layer/RMS/batch/group norm, embedding,
//! pooling, convolution through im2col/col2im, whole LSTM and GRU sequences — plus the
//! device-side error flags (a class or an index out of range), the fused optimizer steps against
//! PyTorch's update rules written out in f64, and the random and cast kernels against the CPU
//! backend's bits. Launches use small grids and blocks so the grid-stride loops run more than once.
//!
//! Skips loudly without a C++20 compiler (fails under `FERRITE_REQUIRE_SYSTEM_DEPS=1`; CI
//! installs g++) and without the fixtures.

use std::path::{Path, PathBuf};

use ferrite_cuda::records::{ConvGemm, ConvGeometry};
use ferrite_cuda::{HostModule, KERNEL_SOURCES, KernelArg};
use ferrite_tensor::Tensor;
use ferrite_test_support::assert_slices_close;
use ferrite_test_support::fixtures::{get, load};
use serde_json::Value;

use KernelArg::{F32, F64, I32, U32, U64};

/// Whether the host compiler runs; otherwise a loud skip (a failure under
/// `FERRITE_REQUIRE_SYSTEM_DEPS=1`, which CI sets after installing g++).
fn compiler_or_skip() -> bool {
    ferrite_test_support::present_or_skip(
        HostModule::compiler_available(),
        "no C++20 compiler (`$CXX`, default g++) to run the CUDA kernels on the CPU",
        "apt-get install g++ (or set CXX)",
    )
}

/// The fixture folder, or `None` after the skip rule (also when there is no C++ compiler).
fn setup() -> Option<PathBuf> {
    if !compiler_or_skip() {
        return None;
    }
    ferrite_test_support::reference_or_skip("ops/manifest.json")
}

/// A grid and block size (x only: ferrite's kernels are one-dimensional).
#[derive(Clone, Copy, Debug)]
struct Launch {
    grid: u32,
    block: u32,
}

const GRID_STRIDE: Launch = Launch { grid: 2, block: 32 };
/// The row kernels' block (`FERRITE_BLOCK` in the sources), two blocks so rows stride too.
const ROWS: Launch = Launch { grid: 2, block: 256 };
/// Few threads: kernels with one thread per column, plane or channel.
const FEW: Launch = Launch { grid: 2, block: 2 };

/// One kernel source compiled for the host.
struct Kernels(HostModule);

fn compile(name: &str) -> Kernels {
    let source = KERNEL_SOURCES.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no kernel source {name}"));
    Kernels(HostModule::compile(source).unwrap_or_else(|e| panic!("{e}")))
}

impl Kernels {
    /// Launches `kernel` with `args`.
    ///
    /// # Safety
    /// As [`HostModule::launch`]: the arguments match the kernel's parameters and every pointer
    /// is valid for what the kernel touches.
    unsafe fn run(&self, kernel: &str, launch: Launch, args: &[KernelArg]) {
        // SAFETY: the caller's promise.
        unsafe { self.0.launch(kernel, launch.grid, launch.block, args) }.unwrap_or_else(|e| panic!("{e}"));
    }
}

/// A buffer argument (read).
fn buf<T>(v: &[T]) -> KernelArg {
    KernelArg::ptr(v.as_ptr())
}
/// A buffer argument the kernel writes.
fn out<T>(v: &mut [T]) -> KernelArg {
    KernelArg::ptr(v.as_mut_ptr() as *const T)
}
/// A size (`long long`).
fn n(v: usize) -> KernelArg {
    KernelArg::I64(v as i64)
}
/// An absent optional buffer.
const NULL: KernelArg = KernelArg::Ptr(0);

/// The case `name` of the fixtures' `folder`: its tensors, attributes and tolerances.
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

/// (rows, cols) of a buffer reduced over its last dimension.
fn rows_cols(shape: &[usize]) -> (usize, usize) {
    let cols = *shape.last().unwrap_or(&1);
    (shape.iter().product::<usize>() / cols.max(1), cols)
}

#[test]
fn a_launch_names_its_kernel_and_the_source_must_define_it() {
    if !compiler_or_skip() {
        return;
    }
    let k = compile("elementwise.cu");
    // SAFETY: the kernel is not launched (the name is refused first).
    let e = unsafe { k.0.launch("no_such_kernel", 1, 1, &[]) }.unwrap_err();
    assert!(matches!(&e, ferrite_cuda::CudaError::NoSuchKernel { kernel, .. } if kernel == "no_such_kernel"), "{e}");
    let broken = ferrite_cuda::KernelSource {
        name: "broken.cu",
        code: "extern \"C\" __global__ void k(float* x) { x[0] = nope; }",
        kernels: &["k"],
    };
    let e = HostModule::compile(&broken).unwrap_err().to_string();
    assert!(e.contains("broken.cu") && e.contains("nope"), "{e}");
}

#[test]
fn unary_kernels_and_their_gradients_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = compile("elementwise.cu");
    let kb = compile("activation_backward.cu");
    for (name, kernel, backward, saved) in [
        ("neg", "neg_f32", None, ""),
        ("exp", "exp_f32", None, ""),
        ("log", "log_f32", None, ""),
        ("sqrt", "sqrt_f32", None, ""),
        ("relu", "relu_f32", Some("relu_backward_f32"), "input.0"),
        ("sigmoid", "sigmoid_f32", Some("sigmoid_backward_f32"), "output"),
        ("tanh", "tanh_f32", Some("tanh_backward_f32"), "output"),
        ("silu", "silu_f32", Some("silu_backward_f32"), "input.0"),
        ("gelu__erf", "gelu_f32", Some("gelu_backward_f32"), "input.0"),
        ("gelu__tanh", "gelu_tanh_f32", Some("gelu_tanh_backward_f32"), "input.0"),
    ] {
        let c = case(&dir, "ops", name);
        let x = c.f32s("input.0");
        let mut y = vec![f32::NAN; x.len()];
        // SAFETY: n elements in each buffer.
        unsafe { k.run(kernel, GRID_STRIDE, &[n(x.len()), buf(&x), out(&mut y)]) };
        c.check(name, &y, "output");
        if let Some(backward) = backward {
            // What the forward saved for the gradient: its input or its output.
            let (s, dy) = (c.f32s(saved), c.f32s("grad_output"));
            let mut dx = vec![f32::NAN; s.len()];
            // SAFETY: as above.
            unsafe { kb.run(backward, GRID_STRIDE, &[n(s.len()), buf(&s), buf(&dy), out(&mut dx)]) };
            c.check(&format!("{name} backward"), &dx, "grad_input.0");
        }
    }
}

/// `Broadcast` of elementwise.cu.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Broadcast {
    ndim: i32,
    _pad: i32,
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

/// How a gradient of `out_shape` sums back to an input of `in_shape` (right-aligned, as
/// broadcasting aligns): the broadcast dimensions must form one run, and the sum is over it —
/// (outer, rows, cols) for `sum_middle_f32`.
fn broadcast_run(in_shape: &[usize], out_shape: &[usize]) -> (usize, usize, usize) {
    let pad = out_shape.len() - in_shape.len();
    let expanded: Vec<usize> =
        (0..out_shape.len()).filter(|&d| out_shape[d] > 1 && (d < pad || in_shape[d - pad] == 1)).collect();
    let (first, last) = match (expanded.first(), expanded.last()) {
        (Some(f), Some(l)) => (*f, *l),
        _ => return (out_shape.iter().product(), 1, 1),
    };
    assert_eq!(last - first + 1, expanded.len(), "{in_shape:?} -> {out_shape:?}: one run of broadcast dimensions");
    let prod = |r: &[usize]| r.iter().product::<usize>();
    (prod(&out_shape[..first]), prod(&out_shape[first..=last]), prod(&out_shape[last + 1..]))
}

#[test]
fn binary_kernels_broadcast_and_their_gradients_sum_as_pytorch_does() {
    let Some(dir) = setup() else { return };
    let k = compile("elementwise.cu");
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
        let mut shape = [1i64; 6];
        for (d, s) in out_shape.iter().enumerate() {
            shape[d] = *s as i64;
        }
        let g = Broadcast {
            ndim: out_shape.len() as i32,
            _pad: 0,
            shape,
            a_stride: broadcast_strides(&c.shape("input.0"), &out_shape),
            b_stride: broadcast_strides(&b_shape, &out_shape),
        };
        let count: usize = out_shape.iter().product();
        let mut y = vec![f32::NAN; count];
        // SAFETY: the strides stay inside both inputs; `count` outputs.
        unsafe { k.run(kernel, GRID_STRIDE, &[n(count), KernelArg::record(&g), buf(&a), buf(&b), out(&mut y)]) };
        c.check(name, &y, "output");
    }
    // The gradients of a broadcast add are sums over the broadcast dimensions.
    let r = compile("reduce.cu");
    let sum = |x: &[f32], outer: usize, rows: usize, cols: usize| {
        let mut o = vec![f32::NAN; outer * cols];
        // SAFETY: outer·rows·cols inputs, outer·cols outputs.
        unsafe { r.run("sum_middle_f32", GRID_STRIDE, &[n(outer), n(rows), n(cols), buf(x), out(&mut o)]) };
        o
    };
    let c = case(&dir, "ops", "add__bcast");
    let (o, g) = (c.shape("output"), c.f32s("grad_output"));
    for i in 0..2 {
        let (outer, rows, cols) = broadcast_run(&c.shape(&format!("input.{i}")), &o);
        c.check(&format!("add__bcast grad {i}"), &sum(&g, outer, rows, cols), &format!("grad_input.{i}"));
    }
    let c = case(&dir, "ops", "sum__dim1_keepdim");
    let s = c.shape("input.0");
    c.check("sum__dim1_keepdim", &sum(&c.f32s("input.0"), s[0], s[1], s[2]), "output");
}

#[test]
fn row_reductions_softmax_and_log_softmax_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = compile("reduce.cu");
    let run = |kernel: &str, x: &[f32], rows: usize, cols: usize, out_len: usize| {
        let mut y = vec![f32::NAN; out_len];
        // SAFETY: rows·cols inputs and out_len outputs.
        unsafe { k.run(kernel, ROWS, &[n(rows), n(cols), buf(x), out(&mut y)]) };
        y
    };
    let c = case(&dir, "ops", "sum__all");
    let x = c.f32s("input.0");
    c.check("sum__all", &run("sum_rows_f32", &x, 1, x.len(), 1), "output");
    let c = case(&dir, "ops", "mean__dim_last");
    let (rows, cols) = rows_cols(&c.shape("input.0"));
    let sums = run("sum_rows_f32", &c.f32s("input.0"), rows, cols, rows);
    c.check("mean__dim_last", &sums.iter().map(|s| s / cols as f32).collect::<Vec<_>>(), "output");
    let want: Vec<f32> =
        c.f32s("input.0").chunks(cols).map(|r| r.iter().copied().fold(f32::NEG_INFINITY, f32::max)).collect();
    assert_eq!(run("max_rows_f32", &c.f32s("input.0"), rows, cols, rows), want);
    // A row longer than the block: 300 columns, each thread sums two.
    let long: Vec<f32> = (0..3 * 300).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
    let want: Vec<f32> = long.chunks(300).map(|r| r.iter().map(|v| *v as f64).sum::<f64>() as f32).collect();
    assert_slices_close("sum of 300-column rows", &run("sum_rows_f32", &long, 3, 300, 3), &want, 1e-5, 1e-4);

    for (name, forward, backward) in [
        ("softmax__dim_last", "softmax_rows_f32", "softmax_rows_backward_f32"),
        ("log_softmax__dim_last", "log_softmax_rows_f32", "log_softmax_rows_backward_f32"),
    ] {
        let c = case(&dir, "ops", name);
        let (rows, cols) = rows_cols(&c.shape("input.0"));
        let y = run(forward, &c.f32s("input.0"), rows, cols, rows * cols);
        c.check(name, &y, "output");
        let dy = c.f32s("grad_output");
        let mut dx = vec![f32::NAN; rows * cols];
        // SAFETY: rows·cols elements in each buffer.
        unsafe { k.run(backward, ROWS, &[n(rows), n(cols), buf(&y), buf(&dy), out(&mut dx)]) };
        c.check(&format!("{name} backward"), &dx, "grad_input.0");
    }
}

#[test]
fn max_with_index_matches_pytorch_with_ties_and_nan() {
    let Some(dir) = setup() else { return };
    let k = compile("reduce.cu");
    let run = |x: &[f32], rows: usize, cols: usize| {
        let (mut v, mut i) = (vec![f32::NAN; rows], vec![-1i64; rows]);
        // SAFETY: rows·cols inputs, rows values and indices.
        unsafe { k.run("max_rows_with_index_f32", ROWS, &[n(rows), n(cols), buf(x), out(&mut v), out(&mut i)]) };
        (v, i)
    };
    // max(dim=0) of the fixture: the rows of the transposed input.
    let c = case(&dir, "ops", "max__dim0");
    let s = c.shape("input.0");
    let (d0, rest) = (s[0], s[1..].iter().product::<usize>());
    let x = c.f32s("input.0");
    let xt: Vec<f32> = (0..rest * d0).map(|i| x[(i % d0) * rest + i / d0]).collect();
    c.check("max__dim0", &run(&xt, rest, d0).0, "output");
    // Ties keep the first index, a NaN is the max (its first occurrence), and a row longer than
    // the block reduces across threads.
    let rows_in = [vec![1.0, 3.0, 3.0, 2.0], vec![1.0, f32::NAN, 5.0, f32::NAN], vec![f32::NEG_INFINITY; 4]];
    for (row, (want_v, want_i)) in rows_in.iter().zip([(3.0f32, 1i64), (f32::NAN, 1), (f32::NEG_INFINITY, 0)]) {
        let (v, i) = run(row, 1, 4);
        assert!(v[0] == want_v || (v[0].is_nan() && want_v.is_nan()), "{row:?}: {}", v[0]);
        assert_eq!(i[0], want_i, "{row:?}");
    }
    let mut long = vec![0.0f32; 600];
    long[450] = 9.0;
    long[301] = 9.0;
    assert_eq!(run(&long, 1, 600), (vec![9.0], vec![301]));
}

#[test]
fn cross_entropy_and_its_gradient_match_pytorch_and_a_bad_class_is_flagged() {
    let Some(dir) = setup() else { return };
    let k = compile("reduce.cu");
    let c = case(&dir, "ops", "cross_entropy");
    let (rows, cols) = rows_cols(&c.shape("input.0"));
    let logits = c.f32s("input.0");
    let run = |target: &[i64], ignore: i64| {
        let mut loss = vec![f32::NAN; rows];
        let mut bad = vec![0u64; 1];
        let args = [n(rows), n(cols), buf(&logits), buf(target), KernelArg::I64(ignore), out(&mut loss), out(&mut bad)];
        // SAFETY: rows·cols logits, rows targets and losses, one flag word.
        unsafe { k.run("cross_entropy_rows_f32", ROWS, &args) };
        (loss, bad[0])
    };
    let target: Vec<i64> = c.attrs["target"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    let (loss, bad) = run(&target, -100);
    assert_eq!(bad, 0);
    let mean = (loss.iter().map(|l| *l as f64).sum::<f64>() / rows as f64) as f32;
    c.check("cross_entropy (mean of the rows)", &[mean], "output");
    // Mean over the rows: each row's scale is grad_output / rows.
    let scale = vec![c.f32s("grad_output")[0] / rows as f32; rows];
    let mut d = vec![f32::NAN; rows * cols];
    // SAFETY: rows·cols logits and gradients, rows targets and scales.
    unsafe {
        k.run(
            "cross_entropy_rows_backward_f32",
            ROWS,
            &[n(rows), n(cols), buf(&logits), buf(&target), buf(&scale), out(&mut d)],
        )
    };
    c.check("cross_entropy backward", &d, "grad_input.0");
    // ignore_index: that row's loss is 0; a class out of range: its row + 1 is flagged.
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

/// `Strided` of copy.cu.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Strided {
    ndim: i32,
    _pad: i32,
    offset: i64,
    shape: [i64; 8],
    stride: [i64; 8],
}

fn strided(offset: usize, shape: &[usize], stride: &[i64]) -> Strided {
    let mut s = Strided { ndim: shape.len() as i32, _pad: 0, offset: offset as i64, shape: [1; 8], stride: [0; 8] };
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
    let k = compile("copy.cu");
    let copy = |src: Strided, input: &[f32], count: usize| {
        let mut o = vec![f32::NAN; count];
        // SAFETY: every offset the view names lies inside `input`; `count` outputs.
        unsafe {
            k.run("strided_copy_f32", GRID_STRIDE, &[n(count), KernelArg::record(&src), buf(input), out(&mut o)])
        };
        o
    };
    // permute and transpose: the output's dimension d reads the input's dimension perm[d].
    for (name, perm) in [("permute__2_0_1", None), ("transpose__0_1", Some([1usize, 0]))] {
        let c = case(&dir, "ops", name);
        let (shape, strides) = (c.shape("input.0"), contiguous_strides(&c.shape("input.0")));
        let perm: Vec<usize> = match perm {
            None => c.attrs["dims"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect(),
            Some(p) => {
                let mut all: Vec<usize> = (0..shape.len()).collect();
                all.swap(p[0], p[1]);
                all
            }
        };
        let out_shape: Vec<usize> = perm.iter().map(|d| shape[*d]).collect();
        let out_strides: Vec<i64> = perm.iter().map(|d| strides[*d]).collect();
        let count = out_shape.iter().product();
        c.check(name, &copy(strided(0, &out_shape, &out_strides), &c.f32s("input.0"), count), "output");
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
    let count = shape.iter().product();
    let view = strided(start * strides[dim] as usize, &shape, &strides);
    c.check("narrow__dim1", &copy(view, &c.f32s("input.0"), count), "output");
    // expand: a stride of 0 repeats [4, 1, 4] along the middle dimension five times.
    let x: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let want: Vec<f32> = (0..80).map(|i| x[(i / 20) * 4 + i % 4]).collect();
    assert_eq!(copy(strided(0, &[4, 5, 4], &[4, 0, 1]), &x, 80), want);
}

#[test]
fn layer_norm_and_rms_norm_with_their_gradients_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = compile("layer_norm.cu");
    let c = case(&dir, "ops", "layer_norm");
    let (rows, cols) = rows_cols(&c.shape("input.0"));
    let eps = c.attrs["eps"].as_f64().unwrap() as f32;
    let (x, w, b, dy) = (c.f32s("input.0"), c.f32s("input.1"), c.f32s("input.2"), c.f32s("grad_output"));
    let (mut y, mut mean, mut rstd) = (vec![f32::NAN; rows * cols], vec![f32::NAN; rows], vec![f32::NAN; rows]);
    let (mut dx, mut dw, mut db) = (vec![f32::NAN; rows * cols], vec![f32::NAN; cols], vec![f32::NAN; cols]);
    let mut plain = vec![f32::NAN; rows * cols];
    let (r, cl) = (n(rows), n(cols));
    // SAFETY: rows·cols inputs and outputs, cols weights, rows statistics; null weight and bias
    // are the kernels' "no affine".
    unsafe {
        k.run(
            "layer_norm_f32",
            ROWS,
            &[r.clone(), cl.clone(), F32(eps), buf(&x), buf(&w), buf(&b), out(&mut y), out(&mut mean), out(&mut rstd)],
        );
        let args = [r.clone(), cl.clone(), buf(&x), buf(&w), buf(&mean), buf(&rstd), buf(&dy), out(&mut dx)];
        k.run("layer_norm_backward_input_f32", ROWS, &args);
        let args = [r.clone(), cl.clone(), buf(&x), buf(&mean), buf(&rstd), buf(&dy), out(&mut dw), out(&mut db)];
        k.run("layer_norm_backward_affine_f32", Launch { grid: 2, block: 4 }, &args);
        let mut m2 = mean.clone();
        let mut r2 = rstd.clone();
        k.run(
            "layer_norm_f32",
            ROWS,
            &[r, cl, F32(eps), buf(&x), NULL, NULL, out(&mut plain), out(&mut m2), out(&mut r2)],
        );
    }
    c.check("layer_norm", &y, "output");
    c.check("layer_norm grad input", &dx, "grad_input.0");
    c.check("layer_norm grad weight", &dw, "grad_input.1");
    c.check("layer_norm grad bias", &db, "grad_input.2");
    // Without affine: PyTorch's output minus the bias, divided by the weight.
    let want: Vec<f32> = c.f32s("output").iter().enumerate().map(|(i, o)| (o - b[i % cols]) / w[i % cols]).collect();
    assert_slices_close("layer_norm without affine", &plain, &want, 1e-3, 1e-4);

    let c = case(&dir, "models", "rms_norm");
    let (rows, cols) = rows_cols(&c.shape("input.0"));
    let eps = c.attrs["eps"].as_f64().unwrap() as f32;
    let (x, w, dy) = (c.f32s("input.0"), c.f32s("input.1"), c.f32s("grad_output"));
    let (mut y, mut rstd) = (vec![f32::NAN; rows * cols], vec![f32::NAN; rows]);
    let (mut dx, mut dw) = (vec![f32::NAN; rows * cols], vec![f32::NAN; cols]);
    // SAFETY: as above.
    unsafe {
        k.run("rms_norm_f32", ROWS, &[n(rows), n(cols), F32(eps), buf(&x), buf(&w), out(&mut y), out(&mut rstd)]);
        let args = [n(rows), n(cols), buf(&x), buf(&w), buf(&rstd), buf(&dy), out(&mut dx)];
        k.run("rms_norm_backward_input_f32", ROWS, &args);
        let args = [n(rows), n(cols), buf(&x), buf(&rstd), buf(&dy), out(&mut dw)];
        k.run("rms_norm_backward_weight_f32", Launch { grid: 2, block: 4 }, &args);
    }
    c.check("rms_norm", &y, "output");
    c.check("rms_norm grad input", &dx, "grad_input.0");
    c.check("rms_norm grad weight", &dw, "grad_input.1");
}

#[test]
fn batch_norm_train_and_eval_and_group_norm_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = compile("batch_norm.cu");
    let floats = |a: &Value, key: &str, c: usize, default: f32| -> Vec<f32> {
        a.get(key)
            .and_then(Value::as_array)
            .map(|v| v.iter().map(|x| x.as_f64().unwrap() as f32).collect())
            .unwrap_or(vec![default; c])
    };
    for name in ["batch_norm2d__train", "batch_norm1d__train", "batch_norm2d__eval"] {
        let case = case(&dir, "models", name);
        let s = case.shape("input.0");
        let (nb, ch, l) = (s[0], s[1], s[2..].iter().product::<usize>());
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
        let (mut y, mut dx) = (vec![f32::NAN; x.len()], vec![f32::NAN; x.len()]);
        let (mut sdy, mut sdx) = (vec![f32::NAN; ch], vec![f32::NAN; ch]);
        let shape = [n(nb), n(ch), n(l)];
        // SAFETY: n·c·l inputs and outputs, c statistics and parameters.
        unsafe {
            if training {
                let mut args = shape.to_vec();
                args.extend([
                    buf(&x),
                    F32(eps),
                    F32(momentum),
                    out(&mut mean),
                    out(&mut invstd),
                    out(&mut rm),
                    out(&mut rv),
                ]);
                k.run("batch_norm_stats_f32", ROWS, &args);
            } else {
                let args = [n(ch), buf(&rm), buf(&rv), F32(eps), out(&mut mean), out(&mut invstd)];
                k.run("batch_norm_eval_stats_f32", GRID_STRIDE, &args);
            }
            let mut args = shape.to_vec();
            args.extend([buf(&x), buf(&mean), buf(&invstd), buf(&w), buf(&b), out(&mut y)]);
            k.run("batch_norm_apply_f32", GRID_STRIDE, &args);
            let mut args = shape.to_vec();
            args.extend([buf(&x), buf(&dy), buf(&mean), buf(&invstd), out(&mut sdy), out(&mut sdx)]);
            k.run("batch_norm_backward_reduce_f32", ROWS, &args);
            let mut args = shape.to_vec();
            args.extend([
                I32(training as i32),
                buf(&x),
                buf(&dy),
                buf(&mean),
                buf(&invstd),
                buf(&w),
                buf(&sdy),
                buf(&sdx),
                out(&mut dx),
            ]);
            k.run("batch_norm_backward_input_f32", GRID_STRIDE, &args);
        }
        case.check(name, &y, "output");
        if training {
            case.check(&format!("{name} running_mean"), &rm, "extra.running_mean");
            case.check(&format!("{name} running_var"), &rv, "extra.running_var");
        }
        case.check(&format!("{name} grad input"), &dx, "grad_input.0");
        case.check(&format!("{name} grad weight"), &sdx, "grad_input.1");
        case.check(&format!("{name} grad bias"), &sdy, "grad_input.2");
    }

    // Group norm: layer_norm.cu over [N·G, C/G·L] rows, the affine and its gradients here.
    let ln = compile("layer_norm.cu");
    let case = case(&dir, "models", "group_norm__g3");
    let s = case.shape("input.0");
    let (nb, ch, l) = (s[0], s[1], s[2..].iter().product::<usize>());
    let groups = case.attrs["num_groups"].as_u64().unwrap() as usize;
    let eps = case.attrs["eps"].as_f64().unwrap() as f32;
    let (rows, cols) = (nb * groups, ch / groups * l);
    let (x, w, b, dy) = (case.f32s("input.0"), case.f32s("input.1"), case.f32s("input.2"), case.f32s("grad_output"));
    let (mut xhat, mut mean, mut rstd, mut y) =
        (vec![f32::NAN; x.len()], vec![f32::NAN; rows], vec![f32::NAN; rows], vec![f32::NAN; x.len()]);
    let (mut g, mut dx, mut dw, mut db) =
        (vec![f32::NAN; x.len()], vec![f32::NAN; x.len()], vec![f32::NAN; ch], vec![f32::NAN; ch]);
    let shape = [n(nb), n(ch), n(l)];
    // SAFETY: rows·cols = n·c·l values, rows statistics, c parameters.
    unsafe {
        let args = [n(rows), n(cols), F32(eps), buf(&x), NULL, NULL, out(&mut xhat), out(&mut mean), out(&mut rstd)];
        ln.run("layer_norm_f32", ROWS, &args);
        let mut args = shape.to_vec();
        args.extend([buf(&xhat), buf(&w), buf(&b), out(&mut y)]);
        k.run("channel_affine_f32", GRID_STRIDE, &args);
        let mut args = shape.to_vec();
        args.extend([buf(&dy), buf(&w), NULL, out(&mut g)]);
        k.run("channel_affine_f32", GRID_STRIDE, &args);
        let args = [n(rows), n(cols), buf(&x), NULL, buf(&mean), buf(&rstd), buf(&g), out(&mut dx)];
        ln.run("layer_norm_backward_input_f32", ROWS, &args);
        let mut args = shape.to_vec();
        args.extend([n(groups), buf(&x), buf(&mean), buf(&rstd), buf(&dy), out(&mut dw), out(&mut db)]);
        k.run("group_norm_backward_affine_f32", GRID_STRIDE, &args);
    }
    case.check("group_norm", &y, "output");
    case.check("group_norm grad input", &dx, "grad_input.0");
    case.check("group_norm grad weight", &dw, "grad_input.1");
    case.check("group_norm grad bias", &db, "grad_input.2");
}

#[test]
fn embedding_and_its_gradient_match_pytorch_and_a_bad_index_is_flagged() {
    let Some(dir) = setup() else { return };
    let k = compile("embedding.cu");
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
    let run = |indices: &[i64]| {
        let mut o = vec![f32::NAN; count * dim];
        let mut bad = vec![0u64];
        let args = [n(count), n(rows), n(dim), buf(indices), buf(&table), out(&mut o), out(&mut bad)];
        // SAFETY: count indices, rows·dim table, count·dim outputs, one flag word.
        unsafe { k.run("embedding_f32", GRID_STRIDE, &args) };
        (o, bad[0])
    };
    let (o, bad) = run(&indices);
    assert_eq!(bad, 0);
    c.check("embedding", &o, "output");
    let go = c.f32s("grad_output");
    let mut grad = vec![0.0f32; rows * dim];
    // SAFETY: count indices and gradient rows, a zeroed rows·dim table gradient.
    unsafe {
        let args = [n(count), n(rows), n(dim), buf(&indices), buf(&go), out(&mut grad)];
        k.run("embedding_backward_f32", Launch { grid: 1, block: 4 }, &args)
    };
    c.check("embedding grad", &grad, "grad_input.0");
    indices[4] = rows as i64;
    let (o, bad) = run(&indices);
    assert_eq!(bad, 5, "position 4 + 1");
    assert!(o[4 * dim..5 * dim].iter().all(|v| *v == 0.0), "the bad position's row is zero");
}

/// The optimizer kernels, three steps' gradients and the initial parameters (`len` values each);
/// `None` after the skip rule without a C++ compiler.
fn optimizer_setup(len: usize) -> Option<(Kernels, Vec<Vec<f32>>, Vec<f32>)> {
    if !compiler_or_skip() {
        return None;
    }
    let grads = (0..3).map(|s| (0..len).map(|i| ((i * 13 + s * 7) % 17) as f32 / 17.0 - 0.4).collect()).collect();
    Some((compile("optimizer.cu"), grads, (0..len).map(|i| (i % 9) as f32 / 9.0 - 0.5).collect()))
}

#[test]
fn fused_adamw_and_sgd_follow_pytorchs_update_rules_and_skip_on_inf() {
    let len = 70;
    let Some((k, grads, init)) = optimizer_setup(len) else { return };

    // torch.optim.AdamW (amsgrad=False), _single_tensor_adamw, in f64.
    let (lr, b1, b2, eps, wd) = (1e-2f64, 0.9f64, 0.999f64, 1e-8f64, 0.01f64);
    let mut want: Vec<f64> = init.iter().map(|v| *v as f64).collect();
    let (mut m, mut v) = (vec![0.0f64; len], vec![0.0f64; len]);
    let mut param = init.clone();
    let (mut em, mut ev) = (vec![0.0f32; len], vec![0.0f32; len]);
    let adamw = |param: &mut [f32], g: &[f32], em: &mut [f32], ev: &mut [f32], step: i32, flag: KernelArg| {
        let (bc1, bc2s) = (1.0 - b1.powi(step), (1.0 - b2.powi(step)).sqrt());
        let w1 = (1.0 - b1) as f32;
        // DECOUPLED | LERP_SMALL: AdamW's decay, lerp's first formula (|1 − beta1| < 0.5).
        let args = [
            n(len),
            out(param),
            buf(g),
            out(em),
            out(ev),
            NULL,
            F32(0.0),
            F32((1.0 - lr * wd) as f32),
            F32(w1),
            F32(1.0 - w1),
            F32(b2 as f32),
            F32((1.0 - b2) as f32),
            F32(bc2s as f32),
            F32(eps as f32),
            F32((-lr / bc1) as f32),
            I32(16 | 32),
            flag,
        ];
        // SAFETY: len elements in every buffer; no amsgrad buffer; the flag is null or one word.
        unsafe { k.run("adam_step_f32", GRID_STRIDE, &args) };
    };
    for (s, g) in grads.iter().enumerate() {
        let step = (s + 1) as i32;
        for i in 0..len {
            want[i] *= 1.0 - lr * wd;
            m[i] += (g[i] as f64 - m[i]) * (1.0 - b1);
            v[i] = v[i] * b2 + (g[i] as f64) * (g[i] as f64) * (1.0 - b2);
            let (bc1, bc2) = (1.0 - b1.powi(step), 1.0 - b2.powi(step));
            want[i] -= lr / bc1 * m[i] / (v[i].sqrt() / bc2.sqrt() + eps);
        }
        adamw(&mut param, g, &mut em, &mut ev, step, NULL);
    }
    let want32: Vec<f32> = want.iter().map(|v| *v as f32).collect();
    assert_slices_close("adamw after 3 steps", &param, &want32, 1e-5, 1e-6);
    // A set found_inf flag skips the step entirely.
    let before = param.clone();
    let flag = [1.0f32];
    adamw(&mut param, &grads[0], &mut em, &mut ev, 4, buf(&flag));
    assert_eq!(param, before);

    // torch.optim.SGD with momentum, dampening, weight decay, nesterov: the first step copies the
    // gradient into the buffer.
    for nesterov in [false, true] {
        let (lr, mom, damp, wd) = (0.1f64, 0.9f64, 0.1f64, 1e-3f64);
        let mut want: Vec<f64> = init.iter().map(|v| *v as f64).collect();
        let mut mbuf = vec![0.0f64; len];
        let (mut param, mut kbuf) = (init.clone(), vec![0.0f32; len]);
        for (s, g) in grads.iter().enumerate() {
            for i in 0..len {
                let gi = g[i] as f64 + wd * want[i];
                mbuf[i] = if s == 0 { gi } else { mbuf[i] * mom + (1.0 - damp) * gi };
                want[i] -= lr * if nesterov { gi + mom * mbuf[i] } else { mbuf[i] };
            }
            // WEIGHT_DECAY | NESTEROV | FIRST_STEP bits.
            let flags = 2 | if nesterov { 4 } else { 0 } | if s == 0 { 8 } else { 0 };
            let args = [
                n(len),
                out(&mut param),
                buf(g),
                out(&mut kbuf),
                F32(-lr as f32),
                F32(mom as f32),
                F32((1.0 - damp) as f32),
                F32(wd as f32),
                I32(flags),
                NULL,
            ];
            // SAFETY: len elements in every buffer; no flag.
            unsafe { k.run("sgd_step_f32", GRID_STRIDE, &args) };
        }
        let want32: Vec<f32> = want.iter().map(|v| *v as f32).collect();
        assert_slices_close(&format!("sgd (nesterov {nesterov}) after 3 steps"), &param, &want32, 1e-5, 1e-6);
    }

    // GradScaler's unscale-and-check: grads *= 1/scale, the flag set by an inf or a NaN.
    for (poison, expect_flag) in [(None, 0.0f32), (Some(f32::INFINITY), 1.0), (Some(f32::NAN), 1.0)] {
        let mut g: Vec<f32> = grads[0].iter().map(|v| v * 1024.0).collect();
        if let Some(x) = poison {
            g[len - 1] = x;
        }
        let mut flag = vec![0.0f32];
        // SAFETY: len gradients and one flag.
        unsafe {
            k.run("unscale_and_check_f32", GRID_STRIDE, &[n(len), out(&mut g), F32(1.0 / 1024.0), out(&mut flag)])
        };
        assert_eq!(flag[0], expect_flag, "{poison:?}");
        assert_slices_close("unscaled", &g[..len - 1], &grads[0][..len - 1], 0.0, 0.0);
    }
}

/// `ChachaKey` of random.cu.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
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
    if !compiler_or_skip() {
        return;
    }
    use ferrite_tensor::{DType, Device, Generator};
    let k = compile("random.cu");
    let len = 333;
    // Seeds, and words drawn before: an odd position makes 64-bit draws straddle ChaCha blocks.
    for (seed, skip) in [(0u64, 0u32), (42, 1), (0x5eed_f00d, 37)] {
        let mut g = Generator::new(seed);
        for _ in 0..skip {
            g.next_u32();
        }
        let pos = g.state().word_pos;
        let at = [n(len), KernelArg::record(&chacha_key(seed)), U64((pos >> 4) as u64), U32((pos & 15) as u32)];
        let run = |kernel: &str, rest: &[KernelArg]| {
            let mut o = vec![f32::NAN; len];
            let mut args = at.to_vec();
            args.extend_from_slice(rest);
            args.push(out(&mut o));
            // SAFETY: len outputs (and the inputs `rest` names, len each).
            unsafe { k.run(kernel, GRID_STRIDE, &args) };
            o
        };
        let cpu = &Device::Cpu;
        let want = Tensor::uniform_with(&[len], -2.0, 3.0, DType::F32, cpu, &mut g.clone()).unwrap();
        assert_eq!(
            run("uniform_f32", &[F64(-2.0), F64(3.0)]),
            want.to_vec::<f32>().unwrap(),
            "uniform, seed {seed}, {skip} words before"
        );
        let want = Tensor::bernoulli_with(&[len], 0.3, DType::F32, cpu, &mut g.clone()).unwrap();
        assert_eq!(run("bernoulli_f32", &[F64(0.3)]), want.to_vec::<f32>().unwrap(), "bernoulli, seed {seed}");
        // Dropout as ferrite_tensor::functional::dropout computes it on the CPU.
        let x: Vec<f32> = (0..len).map(|i| (i as f32 - 150.0) / 37.0).collect();
        let xt = Tensor::from_vec(x.clone(), &[len], cpu).unwrap();
        let drop = 0.1;
        let want =
            ferrite_tensor::functional::dropout(&xt, drop, true, &mut g.clone()).unwrap().to_vec::<f32>().unwrap();
        let mut mask = vec![f32::NAN; len];
        let mut args = at.to_vec();
        let mut got = vec![f32::NAN; len];
        args.extend([F64(1.0 - drop), F32((1.0 / (1.0 - drop)) as f32), buf(&x), out(&mut got), out(&mut mask)]);
        // SAFETY: len inputs, outputs and mask entries.
        unsafe { k.run("dropout_f32", GRID_STRIDE, &args) };
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "dropout, seed {seed} (signed zeros included)");
        // Normal: Box-Muller in double through the C library's log and cos, as Rust's; the GPU's
        // may differ in the last bit of the double, so within two float ulps.
        let want = Tensor::normal_with(&[len], 0.5, 2.0, DType::F32, cpu, &mut g.clone()).unwrap();
        let got = run("normal_f32", &[F64(0.5), F64(2.0)]);
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
fn casts_to_and_from_bf16_and_f16_give_the_cpu_backends_bits() {
    if !compiler_or_skip() {
        return;
    }
    use ferrite_tensor::{DType, Device};
    let k = compile("cast.cu");
    // Every kind of f32: zeros, subnormals, normals around each rounding boundary, the f16 range's
    // edges, infinities, NaNs (quiet and signalling); then a sweep of bit patterns.
    let mut bits: Vec<u32> = vec![
        0,
        0x8000_0000,
        1,
        0x0000_1000,
        0x3300_0000,
        0x3300_0001,
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
    let len = x.len();
    let xt = Tensor::from_vec(x.clone(), &[len], &Device::Cpu).unwrap();
    let wide = Launch { grid: 4, block: 64 };
    for (dtype, down, up) in [(DType::BF16, "f32_to_bf16", "bf16_to_f32"), (DType::F16, "f32_to_f16", "f16_to_f32")] {
        let mut h = vec![0u16; len];
        let mut back = vec![f32::NAN; len];
        // SAFETY: len elements each.
        unsafe {
            k.run(down, wide, &[n(len), buf(&x), out(&mut h)]);
            k.run(up, wide, &[n(len), buf(&h), out(&mut back)]);
        }
        let want_half = xt.to_dtype(dtype).unwrap();
        let want_bits: Vec<u16> = match dtype {
            DType::BF16 => want_half.to_vec::<half::bf16>().unwrap().iter().map(|v| v.to_bits()).collect(),
            _ => want_half.to_vec::<half::f16>().unwrap().iter().map(|v| v.to_bits()).collect(),
        };
        for i in 0..len {
            assert_eq!(
                h[i], want_bits[i],
                "{down} of {:#010x}: {:#06x}, ferrite's {:#06x}",
                bits[i], h[i], want_bits[i]
            );
        }
        let want_back = want_half.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        for i in 0..len {
            assert_eq!(back[i].to_bits(), want_back[i].to_bits(), "{up} of {:#06x}", h[i]);
        }
    }
}

/// `Pool2d` of pool.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
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

/// A pool's forward and backward: (output, argmax for max pooling, input gradient).
fn pool(k: &Kernels, kind: &str, g: Pool2d, x: &[f32], dy: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (mut y, mut dx, mut arg) = (vec![f32::NAN; dy.len()], vec![0.0f32; x.len()], vec![-1i64; dy.len()]);
    let g = KernelArg::record(&g);
    // SAFETY: every buffer has the size the geometry names (planes·h·w, planes·out_h·out_w).
    unsafe {
        match kind {
            "max_pool2d" => {
                k.run("max_pool2d_f32", GRID_STRIDE, &[g.clone(), buf(x), out(&mut y), out(&mut arg)]);
                k.run("max_pool2d_backward_f32", FEW, &[g, buf(&arg), buf(dy), out(&mut dx)]);
            }
            "avg_pool2d" => {
                k.run("avg_pool2d_f32", GRID_STRIDE, &[g.clone(), buf(x), out(&mut y)]);
                k.run("avg_pool2d_backward_f32", FEW, &[g, buf(dy), out(&mut dx)]);
            }
            _ => {
                k.run("adaptive_avg_pool2d_f32", GRID_STRIDE, &[g.clone(), buf(x), out(&mut y)]);
                k.run("adaptive_avg_pool2d_backward_f32", FEW, &[g, buf(dy), out(&mut dx)]);
            }
        }
    }
    (y, dx)
}

#[allow(clippy::too_many_arguments)]
fn pool_geometry(
    x: &[usize],
    o: &[usize],
    k: [i32; 2],
    s: [i32; 2],
    p: [i32; 2],
    d: [i32; 2],
    cip: bool,
    div: i32,
) -> Pool2d {
    Pool2d {
        planes: (x[0] * x[1]) as i64,
        h: x[2] as i64,
        w: x[3] as i64,
        out_h: o[2] as i64,
        out_w: o[3] as i64,
        kh: k[0],
        kw: k[1],
        sh: s[0],
        sw: s[1],
        ph: p[0],
        pw: p[1],
        dh: d[0],
        dw: d[1],
        count_include_pad: cip as i32,
        divisor_override: div,
    }
}

#[test]
fn pooling_and_its_gradients_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = compile("pool.cu");
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
        let a = &c.attrs;
        let ks = pair(a, "kernel_size", 1);
        let st = match pair(a, "stride", 0) {
            [0, 0] => ks,
            s => s,
        };
        let cip = a.get("count_include_pad").and_then(Value::as_bool).unwrap_or(true);
        let div = a.get("divisor_override").and_then(Value::as_i64).unwrap_or(0) as i32;
        let g = pool_geometry(&c.shape("input.0"), &c.shape("output"), ks, st, pair(a, "padding", 0), [1, 1], cip, div);
        let (y, dx) = pool(&k, name.split("__").next().unwrap(), g, &c.f32s("input.0"), &c.f32s("grad_output"));
        c.check(name, &y, "output");
        c.check(&format!("{name} backward"), &dx, "grad_input.0");
    }
}

#[test]
fn pooling_options_beyond_the_fixtures_agree_with_the_cpu_backend() {
    if !compiler_or_skip() {
        return;
    }
    use ferrite_tensor::functional::{AvgPool2dOptions, MaxPool2dOptions, avg_pool2d, max_pool2d};
    let k = compile("pool.cu");
    // Forward and backward on the CPU backend (whose window rules `norm_pool_parity` checks across
    // devices), with a fixed upstream gradient.
    let cpu_pool = |x: &[f32], shape: &[usize], f: &dyn Fn(&Tensor) -> Tensor| {
        let cpu = ferrite_tensor::Device::Cpu;
        let xt = Tensor::from_vec(x.to_vec(), shape, &cpu).unwrap().requires_grad_(true).unwrap();
        let y = f(&xt);
        let dy: Vec<f32> = (0..y.numel()).map(|i| ((i * 7) % 11) as f32 / 11.0 - 0.3).collect();
        y.backward_with(&Tensor::from_vec(dy.clone(), y.shape(), &cpu).unwrap(), false).unwrap();
        (y.to_vec::<f32>().unwrap(), y.shape().to_vec(), dy, xt.grad().unwrap().to_vec::<f32>().unwrap())
    };
    let shape = [2usize, 3, 9, 8];
    let mut x: Vec<f32> = (0..shape.iter().product::<usize>()).map(|i| ((i * 29 % 53) as f32 - 26.0) / 9.0).collect();
    x[17] = f32::NAN; // a NaN is its windows' maximum
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
        let (y, dx) =
            pool(&k, "max_pool2d", pool_geometry(&shape, &o, [3, 2], [2, 3], [1, 1], [2, 1], true, 0), &x, &dy);
        assert_eq!(bits(&y), bits(&want_y), "max_pool2d dilated, ceil_mode {ceil_mode}");
        assert_slices_close(&format!("max_pool2d backward, ceil_mode {ceil_mode}"), &dx, &want_dx, 1e-6, 1e-6);
        let finite: Vec<f32> = x.iter().map(|v| if v.is_nan() { 0.5 } else { *v }).collect();
        for (cip, div) in [(true, None), (false, None), (true, Some(3usize))] {
            let opts = AvgPool2dOptions {
                kernel_size: [3, 3],
                stride: Some([2, 2]),
                padding: [1, 1],
                ceil_mode,
                count_include_pad: cip,
                divisor_override: div,
            };
            let (want_y, o, dy, want_dx) = cpu_pool(&finite, &shape, &|t| avg_pool2d(t, &opts).unwrap());
            let g = pool_geometry(&shape, &o, [3, 3], [2, 2], [1, 1], [1, 1], cip, div.unwrap_or(0) as i32);
            let (y, dx) = pool(&k, "avg_pool2d", g, &finite, &dy);
            let what = format!("avg_pool2d ceil_mode {ceil_mode} count_include_pad {cip} divisor {div:?}");
            assert_slices_close(&what, &y, &want_y, 1e-6, 1e-6);
            assert_slices_close(&format!("{what} backward"), &dx, &want_dx, 1e-6, 1e-6);
        }
    }
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

fn add_into(acc: &mut [f32], a: &[f32]) {
    for (x, y) in acc.iter_mut().zip(a) {
        *x += y;
    }
}

#[test]
fn convolutions_through_im2col_and_col2im_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = compile("conv.cu");
    let fold = |kernel: &str, g: ConvGeometry, input: &[f32], out_len: usize| {
        let mut o = vec![f32::NAN; out_len];
        // SAFETY: `input` and the output hold the image and the columns the geometry names.
        unsafe { k.run(kernel, GRID_STRIDE, &[KernelArg::record(&g), buf(input), out(&mut o)]) };
        o
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
        let (batch, kh, kw) = (xs[0], ws[2], ws[3]);
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
        let (img_len, plane, col_rows) = (img_c * img_h * img_w, grid_h * grid_w, img_c * kk);
        let (in_len, out_len) = (cin * xs[2] * xs[3], cout * ys[2] * ys[3]);
        let (mut y, mut dx, mut dw) =
            (vec![0.0f32; batch * out_len], vec![0.0f32; batch * in_len], vec![0.0f32; w.len()]);
        for s in 0..batch {
            let (xn, dyn_) = (&x[s * in_len..(s + 1) * in_len], &dy[s * out_len..(s + 1) * out_len]);
            if !transposed {
                // y = W · im2col(x); dW += dy · colsᵀ; dx = col2im(Wᵀ · dy); per group.
                let cols = fold("im2col_f32", g, xn, col_rows * plane);
                let (ci_g, co_g) = (cin / groups, cout / groups);
                let mut dcols = vec![0.0f32; col_rows * plane];
                for gi in 0..groups {
                    let r0 = gi * ci_g * kk;
                    let wg = &w[gi * co_g * ci_g * kk..(gi + 1) * co_g * ci_g * kk];
                    let colg = &cols[r0 * plane..(r0 + ci_g * kk) * plane];
                    let yg = gemm(co_g, plane, ci_g * kk, (wg, ci_g * kk, 1), (colg, plane, 1));
                    y[s * out_len + gi * co_g * plane..s * out_len + (gi + 1) * co_g * plane].copy_from_slice(&yg);
                    let dyg = &dyn_[gi * co_g * plane..(gi + 1) * co_g * plane];
                    add_into(
                        &mut dw[gi * co_g * ci_g * kk..],
                        &gemm(co_g, ci_g * kk, plane, (dyg, plane, 1), (colg, 1, plane)),
                    );
                    let dcg = gemm(ci_g * kk, plane, co_g, (wg, 1, ci_g * kk), (dyg, plane, 1));
                    dcols[r0 * plane..(r0 + ci_g * kk) * plane].copy_from_slice(&dcg);
                }
                dx[s * in_len..(s + 1) * in_len].copy_from_slice(&fold("col2im_f32", g, &dcols, img_len));
            } else {
                // y = col2im(Wᵀ · x); dx = W · im2col(dy); dW += x · im2col(dy)ᵀ (one group).
                assert_eq!(groups, 1);
                let cols = gemm(cout * kk, plane, cin, (&w, 1, cout * kk), (xn, plane, 1));
                y[s * out_len..(s + 1) * out_len].copy_from_slice(&fold("col2im_f32", g, &cols, img_len));
                let dcols = fold("im2col_f32", g, dyn_, col_rows * plane);
                dx[s * in_len..(s + 1) * in_len].copy_from_slice(&gemm(
                    cin,
                    plane,
                    cout * kk,
                    (&w, cout * kk, 1),
                    (&dcols, plane, 1),
                ));
                add_into(&mut dw, &gemm(cin, cout * kk, plane, (xn, plane, 1), (&dcols, 1, plane)));
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
    }
}

/// The implicit-GEMM kernels (no unfolded matrix anywhere, on the host or the device) on the
/// same PyTorch cases as im2col/col2im: forward, input gradient (each pixel gathers from dy) and
/// weight gradient in one depth range and split into three ranges summed in order, for conv2d
/// (stride, padding, dilation, groups, depthwise), conv1d and conv_transpose2d (the same products
/// with the roles swapped). Whole batches per launch, two blocks of the kernels' 256 threads so the
/// tile loops stride.
#[test]
fn implicit_gemm_convolutions_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = compile("conv_implicit.cu");
    const TILES: Launch = Launch { grid: 2, block: 256 };
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
        let as2d = |s: Vec<usize>| if s.len() == 3 { vec![s[0], s[1], 1, s[2]] } else { s };
        let pad2 = |v: Vec<i32>, d: i32| if v.len() == 1 { vec![d, v[0]] } else { v };
        let (xs, ws, ys) = (as2d(c.shape("input.0")), as2d(c.shape("input.1")), as2d(c.shape("output")));
        let (st, pd, dl) =
            (pad2(list(a, "stride", 1), 1), pad2(list(a, "padding", 0), 0), pad2(list(a, "dilation", 1), 1));
        let groups = a.get("groups").and_then(Value::as_u64).unwrap_or(1) as usize;
        let transposed = name.starts_with("conv_transpose");
        let (x, w, dy) = (c.f32s("input.0"), c.f32s("input.1"), c.f32s("grad_output"));
        let bias = (c.attrs.get("bias") != Some(&Value::Bool(false))).then(|| c.f32s("input.2"));
        let (batch, cin, cout) = (xs[0], xs[1], ys[1]);
        // The unfolded image: the input (conv) or the output (transposed conv); `m` the rows of
        // the weight viewed [groups, m, K] per group.
        let (img_c, img, grid, m) = if transposed {
            (cout, [ys[2], ys[3]], [xs[2], xs[3]], cin / groups)
        } else {
            (cin, [xs[2], xs[3]], [ys[2], ys[3]], cout / groups)
        };
        let rec = |splits: usize| ConvGemm {
            channels: img_c as i32,
            h: img[0] as i32,
            w: img[1] as i32,
            out_h: grid[0] as i32,
            out_w: grid[1] as i32,
            kh: ws[2] as i32,
            kw: ws[3] as i32,
            sh: st[0],
            sw: st[1],
            ph: pd[0],
            pw: pd[1],
            dh: dl[0],
            dw: dl[1],
            groups: groups as i32,
            m: m as i32,
            images: batch as i32,
            splits: splits as i32,
        };
        let (img_len, y_len) = (batch * img_c * img[0] * img[1], batch * groups * m * grid[0] * grid[1]);
        // The three products; `ymat` is [batch, groups·m, windows], `image` [batch, img_c, h, w].
        let forward = |a3: &[f32], image: &[f32]| {
            let mut o = vec![f32::NAN; y_len];
            // SAFETY: the weight, the image and the output hold what the record describes.
            unsafe {
                k.run("conv_forward_f32", TILES, &[KernelArg::record(&rec(1)), buf(a3), buf(image), out(&mut o)])
            };
            o
        };
        let fold = |a3: &[f32], ymat: &[f32]| {
            let mut o = vec![f32::NAN; img_len];
            // SAFETY: as above.
            unsafe {
                k.run("conv_input_grad_f32", TILES, &[KernelArg::record(&rec(1)), buf(a3), buf(ymat), out(&mut o)])
            };
            o
        };
        let weight = |ymat: &[f32], image: &[f32], splits: usize| {
            let mut partial = vec![f32::NAN; splits * w.len()];
            // SAFETY: as above; the output holds `splits` weights.
            unsafe {
                k.run(
                    "conv_weight_grad_f32",
                    TILES,
                    &[KernelArg::record(&rec(splits)), buf(ymat), buf(image), out(&mut partial)],
                )
            };
            if splits == 1 {
                return partial;
            }
            let mut o = vec![f32::NAN; w.len()];
            // SAFETY: `splits` partial weights in, one weight out.
            unsafe {
                k.run("conv_sum_splits_f32", GRID_STRIDE, &[n(w.len()), I32(splits as i32), buf(&partial), out(&mut o)])
            };
            o
        };
        let (mut y, dx, dw, dw3) = if transposed {
            (fold(&w, &x), forward(&w, &dy), weight(&x, &dy, 1), weight(&x, &dy, 3))
        } else {
            (forward(&w, &x), fold(&w, &dy), weight(&dy, &x, 1), weight(&dy, &x, 3))
        };
        let per_channel = ys[2] * ys[3];
        if let Some(b) = &bias {
            for (i, v) in y.iter_mut().enumerate() {
                *v += b[(i / per_channel) % cout];
            }
        }
        c.check(&format!("{name} implicit"), &y, "output");
        c.check(&format!("{name} implicit grad input"), &dx, "grad_input.0");
        c.check(&format!("{name} implicit grad weight"), &dw, "grad_input.1");
        c.check(&format!("{name} implicit grad weight, 3 ranges"), &dw3, "grad_input.1");
    }
}

/// `m` rows of `a[m×n]` plus `bias[n]` on each.
fn add_bias(mut a: Vec<f32>, bias: &[f32]) -> Vec<f32> {
    let len = bias.len();
    for (i, v) in a.iter_mut().enumerate() {
        *v += bias[i % len];
    }
    a
}

/// Column sums of `a[m×n]`, added into `acc`.
fn add_col_sums(acc: &mut [f32], a: &[f32]) {
    let len = acc.len();
    for (i, v) in a.iter().enumerate() {
        acc[i % len] += v;
    }
}

#[test]
fn lstm_and_gru_cells_over_whole_sequences_match_pytorch() {
    let Some(dir) = setup() else { return };
    let k = compile("recurrent.cu");
    for (folder, name, gates) in [("ops", "lstm__batch_first", 4usize), ("models", "gru__batch_first", 3)] {
        let c = case(&dir, folder, name);
        let (xs, hid) = (c.shape("input.0"), c.attrs["hidden_size"].as_u64().unwrap() as usize);
        let (b, t_len, inp) = (xs[0], xs[1], xs[2]);
        let gw = gates * hid;
        let (x, w_ih, w_hh, b_ih, b_hh) =
            (c.f32s("input.0"), c.f32s("input.1"), c.f32s("input.2"), c.f32s("input.3"), c.f32s("input.4"));
        let dy = c.f32s("grad_output");
        // Every step's input projection at once: [B·T, G·H].
        let gx_all = add_bias(gemm(b * t_len, gw, inp, (&x, inp, 1), (&w_ih, 1, inp)), &b_ih);
        let mut output = vec![f32::NAN; b * t_len * hid];
        let mut hs: Vec<Vec<f32>> = vec![vec![0.0; b * hid]]; // h before each step
        let mut cs: Vec<Vec<f32>> = vec![vec![0.0; b * hid]];
        let mut acts: Vec<Vec<f32>> = Vec::new();
        let (strided_gx, strided_h) = (n(t_len * gw), n(t_len * hid));
        for t in 0..t_len {
            let gh = add_bias(gemm(b, gw, hid, (&hs[t], hid, 1), (&w_hh, 1, hid)), &b_hh);
            let mut act = vec![f32::NAN; b * 4 * hid];
            let mut c_new = vec![f32::NAN; b * hid];
            // Step t's rows of the projections and of the output: offset t, row stride T.
            let gx_t = KernelArg::ptr(gx_all[t * gw..].as_ptr());
            let out_t = KernelArg::ptr(output[t * hid..].as_mut_ptr() as *const f32);
            // SAFETY: [B, G·H] and [B, H] buffers; strided rows stay inside gx_all and output.
            unsafe {
                // The biases are already in the projections: null bias operands.
                if gates == 4 {
                    let args = [
                        n(b),
                        n(hid),
                        gx_t,
                        strided_gx.clone(),
                        buf(&gh),
                        n(gw),
                        NULL,
                        NULL,
                        buf(&cs[t]),
                        n(hid),
                        out_t,
                        strided_h.clone(),
                        out(&mut c_new),
                        n(hid),
                        out(&mut act),
                        n(4 * hid),
                    ];
                    k.run("lstm_cell_f32", GRID_STRIDE, &args);
                } else {
                    let args = [
                        n(b),
                        n(hid),
                        gx_t,
                        strided_gx.clone(),
                        buf(&gh),
                        n(gw),
                        NULL,
                        NULL,
                        buf(&hs[t]),
                        n(hid),
                        out_t,
                        strided_h.clone(),
                        out(&mut act),
                        n(4 * hid),
                    ];
                    k.run("gru_cell_f32", GRID_STRIDE, &args);
                }
            }
            hs.push((0..b * hid).map(|i| output[(i / hid) * t_len * hid + t * hid + i % hid]).collect());
            cs.push(c_new);
            acts.push(act);
        }
        c.check(name, &output, "output");
        if gates == 3 {
            c.check(&format!("{name} h_n"), &hs[t_len], "extra.h_n");
        }
        // Backpropagation through time.
        let mut dgx_all = vec![0.0f32; b * t_len * gw];
        let (mut dw_hh, mut db_hh) = (vec![0.0f32; gw * hid], vec![0.0f32; gw]);
        let mut dh_next = vec![0.0f32; b * hid];
        let mut dc_next: Option<Vec<f32>> = None;
        for t in (0..t_len).rev() {
            // dh from the later steps, plus the output's gradient at step t as dh_out: offset t,
            // row stride T (the batch-first layout).
            let dy_t = KernelArg::ptr(dy[t * hid..].as_ptr());
            let (mut dgx, mut dgh, mut direct) =
                (vec![f32::NAN; b * gw], vec![f32::NAN; b * gw], vec![0.0f32; b * hid]);
            // SAFETY: [B, G·H], [B, 4H] and [B, H] buffers; dy's strided rows stay inside it.
            unsafe {
                if gates == 4 {
                    let mut dc_prev = vec![f32::NAN; b * hid];
                    let dc = dc_next.as_deref().map(buf).unwrap_or(NULL);
                    let args = [
                        n(b),
                        n(hid),
                        buf(&dh_next),
                        n(hid),
                        dy_t,
                        strided_h.clone(),
                        dc,
                        n(hid),
                        buf(&acts[t]),
                        n(4 * hid),
                        buf(&cs[t + 1]),
                        n(hid),
                        buf(&cs[t]),
                        n(hid),
                        out(&mut dgx),
                        n(gw),
                        out(&mut dc_prev),
                        n(hid),
                    ];
                    k.run("lstm_cell_backward_f32", GRID_STRIDE, &args);
                    dgh.clone_from(&dgx);
                    dc_next = Some(dc_prev);
                } else {
                    let args = [
                        n(b),
                        n(hid),
                        buf(&dh_next),
                        n(hid),
                        dy_t,
                        strided_h.clone(),
                        buf(&acts[t]),
                        n(4 * hid),
                        buf(&hs[t]),
                        n(hid),
                        out(&mut dgx),
                        n(gw),
                        out(&mut dgh),
                        n(gw),
                        out(&mut direct),
                        n(hid),
                    ];
                    k.run("gru_cell_backward_f32", GRID_STRIDE, &args);
                }
            }
            for row in 0..b {
                dgx_all[(row * t_len + t) * gw..(row * t_len + t + 1) * gw]
                    .copy_from_slice(&dgx[row * gw..(row + 1) * gw]);
            }
            add_into(&mut dw_hh, &gemm(gw, hid, b, (&dgh, 1, gw), (&hs[t], hid, 1)));
            add_col_sums(&mut db_hh, &dgh);
            dh_next = gemm(b, hid, gw, (&dgh, gw, 1), (&w_hh, hid, 1));
            add_into(&mut dh_next, &direct);
        }
        let dx = gemm(b * t_len, inp, gw, (&dgx_all, gw, 1), (&w_ih, inp, 1));
        let dw_ih = gemm(gw, inp, b * t_len, (&dgx_all, 1, gw), (&x, inp, 1));
        let mut db_ih = vec![0.0f32; gw];
        add_col_sums(&mut db_ih, &dgx_all);
        for (i, got) in [&dx, &dw_ih, &dw_hh, &db_ih, &db_hh].into_iter().enumerate() {
            c.check(&format!("{name} grad_input.{i}"), got, &format!("grad_input.{i}"));
        }
    }
}

/// The CPU backend's result of `f` on `xs` (ferrite's ops, checked against PyTorch by the
/// conformance suite), as f32 values.
fn on_cpu(f: impl FnOnce() -> ferrite_tensor::Result<Tensor>) -> Vec<f32> {
    f().and_then(|t| t.to_dtype(ferrite_tensor::DType::F32)).and_then(|t| t.to_vec::<f32>()).unwrap()
}

fn tensor(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, &ferrite_tensor::Device::Cpu).unwrap()
}

fn indices(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, &ferrite_tensor::Device::Cpu).unwrap()
}

#[test]
fn comparisons_where_and_clamp_agree_with_the_cpu_backend() {
    if !compiler_or_skip() {
        return;
    }
    let k = compile("elementwise.cu");
    let a: Vec<f32> = vec![1.0, -2.0, f32::NAN, 3.0, 0.0, -0.0, 5.0, 2.0, f32::INFINITY, -1.0, 4.0, 2.0];
    let b: Vec<f32> = vec![2.0, -2.0, 0.5, f32::NAN];
    let (sa, sb, so) = ([3usize, 4], [4usize], [3usize, 4]);
    let mut shape = [1i64; 6];
    shape[..2].copy_from_slice(&[3, 4]);
    let g = Broadcast {
        ndim: 2,
        _pad: 0,
        shape,
        a_stride: broadcast_strides(&sa, &so),
        b_stride: broadcast_strides(&sb, &so),
    };
    let (ta, tb) = (tensor(&a, &sa), tensor(&b, &sb));
    type Cmp = fn(&Tensor, &Tensor) -> ferrite_tensor::Result<Tensor>;
    let ops: [(&str, Cmp); 6] = [
        ("eq_f32", Tensor::eq),
        ("ne_f32", Tensor::ne),
        ("lt_f32", Tensor::lt),
        ("le_f32", Tensor::le),
        ("gt_f32", Tensor::gt),
        ("ge_f32", Tensor::ge),
    ];
    for (kernel, op) in ops {
        let mut o = vec![9u8; 12];
        // SAFETY: the strides stay inside both inputs; 12 outputs.
        unsafe { k.run(kernel, GRID_STRIDE, &[n(12), KernelArg::record(&g), buf(&a), buf(&b), out(&mut o)]) };
        let want = on_cpu(|| op(&ta, &tb));
        assert_eq!(o.iter().map(|v| *v as f32).collect::<Vec<_>>(), want, "{kernel}");
    }
    // where(cond [3, 1], a [3, 4], b [4]).
    let cond: Vec<u8> = vec![1, 0, 1];
    let mut shape3 = [1i64; 6];
    shape3[..2].copy_from_slice(&[3, 4]);
    let g3 = Broadcast3 {
        ndim: 2,
        _pad: 0,
        shape: shape3,
        c_stride: broadcast_strides(&[3, 1], &so),
        a_stride: broadcast_strides(&sa, &so),
        b_stride: broadcast_strides(&sb, &so),
    };
    let mut o = vec![f32::NAN; 12];
    // SAFETY: as above, three operands.
    unsafe {
        k.run("where_f32", GRID_STRIDE, &[n(12), KernelArg::record(&g3), buf(&cond), buf(&a), buf(&b), out(&mut o)])
    };
    let tc = tensor(&[1.0, 0.0, 1.0], &[3, 1]).ne_scalar(0.0).unwrap();
    let want = on_cpu(|| Tensor::where_cond(&tc, &ta, &tb));
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&o), bits(&want), "where");
    // clamp: NaN stays NaN, hi wins when lo > hi.
    for (lo, hi) in [(-1.0f32, 2.5f32), (3.0, 1.0), (f32::NEG_INFINITY, 0.0)] {
        let mut o = vec![0.0f32; 12];
        // SAFETY: 12 inputs and outputs.
        unsafe { k.run("clamp_f32", GRID_STRIDE, &[n(12), F32(lo), F32(hi), buf(&a), out(&mut o)]) };
        let want = on_cpu(|| ta.clamp(Some(lo as f64), Some(hi as f64)));
        assert_eq!(bits(&o), bits(&want), "clamp({lo}, {hi})");
    }
}

#[test]
fn gather_scatter_add_index_select_index_add_and_one_hot_agree_with_the_cpu_backend() {
    if !compiler_or_skip() {
        return;
    }
    let k = compile("index.cu");
    // x [2, 5, 3]; indexed dimension 1.
    let x: Vec<f32> = (0..30).map(|i| i as f32 * 0.5 - 4.0).collect();
    let tx = tensor(&x, &[2, 5, 3]);
    let gidx: Vec<i64> = vec![4, 0, 2, 1, 1, 3, 0, 4, 4, 2, 2, 2, 3, 0, 1, 4, 4, 0]; // [2, 3, 3]
    let tg = indices(&gidx, &[2, 3, 3]);
    let run4 = |kernel: &str, dim: usize, count: usize, xin: &[f32], idx: &[i64], out_len: usize, init: f32| {
        let mut o = vec![init; out_len];
        let mut bad = vec![0u64];
        let args = [n(2), n(dim), n(count), n(3), buf(xin), buf(idx), out(&mut o), out(&mut bad)];
        // SAFETY: [outer, dim, inner] and [outer, count, inner] buffers as the kernel names them.
        unsafe { k.run(kernel, GRID_STRIDE, &args) };
        (o, bad[0])
    };
    let (o, bad) = run4("gather_f32", 5, 3, &x, &gidx, 18, f32::NAN);
    assert_eq!((o, bad), (on_cpu(|| tx.gather(1, &tg)), 0));
    // scatter_add into zeros [2, 5, 3] from src [2, 3, 3]: repeated indices add in order.
    let src: Vec<f32> = (0..18).map(|i| (i as f32).sin()).collect();
    let mut dst = vec![0.0f32; 30];
    let mut bad = vec![0u64];
    let args = [n(2), n(5), n(3), n(3), out(&mut dst), buf(&gidx), buf(&src), out(&mut bad)];
    // SAFETY: as above.
    unsafe { k.run("scatter_add_f32", GRID_STRIDE, &args) };
    let zeros = Tensor::zeros(&[2, 5, 3], ferrite_tensor::DType::F32, &ferrite_tensor::Device::Cpu).unwrap();
    assert_slices_close(
        "scatter_add",
        &dst,
        &on_cpu(|| zeros.scatter_add(1, &tg, &tensor(&src, &[2, 3, 3]))),
        1e-6,
        1e-6,
    );
    assert_eq!(bad[0], 0);
    // index_select along 1 with a repeated index, and its gradient index_add.
    let sel: Vec<i64> = vec![3, 0, 3, 4];
    let (o, bad) = run4("index_select_f32", 5, 4, &x, &sel, 24, f32::NAN);
    assert_eq!((o, bad), (on_cpu(|| tx.index_select(1, &indices(&sel, &[4]))), 0));
    let g: Vec<f32> = (0..24).map(|i| i as f32 * 0.25).collect();
    let mut dst = vec![0.0f32; 30];
    let mut flag = vec![0u64];
    let args = [n(2), n(5), n(4), n(3), out(&mut dst), buf(&sel), buf(&g), out(&mut flag)];
    // SAFETY: as above.
    unsafe { k.run("index_add_f32", GRID_STRIDE, &args) };
    // The gradient of index_select is index_add: what autograd computes on the CPU.
    let leaf = tx.detach().requires_grad_(true).unwrap();
    leaf.index_select(1, &indices(&sel, &[4])).unwrap().backward_with(&tensor(&g, &[2, 4, 3]), false).unwrap();
    assert_slices_close("index_add", &dst, &leaf.grad().unwrap().to_vec::<f32>().unwrap(), 1e-6, 1e-6);
    // Out-of-range indices are flagged (the complement of the first bad position, whatever the
    // thread order), not read; flag_index_value_i64 then copies that index's value beside it.
    let mut badg = gidx.clone();
    badg[11] = -1;
    badg[7] = 5;
    let (_, bad) = run4("gather_f32", 5, 3, &x, &badg, 18, f32::NAN);
    assert_eq!(!bad, 7, "first bad position");
    let mut slot = vec![bad, 0u64];
    // SAFETY: the 18 indices and a two-word slot.
    unsafe { k.run("flag_index_value_i64", GRID_STRIDE, &[buf(&badg), out(&mut slot)]) };
    assert_eq!(slot[1] as i64, 5, "the first bad index's value");
    let (_, bad) = run4("index_select_f32", 5, 4, &x, &[0, 9, 1, 2], 24, f32::NAN);
    assert_eq!(!bad, 1);
    // The class-target check: ignore_index passes, negatives are not wrapped.
    let check = |t: &[i64], has_ignore: i32| {
        let mut slot = vec![0u64, 0u64];
        let args = [n(t.len()), n(4), KernelArg::I64(-100), KernelArg::I32(has_ignore), buf(t), out(&mut slot)];
        // SAFETY: `t.len()` indices and a two-word slot.
        unsafe { k.run("check_indices_i64", GRID_STRIDE, &args) };
        slot[0]
    };
    assert_eq!(check(&[0, 3, -100, 2], 1), 0);
    assert_eq!(!check(&[0, 3, -100, 2], 0), 2);
    assert_eq!(!check(&[0, 4, -1, 2], 1), 1);
    // one_hot.
    let cls: Vec<i64> = vec![2, 0, 3, 3];
    let mut o = vec![-1i64; 16];
    let mut bad = vec![0u64];
    // SAFETY: 4 indices, 4·4 outputs, one flag.
    unsafe { k.run("one_hot_i64", GRID_STRIDE, &[n(4), n(4), buf(&cls), out(&mut o), out(&mut bad)]) };
    let want = indices(&cls, &[4]).one_hot(4).unwrap().to_vec::<i64>().unwrap();
    assert_eq!((o, bad[0]), (want, 0));
}

/// `Broadcast3` of elementwise.cu (where's three operands).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Broadcast3 {
    ndim: i32,
    _pad: i32,
    shape: [i64; 6],
    c_stride: [i64; 6],
    a_stride: [i64; 6],
    b_stride: [i64; 6],
}

#[test]
fn fused_rmsprop_adagrad_and_the_clipping_norm_follow_pytorchs_rules() {
    let len = 300;
    let Some((k, grads, init)) = optimizer_setup(len) else { return };
    // torch.optim.RMSprop (_single_tensor_rmsprop) in f64, every combination of centered and
    // momentum.
    for (centered, momentum) in [(false, 0.0f64), (true, 0.0), (false, 0.9), (true, 0.9)] {
        let (lr, alpha, eps, wd) = (1e-2f64, 0.99f64, 1e-8f64, 1e-3f64);
        let mut want: Vec<f64> = init.iter().map(|v| *v as f64).collect();
        let (mut sq, mut ga, mut mb) = (vec![0.0f64; len], vec![0.0f64; len], vec![0.0f64; len]);
        let mut param = init.clone();
        let (mut ksq, mut kga, mut kmb) = (vec![0.0f32; len], vec![0.0f32; len], vec![0.0f32; len]);
        for g in &grads {
            for i in 0..len {
                let gi = g[i] as f64 + wd * want[i];
                sq[i] = alpha * sq[i] + (1.0 - alpha) * gi * gi;
                let avg = if centered {
                    ga[i] = alpha * ga[i] + (1.0 - alpha) * gi;
                    (sq[i] - ga[i] * ga[i]).sqrt() + eps
                } else {
                    sq[i].sqrt() + eps
                };
                if momentum > 0.0 {
                    mb[i] = momentum * mb[i] + gi / avg;
                    want[i] -= lr * mb[i];
                } else {
                    want[i] -= lr * gi / avg;
                }
            }
            let ga_arg = if centered { out(&mut kga) } else { NULL };
            let mb_arg = if momentum > 0.0 { out(&mut kmb) } else { NULL };
            let w = (1.0 - alpha) as f32;
            // WEIGHT_DECAY | LERP_SMALL bits.
            let args = [
                n(len),
                out(&mut param),
                buf(g),
                out(&mut ksq),
                mb_arg,
                ga_arg,
                F32(-lr as f32),
                F32(alpha as f32),
                F32(w),
                F32(1.0 - w),
                F32(eps as f32),
                F32(wd as f32),
                F32(momentum as f32),
                I32(2 | 32),
                NULL,
            ];
            // SAFETY: len elements in every buffer given; null optional buffers and flag.
            unsafe { k.run("rmsprop_step_f32", GRID_STRIDE, &args) };
        }
        let want32: Vec<f32> = want.iter().map(|v| *v as f32).collect();
        assert_slices_close(&format!("rmsprop centered {centered} momentum {momentum}"), &param, &want32, 1e-5, 1e-6);
    }
    // torch.optim.Adagrad (_single_tensor_adagrad) in f64, with lr_decay and weight decay.
    let (lr, lr_decay, eps, wd) = (0.1f64, 0.01f64, 1e-10f64, 1e-3f64);
    let mut want: Vec<f64> = init.iter().map(|v| *v as f64).collect();
    let mut sum = vec![0.1f64; len]; // initial_accumulator_value
    let mut param = init.clone();
    let mut ksum = vec![0.1f32; len];
    for (s, g) in grads.iter().enumerate() {
        let clr = lr / (1.0 + s as f64 * lr_decay);
        for i in 0..len {
            let gi = g[i] as f64 + wd * want[i];
            sum[i] += gi * gi;
            want[i] -= clr * gi / (sum[i].sqrt() + eps);
        }
        let args = [
            n(len),
            out(&mut param),
            buf(g),
            out(&mut ksum),
            F32(-clr as f32),
            F32(eps as f32),
            F32(wd as f32),
            I32(2),
            NULL,
        ];
        // SAFETY: len elements in every buffer; no flag.
        unsafe { k.run("adagrad_step_f32", GRID_STRIDE, &args) };
    }
    let want32: Vec<f32> = want.iter().map(|v| *v as f32).collect();
    assert_slices_close("adagrad after 3 steps", &param, &want32, 1e-5, 1e-6);
    // A set found_inf flag skips both.
    let (before, flag) = (param.clone(), [1.0f32]);
    let args =
        [n(len), out(&mut param), buf(&grads[0]), out(&mut ksum), F32(-0.1), F32(1e-10), F32(0.0), I32(0), buf(&flag)];
    // SAFETY: as above, with a flag word.
    unsafe { k.run("adagrad_step_f32", GRID_STRIDE, &args) };
    assert_eq!(param, before);
    // The clipping norms: partial reductions per block in f64, combined on the host in order; the
    // same bits on every run, and each kind of norm within rounding of the exact one (f64 over
    // the f32 values).
    let mut g: Vec<f32> = (0..5000).map(|i| ((i * 37 % 101) as f32 - 50.0) / 13.0).collect();
    g[17] = 0.0;
    // (kind code of optimizer.cu, p, identity, the exact norm)
    let abs: Vec<f64> = g.iter().map(|v| (*v as f64).abs()).collect();
    let kinds = [
        (0, 0.0, 0.0, abs.iter().cloned().fold(0.0, f64::max)),
        (1, 0.0, f64::INFINITY, abs.iter().cloned().fold(f64::INFINITY, f64::min)),
        (2, 0.0, 0.0, abs.iter().filter(|v| **v != 0.0).count() as f64),
        (3, 0.0, 0.0, abs.iter().sum::<f64>()),
        (4, 0.0, 0.0, abs.iter().map(|v| v * v).sum::<f64>().sqrt()),
        (5, 3.0, 0.0, abs.iter().map(|v| v.powi(3)).sum::<f64>().cbrt()),
    ];
    for (kind, p, identity, exact) in kinds {
        let norm = || {
            let mut partials = vec![f64::NAN; 3];
            let args = [n(g.len()), buf(&g), I32(kind), F64(p), F64(identity), out(&mut partials)];
            // SAFETY: 5000 inputs, one partial per block.
            unsafe { k.run("norm_partial_f32", Launch { grid: 3, block: 256 }, &args) };
            let acc = match kind {
                0 => partials.iter().cloned().fold(0.0, f64::max),
                1 => partials.iter().cloned().fold(f64::INFINITY, f64::min),
                _ => partials.iter().sum::<f64>(),
            };
            match kind {
                4 => acc.sqrt(),
                5 => acc.powf(1.0 / p),
                _ => acc,
            }
        };
        let (a, b) = (norm(), norm());
        assert_eq!(a.to_bits(), b.to_bits(), "kind {kind}");
        assert!((a - exact).abs() <= 1e-9 * exact.max(1.0), "kind {kind}: {a} vs {exact}");
    }
    // A NaN wins the max norm.
    g[4000] = f32::NAN;
    let mut partials = vec![0.0f64; 3];
    // SAFETY: as above.
    unsafe {
        k.run(
            "norm_partial_f32",
            Launch { grid: 3, block: 256 },
            &[n(g.len()), buf(&g), I32(0), F64(0.0), F64(0.0), out(&mut partials)],
        )
    };
    assert!(partials.iter().any(|v| v.is_nan()), "{partials:?}");
}
