//! Recurrent layers' maths: one layer in one direction of PyTorch's `RNN` (tanh/relu), `GRU` and
//! `LSTM`, over a sequence of time steps in which the batch may shrink (packed variable-length
//! sequences) — the building block `ferrite-nn`'s multi-layer, bidirectional layers stack.
//!
//! Why one op for a whole scan instead of a composition of tensor ops per step: a composition
//! records a dozen graph nodes and temporaries per step, and its backward accumulates a full
//! `W_hh`-sized gradient at every step. Here a step is two products and one fused kernel
//! ([`RecurrentCell`], one backend kernel forward and one backward): the input projection
//! `W_ih x` of *every* step is one GEMM before the scan, each step multiplies its previous state
//! by `W_hh` (the existing GEMM) and runs the cell kernel, which writes the new state and the
//! few gate values backward needs. Backward walks the steps in reverse with the same two pieces
//! (cell-backward kernel, one product with `W_hh`) and ends with one GEMM for `W_hh`'s gradient
//! over all steps, so the recorded graph is one node per layer and direction whatever the
//! sequence length. The step's weight is made ready once per scan (`StepProduct`: the CPU
//! packs it for its GEMM once, not at every step).
//!
//! Layout. The sequence is *time-major packed rows* `[N, features]`: step `t` owns
//! `batch_sizes[t]` consecutive rows, the first `batch_sizes[t]` sequences of a batch sorted by
//! decreasing length (PyTorch's `PackedSequence.data`). A padded batch of `B` sequences of `T`
//! steps is the special case `batch_sizes = [B; T]`. A sequence's final state is its state after
//! its last valid step (for the reverse direction, after step 0).

use std::borrow::Cow;

use crate::Tensor;
use crate::autograd::{BackwardFn, SavedTensor, no_grad};
use crate::backend::{BinaryOp, CellBackward, CellForward, PreparedRhs};
use crate::error::{ExpectedShape, Result, TensorError};
use crate::ops::binary::arith_inplace_raw;
use crate::ops::check_same_device;
use crate::ops::copy::copy_into;
use crate::ops::matmul::matmul_raw;
use crate::ops::reduce::sum_raw;

pub use crate::backend::RecurrentCell;

/// The parameters of one layer in one direction, in PyTorch's layout: `w_ih [G·hidden, input]`,
/// `w_hh [G·hidden, hidden]`, biases `[G·hidden]`, with `G` gates stacked in PyTorch's order
/// ([`RecurrentCell::gates`]: LSTM i, f, g, o; GRU r, z, n).
#[derive(Clone, Copy, Debug)]
pub struct RecurrentWeights<'a> {
    pub w_ih: &'a Tensor,
    pub w_hh: &'a Tensor,
    pub b_ih: Option<&'a Tensor>,
    pub b_hh: Option<&'a Tensor>,
}

/// What a scan returns: the hidden state at every step (`[N, hidden]`, the input's row layout),
/// and each sequence's final hidden (and, for the LSTM, cell) state `[batch, hidden]`.
#[derive(Clone, Debug)]
pub struct RecurrentOutput {
    pub output: Tensor,
    pub h_n: Tensor,
    pub c_n: Option<Tensor>,
}

