//! The `cuda:N` kernel backend, checked without a GPU: with `FERRITE_CUDA_EMULATOR=1`, `cuda:0`
//! is the emulated device (host memory, the CUDA C kernels compiled by g++ and run on CPU
//! threads through ferrite-cuda's `HostRuntime`), so every op the backend implements runs its real
//! argument arrays, launch geometry, strides and GEMM operand flags. Each op is compared with the
//! `cpu` backend on random inputs (odd sizes, broadcast and strided operands, f16/bf16 storage)
//! and, where PyTorch's reference fixtures cover it, with PyTorch's numbers.
//!
//! The variable is read once per process, before any device is used, so each test re-runs its
//! own binary (`--exact NAME`) as a child with the variable set, unless the whole run already has
//! it. Without a C++ compiler the tests print a loud SKIPPED line (a failure under
//! `FERRITE_REQUIRE_SYSTEM_DEPS=1`). Shapes stay small: the emulator runs an OS thread per GPU
//! thread.

use ferrite_memory::MemoryError;
use ferrite_tensor::backend::{FusedKernel, UnaryOp};
use ferrite_tensor::functional::layer_norm;
use ferrite_tensor::{DType, Device, Generator, Tensor, TensorError};
use ferrite_test_support::assert_close;

const EMULATOR_ENV: &str = "FERRITE_CUDA_EMULATOR";
/// Set (to the test's name) in the child process [`alone_on_emulator`] starts.
const ALONE_ENV: &str = "FERRITE_TEST_ALONE";

/// A view of a tensor (a transpose, a narrowing, ...).
type View = Box<dyn Fn(&Tensor) -> Tensor>;
/// A unary op under test.
type UnaryFn = fn(&Tensor) -> ferrite_tensor::Result<Tensor>;
/// A comparison under test.
type CompareFn = fn(&Tensor, &Tensor) -> ferrite_tensor::Result<Tensor>;

/// The emulated `cuda:0`.
fn cuda() -> Device {
    Device::Cuda { index: 0 }
}

/// Test bodies that share one process's emulated `cuda:0` (the whole run under
/// `FERRITE_CUDA_EMULATOR=1`) take turns: its allocator's peak statistics, `HostRuntime`'s count of
/// host waits and its deferred device-side errors are per process, and tests measure or provoke
/// them — run side by side, one test's allocations, waits or index error land in another's.
static EMULATED_DEVICE: std::sync::Mutex<()> = std::sync::Mutex::new(());

thread_local! {
    /// This thread's turn on the emulated device, from [`on_emulator`] until [`done`] (or until
    /// the next test on this thread, or the thread's end, after a test that failed).
    static TURN: std::cell::RefCell<Option<std::sync::MutexGuard<'static, ()>>> =
        const { std::cell::RefCell::new(None) };
}

/// `true` when this process runs the test body on the emulated device (after waiting for its
/// turn there); otherwise runs the test `name` in a child process with the emulator on (asserting
/// it passed and really ran) and returns `false`.
fn on_emulator(name: &str) -> bool {
    if ferrite_memory::cuda::emulator_enabled() {
        // A turn this thread still holds (its previous test failed before `done`) ends first.
        TURN.with(|t| t.borrow_mut().take());
        // A test that failed during its turn poisons the lock; the device is usable after it.
        let turn = EMULATED_DEVICE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        TURN.with(|t| *t.borrow_mut() = Some(turn));
        return true;
    }
    if !ferrite_test_support::present_or_skip(
        ferrite_cuda::HostModule::compiler_available(),
        "no C++20 compiler (`$CXX`, default g++) to run the CUDA kernels of the emulated cuda:0",
        "apt-get install g++ (or set CXX)",
    ) {
        return false;
    }
    let stdout = ferrite_test_support::run_in_child(name, &[(EMULATOR_ENV, "1")]);
    assert!(
        stdout.contains(&format!("CUDA-EMULATED {name} done")),
        "{name}: the child did not run the test:\n{stdout}"
    );
    false
}

/// Like [`on_emulator`], but the body always runs in a child process of its own, even when the
/// whole run has the emulator on: for tests that count [`ferrite_cuda::HostRuntime::host_waits`],
/// a process-wide counter that tests running beside them would move.
fn alone_on_emulator(name: &str) -> bool {
    if std::env::var(ALONE_ENV).is_ok_and(|v| v == name) && ferrite_memory::cuda::emulator_enabled() {
        return true;
    }
    if !ferrite_test_support::present_or_skip(
        ferrite_cuda::HostModule::compiler_available(),
        "no C++20 compiler (`$CXX`, default g++) to run the CUDA kernels of the emulated cuda:0",
        "apt-get install g++ (or set CXX)",
    ) {
        return false;
    }
    let stdout = ferrite_test_support::run_in_child(name, &[(EMULATOR_ENV, "1"), (ALONE_ENV, name)]);
    assert!(
        stdout.contains(&format!("CUDA-EMULATED {name} done")),
        "{name}: the child did not run the test:\n{stdout}"
    );
    false
}

fn done(name: &str) {
    println!("CUDA-EMULATED {name} done");
    TURN.with(|t| t.borrow_mut().take());
}

/// A random f32 CPU tensor.
fn randn(g: &mut Generator, shape: &[usize]) -> Tensor {
    Tensor::randn_with(shape, DType::F32, &Device::Cpu, g).unwrap()
}

fn to_cuda(t: &Tensor) -> Tensor {
    t.to_device(&cuda()).unwrap()
}

/// A fresh copy of `t` on `dev` as a leaf that requires grad.
fn leaf_on(dev: &Device, t: &Tensor) -> Tensor {
    t.deep_clone().unwrap().to_device(dev).unwrap().detach().requires_grad_(true).unwrap()
}

fn to_cpu(t: &Tensor) -> Tensor {
    assert_eq!(t.device(), &cuda(), "the result lives on cuda:0");
    t.to_device(&Device::Cpu).unwrap()
}

