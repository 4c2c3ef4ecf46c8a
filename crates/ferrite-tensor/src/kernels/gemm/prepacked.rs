//! Products with a right-hand side packed once and reused: a recurrent layer multiplies every
//! time step's state by the same `W_hhᵀ` (forward) and `W_hh` (backward), 16 to hundreds of
//! times per scan.
//!
//! Why: profiled on the 2-core AVX2 EPYC (`perf record` of `cargo bench -p ferrite-nn --bench
//! lstm_step`, batch 32, 16 steps; BENCHMARKS.md "LSTM"), packing B was 9–20 % of the step (it
//! re-packed the whole `4H × H` weight, through transposes in forward, for each 32-row product)
//! and the helper thread spun for another ~20 % waiting between the three hand-offs of each depth
//! block (pack B, pack A, tiles). Here B is packed once per scan into every depth block's panels,
//! and a product is one hand-off: each thread owns a run of B panels (columns of C), packs its
//! own copy of A's small block and computes its tiles for every depth block in turn.
//!
//! Values are bit-identical to the packed path of `gemm.rs` ([`super::Strategy::Packed`]): the
//! same panels, the same depth blocks (`KC`-bounded, equal sizes), the same register tiles, and
//! every tile accumulates its depth blocks in the same order — only who computes which tile and
//! when differs, and that is not arithmetic. So results do not depend on the thread count.

use super::{Isa, MatPtr, MicroKernel, PACK_A, Strategy, split, strategy, with_scratch};
use crate::kernels::strided::SendPtr;

/// `B [k × n]` packed into the panels of every depth block, for one instruction set.
pub(crate) struct PackedB {
    isa: Isa,
    k: usize,
    n: usize,
    /// Depth of every block but possibly the last (`k` split into equal blocks of at most KC).
    kc_step: usize,
    /// Panels of `NR` columns (the last one zero-padded).
    panels: usize,
    /// Block `pc` (starting at depth `pc`) holds `panels` panels of `kc × NR` values from
    /// offset `pc · panels · NR`; panel `p` of it starts `p · NR · kc` further.
    data: Vec<f32>,
}

impl PackedB {
    /// The depth of the products this B serves.
    pub(crate) fn k(&self) -> usize {
        self.k
    }

    /// The width of the products this B serves.
    pub(crate) fn n(&self) -> usize {
        self.n
    }
}

/// Whether an `m×k · k×n` product is served by a prepacked B: when `gemm.rs` would take its
/// packed path for it ([`strategy`] names the path from the size alone, never from the thread
/// count, so the choice — and the values — do not depend on threads). One row takes `gemv`.
pub(crate) fn applies(m: usize, n: usize, k: usize) -> bool {
    m >= 2 && matches!(strategy(m, n, k, 1), Strategy::Packed { .. })
}

/// Threads for one prepacked product: the packed path's rule ([`strategy`]). A prepacked product
/// is one hand-off, so smaller ones might pay on two threads too, but on the loaded 2-core
/// machine splitting the 2 M multiply-adds of a hidden-128 step made the step slower (a helper
/// descheduled by other processes holds the caller up), and no quiet machine was available to
/// measure a lower threshold.
pub(crate) fn threads_for(m: usize, n: usize, k: usize, threads: usize) -> usize {
    match strategy(m, n, k, threads) {
        Strategy::Small { threads } | Strategy::Packed { threads } => threads,
    }
}

/// Pack `b` (`k × n`, any strides) for [`sgemm_prepacked`] with `isa`, the panels split over
/// `threads` threads.
///
/// # Safety
/// `b` describes an initialised `k × n` matrix; `isa.supported()`.
pub(crate) unsafe fn pack_b(isa: Isa, k: usize, n: usize, b: MatPtr, threads: usize) -> PackedB {
    // SAFETY: forwarded.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => pack_b_with::<super::avx512::Avx512Gemm>(isa, k, n, b, threads),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => pack_b_with::<super::avx2::Avx2Gemm>(isa, k, n, b, threads),
            _ => pack_b_with::<super::scalar::ScalarGemm>(isa, k, n, b, threads),
        }
    }
}

