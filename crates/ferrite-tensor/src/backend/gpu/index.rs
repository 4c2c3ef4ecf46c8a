//! Indexing kernels on the GPU: row selection, gather, scatter-add (with atomic adds, so
//! duplicate indices accumulate), one-hot. An index out of range raises the device's error flag
//! (reported at the next synchronisation, like a CUDA device-side assert) and touches nothing.

use std::fmt::Write as _;

use super::runtime::{ERR_OPS, Operand, Runtime, atomic, read, write};
use super::wgsl;
use crate::error::{Result, TensorError};
use crate::{DType, Tensor};

fn code(op: &str) -> u32 {
    ERR_OPS.iter().position(|&o| o == op).unwrap_or(0) as u32
}

/// Unravel `li` over `shape` (`P[base..base+rank]`), returning the multi-index in `idx`.
const UNRAVEL: &str = "fn coord(li: u32, d: u32, rank: u32, shape_at: u32) -> u32 { var rem = li; var k = rank; loop { if (k == 0u) { break; } k = k - 1u; let sz = P[shape_at + k]; if (k == d) { return rem % sz; } rem = rem / sz; } return 0u; }\n";

/// Shared parameters of the walking kernels: n, rank, shape[rank] of the iteration space,
/// then per operand: offset, strides[rank].
fn walk_params(shape: &[usize], layouts: &[(&[usize], usize)], extra: &[u32]) -> Vec<u32> {
    let mut v = vec![shape.iter().product::<usize>() as u32, shape.len() as u32];
    v.extend(shape.iter().map(|&d| d as u32));
    for (strides, offset) in layouts {
        v.push(*offset as u32);
        v.extend(strides.iter().map(|&s| s as u32));
    }
    v.extend_from_slice(extra);
    v
}

/// WGSL helpers for [`walk_params`] with `m` operands before the parameters: `rank()`,
/// `el(k, li, skip)` (element of walked operand k at iteration index li, leaving out dim `skip`),
/// `ex(j)` extra parameter j.
fn walk_functions(m: usize, walked: usize) -> String {
    format!(
        "fn rank() -> u32 {{ return P[{m}u + 1u]; }}\n\
         fn el(k: u32, li: u32, skip: u32) -> u32 {{ let r = rank(); let base = {m}u + 2u + r + k * (r + 1u); var rem = li; var e = P[base]; var d = r; loop {{ if (d == 0u) {{ break; }} d = d - 1u; let sz = P[{m}u + 2u + d]; if (d != skip) {{ e = e + (rem % sz) * P[base + 1u + d]; }} rem = rem / sz; }} return e; }}\n\
         fn stride(k: u32, d: u32) -> u32 {{ let r = rank(); return P[{m}u + 2u + r + k * (r + 1u) + 1u + d]; }}\n\
         fn ex(j: u32) -> u32 {{ let r = rank(); return P[{m}u + 2u + r + {walked}u * (r + 1u) + j]; }}\n"
    )
}

/// Read index `raw` (already loaded), wrap negatives, check against `size`; on failure raise the
/// flag. Returns (valid, wrapped index).
const CHECK: &str = "fn wrap(raw: i32, size: u32, code: u32, dim: u32) -> vec2<u32> { var j = raw; if (j < 0) { j = j + i32(size); } if (j < 0 || u32(j) >= size) { raise(code, raw, dim, size); return vec2<u32>(0u, 0u); } return vec2<u32>(1u, u32(j)); }\n";