/// Every element equal (as f64; exact for every dtype), shapes equal.
fn assert_same(what: &str, got: &Tensor, want: &Tensor) {
    let got = to_cpu(got);
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let (g, w) = (got.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
    for (i, (x, y)) in g.iter().zip(&w).enumerate() {
        assert!(x == y || (x.is_nan() && y.is_nan()), "{what}[{i}]: {x} vs {y}");
    }
}

/// Close within f32 tolerances.
fn assert_near(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    let got = to_cpu(got);
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_close(what, &got.to_dtype(DType::F32).unwrap(), &want.to_dtype(DType::F32).unwrap(), tol, tol);
}

/// Uploads and reads back every dtype bit for bit, converts between dtypes as the CPU does,
/// materialises transposed, narrowed and expanded views, writes into a strided view, fills, and
/// gives `arange` and seeded random numbers the CPU's exact values.
#[test]
fn data_moves_and_converts_exactly_like_the_cpu() {
    let name = "data_moves_and_converts_exactly_like_the_cpu";
    if !on_emulator(name) {
        return;
    }
    let mut g = Generator::new(1);
    let x = randn(&mut g, &[5, 7]).mul_scalar(40.0).unwrap();
    for dt in DType::ALL {
        let h = x.to_dtype(dt).unwrap();
        let d = to_cuda(&h);
        assert_same(&format!("round trip {dt}"), &d, &h);
        for to in DType::ALL {
            if dt == DType::F64 || to == DType::F64 {
                if dt != to {
                    let e = d.to_dtype(to).unwrap_err();
                    assert!(matches!(e, TensorError::UnsupportedDType { .. }), "{dt} -> {to}: {e:?}");
                }
                continue;
            }
            assert_same(&format!("{dt} -> {to}"), &d.to_dtype(to).unwrap(), &h.to_dtype(to).unwrap());
        }
    }
    let d = to_cuda(&x);
    let views: Vec<(&str, View)> = vec![
        ("transpose", Box::new(|t: &Tensor| t.transpose(0, 1).unwrap())),
        ("narrow", Box::new(|t: &Tensor| t.narrow(1, 2, 4).unwrap())),
        ("expand", Box::new(|t: &Tensor| t.narrow(0, 1, 1).unwrap().expand(&[3, 5, 7]).unwrap())),
        ("permute of a narrow", Box::new(|t: &Tensor| t.narrow(0, 1, 3).unwrap().t().unwrap())),
    ];
    for (what, view) in &views {
        assert_same(what, &view(&d).contiguous().unwrap(), &view(&x).contiguous().unwrap());
        assert_same(
            &format!("{what} to bf16"),
            &view(&d).to_dtype(DType::BF16).unwrap(),
            &view(&x).to_dtype(DType::BF16).unwrap(),
        );
    }
    // copy_ into a strided view of a larger tensor.
    let (hd, dd) = (
        Tensor::zeros(&[7, 5], DType::F32, &Device::Cpu).unwrap(),
        Tensor::zeros(&[7, 5], DType::F32, &cuda()).unwrap(),
    );
    let src = randn(&mut g, &[4, 3]);
    hd.t().unwrap().narrow(0, 1, 4).unwrap().narrow(1, 2, 3).unwrap().copy_(&src).unwrap();
    dd.t().unwrap().narrow(0, 1, 4).unwrap().narrow(1, 2, 3).unwrap().copy_(&to_cuda(&src)).unwrap();
    assert_same("copy_ into a strided view", &dd, &hd);
    for dt in [DType::F32, DType::F16, DType::I64, DType::Bool, DType::F64] {
        let t = Tensor::zeros(&[3, 5], dt, &cuda()).unwrap();
        t.fill_(2.5).unwrap();
        assert_same(&format!("fill {dt}"), &t, &Tensor::full(&[3, 5], 2.5, dt, &Device::Cpu).unwrap());
    }
    // Every dtype (kernels for f64/f32/i64/i32/u8, the host for the rest), with steps whose
    // products round (0.1), integer truncation toward zero, and integer saturation (u8 below 0
    // and above 255, i32 past 2^31).
    for dt in DType::ALL {
        for (start, end, step) in [(-3.0, 8.0, 0.5), (0.0, 3.0, 0.1), (-300.0, 300.0, 37.5), (2.1e9, 2.2e9, 1.5e7)] {
            assert_same(
                &format!("arange({start}, {end}, {step}) {dt}"),
                &Tensor::arange(start, end, step, dt, &cuda()).unwrap(),
                &Tensor::arange(start, end, step, dt, &Device::Cpu).unwrap(),
            );
        }
    }
    let (mut g1, mut g2) = (Generator::new(7), Generator::new(7));
    assert_same(
        "randn",
        &Tensor::randn_with(&[9, 13], DType::F32, &cuda(), &mut g1).unwrap(),
        &Tensor::randn_with(&[9, 13], DType::F32, &Device::Cpu, &mut g2).unwrap(),
    );
    assert_same(
        "rand f16",
        &Tensor::rand_with(&[31], DType::F16, &cuda(), &mut g1).unwrap(),
        &Tensor::rand_with(&[31], DType::F16, &Device::Cpu, &mut g2).unwrap(),
    );
    done(name);
}

/// Binary ops (broadcast, strided and reversed operands, scalars, in place into a strided view),
/// every unary op, clamp, comparisons, logical ops and `where` match the CPU, in f32 and through
/// f16 and bf16 storage.
#[test]
fn elementwise_ops_match_the_cpu() {
    let name = "elementwise_ops_match_the_cpu";
    if !on_emulator(name) {
        return;
    }
    let mut g = Generator::new(2);
    let a = randn(&mut g, &[3, 5, 7]);
    let b = randn(&mut g, &[5, 1]);
    let c = randn(&mut g, &[7, 5]).t().unwrap(); // strided [5, 7]
    let pos = a.abs().unwrap().add_scalar(0.5).unwrap();
    let (da, db, dc, dpos) = (to_cuda(&a), to_cuda(&b), to_cuda(&c), to_cuda(&pos));
    let tol = 1e-6;
    for (what, got, want) in [
        ("add bcast", da.add(&db), a.add(&b)),
        ("sub strided", da.sub(&dc), a.sub(&c)),
        ("mul bcast strided", dc.mul(&db), c.mul(&b)),
        ("div", da.div(&dpos), a.div(&pos)),
        ("maximum", da.maximum(&dc), a.maximum(&c)),
        ("minimum", db.minimum(&da), b.minimum(&a)),
        ("pow", dpos.pow(&db), pos.pow(&b)),
        ("add_scalar", da.add_scalar(0.25), a.add_scalar(0.25)),
        ("rsub_scalar", da.rsub_scalar(2.0), a.rsub_scalar(2.0)),
        ("rdiv_scalar", dpos.rdiv_scalar(3.0), pos.rdiv_scalar(3.0)),
        ("mul_scalar strided", dc.mul_scalar(-1.5), c.mul_scalar(-1.5)),
    ] {
        assert_near(what, &got.unwrap(), &want.unwrap(), tol);
    }
    // In place into a strided view.
    let (h, d) = (a.clone().deep_clone().unwrap(), da.deep_clone().unwrap());
    h.narrow(2, 1, 5).unwrap().add_(&c.narrow(1, 2, 5).unwrap()).unwrap();
    d.narrow(2, 1, 5).unwrap().add_(&dc.narrow(1, 2, 5).unwrap()).unwrap();
    assert_near("add_ into a strided view", &d, &h, tol);
    let unary: Vec<(&str, UnaryFn)> = vec![
        ("exp", |t| t.exp()),
        ("log", |t| t.abs()?.add_scalar(0.1)?.log()),
        ("sqrt", |t| t.abs()?.sqrt()),
        ("rsqrt", |t| t.abs()?.add_scalar(0.1)?.rsqrt()),
        ("tanh", |t| t.tanh()),
        ("sigmoid", |t| t.sigmoid()),
        ("relu", |t| t.relu()),
        ("neg", |t| t.neg()),
        ("abs", |t| t.abs()),
        ("sin", |t| t.sin()),
        ("cos", |t| t.cos()),
        ("log1p", |t| t.abs()?.log1p()),
        ("reciprocal", |t| t.reciprocal()),
        ("square", |t| t.square()),
        ("pow_scalar 2.5", |t| t.abs()?.pow_scalar(2.5)),
        ("gelu", |t| t.gelu()),
        ("gelu_tanh", |t| t.gelu_tanh()),
        ("silu", |t| t.silu()),
        ("leaky_relu", |t| t.leaky_relu(0.1)),
        ("clamp", |t| t.clamp(Some(-0.5), Some(0.7))),
    ];
    for (what, f) in &unary {
        assert_near(what, &f(&dc).unwrap(), &f(&c).unwrap(), 2e-6);
        for dt in [DType::F16, DType::BF16] {
            let (hc, dc) = (c.to_dtype(dt).unwrap(), dc.to_dtype(dt).unwrap());
            assert_same(&format!("{what} {dt}"), &f(&dc).unwrap(), &f(&hc).unwrap());
        }
    }
    let half = a.to_dtype(DType::BF16).unwrap();
    assert_same(
        "add bf16 bcast",
        &to_cuda(&half).add(&db.to_dtype(DType::BF16).unwrap()).unwrap(),
        &half.add(&b.to_dtype(DType::BF16).unwrap()).unwrap(),
    );
    let cmp: Vec<(&str, CompareFn)> = vec![
        ("eq", |x, y| x.eq(y)),
        ("ne", |x, y| x.ne(y)),
        ("lt", |x, y| x.lt(y)),
        ("le", |x, y| x.le(y)),
        ("gt", |x, y| x.gt(y)),
        ("ge", |x, y| x.ge(y)),
    ];
    let rounded = |t: &Tensor| t.mul_scalar(2.0).unwrap().to_dtype(DType::I64).unwrap().to_dtype(DType::F32).unwrap();
    let (ra, rb) = (rounded(&a), rounded(&b));
    for (what, f) in &cmp {
        assert_same(what, &f(&to_cuda(&ra), &to_cuda(&rb)).unwrap(), &f(&ra, &rb).unwrap());
    }
    assert_same("gt_scalar", &dc.gt_scalar(0.1).unwrap(), &c.gt_scalar(0.1).unwrap());
    assert_same("le_scalar", &da.le_scalar(-0.2).unwrap(), &a.le_scalar(-0.2).unwrap());
    let (m1, m2) = (a.gt_scalar(0.0).unwrap(), b.lt_scalar(0.3).unwrap());
    let (dm1, dm2) = (to_cuda(&m1), to_cuda(&m2));
    assert_same("logical_and", &dm1.logical_and(&dm2).unwrap(), &m1.logical_and(&m2).unwrap());
    assert_same("logical_or", &dm1.logical_or(&dm2).unwrap(), &m1.logical_or(&m2).unwrap());
    assert_same("where", &Tensor::where_cond(&dm2, &da, &dc).unwrap(), &Tensor::where_cond(&m2, &a, &c).unwrap());
    done(name);
}

/// f16 and bf16 elementwise ops read their operands as they are — contiguous, strided (a
/// transpose) or broadcast — compute in f32 and round once on store, so they give the CPU's bits
/// exactly, and the only device memory an op takes is its output: no f32 copies of operands or
/// result (an in-place op and a gradient into an existing tensor take none at all).
#[test]
fn half_elementwise_ops_run_natively_with_no_f32_copies() {
    use ferrite_tensor::backend::kernels_for;
    let name = "half_elementwise_ops_run_natively_with_no_f32_copies";
    if !on_emulator(name) {
        return;
    }
    let mut g = Generator::new(41);
    let al = ferrite_memory::allocator(&cuda());
    // Peak bytes `f` allocates beyond what was live before it, and its result.
    let peak = |f: &dyn Fn() -> Tensor| {
        let before = al.memory_allocated();
        al.reset_peak_memory_stats();
        let t = f();
        (al.max_memory_allocated() - before, t)
    };
    // A tensor's bytes as the caching allocator counts them (blocks of 512 bytes).
    let bytes = |t: &Tensor| (t.numel() * t.dtype().size_in_bytes()).div_ceil(512) as u64 * 512;
    let (cpu, dev) = (kernels_for(&Device::Cpu), kernels_for(&cuda()));
    for dt in [DType::F16, DType::BF16] {
        let h = |t: Tensor| t.to_dtype(dt).unwrap();
        let a = h(randn(&mut g, &[3, 5, 7]));
        let b = h(randn(&mut g, &[5, 1])); // broadcasts
        let c = h(randn(&mut g, &[7, 5])).t().unwrap(); // strided [5, 7]
        let pos = a.abs().unwrap().add_scalar(0.5).unwrap();
        let (da, db, dc, dpos) = (to_cuda(&a), to_cuda(&b), to_cuda(&c), to_cuda(&pos));
        type Op2 = fn(&Tensor, &Tensor, &Tensor) -> ferrite_tensor::Result<Tensor>;
        let binary: Vec<(&str, Op2)> = vec![
            ("add bcast", |a, b, _| a.add(b)),
            ("sub strided", |a, _, c| a.sub(c)),
            ("mul bcast strided", |_, b, c| c.mul(b)),
            ("div strided", |a, _, c| c.div(a)),
            ("maximum", |a, _, c| a.maximum(c)),
            ("minimum bcast", |a, b, _| b.minimum(a)),
            ("ge bcast", |a, b, _| a.ge(b)),
            ("lt strided", |a, _, c| c.lt(a)),
        ];
        for (what, f) in &binary {
            let (used, got) = peak(&|| f(&da, &db, &dc).unwrap());
            assert_same(&format!("{what} {dt:?}"), &got, &f(&a, &b, &c).unwrap());
            assert_eq!(used, bytes(&got), "{what} {dt:?} took {used} bytes for a {}-byte output", bytes(&got));
        }
        let (used, got) = peak(&|| dpos.pow(&db).unwrap());
        assert_same(&format!("pow bcast {dt:?}"), &got, &pos.pow(&b).unwrap());
        assert_eq!(used, bytes(&got), "pow {dt:?}: {used} bytes");
        type Op1 = fn(&Tensor) -> ferrite_tensor::Result<Tensor>;
        let unary: Vec<(&str, Op1)> = vec![
            ("add_scalar", |t| t.add_scalar(0.3)),
            ("sub_scalar", |t| t.sub_scalar(-1.7)),
            ("mul_scalar", |t| t.mul_scalar(-1.5)),
            ("div_scalar", |t| t.div_scalar(3.0)),
            ("rsub_scalar", |t| t.rsub_scalar(2.0)),
            ("rdiv_scalar", |t| t.rdiv_scalar(3.0)),
            ("gelu", |t| t.gelu()),
            ("gelu_tanh", |t| t.gelu_tanh()),
            ("relu", |t| t.relu()),
            ("exp", |t| t.exp()),
            ("tanh", |t| t.tanh()),
            ("neg", |t| t.neg()),
            ("square", |t| t.square()),
            ("leaky_relu", |t| t.leaky_relu(0.1)),
            ("clamp", |t| t.clamp(Some(-0.5), Some(0.7))),
        ];
        for (what, f) in &unary {
            let (used, got) = peak(&|| f(&da).unwrap());
            assert_same(&format!("{what} {dt:?}"), &got, &f(&a).unwrap());
            assert_eq!(used, bytes(&got), "{what} {dt:?} took {used} bytes for a {}-byte output", bytes(&got));
            // A strided input (scalar ops read it through its strides; unary ops copy it).
            assert_same(&format!("{what} {dt:?} strided"), &f(&dc).unwrap(), &f(&c).unwrap());
        }
        // In place: straight into the destination, with a broadcast and a strided source.
        let (hx, dx) = (a.deep_clone().unwrap(), da.deep_clone().unwrap());
        hx.add_(&b).unwrap();
        let (used, _) = peak(&|| {
            dx.add_(&db).unwrap();
            dx.clone()
        });
        assert_same(&format!("add_ bcast {dt:?}"), &dx, &hx);
        assert_eq!(used, 0, "add_ {dt:?} took {used} bytes");
        let (hy, dy) = (c.deep_clone().unwrap(), dc.deep_clone().unwrap());
        hy.mul_(&c).unwrap();
        let (used, _) = peak(&|| {
            dy.mul_(&dc).unwrap();
            dy.clone()
        });
        assert_same(&format!("mul_ strided {dt:?}"), &dy, &hy);
        assert_eq!(used, 0, "mul_ {dt:?} took {used} bytes");
        // x -= x through the same storage, and into a strided view (the scratch path).
        dy.sub_(&dy).unwrap();
        hy.sub_(&hy).unwrap();
        assert_same(&format!("sub_ self {dt:?}"), &dy, &hy);
        let (hz, dz) = (a.deep_clone().unwrap(), da.deep_clone().unwrap());
        hz.narrow(2, 1, 5).unwrap().add_(&c.narrow(1, 2, 5).unwrap()).unwrap();
        dz.narrow(2, 1, 5).unwrap().add_(&dc.narrow(1, 2, 5).unwrap()).unwrap();
        assert_same(&format!("add_ into a strided view {dt:?}"), &dz, &hz);
        // Gradients into an existing output: no memory at all; operands as they are.
        let grad = h(randn(&mut g, &[3, 5, 7]));
        let dgrad = to_cuda(&grad);
        for op in [UnaryOp::Gelu, UnaryOp::GeluTanh, UnaryOp::Relu, UnaryOp::Tanh, UnaryOp::Exp, UnaryOp::Square] {
            let want = Tensor::zeros(&[3, 5, 7], dt, &Device::Cpu).unwrap();
            cpu.unary_backward(op, &want, &grad, &a).unwrap();
            let got = Tensor::zeros(&[3, 5, 7], dt, &cuda()).unwrap();
            let (used, _) = peak(&|| {
                dev.unary_backward(op, &got, &dgrad, &da).unwrap();
                got.clone()
            });
            assert_same(&format!("{op:?} backward {dt:?}"), &got, &want);
            assert_eq!(used, 0, "{op:?} backward {dt:?} took {used} bytes");
        }
    }
    done(name);
}

/// Sums over any dims (mean too), (log-)softmax, layer norm, and matmul — 2-D, batched with a
/// broadcast batch, transposed and narrowed operands, f16 storage — match the CPU.
/// NaN goes through relu, the activations and clamp as on the CPU (PyTorch's rules: `relu(NaN)`
/// is NaN, `clamp` keeps a NaN element, `min > max` gives `max`).
#[test]
fn nan_passes_through_activations_and_clamp_as_on_the_cpu() {
    let name = "nan_passes_through_activations_and_clamp_as_on_the_cpu";
    if !on_emulator(name) {
        return;
    }
    let x = Tensor::from_vec(vec![1.5f32, -2.0, f32::NAN, 0.0, -0.0, 3.0, f32::NAN], &[7], &Device::Cpu).unwrap();
    let dx = to_cuda(&x);
    let ops: [(&str, UnaryFn); 5] = [
        ("relu", Tensor::relu),
        ("sigmoid", Tensor::sigmoid),
        ("tanh", Tensor::tanh),
        ("gelu", Tensor::gelu),
        ("exp", Tensor::exp),
    ];
    for (what, f) in ops {
        let (got, want) = (to_cpu(&f(&dx).unwrap()).to_vec_f64().unwrap(), f(&x).unwrap().to_vec_f64().unwrap());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let same = (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-6 * w.abs().max(1.0);
            assert!(same, "{what}[{i}]: {g} on cuda:0, {w} on cpu");
        }
    }
    for (lo, hi) in [(Some(0.0), Some(2.0)), (Some(3.0), Some(1.0)), (None, Some(0.5))] {
        assert_same(&format!("clamp({lo:?}, {hi:?})"), &dx.clamp(lo, hi).unwrap(), &x.clamp(lo, hi).unwrap());
    }
    done(name);
}

#[test]
fn reductions_row_kernels_and_matmul_match_the_cpu() {
    let name = "reductions_row_kernels_and_matmul_match_the_cpu";
    if !on_emulator(name) {
        return;
    }
    let mut g = Generator::new(3);
    let x = randn(&mut g, &[3, 5, 7]);
    let dx = to_cuda(&x);
    for (dims, keep) in [(vec![], false), (vec![0], false), (vec![1], true), (vec![-1], false), (vec![0, 2], true)] {
        assert_near(
            &format!("sum {dims:?}"),
            &dx.sum_dims(&dims, keep).unwrap(),
            &x.sum_dims(&dims, keep).unwrap(),
            1e-5,
        );
        assert_near(
            &format!("mean {dims:?}"),
            &dx.mean_dims(&dims, keep).unwrap(),
            &x.mean_dims(&dims, keep).unwrap(),
            1e-5,
        );
    }
    let xt = x.transpose(0, 2).unwrap();
    assert_near(
        "sum of a transposed view",
        &dx.transpose(0, 2).unwrap().sum_dims(&[1], false).unwrap(),
        &xt.sum_dims(&[1], false).unwrap(),
        1e-5,
    );
    let wide = randn(&mut g, &[3, 300]);
    for (what, t) in [("x", &x), ("wide", &wide)] {
        let d = to_cuda(t);
        assert_near(&format!("softmax {what}"), &d.softmax(-1).unwrap(), &t.softmax(-1).unwrap(), 1e-6);
        assert_near(&format!("log_softmax {what}"), &d.log_softmax(-1).unwrap(), &t.log_softmax(-1).unwrap(), 1e-5);
        let cols = *t.shape().last().unwrap();
        let (w, b) = (randn(&mut g, &[cols]), randn(&mut g, &[cols]));
        assert_near(
            &format!("layer_norm {what}"),
            &layer_norm(&d, &[cols], Some(&to_cuda(&w)), Some(&to_cuda(&b)), 1e-5).unwrap(),
            &layer_norm(t, &[cols], Some(&w), Some(&b), 1e-5).unwrap(),
            1e-5,
        );
        assert_near(
            &format!("layer_norm {what} no affine"),
            &layer_norm(&d, &[cols], None, None, 1e-5).unwrap(),
            &layer_norm(t, &[cols], None, None, 1e-5).unwrap(),
            1e-5,
        );
    }
    let a = randn(&mut g, &[2, 3, 5, 9]);
    let b = randn(&mut g, &[9, 4]);
    let bt = randn(&mut g, &[3, 4, 9]).transpose(-1, -2).unwrap();
    let at = randn(&mut g, &[9, 5]).t().unwrap();
    let an = randn(&mut g, &[5, 12]).narrow(1, 2, 9).unwrap();
    for (what, l, r) in [
        ("2-D", a.narrow(0, 0, 1).unwrap().narrow(1, 0, 1).unwrap().reshape(&[5, 9]).unwrap(), b.clone()),
        ("batched, broadcast rhs", a.clone(), b.clone()),
        ("batched, transposed rhs", a.clone(), bt.clone()),
        ("transposed lhs", at.clone(), b.clone()),
        ("narrowed lhs", an.clone(), b.clone()),
        ("expanded batch", at.unsqueeze(0).unwrap().expand(&[3, 5, 9]).unwrap(), bt.clone()),
    ] {
        assert_near(
            &format!("matmul {what}"),
            &to_cuda(&l).matmul(&to_cuda(&r)).unwrap(),
            &l.matmul(&r).unwrap(),
            1e-5,
        );
    }
    let (ah, bh) = (a.to_dtype(DType::F16).unwrap(), b.to_dtype(DType::F16).unwrap());
    assert_same("matmul f16", &to_cuda(&ah).matmul(&to_cuda(&bh)).unwrap(), &ah.matmul(&bh).unwrap());
    // Half operands go to the GEMM as they are (f32 accumulation, one rounding), transposed
    // views included, and the only device memory the product takes is its own output: no f32
    // copies of the operands or the result.
    for dtype in [DType::F16, DType::BF16] {
        let (l, r) = (a.to_dtype(dtype).unwrap(), bt.to_dtype(dtype).unwrap());
        let (lc, rc) = (to_cuda(&l), to_cuda(&r));
        assert_near(
            &format!("matmul {dtype:?}, transposed rhs"),
            &lc.matmul(&rc).unwrap(),
            &l.matmul(&r).unwrap(),
            1e-2,
        );
        let (x, y) =
            (randn(&mut g, &[64, 96]).to_dtype(dtype).unwrap(), randn(&mut g, &[96, 64]).to_dtype(dtype).unwrap());
        let (xc, yc) = (to_cuda(&x), to_cuda(&y));
        let al = ferrite_memory::allocator(&cuda());
        let before = al.memory_allocated();
        al.reset_peak_memory_stats();
        let z = xc.matmul(&yc).unwrap();
        let (peak, out) = (al.max_memory_allocated() - before, (64 * 64 * 2) as u64);
        assert_eq!(peak, out, "{dtype:?} matmul took {peak} bytes for a {out}-byte output");
        assert_near(&format!("matmul {dtype:?} 64x96x64"), &z, &x.matmul(&y).unwrap(), 1e-2);
    }
    done(name);
}

/// Gradients through the implemented ops (unary backward kernels, broadcast sums, matmul,
/// softmax backward) match the CPU's.
#[test]
fn gradients_match_the_cpu() {
    let name = "gradients_match_the_cpu";
    if !on_emulator(name) {
        return;
    }
    let mut g = Generator::new(4);
    let (a, b, w) = (randn(&mut g, &[4, 6]), randn(&mut g, &[6]), randn(&mut g, &[6, 3]));
    let run = |dev: &Device, op: UnaryOp| -> Vec<Tensor> {
        let leaf = |t: &Tensor| leaf_on(dev, t);
        let (a, b, w) = (leaf(&a), leaf(&b), leaf(&w));
        let h = a.mul(&b).unwrap();
        let h = match op {
            UnaryOp::Exp => h.exp(),
            UnaryOp::Log => h.abs().and_then(|t| t.add_scalar(0.5)).and_then(|t| t.log()),
            UnaryOp::Sqrt => h.abs().and_then(|t| t.add_scalar(0.5)).and_then(|t| t.sqrt()),
            UnaryOp::Tanh => h.tanh(),
            UnaryOp::Sigmoid => h.sigmoid(),
            UnaryOp::Relu => h.relu(),
            UnaryOp::Sin => h.sin(),
            UnaryOp::Square => h.square(),
            UnaryOp::Gelu => h.gelu(),
            UnaryOp::GeluTanh => h.gelu_tanh(),
            UnaryOp::Silu => h.silu(),
            UnaryOp::LeakyRelu(p) => h.leaky_relu(p),
            UnaryOp::Pow(p) => h.abs().and_then(|t| t.pow_scalar(p)),
            _ => unreachable!(),
        }
        .unwrap();
        let y = h.matmul(&w).unwrap().log_softmax(-1).unwrap().softmax(-1).unwrap();
        y.mul(&y).unwrap().sum().unwrap().backward().unwrap();
        [a, b, w].iter().map(|t| t.grad().unwrap().to_device(&Device::Cpu).unwrap()).collect()
    };
    for op in [
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Sin,
        UnaryOp::Square,
        UnaryOp::Gelu,
        UnaryOp::GeluTanh,
        UnaryOp::Silu,
        UnaryOp::LeakyRelu(0.2),
        UnaryOp::Pow(1.5),
    ] {
        let (got, want) = (run(&cuda(), op), run(&Device::Cpu, op));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_close(&format!("{op:?} grad {i}"), g, w, 1e-4, 1e-5);
        }
    }
    done(name);
}

