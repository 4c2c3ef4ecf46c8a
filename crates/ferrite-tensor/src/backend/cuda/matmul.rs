//! Matrix products on `cuda:N` through the runtime's strided-batched GEMM (cuBLAS on a GPU):
//! the row-major `out = a @ b` is the column-major `outᵀ = bᵀ · aᵀ`, so each operand is handed
//! over as it is stored — row-major as is, a transposed view (unit row stride) with the
//! transpose flag — and the batch dimensions as one stride per operand (0 where it broadcasts).
//! An operand that fits neither (a general strided view, batch dims that do not merge into one
//! stride) is made contiguous first.
//!
//! f16 and bf16: when the output and both operands share one of them (what autocast produces),
//! the GEMM takes them as they are and accumulates in f32 (cuBLAS's `CUBLAS_COMPUTE_32F`, as
//! PyTorch's half matmul on CUDA: tensor cores, no f32 copies, the output rounded once). Mixed
//! dtypes go through f32 copies.
use ferrite_cuda::{GemmElement, GemmStridedBatched};

use super::data::copy;
use super::elementwise::{check_float, into_f32_out};
use super::launch::{Ctx, addr, merge_dims};
use crate::error::Result;
use crate::{DType, Tensor};

/// How one operand `[batch.., rows, cols]` is handed to the GEMM.
struct Operand {
    t: Tensor,
    /// Stored column-major (a transposed view): cuBLAS's transpose flag.
    col_major: bool,
    ld: usize,
    batch_stride: usize,
}

/// `t` broadcast to `batch + [rows, cols]` as a GEMM operand of `dtype`, copied to a contiguous
/// buffer of `dtype` when its layout does not fit (or its dtype differs).
fn operand(cx: Ctx<'_>, t: &Tensor, batch: &[usize], rows: usize, cols: usize, dtype: DType) -> Result<Operand> {
    let mut full: Vec<usize> = batch.to_vec();
    full.extend([rows, cols]);
    if t.dtype() == dtype {
        let l = t.layout().broadcast_to(&full, "matmul")?;
        let (rs, cs) = (l.strides[batch.len()], l.strides[batch.len() + 1]);
        let mat = if cols <= 1 || cs == 1 {
            let ld = if rows <= 1 { cols.max(1) } else { rs };
            (ld >= cols.max(1)).then_some((false, ld))
        } else if rows <= 1 || rs == 1 {
            let ld = if cols <= 1 { rows.max(1) } else { cs };
            (ld >= rows.max(1)).then_some((true, ld))
        } else {
            None
        };
        let (bs, bst) = merge_dims(batch, &[&l.strides[..batch.len()]]);
        let batch_stride = match bs.len() {
            0 => Some(0),
            1 => Some(bst[0][0]),
            _ => None,
        };
        if let (Some((col_major, ld)), Some(batch_stride)) = (mat, batch_stride) {
            return Ok(Operand { t: t.view_with_layout(l), col_major, ld, batch_stride });
        }
    }
    let c = cx.scratch(t, &full, dtype)?;
    copy(cx, &c, t)?;
    Ok(Operand { t: c, col_major: false, ld: cols.max(1), batch_stride: rows * cols })
}

pub(super) fn matmul(cx: Ctx<'_>, out: &Tensor, a: &Tensor, b: &Tensor, batch: &[usize]) -> Result<()> {
    const OP: &str = "matmul";
    check_float(OP, &[out, a, b])?;
    let r = out.rank();
    let (m, n) = (out.shape()[r - 2], out.shape()[r - 1]);
    let k = a.shape()[a.rank() - 1];
    let count: usize = batch.iter().product();
    if m == 0 || n == 0 || count == 0 {
        return Ok(());
    }
    let element = match (out.dtype(), a.dtype(), b.dtype()) {
        (DType::F16, DType::F16, DType::F16) => GemmElement::F16,
        (DType::BF16, DType::BF16, DType::BF16) => GemmElement::Bf16,
        _ => GemmElement::F32,
    };
    let dtype = match element {
        GemmElement::F16 => DType::F16,
        GemmElement::Bf16 => DType::BF16,
        GemmElement::F32 => DType::F32,
    };
    let oa = operand(cx, a, batch, m, k, dtype)?;
    let ob = operand(cx, b, batch, k, n, dtype)?;
    let gemm = |o: &Tensor| -> Result<()> {
        let g = GemmStridedBatched {
            element,
            trans_a: ob.col_major,
            trans_b: oa.col_major,
            m: n,
            n: m,
            k,
            alpha: 1.0,
            a: addr(&ob.t, OP)?,
            lda: ob.ld,
            stride_a: ob.batch_stride,
            b: addr(&oa.t, OP)?,
            ldb: oa.ld,
            stride_b: oa.batch_stride,
            beta: 0.0,
            c: addr(o, OP)?,
            ldc: n,
            stride_c: m * n,
            batch: count,
        };
        // SAFETY: every matrix the GEMM describes lies in a live tensor of this device: the
        // operands' views cover `batch + [rows, cols]` with the strides read from their layouts
        // (or are fresh contiguous copies), and `o` is the contiguous `[batch.., m, n]` output.
        unsafe { cx.rt.gemm_strided_batched(&g) }.map_err(|e| cx.fail(OP, e))
    };
    match element {
        GemmElement::F32 => into_f32_out(cx, out, gemm),
        // `out` is the contiguous `[batch.., m, n]` output of its own dtype.
        GemmElement::F16 | GemmElement::Bf16 => gemm(out),
    }
}