#[allow(clippy::too_many_arguments)]
fn launch_walk(
    rt: &Runtime,
    op: &'static str,
    key: &str,
    ops: &[Operand<'_>],
    dtypes: &[DType],
    written: &[bool],
    params: Vec<u32>,
    n: usize,
    walked: usize,
    body: &str,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let m = ops.len();
    let full = format!("{key}|{dtypes:?}");
    rt.launch(op, &full, ops, true, &params, wgsl::groups_1d(n), |plan| {
        let mut s = wgsl::header(plan);
        s.push_str(&wgsl::operands(plan, dtypes, written));
        s.push_str(&walk_functions(m, walked));
        s.push_str(UNRAVEL);
        s.push_str(CHECK);
        s.push_str(&wgsl::main_1d(&format!("{m}u"), body));
        s
    })
}

fn add_into(slot_dtype: DType, k: usize, e: &str, v: &str, plan_slot: &str) -> String {
    let _ = plan_slot;
    match slot_dtype {
        DType::F32 => format!("addf_{k}({e}, {v});"),
        _ => format!("addlane_{k}({e}, {v});"),
    }
}

/// Per-operand atomic add helpers (operand `k` written with atomics, of `dtype`).
fn atomic_add_fn(k: usize, dtype: DType, slot: usize) -> Result<String> {
    Ok(match dtype {
        DType::F32 => format!("fn addf_{k}(e: u32, v: f32) {{ addf{slot}(P[{k}] + e, v); }}\n"),
        DType::F16 => format!(
            "fn addlane_{k}(e: u32, v: f32) {{ addlane{slot}(P[{k}] + (e >> 1u), (e & 1u) * 16u, false, v); }}\n"
        ),
        DType::BF16 => format!(
            "fn addlane_{k}(e: u32, v: f32) {{ addlane{slot}(P[{k}] + (e >> 1u), (e & 1u) * 16u, true, v); }}\n"
        ),
        DType::I32 => format!("fn addlane_{k}(e: u32, v: f32) {{ addi{slot}(P[{k}] + e, i32(v)); }}\n"),
        d => return Err(TensorError::UnsupportedDType { op: "scatter_add", dtype: d }),
    })
}

pub(super) fn index_select(rt: &Runtime, out: &Tensor, x: &Tensor, d: usize, index: &Tensor) -> Result<()> {
    let size = x.shape()[d] as u32;
    let shape = out.shape().to_vec();
    // Walked operands: out (contiguous) and x (with dim d skipped: added from the index).
    let params = walk_params(
        &shape,
        &[(out.strides(), out.storage_offset()), (x.strides(), x.storage_offset())],
        &[
            d as u32,
            size,
            x.strides()[d] as u32,
            index.storage_offset() as u32,
            index.strides().first().copied().unwrap_or(1) as u32,
            code("index_select"),
        ],
    );
    let body = "  let dd = ex(0u);\n  let i = coord(li, dd, rank(), 2u + 3u);\n  let w = wrap(ldi2(ex(3u) + i * ex(4u)), ex(1u), ex(5u), dd);\n  if (w.x == 0u) { return; }\n  straw0(el(0u, li, 0xffffffffu), ldraw1(el(1u, li, dd) + w.y * ex(2u)));\n";
    let body = body.replace("2u + 3u", &format!("{}u + 2u", 3));
    launch_walk(
        rt,
        "index_select",
        "index_select",
        &[write(out), read(x), read(index)],
        &[out.dtype(), x.dtype(), index.dtype()],
        &[true, false, false],
        params,
        out.numel(),
        2,
        &body,
    )
}

pub(super) fn gather(rt: &Runtime, out: &Tensor, x: &Tensor, d: usize, idx: &Tensor) -> Result<()> {
    let size = x.shape()[d] as u32;
    let shape = idx.shape().to_vec();
    let params = walk_params(
        &shape,
        &[
            (out.strides(), out.storage_offset()),
            (x.strides(), x.storage_offset()),
            (idx.strides(), idx.storage_offset()),
        ],
        &[d as u32, size, x.strides()[d] as u32, code("gather")],
    );
    let body = "  let dd = ex(0u);\n  let w = wrap(ldi2(el(2u, li, 0xffffffffu)), ex(1u), ex(3u), dd);\n  if (w.x == 0u) { return; }\n  straw0(el(0u, li, 0xffffffffu), ldraw1(el(1u, li, dd) + w.y * ex(2u)));\n";
    launch_walk(
        rt,
        "gather",
        "gather",
        &[write(out), read(x), read(idx)],
        &[out.dtype(), x.dtype(), idx.dtype()],
        &[true, false, false],
        params,
        idx.numel(),
        3,
        body,
    )
}

/// `out[... index ...] += src[...]` walking `walk_shape` (the index's or the source's shape).
#[allow(clippy::too_many_arguments)]
fn scatter_like(
    rt: &Runtime,
    op: &'static str,
    out: &Tensor,
    dim: usize,
    idx: &Tensor,
    src: &Tensor,
    walk_shape: &[usize],
    index_is_1d: bool,
) -> Result<()> {
    let size = out.shape()[dim] as u32;
    let params = if index_is_1d {
        walk_params(
            walk_shape,
            &[(out.strides(), out.storage_offset()), (src.strides(), src.storage_offset())],
            &[
                dim as u32,
                size,
                out.strides()[dim] as u32,
                idx.storage_offset() as u32,
                idx.strides().first().copied().unwrap_or(1) as u32,
                code(op),
            ],
        )
    } else {
        walk_params(
            walk_shape,
            &[
                (out.strides(), out.storage_offset()),
                (src.strides(), src.storage_offset()),
                (idx.strides(), idx.storage_offset()),
            ],
            &[dim as u32, size, out.strides()[dim] as u32, code(op)],
        )
    };
    let dtypes = [out.dtype(), src.dtype(), idx.dtype()];
    let add = add_into(out.dtype(), 0, "el(0u, li, dd) + w.y * ex(2u)", "ldf1(el(1u, li, 0xffffffffu))", "");
    let body = if index_is_1d {
        format!(
            "  let dd = ex(0u);\n  let i = coord(li, dd, rank(), 3u + 2u);\n  let w = wrap(ldi2(ex(3u) + i * ex(4u)), ex(1u), ex(5u), dd);\n  if (w.x == 0u) {{ return; }}\n  {add}\n"
        )
    } else {
        format!(
            "  let dd = ex(0u);\n  let w = wrap(ldi2(el(2u, li, 0xffffffffu)), ex(1u), ex(3u), dd);\n  if (w.x == 0u) {{ return; }}\n  {add}\n"
        )
    };
    let walked = if index_is_1d { 2 } else { 3 };
    let key = format!("{op}|{index_is_1d}");
    let n: usize = walk_shape.iter().product();
    if n == 0 {
        return Ok(());
    }
    let ops = [atomic(out), read(src), read(idx)];
    let m = ops.len();
    let written = [true, false, false];
    let full = format!("{key}|{dtypes:?}");
    let out_dtype = out.dtype();
    let mut err = None;
    rt.launch(op, &full, &ops, true, &params, wgsl::groups_1d(n), |plan| {
        let mut s = wgsl::header(plan);
        s.push_str(&wgsl::operands(plan, &dtypes, &written));
        match atomic_add_fn(0, out_dtype, plan.slot_of[0]) {
            Ok(f) => s.push_str(&f),
            Err(e) => err = Some(e),
        }
        s.push_str(&walk_functions(m, walked));
        s.push_str(UNRAVEL);
        s.push_str(CHECK);
        s.push_str(&wgsl::main_1d(&format!("{m}u"), &body));
        s
    })?;
    err.map_or(Ok(()), Err)
}

pub(super) fn index_add(rt: &Runtime, dst: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<()> {
    atomic_add_fn(0, dst.dtype(), 0)?;
    scatter_like(rt, "index_add", dst, dim, index, src, src.shape(), true)
}

pub(super) fn scatter_add(rt: &Runtime, out: &Tensor, dim: usize, idx: &Tensor, src: &Tensor) -> Result<()> {
    atomic_add_fn(0, out.dtype(), 0)?;
    scatter_like(rt, "scatter_add", out, dim, idx, src, idx.shape(), false)
}

pub(super) fn one_hot(rt: &Runtime, out: &Tensor, index: &Tensor) -> Result<()> {
    let classes = out.shape().last().copied().unwrap_or(0) as u32;
    let dim = out.rank().saturating_sub(1) as u32;
    let n = index.numel();
    let mut params = vec![n as u32];
    params.extend([
        out.storage_offset() as u32,
        index.storage_offset() as u32,
        index.strides().first().copied().unwrap_or(1) as u32,
        classes,
        dim,
        code("one_hot"),
    ]);
    let dtypes = [out.dtype(), index.dtype()];
    if n == 0 {
        return Ok(());
    }
    let mut body = String::new();
    let _ = write!(
        body,
        "  let w = wrap(ldi1(P[4u] + li * P[5u]), P[6u], P[8u], P[7u]);\n  if (w.x == 0u) {{ return; }}\n  sti0(P[3u] + li * P[6u] + w.y, 1);\n"
    );
    rt.launch(
        "one_hot",
        &format!("one_hot|{dtypes:?}"),
        &[write(out), read(index)],
        true,
        &params,
        wgsl::groups_1d(n),
        |plan| {
            let mut s = wgsl::header(plan);
            s.push_str(&wgsl::operands(plan, &dtypes, &[true, false]));
            s.push_str(CHECK);
            s.push_str(&wgsl::main_1d("2u", &body));
            s
        },
    )
}
