//! Reductions on the GPU: one workgroup of 256 invocations per output, each invocation striding
//! over the reduced elements, then a tree in workgroup memory. Sums accumulate in f32 (the CPU
//! backend uses f64; the conformance tolerances say so). Row kernels (softmax, layer norm) take one
//! workgroup per contiguous row.

use std::fmt::Write as _;

use super::runtime::{Runtime, read, write};
use super::wgsl;
use crate::Tensor;
use crate::backend::Plan;
use crate::backend::{LayerNormArgs, LayerNormParams, rows_cols};
use crate::error::Result;

/// Parameters and index function of a plan: element of input pair (output `o`, reduced `r`) is
/// `xel(o * rn + r)`. Layout after the word bases (`m` of them): n_out, rn, rank, shape[rank],
/// offset, strides[rank], then kernel scalars at `xs(j)`.
fn plan_params(p: &Plan, n_out: usize) -> Vec<u32> {
    let l = &p.permuted;
    let mut v = vec![n_out as u32, p.rn as u32, l.shape.len() as u32];
    v.extend(l.shape.iter().map(|&d| d as u32));
    v.push(l.offset as u32);
    v.extend(l.strides.iter().map(|&s| s as u32));
    v
}

fn plan_functions(m: usize) -> String {
    format!(
        "fn prank() -> u32 {{ return P[{m}u + 2u]; }}\n\
         fn xel(li: u32) -> u32 {{ let r = prank(); var rem = li; var e = P[{m}u + 3u + r]; var d = r; loop {{ if (d == 0u) {{ break; }} d = d - 1u; let sz = P[{m}u + 3u + d]; e = e + (rem % sz) * P[{m}u + 4u + r + d]; rem = rem / sz; }} return e; }}\n\
         fn xs(j: u32) -> u32 {{ let r = prank(); return P[{m}u + 4u + 2u * r + j]; }}\n"
    )
}

const WG_MAIN: &str = "@compute @workgroup_size(256)\nfn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {\n";

pub(super) fn sum(rt: &Runtime, out: &Tensor, x: &Tensor, p: &Plan, scale: f64) -> Result<()> {
    let n_out = out.numel();
    if n_out == 0 {
        return Ok(());
    }
    if x.numel() == 0 {
        // Sums over nothing: 0 (times the mean's NaN scale).
        return super::elementwise::fill(rt, out, 0.0 * scale);
    }
    let float = x.dtype().is_floating_point();
    let mut params = plan_params(p, n_out);
    params.push((scale as f32).to_bits());
    params.push(out.storage_offset() as u32);
    let dtypes = [out.dtype(), x.dtype()];
    let key = format!("sum|{dtypes:?}|{float}");
    rt.launch("sum", &key, &[write(out), read(x)], false, &params, wgsl::groups_n(n_out), |plan| {
        let mut s = wgsl::header(plan);
        s.push_str(&wgsl::operands(plan, &dtypes, &[true, false]));
        s.push_str(&plan_functions(2));
        let (ty, zero, ld, st) = if float { ("f32", "0.0", "ldf1", "stf0(xs(1u) + o, red[0] * bitcast<f32>(xs(0u)));") } else { ("i32", "0", "ldi1", "sti0(xs(1u) + o, red[0]);") };
        let _ = writeln!(s, "var<workgroup> red: array<{ty}, 256>;");
        s.push_str(WG_MAIN);
        let _ = write!(
            s,
            "  let o = wid.y * nwg.x + wid.x;\n  if (o >= P[2u]) {{ return; }}\n  let rn = P[3u];\n  var acc: {ty} = {zero};\n  for (var r = lid; r < rn; r = r + 256u) {{ acc = acc + {ld}(xel(o * rn + r)); }}\n  red[lid] = acc;\n  workgroupBarrier();\n  for (var h = 128u; h > 0u; h = h >> 1u) {{ if (lid < h) {{ red[lid] = red[lid] + red[lid + h]; }} workgroupBarrier(); }}\n  if (lid == 0u) {{ {st} }}\n}}\n"
        );
        s
    })
}

