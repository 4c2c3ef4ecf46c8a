//! The elementwise losses ([`PointwiseLoss`]) and their gradients on the GPU: one WGSL map each,
//! with the formulas of the CPU backend (`backend/cpu/loss.rs`) in f32. Absent weights are not
//! bound at all (the body uses 1), so the common unweighted loss reads two operands.
//!
//! One difference from the CPU: `binary_cross_entropy` cannot stop the run when an input or
//! target lies outside [0, 1] (a kernel has no error path short of the index flag, and PyTorch's
//! CUDA kernel asserts on the device); those elements come out NaN, which the loss then shows.

use std::fmt::Write as _;

use super::elementwise::Map;
use super::runtime::{Runtime, read, write};
use crate::Tensor;
use crate::backend::{LossGrad, LossOperands, PointwiseLoss};
use crate::error::Result;

/// WGSL helpers of the loss bodies (the shared `MATH` block supplies `log1p_f`, `sigmoid_f`).
const HELPERS: &str = "fn clog(v: f32) -> f32 { if (v < -100.0) { return -100.0; } return v; }\n\
fn log_sigmoid(x: f32) -> f32 { return min(x, 0.0) - log1p_f(exp(-abs(x))); }\n\
fn xlogx(t: f32) -> f32 { if (t == 0.0) { return 0.0; } return t * log(t); }\n";

/// The key of the loss variant (which code the body has; scalars are run-time parameters).
fn key(op: PointwiseLoss) -> String {
    match op {
        PointwiseLoss::Bce => "bce".into(),
        PointwiseLoss::BceWithLogits => "bcel".into(),
        PointwiseLoss::SmoothL1 { beta } => format!("sl1:{}", beta == 0.0),
        PointwiseLoss::Huber { .. } => "huber".into(),
        PointwiseLoss::KlDiv { log_target } => format!("kl:{log_target}"),
    }
}

fn scalar(op: PointwiseLoss) -> f32 {
    match op {
        PointwiseLoss::SmoothL1 { beta } => beta as f32,
        PointwiseLoss::Huber { delta } => delta as f32,
        _ => 0.0,
    }
}

/// Bind the loss operands after the `first` already bound ones; returns the map and the WGSL
/// expressions of (x, t, w, pw).
fn bind<'a>(mut map: Map<'a>, first: usize, shape: &[usize], x: &LossOperands<'a>) -> Result<(Map<'a>, [String; 4])> {
    let mut next = first;
    let mut expr = |t: Option<&'a Tensor>, map: Map<'a>| -> Result<(Map<'a>, String)> {
        match t {
            Some(t) => {
                let k = next;
                next += 1;
                Ok((map.broadcast(read(t), shape)?, format!("ldf{k}(e{k})")))
            }
            None => Ok((map, "1.0".to_string())),
        }
    };
    let (map1, xe) = expr(Some(x.input), map)?;
    let (map2, te) = expr(Some(x.target), map1)?;
    let (map3, we) = expr(x.weight, map2)?;
    map = map3;
    let (map4, pe) = expr(x.pos_weight, map)?;
    Ok((map4, [xe, te, we, pe]))
}

fn presence(x: &LossOperands<'_>) -> String {
    format!("w{}p{}", x.weight.is_some() as u8, x.pos_weight.is_some() as u8)
}