/// One recurrent layer in one direction over time-major packed rows `x [N, input]` (see the
/// module documentation), `batch_sizes` summing to `N` and never increasing. `h0`/`c0` are the
/// initial states `[batch_sizes[0], hidden]` (zeros when absent; `c0` only for the LSTM);
/// `reverse` runs from the last step to the first (the backward half of a bidirectional layer).
/// Differentiable in `x`, every weight and the initial states.
///
/// ```
/// use ferrite_tensor::functional::{RecurrentCell, RecurrentWeights, recurrent_scan};
/// use ferrite_tensor::{DType, Device, Generator, Tensor};
/// # fn main() -> Result<(), ferrite_tensor::TensorError> {
/// let (cpu, mut g) = (Device::Cpu, Generator::new(0));
/// let (w_ih, w_hh) = (Tensor::randn_with(&[3 * 4, 2], DType::F32, &cpu, &mut g)?, Tensor::randn_with(&[3 * 4, 4], DType::F32, &cpu, &mut g)?);
/// // Two sequences of lengths 3 and 1: steps of 2, 1 and 1 rows.
/// let x = Tensor::randn_with(&[4, 2], DType::F32, &cpu, &mut g)?;
/// let w = RecurrentWeights { w_ih: &w_ih, w_hh: &w_hh, b_ih: None, b_hh: None };
/// let r = recurrent_scan(RecurrentCell::Gru, &x, &[2, 1, 1], w, None, None, false)?;
/// assert_eq!(r.output.shape(), [4, 4]);
/// assert_eq!(r.h_n.shape(), [2, 4]);
/// // The second sequence ended after step 0: its final state is its output there (row 1).
/// assert_eq!(r.h_n.select(0, 1)?.to_vec::<f32>()?, r.output.select(0, 1)?.to_vec::<f32>()?);
/// # Ok(()) }
/// ```
pub fn recurrent_scan(
    cell: RecurrentCell,
    x: &Tensor,
    batch_sizes: &[usize],
    w: RecurrentWeights<'_>,
    h0: Option<&Tensor>,
    c0: Option<&Tensor>,
    reverse: bool,
) -> Result<RecurrentOutput> {
    let op = cell.name();
    let check = |arg, t: &Tensor, expected: ExpectedShape| {
        if expected.admits(t.shape()) {
            Ok(())
        } else {
            Err(TensorError::InvalidShape { op, arg, shape: t.shape().to_vec(), expected })
        }
    };
    check("input", x, ExpectedShape::Named(&["rows", "input_size"]))?;
    check("w_hh", w.w_hh, ExpectedShape::Named(&["gates*hidden_size", "hidden_size"]))?;
    let gates = cell.gates();
    let hidden = w.w_hh.shape()[1];
    let width = gates * hidden;
    check("w_ih", w.w_ih, ExpectedShape::Exact(vec![width, x.shape()[1]]))?;
    check("w_hh", w.w_hh, ExpectedShape::Exact(vec![width, hidden]))?;
    for (arg, b) in [("b_ih", w.b_ih), ("b_hh", w.b_hh)] {
        if let Some(b) = b {
            check(arg, b, ExpectedShape::Exact(vec![width]))?;
        }
    }
    let steps = Steps::new(op, batch_sizes, x.shape(), reverse)?;
    let batch = steps.batch();
    for (arg, s) in [("h0", h0), ("c0", c0)] {
        if let Some(s) = s {
            check(arg, s, ExpectedShape::Exact(vec![batch, hidden]))?;
        }
    }
    if c0.is_some() && !cell.has_cell_state() {
        return Err(TensorError::invalid(op, "only the LSTM takes an initial cell state c0"));
    }
    let dtype = w.w_hh.dtype();
    if !dtype.is_floating_point() {
        return Err(TensorError::UnsupportedDType { op, dtype });
    }
    for t in [Some(x), Some(w.w_ih), w.b_ih, w.b_hh, h0, c0].into_iter().flatten() {
        check_same_device(op, w.w_hh, t)?;
    }
    let same_dtype = |t: &Tensor| if t.dtype() == dtype { Ok(t.clone()) } else { t.to_dtype(dtype) };
    // The input projection of every step at once (differentiable through matmul).
    let gi = same_dtype(&x.matmul(&w.w_ih.t()?)?)?;
    let b_ih = w.b_ih.map(same_dtype).transpose()?;
    let b_hh = w.b_hh.map(same_dtype).transpose()?;
    let zeros = || Tensor::zeros(&[batch, hidden], dtype, x.device());
    let h0 = match h0 {
        Some(h) => row_block(&same_dtype(h)?)?,
        None => zeros()?,
    };
    let c0 = match (cell.has_cell_state(), c0) {
        (false, _) => None,
        (true, Some(c)) => Some(row_block(&same_dtype(c)?)?),
        (true, None) => Some(zeros()?),
    };
    let mut inputs: Vec<&Tensor> = vec![&gi, w.w_hh];
    inputs.extend(b_ih.iter());
    inputs.extend(b_hh.iter());
    inputs.push(&h0);
    inputs.extend(c0.iter());
    // Without a graph (inference, no_grad) nothing is kept for backward: the cell state and the
    // gates live one step at a time.
    let keep = Tensor::needs_graph(&inputs);
    let scan = Scan { cell, steps, hidden };
    let fwd = {
        let _g = no_grad();
        scan.forward(&gi, w.w_hh, b_ih.as_ref(), b_hh.as_ref(), &h0, c0.as_ref(), keep)?
    };
    if !keep {
        return Ok(RecurrentOutput { output: fwd.out, h_n: fwd.h_n, c_n: fwd.c_n });
    }
    let mut outputs = vec![fwd.out.clone(), fwd.h_n.clone()];
    outputs.extend(fwd.c_n.clone());
    let back = ScanBackward {
        need: inputs.iter().map(|t| t.requires_grad()).collect(),
        has_b_ih: b_ih.is_some(),
        has_b_hh: b_hh.is_some(),
        w_hh: SavedTensor::new(w.w_hh),
        h0: SavedTensor::new(&h0),
        c0: c0.as_ref().map(SavedTensor::new),
        out: SavedTensor::new(&fwd.out),
        c_all: fwd.c_all.as_ref().map(SavedTensor::new),
        saved: fwd.saved.as_ref().map(SavedTensor::new),
        scan,
    };
    let mut o = Tensor::from_op(outputs, &inputs, Box::new(back)).into_iter();
    let (output, h_n) = (next(&mut o)?, next(&mut o)?);
    Ok(RecurrentOutput { output, h_n, c_n: o.next() })
}

