//! An optimizer's state over [pieces](super::owners::Piece) converted to and from the layout of
//! the same optimizer over the whole parameters (one entry per parameter, tensors of the
//! parameter's shape): what a single-device run saves and loads, and what PyTorch writes.
//!
//! Only [`OwnerPolicy::Sharded`](super::OwnerPolicy::Sharded) splits parameters; for the other
//! policies every piece is a whole parameter and both conversions are the identity.
use ferrite_memory::Device;
use ferrite_optim::{GroupState, OptimError, OptimizerState, StateValue};
use ferrite_tensor::{Tensor, no_grad};

use super::owners::Piece;
use crate::error::Result;

fn layout_error(detail: String) -> crate::error::ParallelError {
    OptimError::StateDict(format!("DataParallel optimizer state: {detail}")).into()
}

/// `state` (indexed by piece) as the single-device layout (indexed by parameter, `shapes[j]` the
/// shape of parameter `j`). Split pieces' per-element tensors are joined on the host.
pub(crate) fn merge(state: &OptimizerState, pieces: &[Piece], shapes: &[Vec<usize>]) -> Result<OptimizerState> {
    if pieces.iter().all(|p| p.whole) {
        return Ok(state.clone());
    }
    let _g = no_grad();
    let piece = |i: usize| {
        pieces.get(i).ok_or_else(|| {
            layout_error(format!(
                "piece {i} does not exist ({} pieces); was it built from dp.parameters()?",
                pieces.len()
            ))
        })
    };
    let mut groups = Vec::with_capacity(state.param_groups.len());
    for g in &state.param_groups {
        let (mut params, mut names) = (Vec::new(), g.param_names.as_ref().map(|_| Vec::new()));
        for (k, &i) in g.params.iter().enumerate() {
            let j = piece(i)?.param;
            if !params.contains(&j) {
                params.push(j);
                if let (Some(out), Some(all)) = (names.as_mut(), g.param_names.as_ref()) {
                    out.push(all.get(k).cloned().unwrap_or_default());
                }
            }
        }
        groups.push(GroupState { hyper: g.hyper.clone(), params, param_names: names });
    }
    let mut merged = Vec::new();
    for (j, shape) in shapes.iter().enumerate() {
        let mine: Vec<(usize, &Piece)> = pieces.iter().enumerate().filter(|(_, p)| p.param == j).collect();
        let entries: Vec<Option<&[(String, StateValue)]>> = mine.iter().map(|(i, _)| state.param_state(*i)).collect();
        let Some(first) = entries.first().copied().flatten() else { continue };
        if entries.iter().any(|e| e.is_none()) {
            return Err(layout_error(format!("parameter {j} has state for some of its pieces only")));
        }
        if mine.len() == 1 {
            merged.push((j, first.to_vec()));
            continue;
        }
        let mut out = Vec::with_capacity(first.len());
        for (key, value) in first {
            // A tensor shaped like its piece in every piece holds one value per element: join.
            let parts: Option<Vec<Tensor>> = mine
                .iter()
                .zip(&entries)
                .map(|((_, p), e)| match e.and_then(|e| e.iter().find(|(k, _)| k == key)) {
                    Some((_, StateValue::Tensor(t))) if t.shape() == [p.len] => Some(t.clone()),
                    _ => None,
                })
                .collect();
            let value = match parts {
                Some(parts) => {
                    let host =
                        parts.iter().map(|t| t.detach().to_device(&Device::Cpu)).collect::<Result<Vec<_>, _>>()?;
                    let refs: Vec<&Tensor> = host.iter().collect();
                    StateValue::Tensor(Tensor::cat(&refs, 0)?.reshape_usize(shape)?)
                }
                None => value.clone(),
            };
            out.push((key.clone(), value));
        }
        merged.push((j, out));
    }
    Ok(OptimizerState { state: merged, param_groups: groups })
}

/// A single-device layout `state` (indexed by parameter) as the pieces' layout: each split
/// parameter's per-element tensors cut into its pieces (on the host; loading copies them to the
/// owners' devices).
pub(crate) fn split(state: &OptimizerState, pieces: &[Piece], shapes: &[Vec<usize>]) -> Result<OptimizerState> {
    if pieces.iter().all(|p| p.whole) {
        return Ok(state.clone());
    }
    let _g = no_grad();
    let mut groups = Vec::with_capacity(state.param_groups.len());
    for g in &state.param_groups {
        let (mut params, mut names) = (Vec::new(), g.param_names.as_ref().map(|_| Vec::new()));
        for (k, &j) in g.params.iter().enumerate() {
            if j >= shapes.len() {
                return Err(layout_error(format!("parameter {j} does not exist (the model has {})", shapes.len())));
            }
            for (i, _) in pieces.iter().enumerate().filter(|(_, p)| p.param == j) {
                params.push(i);
                if let (Some(out), Some(all)) = (names.as_mut(), g.param_names.as_ref()) {
                    out.push(all.get(k).cloned().unwrap_or_default());
                }
            }
        }
        groups.push(GroupState { hyper: g.hyper.clone(), params, param_names: names });
    }
    let mut out = Vec::new();
    for (i, p) in pieces.iter().enumerate() {
        let Some(entries) = state.param_state(p.param) else { continue };
        let shape = &shapes[p.param];
        let mut e = Vec::with_capacity(entries.len());
        for (key, value) in entries {
            let value = match value {
                StateValue::Tensor(t) if !p.whole && t.shape() == shape.as_slice() => {
                    let flat = t.detach().to_device(&Device::Cpu)?.reshape_usize(&[t.numel()])?;
                    StateValue::Tensor(flat.narrow(0, p.start, p.len)?.deep_clone()?)
                }
                other => other.clone(),
            };
            e.push((key.clone(), value));
        }
        out.push((i, e));
    }
    Ok(OptimizerState { state: out, param_groups: groups })
}
