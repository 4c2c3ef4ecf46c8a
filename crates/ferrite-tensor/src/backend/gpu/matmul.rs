//! Tiled matrix product on the GPU: 64×64 output tiles per workgroup of 16×16 invocations, each
//! computing a 4×4 block from 64×16 / 16×64 tiles of the operands staged in workgroup memory.
//! Operands keep their strides (transposed views need no copy); the batch dimensions broadcast
//! through per-operand batch strides, one batch entry per workgroup layer (`z`).

use super::runtime::{Runtime, read, write};
use super::wgsl;
use crate::error::{Result, TensorError};
use crate::{DType, Tensor};

const SHADER_MAIN: &str = r#"
var<workgroup> As: array<f32, 1024>;
var<workgroup> Bs: array<f32, 1024>;
fn prm(j: u32) -> u32 { return P[3u + j]; }
@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let M = prm(0u); let N = prm(1u); let K = prm(2u);
    let ars = prm(3u); let acs = prm(4u); let brs = prm(5u); let bcs = prm(6u);
    let nbd = prm(7u);
    let batch = wid.z + prm(8u);
    // Batch offsets: unravel `batch` over the broadcast batch shape.
    var aoff = prm(9u); var boff = prm(10u);
    var rem = batch; var d = nbd;
    loop { if (d == 0u) { break; } d = d - 1u; let sz = prm(12u + d); let i = rem % sz; rem = rem / sz; aoff = aoff + i * prm(12u + nbd + d); boff = boff + i * prm(12u + 2u * nbd + d); }
    let ooff = prm(11u) + batch * M * N;
    let row0 = wid.y * 64u; let col0 = wid.x * 64u;
    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i = i + 1u) { acc[i] = 0.0; }
    for (var k0 = 0u; k0 < K; k0 = k0 + 16u) {
        for (var i = 0u; i < 4u; i = i + 1u) {
            let idx = lid + i * 256u;
            let m = idx / 16u; let kk = idx % 16u;
            let gm = row0 + m; let gk = k0 + kk;
            var v = 0.0;
            if (gm < M && gk < K) { v = ldf1(aoff + gm * ars + gk * acs); }
            As[kk * 64u + m] = v;
            let kb = idx / 64u; let n = idx % 64u;
            let gkb = k0 + kb; let gn = col0 + n;
            var w = 0.0;
            if (gkb < K && gn < N) { w = ldf2(boff + gkb * brs + gn * bcs); }
            Bs[kb * 64u + n] = w;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk = kk + 1u) {
            let a = vec4<f32>(As[kk * 64u + lid3.y * 4u], As[kk * 64u + lid3.y * 4u + 1u], As[kk * 64u + lid3.y * 4u + 2u], As[kk * 64u + lid3.y * 4u + 3u]);
            let b = vec4<f32>(Bs[kk * 64u + lid3.x * 4u], Bs[kk * 64u + lid3.x * 4u + 1u], Bs[kk * 64u + lid3.x * 4u + 2u], Bs[kk * 64u + lid3.x * 4u + 3u]);
            for (var i = 0u; i < 4u; i = i + 1u) {
                acc[i * 4u] = fma(a[i], b.x, acc[i * 4u]);
                acc[i * 4u + 1u] = fma(a[i], b.y, acc[i * 4u + 1u]);
                acc[i * 4u + 2u] = fma(a[i], b.z, acc[i * 4u + 2u]);
                acc[i * 4u + 3u] = fma(a[i], b.w, acc[i * 4u + 3u]);
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i = i + 1u) {
        for (var j = 0u; j < 4u; j = j + 1u) {
            let gm = row0 + lid3.y * 4u + i; let gn = col0 + lid3.x * 4u + j;
            if (gm < M && gn < N) { stf0(ooff + gm * N + gn, acc[i * 4u + j]); }
        }
    }
}
"#;

pub(super) fn matmul(rt: &Runtime, out: &Tensor, a: &Tensor, b: &Tensor, batch: &[usize]) -> Result<()> {
    if out.dtype() != DType::F32 {
        return Err(TensorError::UnsupportedDType { op: "matmul", dtype: out.dtype() });
    }
    let r = out.rank();
    let (m, n) = (out.shape()[r - 2], out.shape()[r - 1]);
    let k = a.shape()[a.rank() - 1];
    if out.numel() == 0 {
        return Ok(());
    }
    if k == 0 {
        return super::elementwise::fill(rt, out, 0.0);
    }
    let nbd = batch.len();
    let al = a.layout().broadcast_to(&[batch, &[m, k]].concat(), "matmul")?;
    let bl = b.layout().broadcast_to(&[batch, &[k, n]].concat(), "matmul")?;
    let nb: usize = batch.iter().product();
    let dtypes = [DType::F32, DType::F32, DType::F32];
    // Batches beyond the 65535 workgroup layers of one dispatch go in several dispatches.
    let mut start = 0usize;
    while start < nb {
        let layers = (nb - start).min(65535);
        let mut params: Vec<u32> = vec![m as u32, n as u32, k as u32];
        params.extend([
            al.strides[nbd] as u32,
            al.strides[nbd + 1] as u32,
            bl.strides[nbd] as u32,
            bl.strides[nbd + 1] as u32,
        ]);
        params.push(nbd as u32);
        params.push(start as u32);
        params.extend([al.offset as u32, bl.offset as u32, out.storage_offset() as u32]);
        params.extend(batch.iter().map(|&d| d as u32));
        params.extend(al.strides[..nbd].iter().map(|&s| s as u32));
        params.extend(bl.strides[..nbd].iter().map(|&s| s as u32));
        let groups = [n.div_ceil(64) as u32, m.div_ceil(64) as u32, layers as u32];
        if groups[0] > 65535 || groups[1] > 65535 {
            return Err(TensorError::invalid(
                "matmul",
                format!("a {m}x{n} product has more output tiles than one GPU dispatch can cover; split the product"),
            ));
        }
        rt.launch("matmul", "matmul_f32", &[write(out), read(a), read(b)], false, &params, groups, |plan| {
            let mut s = wgsl::header(plan);
            s.push_str(&wgsl::operands(plan, &dtypes, &[true, false, false]));
            s.push_str(SHADER_MAIN);
            s
        })?;
        start += layers;
    }
    Ok(())
}
