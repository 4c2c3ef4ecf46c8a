//! Running a kernel's inner loops with the CPU's widest vector instructions.
//!
//! The default build targets baseline x86-64 (SSE2), so auto-vectorised loops would be 4 lanes
//! wide on a machine with AVX-512. [`vectorize`] re-compiles the closure it is given (which must
//! be `#[inline(always)]` all the way down to the loop) inside a function with AVX-512 (or
//! AVX2+FMA) enabled, chosen once at run time from the CPU's feature flags. Kernels stay plain
//! Rust loops over slices — no intrinsics — and still build and run anywhere.

use std::sync::atomic::{AtomicU8, Ordering};

const UNKNOWN: u8 = 0;
const BASELINE: u8 = 1;
const AVX2: u8 = 2;
const AVX512: u8 = 3;

static LEVEL: AtomicU8 = AtomicU8::new(UNKNOWN);

#[cold]
fn detect() -> u8 {
    #[cfg(target_arch = "x86_64")]
    let level = if std::env::var_os("FERRITE_NO_SIMD").is_some() {
        BASELINE
    } else if is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        AVX512
    } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
        AVX2
    } else {
        BASELINE
    };
    #[cfg(not(target_arch = "x86_64"))]
    let level = BASELINE;
    LEVEL.store(level, Ordering::Relaxed);
    level
}

#[inline(always)]
fn level() -> u8 {
    match LEVEL.load(Ordering::Relaxed) {
        UNKNOWN => detect(),
        l => l,
    }
}

/// The instruction set kernels run with (for benchmark reports): `avx512`, `avx2` or `baseline`.
pub fn simd_level() -> &'static str {
    match level() {
        AVX512 => "avx512",
        AVX2 => "avx2",
        _ => "baseline",
    }
}

/// The CPU the kernels run on, for benchmark reports: its model (from `/proc/cpuinfo` on
/// Linux), the vector features the kernels dispatch on (`-name` where absent) and the level
/// they run at, e.g. `AMD EPYC | avx2 fma f16c -avx512f | kernels avx2`.
pub fn cpu_report() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                let (key, value) = l.split_once(':')?;
                matches!(key.trim(), "model name" | "Model" | "Hardware").then(|| value.trim().to_string())
            })
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    #[cfg(target_arch = "x86_64")]
    let features: Vec<String> = [
        ("avx2", is_x86_feature_detected!("avx2")),
        ("fma", is_x86_feature_detected!("fma")),
        ("f16c", is_x86_feature_detected!("f16c")),
        ("avx512f", is_x86_feature_detected!("avx512f")),
        ("avx512bw", is_x86_feature_detected!("avx512bw")),
        ("avx512vl", is_x86_feature_detected!("avx512vl")),
        ("avx512dq", is_x86_feature_detected!("avx512dq")),
    ]
    .iter()
    .map(|&(name, on)| if on { name.to_string() } else { format!("-{name}") })
    .collect();
    #[cfg(not(target_arch = "x86_64"))]
    let features: Vec<String> = Vec::new();
    format!("{model} | {} | kernels {}", features.join(" "), simd_level())
}

/// The lane accumulators of a row loop, handed on unchanged but out of the optimiser's sight.
///
/// Why: a row reduction keeps 16 independent partial sums (`[f32; 16]`) in its loop and then
/// folds them pairwise. With the fold in view, LLVM's SLP vectoriser pairs the lanes for the
/// fold and then runs the *loop* two lanes per instruction (`vmovsd` + `vaddps xmm`) on AVX-512
/// and AVX2 alike — softmax and layer norm at 0.5–0.7× PyTorch on an AVX-512 EPYC (BENCHMARKS.md,
/// "Row kernels at full vector width"). Passing the lanes through this barrier before the fold
/// lets the loop keep one 16-lane (or two 8-lane) vector; the fold then reads them back from
/// the stack. The value and the order of the additions are unchanged.
#[inline(always)]
pub(crate) fn lanes_barrier<L>(lanes: L) -> L {
    std::hint::black_box(lanes)
}

/// The pairwise fold of a row loop's lane accumulators: `lanes[k] = combine(lanes[k], lanes[k +
/// w])` for `w = N/2, N/4, …, 1`, then lane 0 — through [`lanes_barrier`], so the loop that
/// filled the lanes stays at full vector width. One call per accumulator array: folding two
/// arrays in one loop let the SLP vectoriser interleave them into a chain of cross-register
/// shuffles (layer norm backward, BENCHMARKS.md "Layer norm backward").
#[inline(always)]
pub(crate) fn pairwise_fold<A: Copy, const N: usize>(lanes: [A; N], combine: impl Fn(A, A) -> A) -> A {
    let mut lanes = lanes_barrier(lanes);
    let mut width = N;
    while width > 1 {
        width /= 2;
        for k in 0..width {
            lanes[k] = combine(lanes[k], lanes[k + width]);
        }
    }
    lanes[0]
}

/// Run `f` compiled for the best available vector extension. `f` and everything it calls in
/// its hot loop must be `#[inline(always)]` for the loop to be compiled with those features.
#[inline(always)]
pub(crate) fn vectorize<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: the CPU supports every feature the callee enables (checked in `detect`).
        AVX512 => return unsafe { with_avx512(f) },
        // SAFETY: as above.
        AVX2 => return unsafe { with_avx2(f) },
        _ => {}
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,avx,fma,f16c,sse4.1,sse4.2,popcnt,bmi1,bmi2,lzcnt")]
unsafe fn with_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx,fma,f16c,sse4.1,sse4.2,popcnt,bmi1,bmi2,lzcnt")]
unsafe fn with_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}
