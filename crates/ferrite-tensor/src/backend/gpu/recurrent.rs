//! The recurrent cells' pointwise step ([`RecurrentCell`]) and its gradient on the GPU: one
//! WGSL map over a step's `rows × hidden` units each way, with the CPU backend's formulas
//! (`backend/cpu/recurrent.rs`) in f32. Each gate is bound as a view of its row block (columns
//! `[k·hidden, (k+1)·hidden)`), so the stacked gate tensors need no copies, and absent biases are
//! not bound at all.

use std::fmt::Write as _;

use super::elementwise::Map;
use super::runtime::{Operand, Runtime, read, write};
use super::wgsl::round_expr;
use crate::backend::{CellBackward, CellForward, RecurrentCell};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::{DType, Tensor};

/// The operands of one launch, each seen as a `[rows, hidden]` view.
struct Launch<'a> {
    rows: usize,
    hidden: usize,
    ops: Vec<(Operand<'a>, Layout)>,
    /// Which optional operands are bound (part of the pipeline key).
    present: String,
}

impl<'a> Launch<'a> {
    fn new(rows: usize, hidden: usize) -> Launch<'a> {
        Launch { rows, hidden, ops: Vec::new(), present: String::new() }
    }

    /// Gate `k` of the row block `t` (`[rows, G·hidden]`, or `[rows, hidden]` with `k` 0).
    fn view(&self, t: &Tensor, k: usize) -> Layout {
        let (s0, s1) = (t.strides()[0], if t.shape()[1] <= 1 { 1 } else { t.strides()[1] });
        Layout {
            shape: [self.rows, self.hidden].into_iter().collect(),
            strides: [s0, s1].into_iter().collect(),
            offset: t.storage_offset() + k * self.hidden * s1,
        }
    }

    fn push(&mut self, o: Operand<'a>, layout: Layout) -> usize {
        self.ops.push((o, layout));
        self.ops.len() - 1
    }

    /// Bind gate `k` of `t` for writing; returns its operand index.
    fn out(&mut self, t: &'a Tensor, k: usize) -> usize {
        let l = self.view(t, k);
        self.push(write(t), l)
    }

    /// Bind gate `k` of `t` for reading; returns the WGSL expression of its value.
    fn input(&mut self, t: &'a Tensor, k: usize) -> String {
        let l = self.view(t, k);
        let i = self.push(read(t), l);
        format!("ldf{i}(e{i})")
    }

    /// Like [`input`](Self::input) for an optional operand (`default` when absent).
    fn opt(&mut self, t: Option<&'a Tensor>, k: usize, default: &str) -> String {
        self.present.push(if t.is_some() { '1' } else { '0' });
        match t {
            Some(t) => self.input(t, k),
            None => default.to_string(),
        }
    }

    /// Gate `k` of a bias `[G·hidden]` broadcast over the rows ("0.0" when absent).
    fn bias(&mut self, b: Option<&'a Tensor>, k: usize) -> String {
        self.present.push(if b.is_some() { '1' } else { '0' });
        let Some(b) = b else { return "0.0".to_string() };
        let l = Layout {
            shape: [self.rows, self.hidden].into_iter().collect(),
            strides: [0, b.strides().first().copied().unwrap_or(1)].into_iter().collect(),
            offset: b.storage_offset() + k * self.hidden * b.strides().first().copied().unwrap_or(1),
        };
        let i = self.push(read(b), l);
        format!("ldf{i}(e{i})")
    }

    fn run(self, rt: &Runtime, op: &'static str, key: String, body: String) -> Result<()> {
        let mut map = Map::new(op, format!("{key}:{}", self.present));
        for (o, l) in self.ops {
            map = map.operand(o, l);
        }
        map.body(body).run(rt)
    }
}

fn missing(op: &'static str) -> TensorError {
    TensorError::invalid(op, "internal: a recurrent cell operand is missing")
}

