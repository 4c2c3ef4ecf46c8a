//! WGSL code generation shared by every kernel: binding declarations, typed element access over
//! 32-bit words, strided index arithmetic, and the dtype conversions ferrite's CPU kernels use.
//!
//! Every binding is an array of `u32` words. Operand `k` has its word base in `P[k]` and is read
//! and written through generated functions, with `e` the element index from the start of its
//! block (storage offset included):
//! - `ldf{k}(e) -> f32`, `ldi{k}(e) -> i32`: the value as f32 / i32 (int64 as its low 32 bits,
//!   bool as 0/1; f16 and bf16 widen exactly);
//! - `stf{k}(e, v)`, `sti{k}(e, v)`: store with the CPU's conversions (round to nearest even for
//!   f16/bf16, saturating float→u8, truncating float→int);
//! - `ldraw{k}(e) -> vec2<u32>`, `straw{k}(e, v)`: the element's exact bits (two words for int64),
//!   for copies and selections that must not touch the value.
//!
//! Sub-word dtypes (f16, bf16, u8, bool) are stored lane by lane with `atomicAnd`/`atomicOr` on
//! the containing word, so neighbouring elements written by other invocations (or belonging to
//! other views) are never clobbered.

use std::fmt::Write as _;

use super::runtime::BindingPlan;
use crate::DType;

/// Declarations of the plan's bindings and raw word access per slot.
pub(super) fn header(plan: &BindingPlan) -> String {
    let mut s = String::new();
    for (i, &(written, atomic)) in plan.slots.iter().enumerate() {
        if atomic {
            let _ = writeln!(s, "@group(0) @binding({i}) var<storage, read_write> b{i}: array<atomic<u32>>;");
            let _ = writeln!(s, "fn rd{i}(w: u32) -> u32 {{ return atomicLoad(&b{i}[w]); }}");
            let _ = writeln!(s, "fn wr{i}(w: u32, v: u32) {{ atomicStore(&b{i}[w], v); }}");
            let _ = writeln!(
                s,
                "fn lane{i}(w: u32, shift: u32, mask: u32, v: u32) {{ atomicAnd(&b{i}[w], ~(mask << shift)); atomicOr(&b{i}[w], (v & mask) << shift); }}"
            );
            // Float add by compare-and-swap (duplicate indices in scatter/index_add).
            let _ = writeln!(
                s,
                "fn addf{i}(w: u32, v: f32) {{ var old = atomicLoad(&b{i}[w]); loop {{ let r = atomicCompareExchangeWeak(&b{i}[w], old, bitcast<u32>(bitcast<f32>(old) + v)); if (r.exchanged) {{ break; }} old = r.old_value; }} }}"
            );
            let _ = writeln!(
                s,
                "fn addlane{i}(w: u32, shift: u32, is_bf16: bool, v: f32) {{ var old = atomicLoad(&b{i}[w]); loop {{ let cur = (old >> shift) & 0xffffu; var x: f32; var nb: u32; if (is_bf16) {{ x = bitcast<f32>(cur << 16u); nb = bf16_bits(x + v); }} else {{ x = unpack2x16float(cur)[0]; nb = f16_bits(x + v); }} let nw = (old & ~(0xffffu << shift)) | (nb << shift); let r = atomicCompareExchangeWeak(&b{i}[w], old, nw); if (r.exchanged) {{ break; }} old = r.old_value; }} }}"
            );
            let _ = writeln!(s, "fn addi{i}(w: u32, v: i32) {{ atomicAdd(&b{i}[w], bitcast<u32>(v)); }}");
        } else if written {
            let _ = writeln!(s, "@group(0) @binding({i}) var<storage, read_write> b{i}: array<u32>;");
            let _ = writeln!(s, "fn rd{i}(w: u32) -> u32 {{ return b{i}[w]; }}");
            let _ = writeln!(s, "fn wr{i}(w: u32, v: u32) {{ b{i}[w] = v; }}");
        } else {
            let _ = writeln!(s, "@group(0) @binding({i}) var<storage, read> b{i}: array<u32>;");
            let _ = writeln!(s, "fn rd{i}(w: u32) -> u32 {{ return b{i}[w]; }}");
        }
    }
    if plan.error_flag {
        let _ = writeln!(
            s,
            "@group(0) @binding({}) var<storage, read_write> flag: array<atomic<u32>>;",
            plan.flag_binding()
        );
        // The first error wins and records (op code, index, dim, size).
        s.push_str(
            "fn raise(code: u32, index: i32, dim: u32, size: u32) { let r = atomicCompareExchangeWeak(&flag[0], 0u, code); if (r.exchanged) { atomicStore(&flag[1], bitcast<u32>(index)); atomicStore(&flag[2], select(0u, 0xffffffffu, index < 0)); atomicStore(&flag[3], dim); atomicStore(&flag[4], size); } }\n",
        );
    }
    let _ = writeln!(s, "@group(0) @binding({}) var<storage, read> P: array<u32>;", plan.params_binding());
    s.push_str(CONVERSIONS);
    s
}

