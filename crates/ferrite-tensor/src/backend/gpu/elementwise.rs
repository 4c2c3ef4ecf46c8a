//! Elementwise WGSL kernels: arithmetic, unary math and derivatives, comparisons, selection,
//! copies with dtype conversion, fills. One generic "map" launch walks every operand through its
//! own (broadcast, strided) layout, so transposed and expanded inputs need no copies.

use std::fmt::Write as _;

use super::runtime::{Operand, Runtime, read, write};
use super::wgsl;
use crate::backend::{BinaryOp, CompareOp, LogicalOp, UnaryOp};
use crate::error::{Result, TensorError};
use crate::layout::{Layout, contiguous_strides};
use crate::{DType, Tensor};

/// Compute class of a kernel: floats in f32, everything else in i32.
fn is_float(d: DType) -> bool {
    d.is_floating_point()
}

/// One elementwise launch over the shape of operand 0's layout.
pub(super) struct Map<'a> {
    pub op: &'static str,
    /// Identifies the body (op and variant) in the pipeline cache.
    pub key: String,
    pub ops: Vec<Operand<'a>>,
    /// Each operand's layout broadcast to the iteration shape.
    pub layouts: Vec<Layout>,
    pub scalars: Vec<u32>,
    /// WGSL statements; `e{k}` is operand k's element index, `sc(j)` scalar j's bits.
    pub body: String,
    /// Extra module-level WGSL functions the body calls.
    pub helpers: &'static str,
}

impl<'a> Map<'a> {
    pub fn new(op: &'static str, key: impl Into<String>) -> Map<'a> {
        Map {
            op,
            key: key.into(),
            ops: Vec::new(),
            layouts: Vec::new(),
            scalars: Vec::new(),
            body: String::new(),
            helpers: "",
        }
    }

    /// Add an operand seen through `layout` (already broadcast to the iteration shape).
    pub fn operand(mut self, o: Operand<'a>, layout: Layout) -> Self {
        self.ops.push(o);
        self.layouts.push(layout);
        self
    }

    /// Add operand `t` broadcast to `shape`.
    pub fn broadcast(self, o: Operand<'a>, shape: &[usize]) -> Result<Self> {
        let l = o.t.layout().broadcast_to(shape, self.op)?;
        Ok(self.operand(o, l))
    }

    pub fn scalar(mut self, bits: u32) -> Self {
        self.scalars.push(bits);
        self
    }

    pub fn body(mut self, b: impl Into<String>) -> Self {
        self.body = b.into();
        self
    }

    pub fn helpers(mut self, h: &'static str) -> Self {
        self.helpers = h;
        self
    }

    pub fn run(self, rt: &Runtime) -> Result<()> {
        let shape = self.layouts[0].shape.clone();
        let n: usize = shape.iter().product();
        if n == 0 {
            return Ok(());
        }
        if n > u32::MAX as usize {
            return Err(TensorError::invalid(
                self.op,
                format!("{n} elements are more than a GPU kernel can index (2^32)"),
            ));
        }
        let rank = shape.len();
        let cont = contiguous_strides(&shape);
        let nops = self.ops.len();
        let contiguous: Vec<bool> = self
            .layouts
            .iter()
            .map(|l| shape.iter().zip(l.strides.iter().zip(&cont)).all(|(&d, (&s, &c))| d == 1 || s == c))
            .collect();
        let mut params: Vec<u32> = vec![n as u32, rank as u32];
        params.extend(shape.iter().map(|&d| d as u32));
        for l in &self.layouts {
            params.push(l.offset as u32);
            params.extend(l.strides.iter().map(|&s| s as u32));
        }
        params.extend_from_slice(&self.scalars);
        let dtypes: Vec<DType> = self.ops.iter().map(|o| o.t.dtype()).collect();
        let written: Vec<bool> = self.ops.iter().map(|o| o.access != super::runtime::Access::Read).collect();
        let key = format!("map:{}|{:?}|{:?}|{}", self.key, dtypes, contiguous, nops);
        let body = self.body;
        let helpers = self.helpers;
        rt.launch(self.op, &key, &self.ops, false, &params, wgsl::groups_1d(n), |plan| {
            let m = nops; // parameters after the word bases
            let mut s = wgsl::header(plan);
            s.push_str(&wgsl::operands(plan, &dtypes, &written));
            let _ = writeln!(s, "fn rank() -> u32 {{ return P[{}u]; }}", m + 1);
            let _ = writeln!(s, "fn sc(j: u32) -> u32 {{ let r = rank(); return P[{m}u + 2u + r + {nops}u * (r + 1u) + j]; }}");
            for (k, &c) in contiguous.iter().enumerate() {
                if c {
                    let _ = writeln!(s, "fn el{k}(li: u32) -> u32 {{ let r = rank(); return P[{m}u + 2u + r + {k}u * (r + 1u)] + li; }}");
                } else {
                    let _ = writeln!(
                        s,
                        "fn el{k}(li: u32) -> u32 {{ let r = rank(); let base = {m}u + 2u + r + {k}u * (r + 1u); var rem = li; var e = P[base]; var d = r; loop {{ if (d == 0u) {{ break; }} d = d - 1u; let sz = P[{m}u + 2u + d]; e = e + (rem % sz) * P[base + 1u + d]; rem = rem / sz; }} return e; }}"
                    );
                }
            }
            s.push_str(MATH);
            s.push_str(helpers);
            let mut b = String::new();
            for k in 0..nops {
                let _ = writeln!(b, "  let e{k} = el{k}(li);");
            }
            b.push_str(&body);
            s.push_str(&wgsl::main_1d(&format!("{m}u"), &b));
            s
        })
    }
}

/// Math the CPU kernels take from libm, written for f32.
const MATH: &str = r#"
fn erf_f(x: f32) -> f32 {
    // Abramowitz & Stegun 7.1.26 refined (max abs error ~1.2e-7).
    let a = abs(x);
    let t = 1.0 / (1.0 + 0.5 * a);
    let y = 1.0 - t * exp(-a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))));
    return select(-y, y, x >= 0.0);
}
fn powf(x: f32, p: f32) -> f32 {
    if (p == 2.0) { return x * x; }
    if (p == 3.0) { return x * x * x; }
    if (p == 1.0) { return x; }
    if (p == 0.5) { return sqrt(x); }
    if (p == -1.0) { return 1.0 / x; }
    if (p == 0.0) { return 1.0; }
    if (x < 0.0 && floor(p) == p) {
        let r = pow(-x, p);
        let odd = (abs(p) % 2.0) == 1.0;
        return select(r, -r, odd);
    }
    return pow(x, p);
}
fn log1p_f(x: f32) -> f32 {
    let u = 1.0 + x;
    if (u == 1.0) { return x; }
    return log(u) * x / (u - 1.0);
}
fn sigmoid_f(x: f32) -> f32 { return 1.0 / (1.0 + exp(-x)); }
fn tanh_f(x: f32) -> f32 {
    if (abs(x) > 15.0) { return sign(x); }
    return tanh(x);
}
fn isnan_f(x: f32) -> bool { return x != x; }
fn fmax_nan(x: f32, y: f32) -> f32 { if (isnan_f(x) || isnan_f(y)) { return bitcast<f32>(0x7fc00000u); } return max(x, y); }
fn fmin_nan(x: f32, y: f32) -> f32 { if (isnan_f(x) || isnan_f(y)) { return bitcast<f32>(0x7fc00000u); } return min(x, y); }
"#;

