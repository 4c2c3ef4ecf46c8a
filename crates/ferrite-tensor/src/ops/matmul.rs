//! Matrix products: f32 on AVX-512 CPUs through ferrite's own packed GEMM (`kernels/gemm.rs`),
//! everything else through faer's (the choice was measured, see BENCHMARKS.md, "Tensors").
//!
//! f32/f64 run natively with arbitrary strides (transposed operands need no copy). f16/bf16
//! inputs are widened to f32 scratch tensors from the device allocator, multiplied in f32 and
//! rounded once — the documented "computes in f32 internally" contract. Under autocast, float32
//! inputs are cast to the autocast dtype first.

use std::borrow::Cow;

use faer::{Accum, MatMut, MatRef, Par};
use smallvec::SmallVec;

use crate::autograd::{BackwardFn, SavedTensor};
use crate::error::{Result, TensorError};
use crate::kernels::gemm;
use crate::layout::{broadcast_shapes, Layout, Shape};
use crate::ops::check_same_device;
use crate::ops::copy::materialize;
use crate::{DType, Tensor};

/// From this many multiply-adds on, f32 products use the packed AVX-512 kernel
/// (`kernels::gemm`); smaller ones and other dtypes go to faer.
const OWN_GEMM_FLOPS: usize = 32 * 32 * 32;

/// Below this many multiply-adds a product runs on the calling thread.
const PAR_FLOPS: usize = 48 * 48 * 48;

