//! The named fused kernels on the GPU: optimizer steps, clipping and scaling as one elementwise
//! pass each; norms and the GradScaler's inf/NaN check as a two-level reduction (per-workgroup
//! partials on the GPU, combined on the host in a fixed order, so results are reproducible).
//!
//! Bodies follow the CPU backend's sequence of PyTorch ops (`backend/cpu/fused.rs`) in f32, the
//! compute type of f32, f16 and bf16 elements, rounding to the element type where PyTorch stores
//! an intermediate tensor and using `fma` where PyTorch's kernels fuse.

use std::fmt::Write as _;

use super::elementwise::Map;
use super::runtime::{Runtime, read, write};
use super::wgsl::{self, f32_lit, round_expr};
use crate::backend::{FusedKernel, NormKind};
use crate::error::{Result, TensorError};
use crate::{DType, Tensor};

/// Workgroups of a partial reduction (the host combines this many partials at most).
const MAX_PARTIALS: usize = 1024;

pub(super) fn fused(rt: &Runtime, kernel: &FusedKernel, outputs: &[&Tensor], inputs: &[&Tensor]) -> Result<f64> {
    let first = outputs
        .first()
        .or(inputs.first())
        .copied()
        .ok_or_else(|| TensorError::invalid(kernel.name(), "a fused kernel needs at least one tensor"))?;
    let dtype = first.dtype();
    if dtype == DType::F64 {
        return Err(TensorError::UnsupportedDType { op: kernel.name(), dtype });
    }
    match *kernel {
        FusedKernel::Unscale { inv_scale } => partials(rt, kernel.name(), first, Partial::Unscale(inv_scale as f32))
            .map(|v| if v != 0.0 { 1.0 } else { 0.0 }),
        FusedKernel::NormPartial { kind } => partials(rt, kernel.name(), first, Partial::Norm(kind)),
        _ => {
            let body = elementwise_body(kernel, dtype);
            let shape = first.shape().to_vec();
            let mut map = Map::new(kernel.name(), format!("fused:{}", variant_key(kernel)));
            for o in outputs {
                map = map.operand(write(o), o.layout().clone());
            }
            for i in inputs {
                map = map.broadcast(read(i), &shape)?;
            }
            for bits in scalars(kernel) {
                map = map.scalar(bits);
            }
            map.body(body).run(rt)?;
            Ok(0.0)
        }
    }
}

/// What selects the body's code (scalars are run-time parameters).
fn variant_key(kernel: &FusedKernel) -> String {
    match *kernel {
        FusedKernel::Sgd { momentum, nesterov, weight_decay, maximize, first_step, .. } => {
            format!("sgd:{}:{nesterov}:{}:{maximize}:{first_step}", momentum != 0.0, weight_decay != 0.0)
        }
        FusedKernel::Adam { l2, decay, beta1, maximize, amsgrad, .. } => {
            format!("adam:{}:{}:{}:{maximize}:{amsgrad}", l2.is_some(), decay.is_some(), (1.0 - beta1).abs() < 0.5)
        }
        FusedKernel::ClampAbs { .. } => "clampabs".into(),
        FusedKernel::Scale { .. } => "scale".into(),
        FusedKernel::Unscale { .. } | FusedKernel::NormPartial { .. } => "reduce".into(),
        FusedKernel::Rmsprop { alpha, weight_decay, momentum, centered, maximize, .. } => {
            let small = (1.0 - alpha).abs() < 0.5;
            format!("rmsprop:{}:{}:{centered}:{maximize}:{small}", weight_decay != 0.0, momentum > 0.0)
        }
        FusedKernel::Adagrad { weight_decay, maximize, .. } => format!("adagrad:{}:{maximize}", weight_decay != 0.0),
    }
}