/// PyTorch's reference cases of the implemented ops hold on the emulated device: outputs and
/// every input gradient, at each case's tolerance.
#[test]
fn pytorch_reference_cases_hold_on_the_emulated_device() {
    let name = "pytorch_reference_cases_hold_on_the_emulated_device";
    if !on_emulator(name) {
        return;
    }
    let Some(dir) = ferrite_test_support::reference_or_skip("ops/manifest.json") else {
        done(name);
        return;
    };
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("ops/manifest.json")).unwrap()).unwrap();
    let cases = [
        "add__bcast",
        "sub__bcast",
        "mul__bcast",
        "div__bcast",
        "exp",
        "log",
        "sqrt",
        "neg",
        "tanh",
        "sigmoid",
        "relu",
        "silu",
        "gelu__erf",
        "gelu__tanh",
        "pow__scalar",
        "softmax__dim_last",
        "log_softmax__dim_last",
        "sum__all",
        "sum__dim1_keepdim",
        "mean__dim_last",
        "matmul__2d",
        "matmul__batched_bcast",
        "layer_norm",
        "transpose__0_1",
        "permute__2_0_1",
        "narrow__dim1",
    ];
    for case_name in cases {
        let case = manifest["cases"].as_array().unwrap().iter().find(|c| c["name"] == case_name).unwrap();
        let (rtol, atol) = (case["rtol"].as_f64().unwrap(), case["atol"].as_f64().unwrap());
        let attrs = &case["attrs"];
        let fx = ferrite_test_support::fixtures::load(&dir.join(format!("ops/{case_name}.safetensors")));
        let get = |n: &str| ferrite_test_support::fixtures::get(&fx, n).clone();
        let n_in = case["inputs"].as_u64().unwrap() as usize;
        let inputs: Vec<Tensor> =
            (0..n_in).map(|i| to_cuda(&get(&format!("input.{i}"))).requires_grad_(true).unwrap()).collect();
        let x = &inputs[0];
        let dims = |v: &serde_json::Value| -> Vec<i64> {
            match v {
                serde_json::Value::Array(a) => a.iter().map(|d| d.as_i64().unwrap()).collect(),
                serde_json::Value::Number(n) => vec![n.as_i64().unwrap()],
                _ => vec![],
            }
        };
        let keep = attrs["keepdim"].as_bool().unwrap_or(false);
        let out = match case["op"].as_str().unwrap() {
            "add" => x.add(&inputs[1]),
            "sub" => x.sub(&inputs[1]),
            "mul" => x.mul(&inputs[1]),
            "div" => x.div(&inputs[1]),
            "exp" => x.exp(),
            "log" => x.log(),
            "sqrt" => x.sqrt(),
            "neg" => x.neg(),
            "tanh" => x.tanh(),
            "sigmoid" => x.sigmoid(),
            "relu" => x.relu(),
            "silu" => x.silu(),
            "gelu" if attrs["approximate"] == "tanh" => x.gelu_tanh(),
            "gelu" => x.gelu(),
            "pow" => x.pow_scalar(attrs["exponent"].as_f64().unwrap()),
            "softmax" => x.softmax(attrs["dim"].as_i64().unwrap()),
            "log_softmax" => x.log_softmax(attrs["dim"].as_i64().unwrap()),
            "sum" => x.sum_dims(&dims(&attrs["dim"]), keep),
            "mean" => x.mean_dims(&dims(&attrs["dim"]), keep),
            "matmul" => x.matmul(&inputs[1]),
            "layer_norm" => {
                let shape: Vec<usize> = attrs["normalized_shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap() as usize)
                    .collect();
                layer_norm(x, &shape, Some(&inputs[1]), Some(&inputs[2]), attrs["eps"].as_f64().unwrap())
            }
            "transpose" => x.transpose(attrs["dim0"].as_i64().unwrap(), attrs["dim1"].as_i64().unwrap()),
            "permute" => x.permute(&dims(&attrs["dims"])),
            "narrow" => x.narrow(
                attrs["dim"].as_i64().unwrap(),
                attrs["start"].as_u64().unwrap() as usize,
                attrs["length"].as_u64().unwrap() as usize,
            ),
            op => panic!("{case_name}: op {op} not wired in this test"),
        }
        .unwrap_or_else(|e| panic!("{case_name}: {e}"));
        assert_close(&format!("{case_name} output"), &to_cpu(&out), &get("output"), rtol, atol);
        if case["has_grad"].as_bool().unwrap_or(false) {
            out.backward_with(&to_cuda(&get("grad_output")), false).unwrap();
            for (i, t) in inputs.iter().enumerate() {
                let grad = t.grad().unwrap_or_else(|| panic!("{case_name}: no gradient for input {i}"));
                assert_close(
                    &format!("{case_name} grad {i}"),
                    &to_cpu(&grad),
                    &get(&format!("grad_input.{i}")),
                    rtol,
                    atol,
                );
            }
        }
    }
    done(name);
}

