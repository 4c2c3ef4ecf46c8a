//! f32 matrix product: ferrite's own GEMM for AVX-512, AVX2 + FMA and CPUs with neither,
//! chosen at run time from the CPU's features (the same detection as `simd.rs`).
//!
//! Why our own: measured on both machine families (BENCHMARKS.md, "Tensors"), the `faer` and
//! `gemm` crates reach 55–70 % of PyTorch's f32 matmul throughput on AVX-512, and 0.15× (64³) to
//! 0.75× (256³) on AVX2. The gap is the micro-kernels, the blocking and the per-call overhead of
//! small products, not the maths, so this module keeps it small:
//!
//! - **Packed** products ([`Strategy::Packed`]): the BLIS loop nest — B packed in `KC × NC`
//!   blocks, A in `MC × KC` blocks, one register-tile micro-kernel per instruction set
//!   (`avx512.rs` 14×32, `avx2.rs` 6×16, `scalar.rs` 4×8); packing accepts any strides
//!   (transposed operands need no copy; row-major A and `x @ W.T`-style B pack through
//!   in-register transposes). Split across the kernel team (`team.rs`) by row tiles when C is
//!   tall, by register tiles over a shared packed A block when it is short.
//! - **Small** products ([`Strategy::Small`]): below a size chosen by measurement, packing and
//!   the blocking bookkeeping cost more than they save; the small path runs register tiles
//!   straight from A and B (B packed once into `k × NR` panels, from its own strides, only when
//!   its rows are not contiguous), on the calling thread or split over the team by tiles.
//! - **One row** (`m = 1`, `gemm/gemv.rs`): a decoding step's linears; B is read once in place,
//!   not packed (the product is bound by memory bandwidth).
//! - **Prepacked** B (`gemm/prepacked.rs`): a right-hand side packed once for many products (a
//!   recurrent layer's `W_hh` over its time steps), each product one hand-off to the team.
//! - Batches of small products (attention's `[B·H, S, d] × [B·H, d, S]`) are spread over the
//!   team one product per task (`backend/cpu/matmul.rs`), each product on one thread.
//!
//! The kernels are written once over a small vector trait (`vector.rs`, `generic.rs`) and
//! compiled per instruction set inside `#[target_feature]` functions; only AVX-512's tile and
//! the two transposes are instruction-set code. f64 products stay with `faer`, and so does f32
//! off x86-64 (where this module has only its portable kernel, slower than faer's NEON).
//!
//! Workspace: packed panels (at most `KC × NC` of B and `MC × KC` of A per thread, ≤ 4.5 MiB)
//! are reused thread-local scratch, like faer's and MKL's internal workspaces; they are not
//! tensor data and are not drawn from the device allocator.

use std::cell::{Cell, RefCell};

use crate::kernels::strided::SendPtr;
use crate::kernels::team;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod gemv;
mod generic;
mod micro_kernel;
pub(crate) mod prepacked;
mod scalar;
pub(crate) mod vector;

pub(crate) use micro_kernel::{MatPtr, MicroKernel};

/// The instruction sets the GEMM has kernels for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// 16-lane AVX-512F (with the rest of the x86-64-v4 set, as `simd.rs` detects it).
    Avx512,
    /// 8-lane AVX2 with FMA.
    Avx2,
    /// Portable 4-lane code for the baseline target.
    Scalar,
}

impl Isa {
    /// Every instruction set, widest first.
    #[cfg(test)]
    pub(crate) const ALL: [Isa; 3] = [Isa::Avx512, Isa::Avx2, Isa::Scalar];

    /// Whether this CPU can run the kernels of `self` (a CPU that runs AVX-512 runs AVX2 too).
    pub(crate) fn supported(self) -> bool {
        let level = crate::kernels::simd::simd_level();
        match self {
            Isa::Avx512 => cfg!(target_arch = "x86_64") && level == "avx512",
            Isa::Avx2 => cfg!(target_arch = "x86_64") && (level == "avx512" || level == "avx2"),
            Isa::Scalar => true,
        }
    }

    /// The instruction set f32 products use here, or `None` where faer serves them (off x86-64).
    pub(crate) fn best() -> Option<Isa> {
        if !cfg!(target_arch = "x86_64") {
            return None;
        }
        Some(match crate::kernels::simd::simd_level() {
            "avx512" => Isa::Avx512,
            "avx2" => Isa::Avx2,
            _ => Isa::Scalar,
        })
    }
}

/// How one product is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// Register tiles straight from the operands, split over `threads` threads.
    Small { threads: usize },
    /// The packed BLIS loop nest on `threads` threads.
    Packed { threads: usize },
}

impl Strategy {
    /// The same strategy on `threads` threads.
    pub(crate) fn with_threads(self, threads: usize) -> Strategy {
        match self {
            Strategy::Small { .. } => Strategy::Small { threads },
            Strategy::Packed { .. } => Strategy::Packed { threads },
        }
    }
}