/// f32 → f16 / bf16 bits with round-to-nearest-even (the `half` crate's conversions, which the
/// CPU kernels use), and the integer power used by `pow` on integers.
const CONVERSIONS: &str = r#"
fn f16_bits(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    let sign = (x >> 16u) & 0x8000u;
    let e = (x >> 23u) & 0xffu;
    let m = x & 0x7fffffu;
    if (e == 0xffu) {
        if (m != 0u) { return sign | 0x7e00u | (m >> 13u); }
        return sign | 0x7c00u;
    }
    let ee = i32(e) - 112;
    if (ee >= 31) { return sign | 0x7c00u; }
    if (ee <= 0) {
        if (ee < -10) { return sign; }
        let mm = m | 0x800000u;
        let shift = u32(14 - ee);
        var r = mm >> shift;
        let rem = mm & ((1u << shift) - 1u);
        let half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u) == 1u)) { r = r + 1u; }
        return sign | r;
    }
    var r = (u32(ee) << 10u) | (m >> 13u);
    let rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u) == 1u)) { r = r + 1u; }
    return sign | r;
}
fn bf16_bits(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    if ((x & 0x7fffffffu) > 0x7f800000u) { return (x >> 16u) | 0x40u; }
    return (x + 0x7fffu + ((x >> 16u) & 1u)) >> 16u;
}
fn round_f16(v: f32) -> f32 { return unpack2x16float(f16_bits(v))[0]; }
fn round_bf16(v: f32) -> f32 { return bitcast<f32>(bf16_bits(v) << 16u); }
fn ipow(a: i32, b: i32) -> i32 {
    if (b < 0) { return 0; }
    var r = 1; var base = a; var e = b;
    loop { if (e == 0) { break; } if ((e & 1) == 1) { r = r * base; } base = base * base; e = e >> 1; }
    return r;
}
"#;

/// WGSL expression rounding an f32 value to `dtype` and back (identity for f32).
pub(super) fn round_expr(dtype: DType, v: &str) -> String {
    match dtype {
        DType::F16 => format!("round_f16({v})"),
        DType::BF16 => format!("round_bf16({v})"),
        _ => v.to_string(),
    }
}