/// The kernel's scalars as f32 bits, read in the body as `k(j)`.
fn scalars(kernel: &FusedKernel) -> Vec<u32> {
    let b = |v: f64| (v as f32).to_bits();
    match *kernel {
        FusedKernel::Sgd { lr, momentum, dampening, weight_decay, .. } => {
            vec![b(-lr), b(momentum), b(1.0 - dampening), b(weight_decay)]
        }
        FusedKernel::Adam { l2, decay, beta1, beta2, eps, bias_correction2_sqrt, step_size, .. } => {
            let w1 = (1.0 - beta1) as f32;
            vec![
                b(l2.unwrap_or(0.0)),
                b(decay.unwrap_or(1.0)),
                w1.to_bits(),
                (1.0 - w1).to_bits(),
                b(beta2),
                b(1.0 - beta2),
                b(bias_correction2_sqrt),
                b(eps),
                b(-step_size),
            ]
        }
        FusedKernel::ClampAbs { clip } => vec![b(clip)],
        // The coefficient is first rounded to the element type (a 0-dim tensor of the grad's dtype).
        FusedKernel::Scale { coef } => vec![b(coef)],
        FusedKernel::Unscale { .. } | FusedKernel::NormPartial { .. } => Vec::new(),
        FusedKernel::Rmsprop { lr, alpha, eps, weight_decay, momentum, .. } => {
            let w = (1.0 - alpha) as f32;
            vec![b(-lr), b(alpha), w.to_bits(), (1.0 - w).to_bits(), b(eps), b(weight_decay), b(momentum)]
        }
        FusedKernel::Adagrad { clr, eps, weight_decay, .. } => vec![b(-clr), b(eps), b(weight_decay)],
    }
}

