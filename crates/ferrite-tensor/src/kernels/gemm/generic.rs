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
        // apart and may each miss the cache. Prefetching them now overlaps those misses with it:
        // one prefetch per 64-byte step of a row's `2·LANES` values and one at its last value,
        // so every cache line the row touches is fetched however it is aligned (AVX2: offsets
        // 0 and 15; AVX-512: 0, 16 and 31; a constant trip count, unrolled).
        for i in 0..mr {
            let row = i * ldc;
            let mut off = 0;
            while off < 2 * l - 1 {
                V::prefetch(c.wrapping_add(row + off));
                off += 16;
            }
            V::prefetch(c.wrapping_add(row + 2 * l - 1));
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

/// An instruction set's in-register transposition (`MicroKernel::transpose`), which the panel
/// packings below take as a parameter: `dst[p*dst_stride + l] = src[l*stride + p]`.
pub(super) type Transpose = unsafe fn(*const f32, isize, usize, usize, *mut f32, usize);

/// Pack rows `i0..i0+mr` (mr ≤ MR), depth `p0..p0+kc` of A as `[p][i]` with `MR` values per
/// step (rows past `mr` are zero). Row-major A (the usual case) goes through `transpose`, a
/// block of `MR` rows at a time; other layouts take [`pack_a_strided`].
///
/// # Safety
/// Reads A inside the given block; `dst` holds `kc * MR` values; `transpose` takes `MR` lines
/// and the CPU supports its instruction set.
#[inline(always)]
pub(super) unsafe fn pack_a_panel<const MR: usize>(
    a: MatPtr,
    i0: usize,
    mr: usize,
    p0: usize,
    kc: usize,
    dst: *mut f32,
    transpose: Transpose,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if a.cs == 1 && a.rs != 1 && mr == MR {
            let base = a.ptr.offset(i0 as isize * a.rs + p0 as isize);
            return transpose(base, a.rs, MR, kc, dst, MR);
        }
        pack_a_strided::<MR>(a, i0, mr, p0, kc, dst)
    }
}