fn float_binary_expr(op: BinaryOp, a: &str, b: &str) -> String {
    match op {
        BinaryOp::Add => format!("({a} + {b})"),
        BinaryOp::Sub => format!("({a} - {b})"),
        BinaryOp::Mul => format!("({a} * {b})"),
        BinaryOp::Div => format!("({a} / {b})"),
        BinaryOp::Pow => format!("powf({a}, {b})"),
        BinaryOp::Maximum => format!("fmax_nan({a}, {b})"),
        BinaryOp::Minimum => format!("fmin_nan({a}, {b})"),
        BinaryOp::RSub => format!("({b} - {a})"),
        BinaryOp::RDiv => format!("({b} / {a})"),
    }
}

fn int_binary_expr(op: BinaryOp, a: &str, b: &str) -> String {
    match op {
        BinaryOp::Add => format!("({a} + {b})"),
        BinaryOp::Sub => format!("({a} - {b})"),
        BinaryOp::Mul => format!("({a} * {b})"),
        BinaryOp::Div | BinaryOp::RDiv => "0".to_string(),
        BinaryOp::Pow => format!("ipow({a}, {b})"),
        BinaryOp::Maximum => format!("max({a}, {b})"),
        BinaryOp::Minimum => format!("min({a}, {b})"),
        BinaryOp::RSub => format!("({b} - {a})"),
    }
}

