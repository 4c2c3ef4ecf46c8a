//! Batch, group and RMS norm on the GPU, and layer norm's backward, with the formulas of the CPU
//! kernels (`backend/cpu/batch_norm.rs`, `group_norm.rs`, `rms_norm.rs`, `norm.rs`) in f32.
//!
//! One workgroup per reduction unit — a channel (batch norm), a `(sample, group)` (group norm),
//! a row (RMS norm) — reduces its values in one pass and then writes its outputs from the
//! statistics it holds in registers, so a forward is one dispatch that reads the input twice.
//! The one-pass sums are *shifted* by the unit's first value (`Σ(x - k)`, `Σ(x - k)²`), which
//! keeps the f32 variance accurate when the mean is large against the spread. Parameter
//! gradients that sum across units (group norm's weight, RMS norm's weight) are a second
//! dispatch over channels or columns. Layer norm's forward is a row kernel of `reduce.rs`; its
//! backward here is one dispatch for `dx` (a workgroup per row) and two for the weight and bias
//! gradients (column sums per chunk of rows, then over the chunks, both in a fixed order), where
//! it used to be about a dozen composed tensor ops. The GPU has no f64, so where the CPU keeps
//! f64 partials these stay f32; the orders are fixed by the shape, so the bits repeat.

use super::plane_kernel::{PlaneKernel, groups_for, opt_ld};
use super::runtime::{Runtime, read, write};
use super::wgsl;
use crate::backend::{
    BatchNormArgs, BatchNormBackwardArgs, BatchNormStats, GroupNormArgs, GroupNormBackwardArgs, LayerNormBackwardArgs,
    LayerNormGrads, RmsNormArgs, RmsNormBackwardArgs, ncs, rows_cols,
};
use crate::error::Result;
use crate::{DType, Tensor};

/// Accumulate shifted sums of `value(e)` over `i in 0..count`, where `index` maps `i` to the
/// element `e`, into `red`/`red2`, and leave `k0` (the shift: the value at element `first`)
/// defined.
fn shifted_sums(count: &str, index: &str, first: &str, value: impl Fn(&str) -> String) -> String {
    let (at_first, at_e) = (value(first), value("e"));
    format!(
        "  var a1 = 0.0;\n  var a2 = 0.0;\n  let k0 = select(0.0, {at_first}, {count} > 0u);\n  for (var i = lid; i < {count}; i = i + 256u) {{ let e = {index}; let d = {at_e} - k0; a1 = a1 + d; a2 = a2 + d * d; }}\n  red[lid] = a1;\n  red2[lid] = a2;\n  workgroupBarrier();\n  tree2(lid);\n"
    )
}

