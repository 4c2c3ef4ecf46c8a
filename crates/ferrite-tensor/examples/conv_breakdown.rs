//! Where the time of a convolution step goes (perf is not available on the benchmark machine,
//! so this times the pieces): the conv forward with and without bias, the batched products it
//! is made of run alone through `matmul` with the same shapes, and backward with and without the
//! input gradient. `cargo run --release -p ferrite-tensor --example conv_breakdown [-- B CIN COUT HW K]`
//! (defaults: the `conv_step` bench's 32 3 64 32 3). Minimum of 20 runs each, in ms (the least disturbed run on a shared machine).

use std::time::Instant;

use ferrite_tensor::functional::{Conv2dOptions, conv2d};
use ferrite_tensor::{DType, Device, Generator, Tensor, no_grad};

/// With `CONV_CPU_TIME=1`: the process's CPU time (Linux) instead of wall time, to compare
/// variants on a machine shared with other jobs (preemption does not count; run with
/// `RAYON_NUM_THREADS=1` so idle helpers do not count either).
fn cpu_seconds() -> Option<f64> {
    std::env::var_os("CONV_CPU_TIME").and_then(|_| ferrite_test_support::timing::process_cpu_seconds())
}

fn med(mut f: impl FnMut()) -> f64 {
    f();
    let mut v: Vec<f64> = (0..20)
        .map(|_| {
            let t = Instant::now();
            let c0 = cpu_seconds();
            f();
            match (c0, cpu_seconds()) {
                (Some(c0), Some(c1)) => (c1 - c0) * 1e3,
                _ => t.elapsed().as_secs_f64() * 1e3,
            }
        })
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v[0]
}

fn main() {
    let a: Vec<usize> = std::env::args().skip(1).filter_map(|s| s.parse().ok()).collect();
    let [b, cin, cout, hw, k] = [0, 1, 2, 3, 4].map(|i| a.get(i).copied().unwrap_or([32, 3, 64, 32, 3][i]));
    let d = Device::Cpu;
    let mut g = Generator::new(0);
    let x = Tensor::randn_with(&[b, cin, hw, hw], DType::F32, &d, &mut g).unwrap();
    let w = Tensor::randn_with(&[cout, cin, k, k], DType::F32, &d, &mut g).unwrap();
    let bias = Tensor::randn_with(&[cout], DType::F32, &d, &mut g).unwrap();
    let o = Conv2dOptions::new().padding(k / 2);
    let (kk, p) = (cin * k * k, hw * hw);
    let cols = Tensor::randn_with(&[b, kk, p], DType::F32, &d, &mut g).unwrap();
    let w2 = w.reshape_usize(&[cout, kk]).unwrap();
    let gy = Tensor::randn_with(&[b, cout, p], DType::F32, &d, &mut g).unwrap();
    let _ng = no_grad();
    println!("B{b} {cin}->{cout} {hw}x{hw} k{k}, RAYON_NUM_THREADS={:?}", std::env::var("RAYON_NUM_THREADS").ok());
    println!("conv forward, no bias      {:8.3}", med(|| drop(conv2d(&x, &w, None, &o).unwrap())));
    println!("conv forward, bias         {:8.3}", med(|| drop(conv2d(&x, &w, Some(&bias), &o).unwrap())));
    println!("  product W·cols alone     {:8.3}", med(|| drop(w2.matmul(&cols).unwrap())));
    let ct = cols.transpose(1, 2).unwrap();
    println!("  product gY·colsᵀ alone   {:8.3}", med(|| drop(gy.matmul(&ct).unwrap())));
    let wt = w2.t().unwrap();
    println!("  product Wᵀ·gY alone      {:8.3}", med(|| drop(wt.matmul(&gy).unwrap())));
    let gyt = gy.transpose(1, 2).unwrap();
    println!("  alt: cols·gYᵀ            {:8.3}", med(|| drop(cols.matmul(&gyt).unwrap())));
    println!("  alt: gYᵀ·W               {:8.3}", med(|| drop(gyt.matmul(&w2).unwrap())));
    let gyc = gyt.contiguous().unwrap();
    println!("  alt: gYᵀ(contig)·W       {:8.3}", med(|| drop(gyc.matmul(&w2).unwrap())));
    let colsf = cols.permute(&[1, 0, 2]).unwrap().contiguous().unwrap().reshape_usize(&[kk, b * p]).unwrap();
    println!("  alt: W·cols (one GEMM)   {:8.3}", med(|| drop(w2.matmul(&colsf).unwrap())));
    let gyf = gy.permute(&[1, 0, 2]).unwrap().contiguous().unwrap().reshape_usize(&[cout, b * p]).unwrap();
    println!("  alt: gY·colsᵀ (one GEMM) {:8.3}", med(|| drop(gyf.matmul(&colsf.t().unwrap()).unwrap())));
    println!("  alt: Wᵀ·gY (one GEMM)    {:8.3}", med(|| drop(wt.matmul(&gyf).unwrap())));
    println!("  permute [N,C,P]->[C,N,P] {:8.3}", med(|| drop(gy.permute(&[1, 0, 2]).unwrap().contiguous().unwrap())));
    let y = conv2d(&x, &w, Some(&bias), &o).unwrap();
    println!("  y.square()               {:8.3}", med(|| drop(y.square().unwrap())));
    println!("  sum over (0, 2, 3)       {:8.3}", med(|| drop(y.sum_dims(&[0, 2, 3], false).unwrap())));
    drop(_ng);
    for input_grad in [false, true] {
        let xg = x.detach().requires_grad_(input_grad).unwrap();
        let wg = w.detach().requires_grad_(true).unwrap();
        let bg = bias.detach().requires_grad_(true).unwrap();
        let t = med(|| {
            let y = conv2d(&xg, &wg, Some(&bg), &o).unwrap();
            y.backward_with(&y.detach(), false).unwrap();
            wg.set_grad(None).unwrap();
            bg.set_grad(None).unwrap();
            xg.set_grad(None).unwrap();
        });
        println!("forward + backward (input grad {input_grad:5}) {t:8.3}");
    }
}
