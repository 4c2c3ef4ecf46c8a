//! The GEMM for CPUs with neither AVX2 nor AVX-512 (and `FERRITE_NO_SIMD=1`): the generic
//! kernels over a portable 4-lane vector, compiled for the baseline target.
//!
//! A 4×8 tile: eight accumulators of four lanes, which baseline x86-64 (16 SSE registers) holds
//! with room for the B and A values of a depth step. No multiply-add is fused here, so results
//! differ from the FMA paths in the last bits (the tests compare every path with a reference
//! at a tolerance, not with each other).

use super::generic::{self, with_rows};
use super::vector::Portable;
use super::{MatPtr, MicroKernel};

/// Rows of the register tile.
const MR: usize = 4;
/// Columns of the register tile (two 4-lane vectors).
const NR: usize = 8;

/// The portable [`MicroKernel`].
pub(crate) struct ScalarGemm;

impl MicroKernel for ScalarGemm {
    const MR: usize = MR;
    const NR: usize = NR;
    const KC: usize = 256;
    const MC: usize = MR * 32;
    const NC: usize = NR * 256;
    const SMALL_MR: usize = MR;

    #[inline]
    unsafe fn pack_a(a: MatPtr, i0: usize, mr: usize, p0: usize, kc: usize, dst: *mut f32) {
        // SAFETY: forwarded.
        unsafe { generic::pack_a_strided::<MR>(a, i0, mr, p0, kc, dst) }
    }

    #[inline]
    unsafe fn pack_b(b: MatPtr, p0: usize, kc: usize, j0: usize, nr: usize, dst: *mut f32) {
        // SAFETY: forwarded.
        unsafe { generic::pack_b_strided::<NR>(b, p0, kc, j0, nr, dst) }
    }

    #[inline]
    unsafe fn tile(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, mr: usize, nr: usize, acc: bool) {
        // SAFETY: forwarded; `mr <= MR`.
        unsafe { generic::packed_tile::<Portable, MR, MR>(kc, a, b, c, ldc, mr, nr, acc) }
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
            with_rows!(mr, [1, 2, 3, 4], M => if nr <= 4 {
                generic::small_tile::<Portable, M, 1>(k, a, b, ldb, c, ldc, nr)
            } else {
                generic::small_tile::<Portable, M, 2>(k, a, b, ldb, c, ldc, nr)
            })
        }
    }
}