pub(super) fn batch_norm(rt: &Runtime, a: &BatchNormArgs<'_>) -> Result<()> {
    let (n, c, s) = ncs(a.x);
    let batch = matches!(a.params, BatchNormStats::Batch { .. });
    let mut k = PlaneKernel::new("batch_norm", "");
    k.operand(write(a.y));
    k.operand(read(a.x));
    let stat = |t| if batch { write(t) } else { read(t) };
    k.operand(stat(a.mean));
    k.operand(stat(a.rstd));
    let wi = k.optional(a.weight.map(read));
    let bi = k.optional(a.bias.map(read));
    let (eps, running) = match a.params {
        BatchNormStats::Batch { eps, running } => (eps, running),
        BatchNormStats::Given => (0.0, None),
    };
    let rm = k.optional(running.map(|r| write(r.mean)));
    let rv = k.optional(running.map(|r| write(r.var)));
    k.scalars(&[
        n as u32,
        c as u32,
        s as u32,
        (eps as f32).to_bits(),
        (running.map_or(0.0, |r| r.factor) as f32).to_bits(),
    ]);
    let index = "(i / s * c + ch) * s + i % s";
    let mut b = String::from(
        "  let n = sc(0u);\n  let c = sc(1u);\n  let s = sc(2u);\n  let cnt = n * s;\n  let ch = gid;\n  if (ch >= c) { return; }\n",
    );
    if batch {
        b.push_str(&shifted_sums("cnt", index, "ch * s", |e| format!("ldf1(at(1u, {e}))")));
        b.push_str(
            "  let fc = f32(cnt);\n  let md = red[0] / fc;\n  let mu = k0 + md;\n  let var_b = max(red2[0] / fc - md * md, 0.0);\n  let inv = 1.0 / sqrt(var_b + scf(3u));\n  if (lid == 0u) {\n    stf2(at(2u, ch), mu);\n    stf3(at(3u, ch), inv);\n",
        );
        if let (Some(m), Some(v)) = (rm, rv) {
            b.push_str(&format!(
                "    let f = scf(4u);\n    stf{m}(at({m}u, ch), (1.0 - f) * ldf{m}(at({m}u, ch)) + f * mu);\n    stf{v}(at({v}u, ch), (1.0 - f) * ldf{v}(at({v}u, ch)) + f * var_b * fc / (fc - 1.0));\n"
            ));
        }
        b.push_str("  }\n");
    } else {
        b.push_str("  let mu = ldf2(at(2u, ch));\n  let inv = ldf3(at(3u, ch));\n");
    }
    b.push_str(&format!(
        "  let a = inv * {};\n  let sh = {} - mu * a;\n  for (var i = lid; i < cnt; i = i + 256u) {{ let e = {index}; stf0(at(0u, e), ldf1(at(1u, e)) * a + sh); }}\n",
        opt_ld(wi, "ch", "1.0"),
        opt_ld(bi, "ch", "0.0")
    ));
    k.run(rt, c, "", &b)
}

pub(super) fn batch_norm_backward(rt: &Runtime, a: &BatchNormBackwardArgs<'_>) -> Result<()> {
    let (n, c, s) = ncs(a.x);
    let mut k = PlaneKernel::new("batch_norm_backward", format!("{}", a.params.batch_stats));
    k.operand(read(a.grad_output));
    k.operand(read(a.x));
    k.operand(read(a.mean));
    k.operand(read(a.rstd));
    let wi = k.optional(a.weight.map(read));
    let gi = k.optional(a.grad_input.map(write));
    let gw = k.optional(a.grad_weight.map(write));
    let gb = k.optional(a.grad_bias.map(write));
    k.scalars(&[n as u32, c as u32, s as u32]);
    let index = "(i / s * c + ch) * s + i % s";
    let mut b = format!(
        "  let n = sc(0u);\n  let c = sc(1u);\n  let s = sc(2u);\n  let cnt = n * s;\n  let ch = gid;\n  if (ch >= c) {{ return; }}\n  let mu = ldf2(at(2u, ch));\n  let inv = ldf3(at(3u, ch));\n  var a1 = 0.0;\n  var a2 = 0.0;\n  for (var i = lid; i < cnt; i = i + 256u) {{ let e = {index}; let g = ldf0(at(0u, e)); a1 = a1 + g; a2 = a2 + g * (ldf1(at(1u, e)) - mu); }}\n  red[lid] = a1;\n  red2[lid] = a2;\n  workgroupBarrier();\n  tree2(lid);\n  let sdy = red[0];\n  let sdx = red2[0];\n  if (lid == 0u) {{\n"
    );
    if let Some(gw) = gw {
        b.push_str(&format!("    stf{gw}(at({gw}u, ch), sdx * inv);\n"));
    }
    if let Some(gb) = gb {
        b.push_str(&format!("    stf{gb}(at({gb}u, ch), sdy);\n"));
    }
    b.push_str("  }\n");
    if let Some(gi) = gi {
        b.push_str(&format!("  let p = inv * {};\n", opt_ld(wi, "ch", "1.0")));
        let dx = if a.params.batch_stats {
            b.push_str("  let fc = f32(cnt);\n  let mdy = sdy / fc;\n  let kk = sdx * inv * inv / fc;\n");
            "(ldf0(at(0u, e)) - mdy - (ldf1(at(1u, e)) - mu) * kk) * p"
        } else {
            "ldf0(at(0u, e)) * p"
        };
        b.push_str(&format!(
            "  for (var i = lid; i < cnt; i = i + 256u) {{ let e = {index}; stf{gi}(at({gi}u, e), {dx}); }}\n"
        ));
    }
    k.run(rt, c, "", &b)
}