pub(super) fn arg_extreme(
    rt: &Runtime,
    x: &Tensor,
    p: &Plan,
    values: Option<&Tensor>,
    indices: &Tensor,
    is_max: bool,
) -> Result<()> {
    let n_out = indices.numel();
    if n_out == 0 {
        return Ok(());
    }
    let mut params = plan_params(p, n_out);
    params.push(indices.storage_offset() as u32);
    params.push(values.map_or(0, |v| v.storage_offset()) as u32);
    let mut ops = vec![write(indices), read(x)];
    let mut dtypes = vec![indices.dtype(), x.dtype()];
    if let Some(v) = values {
        ops.push(write(v));
        dtypes.push(v.dtype());
    }
    let with_values = values.is_some();
    let key = format!("argext|{dtypes:?}|{is_max}");
    let written: Vec<bool> = (0..dtypes.len()).map(|k| k != 1).collect();
    rt.launch("max", &key, &ops, false, &params, wgsl::groups_n(n_out), |plan| {
        let mut s = wgsl::header(plan);
        s.push_str(&wgsl::operands(plan, &dtypes, &written));
        s.push_str(&plan_functions(ops_len(with_values)));
        let cmp = if is_max { ">" } else { "<" };
        // (value, index): NaN beats everything (first NaN wins), then the larger (smaller) value,
        // ties to the lower index. Index 0xffffffff is "none yet".
        let _ = writeln!(
            s,
            "fn better(v1: f32, i1: u32, v2: f32, i2: u32) -> bool {{ if (i2 == 0xffffffffu) {{ return i1 != 0xffffffffu; }} if (i1 == 0xffffffffu) {{ return false; }} let n1 = v1 != v1; let n2 = v2 != v2; if (n1 && n2) {{ return i1 < i2; }} if (n1) {{ return true; }} if (n2) {{ return false; }} if (v1 {cmp} v2) {{ return true; }} if (v1 == v2) {{ return i1 < i2; }} return false; }}"
        );
        s.push_str("var<workgroup> bv: array<f32, 256>;\nvar<workgroup> bi: array<u32, 256>;\n");
        s.push_str(WG_MAIN);
        let m = ops_len(with_values);
        let _ = write!(
            s,
            "  let o = wid.y * nwg.x + wid.x;\n  if (o >= P[{m}u]) {{ return; }}\n  let rn = P[{m}u + 1u];\n  var v = 0.0; var i = 0xffffffffu;\n  for (var r = lid; r < rn; r = r + 256u) {{ let x = ldf1(xel(o * rn + r)); if (better(x, r, v, i)) {{ v = x; i = r; }} }}\n  bv[lid] = v; bi[lid] = i;\n  workgroupBarrier();\n  for (var h = 128u; h > 0u; h = h >> 1u) {{ if (lid < h) {{ if (better(bv[lid + h], bi[lid + h], bv[lid], bi[lid])) {{ bv[lid] = bv[lid + h]; bi[lid] = bi[lid + h]; }} }} workgroupBarrier(); }}\n  if (lid == 0u) {{\n    let best = select(bi[0], 0u, bi[0] == 0xffffffffu);\n    sti0(xs(0u) + o, i32(best));\n"
        );
        if with_values {
            s.push_str("    straw2(xs(1u) + o, ldraw1(xel(o * rn + best)));\n");
        }
        s.push_str("  }\n}\n");
        s
    })
}

fn ops_len(with_values: bool) -> usize {
    if with_values { 3 } else { 2 }
}

pub(super) fn var(rt: &Runtime, out: &Tensor, x: &Tensor, p: &Plan, denom: f64) -> Result<()> {
    let n_out = out.numel();
    if n_out == 0 {
        return Ok(());
    }
    if x.numel() == 0 {
        return super::elementwise::fill(rt, out, f64::NAN);
    }
    let mut params = plan_params(p, n_out);
    params.push((denom as f32).to_bits());
    params.push(out.storage_offset() as u32);
    let dtypes = [out.dtype(), x.dtype()];
    let key = format!("var|{dtypes:?}");
    rt.launch("var", &key, &[write(out), read(x)], false, &params, wgsl::groups_n(n_out), |plan| {
        let mut s = wgsl::header(plan);
        s.push_str(&wgsl::operands(plan, &dtypes, &[true, false]));
        s.push_str(&plan_functions(2));
        s.push_str("var<workgroup> red: array<f32, 256>;\nvar<workgroup> mean: f32;\n");
        s.push_str(WG_MAIN);
        s.push_str(
            "  let o = wid.y * nwg.x + wid.x;\n  if (o >= P[2u]) { return; }\n  let rn = P[3u];\n  var acc = 0.0;\n  for (var r = lid; r < rn; r = r + 256u) { acc = acc + ldf1(xel(o * rn + r)); }\n  red[lid] = acc;\n  workgroupBarrier();\n  for (var h = 128u; h > 0u; h = h >> 1u) { if (lid < h) { red[lid] = red[lid] + red[lid + h]; } workgroupBarrier(); }\n  if (lid == 0u) { mean = red[0] / f32(rn); }\n  workgroupBarrier();\n  let mu = mean;\n  acc = 0.0;\n  for (var r = lid; r < rn; r = r + 256u) { let d = ldf1(xel(o * rn + r)) - mu; acc = acc + d * d; }\n  workgroupBarrier();\n  red[lid] = acc;\n  workgroupBarrier();\n  for (var h = 128u; h > 0u; h = h >> 1u) { if (lid < h) { red[lid] = red[lid] + red[lid + h]; } workgroupBarrier(); }\n  if (lid == 0u) { let dn = bitcast<f32>(xs(0u)); stf0(xs(1u) + o, select(bitcast<f32>(0x7fc00000u), red[0] / dn, dn > 0.0)); }\n}\n",
        );
        s
    })
}