/// Runs `f` on copies of `inputs` on `dev` (leaves that require grad), backpropagates the sum
/// of squares of its output, and returns the output and every input's gradient on the CPU.
fn forward_backward(
    dev: &Device,
    inputs: &[&Tensor],
    f: &dyn Fn(&[Tensor]) -> ferrite_tensor::Result<Tensor>,
) -> (Tensor, Vec<Tensor>) {
    let leaves: Vec<Tensor> = inputs.iter().map(|t| leaf_on(dev, t)).collect();
    let out = f(&leaves).unwrap_or_else(|e| panic!("{dev}: {e}"));
    out.mul(&out).unwrap().sum().unwrap().backward().unwrap();
    let grads = leaves.iter().map(|t| t.grad().expect("a gradient").to_device(&Device::Cpu).unwrap()).collect();
    (out.to_device(&Device::Cpu).unwrap(), grads)
}

/// The output and gradients of `f` on the emulated device against the CPU's.
fn same_forward_backward(
    what: &str,
    inputs: &[&Tensor],
    tol: f64,
    f: &dyn Fn(&[Tensor]) -> ferrite_tensor::Result<Tensor>,
) {
    let (got, got_g) = forward_backward(&cuda(), inputs, f);
    let (want, want_g) = forward_backward(&Device::Cpu, inputs, f);
    assert_close(&format!("{what} output"), &got, &want, tol, tol);
    for (i, (g, w)) in got_g.iter().zip(&want_g).enumerate() {
        assert_close(&format!("{what} grad {i}"), g, w, tol, tol);
    }
}

/// Variance, max/min with indices, integer comparisons, index ops (index_select, gather,
/// scatter_add, one_hot, embedding, cross entropy), RMS/batch/group norm, pooling and conv2d
/// (through im2col/col2im) match the CPU, gradients included; a bad index is the CPU's typed error.
#[test]
fn index_norm_pool_and_conv_ops_match_the_cpu() {
    use ferrite_tensor::functional::{
        AvgPool2dOptions, BatchNormOptions, Conv2dOptions, CrossEntropyOptions, MaxPool2dOptions, adaptive_avg_pool2d,
        avg_pool2d, batch_norm, conv2d, cross_entropy, embedding, group_norm, max_pool2d, rms_norm,
    };
    let name = "index_norm_pool_and_conv_ops_match_the_cpu";
    if !on_emulator(name) {
        return;
    }
    let mut g = Generator::new(5);
    let x = randn(&mut g, &[4, 6, 5]);
    let dx = to_cuda(&x);
    for (dims, keep) in [(vec![1i64], false), (vec![0, 2], true), (vec![], false)] {
        assert_near(
            &format!("var {dims:?}"),
            &dx.var_dims(&dims, 1, keep).unwrap(),
            &x.var_dims(&dims, 1, keep).unwrap(),
            1e-5,
        );
    }
    for dim in [0i64, 1, -1] {
        let ((gv, gi), (wv, wi)) = (dx.max_dim(dim, false).unwrap(), x.max_dim(dim, false).unwrap());
        assert_same(&format!("max values {dim}"), &gv, &wv);
        assert_same(&format!("max indices {dim}"), &gi, &wi);
        let ((gv, gi), (wv, wi)) = (dx.min_dim(dim, true).unwrap(), x.min_dim(dim, true).unwrap());
        assert_same(&format!("min values {dim}"), &gv, &wv);
        assert_same(&format!("min indices {dim}"), &gi, &wi);
        assert_same(&format!("argmax {dim}"), &dx.argmax(dim, false).unwrap(), &x.argmax(dim, false).unwrap());
    }
    // Integer comparisons are exact beyond f32's precision; fractional scalars follow the CPU.
    let big = Tensor::from_vec(vec![16_777_217i64, 16_777_216, -3, 2, 7], &[5], &Device::Cpu).unwrap();
    let other = Tensor::from_vec(vec![16_777_216i64, 16_777_216, -3, 3, 7], &[5], &Device::Cpu).unwrap();
    let (db, dot) = (to_cuda(&big), to_cuda(&other));
    assert_same("eq i64", &db.eq(&dot).unwrap(), &big.eq(&other).unwrap());
    assert_same("gt i64", &db.gt(&dot).unwrap(), &big.gt(&other).unwrap());
    for s in [2.5, -3.0, 1e30, f64::NAN] {
        assert_same(&format!("lt_scalar {s}"), &db.lt_scalar(s).unwrap(), &big.lt_scalar(s).unwrap());
        assert_same(&format!("ge_scalar {s}"), &db.ge_scalar(s).unwrap(), &big.ge_scalar(s).unwrap());
        assert_same(&format!("eq_scalar {s}"), &db.eq_scalar(s).unwrap(), &big.eq_scalar(s).unwrap());
    }
    // Index ops.
    let idx = Tensor::from_vec(vec![4i64, 0, 2, 2, 5], &[5], &Device::Cpu).unwrap();
    same_forward_backward("index_select", &[&x], 1e-5, &|t| t[0].index_select(1, &idx.to_device(t[0].device())?));
    let gidx =
        Tensor::from_vec((0..4 * 3 * 5).map(|i| (i * 7 % 6) as i64).collect::<Vec<_>>(), &[4, 3, 5], &Device::Cpu)
            .unwrap();
    same_forward_backward("gather", &[&x], 1e-5, &|t| t[0].gather(1, &gidx.to_device(t[0].device())?));
    let src = randn(&mut g, &[4, 3, 5]);
    assert_near(
        "scatter_add",
        &dx.scatter_add(1, &to_cuda(&gidx), &to_cuda(&src)).unwrap(),
        &x.scatter_add(1, &gidx, &src).unwrap(),
        1e-5,
    );
    assert_same("one_hot", &to_cuda(&idx).one_hot(7).unwrap(), &idx.one_hot(7).unwrap());
    let table = randn(&mut g, &[7, 3]);
    let tokens = Tensor::from_vec(vec![1i64, 6, 1, 0, 3, 3], &[2, 3], &Device::Cpu).unwrap();
    same_forward_backward("embedding", &[&table], 1e-5, &|t| embedding(&tokens.to_device(t[0].device())?, &t[0]));
    let logits = randn(&mut g, &[6, 5]);
    let target = Tensor::from_vec(vec![0i64, 4, -100, 2, 2, 1], &[6], &Device::Cpu).unwrap();
    same_forward_backward("cross_entropy", &[&logits], 1e-5, &|t| {
        cross_entropy(&t[0], &target.to_device(t[0].device())?, &CrossEntropyOptions::default())
    });
    let bad = Tensor::from_vec(vec![1i64, 6], &[2], &Device::Cpu).unwrap();
    let queued = dx.index_select(1, &to_cuda(&bad)).expect("a device-side error waits for the next synchronisation");
    let e = queued.to_vec::<f32>().unwrap_err();
    let want = x.index_select(1, &bad).unwrap_err();
    assert_eq!(e.to_string(), want.to_string(), "a bad index is the CPU's error");
    // Norms.
    let img = randn(&mut g, &[3, 4, 5, 3]);
    let (w4, b4) = (randn(&mut g, &[4]), randn(&mut g, &[4]));
    same_forward_backward("rms_norm", &[&img, &randn(&mut g, &[3])], 1e-4, &|t| {
        rms_norm(&t[0], &[3], Some(&t[1]), Some(1e-6))
    });
    same_forward_backward("group_norm", &[&img, &w4, &b4], 1e-4, &|t| {
        group_norm(&t[0], 2, Some(&t[1]), Some(&t[2]), 1e-5)
    });
    same_forward_backward("group_norm, no affine", &[&img], 1e-4, &|t| group_norm(&t[0], 4, None, None, 1e-5));
    let train = BatchNormOptions { training: true, ..BatchNormOptions::default() };
    let (rm, rv) = (randn(&mut g, &[4]), randn(&mut g, &[4]).abs().unwrap());
    let (drm, drv) = (to_cuda(&rm), to_cuda(&rv));
    let (hrm, hrv) = (rm.deep_clone().unwrap(), rv.deep_clone().unwrap());
    same_forward_backward("batch_norm train", &[&img, &w4, &b4], 1e-4, &|t| {
        let (m, v) = if t[0].device() == &cuda() { (&drm, &drv) } else { (&hrm, &hrv) };
        batch_norm(&t[0], Some(m), Some(v), Some(&t[1]), Some(&t[2]), &train)
    });
    assert_near("running mean", &drm, &hrm, 1e-5);
    assert_near("running var", &drv, &hrv, 1e-5);
    let eval = BatchNormOptions { training: false, ..BatchNormOptions::default() };
    same_forward_backward("batch_norm eval", &[&img, &w4], 1e-4, &|t| {
        let (m, v) = if t[0].device() == &cuda() { (&drm, &drv) } else { (&hrm, &hrv) };
        batch_norm(&t[0], Some(m), Some(v), Some(&t[1]), None, &eval)
    });
    // Pooling and convolution.
    let planes = randn(&mut g, &[2, 3, 7, 6]);
    let mut mp = MaxPool2dOptions::new([3, 2]);
    mp.stride = Some([2, 2]);
    mp.padding = [1, 1];
    same_forward_backward("max_pool2d", &[&planes], 1e-5, &|t| max_pool2d(&t[0], &mp));
    let mut ap = AvgPool2dOptions::new([2, 3]);
    ap.padding = [1, 1];
    ap.count_include_pad = false;
    same_forward_backward("avg_pool2d", &[&planes], 1e-5, &|t| avg_pool2d(&t[0], &ap));
    same_forward_backward("adaptive_avg_pool2d", &[&planes], 1e-5, &|t| adaptive_avg_pool2d(&t[0], [Some(3), Some(4)]));
    let (kw, kb) = (randn(&mut g, &[4, 3, 3, 2]), randn(&mut g, &[4]));
    let opts = Conv2dOptions::new().stride([2, 1]).padding([1, 1]);
    same_forward_backward("conv2d", &[&planes, &kw, &kb], 1e-4, &|t| conv2d(&t[0], &t[1], Some(&t[2]), &opts));
    done(name);
}