pub(super) fn group_norm(rt: &Runtime, a: &GroupNormArgs<'_>) -> Result<()> {
    let (n, c, s) = ncs(a.x);
    let g = a.params.groups.max(1);
    let mut k = PlaneKernel::new("group_norm", "");
    k.operand(write(a.y));
    k.operand(write(a.mean));
    k.operand(write(a.rstd));
    k.operand(read(a.x));
    let wi = k.optional(a.weight.map(read));
    let bi = k.optional(a.bias.map(read));
    k.scalars(&[n as u32, c as u32, s as u32, g as u32, (a.params.eps as f32).to_bits()]);
    let mut b = String::from(
        "  let c = sc(1u);\n  let s = sc(2u);\n  let groups = sc(3u);\n  let d = c / groups;\n  let len = d * s;\n  let grp = gid;\n  if (grp >= sc(0u) * groups) { return; }\n  let base = grp * len;\n",
    );
    b.push_str(&shifted_sums("len", "base + i", "base", |e| format!("ldf3(at(3u, {e}))")));
    b.push_str(&format!(
        "  let fl = f32(len);\n  let md = red[0] / fl;\n  let mu = k0 + md;\n  let rs = 1.0 / sqrt(max(red2[0] / fl - md * md, 0.0) + scf(4u));\n  if (lid == 0u) {{ stf1(at(1u, grp), mu); stf2(at(2u, grp), rs); }}\n  let first = (grp % groups) * d;\n  for (var i = lid; i < len; i = i + 256u) {{ let ch = first + i / s; let a = rs * {}; stf0(at(0u, base + i), ldf3(at(3u, base + i)) * a + ({} - mu * a)); }}\n",
        opt_ld(wi, "ch", "1.0"),
        opt_ld(bi, "ch", "0.0")
    ));
    k.run(rt, n * g, "", &b)
}

pub(super) fn group_norm_backward(rt: &Runtime, a: &GroupNormBackwardArgs<'_>) -> Result<()> {
    let (n, c, s) = ncs(a.x);
    let g = a.params.groups.max(1);
    let scalars = [n as u32, c as u32, s as u32, g as u32];
    let head =
        "  let n = sc(0u);\n  let c = sc(1u);\n  let s = sc(2u);\n  let groups = sc(3u);\n  let d = c / groups;\n";
    if let Some(gi) = a.grad_input {
        let mut k = PlaneKernel::new("group_norm_backward", "dx");
        k.operand(write(gi));
        k.operand(read(a.grad_output));
        k.operand(read(a.x));
        k.operand(read(a.mean));
        k.operand(read(a.rstd));
        let wi = k.optional(a.weight.map(read));
        k.scalars(&scalars);
        let w = opt_ld(wi, "first + i / s", "1.0");
        let b = format!(
            "{head}  let len = d * s;\n  let grp = gid;\n  if (grp >= n * groups) {{ return; }}\n  let base = grp * len;\n  let first = (grp % groups) * d;\n  let mu = ldf3(at(3u, grp));\n  let rs = ldf4(at(4u, grp));\n  var a1 = 0.0;\n  var a2 = 0.0;\n  for (var i = lid; i < len; i = i + 256u) {{ let gw = ldf1(at(1u, base + i)) * {w}; a1 = a1 + gw * ldf2(at(2u, base + i)); a2 = a2 + gw; }}\n  red[lid] = a1;\n  red2[lid] = a2;\n  workgroupBarrier();\n  tree2(lid);\n  let scale = 1.0 / f32(len);\n  let c2 = (red2[0] * mu - red[0]) * rs * rs * rs * scale;\n  let c3 = -c2 * mu - red2[0] * rs * scale;\n  for (var i = lid; i < len; i = i + 256u) {{ stf0(at(0u, base + i), rs * {w} * ldf1(at(1u, base + i)) + c2 * ldf2(at(2u, base + i)) + c3); }}\n"
        );
        k.run(rt, n * g, "", &b)?;
    }
    if a.grad_weight.is_some() || a.grad_bias.is_some() {
        let mut k = PlaneKernel::new("group_norm_backward", "dw");
        k.operand(read(a.grad_output));
        k.operand(read(a.x));
        k.operand(read(a.mean));
        k.operand(read(a.rstd));
        let gw = k.optional(a.grad_weight.map(write));
        let gb = k.optional(a.grad_bias.map(write));
        k.scalars(&scalars);
        let mut b = format!(
            "{head}  let ch = gid;\n  if (ch >= c) {{ return; }}\n  let grp_in = ch / d;\n  var a1 = 0.0;\n  var a2 = 0.0;\n  for (var i = lid; i < n * s; i = i + 256u) {{ let ni = i / s; let e = (ni * c + ch) * s + i % s; let st = ni * groups + grp_in; let gv = ldf0(at(0u, e)); a1 = a1 + gv * (ldf1(at(1u, e)) - ldf2(at(2u, st))) * ldf3(at(3u, st)); a2 = a2 + gv; }}\n  red[lid] = a1;\n  red2[lid] = a2;\n  workgroupBarrier();\n  tree2(lid);\n  if (lid == 0u) {{\n"
        );
        if let Some(gw) = gw {
            b.push_str(&format!("    stf{gw}(at({gw}u, ch), red[0]);\n"));
        }
        if let Some(gb) = gb {
            b.push_str(&format!("    stf{gb}(at({gb}u, ch), red2[0]);\n"));
        }
        b.push_str("  }\n");
        k.run(rt, c, "", &b)?;
    }
    Ok(())
}

