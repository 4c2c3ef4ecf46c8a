//! The handful of vector operations the GEMM kernels are written in, for each instruction set.
//!
//! Why a trait instead of intrinsics in every kernel: the unpacked small-product kernel and the
//! AVX2 / portable register tiles are the same loop for every vector width; written once over
//! [`Vector`] they are compiled three times (AVX-512's 16 lanes, AVX2's 8, a portable 4-lane
//! array) and a fix or a measurement on one machine family carries to the others. Every method is
//! `#[inline(always)]`: the kernels that use them are instantiated inside `#[target_feature]`
//! functions (see `avx2.rs`, `avx512.rs`), and only after inlining there do the intrinsics
//! compile to single instructions.

/// A vector of `LANES` f32 values and the operations a GEMM kernel needs.
///
/// # Safety (for every method)
/// The CPU supports the instruction set of the implementing type (the caller dispatched on it),
/// and every pointer is valid for the lanes the method reads or writes: `load`/`store` touch
/// `LANES` values, `load_first`/`store_first` exactly `len` (`len <= LANES`), `broadcast` one.
pub(crate) trait Vector: Copy + 'static {
    /// The register type.
    type V: Copy;
    /// f32 values per vector.
    const LANES: usize;
    /// All lanes zero.
    unsafe fn zero() -> Self::V;
    /// Every lane `*p`.
    unsafe fn broadcast(p: *const f32) -> Self::V;
    /// `LANES` values from `p` (unaligned).
    unsafe fn load(p: *const f32) -> Self::V;
    /// The first `len` lanes from `p`, the rest zero; reads nothing past `p + len`.
    unsafe fn load_first(p: *const f32, len: usize) -> Self::V;
    /// Store all lanes at `p` (unaligned).
    unsafe fn store(p: *mut f32, v: Self::V);
    /// Store the first `len` lanes at `p`; writes nothing past `p + len`.
    unsafe fn store_first(p: *mut f32, len: usize, v: Self::V);
    /// `a * b + c` (one rounding where the instruction set has FMA).
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a + b`.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// Hint that the cache line at `p` will be read soon (never faults; may do nothing).
    unsafe fn prefetch(p: *const f32);
}

/// A portable 4-lane vector: plain array arithmetic that the compiler maps onto whatever vector
/// registers the baseline target has (SSE2 on x86-64, NEON on aarch64).
#[derive(Clone, Copy)]
pub(crate) struct Portable;

impl Vector for Portable {
    type V = [f32; 4];
    const LANES: usize = 4;
    #[inline(always)]
    unsafe fn zero() -> [f32; 4] {
        [0.0; 4]
    }
    #[inline(always)]
    unsafe fn broadcast(p: *const f32) -> [f32; 4] {
        // SAFETY: `p` is valid for one read (trait contract).
        [unsafe { *p }; 4]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> [f32; 4] {
        // SAFETY: `p` is valid for 4 reads (trait contract).
        unsafe { (p as *const [f32; 4]).read_unaligned() }
    }
    #[inline(always)]
    unsafe fn load_first(p: *const f32, len: usize) -> [f32; 4] {
        let mut v = [0.0; 4];
        for (i, x) in v.iter_mut().enumerate().take(len) {
            // SAFETY: i < len, and `p` is valid for `len` reads (trait contract).
            *x = unsafe { *p.add(i) };
        }
        v
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: [f32; 4]) {
        // SAFETY: `p` is valid for 4 writes (trait contract).
        unsafe { (p as *mut [f32; 4]).write_unaligned(v) }
    }
    #[inline(always)]
    unsafe fn store_first(p: *mut f32, len: usize, v: [f32; 4]) {
        for (i, x) in v.iter().enumerate().take(len) {
            // SAFETY: i < len, and `p` is valid for `len` writes (trait contract).
            unsafe { *p.add(i) = *x };
        }
    }
    #[inline(always)]
    unsafe fn fmadd(a: [f32; 4], b: [f32; 4], c: [f32; 4]) -> [f32; 4] {
        // Separate multiply and add: without hardware FMA, `mul_add` is a libm call per lane.
        std::array::from_fn(|i| a[i] * b[i] + c[i])
    }
    #[inline(always)]
    unsafe fn add(a: [f32; 4], b: [f32; 4]) -> [f32; 4] {
        std::array::from_fn(|i| a[i] + b[i])
    }
    #[inline(always)]
    unsafe fn prefetch(_p: *const f32) {}
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Vector;

    /// 8 lanes of AVX2 with FMA (`__m256`).
    #[derive(Clone, Copy)]
    pub(crate) struct Avx2;

    /// `-1` in the first 8 entries and `0` in the next 8: the 8 entries starting at `8 - len`
    /// are the mask of the first `len` lanes.
    static MASKS: [i32; 16] = [-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0];

    #[inline(always)]
    unsafe fn mask8(len: usize) -> __m256i {
        // SAFETY: `len <= 8` (trait contract), so the 8 entries from `8 - len` lie inside MASKS;
        // the caller runs with AVX2.
        unsafe { _mm256_loadu_si256(MASKS.as_ptr().add(8 - len) as *const __m256i) }
    }

    impl Vector for Avx2 {
        type V = __m256;
        const LANES: usize = 8;
        #[inline(always)]
        unsafe fn zero() -> __m256 {
            // SAFETY: AVX is available (trait contract).
            unsafe { _mm256_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn broadcast(p: *const f32) -> __m256 {
            // SAFETY: AVX is available; `p` is valid for one read (trait contract).
            unsafe { _mm256_broadcast_ss(&*p) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            // SAFETY: AVX is available; `p` is valid for 8 reads (trait contract).
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_first(p: *const f32, len: usize) -> __m256 {
            // SAFETY: AVX is available; masked-off lanes are neither read nor faulted on, and
            // `p` is valid for `len` reads (trait contract).
            unsafe { _mm256_maskload_ps(p, mask8(len)) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m256) {
            // SAFETY: AVX is available; `p` is valid for 8 writes (trait contract).
            unsafe { _mm256_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn store_first(p: *mut f32, len: usize, v: __m256) {
            // Plain 4-, 2- and 1-lane stores: AMD's masked stores (`vmaskmovps`) are microcoded
            // and cost several times a plain store; these write exactly `len` values.
            // SAFETY: AVX is available; the stores cover exactly p..p+len (trait contract).
            unsafe {
                if len >= 8 {
                    return _mm256_storeu_ps(p, v);
                }
                let (mut q, mut x, mut n) = (p, _mm256_castps256_ps128(v), len);
                if n >= 4 {
                    _mm_storeu_ps(q, x);
                    q = q.add(4);
                    x = _mm256_extractf128_ps::<1>(v);
                    n -= 4;
                }
                if n >= 2 {
                    _mm_store_sd(q as *mut f64, _mm_castps_pd(x));
                    q = q.add(2);
                    x = _mm_movehl_ps(x, x);
                    n -= 2;
                }
                if n == 1 {
                    _mm_store_ss(q, x);
                }
            }
        }
        #[inline(always)]
        unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
            // SAFETY: FMA is available (trait contract).
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn add(a: __m256, b: __m256) -> __m256 {
            // SAFETY: AVX is available (trait contract).
            unsafe { _mm256_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn prefetch(p: *const f32) {
            // SAFETY: a prefetch never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) }
        }
    }

    /// 16 lanes of AVX-512F (`__m512`).
    #[derive(Clone, Copy)]
    pub(crate) struct Avx512;

    #[inline(always)]
    fn mask16(len: usize) -> __mmask16 {
        if len >= 16 { 0xFFFF } else { ((1u32 << len) - 1) as __mmask16 }
    }

    impl Vector for Avx512 {
        type V = __m512;
        const LANES: usize = 16;
        #[inline(always)]
        unsafe fn zero() -> __m512 {
            // SAFETY: AVX-512F is available (trait contract).
            unsafe { _mm512_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn broadcast(p: *const f32) -> __m512 {
            // SAFETY: AVX-512F is available; `p` is valid for one read (trait contract).
            unsafe { _mm512_set1_ps(*p) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m512 {
            // SAFETY: AVX-512F is available; `p` is valid for 16 reads (trait contract).
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_first(p: *const f32, len: usize) -> __m512 {
            // SAFETY: AVX-512F is available; masked-off lanes are neither read nor faulted on.
            unsafe { _mm512_maskz_loadu_ps(mask16(len), p) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m512) {
            // SAFETY: AVX-512F is available; `p` is valid for 16 writes (trait contract).
            unsafe { _mm512_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn store_first(p: *mut f32, len: usize, v: __m512) {
            // SAFETY: AVX-512F is available; only the first `len` lanes are written.
            unsafe { _mm512_mask_storeu_ps(p, mask16(len), v) }
        }
        #[inline(always)]
        unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
            // SAFETY: AVX-512F is available (trait contract).
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn add(a: __m512, b: __m512) -> __m512 {
            // SAFETY: AVX-512F is available (trait contract).
            unsafe { _mm512_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn prefetch(p: *const f32) {
            // SAFETY: a prefetch never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) }
        }
    }
}
