//! f32 matrix product for AVX-512 CPUs: a packed, cache-blocked GEMM (the BLIS loop nest) around
//! a 14×32 register-tile micro-kernel.
//!
//! Why our own: measured on the target machine class (see BENCHMARKS.md), the `faer` and `gemm`
//! crates reach 55–70 % of PyTorch's f32 matmul throughput, below the 0.8× goal. The gap is the
//! micro-kernel and blocking, not the maths, so this module keeps it small: one micro-kernel, one
//! blocking scheme, packing that accepts any strides (transposed operands need no copy; the
//! common row-major and `x @ W.T` layouts pack through in-register 16×16 transposes), and a
//! split across the kernel team (`team.rs`): by row tiles when C is tall, by register tiles
//! over a shared packed A block when it is short. Everything else (f64, products below
//! 32³ multiply-adds, CPUs without AVX-512) stays with `faer`.
//!
//! Workspace: packed panels (at most `KC × NC` of B and `MC × KC` of A per thread, about
//! 4.5 MiB) are reused thread-local scratch, like faer's and MKL's internal workspaces; they are not tensor data and
//! are not drawn from the device allocator.

use std::cell::RefCell;

use crate::kernels::strided::SendPtr;
use crate::kernels::team;

/// Rows of the register tile.
pub(crate) const MR: usize = 14;
/// Columns of the register tile (two 16-lane vectors).
pub(crate) const NR: usize = 32;
/// Depth of one packed block: a `KC × NR` panel of B (32 KiB) stays in L1.
const KC: usize = 256;
/// Rows of A packed at once: `MC × KC` (≈ 0.45 MiB) stays in L2.
const MC: usize = MR * 32;
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

