//! CPU matrix products: f32 through ferrite's own GEMM (`kernels/gemm.rs`: AVX-512, AVX2 + FMA
//! or portable kernels, chosen from the CPU's features), f64 (and f32 off x86-64) through faer's
//! (the choice was measured, see BENCHMARKS.md, "Tensors").
//!
//! A batch of products runs one product after another, each split over the kernel team, or —
//! when the products are small or the batch is long (attention's `[B·H, S, d] × [B·H, d, S]`) —
//! spread over the team one product per task, each on a single thread: splitting a small
//! product costs a hand-off per product and halves each thread's tiles, spreading the batch
//! costs one hand-off for all of them.

use faer::{Accum, MatMut, MatRef, Par};
use smallvec::SmallVec;

use crate::backend::PreparedRhs;
use crate::error::{Result, TensorError};
use crate::kernels::gemm::{self, Isa, prepacked};
use crate::kernels::strided::{SendPtr, Walk};
use crate::layout::Layout;
use crate::{DType, Tensor};

pub(super) fn matmul(out: &Tensor, a: &Tensor, b: &Tensor, batch: &[usize]) -> Result<()> {
    bmm_kernel(a, b, out, batch)
}

/// `b` packed once for the products of every step of a recurrent scan (f32 on x86-64, where
/// ferrite's own GEMM runs); `None` elsewhere, and while a test forces a GEMM path.
pub(super) fn prepare_rhs(b: &Tensor) -> Result<Option<Box<dyn PreparedRhs>>> {
    if b.dtype() != DType::F32 || b.rank() != 2 || gemm::forced().is_some() {
        return Ok(None);
    }
    let Some(isa) = Isa::best() else { return Ok(None) };
    let (k, n) = (b.shape()[0], b.shape()[1]);
    let bm = gemm::MatPtr { ptr: b.ptr::<f32>("matmul")?, rs: b.strides()[0] as isize, cs: b.strides()[1] as isize };
    // SAFETY: `bm` describes the initialised `k × n` tensor `b` (its layout was validated
    // against its storage); `isa` is this CPU's (`best`).
    let packed = unsafe { prepacked::pack_b(isa, k, n, bm, crate::kernels::team::threads()) };
    Ok(Some(Box::new(CpuPreparedRhs { b: b.clone(), packed })))
}

/// A prepacked f32 right-hand side, and the tensor itself for the products too small for it.
struct CpuPreparedRhs {
    b: Tensor,
    packed: prepacked::PackedB,
}

impl PreparedRhs for CpuPreparedRhs {
    fn matmul(&self, out: &Tensor, a: &Tensor) -> Result<()> {
        let (k, n) = (self.packed.k(), self.packed.n());
        if a.rank() != 2 || a.shape()[1] != k || a.dtype() != DType::F32 || out.shape() != [a.shape()[0], n] {
            return Err(TensorError::MatmulShapeMismatch {
                op: "matmul",
                lhs: a.shape().to_vec(),
                rhs: self.b.shape().to_vec(),
            });
        }
        let m = a.shape()[0];
        if !prepacked::applies(m, n, k) {
            return bmm_kernel(a, &self.b, out, &[]);
        }
        let am =
            gemm::MatPtr { ptr: a.ptr::<f32>("matmul")?, rs: a.strides()[0] as isize, cs: a.strides()[1] as isize };
        let threads = prepacked::threads_for(m, n, k, crate::kernels::team::threads());
        // SAFETY: `am` describes the initialised `m × k` tensor `a`; `out` is a fresh contiguous
        // `m × n` buffer distinct from `a` and from the packed copy of `b`.
        unsafe { prepacked::sgemm_prepacked(m, am, &self.packed, out.ptr::<f32>("matmul")?, n, threads) };
        Ok(())
    }
}

/// Below this many multiply-adds a faer product runs on the calling thread.
const PAR_FLOPS: usize = 48 * 48 * 48;

fn par_for(m: usize, n: usize, k: usize) -> Par {
    let threads = rayon::current_num_threads();
    if m.saturating_mul(n).saturating_mul(k) < PAR_FLOPS || threads <= 1 { Par::Seq } else { Par::rayon(threads) }
}

