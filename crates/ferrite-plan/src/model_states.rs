//! The model states a recorded step keeps at their most — parameters, gradients, optimizer
//! state — read from the step's allocation history by category.
//!
//! Why a file of its own: DeepSpeed's comparison (`zero.rs`) and the per-rank plans of a sharded
//! run (`rank_plan.rs`) both report them, and neither should import the other for it.
use serde::Serialize;

use crate::trace::{Category, StepTrace};

/// The model states a recorded step keeps on one GPU (ferrite's unsharded step, or one rank's), from the recorded step:
/// the most parameter, gradient and optimizer-state bytes live at once (requested bytes, before
/// the allocator rounds them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FerriteModelStates {
    pub parameters: u64,
    pub gradients: u64,
    pub optimizer_state: u64,
    pub total: u64,
}

/// [`FerriteModelStates`] of a recorded step.
pub fn ferrite_model_states(trace: &StepTrace) -> FerriteModelStates {
    let mut live = std::collections::HashMap::new();
    let mut by = [0u64; 3];
    let mut best = FerriteModelStates { parameters: 0, gradients: 0, optimizer_state: 0, total: 0 };
    for (ev, info) in trace.events.iter().zip(&trace.info) {
        if ev.alloc {
            let slot = match info.as_ref().map(|i| i.category) {
                Some(Category::Parameters) => 0,
                Some(Category::Gradients) => 1,
                Some(Category::OptimizerState) => 2,
                _ => continue,
            };
            by[slot] += ev.size;
            live.insert(ev.addr, (slot, ev.size));
        } else if let Some((slot, size)) = live.remove(&ev.addr) {
            by[slot] = by[slot].saturating_sub(size);
        }
        let total = by.iter().sum();
        if total > best.total {
            best = FerriteModelStates { parameters: by[0], gradients: by[1], optimizer_state: by[2], total };
        }
    }
    best
}
