//! The GEMM loops written once over [`Vector`]: the packed register tile, the unpacked
//! small-product tile and the strided packing fallbacks. Each instruction set instantiates them
//! inside its own `#[target_feature]` functions (`avx2.rs`, `avx512.rs`, `scalar.rs`).
//!
//! Register tiles are `M` rows × `NV` vectors of accumulators indexed only by constants (the
//! loops over `M` and `NV` have constant trip counts and unroll), so the whole tile lives in
//! registers; edge rows and columns are handled when storing, never inside the depth loop.

use super::MatPtr;
use super::vector::Vector;

/// `C[mr×nr] (+)= Apanel[kc×MR]ᵀ · Bpanel[kc×2·LANES]` for the first `M` (≥ `mr`) rows of a
/// packed A panel (`MR` values per depth step) and a packed B panel (two vectors per step).
///
/// # Safety
/// The CPU supports `V`'s instruction set; the panels hold `kc` steps; C is writable for `mr`
/// rows of `nr` values at row stride `ldc`; `mr <= M <= MR`, `nr <= 2·LANES`.
#[inline(always)]
pub(super) unsafe fn packed_tile<V: Vector, const M: usize, const MR: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    mr: usize,
    nr: usize,
    accumulate: bool,
) {
    let l = V::LANES;
    // SAFETY: pointer arithmetic stays inside the panels and the C tile (caller's contract);
    // prefetches never fault, and wrapping_add keeps their address arithmetic defined.
    unsafe {
        // The C tile is read or written only after the depth loop; its rows sit a row stride
        // apart and may each miss the cache. Prefetching them now overlaps those misses with it.
        for i in 0..mr {
            V::prefetch(c.wrapping_add(i * ldc));
            V::prefetch(c.wrapping_add(i * ldc + 2 * l - 1));
        }
        let mut acc = [[V::zero(); 2]; M];
        let (mut ap, mut bp) = (a, b);
        for _ in 0..kc {
            let b0 = V::load(bp);
            let b1 = V::load(bp.add(l));
            for (i, row) in acc.iter_mut().enumerate() {
                let av = V::broadcast(ap.add(i));
                row[0] = V::fmadd(av, b0, row[0]);
                row[1] = V::fmadd(av, b1, row[1]);
            }
            ap = ap.add(MR);
            bp = bp.add(2 * l);
        }
        store_tile::<V, M, 2>(&acc, c, ldc, mr, nr, accumulate);
    }
}

/// Write (or add, with `accumulate`) the first `mr` rows and `nr` columns of a register tile to
/// C at row stride `ldc`.
///
/// # Safety
/// As [`packed_tile`]: C is writable for `mr` rows of `nr` values; `mr <= M`, `nr <= NV·LANES`.
#[inline(always)]
pub(super) unsafe fn store_tile<V: Vector, const M: usize, const NV: usize>(
    acc: &[[V::V; NV]; M],
    c: *mut f32,
    ldc: usize,
    mr: usize,
    nr: usize,
    accumulate: bool,
) {
    let l = V::LANES;
    // SAFETY: every access is inside row i < mr, columns < nr of the C tile (caller's contract).
    unsafe {
        if nr == NV * l {
            for (i, row) in acc.iter().enumerate() {
                if i >= mr {
                    break;
                }
                let cp = c.add(i * ldc);
                for (v, &x) in row.iter().enumerate() {
                    let x = if accumulate { V::add(x, V::load(cp.add(v * l))) } else { x };
                    V::store(cp.add(v * l), x);
                }
            }
        } else {
            for (i, row) in acc.iter().enumerate() {
                if i >= mr {
                    break;
                }
                let cp = c.add(i * ldc);
                for (v, &x) in row.iter().enumerate() {
                    let start = v * l;
                    if start >= nr {
                        break;
                    }
                    let len = (nr - start).min(l);
                    let x = if accumulate { V::add(x, V::load_first(cp.add(start), len)) } else { x };
                    V::store_first(cp.add(start), len, x);
                }
            }
        }
    }
}

/// `C[M×nr] = A[M×k] · B[k×nr]` straight from the operands, no packing: A at any strides (one
/// broadcast per row and depth step), B with unit column stride (row stride `ldb`), `NV`
/// vectors of columns (`nr <= NV·LANES`; a partial last vector is loaded with a mask).
///
/// # Safety
/// The CPU supports `V`'s instruction set; A is readable for `M` rows and `k` steps at its
/// strides, B for `k` rows of `nr` values at stride `ldb`; C is writable for `M` rows of `nr`
/// values at stride `ldc`.
#[inline(always)]
pub(super) unsafe fn small_tile<V: Vector, const M: usize, const NV: usize>(
    k: usize,
    a: MatPtr,
    b: *const f32,
    ldb: isize,
    c: *mut f32,
    ldc: usize,
    nr: usize,
) {
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        if nr == NV * V::LANES {
            small_loop::<V, M, NV, true>(k, a, b, ldb, c, ldc, nr)
        } else {
            small_loop::<V, M, NV, false>(k, a, b, ldb, c, ldc, nr)
        }
    }
}