pub(super) fn rms_norm(rt: &Runtime, a: &RmsNormArgs<'_>) -> Result<()> {
    let (rows, cols) = rows_cols(a.x);
    let mut k = PlaneKernel::new("rms_norm", "");
    k.operand(write(a.y));
    k.operand(write(a.rstd));
    k.operand(read(a.x));
    let wi = k.optional(a.weight.map(read));
    k.scalars(&[rows as u32, cols as u32, (a.eps as f32).to_bits()]);
    // PyTorch rounds the normalised value to the input dtype before the weight.
    let h = wgsl::round_expr(a.x.dtype(), "ldf2(at(2u, base + i)) * rs");
    let b = format!(
        "  let cols = sc(1u);\n  let row = gid;\n  if (row >= sc(0u)) {{ return; }}\n  let base = row * cols;\n  var a1 = 0.0;\n  for (var i = lid; i < cols; i = i + 256u) {{ let v = ldf2(at(2u, base + i)); a1 = a1 + v * v; }}\n  red[lid] = a1;\n  red2[lid] = 0.0;\n  workgroupBarrier();\n  tree2(lid);\n  let rs = 1.0 / sqrt(red[0] / f32(cols) + scf(2u));\n  if (lid == 0u) {{ stf1(at(1u, row), rs); }}\n  for (var i = lid; i < cols; i = i + 256u) {{ stf0(at(0u, base + i), {h} * {}); }}\n",
        opt_ld(wi, "i", "1.0")
    );
    k.run(rt, rows, "", &b)
}