fn par_for(m: usize, n: usize, k: usize) -> Par {
    let threads = rayon::current_num_threads();
    if m.saturating_mul(n).saturating_mul(k) < PAR_FLOPS || threads <= 1 {
        Par::Seq
    } else {
        Par::rayon(threads)
    }
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
    if out.dtype() == DType::F32 && k > 0 && m.saturating_mul(n).saturating_mul(k) >= OWN_GEMM_FLOPS && gemm::available() {
        let ap = a.storage_base_ptr::<f32>("matmul")?;
        let bp = b.storage_base_ptr::<f32>("matmul")?;
        let cp = out.ptr::<f32>("matmul")?;
        let threads = crate::kernels::team::threads();
        for_each_batch(&al, &bl, batch, |bi, ao, bo| {
            // SAFETY: offsets/strides come from layouts validated against their storages; the
            // output is a fresh contiguous buffer distinct from both inputs; AVX-512 checked.
            unsafe {
                let am = gemm::MatPtr { ptr: ap.add(ao), rs: al.strides[nbd] as isize, cs: al.strides[nbd + 1] as isize };
                let bm = gemm::MatPtr { ptr: bp.add(bo), rs: bl.strides[nbd] as isize, cs: bl.strides[nbd + 1] as isize };
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

/// Product of `a [.., m, k]` and `b [.., k, n]` (ranks ≥ 2) without autograd.
pub(crate) fn matmul_raw(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    check_same_device("matmul", a, b)?;
    let (ra, rb) = (a.rank(), b.rank());
    let (m, k) = (a.shape()[ra - 2], a.shape()[ra - 1]);
    let (k2, n) = (b.shape()[rb - 2], b.shape()[rb - 1]);
    if k != k2 {
        return Err(TensorError::shape("matmul", format!("mat1 and mat2 shapes cannot be multiplied ({m}x{k} and {k2}x{n}); full shapes {:?} and {:?}", a.shape(), b.shape())));
    }
    if a.dtype() != b.dtype() {
        return Err(TensorError::DTypeMismatch { op: "matmul", detail: format!("expected both operands to have the same dtype, but got {} and {}", a.dtype(), b.dtype()) });
    }
    let dtype = a.dtype();
    if !dtype.is_floating_point() {
        return Err(TensorError::UnsupportedDType { op: "matmul", dtype });
    }
    let batch = broadcast_shapes(&a.shape()[..ra - 2], &b.shape()[..rb - 2], "matmul")?;
    let mut out_shape: Shape = batch.clone();
    out_shape.push(m);
    out_shape.push(n);
    // Fold a batched `a` against a plain matrix `b` into one big GEMM when a's rows merge.
    if rb == 2 && ra > 2 {
        let rows: usize = a.shape()[..ra - 1].iter().product();
        if let Some(l2) = a.layout().view(&[rows, k]) {
            let o = matmul_raw(&a.view_with_layout(l2), b)?;
            return Ok(o.view_with_layout(Layout::contiguous(&out_shape)));
        }
    }
    let (a32, b32) = if matches!(dtype, DType::F16 | DType::BF16) { (materialize(a, DType::F32)?, materialize(b, DType::F32)?) } else { (a.clone(), b.clone()) };
    let compute = a32.dtype();
    let out = a.empty_like_shape(&out_shape, compute)?;
    if !out.is_meta() {
        bmm_kernel(&a32, &b32, &out, &batch)?;
    }
    drop((a32, b32));
    if compute != dtype {
        return materialize(&out, dtype);
    }
    Ok(out)
}

struct MatmulBackward {
    a: SavedTensor,
    b: SavedTensor,
    need: [bool; 2],
}

impl BackwardFn for MatmulBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("MmBackward0")
    }
    fn backward(&mut self, g: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let Some(g) = &g[0] else { return Ok(vec![None, None]) };
        let a = self.a.get("MmBackward0")?;
        let b = self.b.get("MmBackward0")?;
        let g = if g.dtype() != a.dtype() { materialize(g, a.dtype())? } else { g.clone() };
        let ga = if self.need[0] {
            let bt = b.view_with_layout(b.layout().transpose(b.rank() - 2, b.rank() - 1));
            let r = matmul_raw(&g, &bt)?;
            Some(r.sum_to_shape(a.shape())?)
        } else {
            None
        };
        let gb = if self.need[1] {
            let at = a.view_with_layout(a.layout().transpose(a.rank() - 2, a.rank() - 1));
            // For a batchless b, fold the batch into the reduction: a^T [k, B*m] @ g [B*m, n].
            let r = if b.rank() == 2 && a.rank() > 2 {
                let ra = a.rank();
                let rows: usize = a.shape()[..ra - 1].iter().product();
                match (a.layout().view(&[rows, a.shape()[ra - 1]]), g.layout().view(&[rows, g.shape()[g.rank() - 1]])) {
                    (Some(la), Some(lg)) => {
                        let a2 = a.view_with_layout(la);
                        let a2t = a2.view_with_layout(a2.layout().transpose(0, 1));
                        matmul_raw(&a2t, &g.view_with_layout(lg))?
                    }
                    _ => matmul_raw(&at, &g)?.sum_to_shape(b.shape())?,
                }
            } else {
                matmul_raw(&at, &g)?.sum_to_shape(b.shape())?
            };
            Some(r)
        } else {
            None
        };
        Ok(vec![ga, gb])
    }
}

impl Tensor {
    /// Matrix product with PyTorch's `matmul` semantics: 1-D·1-D dot, 2-D·2-D, matrix-vector,
    /// and batched products with broadcast batch dimensions.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        if self.rank() == 0 || other.rank() == 0 {
            return Err(TensorError::shape("matmul", format!("both arguments to matmul need to be at least 1D, but they are {}D and {}D", self.rank(), other.rank())));
        }
        let low = crate::autocast::lower(promote_float(self.dtype(), other.dtype()));
        let a = if self.dtype() != low { self.to_dtype(low)? } else { self.clone() };
        let b = if other.dtype() != low { other.to_dtype(low)? } else { other.clone() };
        let a2 = if a.rank() == 1 { a.unsqueeze(0)? } else { a.clone() };
        let b2 = if b.rank() == 1 { b.unsqueeze(-1)? } else { b.clone() };
        let out = matmul_raw(&a2, &b2)?;
        let out = if Tensor::needs_graph(&[&a2, &b2]) {
            Tensor::from_op1(out, &[&a2, &b2], MatmulBackward { a: SavedTensor::new(&a2), b: SavedTensor::new(&b2), need: [a2.requires_grad(), b2.requires_grad()] })
        } else {
            out
        };
        let out = if b.rank() == 1 { out.squeeze(-1)? } else { out };
        let out = if a.rank() == 1 { out.squeeze(if b.rank() == 1 { -1 } else { -2 })? } else { out };
        Ok(out)
    }

    /// `self @ other^T + bias` with PyTorch's `linear` layout (weight is `[out, in]`).
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        if weight.rank() != 2 {
            return Err(TensorError::shape("linear", format!("weight must be 2-D [out_features, in_features], got {:?}", weight.shape())));
        }
        let y = self.matmul(&weight.t()?)?;
        match bias {
            Some(b) => {
                let b = if b.dtype() != y.dtype() { b.to_dtype(y.dtype())? } else { b.clone() };
                y.add(&b)
            }
            None => Ok(y),
        }
    }
}

fn promote_float(a: DType, b: DType) -> DType {
    let p = crate::ops::promote_types(a, b);
    if p.is_floating_point() { p } else { DType::F32 }
}
