//! Replicas: copies of one model on several devices, each parameter's gradients summed onto its
//! owner replica, and the owners' parameters (the primary's buffers) copied back to the other
//! replicas after each optimizer step.
use ferrite_memory::Device;
use ferrite_nn::Module;
use ferrite_tensor::{Tensor, no_grad};

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

/// Free every gradient a replica holds for a parameter it does not own (per-step scratch), keeping
/// the owners' gradients so that accumulation over several backward passes works.
pub(crate) fn free_unowned_gradients<M: Module>(replicas: &[M], owners: &[usize]) -> Result<()> {
    for (r, replica) in replicas.iter().enumerate() {
        for (p, _) in replica.parameters().iter().zip(owners).filter(|(_, o)| **o != r) {
            if p.grad().is_some() {
                p.set_grad(None)?;
            }
        }
    }
    Ok(())
}

/// Add the gradients of the replicas that ran (`ran`) to each parameter's owner (`owners[j]` is
/// the owner replica of parameter `j`), one parameter at a time (an owner holds one extra
/// parameter-sized copy at most), and free the non-owners' copies. The owner's own gradient (what
/// it accumulated before plus its own backward) comes first, the others are added in replica
/// order.
pub(crate) fn reduce_gradients<M: Module>(
    replicas: &[M],
    owners: &[usize],
    ran: impl Iterator<Item = usize>,
) -> Result<()> {
    let ran: Vec<usize> = ran.collect();
    let _g = no_grad();
    let params: Vec<Vec<Tensor>> = replicas.iter().map(|r| r.parameters()).collect();
    for (j, &owner) in owners.iter().enumerate() {
        let Some(dst) = params.get(owner).and_then(|p| p.get(j)) else { continue };
        for &r in ran.iter().filter(|&&r| r != owner) {
            let Some(src) = params.get(r).and_then(|p| p.get(j)) else { continue };
            let Some(g) = src.grad() else { continue };
            let g = g.to_device(dst.device())?;
            match dst.grad() {
                Some(acc) => acc.add_(&g)?,
                None => dst.set_grad(Some(g))?,
            }
            src.set_grad(None)?;
        }
    }
    Ok(())
}

/// Copy each parameter from its owner to every other replica, and the primary's buffers to the
/// other replicas, in place (after the optimizer stepped the owners' parameters).
pub(crate) fn sync_from_owners<M: Module>(replicas: &[M], owners: &[usize]) -> Result<()> {
    if replicas.len() < 2 {
        return Ok(());
    }
    let _g = no_grad();
    let params: Vec<Vec<Tensor>> = replicas.iter().map(|r| r.parameters()).collect();
    for (j, &owner) in owners.iter().enumerate() {
        let Some(src) = params.get(owner).and_then(|p| p.get(j)) else { continue };
        let src = src.detach();
        let others = params.iter().enumerate().filter(|(r, _)| *r != owner).filter_map(|(_, p)| p.get(j));
        for dst in others {
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