/// Up to this many multiply-adds a product takes the small path.
const SMALL_FLOPS: usize = 96 * 96 * 96;
/// Below this many multiply-adds a small product stays on the calling thread.
const SMALL_PAR_FLOPS: usize = 48 * 48 * 48;
/// Below this many multiply-adds a packed product stays on the calling thread.
const PACKED_PAR_FLOPS: usize = 150 * 150 * 150;

/// The measured choice for an `m×k · k×n` product with `threads` threads available.
pub(crate) fn strategy(m: usize, n: usize, k: usize, threads: usize) -> Strategy {
    let flops = m.saturating_mul(n).saturating_mul(k);
    if flops <= SMALL_FLOPS {
        Strategy::Small { threads: if flops < SMALL_PAR_FLOPS { 1 } else { threads.max(1) } }
    } else {
        Strategy::Packed { threads: if flops < PACKED_PAR_FLOPS { 1 } else { threads.max(1) } }
    }
}

/// Largest product (multiply-adds) of a batch spread one per task that still takes the small path
/// when B has a unit stride: attention's `P·V` (`[S, S] × [S, 64]`, S = 128) ran at 62–70
/// GFLOP/s packed and 63–94 small on the 2-core AVX2 machine (same minutes; BENCHMARKS.md), since
/// packing A's 128×128 costs more than it saves for one 64-wide output. A transposed key
/// (`Q·Kᵀ`) is packed into panels by the small path as the packed path would pack it, so it
/// saves the packing of A the same way (issue 32).
const SPREAD_SMALL_FLOPS: usize = 128 * 128 * 128;

/// [`strategy`] for one product of a batch: `spread` says the batch is spread one product per
/// task, `b_packs_fast` that B's rows or columns are contiguous (a unit stride: B read in place,
/// or a transposed key packed through in-register transposes; issue 32 — the packed path
/// would pack the same B *and* A's rows).
///
/// Only depths up to one depth block (`KC` = 256) take this rule: there the small and the
/// packed path run the same multiply-add chain per element from zero, so a batch gives the same
/// bits whether it is spread (several threads) or not (one thread, where `strategy` may pick the
/// packed path).
pub(crate) fn strategy_in_batch(
    m: usize,
    n: usize,
    k: usize,
    threads: usize,
    spread: bool,
    b_packs_fast: bool,
) -> Strategy {
    if spread && b_packs_fast && k <= 256 && m.saturating_mul(n).saturating_mul(k) <= SPREAD_SMALL_FLOPS {
        return Strategy::Small { threads: 1 };
    }
    strategy(m, n, k, threads)
}

/// Whether a batch of `batch` products of `m×k · k×n` is better spread over the team one
/// product per task (each on one thread) than computed one after another, each threaded.
pub(crate) fn spread_over_batch(batch: usize, m: usize, n: usize, k: usize, threads: usize) -> bool {
    if batch < 2 || threads < 2 {
        return false;
    }
    let flops = m.saturating_mul(n).saturating_mul(k);
    // Products too small to split well on their own always spread; large ones spread when the
    // batch divides evenly or is long enough that one product of imbalance does not matter.
    flops < PACKED_PAR_FLOPS || batch.is_multiple_of(threads) || batch >= 4 * threads
}

/// A forced instruction set and strategy for the products the current thread starts (tests).
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(test), allow(dead_code))] // constructed only by tests, read by every product
pub(crate) struct Forced {
    pub isa: Isa,
    /// `None`: the measured choice for each product's size.
    pub strategy: Option<Strategy>,
    /// `None`: the measured choice; `Some(b)`: spread batches over the team or never.
    pub spread: Option<bool>,
}

thread_local! {
    static FORCED: Cell<Option<Forced>> = const { Cell::new(None) };
}

/// Run `f` with every f32 product this thread starts computed as `forced` says (the kernels
/// of each dispatch path can then be tested on any input a `Tensor` can express).
#[cfg(test)]
pub(crate) fn with_forced<R>(forced: Forced, f: impl FnOnce() -> R) -> R {
    struct Reset(Option<Forced>);
    impl Drop for Reset {
        fn drop(&mut self) {
            FORCED.with(|c| c.set(self.0));
        }
    }
    let _reset = Reset(FORCED.with(|c| c.replace(Some(forced))));
    f()
}

/// The forcing set by `with_forced` on this thread, if any.
pub(crate) fn forced() -> Option<Forced> {
    FORCED.with(|c| c.get())
}