/// The forward expression of a unary op on `x` (parameter `p`), in f32.
fn unary_expr(op: UnaryOp) -> &'static str {
    match op {
        UnaryOp::Exp => "exp(x)",
        UnaryOp::Log => "log(x)",
        UnaryOp::Sqrt => "sqrt(x)",
        UnaryOp::Rsqrt => "1.0 / sqrt(x)",
        UnaryOp::Tanh => "tanh_f(x)",
        UnaryOp::Sigmoid => "sigmoid_f(x)",
        UnaryOp::Relu => "select(select(0.0, x, isnan_f(x)), x, x > 0.0)",
        UnaryOp::Neg => "-x",
        UnaryOp::Abs => "abs(x)",
        UnaryOp::Sin => "sin(x)",
        UnaryOp::Cos => "cos(x)",
        UnaryOp::Log1p => "log1p_f(x)",
        UnaryOp::Reciprocal => "1.0 / x",
        UnaryOp::Square => "x * x",
        UnaryOp::Pow(_) => "powf(x, p)",
        UnaryOp::Gelu => "0.5 * x * (1.0 + erf_f(x * 0.70710678118654752))",
        UnaryOp::GeluTanh => "0.5 * x * (1.0 + tanh_f(0.79788456080286536 * (x + 0.044715 * x * x * x)))",
        UnaryOp::Silu => "x / (1.0 + exp(-x))",
        UnaryOp::LeakyRelu(_) => "select(x * p, x, x > 0.0)",
    }
}

/// The derivative of a unary op given the saved value `s` (output or input), in f32.
fn derivative_expr(op: UnaryOp) -> &'static str {
    match op {
        UnaryOp::Exp => "s",
        UnaryOp::Log => "1.0 / s",
        UnaryOp::Sqrt => "0.5 / s",
        UnaryOp::Rsqrt => "-0.5 * s * s * s",
        UnaryOp::Tanh => "1.0 - s * s",
        UnaryOp::Sigmoid => "s * (1.0 - s)",
        UnaryOp::Relu => "select(0.0, 1.0, s > 0.0)",
        UnaryOp::Neg => "-1.0",
        UnaryOp::Abs => "select(select(0.0, -1.0, s < 0.0), 1.0, s > 0.0)",
        UnaryOp::Sin => "cos(s)",
        UnaryOp::Cos => "-sin(s)",
        UnaryOp::Log1p => "1.0 / (1.0 + s)",
        UnaryOp::Reciprocal => "-(s * s)",
        UnaryOp::Square => "2.0 * s",
        UnaryOp::Pow(_) => "select(p * powf(s, p - 1.0), 0.0, p == 0.0)",
        UnaryOp::Gelu => "0.5 * (1.0 + erf_f(s * 0.70710678118654752)) + s * exp(-0.5 * s * s) * 0.39894228040143268",
        UnaryOp::GeluTanh => "gelu_tanh_d(s)",
        UnaryOp::Silu => "silu_d(s)",
        UnaryOp::LeakyRelu(_) => "select(p, 1.0, s > 0.0)",
    }
}

const DERIV_HELPERS: &str = "fn gelu_tanh_d(x: f32) -> f32 { let k = 0.79788456080286536; let x2 = x * x; let t = tanh_f(k * (x + 0.044715 * x2 * x)); return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x2); }\nfn silu_d(x: f32) -> f32 { let s = sigmoid_f(x); return s * (1.0 + x * (1.0 - s)); }\n";

fn unary_param(op: UnaryOp) -> f32 {
    match op {
        UnaryOp::Pow(p) | UnaryOp::LeakyRelu(p) => p as f32,
        _ => 0.0,
    }
}

fn unary_key(op: UnaryOp) -> String {
    // The parameter is a run-time scalar: one pipeline per function, not per value.
    op.name().to_string()
        + match op {
            UnaryOp::GeluTanh => "_tanh",
            _ => "",
        }
}

pub(super) fn binary(rt: &Runtime, op: BinaryOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    let shape = out.shape().to_vec();
    let body = if is_float(out.dtype()) {
        format!("  stf0(e0, {});\n", float_binary_expr(op, "ldf1(e1)", "ldf2(e2)"))
    } else {
        format!("  sti0(e0, {});\n", int_binary_expr(op, "ldi1(e1)", "ldi2(e2)"))
    };
    Map::new(op.name(), format!("bin:{op:?}"))
        .operand(write(out), out.layout().clone())
        .broadcast(read(a), &shape)?
        .broadcast(read(b), &shape)?
        .body(body)
        .run(rt)
}

