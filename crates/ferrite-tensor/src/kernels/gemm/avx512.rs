//! The AVX-512 GEMM: a 14×32 register tile (28 of the 32 vector registers accumulate), packing
//! through in-register 16×16 transposes, and the unpacked small-product tile at 16 lanes.
//!
//! Measured on a 2-core Xeon (see BENCHMARKS.md, "Tensors"): the micro-kernel alone, on panels
//! resident in L1, runs at 189 GFLOP/s on one thread; PyTorch's whole 512² product on one
//! thread reaches 194. Blocking: a `KC × NR` panel of B (32 KiB) stays in L1, an `MC × KC` block
//! of A (≈ 0.45 MiB) in L2.
//!
//! The kernels themselves are the generic ones (`generic.rs`), instantiated for [`Avx512`] by
//! [`simd_micro_kernel!`], the same body as AVX2's; only the 16×16 transposition is AVX-512's own.

use std::arch::x86_64::*;

use super::generic::{self, simd_micro_kernel};
use super::vector::Avx512;

simd_micro_kernel! {
    /// The AVX-512F instruction set's [`MicroKernel`](super::MicroKernel). The last row tile
    /// of a product whose height is not a multiple of 14 runs with 4 or 7 rows, so (for
    /// example) the 4-row remainder of a 256-row product costs ~2/7 of a full tile.
    Avx512Gemm {
        vector: Avx512,
        features: "avx512f",
        mr: 14,
        mc: MR * 32,
        nc: NR * 128,
        edge_rows: [4, 7],
        small_rows: [1, 2, 3, 4, 5, 6, 7, 8],
        transpose: transpose_pack,
    }
}

/// Pack `lines` (≤ 16) strided sequences of `kc` contiguous values, `src + l*stride + p`, as
/// `dst[p*dst_stride + l]`: the transposition both packings need when the operand's
/// contiguous direction is the depth (row-major A; B that is a transposed row-major matrix,
/// as in `x @ W.T`). Scalar, this is one load and one scattered store per value, ~9 % of a
/// 1024² product; here each 16×16 block is eight shuffle rounds in registers.
///
/// # Safety
/// Reads `lines` sequences of `kc` values at `src + l*stride`; `dst` holds
/// `(kc-1)*dst_stride + lines` values; the CPU supports AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn transpose_pack(src: *const f32, stride: isize, lines: usize, kc: usize, dst: *mut f32, dst_stride: usize) {
    // SAFETY: loads read `lines` sequences of `full <= kc` values; the masked stores write
    // `lines` values at dst + p*dst_stride (caller's contract); the tail is scalar.
    unsafe {
        let full = kc - kc % 16;
        let mask: __mmask16 = if lines >= 16 { 0xFFFF } else { (1u16 << lines) - 1 };
        let mut p = 0;
        while p < full {
            let mut r = [_mm512_setzero_ps(); 16];
            for (l, v) in r.iter_mut().enumerate().take(lines) {
                *v = _mm512_loadu_ps(src.offset(l as isize * stride + p as isize));
            }
            // Pairs of lines interleaved (columns 4L+{0,1} and 4L+{2,3} of each 128-bit lane L).
            let mut s1 = [_mm512_setzero_ps(); 16];
            for g in 0..8 {
                s1[2 * g] = _mm512_unpacklo_ps(r[2 * g], r[2 * g + 1]);
                s1[2 * g + 1] = _mm512_unpackhi_ps(r[2 * g], r[2 * g + 1]);
            }
            // Quads: u[4h+q] holds column 4L+q of lines 4h..4h+3 in lane L.
            let mut u = [_mm512_setzero_ps(); 16];
            for h in 0..4 {
                let (alo, ahi) = (_mm512_castps_pd(s1[4 * h]), _mm512_castps_pd(s1[4 * h + 1]));
                let (blo, bhi) = (_mm512_castps_pd(s1[4 * h + 2]), _mm512_castps_pd(s1[4 * h + 3]));
                u[4 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(alo, blo));
                u[4 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(alo, blo));
                u[4 * h + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(ahi, bhi));
                u[4 * h + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(ahi, bhi));
            }
            // Gather lane L of the four quads: column q + 4L for all 16 lines.
            for q in 0..4 {
                let lo01 = _mm512_shuffle_f32x4::<0b10_00_10_00>(u[q], u[4 + q]);
                let hi01 = _mm512_shuffle_f32x4::<0b11_01_11_01>(u[q], u[4 + q]);
                let lo23 = _mm512_shuffle_f32x4::<0b10_00_10_00>(u[8 + q], u[12 + q]);
                let hi23 = _mm512_shuffle_f32x4::<0b11_01_11_01>(u[8 + q], u[12 + q]);
                let cols = [
                    (q, _mm512_shuffle_f32x4::<0b10_00_10_00>(lo01, lo23)),
                    (q + 4, _mm512_shuffle_f32x4::<0b10_00_10_00>(hi01, hi23)),
                    (q + 8, _mm512_shuffle_f32x4::<0b11_01_11_01>(lo01, lo23)),
                    (q + 12, _mm512_shuffle_f32x4::<0b11_01_11_01>(hi01, hi23)),
                ];
                for (col, v) in cols {
                    _mm512_mask_storeu_ps(dst.add((p + col) * dst_stride), mask, v);
                }
            }
            p += 16;
        }
        generic::transpose_scalar(src.add(full), stride, lines, kc - full, dst.add(full * dst_stride), dst_stride);
    }
}
