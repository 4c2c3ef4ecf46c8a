//! ZeRO-2's gradient exchange: every rank's local gradients, read in the flat layout of
//! [`FlatPartition`], reduce-scattered so that each rank receives the average of its own range
//! only, bucket by bucket.
//!
//! A bucket is a slice `[lo, hi)` of every rank's range at once (`world_size` blocks of
//! `hi - lo` values, block `r` taken from rank `r`'s range), so one `MPI_Reduce_scatter_block`
//! per bucket delivers to each rank the next slice of its own averaged gradient, and at most two
//! buckets' send buffers exist at a time (one being filled while the communication thread reduces
//! the other). Why after backward and not from the grad-ready hooks as DDP's buckets are: a bucket
//! holds a slice of every rank's range, i.e. parameters from all over the model, so it is complete
//! only at the end of backward; overlapping would need the layout ordered by gradient readiness
//! (DeepSpeed's contiguous gradient buffers), which is left for later. The sum is averaged with
//! the same f32 factor DDP uses (`1 / world_size`), so the result equals DDP's all-reduce up to
//! MPI's order of summation.

use ferrite_tensor::{Tensor, no_grad};

use super::comm_dtype::CommDtype;
use super::error::{DistributedError, Result};
use super::host_values::read_f32;
use super::process_group::{Comm, Pending};
use ferrite_optim::FlatPartition;

/// What one rank gets out of the exchange.
pub(crate) struct ScatteredGrads {
    /// The averaged gradient of this rank's range (`per_rank` values, padding included).
    pub(crate) values: Vec<f32>,
    /// Per parameter: whether some rank produced a gradient for it.
    pub(crate) used_by_any: Vec<bool>,
    /// Parameters this rank produced no gradient for.
    pub(crate) unused_here: Vec<usize>,
}

/// Reduce-scatter the gradients `params` hold now (missing ones count as zeros). `zeros` sends
/// zeros instead (a rank that failed locally still pairs with its peers' collectives); a local
/// error reading a gradient does the same and is returned after the exchange.
pub(crate) fn reduce_scatter_grads(
    comm: &Comm,
    partition: &FlatPartition,
    params: &[Tensor],
    bucket_values: usize,
    zeros: bool,
    dtype: CommDtype,
) -> Result<(ScatteredGrads, Option<DistributedError>)> {
    let _g = no_grad();
    let mut local_error = None;
    let mut flat: Vec<Option<Tensor>> = Vec::with_capacity(params.len());
    if !zeros {
        for (i, p) in params.iter().enumerate() {
            let g = match p.grad() {
                Some(g) => flatten(&g, partition.numel(i)).map(Some),
                None => Ok(None),
            };
            match g {
                Ok(g) => flat.push(g),
                Err(e) => {
                    local_error = Some(e);
                    break;
                }
            }
        }
    }
    if local_error.is_some() || zeros {
        flat = vec![None; params.len()];
    }
    let used: Vec<f32> = flat.iter().map(|g| if g.is_some() { 1.0 } else { 0.0 }).collect();
    let unused_here = used.iter().enumerate().filter(|(_, u)| **u == 0.0).map(|(i, _)| i).collect();
    let counts = comm.all_reduce_sum(used)?.wait()?;

    let world = comm.world_size();
    let per_rank = partition.per_rank();
    let seg = bucket_values.max(1);
    let mut values = vec![0f32; per_rank];
    let mut in_flight: std::collections::VecDeque<(usize, Pending<Vec<f32>>)> = Default::default();
    let mut lo = 0;
    while lo < per_rank {
        let hi = (lo + seg).min(per_rank);
        let mut send = vec![0f32; world * (hi - lo)];
        for r in 0..world {
            let block = &mut send[r * (hi - lo)..(r + 1) * (hi - lo)];
            if let Err(e) = read_flat(partition, &flat, r * per_rank + lo, block) {
                block.iter_mut().for_each(|v| *v = 0.0);
                local_error.get_or_insert(e);
            }
        }
        if in_flight.len() == 2
            && let Some((at, p)) = in_flight.pop_front()
        {
            let got = p.wait()?;
            values[at..at + got.len()].copy_from_slice(&got);
        }
        in_flight.push_back((lo, comm.reduce_scatter_sum(send, dtype)?));
        lo = hi;
    }
    while let Some((at, p)) = in_flight.pop_front() {
        let got = p.wait()?;
        values[at..at + got.len()].copy_from_slice(&got);
    }
    let scale = 1.0 / world as f32;
    values.iter_mut().for_each(|v| *v *= scale);
    let used_by_any = counts.iter().map(|c| *c > 0.0).collect();
    Ok((ScatteredGrads { values, used_by_any, unused_here }, local_error))
}

/// Copy the flat values `[start, start + out.len())` of the gradients into `out` (zeros where a
/// gradient is missing or past the last parameter).
fn read_flat(partition: &FlatPartition, flat: &[Option<Tensor>], start: usize, out: &mut [f32]) -> Result<()> {
    let end = start + out.len();
    for (i, a, b) in partition.overlapping(start, end.min(partition.total())) {
        if let Some(g) = &flat[i] {
            let off = partition.offset(i);
            let v = read_f32(&g.narrow(0, a - off, b - a)?)?;
            out[a - start..b - start].copy_from_slice(&v);
        }
    }
    Ok(())
}

/// A gradient as a flat tensor of `numel` values in its own dtype (a view when contiguous; a
/// bf16 gradient is widened slice by slice on the host, never as a whole on the device).
fn flatten(g: &Tensor, numel: usize) -> Result<Tensor> {
    Ok(g.contiguous()?.reshape_usize(&[numel])?)
}