// Packing buffers live with each thread between products (see `with_scratch`: a product
// started while the thread's buffer is in use just allocates its own). Short products share the
// caller's B buffer with the helpers; tall ones give every thread its own B.
thread_local! {
    static PACK_A: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static PACK_B: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `c[m×n] = a[m×k] · b[k×n]` with the given instruction set and strategy.
///
/// # Safety
/// `a` and `b` must describe initialised matrices of the given sizes, `c` must be valid for
/// writes of `m` rows of `n` elements at stride `ldc` and must not overlap `a` or `b`, and
/// `isa.supported()`.
pub(crate) unsafe fn sgemm_with(
    isa: Isa,
    strategy: Strategy,
    m: usize,
    n: usize,
    k: usize,
    a: MatPtr,
    b: MatPtr,
    c: *mut f32,
    ldc: usize,
) {
    debug_assert!(isa.supported(), "{isa:?} kernels on a CPU without them");
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
    if m == 1 && gemv::applies(&b) {
        let threads = match strategy {
            Strategy::Small { threads } | Strategy::Packed { threads } => threads,
        };
        // SAFETY: row 0 of A, B and C as the caller's contract describes them (m = 1).
        return unsafe { gemv::sgemv(n, k, a, b, c, threads) };
    }
    // SAFETY: forwarded; the instruction set is supported (caller's contract).
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => run::<avx512::Avx512Gemm>(strategy, m, n, k, a, b, c, ldc),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => run::<avx2::Avx2Gemm>(strategy, m, n, k, a, b, c, ldc),
            Isa::Scalar => run::<scalar::ScalarGemm>(strategy, m, n, k, a, b, c, ldc),
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("{isa:?} is never supported off x86-64"),
        }
    }
}

/// # Safety
/// As [`sgemm_with`], with `m, n, k > 0`.
unsafe fn run<K: MicroKernel>(
    strategy: Strategy,
    m: usize,
    n: usize,
    k: usize,
    a: MatPtr,
    b: MatPtr,
    c: *mut f32,
    ldc: usize,
) {
    // SAFETY: forwarded.
    unsafe {
        match strategy {
            Strategy::Small { threads } => small::<K>(m, n, k, a, b, c, ldc, threads.max(1)),
            Strategy::Packed { threads } => packed::<K>(m, n, k, a, b, c, ldc, threads.max(1)),
        }
    }
}

/// The small path: register tiles straight from A and B.
///
/// # Safety
/// As [`run`].
unsafe fn small<K: MicroKernel>(
    m: usize,
    n: usize,
    k: usize,
    a: MatPtr,
    b: MatPtr,
    c: *mut f32,
    ldc: usize,
    threads: usize,
) {
    if b.cs == 1 {
        // SAFETY: forwarded; B's rows are contiguous.
        return unsafe { small_tiles::<K>(m, n, k, a, b.ptr, b.rs, K::NR as isize, c, ldc, threads) };
    }
    // B's rows are not contiguous (`x @ W.T` has B = Wᵀ, attention's scores B = Kᵀ): pack it
    // once, straight from its strides, into `k × NR` panels in this thread's scratch (the
    // packed path's panel packing: in-register transposes when B's columns run along the
    // depth) — k·n values against m·n·k multiply-adds. Each column tile then reads its own
    // panel, `NR` values per depth step; the sums are the same as from B in place.
    let panels = n.div_ceil(K::NR);
    with_scratch(&PACK_B, panels * K::NR * k, |buf| {
        // SAFETY: the scratch holds `panels` panels of k*NR values; reads stay inside B
        // (caller's contract).
        unsafe {
            for p in 0..panels {
                let j0 = p * K::NR;
                K::pack_b(b, 0, k, j0, K::NR.min(n - j0), buf.0.add(p * K::NR * k));
            }
            small_tiles::<K>(m, n, k, a, buf.0, K::NR as isize, (K::NR * k) as isize, c, ldc, threads)
        }
    });
}

/// Every `SMALL_MR × NR` tile of C from unpacked A and row-contiguous B, split into equal runs
/// of tiles over `threads` threads. The tile of columns `j0..j0+NR` reads B from
/// `b + (j0/NR)·tile_stride` at row stride `ldb`: B in place has `tile_stride = NR`, B packed
/// into `k × NR` panels has `ldb = NR`, `tile_stride = NR·k`.
///
/// # Safety
/// As [`run`], with B's columns at unit stride.
unsafe fn small_tiles<K: MicroKernel>(
    m: usize,
    n: usize,
    k: usize,
    a: MatPtr,
    b: *const f32,
    ldb: isize,
    tile_stride: isize,
    c: *mut f32,
    ldc: usize,
    threads: usize,
) {
    let (row_tiles, col_tiles) = (m.div_ceil(K::SMALL_MR), n.div_ceil(K::NR));
    let (bp, cp) = (SendPtr(b as *mut f32), SendPtr(c));
    // Column-tile-major order: consecutive tiles of one task share a k×NR column block of B.
    split(row_tiles * col_tiles, threads, &|u0, u1| {
        let (a, bp, cp) = (a, bp, cp); // capture the Sync wrappers, not their raw fields
        for u in u0..u1 {
            let (i0, j0) = ((u % row_tiles) * K::SMALL_MR, (u / row_tiles) * K::NR);
            let (mr, nr) = (K::SMALL_MR.min(m - i0), K::NR.min(n - j0));
            // SAFETY: the tile's rows of A, columns of B and block of C lie inside the
            // operands; tiles are disjoint between tasks.
            unsafe {
                let at = MatPtr { ptr: a.ptr.offset(i0 as isize * a.rs), ..a };
                let bt = bp.0.offset((j0 / K::NR) as isize * tile_stride);
                K::small_tile(k, at, bt, ldb, cp.0.add(i0 * ldc + j0), ldc, mr, nr);
            }
        }
    });
}