/// Convolutions on `cuda:N` run as implicit GEMM (conv_implicit.cu): forward, input gradient and
/// weight gradient match the CPU's unfold + GEMM for every kind of geometry — groups (depthwise
/// included), stride, padding, dilation, conv1d, conv_transpose2d (which runs the same products
/// with the roles swapped), sizes that are not multiples of the 64 × 64 tile or the 16-deep slice,
/// a weight gradient deep enough to be split across blocks, f16 operands — and through autograd
/// every pass takes the path `functional/conv.rs` picks (stride-1 input gradients as a flipped
/// convolution, strided ones as the gathering fold).
#[test]
fn convolutions_run_as_implicit_gemm_and_match_the_cpu() {
    use ferrite_tensor::functional::{
        Conv1dOptions, Conv2dOptions, ConvTranspose2dOptions, Padding, conv_transpose2d, conv1d, conv2d,
    };
    let name = "convolutions_run_as_implicit_gemm_and_match_the_cpu";
    if !on_emulator(name) {
        return;
    }
    let mut g = Generator::new(31);
    // (what, input, weight, options): conv2d with a bias.
    let convs: Vec<(&str, Vec<usize>, Vec<usize>, Conv2dOptions)> = vec![
        ("3x3 same", vec![2, 3, 9, 11], vec![5, 3, 3, 3], Conv2dOptions::new().padding(Padding::Same)),
        (
            "groups 2, stride 2x1, dilation 1x2",
            vec![2, 4, 10, 9],
            vec![6, 2, 3, 2],
            Conv2dOptions::new().groups(2).stride([2, 1]).padding([1, 2]).dilation([1, 2]),
        ),
        (
            "depthwise 5x5 stride 2",
            vec![1, 4, 7, 8],
            vec![4, 1, 5, 5],
            Conv2dOptions::new().groups(4).stride(2).padding(2),
        ),
        (
            "beyond one tile: 70 rows, 156 windows, depth 81",
            vec![2, 9, 13, 12],
            vec![70, 9, 3, 3],
            Conv2dOptions::new(),
        ),
        ("weight gradient split in depth", vec![2, 2, 24, 24], vec![3, 2, 3, 3], Conv2dOptions::new().padding(1)),
        ("1x1", vec![3, 5, 4, 3], vec![7, 5, 1, 1], Conv2dOptions::new()),
    ];
    for (what, xs, ws, opts) in &convs {
        let (x, w, b) = (randn(&mut g, xs), randn(&mut g, ws), randn(&mut g, &[ws[0]]));
        same_forward_backward(&format!("conv2d {what}"), &[&x, &w, &b], 1e-4, &|t| {
            conv2d(&t[0], &t[1], Some(&t[2]), opts)
        });
    }
    let (x1, w1) = (randn(&mut g, &[2, 3, 23]), randn(&mut g, &[4, 3, 4]));
    let o1 = Conv1dOptions::new().stride(3).padding(2).dilation(2);
    same_forward_backward("conv1d", &[&x1, &w1], 1e-4, &|t| conv1d(&t[0], &t[1], None, &o1));
    let transposed: Vec<(&str, Vec<usize>, Vec<usize>, ConvTranspose2dOptions)> = vec![
        (
            "stride 2, output padding 1",
            vec![2, 4, 5, 6],
            vec![4, 3, 3, 3],
            ConvTranspose2dOptions::new().stride(2).padding(1).output_padding(1),
        ),
        (
            "groups 2, stride 1x2, dilation 2x1",
            vec![1, 4, 4, 5],
            vec![4, 2, 2, 3],
            ConvTranspose2dOptions::new().groups(2).stride([1, 2]).dilation([2, 1]),
        ),
    ];
    for (what, xs, ws, opts) in &transposed {
        let (x, w, b) = (randn(&mut g, xs), randn(&mut g, ws), randn(&mut g, &[ws[1] * opts.groups]));
        same_forward_backward(&format!("conv_transpose2d {what}"), &[&x, &w, &b], 1e-4, &|t| {
            conv_transpose2d(&t[0], &t[1], Some(&t[2]), opts)
        });
    }
    let (xh, wh) = (randn(&mut g, &[2, 3, 6, 7]), randn(&mut g, &[4, 3, 3, 3]));
    let oh = Conv2dOptions::new().stride(2).padding(1);
    same_forward_backward("conv2d f16", &[&xh, &wh], 1e-2, &|t| {
        conv2d(&t[0].to_dtype(DType::F16)?, &t[1].to_dtype(DType::F16)?, None, &oh)?.to_dtype(DType::F32)
    });
    done(name);
}

/// The point of the implicit GEMM is memory: a convolution product on `cuda:0` allocates its
/// result and nothing else — no unfolded image (the default unfold + GEMM would allocate 28 KiB
/// of unfolded columns for each of these products) — and a weight gradient split in depth only
/// adds its partial results, weight-sized. Measured at the seam and through `conv2d` /
/// `conv_transpose2d`, with the results checked against the CPU's default path.
#[test]
fn a_convolution_on_cuda_allocates_no_unfold_scratch() {
    use ferrite_tensor::backend::{ConvGeometry, kernels_for};
    use ferrite_tensor::functional::{Conv2dOptions, ConvTranspose2dOptions, conv_transpose2d, conv2d};
    let name = "a_convolution_on_cuda_allocates_no_unfold_scratch";
    if !on_emulator(name) {
        return;
    }
    let mut g = Generator::new(32);
    let al = ferrite_memory::allocator(&cuda());
    // Peak bytes `f` allocates beyond what was live before it, and its result.
    let peak = |f: &dyn Fn() -> Tensor| {
        let before = al.memory_allocated();
        al.reset_peak_memory_stats();
        let t = f();
        (al.max_memory_allocated() - before, t)
    };
    // An f32 tensor's bytes as the caching allocator counts them (blocks of 512 bytes).
    let block = |bytes: usize| bytes.div_ceil(512) as u64 * 512;
    let f32_bytes = |t: &Tensor| block(t.numel() * 4);
    let (x, w) = (randn(&mut g, &[2, 8, 12, 12]), randn(&mut g, &[16, 8, 3, 3]));
    let (xc, wc) = (to_cuda(&x), to_cuda(&w));
    let opts = Conv2dOptions::new().padding(1);
    let (bytes, y) = peak(&|| conv2d(&xc, &wc, None, &opts).unwrap());
    assert_eq!(bytes, f32_bytes(&y), "conv2d forward took {bytes} bytes for its {}-byte output", f32_bytes(&y));
    assert_near("conv2d forward", &y, &conv2d(&x, &w, None, &opts).unwrap(), 1e-4);
    let tw = randn(&mut g, &[8, 6, 3, 3]);
    let twc = to_cuda(&tw);
    let topts = ConvTranspose2dOptions::new().stride(2).padding(1);
    let (bytes, yt) = peak(&|| conv_transpose2d(&xc, &twc, None, &topts).unwrap());
    assert_eq!(bytes, f32_bytes(&yt), "conv_transpose2d took {bytes} bytes for its {}-byte output", f32_bytes(&yt));
    assert_near("conv_transpose2d forward", &yt, &conv_transpose2d(&x, &tw, None, &topts).unwrap(), 1e-4);
    // The three products at the seam: `cuda:0`'s implicit GEMM against the CPU's default.
    let geom = ConvGeometry {
        channels: 8,
        input: [12, 12],
        kernel: [3, 3],
        stride: [1, 1],
        padding: [1, 1],
        dilation: [1, 1],
        output: [12, 12],
    };
    let (groups, m) = (2, 8);
    let a3 = randn(&mut g, &[16, 4, 3, 3]).reshape(&[groups as i64, m as i64, 36]).unwrap();
    let a3c = to_cuda(&a3);
    let dy = randn(&mut g, &[2, 16, 12, 12]);
    let dyc = to_cuda(&dy);
    let (cpu, dev) = (kernels_for(&Device::Cpu), kernels_for(&cuda()));
    let (bytes, got) = peak(&|| dev.conv_unfold_product(&xc, &a3c, &geom, groups).unwrap());
    assert_eq!(bytes, f32_bytes(&got), "forward product: {bytes} bytes");
    assert_near("forward product", &got, &cpu.conv_unfold_product(&x, &a3, &geom, groups).unwrap(), 1e-4);
    let (bytes, got) = peak(&|| dev.conv_product_fold(&a3c, &dyc, &geom, groups, x.shape()).unwrap());
    assert_eq!(bytes, f32_bytes(&got), "fold product: {bytes} bytes");
    assert_near("fold product", &got, &cpu.conv_product_fold(&a3, &dy, &geom, groups, x.shape()).unwrap(), 1e-4);
    let (bytes, got) = peak(&|| dev.conv_weight_product(&dyc, &xc, &geom, groups).unwrap());
    assert_eq!(bytes, f32_bytes(&got), "weight product (one depth range): {bytes} bytes");
    assert_near("weight product", &got, &cpu.conv_weight_product(&dy, &x, &geom, groups).unwrap(), 1e-4);
    // Deep enough to split (2 samples × 576 windows): the partial results are the only extra.
    let deep = ConvGeometry { channels: 2, input: [24, 24], output: [24, 24], ..geom };
    let (xd, dyd) = (randn(&mut g, &[2, 2, 24, 24]), randn(&mut g, &[2, 3, 24, 24]));
    let (xdc, dydc) = (to_cuda(&xd), to_cuda(&dyd));
    let (bytes, got) = peak(&|| dev.conv_weight_product(&dydc, &xdc, &deep, 1).unwrap());
    let (out, most) = (f32_bytes(&got), f32_bytes(&got) + block(16 * got.numel() * 4));
    assert!(bytes > out && bytes <= most, "split weight product: {bytes} bytes for a {out}-byte result");
    assert_near("split weight product", &got, &cpu.conv_weight_product(&dyd, &xd, &deep, 1).unwrap(), 1e-4);
    done(name);
}

