//! Replicas: copies of one model on several devices, each parameter's gradients summed onto its
//! owner replica, and the owners' parameters (the primary's buffers) copied back to the other
//! replicas after each optimizer step.
use ferrite_memory::Device;
use ferrite_nn::Module;
use ferrite_tensor::{Tensor, no_grad};

use super::owners::Piece;
use crate::error::{ParallelError, Result};

/// Refuse an empty device list or a device listed twice.
pub(crate) fn check_devices(devices: &[Device]) -> Result<()> {
    if devices.is_empty() {
        return Err(ParallelError::NoDevices);
    }
    for (i, d) in devices.iter().enumerate() {
        if devices[..i].contains(d) {
            let all: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
            return Err(ParallelError::DuplicateDevice { device: d.to_string(), devices: all.join(", ") });
        }
    }
    Ok(())
}

/// `module` moved to `devices[0]`, followed by a copy of it on each other device (own tensors,
/// same values, same `requires_grad`).
pub(crate) fn replicate<M: Module + Clone>(mut module: M, devices: &[Device]) -> Result<Vec<M>> {
    module.to_device(&devices[0])?;
    let mut replicas = Vec::with_capacity(devices.len());
    for d in &devices[1..] {
        let mut r = module.clone();
        // `to_device` gives the clone its own tensors; the primary keeps its handles.
        r.to_device(d)?;
        replicas.push(r);
    }
    replicas.insert(0, module);
    Ok(replicas)
}

/// Copy the primary's parameters and buffers into the other replicas, in place.
pub(crate) fn sync<M: Module>(replicas: &[M]) -> Result<()> {
    let Some((primary, rest)) = replicas.split_first() else { return Ok(()) };
    let _g = no_grad();
    let src: Vec<Tensor> = tensors(primary);
    for r in rest {
        for (dst, s) in tensors(r).iter().zip(&src) {
            dst.copy_(&s.detach().to_device(dst.device())?)?;
        }
    }
    Ok(())
}

/// Parameters then buffers, in the module's order.
fn tensors<M: Module>(m: &M) -> Vec<Tensor> {
    m.parameters().into_iter().chain(m.named_buffers().into_iter().map(|(_, t)| t)).collect()
}

/// The optimizer's tensors for `pieces`: the owner replica's parameter for a whole piece, a flat
/// view into it (sharing its storage, without autograd history) for a split one.
pub(crate) fn piece_tensors<M: Module>(replicas: &[M], pieces: &[Piece]) -> Result<Vec<Tensor>> {
    let params: Vec<Vec<Tensor>> = replicas.iter().map(|r| r.parameters()).collect();
    pieces.iter().map(|pc| piece_of(&params[pc.owner][pc.param], pc, true)).collect()
}

/// Parameter `p`'s elements of `piece`: `p` itself for a whole piece (or `whole_as_is` false: its
/// detached handle), else a flat view.
fn piece_of(p: &Tensor, piece: &Piece, whole_as_is: bool) -> Result<Tensor> {
    if piece.whole {
        return Ok(if whole_as_is { p.clone() } else { p.detach() });
    }
    Ok(p.detach().reshape(&[p.numel() as i64])?.narrow(0, piece.start, piece.len)?)
}

/// Free every gradient a replica holds for a parameter it does not own wholly (per-step
/// scratch), keeping the owners' gradients so that accumulation over several backward passes
/// works (a split parameter's accumulated gradient lives on its pieces).
pub(crate) fn free_unowned_gradients<M: Module>(replicas: &[M], pieces: &[Piece]) -> Result<()> {
    for (r, replica) in replicas.iter().enumerate() {
        for (j, p) in replica.parameters().iter().enumerate() {
            let owns = pieces.iter().any(|pc| pc.param == j && pc.whole && pc.owner == r);
            if !owns && p.grad().is_some() {
                p.set_grad(None)?;
            }
        }
    }
    Ok(())
}

/// Add the gradients of the replicas that ran (`ran`) onto each piece's owner (`targets[i]` is
/// the optimizer's tensor of `pieces[i]`), one piece at a time (an owner holds one extra
/// piece-sized copy at most), and free the replicas' copies. The owner's own gradient (what it
/// accumulated before plus its own backward) comes first, the others are added in replica order.
pub(crate) fn reduce_gradients<M: Module>(
    replicas: &[M],
    pieces: &[Piece],
    targets: &[Tensor],
    ran: impl Iterator<Item = usize>,
) -> Result<()> {
    let ran: Vec<usize> = ran.collect();
    let _g = no_grad();
    let params: Vec<Vec<Tensor>> = replicas.iter().map(|r| r.parameters()).collect();
    for (i, (pc, dst)) in pieces.iter().zip(targets).enumerate() {
        let order = std::iter::once(pc.owner).chain(ran.iter().copied().filter(|&r| r != pc.owner));
        for r in order {
            // A whole piece's owner already holds its gradient in place.
            if pc.whole && r == pc.owner {
                continue;
            }
            if !pc.whole && !ran.contains(&r) {
                continue;
            }
            let Some(src) = params.get(r).and_then(|p| p.get(pc.param)) else { continue };
            let Some(g) = src.grad() else { continue };
            let part = piece_of(&g, pc, false)?;
            let part = if part.device() == dst.device() { part.deep_clone()? } else { part.to_device(dst.device())? };
            match dst.grad() {
                Some(acc) => acc.add_(&part)?,
                None => dst.set_grad(Some(part))?,
            }
            if pc.whole {
                src.set_grad(None)?;
            }
        }
        // A split parameter's replica gradients are freed once its last piece has taken its part.
        let last_piece = pieces.get(i + 1).is_none_or(|next| next.param != pc.param);
        if !pc.whole && last_piece {
            for p in &params {
                if let Some(t) = p.get(pc.param) {
                    t.set_grad(None)?;
                }
            }
        }
    }
    Ok(())
}

/// Copy each piece from its owner (the optimizer's tensor, `sources[i]`) to every other replica,
/// and the primary's buffers to the other replicas, in place (after the optimizer stepped).
pub(crate) fn sync_from_owners<M: Module>(replicas: &[M], pieces: &[Piece], sources: &[Tensor]) -> Result<()> {
    if replicas.len() < 2 {
        return Ok(());
    }
    let _g = no_grad();
    let params: Vec<Vec<Tensor>> = replicas.iter().map(|r| r.parameters()).collect();
    for (pc, src) in pieces.iter().zip(sources) {
        let src = src.detach();
        for (_, p) in params.iter().enumerate().filter(|(r, _)| *r != pc.owner) {
            let Some(p) = p.get(pc.param) else { continue };
            let dst = piece_of(p, pc, false)?;
            dst.copy_(&src.to_device(dst.device())?)?;
        }
    }
    let buffers: Vec<Vec<Tensor>> =
        replicas.iter().map(|r| r.named_buffers().into_iter().map(|(_, t)| t).collect()).collect();
    let Some((primary, rest)) = buffers.split_first() else { return Ok(()) };
    for other in rest {
        for (dst, s) in other.iter().zip(primary) {
            dst.copy_(&s.detach().to_device(dst.device())?)?;
        }
    }
    Ok(())
}