/// One `[m,k] x [k,n] -> [m,n]` product on raw strided buffers.
///
/// # Safety
/// The pointers and strides must describe valid, initialised matrices of the given sizes, and
/// `c` must not overlap `a` or `b`.
unsafe fn gemm_raw<T: faer::traits::ComplexField + Copy>(
    c: *mut T,
    (crs, ccs): (isize, isize),
    a: *const T,
    (ars, acs): (isize, isize),
    b: *const T,
    (brs, bcs): (isize, isize),
    (m, n, k): (usize, usize, usize),
    one: T,
    par: Par,
) {
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        let cm = MatMut::<T>::from_raw_parts_mut(c, m, n, crs, ccs);
        let am = MatRef::<T>::from_raw_parts(a, m, k, ars, acs);
        let bm = MatRef::<T>::from_raw_parts(b, k, n, brs, bcs);
        faer::linalg::matmul::matmul(cm, Accum::Replace, am, bm, one, par);
    }
}

/// Call `f(batch index, offset into a, offset into b)` for every matrix of the broadcast batch
/// dims `batch`, in row-major batch order (`al`/`bl` are the operands' layouts broadcast to
/// `[batch.., rows, cols]`).
fn for_each_batch(al: &Layout, bl: &Layout, batch: &[usize], mut f: impl FnMut(usize, usize, usize)) {
    let nbd = batch.len();
    let nb: usize = batch.iter().product();
    let mut idx: SmallVec<[usize; 6]> = SmallVec::from_elem(0, nbd);
    for bi in 0..nb {
        let (mut ao, mut bo) = (al.offset, bl.offset);
        for d in 0..nbd {
            ao += idx[d] * al.strides[d];
            bo += idx[d] * bl.strides[d];
        }
        f(bi, ao, bo);
        for d in (0..nbd).rev() {
            idx[d] += 1;
            if idx[d] < batch[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// The thread count a strategy names.
fn s_threads(s: gemm::Strategy) -> usize {
    match s {
        gemm::Strategy::Small { threads } | gemm::Strategy::Packed { threads } => threads,
    }
}

/// Batched product of `a [.., m, k]` and `b [.., k, n]` (batch dims already broadcast in the
/// layouts) into the fresh contiguous `out [.., m, n]`. Same dtype: f32 or f64, or f16/bf16
/// (see [`bmm_half`]).
fn bmm_kernel(a: &Tensor, b: &Tensor, out: &Tensor, batch: &[usize]) -> Result<()> {
    let r = out.rank();
    let (m, n) = (out.shape()[r - 2], out.shape()[r - 1]);
    let k = a.shape()[a.rank() - 1];
    if out.numel() == 0 {
        return Ok(());
    }
    if matches!(out.dtype(), DType::F16 | DType::BF16) {
        return bmm_half(a, b, out, batch);
    }
    let al = a.layout().broadcast_to(&[batch, &[m, k]].concat(), "matmul")?;
    let bl = b.layout().broadcast_to(&[batch, &[k, n]].concat(), "matmul")?;
    let forced = gemm::forced();
    let isa = forced.map(|f| f.isa).or_else(Isa::best);
    let cp = out.ptr::<u8>("matmul")?;
    // Each arm's pointers are the operands' storages, which `al`/`bl` (their layouts, validated
    // against those storages) address; `out` is a fresh contiguous buffer of batch·m·n elements of
    // its dtype, distinct from both.
    match (out.dtype(), isa) {
        (DType::F32, Some(isa)) => {
            let (ap, bp) = (a.storage_base_ptr::<f32>("matmul")?, b.storage_base_ptr::<f32>("matmul")?);
            // SAFETY: as above; `isa` is supported (`best`, or a test that checked it).
            unsafe { bmm_f32_own(isa, forced, ap, &al, bp, &bl, cp.cast(), batch, (m, n, k)) };
        }
        (DType::F32, None) => {
            let (ap, bp) = (a.storage_base_ptr::<f32>("matmul")?, b.storage_base_ptr::<f32>("matmul")?);
            // SAFETY: as above.
            unsafe { bmm_faer::<f32>(ap, &al, bp, &bl, cp.cast(), batch, (m, n, k), 1.0) };
        }
        (DType::F64, _) => {
            let (ap, bp) = (a.storage_base_ptr::<f64>("matmul")?, b.storage_base_ptr::<f64>("matmul")?);
            // SAFETY: as above.
            unsafe { bmm_faer::<f64>(ap, &al, bp, &bl, cp.cast(), batch, (m, n, k), 1.0) };
        }
        (d, _) => return Err(TensorError::UnsupportedDType { op: "matmul", dtype: d }),
    }
    Ok(())
}

/// The batch through faer's GEMM (f64, and f32 where ferrite's own kernels do not run):
/// `c [batch.., m, n]` (contiguous) from `a`/`b` at their storages' bases, addressed by the
/// broadcast layouts `al`/`bl`.
///
/// # Safety
/// `al`/`bl` must address initialised elements of the buffers at `ap`/`bp`; `cp` must be a
/// buffer of batch·m·n elements overlapping neither.
#[allow(clippy::too_many_arguments)]
unsafe fn bmm_faer<T: faer::traits::ComplexField + Copy + Default>(
    ap: *const T,
    al: &Layout,
    bp: *const T,
    bl: &Layout,
    cp: *mut T,
    batch: &[usize],
    (m, n, k): (usize, usize, usize),
    one: T,
) {
    let nbd = batch.len();
    if k == 0 {
        // SAFETY: `cp` holds batch·m·n elements (the caller's contract).
        unsafe { std::slice::from_raw_parts_mut(cp, batch.iter().product::<usize>() * m * n).fill(T::default()) };
        return;
    }
    let par = par_for(m, n, k);
    for_each_batch(al, bl, batch, |bi, ao, bo| {
        // SAFETY: the offsets and strides come from the layouts the caller vouches for; product
        // `bi` writes only its own m×n block of `c`.
        unsafe {
            gemm_raw::<T>(
                cp.add(bi * m * n),
                (n as isize, 1),
                ap.add(ao),
                (al.strides[nbd] as isize, al.strides[nbd + 1] as isize),
                bp.add(bo),
                (bl.strides[nbd] as isize, bl.strides[nbd + 1] as isize),
                (m, n, k),
                one,
                par,
            );
        }
    });
    // The microkernels leave dirty AVX upper state behind (see kernels/avx_state.rs).
    if matches!(par, Par::Seq) {
        crate::kernels::avx_state::clear_upper_state_here();
    } else {
        crate::kernels::avx_state::clear_upper_state_everywhere();
    }
}

/// f16/bf16 products as PyTorch's CPU kernels compute them: the operands widened to f32
/// (exact), one f32 product, rounded once into `out` — the bits of widening to f32 tensors
/// first. The widened operands and the f32 product are host buffers of this call, not tensors:
/// transient kernel workspace like the GEMM's packing. So the allocator sees only the output,
/// as on `cuda:N` where cuBLAS takes half operands itself, and the planner's `sim`/`meta`
/// devices (which run this backend) predict that.
fn bmm_half(a: &Tensor, b: &Tensor, out: &Tensor, batch: &[usize]) -> Result<()> {
    let r = out.rank();
    let (m, n) = (out.shape()[r - 2], out.shape()[r - 1]);
    let k = a.shape()[a.rank() - 1];
    let (aw, bw) = (widened(a)?, widened(b)?);
    let al = Layout::contiguous(a.shape()).broadcast_to(&[batch, &[m, k]].concat(), "matmul")?;
    let bl = Layout::contiguous(b.shape()).broadcast_to(&[batch, &[k, n]].concat(), "matmul")?;
    let mut c = vec![0f32; out.numel()];
    let forced = gemm::forced();
    // `al`/`bl` address the contiguous widened copies of `a`/`b` (their own shapes, broadcast);
    // `c` holds batch·m·n elements and is a third buffer.
    match forced.map(|f| f.isa).or_else(Isa::best) {
        // SAFETY: as above; `isa` is supported.
        Some(isa) => unsafe {
            bmm_f32_own(isa, forced, aw.as_ptr(), &al, bw.as_ptr(), &bl, c.as_mut_ptr(), batch, (m, n, k))
        },
        // SAFETY: as above.
        None => unsafe { bmm_faer::<f32>(aw.as_ptr(), &al, bw.as_ptr(), &bl, c.as_mut_ptr(), batch, (m, n, k), 1.0) },
    }
    let len = out.numel();
    match out.dtype() {
        DType::BF16 => {
            // SAFETY: `out` is a fresh contiguous bf16 buffer of `len` elements.
            let o = unsafe { std::slice::from_raw_parts_mut(out.ptr::<half::bf16>("matmul")?, len) };
            o.iter_mut().zip(&c).for_each(|(o, &x)| *o = half::bf16::from_f32(x));
        }
        DType::F16 => {
            // SAFETY: `out` is a fresh contiguous f16 buffer of `len` elements.
            let o = unsafe { std::slice::from_raw_parts_mut(out.ptr::<half::f16>("matmul")?, len) };
            o.iter_mut().zip(&c).for_each(|(o, &x)| *o = half::f16::from_f32(x));
        }
        d => return Err(TensorError::UnsupportedDType { op: "matmul", dtype: d }),
    }
    Ok(())
}

/// The f16/bf16 tensor `t` widened to a contiguous f32 host buffer of its own shape.
fn widened(t: &Tensor) -> Result<Vec<f32>> {
    fn walk<H: Copy>(t: &Tensor, to_f32: impl Fn(H) -> f32) -> Result<Vec<f32>> {
        let mut v = Vec::with_capacity(t.numel());
        let base = t.storage_base_ptr::<H>("matmul")?;
        let w = Walk::new(t.shape(), [&t.layout().strides[..]], [t.layout().offset]);
        let inner = w.inner_strides()[0];
        w.rows(0, t.numel(), |[off], len, _| {
            // SAFETY: the walk visits the element offsets of `t`'s layout, which was validated
            // against its storage.
            v.extend((0..len).map(|i| to_f32(unsafe { *base.add(off + i * inner) })));
        });
        Ok(v)
    }
    match t.dtype() {
        DType::BF16 => walk::<half::bf16>(t, half::bf16::to_f32),
        DType::F16 => walk::<half::f16>(t, half::f16::to_f32),
        d => Err(TensorError::UnsupportedDType { op: "matmul", dtype: d }),
    }
}

/// The f32 batch on ferrite's own GEMM: `c [batch.., m, n]` (contiguous) from `a`/`b` at their
/// storages' bases `ap`/`bp`, addressed by the broadcast layouts `al`/`bl`.
///
/// # Safety
/// `al`/`bl` must address initialised elements of the buffers at `ap`/`bp`; `cp` must be a
/// buffer of batch·m·n elements overlapping neither; `isa` must be supported by this CPU.
#[allow(clippy::too_many_arguments)]
unsafe fn bmm_f32_own(
    isa: Isa,
    forced: Option<gemm::Forced>,
    ap: *const f32,
    al: &Layout,
    bp: *const f32,
    bl: &Layout,
    cp: *mut f32,
    batch: &[usize],
    (m, n, k): (usize, usize, usize),
) {
    {
        let nbd = batch.len();
        let (ap, bp, cp) = (SendPtr(ap.cast_mut()), SendPtr(bp.cast_mut()), SendPtr(cp));
        let threads = crate::kernels::team::threads();
        let nb: usize = batch.iter().product();
        let (ars, acs) = (al.strides[nbd] as isize, al.strides[nbd + 1] as isize);
        let (brs, bcs) = (bl.strides[nbd] as isize, bl.strides[nbd + 1] as isize);
        let spread = forced.and_then(|f| f.spread).unwrap_or_else(|| gemm::spread_over_batch(nb, m, n, k, threads));
        let per_product = if spread { 1 } else { threads };
        let strategy = match forced.and_then(|f| f.strategy) {
            Some(s) => s.with_threads(if spread { 1 } else { s_threads(s) }),
            None => gemm::strategy_in_batch(m, n, k, per_product, spread, bcs == 1 || brs == 1),
        };
        let product = |bi: usize, ao: usize, bo: usize| {
            let (ap, bp, cp) = (ap, bp, cp);
            // SAFETY: offsets/strides come from layouts validated against their storages; the
            // output is a fresh contiguous buffer distinct from both inputs, and product `bi`
            // writes only its own m×n block of it; `isa` is supported (`best`, or a test that
            // checked it).
            unsafe {
                let am = gemm::MatPtr { ptr: ap.0.add(ao), rs: ars, cs: acs };
                let bm = gemm::MatPtr { ptr: bp.0.add(bo), rs: brs, cs: bcs };
                gemm::sgemm_with(isa, strategy, m, n, k, am, bm, cp.0.add(bi * m * n), n);
            }
        };
        if spread {
            let mut offsets = Vec::with_capacity(nb);
            for_each_batch(al, bl, batch, |_, ao, bo| offsets.push((ao, bo)));
            gemm::split(nb, threads, &|b0, b1| {
                for (bi, &(ao, bo)) in offsets.iter().enumerate().take(b1).skip(b0) {
                    product(bi, ao, bo);
                }
            });
        } else {
            for_each_batch(al, bl, batch, product);
        }
        // No vzeroupper needed here: the kernels are `#[target_feature]` functions, and the
        // compiler emits `vzeroupper` on their return (checked by kernels/avx_state.rs's test).
    }
}

#[cfg(test)]
mod tests {
    use crate::kernels::gemm::{Forced, Isa, Strategy, with_forced};
    use crate::{DType, Device, Generator, Tensor};

    /// `a @ b` in f64 from the logical values, with broadcast batch dims, and per element
    /// Σ|a||b| (the scale of the f32 rounding error).
    fn reference(a: &Tensor, b: &Tensor) -> (Vec<usize>, Vec<f64>, Vec<f64>) {
        let (ra, rb) = (a.rank(), b.rank());
        let (m, k, n) = (a.shape()[ra - 2], a.shape()[ra - 1], b.shape()[rb - 1]);
        let batch = crate::layout::broadcast_shapes(&a.shape()[..ra - 2], &b.shape()[..rb - 2], "test").unwrap();
        let nb: usize = batch.iter().product();
        let av = a.expand(&[&batch[..], &[m, k]].concat()).unwrap().to_vec_f64().unwrap();
        let bv = b.expand(&[&batch[..], &[k, n]].concat()).unwrap().to_vec_f64().unwrap();
        let (mut c, mut s) = (vec![0f64; nb * m * n], vec![0f64; nb * m * n]);
        for bi in 0..nb {
            for i in 0..m {
                for p in 0..k {
                    let x = av[(bi * m + i) * k + p];
                    for j in 0..n {
                        let y = x * bv[(bi * k + p) * n + j];
                        c[(bi * m + i) * n + j] += y;
                        s[(bi * m + i) * n + j] += y.abs();
                    }
                }
            }
        }
        let mut shape = batch.to_vec();
        shape.extend([m, n]);
        (shape, c, s)
    }

    /// A right-hand side prepared once (the recurrent scan's `W_hhᵀ` and `W_hh`) gives the same
    /// bits as `Tensor::matmul` with it, for products on the packed path, the small path (a few
    /// rows) and one row (gemv), from row-block views of a larger tensor as the scan passes them.
    #[test]
    fn prepared_right_hand_sides_give_the_bits_of_matmul() {
        let d = Device::Cpu;
        let mut g = Generator::new(11);
        for (k, n, transposed) in [(512usize, 2048usize, true), (128, 512, true), (512, 128, false), (65, 33, false)] {
            let w = if transposed {
                Tensor::randn_with(&[n, k], DType::F32, &d, &mut g).unwrap().t().unwrap()
            } else {
                Tensor::randn_with(&[k, n], DType::F32, &d, &mut g).unwrap()
            };
            let Some(prep) = super::prepare_rhs(&w).unwrap() else {
                eprintln!("SKIPPED: no prepared products off x86-64");
                return;
            };
            let states = Tensor::randn_with(&[80, k], DType::F32, &d, &mut g).unwrap();
            for (start, rows) in [(0usize, 32usize), (40, 32), (3, 7), (9, 1), (0, 80)] {
                let a = states.narrow(0, start, rows).unwrap();
                let out = Tensor::zeros(&[rows, n], DType::F32, &d).unwrap();
                prep.matmul(&out, &a).unwrap();
                let want = a.matmul(&w).unwrap().to_vec::<f32>().unwrap();
                let got = out.to_vec::<f32>().unwrap();
                assert!(
                    got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "k {k} n {n} transposed {transposed} rows {start}+{rows}"
                );
            }
        }
    }

    /// Attention's batches (`Q·Kᵀ` from a transposed key view, `P·V`) have the same bits whether
    /// the batch is spread over the team, one product per thread on the small path (as with 2+
    /// threads), or not (as with one thread, where the larger products take the packed path):
    /// depths up to one depth block run the same multiply-add chain on both paths.
    #[test]
    fn spread_and_unspread_attention_batches_give_the_same_bits() {
        let d = Device::Cpu;
        let mut g = Generator::new(3);
        let mut r = |shape: &[usize]| Tensor::randn_with(shape, DType::F32, &d, &mut g).unwrap();
        let cases: Vec<(Tensor, Tensor)> = vec![
            (r(&[8, 128, 64]), r(&[8, 128, 64]).transpose(-1, -2).unwrap()),
            (r(&[8, 64, 64]), r(&[8, 64, 64]).transpose(-1, -2).unwrap()),
            (r(&[8, 100, 64]), r(&[8, 100, 64]).transpose(-1, -2).unwrap()),
            (r(&[8, 128, 128]), r(&[8, 128, 64])),
            (r(&[6, 37, 200]), r(&[6, 200, 45])),
        ];
        for isa in Isa::ALL {
            if !isa.supported() {
                eprintln!("SKIPPED: {isa:?} kernels (this CPU lacks the instructions)");
                continue;
            }
            for (a, b) in &cases {
                let run = |spread| {
                    with_forced(Forced { isa, strategy: None, spread: Some(spread) }, || a.matmul(b).unwrap())
                        .to_vec::<f32>()
                        .unwrap()
                };
                let (spread, single) = (run(true), run(false));
                assert!(
                    spread.iter().zip(&single).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{isa:?} {:?} x {:?}",
                    a.shape(),
                    b.shape()
                );
            }
        }
    }

    /// Batched, broadcast, transposed and strided operands through `Tensor::matmul` on every
    /// instruction set this CPU runs, every strategy, with and without spreading the batch
    /// over the team: the same products as an f64 reference.
    #[test]
    fn batched_broadcast_and_strided_products_match_the_reference_on_every_path() {
        let d = Device::Cpu;
        let mut g = Generator::new(7);
        let mut r = |shape: &[usize]| Tensor::randn_with(shape, DType::F32, &d, &mut g).unwrap();
        let cases: Vec<(&str, Tensor, Tensor)> = vec![
            ("broadcast both", r(&[2, 1, 17, 65]), r(&[3, 65, 63])),
            (
                "transposed a, strided b",
                r(&[4, 65, 17]).transpose(-1, -2).unwrap(),
                r(&[4, 65, 130]).slice(-1, 0, 130, 2).unwrap(),
            ),
            ("attention scores", r(&[6, 63, 64]), r(&[6, 63, 64]).transpose(-1, -2).unwrap()),
            ("expanded b, odd sizes", r(&[5, 3, 257]), r(&[1, 257, 1]).expand(&[5, 257, 1]).unwrap()),
            ("batch of one", r(&[1, 65, 3]), r(&[1, 3, 255])),
        ];
        let strategies = [
            None,
            Some(Strategy::Small { threads: 1 }),
            Some(Strategy::Small { threads: 2 }),
            Some(Strategy::Packed { threads: 1 }),
            Some(Strategy::Packed { threads: 2 }),
        ];
        for isa in Isa::ALL {
            if !isa.supported() {
                eprintln!("SKIPPED: {isa:?} kernels (this CPU lacks the instructions)");
                continue;
            }
            for (name, a, b) in &cases {
                let (shape, want, scale) = reference(a, b);
                let k = a.shape()[a.rank() - 1];
                for strategy in strategies {
                    for spread in [None, Some(true), Some(false)] {
                        let got = with_forced(Forced { isa, strategy, spread }, || a.matmul(b).unwrap());
                        assert_eq!(got.shape(), &shape[..], "{name}");
                        for (i, (x, (y, s))) in
                            got.to_vec::<f32>().unwrap().iter().zip(want.iter().zip(&scale)).enumerate()
                        {
                            let tol = 2.0 * (k as f64 + 1.0) * f32::EPSILON as f64 * s + 1e-30;
                            assert!(
                                (*x as f64 - y).abs() <= tol,
                                "{name} {isa:?} {strategy:?} spread {spread:?} at {i}: {x} vs {y}"
                            );
                        }
                    }
                }
            }
        }
    }
}