/// Row kernels: rows of `cols` contiguous elements; operand k's row r starts at element
/// `P[m + 2 + k] + r * cols`.
fn row_params(rows: usize, cols: usize, ts: &[&Tensor], extra: &[u32]) -> Vec<u32> {
    let mut v = vec![rows as u32, cols as u32];
    v.extend(ts.iter().map(|t| t.storage_offset() as u32));
    v.extend_from_slice(extra);
    v
}

const ROW_MAIN: &str = "  let row = wid.y * nwg.x + wid.x;\n  if (row >= P[M]) { return; }\n  let cols = P[M + 1u];\n";

const REDUCE_SUM: &str = "fn tree_sum(lid: u32) { for (var h = 128u; h > 0u; h = h >> 1u) { if (lid < h) { red[lid] = red[lid] + red[lid + h]; } workgroupBarrier(); } }\nfn tree_max(lid: u32) { for (var h = 128u; h > 0u; h = h >> 1u) { if (lid < h) { let a = red[lid]; let b = red[lid + h]; if (b > a || b != b) { red[lid] = b; } } workgroupBarrier(); } }\n";

fn row_kernel(
    rt: &Runtime,
    op: &'static str,
    key: &str,
    ts: &[&Tensor],
    written: &[bool],
    rows: usize,
    cols: usize,
    extra: &[u32],
    body: &str,
) -> Result<()> {
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let m = ts.len();
    let params = row_params(rows, cols, ts, extra);
    let dtypes: Vec<_> = ts.iter().map(|t| t.dtype()).collect();
    let ops: Vec<_> = ts.iter().zip(written).map(|(t, &w)| if w { write(t) } else { read(t) }).collect();
    let full_key = format!("{key}|{dtypes:?}|{written:?}");
    rt.launch(op, &full_key, &ops, false, &params, wgsl::groups_n(rows), |plan| {
        let mut s = wgsl::header(plan);
        s.push_str(&wgsl::operands(plan, &dtypes, written));
        let _ = writeln!(s, "const M: u32 = {m}u;");
        let _ = writeln!(s, "fn at(k: u32, row: u32, c: u32) -> u32 {{ return P[M + 2u + k] + row * P[M + 1u] + c; }}");
        let _ = writeln!(s, "fn ex(j: u32) -> u32 {{ return P[M + 2u + {m}u + j]; }}");
        s.push_str("var<workgroup> red: array<f32, 256>;\n");
        s.push_str(REDUCE_SUM);
        s.push_str(WG_MAIN);
        s.push_str(ROW_MAIN);
        s.push_str(body);
        s.push_str("}\n");
        s
    })
}

pub(super) fn softmax(rt: &Runtime, out: &Tensor, x: &Tensor, log: bool) -> Result<()> {
    let (rows, cols) = rows_cols(x);
    let finish = if log {
        "  let lse = log(total);\n  for (var c = lid; c < cols; c = c + 256u) { stf0(at(0u, row, c), ldf1(at(1u, row, c)) - mx - lse); }\n"
    } else {
        "  let inv = 1.0 / total;\n  for (var c = lid; c < cols; c = c + 256u) { stf0(at(0u, row, c), exp(ldf1(at(1u, row, c)) - mx) * inv); }\n"
    };
    let body = format!(
        "  var m = bitcast<f32>(0xff800000u);\n  for (var c = lid; c < cols; c = c + 256u) {{ let v = ldf1(at(1u, row, c)); if (v > m || v != v) {{ m = v; }} }}\n  red[lid] = m;\n  workgroupBarrier();\n  tree_max(lid);\n  var mx = red[0];\n  if (mx == bitcast<f32>(0xff800000u)) {{ mx = 0.0; }}\n  workgroupBarrier();\n  var acc = 0.0;\n  for (var c = lid; c < cols; c = c + 256u) {{ acc = acc + exp(ldf1(at(1u, row, c)) - mx); }}\n  red[lid] = acc;\n  workgroupBarrier();\n  tree_sum(lid);\n  let total = red[0];\n{finish}"
    );
    row_kernel(
        rt,
        "softmax",
        if log { "logsoftmax" } else { "softmax" },
        &[out, x],
        &[true, false],
        rows,
        cols,
        &[],
        &body,
    )
}