// Packing buffers live with each thread between products (see `with_scratch`: a product
// started while the thread's buffer is in use just allocates its own). Short products share the
// caller's B buffer with the helpers; tall ones give every thread its own B.
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
pub(crate) unsafe fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: MatPtr,
    b: MatPtr,
    c: *mut f32,
    ldc: usize,
    threads: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for i in 0..m {
            // SAFETY: row i of C (caller's contract).
            unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), n).fill(0.0) };
        }
        return;
    }
    // Small products are not worth a hand-off to the team.
    let threads = if m * n * k < PAR_FLOPS { 1 } else { threads.max(1) };
    let cptr = SendPtr(c);
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        let panels = nc.div_ceil(NR);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            let accumulate = pc > 0;
            let pack_b = |bp: SendPtr<f32>, p0: usize, p1: usize| {
                for p in p0..p1 {
                    // SAFETY: panel p of a buffer sized for `panels` panels; ranges are disjoint
                    // between tasks; reads stay inside B (caller's contract).
                    unsafe { pack_b_panel(b, pc, kc, jc + p * NR, NR.min(nc - p * NR), bp.0.add(p * NR * kc)) };
                }
            };
            let tiles = m.div_ceil(MR);
            let tall = threads > 1 && tiles >= TALL_TILES_PER_THREAD * threads;
            let tile = |bp: SendPtr<f32>, ap: SendPtr<f32>, ic: usize, mc: usize, ip: usize, jp: usize| {
                let cptr = cptr; // capture the Sync wrapper, not its raw field
                let (mr, nr) = (MR.min(mc - ip * MR), NR.min(nc - jp * NR));
                // SAFETY: packed panels hold kc×MR and kc×NR values; the C tile (rows
                // ic+ip*MR.., cols jc+jp*NR..) belongs to the calling task only.
                unsafe {
                    let (a, b, c) = (
                        ap.0.add(ip * MR * kc),
                        bp.0.add(jp * NR * kc),
                        cptr.0.add((ic + ip * MR) * ldc + jc + jp * NR),
                    );
                    match mr {
                        0..=4 => kernel::<4>(kc, a, b, c, ldc, mr, nr, accumulate),
                        5..=7 => kernel::<7>(kc, a, b, c, ldc, mr, nr, accumulate),
                        _ => kernel::<MR>(kc, a, b, c, ldc, mr, nr, accumulate),
                    }
                };
            };
            let pack_a = |ap: SendPtr<f32>, ic: usize, mc: usize, i0: usize, i1: usize| {
                for ip in i0..i1 {
                    // SAFETY: panel ip of a buffer sized for the block's panels; reads inside A.
                    unsafe { pack_a_panel(a, ic + ip * MR, MR.min(mc - ip * MR), pc, kc, ap.0.add(ip * MR * kc)) };
                }
            };
            if tall {
                // Tall C: each thread owns a run of whole row tiles, packs its own rows of A and
                // its own copy of the B block, and covers every B panel for them: no hand-off
                // between packing and compute and no cache line written by one core and read by
                // the other (measured at 256²: 131 µs with a shared, jointly packed B, 112 µs
                // like this). The imbalance is at most one tile in eight.
                split(tiles, threads, &|t0, t1| {
                    let (r0, r1) = (t0 * MR, (t1 * MR).min(m));
                    with_scratch(&PACK_B, panels * NR * kc, |bl| {
                        pack_b(bl, 0, panels);
                        for ic in (r0..r1).step_by(MC) {
                            let mc = MC.min(r1 - ic);
                            let apanels = mc.div_ceil(MR);
                            with_scratch(&PACK_A, apanels * MR * kc, |ap| {
                                pack_a(ap, ic, mc, 0, apanels);
                                for jp in 0..panels {
                                    for ip in 0..apanels {
                                        tile(bl, ap, ic, mc, ip, jp);
                                    }
                                }
                            });
                        }
                    });
                });
                continue;
            }
            // Short C: pack B[pc.., jc..] once into the caller's buffer, shared by all threads
            // (they split the panels).
            with_scratch(&PACK_B, panels * NR * kc, |bp| {
                split(panels, threads, &|p0, p1| pack_b(bp, p0, p1));
                for ic in (0..m).step_by(MC) {
                    let mc = MC.min(m - ic);
                    let apanels = mc.div_ceil(MR);
                    with_scratch(&PACK_A, apanels * MR * kc, |ap| {
                        split(apanels, threads, &|i0, i1| pack_a(ap, ic, mc, i0, i1));
                        // Every (B panel, A panel) pair is one register tile. Threads take equal
                        // contiguous runs of tiles in B-panel-major order, so each keeps one B
                        // panel in L1 while the shared A block streams from L2, and no thread has
                        // more than one tile more than another.
                        split(panels * apanels, threads, &|u0, u1| {
                            for u in u0..u1 {
                                tile(bp, ap, ic, mc, u % apanels, u / apanels);
                            }
                        });
                    });
                }
            });
        }
    }
}

/// From this many row tiles per thread on, threads split C by rows (see `sgemm`).
const TALL_TILES_PER_THREAD: usize = 8;

/// Below this many multiply-adds a product runs on the calling thread.
const PAR_FLOPS: usize = 150 * 150 * 150;

/// Run `f` over `0..units` split into at most `threads` equal contiguous ranges on the team.
fn split(units: usize, threads: usize, f: &(dyn Fn(usize, usize) + Sync)) {
    let parts = threads.min(units).max(1);
    if parts == 1 {
        return f(0, units);
    }
    team::run(parts, &|t| f(t * units / parts, (t + 1) * units / parts));
}

/// Run `f` with this thread's packing buffer of at least `len` values (a fresh one if the
/// thread's buffer is already in use further up the stack).
fn with_scratch(cell: &'static std::thread::LocalKey<RefCell<Vec<f32>>>, len: usize, f: impl FnOnce(SendPtr<f32>)) {
    cell.with(|c| match c.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < len {
                buf.resize(len, 0.0);
            }
            f(SendPtr(buf.as_mut_ptr()))
        }
        Err(_) => {
            let mut own = vec![0.0; len];
            f(SendPtr(own.as_mut_ptr()))
        }
    })
}

