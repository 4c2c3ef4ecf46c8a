//! The operands of the recurrent-cell kernels ([`KernelBackend::recurrent_cell`] and its
//! backward): the cell kind and the row blocks of one time step. The trait takes them, so they
//! live on the backend side; `functional/rnn.rs` builds them.
//!
//! [`KernelBackend::recurrent_cell`]: super::KernelBackend::recurrent_cell

use crate::Tensor;

/// The cell of a recurrent layer, whose pointwise part of one time step (gates → new state) is
/// one kernel each way ([`KernelBackend::recurrent_cell`], [`KernelBackend::recurrent_cell_backward`]).
/// The two matrix products of a step (`W_ih x`, precomputed for every step in one GEMM, and
/// `W_hh h`) are the ordinary GEMM; gate order and formulas are PyTorch's:
/// - `Lstm` (gates i, f, g, o): `c' = σ(f) c + σ(i) tanh(g)`, `h' = σ(o) tanh(c')`;
/// - `Gru` (gates r, z, n): `r = σ(.)`, `z = σ(.)`, `n = tanh(x_n + b_in + r (W_hn h + b_hn))`,
///   `h' = (1 - z) n + z h`;
/// - `RnnTanh` / `RnnRelu`: `h' = act(W_ih x + b_ih + W_hh h + b_hh)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecurrentCell {
    Lstm,
    Gru,
    RnnTanh,
    RnnRelu,
}

impl RecurrentCell {
    /// Gates stacked along the weights' first dimension (`[gates * hidden, ..]`).
    pub fn gates(self) -> usize {
        match self {
            RecurrentCell::Lstm => 4,
            RecurrentCell::Gru => 3,
            RecurrentCell::RnnTanh | RecurrentCell::RnnRelu => 1,
        }
    }

    /// Blocks of `hidden` columns the forward keeps per row for backward: the LSTM's activated
    /// i, f, g, o; the GRU's r, z, n and `W_hn h + b_hn`; none for the plain RNN, whose
    /// derivative comes from its output.
    pub fn saved_gates(self) -> usize {
        match self {
            RecurrentCell::Lstm | RecurrentCell::Gru => 4,
            RecurrentCell::RnnTanh | RecurrentCell::RnnRelu => 0,
        }
    }

    /// Whether the cell carries a cell state `c` beside `h` (the LSTM).
    pub fn has_cell_state(self) -> bool {
        self == RecurrentCell::Lstm
    }

    /// PyTorch's name of the layer's mode (`torch.nn.RNNBase.mode`, lower case).
    pub fn name(self) -> &'static str {
        match self {
            RecurrentCell::Lstm => "lstm",
            RecurrentCell::Gru => "gru",
            RecurrentCell::RnnTanh => "rnn_tanh",
            RecurrentCell::RnnRelu => "rnn_relu",
        }
    }

    /// The name of the backward node of a whole recurrent scan (what `grad_fn` shows).
    pub fn backward_name(self) -> &'static str {
        match self {
            RecurrentCell::Lstm => "LstmBackward0",
            RecurrentCell::Gru => "GruBackward0",
            RecurrentCell::RnnTanh => "RnnTanhBackward0",
            RecurrentCell::RnnRelu => "RnnReluBackward0",
        }
    }
}

/// The operands of [`KernelBackend::recurrent_cell`]: one time step of `rows` sequences with
/// `hidden` units (`G` = [`RecurrentCell::gates`]). Every tensor operand is a *row block*: 2-D,
/// unit stride along its columns and any stride between rows (a range of rows of a larger
/// tensor); biases are 1-D and contiguous; everything shares one floating-point dtype.
/// Written operands do not overlap any read operand.
#[derive(Clone, Copy)]
pub struct CellForward<'a> {
    /// `W_ih x` of this step, `[rows, G·hidden]` (no bias).
    pub gi: &'a Tensor,
    /// `W_hh h_prev`, `[rows, G·hidden]` (no bias).
    pub gh: &'a Tensor,
    /// `[G·hidden]` each; absent means zero.
    pub b_ih: Option<&'a Tensor>,
    pub b_hh: Option<&'a Tensor>,
    /// The previous hidden state `[rows, hidden]`.
    pub h_prev: &'a Tensor,
    /// The previous cell state `[rows, hidden]` (LSTM only).
    pub c_prev: Option<&'a Tensor>,
    /// Written: the new hidden state `[rows, hidden]`.
    pub h: &'a Tensor,
    /// Written: the new cell state `[rows, hidden]` (LSTM only).
    pub c: Option<&'a Tensor>,
    /// Written: what backward needs, `[rows, saved_gates·hidden]` (LSTM, GRU).
    pub saved: Option<&'a Tensor>,
}

/// The operands of [`KernelBackend::recurrent_cell_backward`], row blocks as in
/// [`CellForward`]. Reads the gradient arriving at the step's `h` (`dh`, plus `dh_out` when
/// given: the gradient of the layer's output at this step) and, for the LSTM, at its `c`; writes
/// the gradients of the step's pre-activations. Written operands do not overlap read operands.
#[derive(Clone, Copy)]
pub struct CellBackward<'a> {
    /// Gradient reaching `h` from later steps and the final state, `[rows, hidden]`.
    pub dh: &'a Tensor,
    /// Gradient of the layer's output at this step, added to `dh` (absent: none).
    pub dh_out: Option<&'a Tensor>,
    /// Gradient reaching `c` (LSTM only; absent means zero).
    pub dc: Option<&'a Tensor>,
    /// The forward's saved gates (LSTM, GRU).
    pub saved: Option<&'a Tensor>,
    /// The step's output `h` (the plain RNN's derivative).
    pub h: &'a Tensor,
    /// The step's new cell state and the previous one (LSTM only).
    pub c: Option<&'a Tensor>,
    pub c_prev: Option<&'a Tensor>,
    /// The previous hidden state (GRU only).
    pub h_prev: Option<&'a Tensor>,
    /// Written: gradient of the input projection's pre-activations `[rows, G·hidden]` (also
    /// that of `b_ih`'s rows).
    pub dgi: &'a Tensor,
    /// Written (GRU only): gradient of `W_hh h_prev` `[rows, 3·hidden]`, which differs from
    /// `dgi` in the n gate (`r ·` it); for the other cells it equals `dgi`.
    pub dgh: Option<&'a Tensor>,
    /// Written (GRU only): the part of `h_prev`'s gradient that does not pass through `W_hh`
    /// (`dh · z`).
    pub dh_prev: Option<&'a Tensor>,
    /// Written (LSTM only): gradient reaching `c_prev` (`dc_total · f`).
    pub dc_prev: Option<&'a Tensor>,
}