/// From this many row tiles per thread on, threads split C by rows (see `packed`).
const TALL_TILES_PER_THREAD: usize = 8;

/// The packed BLIS loop nest.
///
/// # Safety
/// As [`run`].
unsafe fn packed<K: MicroKernel>(
    m: usize,
    n: usize,
    k: usize,
    a: MatPtr,
    b: MatPtr,
    c: *mut f32,
    ldc: usize,
    threads: usize,
) {
    let (mr_t, nr_t) = (K::MR, K::NR);
    let cptr = SendPtr(c);
    // Depth blocks of equal size (at most KC): a depth of 576 runs as 3 × 192, not 256 + 256 +
    // 64, whose last block would load and store C for a quarter of the work.
    let kc_step = k.div_ceil(k.div_ceil(K::KC));
    for jc in (0..n).step_by(K::NC) {
        let nc = K::NC.min(n - jc);
        let panels = nc.div_ceil(nr_t);
        for pc in (0..k).step_by(kc_step) {
            let kc = kc_step.min(k - pc);
            let accumulate = pc > 0;
            let pack_b = |bp: SendPtr<f32>, p0: usize, p1: usize| {
                for p in p0..p1 {
                    // SAFETY: panel p of a buffer sized for `panels` panels; ranges are disjoint
                    // between tasks; reads stay inside B (caller's contract).
                    unsafe { K::pack_b(b, pc, kc, jc + p * nr_t, nr_t.min(nc - p * nr_t), bp.0.add(p * nr_t * kc)) };
                }
            };
            let tiles = m.div_ceil(mr_t);
            let tall = threads > 1 && tiles >= TALL_TILES_PER_THREAD * threads;
            let tile = |bp: SendPtr<f32>, ap: SendPtr<f32>, ic: usize, mc: usize, ip: usize, jp: usize| {
                let cptr = cptr; // capture the Sync wrapper, not its raw field
                let (mr, nr) = (mr_t.min(mc - ip * mr_t), nr_t.min(nc - jp * nr_t));
                // SAFETY: packed panels hold kc×MR and kc×NR values; the C tile (rows
                // ic+ip*MR.., cols jc+jp*NR..) belongs to the calling task only.
                unsafe {
                    K::tile(
                        kc,
                        ap.0.add(ip * mr_t * kc),
                        bp.0.add(jp * nr_t * kc),
                        cptr.0.add((ic + ip * mr_t) * ldc + jc + jp * nr_t),
                        ldc,
                        mr,
                        nr,
                        accumulate,
                    )
                };
            };
            let pack_a = |ap: SendPtr<f32>, ic: usize, mc: usize, i0: usize, i1: usize| {
                for ip in i0..i1 {
                    // SAFETY: panel ip of a buffer sized for the block's panels; reads inside A.
                    unsafe { K::pack_a(a, ic + ip * mr_t, mr_t.min(mc - ip * mr_t), pc, kc, ap.0.add(ip * mr_t * kc)) };
                }
            };
            if tall {
                // Tall C: each thread owns a run of whole row tiles, packs its own rows of A and
                // its own copy of the B block, and covers every B panel for them: no hand-off
                // between packing and compute and no cache line written by one core and read by
                // the other (measured at 256² on AVX-512: 131 µs with a shared, jointly packed
                // B, 112 µs like this). The imbalance is at most one tile in eight.
                split(tiles, threads, &|t0, t1| {
                    let (r0, r1) = (t0 * mr_t, (t1 * mr_t).min(m));
                    with_scratch(&PACK_B, panels * nr_t * kc, |bl| {
                        pack_b(bl, 0, panels);
                        for ic in (r0..r1).step_by(K::MC) {
                            let mc = K::MC.min(r1 - ic);
                            let apanels = mc.div_ceil(mr_t);
                            with_scratch(&PACK_A, apanels * mr_t * kc, |ap| {
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
            with_scratch(&PACK_B, panels * nr_t * kc, |bp| {
                split(panels, threads, &|p0, p1| pack_b(bp, p0, p1));
                for ic in (0..m).step_by(K::MC) {
                    let mc = K::MC.min(m - ic);
                    let apanels = mc.div_ceil(mr_t);
                    with_scratch(&PACK_A, apanels * mr_t * kc, |ap| {
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

pub(crate) use team::split;

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The odd sizes: 1, one under and over a register tile or a cache block, primes.
    const ODD: [usize; 7] = [1, 3, 17, 63, 65, 255, 257];

    /// How an operand is stored.
    #[derive(Clone, Copy, Debug)]
    enum Store {
        RowMajor,
        /// A transposed operand (`x.t()`): unit row stride.
        ColMajor,
        /// Neither stride is 1 (a view with steps in both dimensions).
        Strided,
    }
    const STORES: [Store; 3] = [Store::RowMajor, Store::ColMajor, Store::Strided];

    fn val(seed: usize, i: usize) -> f32 {
        ((((i as u64 + 11) * 2654435761 + seed as u64 * 97) % 1000) as f32 - 500.0) / 250.0
    }

    /// `rows × cols` logical values `v[i*cols + j]` stored as `store` says; returns the buffer
    /// and the strides.
    fn stored(v: &[f32], rows: usize, cols: usize, store: Store) -> (Vec<f32>, isize, isize) {
        let (rs, cs, len) = match store {
            Store::RowMajor => (cols, 1, rows * cols),
            Store::ColMajor => (1, rows, rows * cols),
            Store::Strided => (2 * cols + 3, 2, rows * (2 * cols + 3)),
        };
        let mut buf = vec![f32::NAN; len.max(1)];
        for i in 0..rows {
            for j in 0..cols {
                buf[i * rs + j * cs] = v[i * cols + j];
            }
        }
        (buf, rs as isize, cs as isize)
    }

    /// f64 product and, per element, Σ|a||b| (the scale of the f32 rounding error).
    fn reference(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let (mut c, mut s) = (vec![0f64; m * n], vec![0f64; m * n]);
        for i in 0..m {
            for p in 0..k {
                let x = a[i * k + p] as f64;
                for j in 0..n {
                    c[i * n + j] += x * b[p * n + j] as f64;
                    s[i * n + j] += (x * b[p * n + j] as f64).abs();
                }
            }
        }
        (c, s)
    }

    struct Case {
        m: usize,
        n: usize,
        k: usize,
        a: Vec<f32>,
        b: Vec<f32>,
        want: Vec<f64>,
        scale: Vec<f64>,
    }

    impl Case {
        fn new(m: usize, n: usize, k: usize) -> Case {
            let a: Vec<f32> = (0..m * k).map(|i| val(1, i)).collect();
            let b: Vec<f32> = (0..k * n).map(|i| val(2, i)).collect();
            let (want, scale) = reference(m, n, k, &a, &b);
            Case { m, n, k, a, b, want, scale }
        }

        /// Run one path on one pair of layouts and compare with the reference: every element
        /// within the f32 error bound of a k-term dot product (k·ε·Σ|a||b|, doubled).
        fn check(&self, isa: Isa, strategy: Strategy, sa: Store, sb: Store) {
            let Case { m, n, k, .. } = *self;
            let (ab, ars, acs) = stored(&self.a, m, k, sa);
            let (bb, brs, bcs) = stored(&self.b, k, n, sb);
            // C with a row stride wider than n, to catch writes past a row.
            let ldc = n + 5;
            let mut c = vec![f32::NAN; m * ldc];
            // SAFETY: buffers of the stated sizes and strides; the caller checked `isa`.
            unsafe {
                sgemm_with(
                    isa,
                    strategy,
                    m,
                    n,
                    k,
                    MatPtr { ptr: ab.as_ptr(), rs: ars, cs: acs },
                    MatPtr { ptr: bb.as_ptr(), rs: brs, cs: bcs },
                    c.as_mut_ptr(),
                    ldc,
                )
            };
            for i in 0..m {
                for j in 0..n {
                    let (x, y) = (c[i * ldc + j] as f64, self.want[i * n + j]);
                    let tol = 2.0 * (k as f64 + 1.0) * f32::EPSILON as f64 * self.scale[i * n + j] + 1e-30;
                    assert!(
                        (x - y).abs() <= tol,
                        "{isa:?} {strategy:?} {m}x{n}x{k} A {sa:?} B {sb:?} at ({i},{j}): {x} vs {y}"
                    );
                }
                assert!(
                    c[i * ldc + n..(i + 1) * ldc].iter().all(|v| v.is_nan()),
                    "{isa:?} {strategy:?} wrote past row {i}"
                );
            }
        }
    }

    /// The instruction sets this CPU runs; prints the ones it cannot.
    fn runnable(test: &str) -> Vec<Isa> {
        Isa::ALL
            .into_iter()
            .filter(|isa| {
                let ok = isa.supported();
                if !ok {
                    eprintln!("SKIPPED in {test}: {isa:?} kernels (this CPU lacks the instructions)");
                }
                ok
            })
            .collect()
    }

    const STRATEGIES: [Strategy; 6] = [
        Strategy::Small { threads: 1 },
        Strategy::Small { threads: 2 },
        Strategy::Small { threads: 3 },
        Strategy::Packed { threads: 1 },
        Strategy::Packed { threads: 2 },
        Strategy::Packed { threads: 3 },
    ];

    /// Every supported instruction set × every strategy × every pair of layouts, on the odd
    /// sizes up to 65 in all three dimensions.
    #[test]
    fn every_path_and_layout_matches_the_reference_on_odd_sizes() {
        let sizes: &[usize] = if cfg!(debug_assertions) { &ODD[..3] } else { &ODD[..5] };
        let isas = runnable("every_path_and_layout_matches_the_reference_on_odd_sizes");
        for &m in sizes {
            for &n in sizes {
                for &k in sizes {
                    let case = Case::new(m, n, k);
                    for &isa in &isas {
                        for strategy in STRATEGIES {
                            for sa in STORES {
                                for sb in STORES {
                                    case.check(isa, strategy, sa, sb);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Sizes past every cache block (k > KC, m > MC, n > NC) and the large odd sizes, on every
    /// path, with the layouts a network produces (row-major, `x @ W.T`, `dYᵀ @ X`).
    #[test]
    fn every_path_matches_the_reference_across_cache_blocks() {
        let isas = runnable("every_path_matches_the_reference_across_cache_blocks");
        let mut shapes =
            vec![(255, 257, 65), (65, 255, 257), (257, 3, 255), (1, 257, 257), (3, 4200, 5), (500, 40, 300)];
        if !cfg!(debug_assertions) {
            shapes.extend([(257, 255, 257), (255, 1, 257)]);
        }
        for (m, n, k) in shapes {
            let case = Case::new(m, n, k);
            for &isa in &isas {
                for strategy in STRATEGIES {
                    for (sa, sb) in [
                        (Store::RowMajor, Store::RowMajor),
                        (Store::RowMajor, Store::ColMajor),
                        (Store::ColMajor, Store::RowMajor),
                    ] {
                        case.check(isa, strategy, sa, sb);
                    }
                }
            }
            // The dispatcher's own choice for this size.
            if let Some(isa) = Isa::best() {
                case.check(isa, strategy(m, n, k, team::threads()), Store::RowMajor, Store::ColMajor);
            }
        }
    }

    #[test]
    fn empty_depth_writes_zeros_and_empty_outputs_write_nothing() {
        for isa in runnable("empty_depth_writes_zeros_and_empty_outputs_write_nothing") {
            for strategy in STRATEGIES {
                let (m, n) = (5, 19);
                let mut c = vec![f32::NAN; m * n];
                let z = [0f32; 1];
                let e = MatPtr { ptr: z.as_ptr(), rs: 0, cs: 0 };
                // SAFETY: k = 0 reads nothing; C holds m*n values.
                unsafe { sgemm_with(isa, strategy, m, n, 0, e, e, c.as_mut_ptr(), n) };
                assert!(c.iter().all(|&v| v == 0.0), "{isa:?} {strategy:?}");
                // SAFETY: m = 0 touches nothing.
                unsafe { sgemm_with(isa, strategy, 0, n, 3, e, e, c.as_mut_ptr(), n) };
            }
        }
    }

    #[test]
    fn spread_attention_products_with_contiguous_b_rows_take_the_small_path() {
        // P·V of attention (S = 128, head 64), spread over the batch: small.
        assert_eq!(strategy_in_batch(128, 64, 128, 1, true, true), Strategy::Small { threads: 1 });
        // Q·Kᵀ (B is a transposed view): the size's own choice, packed.
        assert!(matches!(strategy_in_batch(128, 128, 64, 1, true, false), Strategy::Packed { .. }));
        // Not spread, or larger than 128³: the size's own choice.
        assert_eq!(strategy_in_batch(128, 64, 128, 2, false, true), strategy(128, 64, 128, 2));
        assert_eq!(strategy_in_batch(256, 256, 256, 1, true, true), strategy(256, 256, 256, 1));
    }

    #[test]
    fn the_measured_choice_is_small_then_packed_and_threads_large_products() {
        assert_eq!(strategy(32, 32, 32, 2), Strategy::Small { threads: 1 });
        assert!(matches!(strategy(2048, 2048, 2048, 2), Strategy::Packed { threads: 2 }));
        assert!(matches!(strategy(2048, 2048, 2048, 1), Strategy::Packed { threads: 1 }));
        assert!(spread_over_batch(128, 128, 128, 64, 2));
        assert!(!spread_over_batch(1, 128, 128, 64, 2));
        assert!(!spread_over_batch(128, 128, 128, 64, 1));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, .. proptest::prelude::ProptestConfig::default() })]
        /// Any shape (ragged edges in every dimension, depths that are not a multiple of the
        /// transposes' blocks), any layout, any path this CPU runs: the product matches the
        /// reference.
        #[test]
        fn matches_reference_for_any_shape_and_layout(m in 1usize..300, n in 1usize..90, k in 0usize..300,
                                                      sa in 0usize..3, sb in 0usize..3, path in 0usize..18) {
            let isa = Isa::ALL[path / 6];
            if !isa.supported() {
                return Ok(());
            }
            Case::new(m, n, k).check(isa, STRATEGIES[path % 6], STORES[sa], STORES[sb]);
        }
    }
}

/// The measurement behind [`strategy`]'s thresholds: GFLOP/s of every strategy on the best
/// instruction set, for square products and attention-shaped ones, best of 5 runs.
///
/// `cargo test --release -p ferrite-tensor --lib kernels::gemm::timing -- --ignored --nocapture`
/// (`GEMM_SIZES=32,64` picks the sizes; `GEMM_CPU_TIME=1 RAYON_NUM_THREADS=1` times the
/// calling thread's CPU time instead of wall time).
#[cfg(test)]
mod timing {
    use super::*;
    use std::time::Instant;

    /// With `GEMM_CPU_TIME=1`: the calling thread's CPU time (Linux), to compare single-thread
    /// strategies on a machine shared with other jobs (preemption does not count).
    pub(super) fn thread_cpu_seconds() -> Option<f64> {
        std::env::var_os("GEMM_CPU_TIME").and_then(|_| ferrite_test_support::timing::thread_cpu_seconds())
    }

    #[test]
    #[ignore = "a measurement, not a test: run it on a quiet machine with --nocapture"]
    fn strategies_by_size() {
        let Some(isa) = Isa::best() else { return };
        let threads = team::threads();
        let sizes: Vec<usize> = std::env::var("GEMM_SIZES")
            .ok()
            .map(|s| s.split(',').filter_map(|v| v.parse().ok()).collect())
            .unwrap_or_else(|| vec![16, 24, 32, 48, 64, 80, 96, 128, 160, 192, 256, 512, 1024]);
        println!("{isa:?}, {threads} threads; GFLOP/s, best of 5 (A row-major; B row-major | B = Wᵀ)");
        let strategies = [
            Strategy::Small { threads: 1 },
            Strategy::Small { threads },
            Strategy::Packed { threads: 1 },
            Strategy::Packed { threads },
        ];
        for &n in &sizes {
            let a: Vec<f32> = (0..n * n).map(|i| (i % 13) as f32 - 6.0).collect();
            let b: Vec<f32> = (0..n * n).map(|i| (i % 11) as f32 - 5.0).collect();
            let mut c = vec![0f32; n * n];
            let iters = (400_000_000 / (2 * n * n * n)).clamp(3, 100_000);
            let mut line = format!("{n:>5}: ");
            for s in strategies {
                for bt in [false, true] {
                    let (brs, bcs) = if bt { (1, n as isize) } else { (n as isize, 1) };
                    let mut best = f64::INFINITY;
                    for _ in 0..5 {
                        let t = Instant::now();
                        let c0 = thread_cpu_seconds();
                        for _ in 0..iters {
                            // SAFETY: n×n buffers; the instruction set is this CPU's best.
                            unsafe {
                                sgemm_with(
                                    isa,
                                    s,
                                    n,
                                    n,
                                    n,
                                    MatPtr { ptr: a.as_ptr(), rs: n as isize, cs: 1 },
                                    MatPtr { ptr: b.as_ptr(), rs: brs, cs: bcs },
                                    c.as_mut_ptr(),
                                    n,
                                )
                            };
                        }
                        let dt = match (c0, thread_cpu_seconds()) {
                            (Some(c0), Some(c1)) => c1 - c0,
                            _ => t.elapsed().as_secs_f64(),
                        };
                        best = best.min(dt / iters as f64);
                    }
                    line += &format!("{:>7.1}{}", 2.0 * (n * n * n) as f64 / best / 1e9, if bt { " |" } else { "" });
                }
            }
            println!("{line}   [{:?}]", strategy(n, n, n, threads));
        }
        println!("columns: small×1, small×{threads}, packed×1, packed×{threads}; [the dispatcher's choice]");
    }
}

/// The measurement behind `avx2.rs`'s block sizes: the packed path on one thread with other
/// `KC`/`MC`/`NC` around the same micro-kernel (calling thread's CPU time with
/// `GEMM_CPU_TIME=1`).
///
/// `GEMM_CPU_TIME=1 RAYON_NUM_THREADS=1 cargo test --release -p ferrite-tensor --lib
/// kernels::gemm::blocking -- --ignored --nocapture`
#[cfg(all(test, target_arch = "x86_64"))]
mod blocking {
    use super::*;
    use std::time::Instant;

    struct Blocked<const KC: usize, const MC: usize, const NC: usize>;

    impl<const KC: usize, const MC: usize, const NC: usize> MicroKernel for Blocked<KC, MC, NC> {
        const MR: usize = avx2::Avx2Gemm::MR;
        const NR: usize = avx2::Avx2Gemm::NR;
        const KC: usize = KC;
        const MC: usize = MC;
        const NC: usize = NC;
        const SMALL_MR: usize = avx2::Avx2Gemm::SMALL_MR;
        unsafe fn pack_a(a: MatPtr, i0: usize, mr: usize, p0: usize, kc: usize, dst: *mut f32) {
            // SAFETY: forwarded.
            unsafe { avx2::Avx2Gemm::pack_a(a, i0, mr, p0, kc, dst) }
        }
        unsafe fn pack_b(b: MatPtr, p0: usize, kc: usize, j0: usize, nr: usize, dst: *mut f32) {
            // SAFETY: forwarded.
            unsafe { avx2::Avx2Gemm::pack_b(b, p0, kc, j0, nr, dst) }
        }
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
            // SAFETY: forwarded.
            unsafe { avx2::Avx2Gemm::tile(kc, a, b, c, ldc, mr, nr, acc) }
        }
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
            unsafe { avx2::Avx2Gemm::small_tile(k, a, b, ldb, c, ldc, mr, nr) }
        }
    }

    fn time<K: MicroKernel>(n: usize, threads: usize) -> f64 {
        let a: Vec<f32> = (0..n * n).map(|i| (i % 13) as f32 - 6.0).collect();
        let b: Vec<f32> = (0..n * n).map(|i| (i % 11) as f32 - 5.0).collect();
        let mut c = vec![0f32; n * n];
        let iters = (2_000_000_000 / (2 * n * n * n)).clamp(2, 1000);
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let t = Instant::now();
            let c0 = super::timing::thread_cpu_seconds();
            for _ in 0..iters {
                let (am, bm) = (
                    MatPtr { ptr: a.as_ptr(), rs: n as isize, cs: 1 },
                    MatPtr { ptr: b.as_ptr(), rs: 1, cs: n as isize },
                );
                // SAFETY: n×n buffers; the test checked AVX2.
                unsafe { packed::<K>(n, n, n, am, bm, c.as_mut_ptr(), n, threads) };
            }
            let dt = match (c0, super::timing::thread_cpu_seconds()) {
                (Some(c0), Some(c1)) if threads == 1 => c1 - c0,
                _ => t.elapsed().as_secs_f64(),
            };
            best = best.min(dt / iters as f64);
        }
        2.0 * (n * n * n) as f64 / best / 1e9
    }

    /// The micro-kernel alone on panels resident in L1 (the ceiling for the packed path).
    #[test]
    #[ignore = "a measurement, not a test: run it on a quiet machine with --nocapture"]
    fn avx2_micro_kernel_in_l1() {
        if !Isa::Avx2.supported() {
            return;
        }
        type K = avx2::Avx2Gemm;
        for kc in [64usize, 128, 256] {
            let a = vec![0.5f32; kc * K::MR];
            let b = vec![0.25f32; kc * K::NR];
            let mut c = vec![0f32; K::MR * K::NR * 4];
            let iters = 200_000;
            let mut best = f64::INFINITY;
            for _ in 0..5 {
                let t = Instant::now();
                let c0 = super::timing::thread_cpu_seconds();
                for i in 0..iters {
                    // SAFETY: panels of kc steps; C holds MR rows of NR (×4, rotating tiles).
                    unsafe {
                        K::tile(
                            kc,
                            a.as_ptr(),
                            b.as_ptr(),
                            c.as_mut_ptr().add((i % 4) * K::MR * K::NR),
                            K::NR,
                            K::MR,
                            K::NR,
                            true,
                        )
                    };
                }
                let dt = match (c0, super::timing::thread_cpu_seconds()) {
                    (Some(c0), Some(c1)) => c1 - c0,
                    _ => t.elapsed().as_secs_f64(),
                };
                best = best.min(dt / iters as f64);
            }
            println!("micro-kernel 6x16, kc {kc}: {:.1} GFLOP/s", 2.0 * (kc * K::MR * K::NR) as f64 / best / 1e9);
        }
    }

    #[test]
    #[ignore = "a measurement, not a test: run it on a quiet machine with --nocapture"]
    fn avx2_block_sizes() {
        if !Isa::Avx2.supported() {
            return;
        }
        let threads: usize = std::env::var("GEMM_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
        println!("AVX2 packed x @ W.T, {threads} thread(s), GFLOP/s: KC/MC/NC variants");
        for n in [256usize, 512, 1024, 2048] {
            println!(
                "{n:>5}: 256/144/4096 {:.1}  256/72/4096 {:.1}  256/288/4096 {:.1}  384/96/4096 {:.1}  192/192/4096 {:.1}  512/72/4096 {:.1}  256/144/1024 {:.1}",
                time::<Blocked<256, 144, 4096>>(n, threads),
                time::<Blocked<256, 72, 4096>>(n, threads),
                time::<Blocked<256, 288, 4096>>(n, threads),
                time::<Blocked<384, 96, 4096>>(n, threads),
                time::<Blocked<192, 192, 4096>>(n, threads),
                time::<Blocked<512, 72, 4096>>(n, threads),
                time::<Blocked<256, 144, 1024>>(n, threads),
            );
        }
    }
}
