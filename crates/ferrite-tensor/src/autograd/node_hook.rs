//! A per-thread hook that backward calls before it runs each node, with the node's sequence
//! number (its creation order).
//!
//! Why: a fully sharded data-parallel run (ZeRO-3, PyTorch FSDP) frees a unit's parameters after
//! its forward and must gather them again just before backward reaches the unit's ops — PyTorch
//! does this with hooks on the unit's outputs. Here the model's forward marks where each unit
//! begins (`ferrite_nn::mark_layer`), the sharding code notes [`next_node_seq`] at each mark, and
//! since backward runs nodes in decreasing sequence order, the hook can tell from a node's number
//! which unit backward is in, gather it before its first op and free (and reduce) the unit just
//! left. A hook that returns an error stops backward with that error.

use std::cell::RefCell;
use std::sync::Arc;

use super::node::next_seq;
use crate::error::{Result, TensorError};

/// Called with the sequence number of each node before backward runs it.
pub type BackwardNodeHook = Arc<dyn Fn(u64) -> std::result::Result<(), String>>;

thread_local! {
    static HOOK: RefCell<Option<BackwardNodeHook>> = const { RefCell::new(None) };
}

/// The sequence number the next recorded op's node will get (creation order, shared by all
/// threads).
pub fn next_node_seq() -> u64 {
    next_seq()
}

/// Install `hook` for backward passes run on this thread until the guard drops (the previous
/// hook is restored then).
pub fn set_backward_node_hook(hook: BackwardNodeHook) -> BackwardNodeHookGuard {
    let previous = HOOK.with(|h| h.borrow_mut().replace(hook));
    BackwardNodeHookGuard { previous: Some(previous) }
}

/// Keeps a backward node hook installed; see [`set_backward_node_hook`].
#[must_use = "the hook is removed when the guard is dropped"]
pub struct BackwardNodeHookGuard {
    previous: Option<Option<BackwardNodeHook>>,
}

impl Drop for BackwardNodeHookGuard {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            HOOK.with(|h| *h.borrow_mut() = previous);
        }
    }
}

/// Run the hook (if any) for the node numbered `seq`.
pub(crate) fn before_node(seq: u64) -> Result<()> {
    let hook = HOOK.with(|h| h.borrow().clone());
    match hook {
        Some(f) => f(seq).map_err(|detail| TensorError::Autograd { detail }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::{DType, Device, Tensor};

    #[test]
    fn the_hook_sees_nodes_in_decreasing_order_and_its_error_stops_backward() {
        let x = Tensor::ones(&[3], DType::F32, &Device::Cpu).unwrap().requires_grad_(true).unwrap();
        let start = next_node_seq();
        let y = x.mul_scalar(2.0).unwrap();
        let z = y.sum().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        {
            let _g = set_backward_node_hook(Arc::new(move |seq| {
                s.lock().unwrap().push(seq);
                Ok(())
            }));
            z.backward_retain().unwrap();
        }
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen[0] > seen[1] && seen[1] >= start, "{seen:?} from {start}");
        let _g = set_backward_node_hook(Arc::new(|_| Err("stop here".into())));
        let e = z.backward().unwrap_err();
        assert!(e.to_string().contains("stop here"), "{e}");
    }
}