/// The CPU's error for `bad` run on the CPU, and what the same op gives on `cuda:0`: Ok at the op
/// (its kernels are only queued), then the very same typed error (variant and fields, the op's
/// name included) at the next synchronisation `sync` — and a clean state after it.
fn same_deferred_error(
    what: &str,
    op: &str,
    run: &dyn Fn(&Device) -> ferrite_tensor::Result<Tensor>,
    sync: &dyn Fn(&Tensor) -> ferrite_tensor::Result<()>,
) {
    let want = run(&Device::Cpu).unwrap_err();
    assert!(matches!(&want, TensorError::IndexOutOfRange { op: o, .. } if *o == op), "{what}: CPU gives {want:?}");
    let queued =
        run(&cuda()).unwrap_or_else(|e| panic!("{what}: the op itself must not report a device-side error: {e}"));
    let got = sync(&queued).expect_err(&format!("{what}: the next synchronisation reports the error"));
    assert_eq!(format!("{got:?}"), format!("{want:?}"), "{what}");
    assert_eq!(got.to_string(), want.to_string(), "{what}");
    sync(&queued).unwrap_or_else(|e| panic!("{what}: reported once, then the state is clean: {e}"));
}

/// PyTorch's asynchronous model (issue 31): an out-of-range index of index_select, gather,
/// embedding, one_hot, cross_entropy/nll_loss targets on `cuda:0` is Ok at the op and the CPU's
/// `IndexOutOfRange` (same op, index, dim and size) at the next synchronisation — `to_vec`,
/// `item`, `.to(cpu)` or `synchronize` —; two bad ops report the first queued; afterwards every
/// op works again.
#[test]
fn device_side_index_errors_surface_at_the_next_synchronisation() {
    use ferrite_tensor::functional::{CrossEntropyOptions, cross_entropy, embedding, nll_loss};
    let name = "device_side_index_errors_surface_at_the_next_synchronisation";
    if !on_emulator(name) {
        return;
    }
    let mut g = Generator::new(31);
    let x = randn(&mut g, &[4, 3]);
    let on = |t: &Tensor, d: &Device| t.to_device(d);
    let ints = |v: &[i64], shape: &[usize]| Tensor::from_slice(v, shape, &Device::Cpu).unwrap();
    let to_vec = |t: &Tensor| t.to_vec::<f32>().map(|_| ());
    let item = |t: &Tensor| t.item().map(|_| ());
    let to_host = |t: &Tensor| t.to_device(&Device::Cpu).map(|_| ());
    let sync = |_: &Tensor| ferrite_tensor::backend::kernels_for(&cuda()).synchronize();
    // Several bad values: the first in order is the one reported, as on the CPU.
    let sel = ints(&[1, 7, 2, 9], &[4]);
    same_deferred_error("index_select", "index_select", &|d| on(&x, d)?.index_select(0, &on(&sel, d)?), &to_vec);
    let gat = ints(&[0, 2, 1, 0, 5, 1, 2, 3], &[4, 2]);
    same_deferred_error("gather", "gather", &|d| on(&x, d)?.gather(1, &on(&gat, d)?), &sync);
    let tokens = ints(&[1, 0, 3, 4, 2, 8], &[2, 3]);
    same_deferred_error("embedding", "index_select", &|d| embedding(&on(&tokens, d)?, &on(&x, d)?), &to_host);
    let opts = CrossEntropyOptions::default();
    let target = ints(&[0, -100, 3, 1], &[4]);
    same_deferred_error(
        "cross_entropy target",
        "cross_entropy",
        &|d| cross_entropy(&on(&x, d)?, &on(&target, d)?, &opts),
        &item,
    );
    let target = ints(&[2, -1, 0, 1], &[4]);
    same_deferred_error(
        "nll_loss target",
        "nll_loss",
        &|d| nll_loss(&on(&x, d)?.log_softmax(1)?, &on(&target, d)?, &opts),
        &item,
    );
    // Queue order: the first bad op queued is the one reported, once.
    let want = x.gather(1, &gat).unwrap_err();
    let dx = to_cuda(&x);
    let a = dx.gather(1, &to_cuda(&gat)).unwrap();
    let b = dx.index_select(0, &to_cuda(&sel)).unwrap();
    let e = b.to_vec::<f32>().unwrap_err();
    assert_eq!(format!("{e:?}"), format!("{want:?}"), "the first error queued");
    to_vec(&a).unwrap();
    // Afterwards every op works and matches the CPU.
    let good = ints(&[3, 0, 0, 2], &[4]);
    assert_same(
        "index_select after an error",
        &dx.index_select(0, &to_cuda(&good)).unwrap(),
        &x.index_select(0, &good).unwrap(),
    );
    assert_near(
        "cross_entropy after an error",
        &cross_entropy(&dx, &to_cuda(&ints(&[2, 0, 1, 1], &[4])), &opts).unwrap(),
        &cross_entropy(&x, &ints(&[2, 0, 1, 1], &[4]), &opts).unwrap(),
        1e-5,
    );
    done(name);
}

/// Index ops, embedding and the class-target check of cross entropy queue their kernels and
/// never make the host wait for the device (no `synchronize`, no copy to the host): the only wait
/// is the `.item()` that reads the loss, as in PyTorch. The flags queued by a loop that never
/// reads back stay bounded: at most one wait per slab of flags.
#[test]
fn index_ops_and_class_targets_do_not_synchronise() {
    use ferrite_cuda::HostRuntime;
    use ferrite_tensor::functional::{CrossEntropyOptions, cross_entropy, embedding};
    let name = "index_ops_and_class_targets_do_not_synchronise";
    if !alone_on_emulator(name) {
        return;
    }
    let mut g = Generator::new(3);
    let (x, table) = (to_cuda(&randn(&mut g, &[4, 3])), to_cuda(&randn(&mut g, &[7, 3])));
    let idx = to_cuda(&Tensor::from_slice(&[3i64, 0, 2], &[3], &Device::Cpu).unwrap());
    let gidx = to_cuda(&Tensor::from_slice(&[0i64, 2, 1, 1, 2, 0, 0, 0], &[4, 2], &Device::Cpu).unwrap());
    let tokens = to_cuda(&Tensor::from_slice(&[6i64, 0, 3, 3], &[2, 2], &Device::Cpu).unwrap());
    let target = to_cuda(&Tensor::from_slice(&[0i64, 2, -100, 1], &[4], &Device::Cpu).unwrap());
    let classes = to_cuda(&Tensor::from_slice(&[0i64, 2, 1, 1], &[4], &Device::Cpu).unwrap());
    // Compile every kernel involved first (not a wait, but keep the measured part plain).
    let warm = cross_entropy(
        &x.index_select(0, &idx).unwrap(),
        &target.narrow(0, 0, 3).unwrap(),
        &CrossEntropyOptions::default(),
    )
    .unwrap();
    warm.item().unwrap();
    let before = HostRuntime::host_waits();
    let mut loss = None;
    for _ in 0..4 {
        let picked = x.index_select(0, &idx).unwrap();
        let gathered = x.gather(1, &gidx).unwrap();
        let emb = embedding(&tokens, &table).unwrap();
        let oh = classes.one_hot(3).unwrap();
        let ce = cross_entropy(&x, &target, &CrossEntropyOptions::default()).unwrap();
        let l = ce.add(&picked.sum().unwrap()).unwrap().add(&gathered.sum().unwrap()).unwrap();
        let l = l.add(&emb.sum().unwrap()).unwrap().add(&oh.to_dtype(DType::F32).unwrap().sum().unwrap()).unwrap();
        loss = Some(l);
    }
    assert_eq!(HostRuntime::host_waits() - before, 0, "index ops and cross entropy queue work without waiting");
    let loss = loss.expect("four steps ran");
    loss.item().unwrap();
    assert!(HostRuntime::host_waits() > before, "item() is a synchronisation point");
    // A loop that never reads back: the flags are drained once per slab, not kept without bound.
    let before = HostRuntime::host_waits();
    let ops = 600;
    for _ in 0..ops {
        x.index_select(0, &idx).unwrap();
    }
    let waits = HostRuntime::host_waits() - before;
    assert!((1..=ops / 200).contains(&waits), "{waits} waits for {ops} flagged ops");
    done(name);
}

/// Each element's bits as an integer (exact for every dtype; NaN payloads included).
fn element_bits(t: &Tensor) -> Vec<u64> {
    let t = t.to_device(&Device::Cpu).unwrap();
    match t.dtype() {
        DType::F32 => t.to_vec::<f32>().unwrap().into_iter().map(|v| u64::from(v.to_bits())).collect(),
        DType::F64 => t.to_vec::<f64>().unwrap().into_iter().map(f64::to_bits).collect(),
        DType::F16 => t.to_vec::<half::f16>().unwrap().into_iter().map(|v| u64::from(v.to_bits())).collect(),
        DType::BF16 => t.to_vec::<half::bf16>().unwrap().into_iter().map(|v| u64::from(v.to_bits())).collect(),
        DType::I64 => t.to_vec::<i64>().unwrap().into_iter().map(|v| v as u64).collect(),
        DType::I32 => t.to_vec::<i32>().unwrap().into_iter().map(|v| u64::from(v as u32)).collect(),
        DType::U8 => t.to_vec::<u8>().unwrap().into_iter().map(u64::from).collect(),
        DType::Bool => t.to_vec::<ferrite_tensor::Bool8>().unwrap().into_iter().map(|v| u64::from(v.0)).collect(),
    }
}

/// A fill on `cuda:0` holds the very bits the CPU's fill holds, in every dtype: the value is
/// converted on the host as the CPU converts it (rounding, f16 overflow to infinity, NaN,
/// truncated and saturated integers, bool as `value != 0`) and written by a kernel of the
/// element's width — also into a view that starts inside its storage, and through `fill_`.
#[test]
fn fills_hold_the_cpu_s_bits_in_every_dtype() {
    let name = "fills_hold_the_cpu_s_bits_in_every_dtype";
    if !on_emulator(name) {
        return;
    }
    let values = [
        0.0,
        -0.0,
        1.0,
        -2.5,
        0.1,
        3.7,
        -3.7,
        255.5,
        300.0,
        1e5,
        -1e5,
        65519.0,
        1.00390625, // halfway between two bf16 neighbours: rounds to even
        1e-30,
        3e9,
        1e20,
        -1e20,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
    ];
    for dt in DType::ALL {
        for v in values {
            let want = element_bits(&Tensor::full(&[37], v, dt, &Device::Cpu).unwrap());
            let got = Tensor::full(&[37], v, dt, &cuda()).unwrap();
            assert_eq!(element_bits(&got), want, "full({v}) as {dt}");
            // fill_ into the middle rows of a larger tensor (a contiguous view at an offset).
            let big = Tensor::zeros(&[4, 5], dt, &cuda()).unwrap();
            big.narrow(0, 1, 2).unwrap().fill_(v).unwrap();
            let host = Tensor::zeros(&[4, 5], dt, &Device::Cpu).unwrap();
            host.narrow(0, 1, 2).unwrap().fill_(v).unwrap();
            assert_eq!(element_bits(&big), element_bits(&host), "fill_({v}) of rows 1..3 as {dt}");
        }
    }
    done(name);
}

