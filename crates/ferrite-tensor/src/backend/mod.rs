//! The kernel-backend seam: where an op's arithmetic runs.
//!
//! An op is defined once in `ops/` (or `functional/`): its shape rule, its dtype rule, the
//! allocation of its output through the device's caching allocator, and its backward. Only the
//! arithmetic is handed to the [`KernelBackend`] of the output's device, which *writes into
//! outputs it is given* and never allocates the tensors an op returns. That keeps ferrite's
//! invariant — a `meta` run makes exactly the allocations a real run makes — on every device, and
//! keeps autograd, nn, optim, data and io unaware of which backend ran a kernel.
//!
//! A device is a pair (memory, kernels), declared in one table:
//!
//! | device        | memory (`ferrite_memory::raw_memory`)  | kernels                  |
//! |---------------|----------------------------------------|--------------------------|
//! | `cpu`         | host                                   | [`cpu::CpuBackend`]      |
//! | `sim:<gpu>`   | host, with the GPU's capacity          | [`cpu::CpuBackend`]      |
//! | `meta`        | addresses only                         | [`meta::MetaBackend`]    |
//! | `gpu:<i>`     | wgpu buffers                           | [`gpu::WgpuBackend`]     |
//!
//! Adding a backend: implement [`KernelBackend`] (every method; the trait has no defaults, so the
//! compiler lists what is missing), give its device a `RawMemory` in ferrite-memory, and add its
//! row to [`kernels_for`]. The PyTorch conformance suite then runs on it from the same test code.
//!
//! Contract of every method: the op layer has already validated shapes, dtypes and devices, made
//! operand dtypes agree where the op needs it, and allocated every output on the same device.
//! `out` arguments are fresh contiguous tensors unless a method says otherwise; inputs may be
//! strided and broadcast (zero strides). A backend may run kernels asynchronously: anything
//! that reads data back to the host ([`KernelBackend::read_to_host`], [`FusedKernel`] results)
//! is a synchronisation point.

pub(crate) mod cpu;
pub(crate) mod gpu;
pub(crate) mod meta;
mod norm_args;
mod pool_window;

use ferrite_memory::Device;

use crate::Tensor;
use crate::error::{Result, TensorError};
use crate::ops::reduce::Plan;
use crate::random::Generator;

pub use crate::ops::fused::{FusedKernel, NormKind};
pub use norm_args::{
    BatchNormArgs, BatchNormBackwardArgs, BatchNormStats, GroupNormArgs, GroupNormBackwardArgs, RmsNormArgs,
    RmsNormBackwardArgs, RunningStats, ncs,
};
pub use pool_window::{AvgWindow, Pool2d, PoolKind, adaptive_end, adaptive_start, pool_output_size};

/// A binary arithmetic op (`out = a ∘ b`, or `b ∘ a` for the reversed forms used with scalars).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
    /// `b - a`
    RSub,
    /// `b / a`
    RDiv,
}

impl BinaryOp {
    /// PyTorch's name of the op (for error messages).
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::RSub => "rsub",
            BinaryOp::RDiv => "rdiv",
        }
    }

    /// Whether the op is defined on integers (true division and negative powers are not).
    pub fn defined_on_integers(self) -> bool {
        !matches!(self, BinaryOp::Div | BinaryOp::RDiv)
    }
}

/// A differentiable elementwise function; `Pow` and `LeakyRelu` carry their scalar parameter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Relu,
    Neg,
    Abs,
    Sin,
    Cos,
    Log1p,
    Reciprocal,
    Square,
    /// `x ** p` for a scalar exponent.
    Pow(f64),
    /// GELU, exact erf form.
    Gelu,
    /// GELU, tanh approximation.
    GeluTanh,
    Silu,
    /// `x > 0 ? x : x * slope`.
    LeakyRelu(f64),
}

