//! The AVX2 + FMA GEMM (AMD Zen 1–4 servers, most laptops, some CI machines): a 6×16 register
//! tile and packing through in-register 8×8 transposes.
//!
//! Why 6×16: AVX2 has 16 vector registers. Twelve accumulators (6 rows × 2 vectors of 8), the
//! two B vectors of a depth step and one broadcast A value fill 15 of them, and twelve
//! independent multiply-add chains cover the FMA latency (4 cycles × 2 units on Zen 3 and
//! Haswell–Skylake) — the BLIS and OpenBLAS choice for these cores. Blocking: a `KC × NR` panel
//! of B (16 KiB) stays in L1 (32 KiB), an `MC × KC` block of A (≈ 0.14 MiB) in L2 (512 KiB);
//! the values were chosen by measurement (BENCHMARKS.md, "Tensors on AVX2").

use std::arch::x86_64::*;

use super::generic::{self, with_rows};
use super::vector::{Avx2, Vector};
use super::{MatPtr, MicroKernel};

/// Rows of the register tile.
const MR: usize = 6;
/// Columns of the register tile (two 8-lane vectors).
const NR: usize = 16;

/// The AVX2 + FMA instruction set's [`MicroKernel`].
pub(crate) struct Avx2Gemm;

impl MicroKernel for Avx2Gemm {
    const MR: usize = MR;
    const NR: usize = NR;
    const KC: usize = 256;
    const MC: usize = MR * 24;
    const NC: usize = NR * 256;
    const SMALL_MR: usize = MR;
    const TRANSPOSE_LINES: usize = 8;

    #[inline]
    unsafe fn pack_a(a: MatPtr, i0: usize, mr: usize, p0: usize, kc: usize, dst: *mut f32) {
        // SAFETY: forwarded (the trait's contract includes the CPU check).
        unsafe { pack_a_panel(a, i0, mr, p0, kc, dst) }
    }

    #[inline]
    unsafe fn pack_b(b: MatPtr, p0: usize, kc: usize, j0: usize, nr: usize, dst: *mut f32) {
        // SAFETY: forwarded.
        unsafe { pack_b_panel(b, p0, kc, j0, nr, dst) }
    }

    #[inline]
    unsafe fn tile(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, mr: usize, nr: usize, acc: bool) {
        // Edge row tiles run with as many accumulator rows as they need (a 2-row remainder
        // costs a third of a full tile, not a full one).
        // SAFETY: forwarded; `mr <= M` in every arm.
        unsafe {
            match mr {
                0..=2 => packed::<2>(kc, a, b, c, ldc, mr, nr, acc),
                3..=4 => packed::<4>(kc, a, b, c, ldc, mr, nr, acc),
                _ => packed::<MR>(kc, a, b, c, ldc, mr, nr, acc),
            }
        }
    }

    #[inline]
    unsafe fn small_tile(
        k: usize,
        a: MatPtr,
        b: *const f32,
        ldb: isize,
        c: *mut f32,
        ldc: usize,
        mr: usize,
        nr: usize,
    ) {
        // SAFETY: forwarded.
        unsafe {
            with_rows!(mr, [1, 2, 3, 4, 5, 6], M => if nr <= 8 {
                small::<M, 1>(k, a, b, ldb, c, ldc, nr)
            } else {
                small::<M, 2>(k, a, b, ldb, c, ldc, nr)
            })
        }
    }

    #[inline]
    unsafe fn transpose(src: *const f32, stride: isize, lines: usize, kc: usize, dst: *mut f32, dst_stride: usize) {
        // SAFETY: forwarded.
        unsafe { transpose_pack(src, stride, lines, kc, dst, dst_stride) }
    }
}

/// [`generic::packed_tile`] compiled for AVX2 + FMA.
///
/// # Safety
/// As [`MicroKernel::tile`], with `mr <= M`.
#[target_feature(enable = "avx2,fma")]
unsafe fn packed<const M: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    mr: usize,
    nr: usize,
    accumulate: bool,
) {
    // SAFETY: forwarded; AVX2 and FMA are enabled here.
    unsafe { generic::packed_tile::<Avx2, M, MR>(kc, a, b, c, ldc, mr, nr, accumulate) }
}

/// [`generic::small_tile`] compiled for AVX2 + FMA.
///
/// # Safety
/// As [`MicroKernel::small_tile`] with `mr = M`, `nr <= 8·NV`.
#[target_feature(enable = "avx2,fma")]
unsafe fn small<const M: usize, const NV: usize>(
    k: usize,
    a: MatPtr,
    b: *const f32,
    ldb: isize,
    c: *mut f32,
    ldc: usize,
    nr: usize,
) {
    // SAFETY: forwarded; AVX2 and FMA are enabled here.
    unsafe { generic::small_tile::<Avx2, M, NV>(k, a, b, ldb, c, ldc, nr) }
}

/// Pack rows `i0..i0+mr` (mr ≤ MR), depth `p0..p0+kc` of A as `[p][i]` with MR values per step
/// (rows past `mr` are zero). Row-major A (the usual case) is transposed 8 steps at a time in
/// registers; other layouts take the strided copies.
///
/// # Safety
/// Reads A inside the given block; `dst` holds `kc * MR` values; the CPU has AVX2.
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_a_panel(a: MatPtr, i0: usize, mr: usize, p0: usize, kc: usize, dst: *mut f32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if a.cs == 1 && a.rs != 1 && mr == MR {
            let base = a.ptr.offset(i0 as isize * a.rs + p0 as isize);
            return transpose_pack(base, a.rs, MR, kc, dst, MR);
        }
        generic::pack_a_strided::<MR>(a, i0, mr, p0, kc, dst)
    }
}

/// Pack depth `p0..p0+kc`, columns `j0..j0+nr` (nr ≤ NR) of B as `[p][j]` with NR values per
/// step (columns past `nr` are zero). Row-major B is copied row by row; B = Wᵀ of a row-major
/// W (`x @ W.T`) is transposed 8 columns at a time in registers.
///
/// # Safety
/// Reads B inside the given block; `dst` holds `kc * NR` values; the CPU has AVX2.
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_b_panel(b: MatPtr, p0: usize, kc: usize, j0: usize, nr: usize, dst: *mut f32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if b.rs == 1 && b.cs != 1 && nr == NR {
            let base = b.ptr.offset(p0 as isize + j0 as isize * b.cs);
            transpose_pack(base, b.cs, 8, kc, dst, NR);
            transpose_pack(base.offset(8 * b.cs), b.cs, 8, kc, dst.add(8), NR);
            return;
        }
        generic::pack_b_strided::<NR>(b, p0, kc, j0, nr, dst)
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
