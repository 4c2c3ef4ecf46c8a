//! CPU matrix products: f32 on AVX-512 CPUs through ferrite's own packed GEMM (`kernels/gemm.rs`),
//! everything else through faer's (the choice was measured, see BENCHMARKS.md, "Tensors").

use faer::{Accum, MatMut, MatRef, Par};
use smallvec::SmallVec;

use crate::error::{Result, TensorError};
use crate::kernels::gemm;
use crate::layout::Layout;
use crate::{DType, Tensor};

pub(super) fn matmul(out: &Tensor, a: &Tensor, b: &Tensor, batch: &[usize]) -> Result<()> {
    bmm_kernel(a, b, out, batch)
}

/// From this many multiply-adds on, f32 products use the packed AVX-512 kernel
/// (`kernels::gemm`); smaller ones and other dtypes go to faer.
const OWN_GEMM_FLOPS: usize = 32 * 32 * 32;

/// Below this many multiply-adds a product runs on the calling thread.
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

/// Batched product of `a [.., m, k]` and `b [.., k, n]` (batch dims already broadcast in the
/// layouts) into the fresh contiguous `out [.., m, n]`. Same dtype, f32 or f64.
fn bmm_kernel(a: &Tensor, b: &Tensor, out: &Tensor, batch: &[usize]) -> Result<()> {
    let r = out.rank();
    let (m, n) = (out.shape()[r - 2], out.shape()[r - 1]);
    let k = a.shape()[a.rank() - 1];
    if out.numel() == 0 {
        return Ok(());
    }
    let al = a.layout().broadcast_to(&[batch, &[m, k]].concat(), "matmul")?;
    let bl = b.layout().broadcast_to(&[batch, &[k, n]].concat(), "matmul")?;
    let nbd = batch.len();
    let par = par_for(m, n, k);
    macro_rules! run {
        ($T:ty, $one:expr) => {{
            let ap = a.storage_base_ptr::<$T>("matmul")?;
            let bp = b.storage_base_ptr::<$T>("matmul")?;
            let cp = out.ptr::<$T>("matmul")?;
            if k == 0 {
                // SAFETY: fresh contiguous output of out.numel() elements.
                unsafe { std::slice::from_raw_parts_mut(cp, out.numel()).fill(0 as $T) };
                return Ok(());
            }
            for_each_batch(&al, &bl, batch, |bi, ao, bo| {
                // SAFETY: offsets/strides come from layouts validated against their storages;
                // the output is a fresh buffer distinct from both inputs.
                unsafe {
                    gemm_raw::<$T>(
                        cp.add(bi * m * n),
                        (n as isize, 1),
                        ap.add(ao),
                        (al.strides[nbd] as isize, al.strides[nbd + 1] as isize),
                        bp.add(bo),
                        (bl.strides[nbd] as isize, bl.strides[nbd + 1] as isize),
                        (m, n, k),
                        $one,
                        par,
                    );
                }
            });
        }};
    }
    if out.dtype() == DType::F32
        && k > 0
        && m.saturating_mul(n).saturating_mul(k) >= OWN_GEMM_FLOPS
        && gemm::available()
    {
        let ap = a.storage_base_ptr::<f32>("matmul")?;
        let bp = b.storage_base_ptr::<f32>("matmul")?;
        let cp = out.ptr::<f32>("matmul")?;
        let threads = crate::kernels::team::threads();
        for_each_batch(&al, &bl, batch, |bi, ao, bo| {
            // SAFETY: offsets/strides come from layouts validated against their storages; the
            // output is a fresh contiguous buffer distinct from both inputs; AVX-512 checked.
            unsafe {
                let am =
                    gemm::MatPtr { ptr: ap.add(ao), rs: al.strides[nbd] as isize, cs: al.strides[nbd + 1] as isize };
                let bm =
                    gemm::MatPtr { ptr: bp.add(bo), rs: bl.strides[nbd] as isize, cs: bl.strides[nbd + 1] as isize };
                gemm::sgemm(m, n, k, am, bm, cp.add(bi * m * n), n, threads);
            }
        });
        // No vzeroupper needed here: the kernel is a `#[target_feature]` function, and the
        // compiler emits `vzeroupper` on its return (checked by kernels/avx_state.rs's test).
        return Ok(());
    }
    match out.dtype() {
        DType::F32 => run!(f32, 1.0f32),
        DType::F64 => run!(f64, 1.0f64),
        d => return Err(TensorError::UnsupportedDType { op: "matmul", dtype: d }),
    }
    // The microkernels leave dirty AVX upper state behind (see kernels/avx_state.rs).
    if matches!(par, Par::Seq) {
        crate::kernels::avx_state::clear_upper_state_here();
    } else {
        crate::kernels::avx_state::clear_upper_state_everywhere();
    }
    Ok(())
}