/// A training step on `cuda:0` — a linear layer, cross entropy with an ignored target (its
/// integer `zeros` and `target != ignore_index`), backward, an SGD update, fills of every dtype,
/// position ids from `arange` —
/// queues all of its work: the host waits for the device only where it reads a loss back. On a
/// GPU an upload waits too (the emulator counts it), so a fill that uploaded its value would
/// stall every step. The losses are the CPU's.
#[test]
fn a_training_step_with_cross_entropy_never_waits_for_the_device() {
    use ferrite_cuda::HostRuntime;
    use ferrite_tensor::functional::{CrossEntropyOptions, cross_entropy};
    let name = "a_training_step_with_cross_entropy_never_waits_for_the_device";
    if !alone_on_emulator(name) {
        return;
    }
    let mut g = Generator::new(5);
    let (w0, b0, x0) = (randn(&mut g, &[4, 3]), randn(&mut g, &[3]), randn(&mut g, &[6, 4]));
    let target0 = Tensor::from_slice(&[0i64, 2, 1, -100, 2, 0], &[6], &Device::Cpu).unwrap();
    let train = |dev: &Device, count_waits: bool| -> Vec<f64> {
        let leaf = |t: &Tensor| leaf_on(dev, t);
        let (w, b) = (leaf(&w0), leaf(&b0));
        let (x, target) = (x0.to_device(dev).unwrap(), target0.to_device(dev).unwrap());
        let step = || -> Tensor {
            let logits = x.matmul(&w).unwrap().add(&b).unwrap();
            let loss = cross_entropy(&logits, &target, &CrossEntropyOptions::default()).unwrap();
            loss.backward().unwrap();
            let _no_grad = ferrite_tensor::no_grad();
            for p in [&w, &b] {
                p.add_scaled_(&p.grad().unwrap(), -0.5).unwrap();
                p.set_grad(None).unwrap();
            }
            for dt in DType::ALL {
                Tensor::full(&[3], -1.5, dt, dev).unwrap();
            }
            // A transformer's position ids, made every forward.
            Tensor::arange(0.0, 6.0, 1.0, DType::I64, dev).unwrap();
            loss
        };
        // The first step compiles every kernel and allocates the device's flag slab.
        let mut losses = vec![step().item().unwrap()];
        let before = HostRuntime::host_waits();
        let queued: Vec<Tensor> = (0..3).map(|_| step()).collect();
        if count_waits {
            assert_eq!(HostRuntime::host_waits() - before, 0, "host waits in three training steps on {dev}");
        }
        losses.extend(queued.iter().map(|l| l.item().unwrap()));
        if count_waits {
            assert!(HostRuntime::host_waits() > before, "reading a loss back waits for the device");
        }
        losses
    };
    let (got, want) = (train(&cuda(), true), train(&Device::Cpu, false));
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "loss of step {i}: cuda {a}, cpu {b}");
    }
    assert!(want[3] < want[0], "the steps train: {want:?}");
    done(name);
}

/// What the backend does not do is a typed error naming the op and the device: f64 and integer
/// arithmetic (also in the fused kernels and losses); and the emulator is `cuda:0` only and says so
/// where devices are listed.
#[test]
fn the_emulated_device_refuses_with_typed_errors_and_is_listed_as_emulated() {
    let name = "the_emulated_device_refuses_with_typed_errors_and_is_listed_as_emulated";
    if !on_emulator(name) {
        return;
    }
    let f = Tensor::ones(&[3], DType::F64, &cuda()).unwrap();
    assert!(matches!(f.add(&f).unwrap_err(), TensorError::UnsupportedDType { dtype: DType::F64, .. }));
    // The fused kernels, losses and cells refuse f64 the same way.
    let e = ferrite_tensor::functional::smooth_l1_loss(&f, &f, 1.0, ferrite_tensor::functional::Reduction::Mean)
        .unwrap_err();
    assert!(matches!(e, TensorError::UnsupportedDType { dtype: DType::F64, .. }), "{e:?}");
    let e = Tensor::fused(&FusedKernel::ClampAbs { clip: 1.0 }, &[&f], &[]).unwrap_err();
    assert!(matches!(e, TensorError::UnsupportedDType { dtype: DType::F64, .. }), "{e:?}");
    let i = Tensor::ones(&[3], DType::I64, &cuda()).unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), [1, 1, 1]);
    let e = i.mul(&i).unwrap_err();
    assert!(matches!(e, TensorError::UnsupportedDType { dtype: DType::I64, .. }), "{e:?}");
    let e = Tensor::zeros(&[2], DType::F32, &Device::Cuda { index: 1 }).unwrap_err();
    assert!(matches!(&e, TensorError::Memory(MemoryError::CudaDeviceMissing { visible: 1, .. })), "{e:?}");
    let listed = ferrite_memory::cuda::cuda_devices(false).unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].name.contains("emulated"), "{}", listed[0].name);
    let all = ferrite_memory::devices().unwrap();
    let c = all.iter().find(|i| i.device == cuda()).expect("cuda:0 is listed");
    assert!(c.name.contains("emulated"), "{}", c.name);
    done(name);
}

/// Without the emulator and without an NVIDIA driver (this CI machine), a tensor on `cuda:0` is
/// one typed error saying the driver is missing and what to use instead — no panic.
#[test]
fn cuda_without_the_emulator_and_without_a_driver_is_one_typed_error() {
    if ferrite_memory::cuda::emulator_enabled() {
        eprintln!("SKIPPED here: this process has {EMULATOR_ENV}=1 (the other tests cover that case)");
        return;
    }
    if ferrite_memory::cuda::driver().is_ok() {
        eprintln!("SKIPPED: an NVIDIA driver is installed; this test is about machines without one");
        return;
    }
    let e = Tensor::zeros(&[4], DType::F32, &cuda()).unwrap_err();
    assert!(matches!(&e, TensorError::Memory(MemoryError::CudaDriverNotFound { .. })), "{e:?}");
    assert!(e.to_string().contains("cuda:0") && e.to_string().contains("`cpu`"), "{e}");
    let e = Tensor::ones(&[4], DType::F32, &Device::Cpu).unwrap().to_device(&cuda()).unwrap_err();
    assert!(matches!(&e, TensorError::Memory(MemoryError::CudaDriverNotFound { .. })), "{e:?}");
}