impl UnaryOp {
    /// PyTorch's name of the forward op.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Log1p => "log1p",
            UnaryOp::Reciprocal => "reciprocal",
            UnaryOp::Square => "square",
            UnaryOp::Pow(_) => "pow",
            UnaryOp::Gelu | UnaryOp::GeluTanh => "gelu",
            UnaryOp::Silu => "silu",
            UnaryOp::LeakyRelu(_) => "leaky_relu",
        }
    }

    /// PyTorch's name of the backward node (what `grad_fn` shows).
    pub fn backward_name(self) -> &'static str {
        match self {
            UnaryOp::Exp => "ExpBackward0",
            UnaryOp::Log => "LogBackward0",
            UnaryOp::Sqrt => "SqrtBackward0",
            UnaryOp::Rsqrt => "RsqrtBackward0",
            UnaryOp::Tanh => "TanhBackward0",
            UnaryOp::Sigmoid => "SigmoidBackward0",
            UnaryOp::Relu => "ReluBackward0",
            UnaryOp::Neg => "NegBackward0",
            UnaryOp::Abs => "AbsBackward0",
            UnaryOp::Sin => "SinBackward0",
            UnaryOp::Cos => "CosBackward0",
            UnaryOp::Log1p => "Log1PBackward0",
            UnaryOp::Reciprocal => "ReciprocalBackward0",
            UnaryOp::Square | UnaryOp::Pow(_) => "PowBackward0",
            UnaryOp::Gelu | UnaryOp::GeluTanh => "GeluBackward0",
            UnaryOp::Silu => "SiluBackward0",
            UnaryOp::LeakyRelu(_) => "LeakyReluBackward0",
        }
    }

    /// Whether the derivative is computed from the op's output (else from its input), which
    /// decides what autograd saves.
    pub fn derivative_from_output(self) -> bool {
        matches!(
            self,
            UnaryOp::Exp
                | UnaryOp::Sqrt
                | UnaryOp::Rsqrt
                | UnaryOp::Tanh
                | UnaryOp::Sigmoid
                | UnaryOp::Relu
                | UnaryOp::Reciprocal
        )
    }
}

/// An elementwise comparison producing a bool tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CompareOp {
    pub fn name(self) -> &'static str {
        match self {
            CompareOp::Eq => "eq",
            CompareOp::Ne => "ne",
            CompareOp::Lt => "lt",
            CompareOp::Le => "le",
            CompareOp::Gt => "gt",
            CompareOp::Ge => "ge",
        }
    }

    /// The comparison on f64 values (every dtype converts exactly or nearly so).
    #[inline(always)]
    pub fn eval(self, x: f64, y: f64) -> bool {
        match self {
            CompareOp::Eq => x == y,
            CompareOp::Ne => x != y,
            CompareOp::Lt => x < y,
            CompareOp::Le => x <= y,
            CompareOp::Gt => x > y,
            CompareOp::Ge => x >= y,
        }
    }
}

/// A logical op on bool tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LogicalOp {
    And,
    Or,
}

/// A distribution to fill a tensor from. Every element consumes a fixed number of generator
/// words ([`Distribution::words_per_element`]) at a fixed offset, so values never depend on how
/// a backend splits the work.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Distribution {
    /// Uniform `[low, high)` from 53 random bits (2 words per element).
    Uniform { low: f64, high: f64 },
    /// Normal(mean, std) by Box–Muller (4 words per element).
    Normal { mean: f64, std: f64 },
    /// 1 with probability `p`, else 0 (2 words per element; `uniform < p`).
    Bernoulli { p: f64 },
}

impl Distribution {
    pub fn words_per_element(self) -> u128 {
        match self {
            Distribution::Uniform { .. } | Distribution::Bernoulli { .. } => 2,
            Distribution::Normal { .. } => 4,
        }
    }
}

// ---------------------------------------------------------------------- losses (lossopt)