pub(super) fn forward(rt: &Runtime, cell: RecurrentCell, x: &CellForward<'_>) -> Result<()> {
    let op = cell.name();
    let (rows, hidden) = (x.h.shape()[0], x.h.shape()[1]);
    if rows == 0 || hidden == 0 {
        return Ok(());
    }
    let dtype = x.h.dtype();
    let mut l = Launch::new(rows, hidden);
    let h = l.out(x.h, 0);
    let mut b = String::new();
    match cell {
        RecurrentCell::Lstm => {
            let (c_t, sv) = (x.c.ok_or_else(|| missing(op))?, x.saved.ok_or_else(|| missing(op))?);
            let c = l.out(c_t, 0);
            let s: Vec<usize> = (0..4).map(|k| l.out(sv, k)).collect();
            for (k, name) in ["i", "f", "g", "o"].iter().enumerate() {
                let (gi, gh) = (l.input(x.gi, k), l.input(x.gh, k));
                let (bi, bh) = (l.bias(x.b_ih, k), l.bias(x.b_hh, k));
                let _ = writeln!(b, "  let p{name} = ({gi} + {bi}) + ({gh} + {bh});");
            }
            let cp = l.input(x.c_prev.ok_or_else(|| missing(op))?, 0);
            let cn = round_expr(dtype, "f * cp + i * g");
            let _ = writeln!(
                b,
                "  let i = sigmoid_f(pi);\n  let f = sigmoid_f(pf);\n  let g = tanh_f(pg);\n  let o = sigmoid_f(po);\n  let cp = {cp};\n  let cn = {cn};"
            );
            let _ = writeln!(b, "  stf{c}(e{c}, cn);\n  stf{h}(e{h}, o * tanh_f(cn));");
            for (k, v) in ["i", "f", "g", "o"].iter().enumerate() {
                let _ = writeln!(b, "  stf{}(e{}, {v});", s[k], s[k]);
            }
        }
        RecurrentCell::Gru => {
            let sv = x.saved.ok_or_else(|| missing(op))?;
            let s: Vec<usize> = (0..4).map(|k| l.out(sv, k)).collect();
            for (k, name) in ["r", "z"].iter().enumerate() {
                let (gi, gh) = (l.input(x.gi, k), l.input(x.gh, k));
                let (bi, bh) = (l.bias(x.b_ih, k), l.bias(x.b_hh, k));
                let _ = writeln!(b, "  let {name} = sigmoid_f(({gi} + {bi}) + ({gh} + {bh}));");
            }
            let (gi, gh) = (l.input(x.gi, 2), l.input(x.gh, 2));
            let (bi, bh) = (l.bias(x.b_ih, 2), l.bias(x.b_hh, 2));
            let hp = l.input(x.h_prev, 0);
            let _ = writeln!(b, "  let hn = {gh} + {bh};\n  let n = tanh_f(({gi} + {bi}) + r * hn);");
            let _ = writeln!(b, "  stf{h}(e{h}, n + z * ({hp} - n));");
            for (k, v) in ["r", "z", "n", "hn"].iter().enumerate() {
                let _ = writeln!(b, "  stf{}(e{}, {v});", s[k], s[k]);
            }
        }
        RecurrentCell::RnnTanh | RecurrentCell::RnnRelu => {
            let (gi, gh) = (l.input(x.gi, 0), l.input(x.gh, 0));
            let (bi, bh) = (l.bias(x.b_ih, 0), l.bias(x.b_hh, 0));
            let _ = writeln!(b, "  let p = ({gi} + {bi}) + ({gh} + {bh});");
            let act = if cell == RecurrentCell::RnnRelu { "select(p, 0.0, p < 0.0)" } else { "tanh_f(p)" };
            let _ = writeln!(b, "  stf{h}(e{h}, {act});");
        }
    }
    l.run(rt, op, format!("rnnf:{}:{}", op, dtype == DType::F32), b)
}

