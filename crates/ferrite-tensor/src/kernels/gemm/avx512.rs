//! The AVX-512 GEMM: a 14×32 register tile (28 of the 32 vector registers accumulate), packing
//! through in-register 16×16 transposes, and the unpacked small-product tile at 16 lanes.
//!
//! Measured on a 2-core Xeon (see BENCHMARKS.md, "Tensors"): the micro-kernel alone, on panels
//! resident in L1, runs at 189 GFLOP/s on one thread; PyTorch's whole 512² product on one
//! thread reaches 194. Blocking: a `KC × NR` panel of B (32 KiB) stays in L1, an `MC × KC` block
//! of A (≈ 0.45 MiB) in L2.

use std::arch::x86_64::*;

use super::generic::{self, with_rows};
use super::vector::Avx512;
use super::{MatPtr, MicroKernel};

/// Rows of the register tile.
const MR: usize = 14;
/// Columns of the register tile (two 16-lane vectors).
const NR: usize = 32;

/// The AVX-512F instruction set's [`MicroKernel`].
pub(crate) struct Avx512Gemm;

impl MicroKernel for Avx512Gemm {
    const MR: usize = MR;
    const NR: usize = NR;
    const KC: usize = 256;
    const MC: usize = MR * 32;
    const NC: usize = NR * 128;
    const SMALL_MR: usize = 8;
    const TRANSPOSE_LINES: usize = 16;

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
        // The last row tile of a product whose height is not a multiple of 14 runs with 4 or 7
        // rows, so (for example) the 4-row remainder of a 256-row product costs ~2/7 of a full
        // tile instead of a full one.
        // SAFETY: forwarded; `mr <= M` in every arm.
        unsafe {
            match mr {
                0..=4 => kernel::<4>(kc, a, b, c, ldc, mr, nr, acc),
                5..=7 => kernel::<7>(kc, a, b, c, ldc, mr, nr, acc),
                _ => kernel::<MR>(kc, a, b, c, ldc, mr, nr, acc),
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
            with_rows!(mr, [1, 2, 3, 4, 5, 6, 7, 8], M => if nr <= 16 {
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

/// [`generic::small_tile`] compiled for AVX-512.
///
/// # Safety
/// As [`MicroKernel::small_tile`] with `mr = M`, `nr <= 16·NV`.
#[target_feature(enable = "avx512f")]
unsafe fn small<const M: usize, const NV: usize>(
    k: usize,
    a: MatPtr,
    b: *const f32,
    ldb: isize,
    c: *mut f32,
    ldc: usize,
    nr: usize,
) {
    // SAFETY: forwarded; AVX-512F is enabled here.
    unsafe { generic::small_tile::<Avx512, M, NV>(k, a, b, ldb, c, ldc, nr) }
}

/// Pack rows `i0..i0+mr` (mr ≤ MR), depth `p0..p0+kc` of A as `[p][i]` with MR values per p
/// (rows past `mr` are zero).
///
/// Compiled for AVX-512 (like everything `sgemm` calls) so that the copies move 64 bytes at a
/// time: in baseline SSE the B copies alone took 10 % of a 256² product.
///
/// # Safety
/// Reads A inside the given block; `dst` holds `kc * MR` values; the CPU supports AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn pack_a_panel(a: MatPtr, i0: usize, mr: usize, p0: usize, kc: usize, dst: *mut f32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        let base = a.ptr.offset(i0 as isize * a.rs + p0 as isize * a.cs);
        if a.cs == 1 && mr == MR {
            // Row-major A: 16-deep slices of the 14 rows are transposed in registers.
            return transpose_pack(base, a.rs, MR, kc, dst, MR);
        }
        if a.rs == 1 {
            // Column-major A (a transposed operand, as in the weight gradient `dYᵀ @ X`): the
            // rows of one depth step are already contiguous.
            if mr == MR {
                // A fixed-size copy compiles to two vector moves (a memcpy call per step would
                // cost more than the copy).
                for p in 0..kc {
                    let v = (base.offset(p as isize * a.cs) as *const [f32; MR]).read_unaligned();
                    (dst.add(p * MR) as *mut [f32; MR]).write_unaligned(v);
                }
                return;
            }
            for p in 0..kc {
                std::ptr::copy_nonoverlapping(base.offset(p as isize * a.cs), dst.add(p * MR), mr);
                std::slice::from_raw_parts_mut(dst.add(p * MR + mr), MR - mr).fill(0.0);
            }
            return;
        }
        if mr < MR {
            std::slice::from_raw_parts_mut(dst, kc * MR).fill(0.0);
        }
        for i in 0..mr {
            let row = base.offset(i as isize * a.rs);
            for p in 0..kc {
                *dst.add(p * MR + i) = *row.offset(p as isize * a.cs);
            }
        }
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
unsafe fn transpose_pack(src: *const f32, stride: isize, lines: usize, kc: usize, dst: *mut f32, dst_stride: usize) {
    // SAFETY: forwarded from the caller.
    unsafe {
        let full = kc - kc % 16;
        if full > 0 {
            transpose_pack_avx512(src, stride, lines, full, dst, dst_stride);
        }
        for p in full..kc {
            for l in 0..lines {
                *dst.add(p * dst_stride + l) = *src.offset(l as isize * stride + p as isize);
            }
        }
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn transpose_pack_avx512(
    src: *const f32,
    stride: isize,
    lines: usize,
    kc: usize,
    dst: *mut f32,
    dst_stride: usize,
) {
    // SAFETY: loads read `lines` sequences of kc (a multiple of 16) values; the masked stores
    // write `lines` values at dst + p*dst_stride (caller's contract).
    unsafe {
        let mask: __mmask16 = if lines >= 16 { 0xFFFF } else { (1u16 << lines) - 1 };
        let mut p = 0;
        while p < kc {
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
    }
}

/// Pack depth `p0..p0+kc`, columns `j0..j0+nr` (nr ≤ NR) of B as `[p][j]` with NR values per p
/// (columns past `nr` are zero).
///
/// # Safety
/// Reads B inside the given block; `dst` holds `kc * NR` values; the CPU supports AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn pack_b_panel(b: MatPtr, p0: usize, kc: usize, j0: usize, nr: usize, dst: *mut f32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if b.cs == 1 && nr == NR {
            for p in 0..kc {
                let src = b.ptr.offset((p0 + p) as isize * b.rs + j0 as isize);
                std::ptr::copy_nonoverlapping(src, dst.add(p * NR), NR);
            }
            return;
        }
        if b.rs == 1 && nr == NR {
            // B = Wᵀ of a row-major W: each column is contiguous along the depth.
            let base = b.ptr.offset(p0 as isize + j0 as isize * b.cs);
            transpose_pack(base, b.cs, 16, kc, dst, NR);
            transpose_pack(base.offset(16 * b.cs), b.cs, 16, kc, dst.add(16), NR);
            return;
        }
        if nr < NR {
            std::slice::from_raw_parts_mut(dst, kc * NR).fill(0.0);
        }
        for j in 0..nr {
            let col = b.ptr.offset(p0 as isize * b.rs + (j0 + j) as isize * b.cs);
            for p in 0..kc {
                *dst.add(p * NR + j) = *col.offset(p as isize * b.rs);
            }
        }
    }
}

/// `C[mr×nr] (+)= Apanel[kc×MR]ᵀ · Bpanel[kc×NR]` for the first `M` (≥ `mr`) rows of the
/// packed A panel, with the whole `M×32` tile in registers. `M = MR` for full tiles; the last
/// row tile of a product whose height is not a multiple of 14 runs with `M = 4` or `7`, so
/// (for example) the 4-row remainder of a 256-row product costs ~2/7 of a full tile instead
/// of a full one.
///
/// # Safety
/// Panels hold `kc` steps; C is writable for `mr` rows of `nr` values at stride `ldc`; the CPU
/// supports AVX-512F; `mr <= M <= MR`.
#[target_feature(enable = "avx512f")]
unsafe fn kernel<const M: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    mr: usize,
    nr: usize,
    accumulate: bool,
) {
    // SAFETY: pointer arithmetic stays inside the panels and the C tile (caller's contract).
    unsafe {
        // The C tile is read (or written) only after the k loop; its rows sit a row stride
        // apart, so each may miss the cache after the loop. Prefetching them now overlaps
        // those misses with the loop. Prefetches never fault; wrapping_add keeps the address
        // arithmetic defined even for the columns of an edge tile past `nr`.
        for i in 0..mr {
            let row = c.wrapping_add(i * ldc) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(row);
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(64));
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(124));
        }
        let mut acc = [[_mm512_setzero_ps(); 2]; M];
        let (mut ap, mut bp) = (a, b);
        for _ in 0..kc {
            let b0 = _mm512_loadu_ps(bp);
            let b1 = _mm512_loadu_ps(bp.add(16));
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*ap.add(i));
                row[0] = _mm512_fmadd_ps(av, b0, row[0]);
                row[1] = _mm512_fmadd_ps(av, b1, row[1]);
            }
            ap = ap.add(MR);
            bp = bp.add(NR);
        }
        if mr == M && nr == NR {
            for (i, row) in acc.iter().enumerate() {
                let cp = c.add(i * ldc);
                let (mut v0, mut v1) = (row[0], row[1]);
                if accumulate {
                    v0 = _mm512_add_ps(v0, _mm512_loadu_ps(cp));
                    v1 = _mm512_add_ps(v1, _mm512_loadu_ps(cp.add(16)));
                }
                _mm512_storeu_ps(cp, v0);
                _mm512_storeu_ps(cp.add(16), v1);
            }
        } else {
            let mut tile = [0f32; MR * NR];
            for (i, row) in acc.iter().enumerate() {
                _mm512_storeu_ps(tile.as_mut_ptr().add(i * NR), row[0]);
                _mm512_storeu_ps(tile.as_mut_ptr().add(i * NR + 16), row[1]);
            }
            for i in 0..mr {
                for j in 0..nr {
                    let cp = c.add(i * ldc + j);
                    *cp = if accumulate { *cp + tile[i * NR + j] } else { tile[i * NR + j] };
                }
            }
        }
    }
}
