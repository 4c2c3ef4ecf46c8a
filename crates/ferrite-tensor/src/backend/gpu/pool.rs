//! 2-D pooling on the GPU: one invocation per output element forward, one per input element
//! backward. The window arithmetic is `backend/pool_window.rs`'s, transcribed to WGSL.
//!
//! Backward gathers instead of scattering (a scatter would need float atomics where windows
//! overlap): each input element visits the outputs whose windows can contain it
//! ([`Pool2d::outputs_touching`]'s bounds) and sums their gradients — for max pooling those whose
//! saved argmax is this element, for average pooling those whose window holds it, divided by the
//! window's divisor. Every element is written once, so the result does not depend on scheduling.

use super::plane_kernel::{PlaneKernel, groups_for};
use super::runtime::{Runtime, read, write};
use crate::Tensor;
use crate::backend::{Pool2d, PoolKind};
use crate::error::Result;

/// Scalars shared by every pooling kernel: `sc(0)` item count, then H, W, OH, OW, kH, kW, sH,
/// sW, pH, pW, dH, dW, count_include_pad, divisor_override (0 = none).
fn scalars(items: usize, pool: &Pool2d) -> Vec<u32> {
    let [h, w] = pool.input;
    let [oh, ow] = pool.output;
    let (kernel, stride, padding, dilation, cip, div) = match pool.kind {
        PoolKind::Max { kernel, stride, padding, dilation } => (kernel, stride, padding, dilation, false, 0),
        PoolKind::Avg { kernel, stride, padding, count_include_pad, divisor_override } => {
            (kernel, stride, padding, [1, 1], count_include_pad, divisor_override.unwrap_or(0))
        }
        PoolKind::AdaptiveAvg => ([1, 1], [1, 1], [0, 0], [1, 1], false, 0),
    };
    [items, h, w, oh, ow, kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1]]
        .iter()
        .map(|&v| v as u32)
        .chain([cip as u32, div as u32])
        .collect()
}

const GEOMETRY: &str = "fn H() -> u32 { return sc(1u); }\nfn W() -> u32 { return sc(2u); }\nfn OH() -> u32 { return sc(3u); }\nfn OW() -> u32 { return sc(4u); }\n";

/// `win(axis, o)`: (first row/column, one past the last, padded length) of output `o`'s window.
fn avg_window_fn(adaptive: bool) -> &'static str {
    if adaptive {
        "fn win(a: u32, o: u32) -> vec3<i32> { let size = sc(1u + a); let out = sc(3u + a); let st = i32((o * size) / out); let en = i32(((o + 1u) * size + out - 1u) / out); return vec3<i32>(st, en, en - st); }\n"
    } else {
        "fn win(a: u32, o: u32) -> vec3<i32> { let size = i32(sc(1u + a)); let k = i32(sc(5u + a)); let s = i32(sc(7u + a)); let p = i32(sc(9u + a)); var st = i32(o) * s - p; var en = min(st + k, size + p); let padded = en - st; st = max(st, 0); en = min(en, size); return vec3<i32>(st, en, padded); }\n"
    }
}

const DIVISOR: &str = "fn divisor(hv: vec3<i32>, wv: vec3<i32>) -> f32 { let ov = sc(14u); if (ov != 0u) { return f32(ov); } if (sc(13u) != 0u) { return f32(hv.z * wv.z); } return f32((hv.y - hv.x) * (wv.y - wv.x)); }\n";

/// `touch(axis, i)`: the range of outputs whose windows may contain input index `i`.
fn touch_fn(adaptive: bool) -> &'static str {
    if adaptive {
        "fn touch(a: u32, i: u32) -> vec2<u32> { let size = sc(1u + a); let out = sc(3u + a); return vec2<u32>(min((i * out) / size, out), min(((i + 1u) * out + size - 1u) / size, out)); }\n"
    } else {
        "fn touch(a: u32, i: u32) -> vec2<u32> { let out = sc(3u + a); let s = sc(7u + a); let pos = i + sc(9u + a); let reach = (sc(5u + a) - 1u) * sc(11u + a); var lo = 0u; if (pos >= reach) { lo = (pos - reach + s - 1u) / s; } return vec2<u32>(min(lo, out), min(pos / s + 1u, out)); }\n"
    }
}

/// The item index and its plane/row/column for a kernel over `[P, rows, cols]`.
fn item(rows: &str, cols: &str) -> String {
    format!(
        "  let li = gid * 256u + lid;\n  if (li >= sc(0u)) {{ return; }}\n  let plane = {rows} * {cols};\n  let p = li / plane;\n  let rem = li % plane;\n  let r = rem / {cols};\n  let q = rem % {cols};\n"
    )
}

