//! f32 matrix product for AVX-512 CPUs: a packed, cache-blocked GEMM (the BLIS loop nest) around
//! a 14×32 register-tile micro-kernel.
//!
//! Why our own: measured on the target machine class (see BENCHMARKS.md), the `faer` and `gemm`
//! crates reach 55–70 % of PyTorch's f32 matmul throughput, below the 0.8× goal. The gap is the
//! micro-kernel and blocking, not the maths, so this module keeps it small: one micro-kernel, one
//! blocking scheme, packing that accepts any strides (transposed operands need no copy), and a
//! two-level split across threads that shares the packed B panel. Everything else (f64, small
//! products, CPUs without AVX-512) stays with `faer`.
//!
//! Workspace: packed panels (at most `KC × NC` of B and `MC × KC` of A per thread, about
//! 5 MiB) are reused thread-local scratch, like faer's and MKL's internal workspaces; they are
//! not tensor data and are not drawn from the device allocator.

use std::cell::RefCell;

use crate::kernels::strided::SendPtr;

/// Rows of the register tile.
pub(crate) const MR: usize = 14;
/// Columns of the register tile (two 16-lane vectors).
pub(crate) const NR: usize = 32;
/// Depth of one packed block: a `KC × NR` panel of B (32 KiB) stays in L1.
const KC: usize = 256;
/// Rows of A packed at once: `MC × KC` (≈ 0.9 MiB) stays in L2.
const MC: usize = MR * 64;
/// Columns of B packed at once.
const NC: usize = NR * 128;

/// Whether [`sgemm`] can run on this CPU.
pub(crate) fn available() -> bool {
    crate::kernels::simd::simd_level() == "avx512"
}

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

thread_local! {
    static PACK_A: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static PACK_B: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `c[m×n] = a[m×k] · b[k×n]`, `c` row-major contiguous with row stride `ldc`.
///
/// # Safety
/// `a` and `b` must describe initialised matrices of the given sizes, `c` must be valid for
/// writes of `m` rows of `n` elements at stride `ldc` and must not overlap `a` or `b`, and the
/// CPU must support AVX-512F ([`available`]).
pub(crate) unsafe fn sgemm(m: usize, n: usize, k: usize, a: MatPtr, b: MatPtr, c: *mut f32, ldc: usize, threads: usize) {
    if m == 0 || n == 0 {
        return;
    }
    let threads = threads.max(1);
    let cptr = SendPtr(c);
    let mut packed_b = PACK_B.with(|p| std::mem::take(&mut *p.borrow_mut()));
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        let panels = nc.div_ceil(NR);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            let accumulate = pc > 0;
            // Pack B[pc.., jc..] once, shared by all threads (they split the panels).
            packed_b.resize(panels * NR * kc, 0.0);
            let bp = SendPtr(packed_b.as_mut_ptr());
            let pack_b_range = |p0: usize, p1: usize| {
                let bp = bp;
                for p in p0..p1 {
                    // SAFETY: panel p of the buffer sized for `panels` panels; panels are
                    // disjoint between tasks; reads stay inside B (caller's contract).
                    unsafe { pack_b_panel(b, pc, kc, jc + p * NR, NR.min(nc - p * NR), bp.0.add(p * NR * kc)) };
                }
            };
            if threads > 1 && panels > 1 && kc * nc >= 16 * 1024 {
                let half = panels / 2;
                rayon::join(|| pack_b_range(0, half), || pack_b_range(half, panels));
            } else {
                pack_b_range(0, panels);
            }
            // One task per thread: split C's rows (whole register tiles) when there are enough,
            // else its columns (whole panels).
            let work = |r0: usize, r1: usize, q0: usize, q1: usize| {
                let (bp, cptr) = (bp, cptr);
                PACK_A.with(|pa| {
                    let mut pa = pa.borrow_mut();
                    for ic in (r0..r1).step_by(MC) {
                        let mc = MC.min(r1 - ic);
                        let apanels = mc.div_ceil(MR);
                        pa.resize(apanels * MR * kc, 0.0);
                        for ip in 0..apanels {
                            // SAFETY: panel ip of the thread-local buffer; reads inside A.
                            unsafe { pack_a_panel(a, ic + ip * MR, MR.min(mc - ip * MR), pc, kc, pa.as_mut_ptr().add(ip * MR * kc)) };
                        }
                        for jp in q0..q1 {
                            let nr = NR.min(nc - jp * NR);
                            for ip in 0..apanels {
                                let mr = MR.min(mc - ip * MR);
                                // SAFETY: packed panels hold kc×MR and kc×NR values; the C tile
                                // (rows ic+ip*MR.., cols jc+jp*NR..) belongs to this task only.
                                unsafe {
                                    kernel_14x32(
                                        kc,
                                        pa.as_ptr().add(ip * MR * kc),
                                        bp.0.add(jp * NR * kc),
                                        cptr.0.add((ic + ip * MR) * ldc + jc + jp * NR),
                                        ldc,
                                        mr,
                                        nr,
                                        accumulate,
                                    )
                                };
                            }
                        }
                    }
                });
            };
            let tiles = m.div_ceil(MR);
            let flops = m * nc * kc;
            let parts = if flops < 64 * 64 * 64 { 1 } else { threads };
            if parts > 1 && tiles >= parts {
                let per = tiles.div_ceil(parts) * MR;
                rayon::scope(|s| {
                    for t in 0..parts {
                        let (r0, r1) = (t * per, ((t + 1) * per).min(m));
                        if r0 < r1 {
                            let work = &work;
                            s.spawn(move |_| work(r0, r1, 0, panels));
                        }
                    }
                });
            } else if parts > 1 && panels > 1 {
                let per = panels.div_ceil(parts.min(panels));
                rayon::scope(|s| {
                    for q0 in (0..panels).step_by(per) {
                        let q1 = (q0 + per).min(panels);
                        let work = &work;
                        s.spawn(move |_| work(0, m, q0, q1));
                    }
                });
            } else {
                work(0, m, 0, panels);
            }
        }
        if k == 0 {
            for i in 0..m {
                // SAFETY: row i of C, columns jc..jc+nc.
                unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc + jc), nc).fill(0.0) };
            }
        }
    }
    PACK_B.with(|p| *p.borrow_mut() = packed_b);
}