fn next(it: &mut impl Iterator<Item = Tensor>) -> Result<Tensor> {
    it.next().ok_or_else(|| TensorError::invalid("recurrent_scan", "internal: an output went missing"))
}

/// A single-layer unidirectional LSTM over a padded batch (PyTorch's `nn.LSTM` maths, gate
/// order i, f, g, o): `x [batch, seq, in]` when `batch_first`, else `[seq, batch, in]`;
/// `w_ih [4H, in]`, `w_hh [4H, H]`, optional biases `[4H]`, optional initial `(h0, c0)` each
/// `[batch, H]` (zeros when absent). Returns the output sequence (same batch/seq order as `x`)
/// and the final `(h, c)`. Runs [`recurrent_scan`].
pub fn lstm(
    x: &Tensor,
    w_ih: &Tensor,
    w_hh: &Tensor,
    b_ih: Option<&Tensor>,
    b_hh: Option<&Tensor>,
    state: Option<(&Tensor, &Tensor)>,
    batch_first: bool,
) -> Result<(Tensor, (Tensor, Tensor))> {
    let w = RecurrentWeights { w_ih, w_hh, b_ih, b_hh };
    let r = recurrent(RecurrentCell::Lstm, x, w, state.map(|s| s.0), state.map(|s| s.1), batch_first)?;
    let c_n = r.c_n.ok_or_else(|| TensorError::invalid("lstm", "internal: the LSTM returned no cell state"))?;
    Ok((r.output, (r.h_n, c_n)))
}

/// One layer, one direction, over a padded batch `x` (`[seq, batch, in]`, or `[batch, seq, in]`
/// when `batch_first`); the output has `x`'s batch/seq order, the final states are
/// `[batch, hidden]`. Runs [`recurrent_scan`] on the time-major rows of `x`.
pub fn recurrent(
    cell: RecurrentCell,
    x: &Tensor,
    w: RecurrentWeights<'_>,
    h0: Option<&Tensor>,
    c0: Option<&Tensor>,
    batch_first: bool,
) -> Result<RecurrentOutput> {
    let names: &'static [&'static str] =
        if batch_first { &["batch", "seq", "features"] } else { &["seq", "batch", "features"] };
    if x.rank() != 3 {
        return Err(TensorError::InvalidShape {
            op: cell.name(),
            arg: "input",
            shape: x.shape().to_vec(),
            expected: ExpectedShape::Named(names),
        });
    }
    let tm = if batch_first { x.transpose(0, 1)? } else { x.clone() };
    let (t, b, f) = (tm.shape()[0], tm.shape()[1], tm.shape()[2]);
    let rows = tm.reshape_usize(&[t * b, f])?;
    let r = recurrent_scan(cell, &rows, &vec![b; t], w, h0, c0, false)?;
    let hidden = r.output.shape()[1];
    let out = r.output.reshape_usize(&[t, b, hidden])?;
    let out = if batch_first { out.transpose(0, 1)? } else { out };
    Ok(RecurrentOutput { output: out, ..r })
}