/// WGSL statements of an elementwise fused kernel. Operand order: outputs, then inputs.
fn elementwise_body(kernel: &FusedKernel, dtype: DType) -> String {
    let r = |v: &str| round_expr(dtype, v);
    let mut s = String::from("  let k0 = bitcast<f32>(sc(0u));\n");
    match *kernel {
        FusedKernel::Sgd { momentum, nesterov, weight_decay, maximize, first_step, .. } => {
            let has_m = momentum != 0.0;
            let g_at = if has_m { "ldf2(e2)" } else { "ldf1(e1)" };
            let _ = writeln!(
                s,
                "  let neg_lr = k0; let mom = bitcast<f32>(sc(1u)); let omd = bitcast<f32>(sc(2u)); let wd = bitcast<f32>(sc(3u));"
            );
            let _ = writeln!(s, "  let pa = ldf0(e0);\n  var g = {g_at};");
            if maximize {
                s.push_str("  g = -g;\n");
            }
            if weight_decay != 0.0 {
                let _ = writeln!(s, "  g = {};", r("fma(pa, wd, g)"));
            }
            if has_m {
                if first_step {
                    s.push_str("  let buf = g;\n");
                } else {
                    let _ = writeln!(s, "  let buf = {};", r(&format!("fma(g, omd, {})", r("ldf1(e1) * mom"))));
                }
                s.push_str("  stf1(e1, buf);\n");
                if nesterov {
                    let _ = writeln!(s, "  let step = {};", r("fma(buf, mom, g)"));
                } else {
                    s.push_str("  let step = buf;\n");
                }
                s.push_str("  stf0(e0, fma(step, neg_lr, pa));\n");
            } else {
                s.push_str("  stf0(e0, fma(g, neg_lr, pa));\n");
            }
        }
        FusedKernel::Adam { l2, decay, beta1, maximize, amsgrad, .. } => {
            let small = (1.0 - beta1).abs() < 0.5;
            let g_at = if amsgrad { "ldf4(e4)" } else { "ldf3(e3)" };
            s.push_str("  let wd = k0; let decay = bitcast<f32>(sc(1u)); let w1 = bitcast<f32>(sc(2u)); let omw1 = bitcast<f32>(sc(3u)); let beta2 = bitcast<f32>(sc(4u)); let c2 = bitcast<f32>(sc(5u)); let bc2 = bitcast<f32>(sc(6u)); let eps = bitcast<f32>(sc(7u)); let nss = bitcast<f32>(sc(8u));\n");
            let _ = writeln!(s, "  var pa = ldf0(e0);\n  var g = {g_at};");
            if maximize {
                s.push_str("  g = -g;\n");
            }
            if decay.is_some() {
                let _ = writeln!(s, "  pa = {};", r("pa * decay"));
            }
            if l2.is_some() {
                let _ = writeln!(s, "  g = {};", r("fma(pa, wd, g)"));
            }
            s.push_str("  let m0 = ldf1(e1);\n  let d = g - m0;\n");
            let lerp = if small { "fma(w1, d, m0)" } else { "fma(-d, omw1, g)" };
            let _ = writeln!(s, "  let ma = {};", r(lerp));
            let _ = writeln!(s, "  let v1 = {};", r("ldf2(e2) * beta2"));
            let _ = writeln!(s, "  let va = {};", r("fma(c2 * g, g, v1)"));
            s.push_str("  stf1(e1, ma);\n  stf2(e2, va);\n");
            if amsgrad {
                s.push_str("  let old = ldf3(e3);\n  var mx = old;\n  if (isnan_f(old) || isnan_f(va)) { mx = bitcast<f32>(0x7fc00000u); } else if (va > old) { mx = va; }\n  stf3(e3, mx);\n");
                let _ = writeln!(s, "  let vv = {};", r("mx"));
            } else {
                s.push_str("  let vv = va;\n");
            }
            let _ = writeln!(s, "  let den0 = {};", r(&format!("{} / bc2", r("sqrt(vv)"))));
            let _ = writeln!(s, "  let den = {};", r("den0 + eps"));
            s.push_str("  stf0(e0, pa + (nss * ma) / den);\n");
        }
        FusedKernel::ClampAbs { .. } => {
            s.push_str("  let a = ldf0(e0);\n  if (a > k0) { stf0(e0, k0); } else if (a < -k0) { stf0(e0, -k0); }\n");
        }
        FusedKernel::Scale { .. } => {
            let _ = writeln!(s, "  let c = {};\n  stf0(e0, ldf0(e0) * c);", r("k0"));
        }
        FusedKernel::Unscale { .. } | FusedKernel::NormPartial { .. } => {}
        FusedKernel::Rmsprop { alpha, weight_decay, momentum, centered, maximize, .. } => {
            // Operands: param, square_avg, [momentum_buffer], [grad_avg], grad.
            let has_m = momentum > 0.0;
            let buf = 2;
            let gavg = 2 + has_m as usize;
            let grad = 2 + has_m as usize + centered as usize;
            s.push_str("  let neg_lr = k0; let alpha = bitcast<f32>(sc(1u)); let w = bitcast<f32>(sc(2u)); let omw = bitcast<f32>(sc(3u)); let eps = bitcast<f32>(sc(4u)); let wd = bitcast<f32>(sc(5u)); let mom = bitcast<f32>(sc(6u));\n");
            let _ = writeln!(s, "  let pa = ldf0(e0);\n  var g = ldf{grad}(e{grad});");
            if maximize {
                s.push_str("  g = -g;\n");
            }
            if weight_decay != 0.0 {
                let _ = writeln!(s, "  g = {};", r("fma(pa, wd, g)"));
            }
            let _ = writeln!(s, "  let s1 = {};", r("ldf1(e1) * alpha"));
            let _ = writeln!(s, "  let sq = {};\n  stf1(e1, sq);", r("fma(w * g, g, s1)"));
            if centered {
                let small = (1.0 - alpha).abs() < 0.5;
                let _ = writeln!(s, "  let m0 = ldf{gavg}(e{gavg});\n  let d = g - m0;");
                let lerp = if small { "fma(w, d, m0)" } else { "fma(-d, omw, g)" };
                let _ = writeln!(s, "  let m = {};\n  stf{gavg}(e{gavg}, m);", r(lerp));
                let _ = writeln!(s, "  let v = {};", r("fma(-m, m, sq)"));
            } else {
                s.push_str("  let v = sq;\n");
            }
            let _ = writeln!(s, "  let avg = {};", r(&format!("{} + eps", r("sqrt(v)"))));
            if has_m {
                let _ =
                    writeln!(s, "  let b = {};", r(&format!("{} + g / avg", r(&format!("ldf{buf}(e{buf}) * mom")))));
                let _ = writeln!(s, "  stf{buf}(e{buf}, b);\n  stf0(e0, fma(b, neg_lr, pa));");
            } else {
                s.push_str("  stf0(e0, pa + (neg_lr * g) / avg);\n");
            }
        }
        FusedKernel::Adagrad { weight_decay, maximize, .. } => {
            s.push_str("  let neg_clr = k0; let eps = bitcast<f32>(sc(1u)); let wd = bitcast<f32>(sc(2u));\n");
            s.push_str("  let pa = ldf0(e0);\n  var g = ldf2(e2);\n");
            if maximize {
                s.push_str("  g = -g;\n");
            }
            if weight_decay != 0.0 {
                let _ = writeln!(s, "  g = {};", r("fma(pa, wd, g)"));
            }
            let _ = writeln!(s, "  let sa = {};\n  stf1(e1, sa);", r("fma(g, g, ldf1(e1))"));
            let _ = writeln!(s, "  let sd = {};", r(&format!("{} + eps", r("sqrt(sa)"))));
            s.push_str("  stf0(e0, pa + (neg_clr * g) / sd);\n");
        }
    }
    s
}

/// A reduction whose per-workgroup partials the host combines.
#[derive(Clone, Copy)]
enum Partial {
    /// Scale in place (unless 1) and flag non-finite elements (partials: 0 or 1).
    Unscale(f32),
    Norm(NormKind),
}