/// Pack depth `p0..p0+kc`, columns `j0..j0+nr` (nr ≤ NR) of B as `[p][j]` with `NR` values per
/// step (columns past `nr` are zero). B = Wᵀ of a row-major W (`x @ W.T`) goes through
/// `transpose`, half a panel (one vector of columns) at a time; other layouts take
/// [`pack_b_strided`].
///
/// # Safety
/// Reads B inside the given block; `dst` holds `kc * NR` values; `transpose` takes `NR / 2`
/// lines and the CPU supports its instruction set.
#[inline(always)]
pub(super) unsafe fn pack_b_panel<const NR: usize>(
    b: MatPtr,
    p0: usize,
    kc: usize,
    j0: usize,
    nr: usize,
    dst: *mut f32,
    transpose: Transpose,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if b.rs == 1 && b.cs != 1 && nr == NR {
            let half = NR / 2;
            let base = b.ptr.offset(p0 as isize + j0 as isize * b.cs);
            transpose(base, b.cs, half, kc, dst, NR);
            transpose(base.offset(half as isize * b.cs), b.cs, half, kc, dst.add(half), NR);
            return;
        }
        pack_b_strided::<NR>(b, p0, kc, j0, nr, dst)
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

/// Defines the [`MicroKernel`](super::MicroKernel) of one SIMD instruction set: one body for
/// AVX2 and AVX-512, with what differs as parameters — the vector type `$V` (its lanes set the
/// tile width, two vectors), the `#[target_feature]` list, the register-tile rows `MR` and the
/// blocking, the smaller row counts edge tiles are compiled for, the row counts of the unpacked
/// small-product tile, and the instruction set's in-register transposition.
///
/// Every kernel it defines is a generic function of this file instantiated inside a
/// `#[target_feature(enable = $features)]` function (`packed`, `small`, `pack_a_panel`,
/// `pack_b_panel` in the calling module), where the [`Vector`] methods inline to single
/// instructions; the trait methods only forward to them. It also defines the calling module's
/// `MR` and `NR` constants, which its transposition may use.
macro_rules! simd_micro_kernel {
    (
        $(#[$attr:meta])*
        $name:ident {
            vector: $V:ty,
            features: $features:literal,
            mr: $mr:literal,
            mc: $mc:expr,
            nc: $nc:expr,
            edge_rows: [$($edge:literal),*],
            small_rows: [$($small:literal),+],
            transpose: $transpose:path $(,)?
        }
    ) => {
        /// Rows of the register tile.
        const MR: usize = $mr;
        /// Columns of the register tile (two vectors).
        const NR: usize = 2 * <$V as super::vector::Vector>::LANES;
        // A's packing transposes the tile's MR rows in one call of the LANES-line transposition.
        const _: () = assert!(MR <= <$V as super::vector::Vector>::LANES, "MR rows must fit one transposition");

        $(#[$attr])*
        pub(crate) struct $name;

        impl super::MicroKernel for $name {
            const MR: usize = MR;
            const NR: usize = NR;
            const KC: usize = 256;
            const MC: usize = $mc;
            const NC: usize = $nc;
            const SMALL_MR: usize = [$($small),+][[$($small),+].len() - 1];

            #[inline]
            unsafe fn pack_a(a: super::MatPtr, i0: usize, mr: usize, p0: usize, kc: usize, dst: *mut f32) {
                // SAFETY: forwarded (the trait's contract includes the CPU check).
                unsafe { pack_a_panel(a, i0, mr, p0, kc, dst) }
            }

            #[inline]
            unsafe fn pack_b(b: super::MatPtr, p0: usize, kc: usize, j0: usize, nr: usize, dst: *mut f32) {
                // SAFETY: forwarded.
                unsafe { pack_b_panel(b, p0, kc, j0, nr, dst) }
            }

            #[inline]
            unsafe fn tile(
                kc: usize,
                a: *const f32,
                b: *const f32,
                c: *mut f32,
                ldc: usize,
                mr: usize,
                nr: usize,
                acc: bool,
            ) {
                // Edge row tiles run with as few accumulator rows as they need (on AVX2 a
                // 2-row remainder costs a third of a full 6-row tile, not a full one).
                // SAFETY: forwarded; `mr <= M` for the `M` each call is compiled for.
                unsafe {
                    $(
                        if mr <= $edge {
                            return packed::<$edge>(kc, a, b, c, ldc, mr, nr, acc);
                        }
                    )*
                    packed::<MR>(kc, a, b, c, ldc, mr, nr, acc)
                }
            }

            #[inline]
            unsafe fn small_tile(
                k: usize,
                a: super::MatPtr,
                b: *const f32,
                ldb: isize,
                c: *mut f32,
                ldc: usize,
                mr: usize,
                nr: usize,
            ) {
                // SAFETY: forwarded.
                unsafe {
                    super::generic::with_rows!(mr, [$($small),+], M => if nr <= <$V as super::vector::Vector>::LANES {
                        small::<M, 1>(k, a, b, ldb, c, ldc, nr)
                    } else {
                        small::<M, 2>(k, a, b, ldb, c, ldc, nr)
                    })
                }
            }
        }

        /// [`generic::packed_tile`](super::generic::packed_tile) compiled for this instruction set.
        ///
        /// # Safety
        /// As [`MicroKernel::tile`](super::MicroKernel::tile), with `mr <= M`.
        #[target_feature(enable = $features)]
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
            // SAFETY: forwarded; the instruction set is enabled here.
            unsafe { super::generic::packed_tile::<$V, M, MR>(kc, a, b, c, ldc, mr, nr, accumulate) }
        }

        /// [`generic::small_tile`](super::generic::small_tile) compiled for this instruction set.
        ///
        /// # Safety
        /// As [`MicroKernel::small_tile`](super::MicroKernel::small_tile) with `mr = M`,
        /// `nr <= NV·LANES`.
        #[target_feature(enable = $features)]
        unsafe fn small<const M: usize, const NV: usize>(
            k: usize,
            a: super::MatPtr,
            b: *const f32,
            ldb: isize,
            c: *mut f32,
            ldc: usize,
            nr: usize,
        ) {
            // SAFETY: forwarded; the instruction set is enabled here.
            unsafe { super::generic::small_tile::<$V, M, NV>(k, a, b, ldb, c, ldc, nr) }
        }

        /// [`generic::pack_a_panel`](super::generic::pack_a_panel) compiled for this
        /// instruction set (the copies move whole vectors), with its transposition.
        ///
        /// # Safety
        /// As [`MicroKernel::pack_a`](super::MicroKernel::pack_a).
        #[target_feature(enable = $features)]
        unsafe fn pack_a_panel(a: super::MatPtr, i0: usize, mr: usize, p0: usize, kc: usize, dst: *mut f32) {
            // SAFETY: forwarded; `$transpose` takes LANES >= MR lines (asserted above).
            unsafe { super::generic::pack_a_panel::<MR>(a, i0, mr, p0, kc, dst, $transpose) }
        }

        /// [`generic::pack_b_panel`](super::generic::pack_b_panel) compiled for this
        /// instruction set, with its transposition.
        ///
        /// # Safety
        /// As [`MicroKernel::pack_b`](super::MicroKernel::pack_b).
        #[target_feature(enable = $features)]
        unsafe fn pack_b_panel(b: super::MatPtr, p0: usize, kc: usize, j0: usize, nr: usize, dst: *mut f32) {
            // SAFETY: forwarded; `$transpose` takes LANES = NR / 2 lines.
            unsafe { super::generic::pack_b_panel::<NR>(b, p0, kc, j0, nr, dst, $transpose) }
        }
    };
}
pub(super) use simd_micro_kernel;
