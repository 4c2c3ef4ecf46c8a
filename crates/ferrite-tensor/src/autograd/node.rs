//! Graph nodes and edges.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::Tensor;
use crate::error::Result;

/// The backward of one op: given the gradients of its outputs (None where an output received no
/// gradient), return the gradients of its inputs, in input order (None where an input needs none).
///
/// Implementors own the tensors they saved for backward; dropping the implementor releases them.
pub trait BackwardFn: Send {
    /// Name used in error messages (PyTorch style, e.g. `MulBackward0`).
    fn name(&self) -> Cow<'static, str>;
    fn backward(&mut self, grad_outputs: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>>;
}

/// Where an input's gradient goes.
#[derive(Clone)]
pub enum Edge {
    /// Into input `input_nr` of the node that produced the input tensor.
    Node { node: Arc<Node>, output_nr: usize },
    /// Into a leaf's gradient slot.
    Leaf(Arc<GradSlot>),
}

/// Called once per backward pass when a leaf's gradient for that pass is complete (every edge
/// into the leaf has accumulated), like PyTorch's `register_post_accumulate_grad_hook`. Data
/// parallelism uses it to start reducing a gradient while backward is still running.
pub type GradReadyHook = Arc<dyn Fn() + Send + Sync>;

/// A leaf's accumulated gradient (also used for `retain_grad` on non-leaves).
#[derive(Default)]
pub struct GradSlot {
    pub(crate) grad: Mutex<Option<Tensor>>,
    pub(crate) ready_hook: Mutex<Option<GradReadyHook>>,
}

impl GradSlot {
    pub fn get(&self) -> Option<Tensor> {
        self.grad.lock().clone()
    }
    pub fn set(&self, g: Option<Tensor>) {
        *self.grad.lock() = g;
    }

    pub(crate) fn ready_hook(&self) -> Option<GradReadyHook> {
        self.ready_hook.lock().clone()
    }
}

static NEXT_SEQ: AtomicU64 = AtomicU64::new(0);

/// The sequence number the next node will get.
pub(crate) fn next_seq() -> u64 {
    NEXT_SEQ.load(Ordering::Relaxed)
}

/// One recorded op.
pub struct Node {
    pub(crate) name: Cow<'static, str>,
    pub(crate) backward: Mutex<Option<Box<dyn BackwardFn>>>,
    pub(crate) edges: Vec<Option<Edge>>,
    pub(crate) num_outputs: usize,
    /// Creation order; backward runs nodes in decreasing order, like PyTorch's sequence numbers.
    pub(crate) seq: u64,
    /// Grad slots of outputs that asked for `retain_grad`.
    pub(crate) retained: Mutex<Vec<(usize, Arc<GradSlot>)>>,
}

impl Node {
    pub(crate) fn new(backward: Box<dyn BackwardFn>, edges: Vec<Option<Edge>>, num_outputs: usize) -> Arc<Node> {
        Arc::new(Node {
            name: backward.name(),
            backward: Mutex::new(Some(backward)),
            edges,
            num_outputs,
            seq: NEXT_SEQ.fetch_add(1, Ordering::Relaxed),
            retained: Mutex::new(Vec::new()),
        })
    }

    /// Creation order (backward runs nodes in decreasing order).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The op name, e.g. `MulBackward0`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Edges to the producers of this node's inputs.
    pub fn next_edges(&self) -> &[Option<Edge>] {
        &self.edges
    }

    /// Whether backward already ran without `retain_graph` (saved tensors released).
    pub fn is_released(&self) -> bool {
        self.backward.lock().is_none()
    }
}

impl Drop for Node {
    // Long chains (e.g. an RNN unrolled over thousands of steps) would otherwise drop recursively
    // and overflow the stack: unlink edges iteratively.
    fn drop(&mut self) {
        let mut stack: Vec<Arc<Node>> = Vec::new();
        for e in self.edges.drain(..).flatten() {
            if let Edge::Node { node, .. } = e {
                stack.push(node);
            }
        }
        while let Some(n) = stack.pop() {
            if let Ok(mut inner) = Arc::try_unwrap(n) {
                for e in inner.edges.drain(..).flatten() {
                    if let Edge::Node { node, .. } = e {
                        stack.push(node);
                    }
                }
            }
        }
    }
}
