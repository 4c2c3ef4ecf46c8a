//! The op selectors of the elementwise and random-fill kernels (`BinaryOp`, `UnaryOp`,
//! `CompareOp`, `LogicalOp`, `Distribution`): plain values that name which arithmetic a
//! [`KernelBackend`](super::KernelBackend) method runs. They live on the backend side of the seam
//! because the trait takes them; `ops/` names them when it hands the arithmetic down.

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
