//! Unfold/fold (im2col/col2im) of a convolution on the GPU, the WGSL twins of
//! `backend/cpu/conv.rs`: one invocation per element written. im2col reads the one pixel its
//! tap sees (or writes 0 in the padding); col2im is written as a gather — each pixel sums the
//! unfolded entries whose tap reads it — so no two invocations write the same word and no atomics
//! are needed. The products around them run on the tiled matmul kernel.

use super::runtime::{Runtime, read, write};
use super::wgsl;
use crate::Tensor;
use crate::backend::ConvGeometry;
use crate::error::{Result, TensorError};

/// Parameters after the two operands' word bases: element count, the operands' storage
/// offsets, then the geometry.
fn params(op: &'static str, n: usize, a: &Tensor, b: &Tensor, g: &ConvGeometry) -> Result<Vec<u32>> {
    let fits = |v: usize| u32::try_from(v).is_ok();
    if !fits(a.numel()) || !fits(b.numel()) || !fits(a.storage_offset() + a.numel()) {
        return Err(TensorError::invalid(
            op,
            format!(
                "an operand of {} elements is beyond the 2^32 elements one GPU kernel can index; use a smaller batch",
                a.numel().max(b.numel())
            ),
        ));
    }
    let v = [
        n,
        a.storage_offset(),
        b.storage_offset(),
        g.channels,
        g.input[0],
        g.input[1],
        g.kernel[0],
        g.kernel[1],
        g.stride[0],
        g.stride[1],
        g.padding[0],
        g.padding[1],
        g.dilation[0],
        g.dilation[1],
        g.output[0],
        g.output[1],
    ];
    Ok(v.iter().map(|&x| x as u32).collect())
}

/// Names for the parameters of [`params`] (operands 0 and 1 come first in `P`).
const GEOMETRY: &str = "fn aoff() -> u32 { return P[3u]; }\n\
fn boff() -> u32 { return P[4u]; }\n\
fn gH() -> u32 { return P[6u]; }\n\
fn gW() -> u32 { return P[7u]; }\n\
fn gKH() -> u32 { return P[8u]; }\n\
fn gKW() -> u32 { return P[9u]; }\n\
fn gSH() -> u32 { return P[10u]; }\n\
fn gSW() -> u32 { return P[11u]; }\n\
fn gPH() -> u32 { return P[12u]; }\n\
fn gPW() -> u32 { return P[13u]; }\n\
fn gDH() -> u32 { return P[14u]; }\n\
fn gDW() -> u32 { return P[15u]; }\n\
fn gOH() -> u32 { return P[16u]; }\n\
fn gOW() -> u32 { return P[17u]; }\n";

/// One invocation per element of `cols` (operand 0): decode (plane, tap row i, tap column j,
/// window row r, window column q) and read the pixel the tap sees.
const IM2COL: &str = "  let q = li % gOW(); let t1 = li / gOW(); let r = t1 % gOH(); let t2 = t1 / gOH();\n\
  let j = t2 % gKW(); let t3 = t2 / gKW(); let i = t3 % gKH(); let plane = t3 / gKH();\n\
  let y = i32(r * gSH() + i * gDH()) - i32(gPH()); let x = i32(q * gSW() + j * gDW()) - i32(gPW());\n\
  var v = 0.0;\n\
  if (y >= 0 && x >= 0 && u32(y) < gH() && u32(x) < gW()) { v = ldf1(boff() + (plane * gH() + u32(y)) * gW() + u32(x)); }\n\
  stf0(aoff() + li, v);\n";

/// One invocation per pixel of `x` (operand 0): sum the entries of `cols` (operand 1) of every
/// tap whose window reads this pixel.
const COL2IM: &str = "  let px = li % gW(); let t = li / gW(); let py = t % gH(); let plane = t / gH();\n\
  var acc = 0.0;\n\
  for (var i = 0u; i < gKH(); i = i + 1u) {\n\
    let ny = i32(py + gPH()) - i32(i * gDH());\n\
    if (ny < 0 || u32(ny) % gSH() != 0u) { continue; }\n\
    let r = u32(ny) / gSH();\n\
    if (r >= gOH()) { continue; }\n\
    for (var j = 0u; j < gKW(); j = j + 1u) {\n\
      let nx = i32(px + gPW()) - i32(j * gDW());\n\
      if (nx < 0 || u32(nx) % gSW() != 0u) { continue; }\n\
      let q = u32(nx) / gSW();\n\
      if (q >= gOW()) { continue; }\n\
      acc = acc + ldf1(boff() + ((plane * gKH() + i) * gKW() + j) * gOH() * gOW() + r * gOW() + q);\n\
    }\n\
  }\n\
  stf0(aoff() + li, acc);\n";

fn launch(
    rt: &Runtime,
    op: &'static str,
    body: &'static str,
    out: &Tensor,
    src: &Tensor,
    g: &ConvGeometry,
) -> Result<()> {
    let n = out.numel();
    if n == 0 {
        return Ok(());
    }
    let params = params(op, n, out, src, g)?;
    let dtypes = [out.dtype(), src.dtype()];
    rt.launch(op, &format!("{op}|{dtypes:?}"), &[write(out), read(src)], false, &params, wgsl::groups_1d(n), |plan| {
        let mut s = wgsl::header(plan);
        s.push_str(&wgsl::operands(plan, &dtypes, &[true, false]));
        s.push_str(GEOMETRY);
        s.push_str(&wgsl::main_1d("2u", body));
        s
    })
}

pub(super) fn im2col(rt: &Runtime, cols: &Tensor, x: &Tensor, g: &ConvGeometry) -> Result<()> {
    launch(rt, "im2col", IM2COL, cols, x, g)
}

pub(super) fn col2im(rt: &Runtime, x: &Tensor, cols: &Tensor, g: &ConvGeometry) -> Result<()> {
    launch(rt, "col2im", COL2IM, x, cols, g)
}