/// # Safety
/// As [`pack_b`], `K` being `isa`'s kernel.
unsafe fn pack_b_with<K: MicroKernel>(isa: Isa, k: usize, n: usize, b: MatPtr, threads: usize) -> PackedB {
    let nr = K::NR;
    let panels = n.div_ceil(nr);
    let kc_step = if k == 0 { 1 } else { k.div_ceil(k.div_ceil(K::KC)) };
    let mut data = vec![0f32; k * panels * nr];
    let dp = SendPtr(data.as_mut_ptr());
    // Every (depth block, panel) pair is one unit of packing work.
    let blocks = k.div_ceil(kc_step);
    split(blocks * panels, threads, &|u0, u1| {
        let dp = dp; // capture the Sync wrapper, not its raw field
        for u in u0..u1 {
            let (blk, p) = (u / panels, u % panels);
            let pc = blk * kc_step;
            let kc = kc_step.min(k - pc);
            // SAFETY: panel p of block pc lies inside `data` (k·panels·NR values: blocks before
            // pc hold pc·panels·NR); reads stay inside B (caller's contract); units are disjoint.
            unsafe { K::pack_b(b, pc, kc, p * nr, nr.min(n - p * nr), dp.0.add(pc * panels * nr + p * nr * kc)) };
        }
    });
    PackedB { isa, k, n, kc_step, panels, data }
}

/// `c[m×n] = a[m×k] · B` with `B` packed by [`pack_b`], on up to `threads` threads (one hand-off).
///
/// # Safety
/// `a` describes an initialised `m × b.k()` matrix; `c` is writable for `m` rows of `b.n()`
/// values at row stride `ldc` and overlaps neither `a` nor the packed B.
pub(crate) unsafe fn sgemm_prepacked(m: usize, a: MatPtr, b: &PackedB, c: *mut f32, ldc: usize, threads: usize) {
    if m == 0 || b.n == 0 {
        return;
    }
    if b.k == 0 {
        for i in 0..m {
            // SAFETY: row i of C (caller's contract).
            unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), b.n).fill(0.0) };
        }
        return;
    }
    // SAFETY: forwarded; the packing checked the instruction set.
    unsafe {
        match b.isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => run::<super::avx512::Avx512Gemm>(m, a, b, c, ldc, threads),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => run::<super::avx2::Avx2Gemm>(m, a, b, c, ldc, threads),
            _ => run::<super::scalar::ScalarGemm>(m, a, b, c, ldc, threads),
        }
    }
}