pub(super) fn backward(rt: &Runtime, cell: RecurrentCell, x: &CellBackward<'_>) -> Result<()> {
    let op = cell.backward_name();
    let (rows, hidden) = (x.dh.shape()[0], x.dh.shape()[1]);
    if rows == 0 || hidden == 0 {
        return Ok(());
    }
    let mut l = Launch::new(rows, hidden);
    let mut b = String::new();
    match cell {
        RecurrentCell::Lstm => {
            let d: Vec<usize> = (0..4).map(|k| l.out(x.dgi, k)).collect();
            let dcp = l.out(x.dc_prev.ok_or_else(|| missing(op))?, 0);
            let dh = l.input(x.dh, 0);
            let dho = l.opt(x.dh_out, 0, "0.0");
            let dc = l.opt(x.dc, 0, "0.0");
            let sv = x.saved.ok_or_else(|| missing(op))?;
            let s: Vec<String> = (0..4).map(|k| l.input(sv, k)).collect();
            let c = l.input(x.c.ok_or_else(|| missing(op))?, 0);
            let cp = l.input(x.c_prev.ok_or_else(|| missing(op))?, 0);
            let _ = writeln!(
                b,
                "  let dh = {dh} + {dho};\n  let i = {};\n  let f = {};\n  let g = {};\n  let o = {};\n  let tc = tanh_f({c});\n  let dct = {dc} + dh * o * (1.0 - tc * tc);",
                s[0], s[1], s[2], s[3]
            );
            let _ = writeln!(
                b,
                "  stf{0}(e{0}, dct * g * i * (1.0 - i));\n  stf{1}(e{1}, dct * {cp} * f * (1.0 - f));\n  stf{2}(e{2}, dct * i * (1.0 - g * g));\n  stf{3}(e{3}, dh * tc * o * (1.0 - o));\n  stf{4}(e{4}, dct * f);",
                d[0], d[1], d[2], d[3], dcp
            );
        }
        RecurrentCell::Gru => {
            let gi: Vec<usize> = (0..3).map(|k| l.out(x.dgi, k)).collect();
            let dgh = x.dgh.ok_or_else(|| missing(op))?;
            let gh: Vec<usize> = (0..3).map(|k| l.out(dgh, k)).collect();
            let dhp = l.out(x.dh_prev.ok_or_else(|| missing(op))?, 0);
            let dh = l.input(x.dh, 0);
            let dho = l.opt(x.dh_out, 0, "0.0");
            let sv = x.saved.ok_or_else(|| missing(op))?;
            let s: Vec<String> = (0..4).map(|k| l.input(sv, k)).collect();
            let hp = l.input(x.h_prev.ok_or_else(|| missing(op))?, 0);
            let _ = writeln!(
                b,
                "  let dh = {dh} + {dho};\n  let r = {};\n  let z = {};\n  let n = {};\n  let hn = {};\n  let dn = dh * (1.0 - z) * (1.0 - n * n);\n  let dz = dh * ({hp} - n) * z * (1.0 - z);\n  let dr = dn * hn * r * (1.0 - r);",
                s[0], s[1], s[2], s[3]
            );
            let _ = writeln!(
                b,
                "  stf{0}(e{0}, dr);\n  stf{1}(e{1}, dz);\n  stf{2}(e{2}, dn);\n  stf{3}(e{3}, dr);\n  stf{4}(e{4}, dz);\n  stf{5}(e{5}, dn * r);\n  stf{6}(e{6}, dh * z);",
                gi[0], gi[1], gi[2], gh[0], gh[1], gh[2], dhp
            );
        }
        RecurrentCell::RnnTanh | RecurrentCell::RnnRelu => {
            let d = l.out(x.dgi, 0);
            let dh = l.input(x.dh, 0);
            let dho = l.opt(x.dh_out, 0, "0.0");
            let h = l.input(x.h, 0);
            let grad = if cell == RecurrentCell::RnnRelu { "select(0.0, dh, y > 0.0)" } else { "dh * (1.0 - y * y)" };
            let _ = writeln!(b, "  let dh = {dh} + {dho};\n  let y = {h};\n  stf{d}(e{d}, {grad});");
        }
    }
    l.run(rt, op, format!("rnnb:{}", cell.name()), b)
}
