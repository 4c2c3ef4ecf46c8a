//! Replicas: copies of one model on several devices, their gradients summed onto the primary,
//! and the primary's parameters and buffers copied back after each optimizer step.
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

/// Add the gradients of the replicas that ran (`ran`, primary excluded) to the primary's, one
/// parameter at a time (the primary holds one extra parameter-sized copy at most), and free them.
pub(crate) fn reduce_gradients<M: Module>(replicas: &[M], ran: impl Iterator<Item = usize>) -> Result<()> {
    let Some((primary, _)) = replicas.split_first() else { return Ok(()) };
    let others: Vec<usize> = ran.filter(|&i| i != 0).collect();
    let _g = no_grad();
    let dst = primary.parameters();
    let srcs: Vec<Vec<Tensor>> = others.iter().map(|&i| replicas[i].parameters()).collect();
    for (j, p) in dst.iter().enumerate() {
        for params in &srcs {
            let Some(g) = params.get(j).and_then(|q| q.grad()) else { continue };
            let g = g.to_device(p.device())?;
            match p.grad() {
                Some(acc) => acc.add_(&g)?,
                None => p.set_grad(Some(g))?,
            }
            params[j].set_grad(None)?;
        }
    }
    Ok(())
}