/// # Safety
/// As [`sgemm_prepacked`], with `m, k, n > 0` and `K` the kernel `b` was packed for.
unsafe fn run<K: MicroKernel>(m: usize, a: MatPtr, b: &PackedB, c: *mut f32, ldc: usize, threads: usize) {
    let (mr_t, nr_t) = (K::MR, K::NR);
    let (k, n, panels, kc_step) = (b.k, b.n, b.panels, b.kc_step);
    let (bp, cp) = (SendPtr(b.data.as_ptr() as *mut f32), SendPtr(c));
    split(panels, threads, &|p0, p1| {
        let (bp, cp) = (bp, cp); // capture the Sync wrappers, not their raw fields
        for pc in (0..k).step_by(kc_step) {
            let kc = kc_step.min(k - pc);
            let block = pc * panels * nr_t;
            for ic in (0..m).step_by(K::MC) {
                let mc = K::MC.min(m - ic);
                let apanels = mc.div_ceil(mr_t);
                with_scratch(&PACK_A, apanels * mr_t * kc, |ap| {
                    for ip in 0..apanels {
                        // SAFETY: panel ip of a buffer sized for the block's panels; reads
                        // stay inside A (caller's contract).
                        unsafe {
                            K::pack_a(a, ic + ip * mr_t, mr_t.min(mc - ip * mr_t), pc, kc, ap.0.add(ip * mr_t * kc))
                        };
                    }
                    for jp in p0..p1 {
                        for ip in 0..apanels {
                            let (mr, nr) = (mr_t.min(mc - ip * mr_t), nr_t.min(n - jp * nr_t));
                            // SAFETY: the packed panels hold kc×MR and kc×NR values; the C tile
                            // (rows ic+ip·MR.., columns jp·NR..) belongs to this task only (its
                            // own run of panels).
                            unsafe {
                                K::tile(
                                    kc,
                                    ap.0.add(ip * mr_t * kc),
                                    bp.0.add(block + jp * nr_t * kc),
                                    cp.0.add((ic + ip * mr_t) * ldc + jp * nr_t),
                                    ldc,
                                    mr,
                                    nr,
                                    pc > 0,
                                )
                            };
                        }
                    }
                });
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::kernels::gemm::sgemm_with;

    fn val(seed: u64, i: usize) -> f32 {
        ((((i as u64 + 11) * 2654435761 + seed * 97) % 1000) as f32 - 500.0) / 250.0
    }

    /// The prepacked product against the packed path of `sgemm_with`, bit for bit on every
    /// instruction set this CPU runs, whatever the threads (`m >= 2`: one row takes `gemv`).
    fn check(m: usize, n: usize, k: usize, b_transposed: bool, threads: usize) {
        let a: Vec<f32> = (0..m * k).map(|i| val(1, i)).collect();
        let bv: Vec<f32> = (0..k * n).map(|i| val(2, i)).collect();
        // B stored row-major, or as the transpose of a row-major [n, k] (`x @ W.T`).
        let (bs, brs, bcs) = if b_transposed {
            let mut t = vec![0f32; k * n];
            for p in 0..k {
                for j in 0..n {
                    t[j * k + p] = bv[p * n + j];
                }
            }
            (t, 1isize, k as isize)
        } else {
            (bv.clone(), n as isize, 1isize)
        };
        let am = MatPtr { ptr: a.as_ptr(), rs: k as isize, cs: 1 };
        let bm = MatPtr { ptr: bs.as_ptr(), rs: brs, cs: bcs };
        let ldc = n + 3;
        for isa in Isa::ALL.into_iter().filter(|i| i.supported()) {
            let mut want = vec![f32::NAN; m * ldc];
            // SAFETY: the buffers hold the matrices the pointers and strides describe.
            unsafe { sgemm_with(isa, super::Strategy::Packed { threads: 1 }, m, n, k, am, bm, want.as_mut_ptr(), ldc) };
            // SAFETY: as above.
            let packed = unsafe { pack_b(isa, k, n, bm, threads) };
            let mut got = vec![f32::NAN; m * ldc];
            // SAFETY: as above; `got` is a distinct buffer.
            unsafe { sgemm_prepacked(m, am, &packed, got.as_mut_ptr(), ldc, threads) };
            for i in 0..m {
                for j in 0..n {
                    let (g, w) = (got[i * ldc + j], want[i * ldc + j]);
                    assert_eq!(
                        g.to_bits(),
                        w.to_bits(),
                        "{isa:?} m {m} n {n} k {k} threads {threads} at ({i}, {j}): {g} vs {w}"
                    );
                }
                // Nothing written past a row's n values.
                for j in n..ldc {
                    assert!(got[i * ldc + j].is_nan(), "{isa:?} wrote past row {i}");
                }
            }
        }
    }

    #[test]
    fn prepacked_products_equal_the_packed_path_bit_for_bit_on_odd_shapes() {
        // Tails of every tile size, depths over one and several KC blocks, the LSTM's shapes.
        for &(m, n, k) in &[(2, 1, 1), (5, 17, 3), (32, 2048, 512), (7, 33, 600), (65, 130, 257), (32, 512, 128)] {
            for t in [false, true] {
                for threads in [1, 2, 3] {
                    check(m, n, k, t, threads);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn prepacked_products_equal_the_packed_path_bit_for_bit(
            m in 2usize..80, n in 1usize..100, k in 1usize..700, t in any::<bool>(), threads in 1usize..4,
        ) {
            check(m, n, k, t, threads);
        }
    }
}