/// Pack rows `i0..i0+mr` (mr ≤ MR), depth `p0..p0+kc` of A as `[p][i]` with MR values per p
/// (rows past `mr` are zero).
///
/// # Safety
/// Reads A inside the given block; `dst` holds `kc * MR` values.
unsafe fn pack_a_panel(a: MatPtr, i0: usize, mr: usize, p0: usize, kc: usize, dst: *mut f32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if mr < MR {
            std::slice::from_raw_parts_mut(dst, kc * MR).fill(0.0);
        }
        for i in 0..mr {
            let row = a.ptr.offset((i0 + i) as isize * a.rs + p0 as isize * a.cs);
            for p in 0..kc {
                *dst.add(p * MR + i) = *row.offset(p as isize * a.cs);
            }
        }
    }
}

/// Pack depth `p0..p0+kc`, columns `j0..j0+nr` (nr ≤ NR) of B as `[p][j]` with NR values per p
/// (columns past `nr` are zero).
///
/// # Safety
/// Reads B inside the given block; `dst` holds `kc * NR` values.
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

/// `C[mr×nr] (+)= Apanel[kc×MR]ᵀ · Bpanel[kc×NR]` with the full 14×32 tile in registers.
///
/// # Safety
/// Panels hold `kc` steps; C is writable for `mr` rows of `nr` values at stride `ldc`; the CPU
/// supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn kernel_14x32(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, mr: usize, nr: usize, accumulate: bool) {
    use std::arch::x86_64::*;
    // SAFETY: pointer arithmetic stays inside the panels and the C tile (caller's contract).
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
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
        if mr == MR && nr == NR {
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

#[cfg(not(target_arch = "x86_64"))]
unsafe fn kernel_14x32(_kc: usize, _a: *const f32, _b: *const f32, _c: *mut f32, _ldc: usize, _mr: usize, _nr: usize, _accumulate: bool) {
    unreachable!("sgemm is only called when available() is true, which needs x86-64 AVX-512")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f64> {
        let mut c = vec![0f64; m * n];
        for i in 0..m {
            for p in 0..k {
                for j in 0..n {
                    c[i * n + j] += a[i * k + p] as f64 * b[p * n + j] as f64;
                }
            }
        }
        c
    }

    #[test]
    fn matches_reference_on_ragged_and_transposed_shapes() {
        if !available() {
            eprintln!("SKIPPED: no AVX-512 on this CPU (faer serves f32 matmul here)");
            return;
        }
        for &(m, n, k) in &[(1, 1, 1), (14, 32, 7), (15, 33, 300), (37, 70, 513), (100, 5, 9), (3, 200, 0)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 7.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 5.0).collect();
            let want = reference(m, n, k, &a, &b);
            for threads in [1, 2, 3] {
                let mut c = vec![f32::NAN; m * n];
                let am = MatPtr { ptr: a.as_ptr(), rs: k as isize, cs: 1 };
                let bm = MatPtr { ptr: b.as_ptr(), rs: n as isize, cs: 1 };
                // SAFETY: buffers of the stated sizes; CPU checked above.
                unsafe { sgemm(m, n, k, am, bm, c.as_mut_ptr(), n, threads) };
                for (x, y) in c.iter().zip(&want) {
                    assert!((*x as f64 - y).abs() <= 1e-4 * (1.0 + y.abs()), "{m}x{n}x{k}: {x} vs {y}");
                }
                // The same product from transposed storage (column-major A and B).
                let at: Vec<f32> = (0..k * m).map(|idx| a[(idx % m) * k + idx / m]).collect();
                let bt: Vec<f32> = (0..n * k).map(|idx| b[(idx % k) * n + idx / k]).collect();
                let mut c2 = vec![f32::NAN; m * n];
                let am = MatPtr { ptr: at.as_ptr(), rs: 1, cs: m as isize };
                let bm = MatPtr { ptr: bt.as_ptr(), rs: 1, cs: k as isize };
                // SAFETY: as above.
                unsafe { sgemm(m, n, k, am, bm, c2.as_mut_ptr(), n, threads) };
                assert_eq!(c, c2, "{m}x{n}x{k}: strides change nothing");
            }
        }
    }
}