/// [`small_tile`]'s depth loop, with full (`FULL`) or masked loads of B.
///
/// # Safety
/// As [`small_tile`].
#[inline(always)]
unsafe fn small_loop<V: Vector, const M: usize, const NV: usize, const FULL: bool>(
    k: usize,
    a: MatPtr,
    b: *const f32,
    ldb: isize,
    c: *mut f32,
    ldc: usize,
    nr: usize,
) {
    let l = V::LANES;
    // SAFETY: reads stay inside A's M rows and k steps and B's k rows of nr values (masked
    // loads read only the first `len` values of a partial vector); see the caller's contract.
    unsafe {
        let mut acc = [[V::zero(); NV]; M];
        let (mut ap, mut bp) = (a.ptr, b);
        for _ in 0..k {
            let mut bv = [V::zero(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = if FULL {
                    V::load(bp.add(v * l))
                } else {
                    V::load_first(bp.add(v * l), nr.saturating_sub(v * l).min(l))
                };
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let av = V::broadcast(ap.offset(i as isize * a.rs));
                for (x, &bx) in row.iter_mut().zip(&bv) {
                    *x = V::fmadd(av, bx, *x);
                }
            }
            ap = ap.offset(a.cs);
            bp = bp.offset(ldb);
        }
        store_tile::<V, M, NV>(&acc, c, ldc, M, nr, false);
    }
}

/// Pack rows `i0..i0+mr` (mr ≤ MR), depth `p0..p0+kc` of A as `[p][i]` with `MR` values per
/// step (rows past `mr` are zero), for any strides: the fallback when no faster layout applies.
///
/// # Safety
/// Reads A inside the given block; `dst` holds `kc * MR` values.
#[inline(always)]
pub(super) unsafe fn pack_a_strided<const MR: usize>(
    a: MatPtr,
    i0: usize,
    mr: usize,
    p0: usize,
    kc: usize,
    dst: *mut f32,
) {
    // SAFETY: reads inside A's block, writes inside dst's kc*MR values (caller's contract).
    unsafe {
        let base = a.ptr.offset(i0 as isize * a.rs + p0 as isize * a.cs);
        if a.rs == 1 {
            // Column-major A (a transposed operand, as in the weight gradient `dYᵀ @ X`): the
            // rows of one depth step are already contiguous.
            if mr == MR {
                // A fixed-size copy compiles to vector moves (a memcpy call per step would cost
                // more than the copy).
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

/// Pack depth `p0..p0+kc`, columns `j0..j0+nr` (nr ≤ NR) of B as `[p][j]` with `NR` values per
/// step (columns past `nr` are zero), for any strides; row-major full panels are row copies.
///
/// # Safety
/// Reads B inside the given block; `dst` holds `kc * NR` values.
#[inline(always)]
pub(super) unsafe fn pack_b_strided<const NR: usize>(
    b: MatPtr,
    p0: usize,
    kc: usize,
    j0: usize,
    nr: usize,
    dst: *mut f32,
) {
    // SAFETY: reads inside B's block, writes inside dst's kc*NR values (caller's contract).
    unsafe {
        if b.cs == 1 && nr == NR {
            for p in 0..kc {
                let src = b.ptr.offset((p0 + p) as isize * b.rs + j0 as isize);
                let v = (src as *const [f32; NR]).read_unaligned();
                (dst.add(p * NR) as *mut [f32; NR]).write_unaligned(v);
            }
            return;
        }
        if nr < NR {
            std::slice::from_raw_parts_mut(dst, kc * NR).fill(0.0);
        }
        if b.cs == 1 {
            for p in 0..kc {
                let src = b.ptr.offset((p0 + p) as isize * b.rs + j0 as isize);
                std::ptr::copy_nonoverlapping(src, dst.add(p * NR), nr);
            }
            return;
        }
        for j in 0..nr {
            let col = b.ptr.offset(p0 as isize * b.rs + (j0 + j) as isize * b.cs);
            for p in 0..kc {
                *dst.add(p * NR + j) = *col.offset(p as isize * b.rs);
            }
        }
    }
}

/// `dst[p*dst_stride + l] = src[l*stride + p]` for `l < lines`, `p < kc`: the scalar
/// transposition (the instruction sets replace it with in-register block transposes).
///
/// # Safety
/// Reads `lines` sequences of `kc` values at `src + l*stride`; `dst` is writable at
/// `p*dst_stride + l` for every `p < kc`, `l < lines`.
#[inline(always)]
pub(super) unsafe fn transpose_scalar(
    src: *const f32,
    stride: isize,
    lines: usize,
    kc: usize,
    dst: *mut f32,
    dst_stride: usize,
) {
    for p in 0..kc {
        for l in 0..lines {
            // SAFETY: inside both blocks (caller's contract).
            unsafe { *dst.add(p * dst_stride + l) = *src.offset(l as isize * stride + p as isize) };
        }
    }
}

/// Expand `$body` with `$M` bound to the constant equal to `$mr`, which must be one of the
/// listed row counts: register tiles are sized at compile time, the row count of an edge tile is
/// known only at run time.
macro_rules! with_rows {
    ($mr:expr, [$($n:literal),+], $M:ident => $body:expr) => {
        match $mr {
            $($n => {
                const $M: usize = $n;
                $body
            })+
            _ => unreachable!("a register tile has {} rows at most", [$($n),+].len()),
        }
    };
}
pub(super) use with_rows;