/// `t` itself when it is a row block (2-D, unit column stride), else a contiguous copy.
fn row_block(t: &Tensor) -> Result<Tensor> {
    if t.rank() == 2 && (t.shape()[1] <= 1 || t.strides()[1] == 1) { Ok(t.clone()) } else { t.contiguous() }
}

/// The steps of a scan: rows per step, where each step's rows start, and the direction.
#[derive(Clone, Debug)]
struct Steps {
    sizes: Vec<usize>,
    offsets: Vec<usize>,
    reverse: bool,
}

impl Steps {
    /// Steps of `sizes` rows over an input of `shape` (`[rows, features]`).
    fn new(op: &'static str, sizes: &[usize], shape: &[usize], reverse: bool) -> Result<Steps> {
        if sizes.is_empty() || sizes[0] == 0 {
            return Err(TensorError::invalid(
                op,
                format!("expected at least one time step with at least one sequence, got batch_sizes {sizes:?}"),
            ));
        }
        if let Some(t) = (1..sizes.len()).find(|&t| sizes[t] == 0 || sizes[t] > sizes[t - 1]) {
            return Err(TensorError::invalid(
                op,
                format!(
                    "batch_sizes must be positive and never increase (sequences sorted by decreasing length), but step {t} has {} after {}",
                    sizes[t],
                    sizes[t - 1]
                ),
            ));
        }
        let total: usize = sizes.iter().sum();
        if total != shape[0] {
            // The rows must be the packed steps: batch_sizes says how many.
            return Err(TensorError::InvalidShape {
                op,
                arg: "input",
                shape: shape.to_vec(),
                expected: ExpectedShape::SizeAt { dim: 0, size: total },
            });
        }
        let mut offsets = Vec::with_capacity(sizes.len());
        let mut o = 0;
        for &s in sizes {
            offsets.push(o);
            o += s;
        }
        Ok(Steps { sizes: sizes.to_vec(), offsets, reverse })
    }

    fn batch(&self) -> usize {
        self.sizes[0]
    }

    fn rows(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0) + self.sizes.last().copied().unwrap_or(0)
    }

    /// Steps in processing order.
    fn order(&self) -> Vec<usize> {
        let n = self.sizes.len();
        if self.reverse { (0..n).rev().collect() } else { (0..n).collect() }
    }

    /// The step processed just before `t`, if any.
    fn prev(&self, t: usize) -> Option<usize> {
        if self.reverse { (t + 1 < self.sizes.len()).then_some(t + 1) } else { t.checked_sub(1) }
    }

    /// The step processed just after `t`, if any.
    fn next(&self, t: usize) -> Option<usize> {
        if self.reverse { t.checked_sub(1) } else { (t + 1 < self.sizes.len()).then_some(t + 1) }
    }

    fn size_of(&self, t: Option<usize>) -> usize {
        t.map_or(0, |t| self.sizes[t])
    }

    /// Rows `[off, off + size)` of step `t` in a `[N, ..]` tensor.
    fn of(&self, all: &Tensor, t: usize) -> Result<Tensor> {
        all.narrow(0, self.offsets[t], self.sizes[t])
    }

    /// Rows of step `t`'s predecessor (in processing order) in `all`, if it has one.
    fn prev_rows(&self, all: &Tensor, t: usize) -> Result<Option<Tensor>> {
        self.prev(t).map(|p| self.of(all, p)).transpose()
    }

    /// The state step `t` starts from, `[sizes[t], hidden]`: rows of the previous step's state
    /// `prev` (`[sizes[prev], hidden]`), and, for sequences that start at `t` (only in the
    /// reverse direction of a packed batch), rows of `init`. A view when it is one block, else a
    /// fresh copy.
    fn start_state(&self, prev: Option<&Tensor>, init: &Tensor, t: usize) -> Result<Tensor> {
        let bs = self.sizes[t];
        let Some(prev) = prev else { return init.narrow(0, 0, bs) };
        let bp = prev.shape()[0];
        let from_prev = prev.narrow(0, 0, bs.min(bp))?;
        if bp >= bs {
            return Ok(from_prev);
        }
        Tensor::cat(&[&from_prev, &init.narrow(0, bp, bs - bp)?], 0)
    }

    /// [`start_state`](Self::start_state) with the previous step's rows taken from `all`.
    fn state_before(&self, all: &Tensor, init: &Tensor, t: usize) -> Result<Tensor> {
        self.start_state(self.prev_rows(all, t)?.as_ref(), init, t)
    }
}