pub(super) fn rms_norm_backward(rt: &Runtime, a: &RmsNormBackwardArgs<'_>) -> Result<()> {
    let (rows, cols) = rows_cols(a.x);
    if let Some(gi) = a.grad_input {
        let mut k = PlaneKernel::new("rms_norm_backward", "dx");
        k.operand(write(gi));
        k.operand(read(a.grad_output));
        k.operand(read(a.x));
        k.operand(read(a.rstd));
        let wi = k.optional(a.weight.map(read));
        k.scalars(&[rows as u32, cols as u32]);
        let w = opt_ld(wi, "i", "1.0");
        let b = format!(
            "  let cols = sc(1u);\n  let row = gid;\n  if (row >= sc(0u)) {{ return; }}\n  let base = row * cols;\n  let rs = ldf3(at(3u, row));\n  var a1 = 0.0;\n  for (var i = lid; i < cols; i = i + 256u) {{ a1 = a1 + ldf1(at(1u, base + i)) * {w} * ldf2(at(2u, base + i)); }}\n  red[lid] = a1;\n  red2[lid] = 0.0;\n  workgroupBarrier();\n  tree2(lid);\n  let kk = rs * rs * rs * red[0] / f32(cols);\n  for (var i = lid; i < cols; i = i + 256u) {{ stf0(at(0u, base + i), rs * ldf1(at(1u, base + i)) * {w} - ldf2(at(2u, base + i)) * kk); }}\n"
        );
        k.run(rt, rows, "", &b)?;
    }
    if let Some(gw) = a.grad_weight {
        let mut k = PlaneKernel::new("rms_norm_backward", "dw");
        k.operand(write(gw));
        k.operand(read(a.grad_output));
        k.operand(read(a.x));
        k.operand(read(a.rstd));
        k.scalars(&[rows as u32, cols as u32]);
        let b = "  let cols = sc(1u);\n  let col = gid * 256u + lid;\n  if (col >= cols) { return; }\n  var acc = 0.0;\n  for (var r = 0u; r < sc(0u); r = r + 1u) { acc = acc + ldf1(at(1u, r * cols + col)) * ldf2(at(2u, r * cols + col)) * ldf3(at(3u, r)); }\n  stf0(at(0u, col), acc);\n";
        k.run(rt, groups_for(cols), "", b)?;
    }
    Ok(())
}

/// Rows per partial of layer norm's weight and bias gradients: the first kernel sums each
/// column over a chunk of this many rows, in row order; the second adds the chunks' partials in
/// chunk order. Both orders follow from the shape alone, so the bits repeat run to run.
const LN_ROW_CHUNK: usize = 64;

