//! Reverse-mode automatic differentiation over a dynamic graph.
//!
//! Each op whose inputs require grad records a [`Node`] holding a [`BackwardFn`] (which owns the
//! tensors saved for backward) and one [`Edge`] per input. Backward walks the graph from the
//! root in reverse creation order and releases each node's saved tensors as soon as it has run
//! (unless `retain_graph`), so activation memory is returned to the allocator during backward,
//! not after it. Leaves accumulate into a grad slot they share with the graph; the graph never
//! holds the leaf tensor itself, so dropping a model frees its parameters.
//!
//! Crates above (nn layers with fused backward, activation checkpointing) plug in through the
//! public [`BackwardFn`] trait and [`Tensor::from_op`]; see `tests/custom_function.rs` for an example.

mod engine;
mod grad_mode;
mod node;
mod node_hook;
mod saved;

pub use engine::backward;
pub use grad_mode::{GradModeGuard, enable_grad, is_grad_enabled, no_grad, set_grad_enabled};
pub use node::{BackwardFn, Edge, GradReadyHook, GradSlot, Node};
pub use node_hook::{BackwardNodeHook, BackwardNodeHookGuard, next_node_seq, set_backward_node_hook};
pub use saved::SavedTensor;