/// The weight every step of a scan multiplies by (`W_hhᵀ` forward, `W_hh` backward), made ready
/// once per scan where the backend can (the CPU packs it for its GEMM once instead of at every
/// step: `kernels/gemm/prepacked.rs`), else one plain product per step.
struct StepProduct {
    b: Tensor,
    prepared: Option<Box<dyn PreparedRhs>>,
}

impl StepProduct {
    fn new(b: &Tensor) -> Result<StepProduct> {
        Ok(StepProduct { b: b.clone(), prepared: b.kernels().prepare_rhs(b)? })
    }

    /// `a @ b`.
    fn apply(&self, a: &Tensor) -> Result<Tensor> {
        match &self.prepared {
            None => matmul_raw(a, &self.b),
            Some(p) => {
                let out = a.empty_like_shape(&[a.shape()[0], self.b.shape()[1]], self.b.dtype())?;
                p.matmul(&out, a)?;
                Ok(out)
            }
        }
    }
}

/// One layer and direction of a recurrent scan.
struct Scan {
    cell: RecurrentCell,
    steps: Steps,
    hidden: usize,
}

/// What the forward scan produced (raw tensors, no graph).
struct Forward {
    out: Tensor,
    h_n: Tensor,
    c_n: Option<Tensor>,
    c_all: Option<Tensor>,
    saved: Option<Tensor>,
}

impl Scan {
    /// The forward scan. With `keep`, every step's cell state and gates are kept (`c_all`,
    /// `saved`) for backward; without, they live one step at a time.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        gi: &Tensor,
        w_hh: &Tensor,
        b_ih: Option<&Tensor>,
        b_hh: Option<&Tensor>,
        h0: &Tensor,
        c0: Option<&Tensor>,
        keep: bool,
    ) -> Result<Forward> {
        let (cell, steps, hidden) = (self.cell, &self.steps, self.hidden);
        let (rows, batch, dtype) = (steps.rows(), steps.batch(), gi.dtype());
        let out = gi.empty_like_shape(&[rows, hidden], dtype)?;
        let c_all = c0.filter(|_| keep).map(|_| gi.empty_like_shape(&[rows, hidden], dtype)).transpose()?;
        let saved_gates = cell.saved_gates();
        let saved = match saved_gates {
            0 => None,
            _ if !keep => None,
            s => Some(gi.empty_like_shape(&[rows, s * hidden], dtype)?),
        };
        let h_n = gi.empty_like_shape(&[batch, hidden], dtype)?;
        let c_n = c0.map(|_| gi.empty_like_shape(&[batch, hidden], dtype)).transpose()?;
        let w_hh_t = StepProduct::new(&w_hh.t()?)?;
        // The previous step's cell state when `c_all` is not kept.
        let mut c_last: Option<Tensor> = None;
        for t in steps.order() {
            let bs = steps.sizes[t];
            let h_prev = steps.state_before(&out, h0, t)?;
            let c_prev = match (&c_all, c0) {
                (Some(all), Some(init)) => Some(steps.state_before(all, init, t)?),
                (None, Some(init)) => Some(steps.start_state(c_last.as_ref(), init, t)?),
                _ => None,
            };
            let gh = w_hh_t.apply(&h_prev)?;
            let h = steps.of(&out, t)?;
            let c = match (&c_all, c0) {
                (Some(a), _) => Some(steps.of(a, t)?),
                (None, Some(_)) => Some(gi.empty_like_shape(&[bs, hidden], dtype)?),
                _ => None,
            };
            let sv = match (&saved, saved_gates) {
                (Some(a), _) => Some(steps.of(a, t)?),
                (None, 0) => None,
                (None, s) => Some(gi.empty_like_shape(&[bs, s * hidden], dtype)?),
            };
            let step_gi = steps.of(gi, t)?;
            let args = CellForward {
                gi: &step_gi,
                gh: &gh,
                b_ih,
                b_hh,
                h_prev: &h_prev,
                c_prev: c_prev.as_ref(),
                h: &h,
                c: c.as_ref(),
                saved: sv.as_ref(),
            };
            out.kernels().recurrent_cell(cell, &args)?;
            // A sequence's final state is its state after the last step it takes part in: rows
            // [size of the next step, size of this step) of this step.
            let bn = steps.size_of(steps.next(t));
            if bn < bs {
                copy_into(&h_n.narrow(0, bn, bs - bn)?, &h.narrow(0, bn, bs - bn)?)?;
                if let (Some(c_n), Some(c)) = (&c_n, &c) {
                    copy_into(&c_n.narrow(0, bn, bs - bn)?, &c.narrow(0, bn, bs - bn)?)?;
                }
            }
            c_last = c;
        }
        Ok(Forward { out, h_n, c_n, c_all, saved })
    }
}

