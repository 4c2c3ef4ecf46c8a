//! The measurement behind the choice of matmul kernel: raw f32 GEMM throughput of the `faer`
//! and `gemm` crates (and of ferrite's `Tensor::matmul`, which adds allocation and dispatch) on
//! square matrices, best of 3, all threads of the rayon pool.
//!
//! `cargo bench -p ferrite-tensor --bench gemm_crates` prints `<kernel> <n> <GFLOP/s>` lines.
//! `GEMM_SIZES=256,1024` picks sizes; `GEMM_CPU_TIME=1 RAYON_NUM_THREADS=1` measures the calling
//! thread's CPU time instead of wall time (for tuning on a busy machine).

use std::time::Instant;

use faer::{Accum, MatMut, MatRef, Par};
use ferrite_tensor::{DType, Device, Generator, Tensor};
use ferrite_test_support::timing::thread_cpu_seconds;

fn best_of(reps: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    let cpu_time = std::env::var_os("GEMM_CPU_TIME").is_some();
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        let c0 = if cpu_time { thread_cpu_seconds() } else { None };
        for _ in 0..iters {
            f();
        }
        let dt = match (c0, thread_cpu_seconds()) {
            (Some(a), Some(b)) if cpu_time => b - a,
            _ => t.elapsed().as_secs_f64(),
        };
        best = best.min(dt / iters as f64);
    }
    best
}

fn main() {
    let threads = rayon::current_num_threads();
    let sizes: Vec<usize> = std::env::var("GEMM_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|v| v.parse().ok()).collect())
        .unwrap_or_else(|| vec![64, 256, 1024, 2048]);
    println!("threads {threads} simd {}", ferrite_tensor::simd_level());
    for &n in &sizes {
        let a: Vec<f32> = (0..n * n).map(|i| ((i * 7 % 13) as f32 - 6.0) / 7.0).collect();
        let b: Vec<f32> = (0..n * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 5.0).collect();
        let mut c = vec![0f32; n * n];
        let iters = (2_000_000_000 / (2 * n * n * n)).clamp(1, 2000);
        let gf = |t: f64| 2.0 * (n * n * n) as f64 / t / 1e9;
        let par = if threads > 1 { Par::rayon(threads) } else { Par::Seq };
        let t = best_of(3, iters, || {
            let am = MatRef::from_row_major_slice(&a, n, n);
            let bm = MatRef::from_row_major_slice(&b, n, n);
            let cm = MatMut::from_row_major_slice_mut(&mut c, n, n);
            faer::linalg::matmul::matmul(cm, Accum::Replace, am, bm, 1.0f32, par);
        });
        println!("faer {n} {:.1}", gf(t));
        let gpar = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
        let t = best_of(3, iters, || {
            // SAFETY: row-major n x n buffers (row stride n, column stride 1), c distinct.
            unsafe {
                gemm::gemm(
                    n,
                    n,
                    n,
                    c.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.as_ptr(),
                    1,
                    n as isize,
                    b.as_ptr(),
                    1,
                    n as isize,
                    0.0f32,
                    1.0f32,
                    false,
                    false,
                    false,
                    gpar,
                );
            }
        });
        println!("gemm {n} {:.1}", gf(t));
        let d = Device::Cpu;
        let mut g = Generator::new(0);
        let ta = Tensor::randn_with(&[n, n], DType::F32, &d, &mut g).unwrap();
        let tb = Tensor::randn_with(&[n, n], DType::F32, &d, &mut g).unwrap();
        let t = best_of(3, iters, || {
            std::hint::black_box(ta.matmul(&tb).unwrap());
        });
        println!("ferrite {n} {:.1}", gf(t));
    }
}