/// Runs `kernel` twice on copies of `state` (outputs, then the inputs) on the emulated device and
/// on the CPU; every output and the results agree.
fn same_fused(what: &str, kernel: &FusedKernel, again: Option<&FusedKernel>, state: &[Tensor], tol: f64) {
    let (outs, ins) = kernel.arity();
    assert_eq!(outs + ins, state.len(), "{what}: operand count");
    let run = |dev: &Device| -> (Vec<Tensor>, Vec<f64>) {
        let ts: Vec<Tensor> = state.iter().map(|t| t.deep_clone().unwrap().to_device(dev).unwrap()).collect();
        let refs: Vec<&Tensor> = ts.iter().collect();
        let mut results = vec![
            Tensor::fused(kernel, &refs[..outs], &refs[outs..]).unwrap_or_else(|e| panic!("{what} on {dev}: {e}")),
        ];
        if let Some(k) = again {
            results.push(
                Tensor::fused(k, &refs[..outs], &refs[outs..]).unwrap_or_else(|e| panic!("{what} on {dev}: {e}")),
            );
        }
        (ts.iter().map(|t| t.to_device(&Device::Cpu).unwrap()).collect(), results)
    };
    let (got, got_r) = run(&cuda());
    let (want, want_r) = run(&Device::Cpu);
    // Equal (infinities and NaN included) or within `tol` relative and absolute.
    for (i, (g, w)) in got.iter().zip(&want).enumerate().take(outs) {
        let (gv, wv) = (g.to_vec_f64().unwrap(), w.to_vec_f64().unwrap());
        for (j, (x, y)) in gv.iter().zip(&wv).enumerate() {
            let ok = x == y || (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol * (1.0 + y.abs());
            assert!(ok, "{what}: output {i}[{j}]: {x} vs {y}");
        }
    }
    for (g, w) in got_r.iter().zip(&want_r) {
        let same = g == w || (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-9 * w.abs().max(1.0);
        assert!(same, "{what}: result {g} vs {w}");
    }
}

/// Every fused kernel with every flag — SGD (momentum 0 and not, nesterov, dampening, weight
/// decay, maximize, first step), Adam and AdamW (L2 or decoupled decay, amsgrad, maximize, both of
/// lerp's formulas), RMSprop (momentum, centered, weight decay, maximize), Adagrad (weight decay,
/// maximize), the GradScaler's unscale with and without inf/NaN, every kind of vector norm, value
/// clipping and scaling, plus an f16 and a bf16 step — matches the CPU backend after two steps.
#[test]
fn fused_kernels_match_the_cpu_with_every_flag() {
    let name = "fused_kernels_match_the_cpu_with_every_flag";
    if !on_emulator(name) {
        return;
    }
    let mut g = Generator::new(11);
    let n = 301;
    let mut rnd = |scale: f64, positive: bool| {
        let t = randn(&mut g, &[n]).mul_scalar(scale).unwrap();
        if positive { t.abs().unwrap().add_scalar(0.5).unwrap() } else { t }
    };
    let (p, grad, buf1, buf2, pos1, pos2) =
        (rnd(1.0, false), rnd(1.0, false), rnd(0.1, false), rnd(0.1, false), rnd(1.0, true), rnd(1.0, true));
    for momentum in [0.0, 0.9] {
        for nesterov in [false, true] {
            if nesterov && momentum == 0.0 {
                continue;
            }
            for weight_decay in [0.0, 0.01] {
                for maximize in [false, true] {
                    let k = |first_step| FusedKernel::Sgd {
                        lr: 0.1,
                        momentum,
                        dampening: 0.1,
                        nesterov,
                        weight_decay,
                        maximize,
                        first_step,
                    };
                    let mut st = vec![p.clone()];
                    if momentum != 0.0 {
                        st.push(buf1.clone());
                    }
                    st.push(grad.clone());
                    let what = format!("sgd m{momentum} nesterov {nesterov} wd {weight_decay} maximize {maximize}");
                    same_fused(&what, &k(true), Some(&k(false)), &st, 1e-6);
                    same_fused(&format!("{what} (no first step)"), &k(false), None, &st, 1e-6);
                }
            }
        }
    }
    for (l2, decay) in [(None, None), (Some(0.01), None), (None, Some(1.0 - 1e-3 * 0.01))] {
        for amsgrad in [false, true] {
            for maximize in [false, true] {
                for beta1 in [0.9, 0.3] {
                    let k = FusedKernel::Adam {
                        l2,
                        decay,
                        beta1,
                        beta2: 0.999,
                        eps: 1e-8,
                        bias_correction2_sqrt: (1.0f64 - 0.999f64.powi(2)).sqrt(),
                        step_size: 1e-3 / (1.0 - beta1 * beta1),
                        maximize,
                        amsgrad,
                    };
                    let mut st = vec![p.clone(), buf1.clone(), pos1.clone()];
                    if amsgrad {
                        st.push(pos2.clone());
                    }
                    st.push(grad.clone());
                    let what =
                        format!("adam l2 {l2:?} decay {decay:?} amsgrad {amsgrad} maximize {maximize} beta1 {beta1}");
                    same_fused(&what, &k, Some(&k), &st, 1e-6);
                }
            }
        }
    }
    for momentum in [0.0, 0.9] {
        for centered in [false, true] {
            for weight_decay in [0.0, 0.01] {
                for (maximize, alpha) in [(false, 0.99), (true, 0.99), (false, 0.3)] {
                    let k =
                        FusedKernel::Rmsprop { lr: 0.01, alpha, eps: 1e-8, weight_decay, momentum, centered, maximize };
                    let mut st = vec![p.clone(), pos1.clone()];
                    if momentum > 0.0 {
                        st.push(buf1.clone());
                    }
                    if centered {
                        st.push(buf2.clone());
                    }
                    st.push(grad.clone());
                    let what = format!(
                        "rmsprop m{momentum} centered {centered} wd {weight_decay} maximize {maximize} alpha {alpha}"
                    );
                    same_fused(&what, &k, Some(&k), &st, 1e-6);
                }
            }
        }
    }
    for weight_decay in [0.0, 0.01] {
        for maximize in [false, true] {
            let k = FusedKernel::Adagrad { clr: 0.1 / 1.01, eps: 1e-10, weight_decay, maximize };
            let st = [p.clone(), pos1.clone(), grad.clone()];
            same_fused(&format!("adagrad wd {weight_decay} maximize {maximize}"), &k, Some(&k), &st, 1e-6);
        }
    }
    let mut poisoned = grad.to_vec::<f32>().unwrap();
    for (inv_scale, poison) in [(0.5, None), (1.0, None), (0.25, Some(f32::INFINITY)), (1.0, Some(f32::NAN))] {
        if let Some(v) = poison {
            poisoned[n - 3] = v;
        }
        let gr = Tensor::from_slice(&poisoned, &[n], &Device::Cpu).unwrap();
        let k = FusedKernel::Unscale { inv_scale };
        same_fused(&format!("unscale {inv_scale} {poison:?}"), &k, None, &[gr], 0.0);
    }
    let big = randn(&mut g, &[1001]);
    for p in [2.0, 1.0, f64::INFINITY, f64::NEG_INFINITY, 0.0, 3.0] {
        let k = FusedKernel::NormPartial { kind: ferrite_tensor::backend::NormKind::of(p) };
        same_fused(&format!("norm partial p={p}"), &k, None, std::slice::from_ref(&big), 0.0);
    }
    let nan_norm = Tensor::from_slice(&poisoned, &[n], &Device::Cpu).unwrap();
    let k = FusedKernel::NormPartial { kind: ferrite_tensor::backend::NormKind::Inf };
    same_fused("inf norm with a NaN", &k, None, &[nan_norm], 0.0);
    same_fused("clamp_abs", &FusedKernel::ClampAbs { clip: 0.7 }, None, std::slice::from_ref(&grad), 0.0);
    same_fused("scale", &FusedKernel::Scale { coef: 0.123_456_789 }, None, std::slice::from_ref(&grad), 0.0);
    // f16 and bf16 operands go through f32 on CUDA; the CPU rounds its intermediates to the
    // element type, hence the looser tolerance.
    for dtype in [DType::F16, DType::BF16] {
        let cast = |t: &Tensor| t.to_dtype(dtype).unwrap();
        let k = FusedKernel::Sgd {
            lr: 0.1,
            momentum: 0.9,
            dampening: 0.0,
            nesterov: true,
            weight_decay: 0.01,
            maximize: false,
            first_step: true,
        };
        same_fused(&format!("sgd {dtype:?}"), &k, None, &[cast(&p), cast(&buf1), cast(&grad)], 2e-2);
        let k = FusedKernel::Scale { coef: 0.123_456_789 };
        same_fused(&format!("scale {dtype:?}"), &k, None, &[cast(&grad)], 0.0);
    }
    done(name);
}

/// Every pointwise loss (binary cross entropy with and without weights, with logits with
/// pos_weight, smooth L1 with beta 0 and not, Huber, KL divergence with and without log targets)
/// with every reduction, forward and the gradients for input and target, on a strided input,
/// matches the CPU backend; an out-of-range probability is the CPU's typed error.
#[test]
fn pointwise_losses_and_their_gradients_match_the_cpu() {
    use ferrite_tensor::functional::{
        KlDivReduction, Reduction, binary_cross_entropy, binary_cross_entropy_with_logits, huber_loss, kl_div,
        smooth_l1_loss,
    };
    let name = "pointwise_losses_and_their_gradients_match_the_cpu";
    if !on_emulator(name) {
        return;
    }
    let mut g = Generator::new(21);
    // Inputs [5, 7] as the transpose of [7, 5] (strided), targets [5, 7], weights [7] broadcast.
    let xt = randn(&mut g, &[7, 5]);
    let y = randn(&mut g, &[5, 7]);
    let w = randn(&mut g, &[7]).abs().unwrap();
    let pw = randn(&mut g, &[7]).abs().unwrap().add_scalar(0.5).unwrap();
    let on = |t: &Tensor, like: &Tensor| t.to_device(like.device()).unwrap();
    for red in [Reduction::None, Reduction::Mean, Reduction::Sum] {
        let what = |l: &str| format!("{l} {red:?}");
        same_forward_backward(&what("bce"), &[&xt, &y], 1e-5, &|t| {
            binary_cross_entropy(&t[0].t()?.sigmoid()?, &t[1].sigmoid()?, None, red)
        });
        same_forward_backward(&what("bce weighted"), &[&xt, &y], 1e-5, &|t| {
            binary_cross_entropy(&t[0].t()?.sigmoid()?, &t[1].sigmoid()?, Some(&on(&w, &t[0])), red)
        });
        same_forward_backward(&what("bce with logits"), &[&xt, &y], 1e-5, &|t| {
            binary_cross_entropy_with_logits(&t[0].t()?, &t[1].sigmoid()?, None, None, red)
        });
        same_forward_backward(&what("bce with logits, weight and pos_weight"), &[&xt, &y], 1e-5, &|t| {
            binary_cross_entropy_with_logits(
                &t[0].t()?,
                &t[1].sigmoid()?,
                Some(&on(&w, &t[0])),
                Some(&on(&pw, &t[0])),
                red,
            )
        });
        for beta in [0.0, 0.5] {
            same_forward_backward(&what(&format!("smooth_l1 beta {beta}")), &[&xt, &y], 1e-5, &|t| {
                smooth_l1_loss(&t[0].t()?, &t[1], beta, red)
            });
        }
        same_forward_backward(&what("huber"), &[&xt, &y], 1e-5, &|t| huber_loss(&t[0].t()?, &t[1], 0.7, red));
    }
    for red in [KlDivReduction::None, KlDivReduction::Mean, KlDivReduction::Sum, KlDivReduction::BatchMean] {
        same_forward_backward(&format!("kl_div {red:?}"), &[&xt, &y], 1e-5, &|t| {
            kl_div(&t[0].t()?.log_softmax(-1)?, &t[1].softmax(-1)?, red, false)
        });
        same_forward_backward(&format!("kl_div log_target {red:?}"), &[&xt, &y], 1e-5, &|t| {
            kl_div(&t[0].t()?.log_softmax(-1)?, &t[1].log_softmax(-1)?, red, true)
        });
    }
    // A zero target is 0 in the forward (xlogy), as on the CPU.
    let zt = Tensor::from_slice(&[0.0f32, 0.5, 0.5], &[3], &Device::Cpu).unwrap();
    let zx = Tensor::from_slice(&[-1.0f32, -0.5, -2.0], &[3], &Device::Cpu).unwrap();
    assert_near(
        "kl_div with a zero target",
        &kl_div(&to_cuda(&zx), &to_cuda(&zt), KlDivReduction::None, false).unwrap(),
        &kl_div(&zx, &zt, KlDivReduction::None, false).unwrap(),
        1e-6,
    );
    // Probabilities outside [0, 1]: the CPU's typed error, on the input and on the target.
    let (good, bad) = (
        Tensor::from_slice(&[0.5f32, 0.25], &[2], &Device::Cpu).unwrap(),
        Tensor::from_slice(&[0.5f32, 1.5], &[2], &Device::Cpu).unwrap(),
    );
    for (x, t) in [(&bad, &good), (&good, &bad)] {
        // Queued without a wait; the error is the CPU's, at the next synchronisation.
        let loss = binary_cross_entropy(&to_cuda(x), &to_cuda(t), None, Reduction::Mean).unwrap();
        let e = loss.item().unwrap_err();
        let want = binary_cross_entropy(x, t, None, Reduction::Mean).unwrap_err();
        assert_eq!(e.to_string(), want.to_string());
    }
    done(name);
}

/// The LSTM, GRU, tanh RNN and ReLU RNN cells over whole sequences (batch-first, so every step is
/// a strided row block, and time-first), with and without biases and initial states, forward and
/// every gradient (through the output and through the final states), match the CPU backend.
#[test]
fn recurrent_cells_forward_and_backward_match_the_cpu() {
    use ferrite_tensor::functional::{RecurrentCell, RecurrentWeights, recurrent};
    let name = "recurrent_cells_forward_and_backward_match_the_cpu";
    if !on_emulator(name) {
        return;
    }
    let mut g = Generator::new(31);
    let (batch, steps, input, hidden) = (3, 4, 5, 6);
    for cell in [RecurrentCell::Lstm, RecurrentCell::Gru, RecurrentCell::RnnTanh, RecurrentCell::RnnRelu] {
        let width = cell.gates() * hidden;
        let x = randn(&mut g, &[batch, steps, input]);
        let w_ih = randn(&mut g, &[width, input]).mul_scalar(0.4).unwrap();
        let w_hh = randn(&mut g, &[width, hidden]).mul_scalar(0.4).unwrap();
        let (b_ih, b_hh) = (randn(&mut g, &[width]), randn(&mut g, &[width]));
        let (h0, c0) = (randn(&mut g, &[batch, hidden]), randn(&mut g, &[batch, hidden]));
        let lstm = cell == RecurrentCell::Lstm;
        for batch_first in [true, false] {
            let what = format!("{} batch_first {batch_first}", cell.name());
            same_forward_backward(
                &format!("{what}, biases and states"),
                &[&x, &w_ih, &w_hh, &b_ih, &b_hh, &h0, &c0],
                1e-4,
                &|t| {
                    let x = if batch_first { t[0].clone() } else { t[0].transpose(0, 1)? };
                    let w = RecurrentWeights { w_ih: &t[1], w_hh: &t[2], b_ih: Some(&t[3]), b_hh: Some(&t[4]) };
                    let r = recurrent(cell, &x, w, Some(&t[5]), if lstm { Some(&t[6]) } else { None }, batch_first)?;
                    // The output, and the final states through their own path.
                    let mut total = r.output.sum()?.add(&r.h_n.mul(&r.h_n)?.sum()?)?;
                    if let Some(c) = &r.c_n {
                        total = total.add(&c.mul(c)?.sum()?)?;
                    }
                    // c0 is unused by the other cells: give it a zero gradient path.
                    total.add(&t[6].mul_scalar(0.0)?.sum()?)
                },
            );
            same_forward_backward(&format!("{what}, no biases or states"), &[&x, &w_ih, &w_hh], 1e-4, &|t| {
                let x = if batch_first { t[0].clone() } else { t[0].transpose(0, 1)? };
                let w = RecurrentWeights { w_ih: &t[1], w_hh: &t[2], b_ih: None, b_hh: None };
                Ok(recurrent(cell, &x, w, None, None, batch_first)?.output)
            });
        }
    }
    done(name);
}