pub(super) fn binary_scalar(rt: &Runtime, op: BinaryOp, out: &Tensor, a: &Tensor, s: f64) -> Result<()> {
    let shape = out.shape().to_vec();
    let (body, bits) = if is_float(out.dtype()) {
        (format!("  stf0(e0, {});\n", float_binary_expr(op, "ldf1(e1)", "bitcast<f32>(sc(0u))")), (s as f32).to_bits())
    } else {
        (
            format!("  sti0(e0, {});\n", int_binary_expr(op, "ldi1(e1)", "bitcast<i32>(sc(0u))")),
            (s as i64 as i32) as u32,
        )
    };
    Map::new(op.name(), format!("bins:{op:?}"))
        .operand(write(out), out.layout().clone())
        .broadcast(read(a), &shape)?
        .scalar(bits)
        .body(body)
        .run(rt)
}

pub(super) fn binary_inplace(rt: &Runtime, op: BinaryOp, dst: &Tensor, src: &Tensor) -> Result<()> {
    let shape = dst.shape().to_vec();
    let body = if is_float(dst.dtype()) {
        format!("  stf0(e0, {});\n", float_binary_expr(op, "ldf0(e0)", "ldf1(e1)"))
    } else {
        format!("  sti0(e0, {});\n", int_binary_expr(op, "ldi0(e0)", "ldi1(e1)"))
    };
    Map::new(op.name(), format!("bini:{op:?}"))
        .operand(write(dst), dst.layout().clone())
        .broadcast(read(src), &shape)?
        .body(body)
        .run(rt)
}

pub(super) fn unary(rt: &Runtime, op: UnaryOp, out: &Tensor, x: &Tensor) -> Result<()> {
    let shape = out.shape().to_vec();
    let body = format!("  let x = ldf1(e1);\n  let p = bitcast<f32>(sc(0u));\n  stf0(e0, {});\n", unary_expr(op));
    Map::new(op.name(), format!("un:{}", unary_key(op)))
        .operand(write(out), out.layout().clone())
        .broadcast(read(x), &shape)?
        .scalar(unary_param(op).to_bits())
        .body(body)
        .run(rt)
}

pub(super) fn unary_backward(rt: &Runtime, op: UnaryOp, out: &Tensor, g: &Tensor, saved: &Tensor) -> Result<()> {
    let shape = out.shape().to_vec();
    let body = format!(
        "  let s = ldf2(e2);\n  let p = bitcast<f32>(sc(0u));\n  stf0(e0, ldf1(e1) * ({}));\n",
        derivative_expr(op)
    );
    let map = Map::new(op.backward_name(), format!("unb:{}", unary_key(op)))
        .operand(write(out), out.layout().clone())
        .broadcast(read(g), &shape)?
        .broadcast(read(saved), &shape)?
        .scalar(unary_param(op).to_bits());
    map.body(body).helpers(DERIV_HELPERS).run(rt)
}

pub(super) fn clamp(rt: &Runtime, out: &Tensor, x: &Tensor, lo: f64, hi: f64) -> Result<()> {
    let shape = out.shape().to_vec();
    if is_float(out.dtype()) {
        let body = "  let v = ldf1(e1);\n  let lo = bitcast<f32>(sc(0u));\n  let hi = bitcast<f32>(sc(1u));\n  var r = v;\n  if (!isnan_f(v)) { if (v < lo) { r = lo; } else if (v > hi) { r = hi; } }\n  stf0(e0, r);\n";
        return Map::new("clamp", "clampf")
            .operand(write(out), out.layout().clone())
            .broadcast(read(x), &shape)?
            .scalar((lo as f32).to_bits())
            .scalar((hi as f32).to_bits())
            .body(body)
            .run(rt);
    }
    let clip = |v: f64| v.clamp(i32::MIN as f64, i32::MAX as f64) as i32 as u32;
    let body = "  let v = ldi1(e1);\n  sti0(e0, clamp(v, bitcast<i32>(sc(0u)), bitcast<i32>(sc(1u))));\n";
    Map::new("clamp", "clampi")
        .operand(write(out), out.layout().clone())
        .broadcast(read(x), &shape)?
        .scalar(clip(lo.ceil()))
        .scalar(clip(hi.floor()))
        .body(body)
        .run(rt)
}

fn compare_op(op: CompareOp) -> &'static str {
    match op {
        CompareOp::Eq => "==",
        CompareOp::Ne => "!=",
        CompareOp::Lt => "<",
        CompareOp::Le => "<=",
        CompareOp::Gt => ">",
        CompareOp::Ge => ">=",
    }
}