/// Typed access functions for operand `k` of `dtype`, bound in `slot`.
pub(super) fn operand(k: usize, dtype: DType, slot: usize, writable: bool) -> String {
    let s = slot;
    let mut out = String::new();
    let (ldf, ldi, raw_ld) = match dtype {
        DType::F32 => (
            format!("bitcast<f32>(rd{s}(P[{k}] + e))"),
            format!("i32(ldf{k}(e))"),
            format!("vec2<u32>(rd{s}(P[{k}] + e), 0u)"),
        ),
        DType::F64 => ("0.0".to_string(), "0".to_string(), "vec2<u32>(0u, 0u)".to_string()),
        DType::I32 => (
            format!("f32(ldi{k}(e))"),
            format!("bitcast<i32>(rd{s}(P[{k}] + e))"),
            format!("vec2<u32>(rd{s}(P[{k}] + e), 0u)"),
        ),
        DType::I64 => (
            format!("f32(ldi{k}(e))"),
            format!("bitcast<i32>(rd{s}(P[{k}] + 2u * e))"),
            format!("vec2<u32>(rd{s}(P[{k}] + 2u * e), rd{s}(P[{k}] + 2u * e + 1u))"),
        ),
        DType::F16 => (
            format!("unpack2x16float(rd{s}(P[{k}] + (e >> 1u)))[e & 1u]"),
            format!("i32(ldf{k}(e))"),
            format!("vec2<u32>((rd{s}(P[{k}] + (e >> 1u)) >> ((e & 1u) * 16u)) & 0xffffu, 0u)"),
        ),
        DType::BF16 => (
            format!("bitcast<f32>(((rd{s}(P[{k}] + (e >> 1u)) >> ((e & 1u) * 16u)) & 0xffffu) << 16u)"),
            format!("i32(ldf{k}(e))"),
            format!("vec2<u32>((rd{s}(P[{k}] + (e >> 1u)) >> ((e & 1u) * 16u)) & 0xffffu, 0u)"),
        ),
        DType::U8 => (
            format!("f32(ldi{k}(e))"),
            format!("i32((rd{s}(P[{k}] + (e >> 2u)) >> ((e & 3u) * 8u)) & 0xffu)"),
            format!("vec2<u32>((rd{s}(P[{k}] + (e >> 2u)) >> ((e & 3u) * 8u)) & 0xffu, 0u)"),
        ),
        DType::Bool => (
            format!("f32(ldi{k}(e))"),
            format!("select(0, 1, ((rd{s}(P[{k}] + (e >> 2u)) >> ((e & 3u) * 8u)) & 0xffu) != 0u)"),
            format!("vec2<u32>((rd{s}(P[{k}] + (e >> 2u)) >> ((e & 3u) * 8u)) & 0xffu, 0u)"),
        ),
    };
    let _ = writeln!(out, "fn ldf{k}(e: u32) -> f32 {{ return {ldf}; }}");
    let _ = writeln!(out, "fn ldi{k}(e: u32) -> i32 {{ return {ldi}; }}");
    let _ = writeln!(out, "fn ldraw{k}(e: u32) -> vec2<u32> {{ return {raw_ld}; }}");
    if writable {
        let (stf, sti, raw_st) = match dtype {
            DType::F32 => (
                format!("wr{s}(P[{k}] + e, bitcast<u32>(v));"),
                format!("stf{k}(e, f32(v));"),
                format!("wr{s}(P[{k}] + e, v.x);"),
            ),
            DType::F64 => (String::new(), String::new(), String::new()),
            DType::I32 => (
                format!("sti{k}(e, i32(v));"),
                format!("wr{s}(P[{k}] + e, bitcast<u32>(v));"),
                format!("wr{s}(P[{k}] + e, v.x);"),
            ),
            DType::I64 => (
                format!("sti{k}(e, i32(v));"),
                format!(
                    "wr{s}(P[{k}] + 2u * e, bitcast<u32>(v)); wr{s}(P[{k}] + 2u * e + 1u, select(0u, 0xffffffffu, v < 0));"
                ),
                format!("wr{s}(P[{k}] + 2u * e, v.x); wr{s}(P[{k}] + 2u * e + 1u, v.y);"),
            ),
            DType::F16 => (
                format!("lane{s}(P[{k}] + (e >> 1u), (e & 1u) * 16u, 0xffffu, f16_bits(v));"),
                format!("stf{k}(e, f32(v));"),
                format!("lane{s}(P[{k}] + (e >> 1u), (e & 1u) * 16u, 0xffffu, v.x);"),
            ),
            DType::BF16 => (
                format!("lane{s}(P[{k}] + (e >> 1u), (e & 1u) * 16u, 0xffffu, bf16_bits(v));"),
                format!("stf{k}(e, f32(v));"),
                format!("lane{s}(P[{k}] + (e >> 1u), (e & 1u) * 16u, 0xffffu, v.x);"),
            ),
            DType::U8 => (
                format!(
                    "if (v != v) {{ lane{s}(P[{k}] + (e >> 2u), (e & 3u) * 8u, 0xffu, 0u); }} else {{ lane{s}(P[{k}] + (e >> 2u), (e & 3u) * 8u, 0xffu, u32(clamp(v, 0.0, 255.0))); }}"
                ),
                format!("lane{s}(P[{k}] + (e >> 2u), (e & 3u) * 8u, 0xffu, bitcast<u32>(v));"),
                format!("lane{s}(P[{k}] + (e >> 2u), (e & 3u) * 8u, 0xffu, v.x);"),
            ),
            DType::Bool => (
                format!("lane{s}(P[{k}] + (e >> 2u), (e & 3u) * 8u, 0xffu, select(0u, 1u, v != 0.0));"),
                format!("lane{s}(P[{k}] + (e >> 2u), (e & 3u) * 8u, 0xffu, select(0u, 1u, v != 0));"),
                format!("lane{s}(P[{k}] + (e >> 2u), (e & 3u) * 8u, 0xffu, v.x);"),
            ),
        };
        let _ = writeln!(out, "fn stf{k}(e: u32, v: f32) {{ {stf} }}");
        let _ = writeln!(out, "fn sti{k}(e: u32, v: i32) {{ {sti} }}");
        let _ = writeln!(out, "fn straw{k}(e: u32, v: vec2<u32>) {{ {raw_st} }}");
    }
    out
}

