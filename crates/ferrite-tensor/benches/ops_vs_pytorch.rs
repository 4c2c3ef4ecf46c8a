//! Tensor throughput figures comparable with PyTorch CPU (see `bench/tensor_vs_pytorch.py`,
//! which runs this and the same workloads in PyTorch with the same thread count).
//!
//! `cargo bench -p ferrite-tensor --bench ops_vs_pytorch` prints the CPU (`cpu <report>`), then
//! one line per workload: `matmul <n> <GFLOP/s>`, `bmm_qk <S> <GFLOP/s>` and `bmm_pv <S>
//! <GFLOP/s>` (attention's two batched products, `[B·H, S, 64] × [B·H, 64, S]` from a transposed
//! key view and `[B·H, S, S] × [B·H, S, 64]`, B·H = 128), `chain <elements> <ms>`,
//! `softmax|layer_norm|sum_rows <rows> <ms>` (the transformer's row kernels over `[rows, 256]`:
//! softmax over the last dim, layer norm with weight and bias, a sum over the rows as in a bias
//! gradient), `softmax_bwd|layer_norm_bwd <rows> <ms>` (their backward passes, replayed on a
//! kept graph with a fixed output gradient; `rows:NAME` runs one of the row workloads alone, for a
//! profile), `tiny_add <ns per op>`. `FERRITE_BENCH_SEQ=S` and `FERRITE_BENCH_ROWS=RxC` change the
//! attention and row shapes (`bench/all_vs_pytorch.py` reports several).

use std::time::Instant;

use ferrite_tensor::{DType, Device, Generator, Tensor};

fn best_of<F: FnMut()>(reps: usize, iters: usize, mut f: F) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / iters as f64);
    }
    best
}