pub(super) fn compare(rt: &Runtime, op: CompareOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    let shape = out.shape().to_vec();
    let (ld, cls) = if is_float(a.dtype()) { ("ldf", "f") } else { ("ldi", "i") };
    let body = format!("  sti0(e0, select(0, 1, {ld}1(e1) {} {ld}2(e2)));\n", compare_op(op));
    Map::new(op.name(), format!("cmp:{op:?}{cls}"))
        .operand(write(out), out.layout().clone())
        .broadcast(read(a), &shape)?
        .broadcast(read(b), &shape)?
        .body(body)
        .run(rt)
}

pub(super) fn compare_scalar(rt: &Runtime, op: CompareOp, out: &Tensor, a: &Tensor, s: f64) -> Result<()> {
    let shape = out.shape().to_vec();
    // Integers compare exactly against the scalar in f32 only when representable; compare in
    // f32 for floats and in i32 (with the scalar rounded the way the comparison needs) for ints.
    let body = if is_float(a.dtype()) || s.fract() != 0.0 || s.abs() > 2_147_483_647.0 {
        format!("  sti0(e0, select(0, 1, ldf1(e1) {} bitcast<f32>(sc(0u))));\n", compare_op(op))
    } else {
        format!("  sti0(e0, select(0, 1, ldi1(e1) {} bitcast<i32>(sc(1u))));\n", compare_op(op))
    };
    Map::new(op.name(), format!("cmps:{op:?}:{}", body.contains("ldi")))
        .operand(write(out), out.layout().clone())
        .broadcast(read(a), &shape)?
        .scalar((s as f32).to_bits())
        .scalar((s as i64 as i32) as u32)
        .body(body)
        .run(rt)
}

pub(super) fn logical(rt: &Runtime, op: LogicalOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    let shape = out.shape().to_vec();
    let o = if op == LogicalOp::And { "&&" } else { "||" };
    let body = format!("  sti0(e0, select(0, 1, (ldi1(e1) != 0) {o} (ldi2(e2) != 0)));\n");
    Map::new("logical", format!("log:{op:?}"))
        .operand(write(out), out.layout().clone())
        .broadcast(read(a), &shape)?
        .broadcast(read(b), &shape)?
        .body(body)
        .run(rt)
}

pub(super) fn where_cond(rt: &Runtime, out: &Tensor, cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    let shape = out.shape().to_vec();
    let body = "  straw0(e0, select(ldraw3(e3), ldraw2(e2), ldi1(e1) != 0));\n";
    Map::new("where", "where")
        .operand(write(out), out.layout().clone())
        .broadcast(read(cond), &shape)?
        .broadcast(read(a), &shape)?
        .broadcast(read(b), &shape)?
        .body(body)
        .run(rt)
}

pub(super) fn copy(rt: &Runtime, dst: &Tensor, src: &Tensor) -> Result<()> {
    let shape = dst.shape().to_vec();
    let body = if dst.dtype() == src.dtype() {
        "  straw0(e0, ldraw1(e1));\n"
    } else if is_float(dst.dtype()) || is_float(src.dtype()) {
        "  stf0(e0, ldf1(e1));\n"
    } else {
        "  sti0(e0, ldi1(e1));\n"
    };
    Map::new("copy_", format!("copy:{}", body.trim()))
        .operand(write(dst), dst.layout().clone())
        .broadcast(read(src), &shape)?
        .body(body)
        .run(rt)
}

/// The exact bits of `value` stored as `dtype` (what `straw` writes).
fn value_bits(value: f64, dtype: DType) -> (u32, u32) {
    match dtype {
        DType::F32 => ((value as f32).to_bits(), 0),
        DType::F64 => (0, 0),
        DType::F16 => (half::f16::from_f64(value).to_bits() as u32, 0),
        DType::BF16 => (half::bf16::from_f64(value).to_bits() as u32, 0),
        DType::I64 => {
            let v = value as i64;
            (v as u32, (v >> 32) as u32)
        }
        DType::I32 => ((value as i32) as u32, 0),
        DType::U8 => ((value as u8) as u32, 0),
        DType::Bool => ((value != 0.0) as u32, 0),
    }
}

pub(super) fn fill(rt: &Runtime, dst: &Tensor, value: f64) -> Result<()> {
    let (lo, hi) = value_bits(value, dst.dtype());
    Map::new("fill", "fill")
        .operand(write(dst), dst.layout().clone())
        .scalar(lo)
        .scalar(hi)
        .body("  straw0(e0, vec2<u32>(sc(0u), sc(1u)));\n")
        .run(rt)
}