/// Backward of a whole scan: the steps in reverse processing order, each one cell-backward
/// kernel and one product with `W_hh`, then one GEMM for `W_hh`'s gradient over every step.
struct ScanBackward {
    scan: Scan,
    /// Per input (gi, w_hh, [b_ih], [b_hh], h0, [c0]): whether it wants a gradient.
    need: Vec<bool>,
    has_b_ih: bool,
    has_b_hh: bool,
    w_hh: SavedTensor,
    h0: SavedTensor,
    c0: Option<SavedTensor>,
    out: SavedTensor,
    c_all: Option<SavedTensor>,
    saved: Option<SavedTensor>,
}

impl BackwardFn for ScanBackward {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(self.scan.cell.backward_name())
    }

    fn backward(&mut self, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        let name = self.scan.cell.backward_name();
        let (cell, steps, hidden) = (self.scan.cell, &self.scan.steps, self.scan.hidden);
        let w_hh = self.w_hh.get(name)?;
        let h0 = self.h0.get(name)?;
        let c0 = self.c0.as_ref().map(|s| s.get(name)).transpose()?;
        let out = self.out.get(name)?;
        let c_all = self.c_all.as_ref().map(|s| s.get(name)).transpose()?;
        let saved = self.saved.as_ref().map(|s| s.get(name)).transpose()?;
        let (rows, batch, dtype) = (steps.rows(), steps.batch(), out.dtype());
        let width = cell.gates() * hidden;
        let grad = |i: usize| -> Result<Option<Tensor>> {
            match grads.get(i).and_then(|g| g.as_ref()) {
                None => Ok(None),
                Some(g) => {
                    let g = if g.dtype() == dtype { g.clone() } else { g.to_dtype(dtype)? };
                    Ok(Some(row_block(&g)?))
                }
            }
        };
        let (g_out, g_hn, g_cn) = (grad(0)?, grad(1)?, grad(2)?);
        let zeros = || Tensor::zeros(&[batch, hidden], dtype, out.device());
        let g_hn = match g_hn {
            Some(g) => g,
            None => zeros()?,
        };
        let g_cn = match (cell.has_cell_state(), g_cn) {
            (false, _) => None,
            (true, Some(g)) => Some(g),
            (true, None) => Some(zeros()?),
        };
        let dgi_all = out.empty_like_shape(&[rows, width], dtype)?;
        let dgh_all =
            if cell == RecurrentCell::Gru { Some(out.empty_like_shape(&[rows, width], dtype)?) } else { None };
        let grad_h0 = out.empty_like_shape(&[batch, hidden], dtype)?;
        let grad_c0 = c0.map(|_| out.empty_like_shape(&[batch, hidden], dtype)).transpose()?;
        let w_hh_step = StepProduct::new(w_hh)?;
        let mut carry_h: Option<Tensor> = None;
        let mut carry_c: Option<Tensor> = None;
        for t in steps.order().into_iter().rev() {
            let (bs, bn, bp) = (steps.sizes[t], steps.size_of(steps.next(t)), steps.size_of(steps.prev(t)));
            // The gradient reaching this step's state: from the step processed after it (rows
            // it continued), and from the final state (rows that end here).
            let incoming = |carry: &Option<Tensor>, final_grad: &Tensor| -> Result<Tensor> {
                let k = bn.min(bs);
                match carry {
                    Some(c) if k == bs => c.narrow(0, 0, bs),
                    Some(c) if k > 0 => Tensor::cat(&[&c.narrow(0, 0, k)?, &final_grad.narrow(0, k, bs - k)?], 0),
                    _ => final_grad.narrow(0, 0, bs),
                }
            };
            let dh = incoming(&carry_h, &g_hn)?;
            let dc = g_cn.as_ref().map(|g| incoming(&carry_c, g)).transpose()?;
            let dh_out = g_out.as_ref().map(|g| steps.of(g, t)).transpose()?;
            let h = steps.of(out, t)?;
            let c = c_all.map(|a| steps.of(a, t)).transpose()?;
            let c_prev = match (c_all, c0) {
                (Some(a), Some(i)) => Some(steps.state_before(a, i, t)?),
                _ => None,
            };
            let h_prev = steps.state_before(out, h0, t)?;
            let sv = saved.map(|a| steps.of(a, t)).transpose()?;
            let dgi = steps.of(&dgi_all, t)?;
            let dgh = dgh_all.as_ref().map(|a| steps.of(a, t)).transpose()?;
            let dh_direct =
                (cell == RecurrentCell::Gru).then(|| out.empty_like_shape(&[bs, hidden], dtype)).transpose()?;
            let dc_prev = cell.has_cell_state().then(|| out.empty_like_shape(&[bs, hidden], dtype)).transpose()?;
            let args = CellBackward {
                dh: &dh,
                dh_out: dh_out.as_ref(),
                dc: dc.as_ref(),
                saved: sv.as_ref(),
                h: &h,
                c: c.as_ref(),
                c_prev: c_prev.as_ref(),
                h_prev: (cell == RecurrentCell::Gru).then_some(&h_prev),
                dgi: &dgi,
                dgh: dgh.as_ref(),
                dh_prev: dh_direct.as_ref(),
                dc_prev: dc_prev.as_ref(),
            };
            out.kernels().recurrent_cell_backward(cell, &args)?;
            let dh_prev = w_hh_step.apply(dgh.as_ref().unwrap_or(&dgi))?;
            if let Some(d) = &dh_direct {
                arith_inplace_raw(BinaryOp::Add, &dh_prev, d)?;
            }
            // Rows that started from the initial state hand their gradient to it.
            if bp < bs {
                copy_into(&grad_h0.narrow(0, bp, bs - bp)?, &dh_prev.narrow(0, bp, bs - bp)?)?;
                if let (Some(g), Some(d)) = (&grad_c0, &dc_prev) {
                    copy_into(&g.narrow(0, bp, bs - bp)?, &d.narrow(0, bp, bs - bp)?)?;
                }
            }
            carry_h = Some(dh_prev);
            carry_c = dc_prev;
        }
        drop((carry_h, carry_c));
        let dgh_all_ref = dgh_all.as_ref().unwrap_or(&dgi_all);
        let mut k = 0;
        let mut need = || {
            k += 1;
            self.need.get(k - 1).copied().unwrap_or(false)
        };
        let g_gi = need().then(|| dgi_all.clone());
        let g_w_hh = if need() {
            // Every step's previous state, in the steps' row layout: dW_hh = dgh^T · H_prev.
            let h_prev_all = out.empty_like_shape(&[rows, hidden], dtype)?;
            for t in 0..steps.sizes.len() {
                copy_into(&steps.of(&h_prev_all, t)?, &steps.state_before(out, h0, t)?)?;
            }
            Some(matmul_raw(&dgh_all_ref.t()?, &h_prev_all)?)
        } else {
            None
        };
        let mut result = vec![g_gi, g_w_hh];
        if self.has_b_ih {
            result.push(if need() { Some(sum_raw(&dgi_all, &[0], false, 1.0, name)?.0) } else { None });
        }
        if self.has_b_hh {
            result.push(if need() { Some(sum_raw(dgh_all_ref, &[0], false, 1.0, name)?.0) } else { None });
        }
        result.push(need().then_some(grad_h0));
        if grad_c0.is_some() {
            result.push(if need() { grad_c0 } else { None });
        }
        Ok(result)
    }
}