pub(super) fn pointwise_loss(rt: &Runtime, op: PointwiseLoss, out: &Tensor, x: LossOperands<'_>) -> Result<()> {
    let shape = out.shape().to_vec();
    let map =
        Map::new(op.name(), format!("loss:{}:{}", key(op), presence(&x))).operand(write(out), out.layout().clone());
    let (map, [xe, te, we, pe]) = bind(map, 1, &shape, &x)?;
    let mut b = format!(
        "  let x = {xe};\n  let t = {te};\n  let w = {we};\n  let pw = {pe};\n  let k = bitcast<f32>(sc(0u));\n"
    );
    let value = match op {
        PointwiseLoss::Bce => {
            "select((t - 1.0) * clog(log1p_f(-x)) - t * clog(log(x)), bitcast<f32>(0x7fc00000u), !(x >= 0.0 && x <= 1.0 && t >= 0.0 && t <= 1.0)) * w"
        }
        PointwiseLoss::BceWithLogits => "((1.0 - t) * x - ((pw - 1.0) * t + 1.0) * log_sigmoid(x)) * w",
        PointwiseLoss::SmoothL1 { beta: 0.0 } => "abs(x - t)",
        PointwiseLoss::SmoothL1 { .. } => {
            "select(abs(x - t) - 0.5 * k, 0.5 * abs(x - t) * abs(x - t) / k, abs(x - t) < k)"
        }
        PointwiseLoss::Huber { .. } => {
            "select(k * (abs(x - t) - 0.5 * k), 0.5 * abs(x - t) * abs(x - t), abs(x - t) < k)"
        }
        PointwiseLoss::KlDiv { log_target: true } => "exp(t) * (t - x)",
        PointwiseLoss::KlDiv { log_target: false } => "xlogx(t) - t * x",
    };
    let _ = writeln!(b, "  stf0(e0, {value});");
    map.scalar(scalar(op).to_bits()).body(b).helpers(HELPERS).run(rt)
}

pub(super) fn pointwise_loss_backward(
    rt: &Runtime,
    op: PointwiseLoss,
    wrt: LossGrad,
    out: &Tensor,
    grad: &Tensor,
    x: LossOperands<'_>,
) -> Result<()> {
    let shape = out.shape().to_vec();
    let target = wrt == LossGrad::Target;
    let map = Map::new(op.backward_name(), format!("lossb:{}:{}:{target}", key(op), presence(&x)))
        .operand(write(out), out.layout().clone())
        .broadcast(read(grad), &shape)?;
    let (map, [xe, te, we, pe]) = bind(map, 2, &shape, &x)?;
    let mut b = format!(
        "  let g = ldf1(e1);\n  let x = {xe};\n  let t = {te};\n  let w = {we};\n  let pw = {pe};\n  let k = bitcast<f32>(sc(0u));\n"
    );
    let sign = if target { "-" } else { "" };
    let value = match (op, target) {
        (PointwiseLoss::Bce, true) => "g * (clog(log1p_f(-x)) - clog(log(x))) * w".to_string(),
        (PointwiseLoss::Bce, false) => "g * (x - t) / max((1.0 - x) * x, 1e-12) * w".to_string(),
        (PointwiseLoss::BceWithLogits, true) => "g * (-x - (pw - 1.0) * log_sigmoid(x)) * w".to_string(),
        (PointwiseLoss::BceWithLogits, false) => {
            "g * ((1.0 - t) - ((pw - 1.0) * t + 1.0) * sigmoid_f(-x)) * w".to_string()
        }
        (PointwiseLoss::SmoothL1 { beta: 0.0 }, _) => format!("{sign}(g * sign(x - t))"),
        (PointwiseLoss::SmoothL1 { .. }, _) => {
            format!("{sign}select(select((x - t) * g / k, g, x - t >= k), -g, x - t <= -k)")
        }
        (PointwiseLoss::Huber { .. }, _) => {
            format!("{sign}select(select((x - t) * g, g * k, x - t >= k), -g * k, x - t <= -k)")
        }
        (PointwiseLoss::KlDiv { log_target: true }, false) => "-(g * exp(t))".to_string(),
        (PointwiseLoss::KlDiv { log_target: false }, false) => "-(g * t)".to_string(),
        (PointwiseLoss::KlDiv { log_target: true }, true) => "g * exp(t) * (t - x + 1.0)".to_string(),
        (PointwiseLoss::KlDiv { log_target: false }, true) => {
            "g * (select(log(t), 0.0, t == 0.0) + t / t - x)".to_string()
        }
    };
    let _ = writeln!(b, "  stf0(e0, {value});");
    map.scalar(scalar(op).to_bits()).body(b).helpers(HELPERS).run(rt)
}
