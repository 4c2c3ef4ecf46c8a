//! The AVX2 + FMA GEMM (AMD Zen 1–4 servers, most laptops, some CI machines): a 6×16 register
//! tile and packing through in-register 8×8 transposes.
//!
//! Why 6×16: AVX2 has 16 vector registers. Twelve accumulators (6 rows × 2 vectors of 8), the
//! two B vectors of a depth step and one broadcast A value fill 15 of them, and twelve
//! independent multiply-add chains cover the FMA latency (4 cycles × 2 units on Zen 3 and
//! Haswell–Skylake) — the BLIS and OpenBLAS choice for these cores. Blocking: a `KC × NR` panel
//! of B (16 KiB) stays in L1 (32 KiB), an `MC × KC` block of A (≈ 0.14 MiB) in L2 (512 KiB);
//! the values were chosen by measurement (BENCHMARKS.md, "Tensors on AVX2").
//!
//! The kernels themselves are the generic ones (`generic.rs`), instantiated for [`Avx2`] by
//! [`simd_micro_kernel!`], the same body as AVX-512's; only the 8×8 transposition is AVX2's own.

use std::arch::x86_64::*;

use super::generic::{self, simd_micro_kernel};
use super::vector::{Avx2, Vector};

simd_micro_kernel! {
    /// The AVX2 + FMA instruction set's [`MicroKernel`](super::MicroKernel).
    Avx2Gemm {
        vector: Avx2,
        features: "avx2,fma",
        mr: 6,
        mc: MR * 24,
        nc: NR * 256,
        edge_rows: [2, 4],
        small_rows: [1, 2, 3, 4, 5, 6],
        transpose: transpose_pack,
    }
}

/// `dst[p*dst_stride + l] = src[l*stride + p]` for `l < lines` (≤ 8), `p < kc`: the
/// transposition both packings need when the operand's contiguous direction is the depth.
/// Scalar, it is one load and one scattered store per value; here each 8×8 block is three
/// shuffle rounds in registers and eight stores of `lines` values.
///
/// # Safety
/// Reads `lines` sequences of `kc` values at `src + l*stride`; `dst` is writable at
/// `p*dst_stride + l` for `p < kc`, `l < lines`; the CPU has AVX2.
#[target_feature(enable = "avx2,fma")]
unsafe fn transpose_pack(src: *const f32, stride: isize, lines: usize, kc: usize, dst: *mut f32, dst_stride: usize) {
    // SAFETY: loads read `lines` sequences of `full <= kc` values; each store writes exactly
    // `lines` values at dst + p*dst_stride (caller's contract); the tail is scalar.
    unsafe {
        let full = kc - kc % 8;
        let mut p = 0;
        while p < full {
            let mut r = [_mm256_setzero_ps(); 8];
            for (l, v) in r.iter_mut().enumerate().take(lines) {
                *v = _mm256_loadu_ps(src.offset(l as isize * stride + p as isize));
            }
            // Pairs of lines interleaved within each 128-bit half.
            let t: [__m256; 8] = std::array::from_fn(|i| {
                let (x, y) = (r[2 * (i / 2)], r[2 * (i / 2) + 1]);
                if i % 2 == 0 { _mm256_unpacklo_ps(x, y) } else { _mm256_unpackhi_ps(x, y) }
            });
            // Quads: s[4h+q] holds column q (low half) and q+4 (high half) of lines 4h..4h+3.
            let s: [__m256; 8] = std::array::from_fn(|i| {
                let (h, q) = (i / 4, i % 4);
                let (x, y) = (t[4 * h + q / 2], t[4 * h + 2 + q / 2]);
                if q % 2 == 0 { _mm256_shuffle_ps::<0x44>(x, y) } else { _mm256_shuffle_ps::<0xEE>(x, y) }
            });
            for q in 0..4 {
                let lo = _mm256_permute2f128_ps::<0x20>(s[q], s[4 + q]);
                let hi = _mm256_permute2f128_ps::<0x31>(s[q], s[4 + q]);
                Avx2::store_first(dst.add((p + q) * dst_stride), lines, lo);
                Avx2::store_first(dst.add((p + q + 4) * dst_stride), lines, hi);
            }
            p += 8;
        }
        generic::transpose_scalar(src.add(full), stride, lines, kc - full, dst.add(full * dst_stride), dst_stride);
    }
}