/// Pack rows `i0..i0+mr` (mr ≤ MR), depth `p0..p0+kc` of A as `[p][i]` with MR values per p
/// (rows past `mr` are zero).
///
/// Compiled for AVX-512 (like everything `sgemm` calls) so that the copies move 64 bytes at a
/// time: in baseline SSE the B copies alone took 10 % of a 256² product.
///
/// # Safety
/// Reads A inside the given block; `dst` holds `kc * MR` values; the CPU supports AVX-512F.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f"))]
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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose_pack_avx512(
    src: *const f32,
    stride: isize,
    lines: usize,
    kc: usize,
    dst: *mut f32,
    dst_stride: usize,
) {
    use std::arch::x86_64::*;
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

#[cfg(not(target_arch = "x86_64"))]
unsafe fn transpose_pack_avx512(
    _src: *const f32,
    _stride: isize,
    _lines: usize,
    _kc: usize,
    _dst: *mut f32,
    _dst_stride: usize,
) {
    unreachable!("sgemm is only called when available() is true, which needs x86-64 AVX-512")
}

/// Pack depth `p0..p0+kc`, columns `j0..j0+nr` (nr ≤ NR) of B as `[p][j]` with NR values per p
/// (columns past `nr` are zero).
///
/// # Safety
/// Reads B inside the given block; `dst` holds `kc * NR` values; the CPU supports AVX-512F.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f"))]
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
#[cfg(target_arch = "x86_64")]
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
    use std::arch::x86_64::*;
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

#[cfg(not(target_arch = "x86_64"))]
unsafe fn kernel<const M: usize>(
    _kc: usize,
    _a: *const f32,
    _b: *const f32,
    _c: *mut f32,
    _ldc: usize,
    _mr: usize,
    _nr: usize,
    _accumulate: bool,
) {
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

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, .. proptest::prelude::ProptestConfig::default() })]
        /// Any shape (including ragged edges in every dimension and depths that are not a
        /// multiple of the 16-wide transpose), either operand transposed, any thread count:
        /// the product matches an f64 reference.
        #[test]
        fn matches_reference_for_any_shape_and_layout(m in 1usize..300, n in 1usize..90, k in 0usize..300,
                                                      ta in proptest::bool::ANY, tb in proptest::bool::ANY, threads in 1usize..4, seed in 0u64..1000) {
            if !available() {
                return Ok(());
            }
            let val = |i: usize| (((i as u64 * 2654435761 + seed * 97) % 1000) as f32 - 500.0) / 250.0;
            let a: Vec<f32> = (0..m * k).map(val).collect();
            let b: Vec<f32> = (0..k * n).map(|i| val(i + 7)).collect();
            let want = reference(m, n, k, &a, &b);
            // Store each operand in the requested layout with the same logical values.
            let (ast, am) = if ta {
                let at: Vec<f32> = (0..k * m).map(|idx| a[(idx % m) * k + idx / m]).collect();
                (at, (1isize, m as isize))
            } else {
                (a.clone(), (k as isize, 1isize))
            };
            let (bst, bm) = if tb {
                let bt: Vec<f32> = (0..n * k).map(|idx| b[(idx % k) * n + idx / k]).collect();
                (bt, (1isize, k as isize))
            } else {
                (b.clone(), (n as isize, 1isize))
            };
            let mut c = vec![f32::NAN; m * n];
            // SAFETY: buffers of the stated sizes and strides; CPU checked above.
            unsafe {
                sgemm(m, n, k, MatPtr { ptr: ast.as_ptr(), rs: am.0, cs: am.1 }, MatPtr { ptr: bst.as_ptr(), rs: bm.0, cs: bm.1 }, c.as_mut_ptr(), n, threads)
            };
            for (idx, (x, y)) in c.iter().zip(&want).enumerate() {
                proptest::prop_assert!((*x as f64 - y).abs() <= 1e-4 * (1.0 + y.abs()), "{m}x{n}x{k} ta={ta} tb={tb} at {idx}: {x} vs {y}");
            }
        }
    }
}