/// An elementwise loss computed in one pass by [`KernelBackend::pointwise_loss`] (reductions are
/// the ordinary differentiable `sum`/`mean` on its output). Formulas are PyTorch's, in the compute
/// type of the element (f32 for f16/bf16/f32, f64 for f64); `w` is the optional `weight`
/// (1 when absent), `pw` the optional `pos_weight`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PointwiseLoss {
    /// `F.binary_cross_entropy` of probabilities `x`:
    /// `w ((t - 1) max(ln(1 - x), -100) - t max(ln x, -100))`. The CPU backend refuses inputs or
    /// targets outside [0, 1]; the GPU backend gives NaN for them (no device-side assert).
    Bce,
    /// `F.binary_cross_entropy_with_logits`: `w ((1 - t) x - (1 + (pw - 1) t) logsigmoid(x))`,
    /// with the stable `logsigmoid(x) = min(x, 0) - ln(1 + e^-|x|)`.
    BceWithLogits,
    /// `F.smooth_l1_loss`: `|d| < beta ? 0.5 d² / beta : |d| - 0.5 beta` (L1 when `beta` is 0).
    SmoothL1 { beta: f64 },
    /// `F.huber_loss`: `|d| < delta ? 0.5 d² : delta (|d| - 0.5 delta)`.
    Huber { delta: f64 },
    /// `F.kl_div` (elementwise, before reduction): `t ln t - t x` (0 where t is 0), or
    /// `e^t (t - x)` with `log_target`.
    KlDiv { log_target: bool },
}

impl PointwiseLoss {
    /// PyTorch's name of the op.
    pub fn name(self) -> &'static str {
        match self {
            PointwiseLoss::Bce => "binary_cross_entropy",
            PointwiseLoss::BceWithLogits => "binary_cross_entropy_with_logits",
            PointwiseLoss::SmoothL1 { .. } => "smooth_l1_loss",
            PointwiseLoss::Huber { .. } => "huber_loss",
            PointwiseLoss::KlDiv { .. } => "kl_div",
        }
    }

    /// PyTorch's name of the backward node (what `grad_fn` shows).
    pub fn backward_name(self) -> &'static str {
        match self {
            PointwiseLoss::Bce => "BinaryCrossEntropyBackward0",
            PointwiseLoss::BceWithLogits => "BinaryCrossEntropyWithLogitsBackward0",
            PointwiseLoss::SmoothL1 { .. } => "SmoothL1LossBackward0",
            PointwiseLoss::Huber { .. } => "HuberLossBackward0",
            PointwiseLoss::KlDiv { .. } => "KlDivBackward0",
        }
    }
}

/// The operands of a [`PointwiseLoss`]: `input` and `target` have the output's shape and dtype
/// (they may be strided); `weight` and `pos_weight` have its dtype and broadcast to its shape.
#[derive(Clone, Copy, Debug)]
pub struct LossOperands<'a> {
    pub input: &'a Tensor,
    pub target: &'a Tensor,
    pub weight: Option<&'a Tensor>,
    /// Only for [`PointwiseLoss::BceWithLogits`].
    pub pos_weight: Option<&'a Tensor>,
}

/// Which operand a loss gradient is taken with respect to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossGrad {
    Input,
    Target,
}

// ---------------------------------------------------------------------- recurrent cells (rnn)

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

