//! The contract between the GEMM driver (`gemm.rs`: strategy, blocking, threads) and its
//! per-instruction-set micro-kernels (`avx512.rs`, `avx2.rs`, `scalar.rs`): the strided matrix
//! view they share and the [`MicroKernel`] trait each implements. It is its own file so that the
//! kernels depend on it and the driver depends on the kernels, one direction: with the trait in
//! `gemm.rs`, the driver and its kernels imported each other.

/// A read-only strided matrix: element (i, j) at `ptr + i*rs + j*cs`.
#[derive(Clone, Copy)]
pub(crate) struct MatPtr {
    pub ptr: *const f32,
    pub rs: isize,
    pub cs: isize,
}
// SAFETY: a read-only view of memory the caller keeps alive and unmodified during the product.
unsafe impl Send for MatPtr {}
// SAFETY: as above.
unsafe impl Sync for MatPtr {}

/// One instruction set's building blocks for [`sgemm_with`](super::sgemm_with).
///
/// # Safety (for every method)
/// The CPU supports the instruction set (the dispatcher checked [`Isa::supported`](super::Isa::supported)), and the
/// pointers describe memory as each method states.
pub(crate) trait MicroKernel {
    /// Rows of the packed register tile.
    const MR: usize;
    /// Columns of the register tile (packed and small): two vectors.
    const NR: usize;
    /// Depth of one packed block.
    const KC: usize;
    /// Rows of A packed at once (a multiple of `MR`).
    const MC: usize;
    /// Columns of B packed at once (a multiple of `NR`).
    const NC: usize;
    /// Most rows of a small-product tile.
    const SMALL_MR: usize;
    /// Pack rows `i0..i0+mr` (≤ MR), depth `p0..p0+kc` of A as `[p][i]`, `MR` values per step,
    /// rows past `mr` zero. `dst` holds `kc * MR` values.
    unsafe fn pack_a(a: MatPtr, i0: usize, mr: usize, p0: usize, kc: usize, dst: *mut f32);
    /// Pack depth `p0..p0+kc`, columns `j0..j0+nr` (≤ NR) of B as `[p][j]`, `NR` values per
    /// step, columns past `nr` zero. `dst` holds `kc * NR` values.
    unsafe fn pack_b(b: MatPtr, p0: usize, kc: usize, j0: usize, nr: usize, dst: *mut f32);
    /// `C[mr×nr] (+)= Apanel[kc×MR]ᵀ · Bpanel[kc×NR]` (`+=` when `acc`); C writable for `mr`
    /// rows of `nr` values at stride `ldc`.
    unsafe fn tile(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, mr: usize, nr: usize, acc: bool);
    /// `C[mr×nr] = A[mr×k] · B[k×nr]` from unpacked operands: A at any strides, B with unit
    /// column stride and row stride `ldb`; `1 <= mr <= SMALL_MR`, `nr <= NR`.
    unsafe fn small_tile(k: usize, a: MatPtr, b: *const f32, ldb: isize, c: *mut f32, ldc: usize, mr: usize, nr: usize);
}