/// Layer norm's gradients (see [`LayerNormBackwardArgs`]): `dx` with one workgroup per row, which
/// reduces `Σ dy·w` and `Σ dy·w·x̂` over the row with a fixed tree and then writes the row; the
/// weight and bias gradients as column sums in two kernels (per chunk of [`LN_ROW_CHUNK`] rows,
/// then over chunks). Everything accumulates in f32. `None` (the caller composes the gradients
/// from tensor ops) for operands this launch shape does not take: dtypes other than f32, f16 and
/// bf16, statistics that are not f32 or not one per row, non-contiguous operands, or more
/// elements than a `u32` index reaches.
pub(super) fn layer_norm_backward(rt: &Runtime, a: &LayerNormBackwardArgs<'_>) -> Result<Option<LayerNormGrads>> {
    let (rows, cols) = rows_cols(a.x);
    let float = |t: &Tensor| matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) && t.is_contiguous();
    let stats = |t: &Tensor| t.dtype() == DType::F32 && t.is_contiguous() && t.numel() == rows;
    if rows.saturating_mul(cols) > u32::MAX as usize
        || !float(a.x)
        || !float(a.grad_output)
        || a.grad_output.numel() != rows * cols
        || !a.weight.is_none_or(|w| float(w) && w.numel() == cols)
        || !stats(a.mean)
        || !stats(a.rstd)
    {
        return Ok(None);
    }
    let grads = a.outputs()?;
    if cols == 0 {
        return Ok(Some(grads));
    }
    if let Some(gi) = &grads.input {
        let mut k = PlaneKernel::new("layer_norm_backward", "dx");
        k.operand(write(gi));
        k.operand(read(a.grad_output));
        k.operand(read(a.x));
        k.operand(read(a.mean));
        k.operand(read(a.rstd));
        let wi = k.optional(a.weight.map(read));
        k.scalars(&[rows as u32, cols as u32]);
        let w = opt_ld(wi, "i", "1.0");
        let b = format!(
            "  let cols = sc(1u);\n  let row = gid;\n  if (row >= sc(0u)) {{ return; }}\n  let base = row * cols;\n  let mu = ldf3(at(3u, row));\n  let rs = ldf4(at(4u, row));\n  var a1 = 0.0;\n  var a2 = 0.0;\n  for (var i = lid; i < cols; i = i + 256u) {{ let gw = ldf1(at(1u, base + i)) * {w}; a1 = a1 + gw; a2 = a2 + gw * ((ldf2(at(2u, base + i)) - mu) * rs); }}\n  red[lid] = a1;\n  red2[lid] = a2;\n  workgroupBarrier();\n  tree2(lid);\n  let inv_n = 1.0 / f32(cols);\n  let mg = red[0] * inv_n;\n  let mgx = red2[0] * inv_n;\n  for (var i = lid; i < cols; i = i + 256u) {{ let xh = (ldf2(at(2u, base + i)) - mu) * rs; stf0(at(0u, base + i), rs * (ldf1(at(1u, base + i)) * {w} - mg - xh * mgx)); }}\n"
        );
        k.run(rt, rows, "", &b)?;
    }
    if grads.weight.is_some() || grads.bias.is_some() {
        let chunks = rows.div_ceil(LN_ROW_CHUNK).max(1);
        let blocks = groups_for(cols);
        // Per chunk and column: Σ dy·x̂ in [0, chunks), Σ dy in [chunks, 2·chunks).
        let parts = Tensor::empty_with(a.x.storage().allocator(), &[2, chunks, cols], DType::F32)?;
        let mut k = PlaneKernel::new("layer_norm_backward", "dw_chunks");
        k.operand(write(&parts));
        k.operand(read(a.grad_output));
        k.operand(read(a.x));
        k.operand(read(a.mean));
        k.operand(read(a.rstd));
        k.scalars(&[rows as u32, cols as u32, chunks as u32, blocks as u32, LN_ROW_CHUNK as u32]);
        let b = "  let rows = sc(0u);\n  let cols = sc(1u);\n  let chunks = sc(2u);\n  let blocks = sc(3u);\n  if (gid >= chunks * blocks) { return; }\n  let chunk = gid / blocks;\n  let col = (gid % blocks) * 256u + lid;\n  if (col >= cols) { return; }\n  let r0 = chunk * sc(4u);\n  let r1 = min(rows, r0 + sc(4u));\n  var sw = 0.0;\n  var sb = 0.0;\n  for (var r = r0; r < r1; r = r + 1u) { let e = r * cols + col; let g = ldf1(at(1u, e)); sw = sw + g * ((ldf2(at(2u, e)) - ldf3(at(3u, r))) * ldf4(at(4u, r))); sb = sb + g; }\n  stf0(at(0u, chunk * cols + col), sw);\n  stf0(at(0u, (chunks + chunk) * cols + col), sb);\n";
        k.run(rt, chunks * blocks, "", b)?;
        // The key names the gradients written: weight alone and bias alone have the same operands.
        let key = format!("dw_sum|{}|{}", grads.weight.is_some(), grads.bias.is_some());
        let mut k = PlaneKernel::new("layer_norm_backward", key);
        k.operand(read(&parts));
        let gw = k.optional(grads.weight.as_ref().map(write));
        let gb = k.optional(grads.bias.as_ref().map(write));
        k.scalars(&[cols as u32, chunks as u32]);
        let mut b = String::from(
            "  let cols = sc(0u);\n  let chunks = sc(1u);\n  let col = gid * 256u + lid;\n  if (col >= cols) { return; }\n  var sw = 0.0;\n  var sb = 0.0;\n  for (var c = 0u; c < chunks; c = c + 1u) { sw = sw + ldf0(at(0u, c * cols + col)); sb = sb + ldf0(at(0u, (chunks + c) * cols + col)); }\n",
        );
        if let Some(gw) = gw {
            b.push_str(&format!("  stf{gw}(at({gw}u, col), sw);\n"));
        }
        if let Some(gb) = gb {
            b.push_str(&format!("  stf{gb}(at({gb}u, col), sb);\n"));
        }
        k.run(rt, blocks, "", &b)?;
    }
    Ok(Some(grads))
}