/// The kernels of one kind of device. See the module documentation for the contract.
pub trait KernelBackend: Send + Sync + 'static {
    /// Short name for messages (`"cpu"`, `"meta"`, `"wgpu"`).
    fn name(&self) -> &'static str;

    // ------------------------------------------------------------------ data movement

    /// Write `bytes` (exactly `dst.nbytes()`, element layout of `dst.dtype()`) into the
    /// contiguous `dst`.
    fn write_from_host(&self, dst: &Tensor, bytes: &[u8]) -> Result<()>;
    /// Read the contiguous `src` into `bytes` (exactly `src.nbytes()`). A synchronisation point.
    fn read_to_host(&self, src: &Tensor, bytes: &mut [u8]) -> Result<()>;
    /// `dst = src` elementwise: `src` is broadcast to `dst`'s shape and converted to its dtype;
    /// `dst` may be any non-overlapping strided view (it is written in place).
    fn copy(&self, dst: &Tensor, src: &Tensor) -> Result<()>;
    /// Fill the contiguous `dst` with `value` converted to its dtype.
    fn fill(&self, dst: &Tensor, value: f64) -> Result<()>;
    /// `dst[i] = start + i * step` (contiguous `dst`).
    fn arange(&self, dst: &Tensor, start: f64, step: f64) -> Result<()>;
    /// Fill the contiguous floating-point `dst` from `dist`, element `i` using the generator's
    /// words `[w·i, w·(i+1))` past its current position (the caller advances the generator).
    fn random(&self, dst: &Tensor, dist: Distribution, generator: &Generator) -> Result<()>;

    // ------------------------------------------------------------------ elementwise

    /// `out = op(a, b)`; `a` and `b` have `out`'s dtype and broadcast to its shape.
    fn binary(&self, op: BinaryOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()>;
    /// `out = op(a, s)`; `a` has `out`'s dtype and shape.
    fn binary_scalar(&self, op: BinaryOp, out: &Tensor, a: &Tensor, s: f64) -> Result<()>;
    /// In place `dst = op(dst, src)`; `src` has `dst`'s dtype and broadcasts to its shape; `dst`
    /// may be strided.
    fn binary_inplace(&self, op: BinaryOp, dst: &Tensor, src: &Tensor) -> Result<()>;
    /// `out = op(x)` for a floating-point `x` of `out`'s dtype and shape (x may be strided).
    fn unary(&self, op: UnaryOp, out: &Tensor, x: &Tensor) -> Result<()>;
    /// `out = grad * op'(saved)` where `saved` is the op's output or input
    /// ([`UnaryOp::derivative_from_output`]); all of `out`'s dtype, broadcast to its shape.
    fn unary_backward(&self, op: UnaryOp, out: &Tensor, grad: &Tensor, saved: &Tensor) -> Result<()>;
    /// `out = clamp(x, lo, hi)` (NaN stays NaN); `x` of `out`'s dtype.
    fn clamp(&self, out: &Tensor, x: &Tensor, lo: f64, hi: f64) -> Result<()>;
    /// Bool `out = op(a, b)`; `a` and `b` share a dtype and broadcast to `out`'s shape.
    fn compare(&self, op: CompareOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()>;
    /// Bool `out = op(a, s)`.
    fn compare_scalar(&self, op: CompareOp, out: &Tensor, a: &Tensor, s: f64) -> Result<()>;
    /// Bool `out = op(a, b)` for bool `a`, `b` broadcast to `out`'s shape.
    fn logical(&self, op: LogicalOp, out: &Tensor, a: &Tensor, b: &Tensor) -> Result<()>;
    /// `out = cond ? a : b` (bool `cond`; `a`, `b` of `out`'s dtype; all broadcast).
    fn where_cond(&self, out: &Tensor, cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<()>;

    // ------------------------------------------------------------------ reductions

    /// Sum over the plan's reduced dims, times `scale`; floats accumulate in f64, integers and
    /// bools sum into int64 `out`.
    fn sum(&self, out: &Tensor, x: &Tensor, plan: &Plan, scale: f64) -> Result<()>;
    /// Index (int64, into the reduced dim) and optionally the value of the max or min; the first
    /// NaN wins, ties take the first index.
    fn arg_extreme(
        &self,
        x: &Tensor,
        plan: &Plan,
        values: Option<&Tensor>,
        indices: &Tensor,
        is_max: bool,
    ) -> Result<()>;
    /// Variance over the plan's reduced dims with the given denominator (two passes in f64).
    fn var(&self, out: &Tensor, x: &Tensor, plan: &Plan, denom: f64) -> Result<()>;
    /// (log-)softmax over the last dim of the contiguous `x`.
    fn softmax(&self, out: &Tensor, x: &Tensor, log: bool) -> Result<()>;
    /// Backward of (log-)softmax over the last dim: contiguous `grad` and saved output `y`.
    fn softmax_backward(&self, out: &Tensor, grad: &Tensor, y: &Tensor, log: bool) -> Result<()>;
    /// Layer norm over the last dim (see [`LayerNormArgs`]).
    fn layer_norm(&self, args: &LayerNormArgs<'_>) -> Result<()>;

    // ------------------------------------------------------------------ products

    /// `out [batch.., m, n] = a [.., m, k] @ b [.., k, n]` with batch dims broadcast (a and b
    /// strided, f32 or f64, same dtype as `out`).
    fn matmul(&self, out: &Tensor, a: &Tensor, b: &Tensor, batch: &[usize]) -> Result<()>;

    // ------------------------------------------------------------------ indexing

    /// Error unless every element of the integer tensor `index` is in `[0, size)` or equals
    /// `ignore` (class targets of a loss: negative values are not wrapped). `dim` and `op` name the indexed dimension and the op in the error.
    fn check_indices(
        &self,
        index: &Tensor,
        size: usize,
        ignore: Option<i64>,
        dim: usize,
        op: &'static str,
    ) -> Result<()>;
    /// `out.select(dim, i) = x.select(dim, index[i])` for a 1-D integer `index`.
    fn index_select(&self, out: &Tensor, x: &Tensor, dim: usize, index: &Tensor) -> Result<()>;
    /// In place `dst.select(dim, index[i]) += src.select(dim, i)` (src of dst's dtype).
    fn index_add(&self, dst: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<()>;
    /// `out[..i..] = x[.. index[..i..] ..]` along `dim` (int64 `index` of `out`'s shape).
    fn gather(&self, out: &Tensor, x: &Tensor, dim: usize, index: &Tensor) -> Result<()>;
    /// In place on the contiguous `out`: `out[.. index[..i..] ..] += src[..i..]` along `dim`.
    fn scatter_add(&self, out: &Tensor, dim: usize, index: &Tensor, src: &Tensor) -> Result<()>;
    /// `out[i, index[i]] = 1` on a zero-filled int64 `out [n, classes]` (index flattened).
    fn one_hot(&self, out: &Tensor, index: &Tensor) -> Result<()>;

    // ------------------------------------------------------------------ fused updates

    /// Run a named multi-tensor kernel over contiguous, same-shaped operands; `outputs` are
    /// updated in place. Returns the kernel's scalar result (norm partials, found-inf as 0/1), or
    /// 0 for kernels without one.
    fn fused(&self, kernel: &FusedKernel, outputs: &[&Tensor], inputs: &[&Tensor]) -> Result<f64>;

    // ------------------------------------------------------------------ losses (lossopt)

    /// Elementwise `out = op(input, target)` (weighted); see [`PointwiseLoss`].
    fn pointwise_loss(&self, op: PointwiseLoss, out: &Tensor, x: LossOperands<'_>) -> Result<()>;
    /// `out = grad * ∂op/∂wrt` elementwise: `grad` (of `out`'s dtype) broadcasts to `out`'s shape,
    /// which is the operands' shape.
    fn pointwise_loss_backward(
        &self,
        op: PointwiseLoss,
        wrt: LossGrad,
        out: &Tensor,
        grad: &Tensor,
        x: LossOperands<'_>,
    ) -> Result<()>;

    /// Wait until every kernel submitted so far has finished (no-op for synchronous backends).
    fn synchronize(&self) -> Result<()>;

    // ------------------------------------------------------------------ normalisation and pooling (normpool)

    /// Batch norm over `x [N, C, S]`: statistics per channel (or given), then the normalised,
    /// scaled output; see [`BatchNormArgs`].
    fn batch_norm(&self, args: &BatchNormArgs<'_>) -> Result<()>;
    /// Gradients of [`batch_norm`](Self::batch_norm); see [`BatchNormBackwardArgs`].
    fn batch_norm_backward(&self, args: &BatchNormBackwardArgs<'_>) -> Result<()>;
    /// Group norm over `x [N, C, S]`; see [`GroupNormArgs`].
    fn group_norm(&self, args: &GroupNormArgs<'_>) -> Result<()>;
    /// Gradients of [`group_norm`](Self::group_norm); see [`GroupNormBackwardArgs`].
    fn group_norm_backward(&self, args: &GroupNormBackwardArgs<'_>) -> Result<()>;
    /// RMS norm over the rows of `x [rows, cols]`; see [`RmsNormArgs`].
    fn rms_norm(&self, args: &RmsNormArgs<'_>) -> Result<()>;
    /// Gradients of [`rms_norm`](Self::rms_norm); see [`RmsNormBackwardArgs`].
    fn rms_norm_backward(&self, args: &RmsNormBackwardArgs<'_>) -> Result<()>;
    /// Max pooling of the contiguous planes `x [P, H, W]` into `out [P, OH, OW]`, writing the
    /// int64 position `h·W + w` of each maximum into `indices` (NaN wins, then the first maximum).
    fn max_pool2d(&self, out: &Tensor, indices: &Tensor, x: &Tensor, pool: &Pool2d) -> Result<()>;
    /// `grad_input [P, H, W]` (fully written) from `grad_output [P, OH, OW]` routed to the saved
    /// `indices`.
    fn max_pool2d_backward(
        &self,
        grad_input: &Tensor,
        grad_output: &Tensor,
        indices: &Tensor,
        pool: &Pool2d,
    ) -> Result<()>;
    /// Average pooling (fixed or adaptive windows, [`Pool2d::avg_window`]) of `x [P, H, W]`.
    fn avg_pool2d(&self, out: &Tensor, x: &Tensor, pool: &Pool2d) -> Result<()>;
    /// `grad_input [P, H, W]` (fully written): each output's gradient spread over its window
    /// divided by the window's divisor.
    fn avg_pool2d_backward(&self, grad_input: &Tensor, grad_output: &Tensor, pool: &Pool2d) -> Result<()>;
    // ------------------------------------------------------------------ convolution (conv)

    /// Unfold (im2col): `cols [n, channels·kh·kw, oh·ow]` from the image `x [n, channels, h, w]`
    /// (both contiguous, one floating-point dtype) through the windows of `geom`: row
    /// `c·kh·kw + i·kw + j` holds tap `(i, j)` of channel `c` for every window, 0 where the tap
    /// falls into the padding. Writes every element of `cols`.
    fn im2col(&self, cols: &Tensor, x: &Tensor, geom: &ConvGeometry) -> Result<()>;
    /// Fold (col2im), the adjoint of [`im2col`](Self::im2col): every pixel of the contiguous
    /// `x [n, channels, h, w]` is the sum of the `cols` entries whose tap reads it (0 for pixels no
    /// window reads). Writes every element of `x`.
    fn col2im(&self, x: &Tensor, cols: &Tensor, geom: &ConvGeometry) -> Result<()>;
    // ------------------------------------------------------------------ recurrent cells (rnn)

    /// One time step's gate arithmetic of a recurrent layer (see [`CellForward`]).
    fn recurrent_cell(&self, cell: RecurrentCell, x: &CellForward<'_>) -> Result<()>;
    /// Its gradient (see [`CellBackward`]).
    fn recurrent_cell_backward(&self, cell: RecurrentCell, x: &CellBackward<'_>) -> Result<()>;
}

/// The operands of [`KernelBackend::layer_norm`], one value so that every backend's kernel (and
/// the next normalisation op's) takes them the same way: normalise each row of the contiguous
/// `x` `[rows, cols]` (see [`rows_cols`]) into `y`, writing the f32 statistics `mean` and `rstd`
/// `[rows]`, scaled by `weight` and shifted by `bias` (`[cols]`, `x`'s dtype) when present.
#[derive(Clone, Copy)]
pub struct LayerNormArgs<'a> {
    pub y: &'a Tensor,
    pub mean: &'a Tensor,
    pub rstd: &'a Tensor,
    pub x: &'a Tensor,
    pub weight: Option<&'a Tensor>,
    pub bias: Option<&'a Tensor>,
    pub eps: f64,
}

/// Copy the contiguous `src` into the contiguous `dst` of the same shape and dtype on another
/// device: through the backend of whichever side is not in host memory, else through a staging
/// buffer on the host.
pub(crate) fn transfer(dst: &Tensor, src: &Tensor) -> Result<()> {
    let n = dst.nbytes();
    if dst.is_meta() || n == 0 {
        return Ok(());
    }
    if src.is_meta() {
        return Err(TensorError::MetaHasNoData { op: "to_device" });
    }
    match (src.storage().ptr(), dst.storage().ptr()) {
        (Some(_), _) => {
            let s = src.ptr::<u8>("to_device")?;
            // SAFETY: `src` is a contiguous tensor of `n` initialised bytes in host memory that
            // stays alive (borrowed) for the duration of the call.
            let bytes = unsafe { std::slice::from_raw_parts(s, n) };
            dst.kernels().write_from_host(dst, bytes)
        }
        (None, Some(_)) => {
            let d = dst.ptr::<u8>("to_device")?;
            // SAFETY: `dst` is a fresh contiguous tensor of `n` bytes in host memory that no
            // other handle can reach yet.
            let bytes = unsafe { std::slice::from_raw_parts_mut(d, n) };
            src.kernels().read_to_host(src, bytes)
        }
        (None, None) => {
            let mut staging = vec![0u8; n];
            src.kernels().read_to_host(src, &mut staging)?;
            dst.kernels().write_from_host(dst, &staging)
        }
    }
}

/// The `[rows, cols]` a row kernel (softmax, layer norm) sees in its contiguous operand `t`:
/// `cols` is the last dimension (1 for a 0-dim tensor), `rows` the product of the others. Every
/// backend's row kernels take their bookkeeping from here.
pub fn rows_cols(t: &Tensor) -> (usize, usize) {
    let cols = t.shape().last().copied().unwrap_or(1);
    (t.numel().checked_div(cols).unwrap_or(0), cols)
}

/// Error unless a host buffer of `len` bytes matches `t` byte for byte (the length check of
/// every backend's `write_from_host`/`read_to_host`).
pub(crate) fn check_host_len(op: &'static str, len: usize, t: &Tensor) -> Result<()> {
    let nbytes = t.nbytes();
    if len == nbytes { Ok(()) } else { Err(TensorError::ByteLength { op, len, nbytes }) }
}

/// The kernels that compute on `device`'s memory.
pub fn kernels_for(device: &Device) -> &'static dyn KernelBackend {
    match device {
        Device::Cpu | Device::Sim { .. } => &cpu::CpuBackend,
        Device::Meta => &meta::MetaBackend,
        Device::Gpu { index } => gpu::backend(*index),
    }
}

// ---------------------------------------------------------------------- convolution (conv)

/// How the windows of a 2-D convolution sweep an image, the one description both
/// [`KernelBackend::im2col`] and [`KernelBackend::col2im`] take: an image of `channels` planes of
/// `input = [h, w]` pixels is read through `output = [oh, ow]` windows of `kernel = [kh, kw]` taps
/// spaced `dilation` apart; window `(p, q)` starts at pixel `(p·stride₀ − padding₀,
/// q·stride₁ − padding₁)`, and taps outside the image read 0. Padding after the image (PyTorch's
/// asymmetric `"same"` padding) needs no field: it only lengthens `output`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvGeometry {
    pub channels: usize,
    pub input: [usize; 2],
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub output: [usize; 2],
}

impl ConvGeometry {
    /// Taps of one window (`kh·kw`).
    pub fn taps(&self) -> usize {
        self.kernel[0] * self.kernel[1]
    }
    /// Windows per image and channel (`oh·ow`), the column count of the unfolded matrix.
    pub fn windows(&self) -> usize {
        self.output[0] * self.output[1]
    }
    /// Rows of the unfolded matrix of one image (`channels·kh·kw`).
    pub fn rows(&self) -> usize {
        self.channels * self.taps()
    }
    /// Pixels of one image plane (`h·w`).
    pub fn pixels(&self) -> usize {
        self.input[0] * self.input[1]
    }
}
