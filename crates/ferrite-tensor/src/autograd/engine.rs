//! The backward pass.

use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use crate::Tensor;
use crate::autograd::no_grad;
use crate::autograd::node::{Edge, GradSlot, Node};
use crate::error::{Result, TensorError};

struct Ready(Arc<Node>);
impl PartialEq for Ready {
    fn eq(&self, o: &Self) -> bool {
        self.0.seq == o.0.seq
    }
}
impl Eq for Ready {}
impl PartialOrd for Ready {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ready {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.seq.cmp(&o.0.seq)
    }
}

fn key(n: &Arc<Node>) -> usize {
    Arc::as_ptr(n) as usize
}

/// Accumulate `g` into a gradient slot. The first gradient is stolen when nothing else holds it
/// (else copied, so a later in-place update of `.grad` cannot corrupt another tensor); later ones
/// are added in place when the stored gradient is not shared, like PyTorch's AccumulateGrad.
pub(crate) fn accumulate(slot: &GradSlot, g: Tensor) -> Result<()> {
    let mut cur = slot.grad.lock();
    match cur.take() {
        None => {
            let g = if g.is_exclusively_owned() && g.is_contiguous() { g } else { g.deep_clone()? };
            *cur = Some(g);
        }
        Some(existing) => {
            if existing.is_exclusively_owned() {
                existing.add_assign_unchecked(&g)?;
                *cur = Some(existing);
            } else {
                *cur = Some(existing.add(&g)?);
            }
        }
    }
    Ok(())
}

/// Run backward from `roots` (tensors) with the given gradients.
pub fn backward(roots: &[(Tensor, Tensor)], retain_graph: bool) -> Result<()> {
    let _guard = no_grad();
    // Seed: leaves accumulate directly; non-leaves feed their node's input buffer.
    let mut buffers: HashMap<usize, Vec<Option<Tensor>>> = HashMap::new();
    let mut start_nodes: Vec<Arc<Node>> = Vec::new();
    for (t, g) in roots {
        if t.shape() != g.shape() {
            return Err(TensorError::Autograd {
                detail: format!(
                    "mismatch in shape: grad_output has a shape of {:?} and output has a shape of {:?}",
                    g.shape(),
                    t.shape()
                ),
            });
        }
        match t.grad_fn() {
            Some(node) => {
                let buf = buffers.entry(key(&node)).or_insert_with(|| vec![None; node.num_outputs]);
                add_into(&mut buf[t.output_nr()], g.clone())?;
                start_nodes.push(node);
            }
            None => {
                if !t.requires_grad() {
                    return Err(TensorError::Autograd {
                        detail: "element 0 of tensors does not require grad and does not have a grad_fn; call requires_grad_(true) on the leaves you want gradients for, and make sure the loss is not computed under no_grad".into(),
                    });
                }
                let slot = t.grad_slot();
                accumulate(&slot, g.clone())?;
                if let Some(hook) = slot.ready_hook() {
                    hook();
                }
            }
        }
    }
    if start_nodes.is_empty() {
        return Ok(());
    }
    // Dependency counts: how many edges point at each node within the reachable graph.
    let mut deps: HashMap<usize, usize> = HashMap::new();
    // Leaves with a grad-ready hook: how many edges still have to deliver into them.
    let mut pending_leaves: HashMap<usize, usize> = HashMap::new();
    let mut seen: HashMap<usize, ()> = HashMap::new();
    let mut stack: Vec<Arc<Node>> = Vec::new();
    for n in &start_nodes {
        if seen.insert(key(n), ()).is_none() {
            stack.push(n.clone());
        }
    }
    while let Some(n) = stack.pop() {
        for e in n.edges.iter().flatten() {
            match e {
                Edge::Node { node, .. } => {
                    *deps.entry(key(node)).or_insert(0) += 1;
                    if seen.insert(key(node), ()).is_none() {
                        stack.push(node.clone());
                    }
                }
                Edge::Leaf(slot) => {
                    if slot.ready_hook.lock().is_some() {
                        *pending_leaves.entry(Arc::as_ptr(slot) as usize).or_insert(0) += 1;
                    }
                }
            }
        }
    }
    let mut ready: BinaryHeap<Ready> = BinaryHeap::new();
    for n in start_nodes {
        if deps.get(&key(&n)).copied().unwrap_or(0) == 0 && !ready.iter().any(|r| Arc::ptr_eq(&r.0, &n)) {
            ready.push(Ready(n));
        }
    }
    while let Some(Ready(node)) = ready.pop() {
        let grads_out = buffers.remove(&key(&node)).unwrap_or_else(|| vec![None; node.num_outputs]);
        {
            let retained = node.retained.lock();
            for (nr, slot) in retained.iter() {
                if let Some(Some(g)) = grads_out.get(*nr) {
                    accumulate(slot, g.clone())?;
                }
            }
        }
        super::node_hook::before_node(node.seq)?;
        let grads_in = {
            let mut f = node.backward.lock();
            let Some(func) = f.as_mut() else {
                return Err(TensorError::GraphReleased { op: node.name.to_string() });
            };
            let r = func.backward(&grads_out)?;
            if !retain_graph {
                // Release saved tensors now: activation memory returns during backward.
                *f = None;
            }
            r
        };
        drop(grads_out);
        if grads_in.len() != node.edges.len() {
            return Err(TensorError::Autograd {
                detail: format!(
                    "function {} returned {} gradients, expected {} (one per input)",
                    node.name,
                    grads_in.len(),
                    node.edges.len()
                ),
            });
        }
        for (edge, g) in node.edges.iter().zip(grads_in) {
            let Some(edge) = edge else { continue };
            match edge {
                Edge::Leaf(slot) => {
                    if let Some(g) = g {
                        accumulate(slot, g)?;
                    }
                    if let Some(left) = pending_leaves.get_mut(&(Arc::as_ptr(slot) as usize)) {
                        *left -= 1;
                        if *left == 0
                            && let Some(hook) = slot.ready_hook()
                        {
                            hook();
                        }
                    }
                }
                Edge::Node { node: next, output_nr } => {
                    if let Some(g) = g {
                        let buf = buffers.entry(key(next)).or_insert_with(|| vec![None; next.num_outputs]);
                        add_into(&mut buf[*output_nr], g)?;
                    }
                    let d = deps
                        .get_mut(&key(next))
                        .ok_or_else(|| TensorError::Autograd { detail: "internal: missing dependency count".into() })?;
                    *d -= 1;
                    if *d == 0 {
                        ready.push(Ready(next.clone()));
                    }
                }
            }
        }
    }
    Ok(())
}

fn add_into(slot: &mut Option<Tensor>, g: Tensor) -> Result<()> {
    *slot = Some(match slot.take() {
        None => g,
        Some(prev) => prev.add(&g)?,
    });
    Ok(())
}