pub(super) fn softmax_backward(rt: &Runtime, out: &Tensor, g: &Tensor, y: &Tensor, log: bool) -> Result<()> {
    let (rows, cols) = rows_cols(g);
    let body = if log {
        "  var acc = 0.0;\n  for (var c = lid; c < cols; c = c + 256u) { acc = acc + ldf1(at(1u, row, c)); }\n  red[lid] = acc;\n  workgroupBarrier();\n  tree_sum(lid);\n  let t = red[0];\n  for (var c = lid; c < cols; c = c + 256u) { stf0(at(0u, row, c), ldf1(at(1u, row, c)) - exp(ldf2(at(2u, row, c))) * t); }\n"
    } else {
        "  var acc = 0.0;\n  for (var c = lid; c < cols; c = c + 256u) { acc = acc + ldf1(at(1u, row, c)) * ldf2(at(2u, row, c)); }\n  red[lid] = acc;\n  workgroupBarrier();\n  tree_sum(lid);\n  let t = red[0];\n  for (var c = lid; c < cols; c = c + 256u) { stf0(at(0u, row, c), ldf2(at(2u, row, c)) * (ldf1(at(1u, row, c)) - t)); }\n"
    };
    row_kernel(
        rt,
        "softmax_backward",
        if log { "logsoftmax_bw" } else { "softmax_bw" },
        &[out, g, y],
        &[true, false, false],
        rows,
        cols,
        &[],
        body,
    )
}

pub(super) fn layer_norm(rt: &Runtime, args: &LayerNormArgs<'_>) -> Result<()> {
    let LayerNormArgs { y, mean, rstd, x, weight: w, bias: b, params: LayerNormParams { eps } } = *args;
    let (rows, cols) = rows_cols(x);
    // Operands: 0 y, 1 mean, 2 rstd, 3 x, then weight and bias (rows of them: row 0 only).
    let mut ts: Vec<&Tensor> = vec![y, mean, rstd, x];
    let mut written = vec![true, true, true, false];
    let wi = w.map(|w| {
        ts.push(w);
        written.push(false);
        ts.len() - 1
    });
    let bi = b.map(|b| {
        ts.push(b);
        written.push(false);
        ts.len() - 1
    });
    let affine_w = wi.map_or(String::new(), |k| format!(" * ldf{k}(P[M + 2u + {k}u] + c)"));
    let affine_b = bi.map_or(String::new(), |k| format!(" + ldf{k}(P[M + 2u + {k}u] + c)"));
    let body = format!(
        "  var acc = 0.0;\n  for (var c = lid; c < cols; c = c + 256u) {{ acc = acc + ldf3(at(3u, row, c)); }}\n  red[lid] = acc;\n  workgroupBarrier();\n  tree_sum(lid);\n  let mu = red[0] / f32(cols);\n  workgroupBarrier();\n  acc = 0.0;\n  for (var c = lid; c < cols; c = c + 256u) {{ let d = ldf3(at(3u, row, c)) - mu; acc = acc + d * d; }}\n  red[lid] = acc;\n  workgroupBarrier();\n  tree_sum(lid);\n  let rs = 1.0 / sqrt(red[0] / f32(cols) + bitcast<f32>(ex(0u)));\n  for (var c = lid; c < cols; c = c + 256u) {{ stf0(at(0u, row, c), (ldf3(at(3u, row, c)) - mu) * rs{affine_w}{affine_b}); }}\n  if (lid == 0u) {{ stf1(P[M + 2u + 1u] + row, mu); stf2(P[M + 2u + 2u] + row, rs); }}\n"
    );
    let key = format!("layernorm|{}|{}", wi.is_some(), bi.is_some());
    row_kernel(rt, "layer_norm", &key, &ts, &written, rows, cols, &[(eps as f32).to_bits()], &body)
}