/// (WGSL element contribution of `x`, WGSL combine of `a` and `b`, identity) of a norm kind.
fn norm_code(kind: NormKind) -> (&'static str, &'static str, f32) {
    match kind {
        NormKind::Inf => ("abs(x)", "fmax_nan(a, b)", 0.0),
        NormKind::NegInf => ("abs(x)", "fmin_nan(a, b)", f32::INFINITY),
        NormKind::Zero => ("select(0.0, 1.0, x != 0.0)", "a + b", 0.0),
        NormKind::One => ("abs(x)", "a + b", 0.0),
        NormKind::Two => ("x * x", "a + b", 0.0),
        NormKind::P(_) => ("pow(abs(x), pp)", "a + b", 0.0),
    }
}

fn partials(rt: &Runtime, op: &'static str, x: &Tensor, what: Partial) -> Result<f64> {
    let n = x.numel();
    if n > u32::MAX as usize {
        return Err(TensorError::invalid(op, format!("{n} elements are more than a GPU kernel can index (2^32)")));
    }
    let groups = n.div_ceil(wgsl_wg()).clamp(1, MAX_PARTIALS);
    let parts = Tensor::empty_with(x.storage().allocator(), &[groups], DType::F32)?;
    let (elem, combine, identity, key, param, writes_x) = match what {
        Partial::Unscale(inv) => (
            "select(0.0, 1.0, (bitcast<u32>(x) & 0x7f800000u) == 0x7f800000u)",
            "max(a, b)",
            0.0f32,
            "unscale".to_string(),
            inv,
            inv != 1.0,
        ),
        Partial::Norm(kind) => {
            let (e, c, id) = norm_code(kind);
            let p = if let NormKind::P(p) = kind { p as f32 } else { 0.0 };
            let name = match kind {
                NormKind::Inf => "inf",
                NormKind::NegInf => "neginf",
                NormKind::Zero => "zero",
                NormKind::One => "one",
                NormKind::Two => "two",
                NormKind::P(_) => "p",
            };
            (e, c, id, format!("norm:{name}"), p, false)
        }
    };
    let dtypes = [DType::F32, x.dtype()];
    let written = [true, writes_x];
    let params = vec![n as u32, groups as u32, x.storage_offset() as u32, param.to_bits()];
    let full_key = format!("partials|{key}|{writes_x}|{dtypes:?}");
    let x_op = if writes_x { write(x) } else { read(x) };
    let store = if writes_x { "    stf1(P[4u] + e, x * pp);\n" } else { "" };
    rt.launch(op, &full_key, &[write(&parts), x_op], false, &params, [groups as u32, 1, 1], |plan| {
        let mut s = wgsl::header(plan);
        s.push_str(&wgsl::operands(plan, &dtypes, &written));
        s.push_str("fn fmax_nan(x: f32, y: f32) -> f32 { if (x != x || y != y) { return bitcast<f32>(0x7fc00000u); } return max(x, y); }\n");
        s.push_str("fn fmin_nan(x: f32, y: f32) -> f32 { if (x != x || y != y) { return bitcast<f32>(0x7fc00000u); } return min(x, y); }\n");
        let _ = writeln!(s, "fn comb(a: f32, b: f32) -> f32 {{ return {combine}; }}");
        s.push_str("var<workgroup> red: array<f32, 256>;\n");
        s.push_str("@compute @workgroup_size(256)\nfn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {\n");
        let _ = write!(
            s,
            "  let n = P[2u]; let g = P[3u]; let pp = bitcast<f32>(P[5u]);\n  var acc = {id};\n  for (var e = wid.x * 256u + lid; e < n; e = e + g * 256u) {{\n    let x = ldf1(P[4u] + e);\n    acc = comb(acc, {elem});\n{store}  }}\n  red[lid] = acc;\n  workgroupBarrier();\n  for (var h = 128u; h > 0u; h = h >> 1u) {{ if (lid < h) {{ red[lid] = comb(red[lid], red[lid + h]); }} workgroupBarrier(); }}\n  if (lid == 0u) {{ stf0(wid.x, red[0]); }}\n}}\n",
            id = f32_lit(identity)
        );
        s
    })?;
    let mut bytes = vec![0u8; groups * 4];
    rt.read(&parts, &mut bytes)?;
    let values: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
    Ok(match what {
        Partial::Unscale(_) => values.iter().any(|&v| v != 0.0) as u8 as f64,
        Partial::Norm(kind) => values.iter().fold(kind.identity(), |acc, &v| kind.combine(acc, v as f64)),
    })
}

fn wgsl_wg() -> usize {
    super::runtime::WG as usize
}