pub(super) fn max_pool2d(rt: &Runtime, out: &Tensor, indices: &Tensor, x: &Tensor, pool: &Pool2d) -> Result<()> {
    let n = out.numel();
    let mut k = PlaneKernel::new("max_pool2d", "");
    k.operand(write(out));
    k.operand(write(indices));
    k.operand(read(x));
    k.scalars(&scalars(n, pool));
    let mut b = item("OH()", "OW()");
    b.push_str(
        "  var h0 = i32(r * sc(7u)) - i32(sc(9u));\n  let h1 = min(h0 + i32((sc(5u) - 1u) * sc(11u) + 1u), i32(H()));\n  loop { if (h0 >= 0) { break; } h0 = h0 + i32(sc(11u)); }\n  var w0 = i32(q * sc(8u)) - i32(sc(10u));\n  let w1 = min(w0 + i32((sc(6u) - 1u) * sc(12u) + 1u), i32(W()));\n  loop { if (w0 >= 0) { break; } w0 = w0 + i32(sc(12u)); }\n  var best = bitcast<f32>(0xff800000u);\n  var arg = u32(h0) * W() + u32(w0);\n  let base = p * H() * W();\n  for (var hh = h0; hh < h1; hh = hh + i32(sc(11u))) {\n    for (var ww = w0; ww < w1; ww = ww + i32(sc(12u))) {\n      let idx = u32(hh) * W() + u32(ww);\n      let v = ldf2(at(2u, base + idx));\n      if (v > best || v != v) { best = v; arg = idx; }\n    }\n  }\n  stf0(at(0u, li), best);\n  sti1(at(1u, li), i32(arg));\n",
    );
    k.run(rt, groups_for(n), GEOMETRY, &b)
}

pub(super) fn max_pool2d_backward(
    rt: &Runtime,
    gi: &Tensor,
    go: &Tensor,
    indices: &Tensor,
    pool: &Pool2d,
) -> Result<()> {
    let n = gi.numel();
    let mut k = PlaneKernel::new("max_pool2d_backward", "");
    k.operand(write(gi));
    k.operand(read(go));
    k.operand(read(indices));
    k.scalars(&scalars(n, pool));
    let mut b = item("H()", "W()");
    b.push_str(
        "  let th = touch(0u, r);\n  let tw = touch(1u, q);\n  let obase = p * OH() * OW();\n  var acc = 0.0;\n  for (var oh = th.x; oh < th.y; oh = oh + 1u) {\n    for (var ow = tw.x; ow < tw.y; ow = ow + 1u) {\n      let o = obase + oh * OW() + ow;\n      if (ldi2(at(2u, o)) == i32(rem)) { acc = acc + ldf1(at(1u, o)); }\n    }\n  }\n  stf0(at(0u, li), acc);\n",
    );
    let helpers = format!("{GEOMETRY}{}", touch_fn(false));
    k.run(rt, groups_for(n), &helpers, &b)
}

pub(super) fn avg_pool2d(rt: &Runtime, out: &Tensor, x: &Tensor, pool: &Pool2d) -> Result<()> {
    let n = out.numel();
    let adaptive = pool.kind == PoolKind::AdaptiveAvg;
    let mut k = PlaneKernel::new("avg_pool2d", format!("{adaptive}"));
    k.operand(write(out));
    k.operand(read(x));
    k.scalars(&scalars(n, pool));
    let mut b = item("OH()", "OW()");
    b.push_str(
        "  let hv = win(0u, r);\n  let wv = win(1u, q);\n  let base = p * H() * W();\n  var acc = 0.0;\n  for (var hh = hv.x; hh < hv.y; hh = hh + 1) {\n    for (var ww = wv.x; ww < wv.y; ww = ww + 1) { acc = acc + ldf1(at(1u, base + u32(hh) * W() + u32(ww))); }\n  }\n  var v = 0.0;\n  if (hv.x < hv.y && wv.x < wv.y) { v = acc / divisor(hv, wv); }\n  stf0(at(0u, li), v);\n",
    );
    let helpers = format!("{GEOMETRY}{}{DIVISOR}", avg_window_fn(adaptive));
    k.run(rt, groups_for(n), &helpers, &b)
}

pub(super) fn avg_pool2d_backward(rt: &Runtime, gi: &Tensor, go: &Tensor, pool: &Pool2d) -> Result<()> {
    let n = gi.numel();
    let adaptive = pool.kind == PoolKind::AdaptiveAvg;
    let mut k = PlaneKernel::new("avg_pool2d_backward", format!("{adaptive}"));
    k.operand(write(gi));
    k.operand(read(go));
    k.scalars(&scalars(n, pool));
    let mut b = item("H()", "W()");
    b.push_str(
        "  let th = touch(0u, r);\n  let tw = touch(1u, q);\n  let obase = p * OH() * OW();\n  var acc = 0.0;\n  for (var oh = th.x; oh < th.y; oh = oh + 1u) {\n    let hv = win(0u, oh);\n    if (i32(r) < hv.x || i32(r) >= hv.y) { continue; }\n    for (var ow = tw.x; ow < tw.y; ow = ow + 1u) {\n      let wv = win(1u, ow);\n      if (i32(q) < wv.x || i32(q) >= wv.y) { continue; }\n      acc = acc + ldf1(at(1u, obase + oh * OW() + ow)) / divisor(hv, wv);\n    }\n  }\n  stf0(at(0u, li), acc);\n",
    );
    let helpers = format!("{GEOMETRY}{}{}{DIVISOR}", avg_window_fn(adaptive), touch_fn(adaptive));
    k.run(rt, groups_for(n), &helpers, &b)
}