/// Access functions for every operand of a launch (operand `k` is `dtypes[k]`; `written[k]`
/// says whether it is stored to).
pub(super) fn operands(plan: &BindingPlan, dtypes: &[DType], written: &[bool]) -> String {
    let mut s = String::new();
    for (k, (&d, &w)) in dtypes.iter().zip(written).enumerate() {
        s.push_str(&operand(k, d, plan.slot_of[k], w));
    }
    s
}

/// The entry point of a one-dimensional kernel over `n` items (`P[n_at]`), `li` the item index.
pub(super) fn main_1d(n_at: &str, body: &str) -> String {
    format!(
        "@compute @workgroup_size(256)\nfn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{\n  let li = (wid.y * nwg.x + wid.x) * 256u + lid;\n  if (li >= P[{n_at}]) {{ return; }}\n{body}\n}}\n"
    )
}

/// Workgroup counts for `n` items of a one-dimensional kernel (two-dimensional past 65535 groups).
pub(super) fn groups_1d(n: usize) -> [u32; 3] {
    let g = n.div_ceil(256).max(1);
    let x = g.min(65535);
    [x as u32, g.div_ceil(x) as u32, 1]
}

/// Workgroup counts for `n` workgroups (one per output row / reduction).
pub(super) fn groups_n(n: usize) -> [u32; 3] {
    let n = n.max(1);
    let x = n.min(65535);
    [x as u32, n.div_ceil(x) as u32, 1]
}

/// A WGSL f32 literal that round-trips exactly.
pub(super) fn f32_lit(v: f32) -> String {
    if v.is_nan() {
        "bitcast<f32>(0x7fc00000u)".to_string()
    } else if v.is_infinite() {
        if v > 0.0 { "bitcast<f32>(0x7f800000u)".to_string() } else { "bitcast<f32>(0xff800000u)".to_string() }
    } else {
        format!("bitcast<f32>({}u)", v.to_bits())
    }
}