fn main() {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let want = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let d = Device::Cpu;
    let mut g = Generator::new(0);
    println!("cpu {}", ferrite_tensor::cpu_report());
    println!("threads {}", rayon::current_num_threads());
    if want("matmul") {
        for n in [32usize, 64, 256, 1024, 2048] {
            let a = Tensor::randn_with(&[n, n], DType::F32, &d, &mut g).unwrap();
            let b = Tensor::randn_with(&[n, n], DType::F32, &d, &mut g).unwrap();
            // Best of 5 runs of at least 3 products (~0.25 s per run at 2048): single products
            // on a shared 2-core VM vary by ±20 %.
            let iters = (4_000_000_000 / (2 * n * n * n)).clamp(3, 4000);
            let t = best_of(5, iters, || {
                std::hint::black_box(a.matmul(&b).unwrap());
            });
            println!("matmul {n} {:.1}", 2.0 * (n * n * n) as f64 / t / 1e9);
        }
    }
    if want("bmm") {
        // Attention's products at batch 32 × 4 heads, head width 64, sequence 128.
        // `FERRITE_BENCH_SEQ=S` changes the sequence length (B·H and the head width stay).
        let s: usize = std::env::var("FERRITE_BENCH_SEQ").ok().and_then(|v| v.parse().ok()).unwrap_or(128);
        let (bh, dh) = (128usize, 64usize);
        let q = Tensor::randn_with(&[bh, s, dh], DType::F32, &d, &mut g).unwrap();
        let k = Tensor::randn_with(&[bh, s, dh], DType::F32, &d, &mut g).unwrap();
        let p = Tensor::randn_with(&[bh, s, s], DType::F32, &d, &mut g).unwrap();
        let kt = k.transpose(-2, -1).unwrap();
        let flops = 2.0 * (bh * s * s * dh) as f64;
        // About the work of 20 products at S = 128, whatever S.
        let iters = (20 * 128 * 128 / (s * s)).clamp(2, 80);
        let t = best_of(5, iters, || {
            std::hint::black_box(q.matmul(&kt).unwrap());
        });
        println!("bmm_qk {s} {:.1}", flops / t / 1e9);
        let t = best_of(5, iters, || {
            std::hint::black_box(p.matmul(&k).unwrap());
        });
        println!("bmm_pv {s} {:.1}", flops / t / 1e9);
    }
    if want("chain") {
        for n in [1usize << 20, 1 << 24] {
            let x = Tensor::randn_with(&[n], DType::F32, &d, &mut g).unwrap();
            let y = Tensor::randn_with(&[n], DType::F32, &d, &mut g).unwrap();
            let iters = if n > 1 << 22 { 5 } else { 50 };
            // ((x * y + x).relu() * 0.5).exp()
            let t = best_of(3, iters, || {
                let z = x.mul(&y).unwrap().add(&x).unwrap().relu().unwrap().mul_scalar(0.5).unwrap().exp().unwrap();
                std::hint::black_box(z);
            });
            println!("chain {n} {:.3}", t * 1e3);
        }
    }
    // `rows` selects every row workload; `rows:softmax_bwd` (etc.) one of them, for a profile.
    let row =
        |name: &str| filter.is_empty() || filter.iter().any(|f| f == "rows" || f.strip_prefix("rows:") == Some(name));
    if filter.is_empty() || filter.iter().any(|f| f.starts_with("rows")) {
        // `FERRITE_BENCH_ROWS=ROWSxCOLS` changes the shape (default 4096x256).
        let (rows, cols) = std::env::var("FERRITE_BENCH_ROWS")
            .ok()
            .and_then(|v| {
                let (r, c) = v.split_once('x')?;
                Some((r.parse::<usize>().ok()?, c.parse::<usize>().ok()?))
            })
            .unwrap_or((4096, 256));
        let x = Tensor::randn_with(&[rows, cols], DType::F32, &d, &mut g).unwrap();
        let w = Tensor::randn_with(&[cols], DType::F32, &d, &mut g).unwrap();
        let b = Tensor::randn_with(&[cols], DType::F32, &d, &mut g).unwrap();
        if row("softmax") {
            let t = best_of(5, 50, || {
                std::hint::black_box(x.softmax(-1).unwrap());
            });
            println!("softmax {rows} {:.3}", t * 1e3);
        }
        if row("layer_norm") {
            let t = best_of(5, 50, || {
                std::hint::black_box(
                    ferrite_tensor::functional::layer_norm(&x, &[cols], Some(&w), Some(&b), 1e-5).unwrap(),
                );
            });
            println!("layer_norm {rows} {:.3}", t * 1e3);
        }
        if row("sum_rows") {
            let t = best_of(5, 50, || {
                std::hint::black_box(x.sum_dims(&[0], false).unwrap());
            });
            println!("sum_rows {rows} {:.3}", t * 1e3);
        }
        // Backward passes: the graph is kept and replayed with a fixed output gradient; the
        // input's (and norm parameters') gradients are cleared each time, as in a training step.
        let gy = Tensor::randn_with(&[rows, cols], DType::F32, &d, &mut g).unwrap();
        let xg = x.detach().requires_grad_(true).unwrap();
        if row("softmax_bwd") {
            let y = xg.softmax(-1).unwrap();
            let t = best_of(5, 50, || {
                y.backward_with(&gy, true).unwrap();
                xg.set_grad(None).unwrap();
            });
            println!("softmax_bwd {rows} {:.3}", t * 1e3);
        }
        if row("layer_norm_bwd") {
            let (wg, bg) = (w.detach().requires_grad_(true).unwrap(), b.detach().requires_grad_(true).unwrap());
            let y = ferrite_tensor::functional::layer_norm(&xg, &[cols], Some(&wg), Some(&bg), 1e-5).unwrap();
            let t = best_of(5, 50, || {
                y.backward_with(&gy, true).unwrap();
                for p in [&xg, &wg, &bg] {
                    p.set_grad(None).unwrap();
                }
            });
            println!("layer_norm_bwd {rows} {:.3}", t * 1e3);
        }
    }
    if want("tiny_add") {
        let a = Tensor::randn_with(&[4], DType::F32, &d, &mut g).unwrap();
        let b = Tensor::randn_with(&[4], DType::F32, &d, &mut g).unwrap();
        let iters: usize = std::env::var("TINY_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000);
        let t = best_of(5, iters, || {
            std::hint::black_box(a.add(&b).unwrap());
        });
        println!("tiny_add {:.0}", t * 1e9);
    }
}
