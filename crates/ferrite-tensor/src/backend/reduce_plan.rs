//! The plan of a reduction ([`Plan`]): which input elements fold into which output, the operand
//! of the reduction kernels ([`KernelBackend::sum`](super::KernelBackend::sum), `var`,
//! `arg_extreme`). The trait takes it, so it lives on the backend side; `ops/reduce.rs` builds it
//! from the op's dims and re-exports it under its old path.

use smallvec::SmallVec;

use crate::layout::{Layout, Shape};

/// How a reduction maps input elements to outputs.
pub struct Plan {
    /// Output shape as returned (reduced dims removed unless keepdim).
    pub out_shape: Shape,
    /// Output shape with reduced dims kept as 1 (for broadcasting gradients back).
    pub keep_shape: Shape,
    /// Input layout permuted so kept dims come first and reduced dims last.
    pub permuted: Layout,
    /// Elements reduced into each output.
    pub rn: usize,
    pub reduced: SmallVec<[bool; 6]>,
}
