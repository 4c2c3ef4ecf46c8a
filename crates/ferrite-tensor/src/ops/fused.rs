//! Fused multi-tensor updates: one pass over several same-shaped tensors.
//!
//! An optimizer step written op by op (`mul_`, `add_`, `sqrt`, `div`, …) reads and writes every
//! state buffer several times and allocates a temporary per op. Optimizers, gradient unscaling
//! and norm computations instead hand a per-element recipe to [`Tensor::fused_update`], which
//! runs it over matching slices of all operands in a single pass, in parallel, without
//! allocating. Chunk boundaries are fixed (not derived from the thread count), so any per-chunk
//! results are combined in the same order on every machine and a run is reproducible bit for bit.

use rayon::prelude::*;
use smallvec::SmallVec;

use crate::element::Element;
use crate::error::{Result, TensorError};
use crate::ops::check_same_device;
use crate::ops::copy::check_inplace;
use crate::Tensor;

/// Elements per chunk handed to the closure (the last chunk may be shorter).
pub const FUSED_CHUNK: usize = 1 << 15;

/// Raw element pointer that may cross into rayon tasks.
#[derive(Copy, Clone)]
struct RawPtr<T>(*mut T);
// SAFETY: used only below, where every task gets disjoint element ranges of the outputs and
// reads inputs that no task writes (overlap is rejected before any pointer is shared); the
// tensors outlive the parallel loop because the caller holds them by reference.
unsafe impl<T> Send for RawPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for RawPtr<T> {}

impl Tensor {
    /// Run `f` over matching chunks of `outputs` (written in place) and `inputs` (read only).
    ///
    /// Every operand must have dtype `T`, the same shape, the same device and a contiguous
    /// layout; outputs must not overlap each other or any input. `f` receives, for one chunk,
    /// the output slices (in order) and the input slices (in order), all of equal length, and
    /// returns a per-chunk result; the results come back in chunk order (empty for zero
    /// elements or tensors on `meta`, which have no data). Chunks are [`FUSED_CHUNK`] elements
    /// and may run in parallel. Outputs get their version counter bumped, like any in-place op;
    /// outputs that require grad must be updated under `no_grad()`.
    ///
    /// `op` names the caller in error messages (e.g. `"adam_step"`).
    pub fn fused_update<T: Element, R: Send>(
        op: &'static str,
        outputs: &[&Tensor],
        inputs: &[&Tensor],
        f: impl Fn(&mut [&mut [T]], &[&[T]]) -> R + Sync + Send,
    ) -> Result<Vec<R>> {
        let Some(first) = outputs.first().or(inputs.first()) else {
            return Err(TensorError::invalid(op, "fused_update needs at least one tensor"));
        };
        for t in outputs.iter().chain(inputs) {
            if t.dtype() != T::DTYPE {
                return Err(TensorError::DTypeMismatch { op, detail: format!("expected every operand to have dtype {} but one has {}", T::DTYPE, t.dtype()) });
            }
            if t.shape() != first.shape() {
                return Err(TensorError::shape(op, format!("all operands must have the same shape; found {:?} and {:?}", first.shape(), t.shape())));
            }
            check_same_device(op, first, t)?;
            if !t.is_contiguous() {
                return Err(TensorError::invalid(op, format!("operands must be contiguous (a tensor of shape {:?} has strides {:?}); call .contiguous() first", t.shape(), t.strides())));
            }
        }
        for o in outputs {
            check_inplace(op, o, inputs)?;
        }
        for (i, a) in outputs.iter().enumerate() {
            for b in outputs[i + 1..].iter().chain(inputs) {
                if overlaps(a, b) {
                    return Err(TensorError::invalid(op, "an output overlaps another operand in memory; fused updates need distinct buffers for every output"));
                }
            }
        }
        let n = first.numel();
        if n == 0 || first.is_meta() {
            return Ok(Vec::new());
        }
        let outs: SmallVec<[RawPtr<T>; 4]> = outputs.iter().map(|t| t.ptr::<T>(op).map(RawPtr)).collect::<Result<_>>()?;
        let ins: SmallVec<[RawPtr<T>; 4]> = inputs.iter().map(|t| t.ptr::<T>(op).map(RawPtr)).collect::<Result<_>>()?;
        let run = |c: usize| -> R {
            let start = c * FUSED_CHUNK;
            let len = FUSED_CHUNK.min(n - start);
            // SAFETY: every operand is contiguous with `n` initialised elements of T (checked
            // above), so [start, start+len) is in bounds. Chunks are disjoint, so no two tasks
            // build slices over the same output elements, and outputs overlap neither each other
            // nor any input (checked above), so the `&mut` slices alias nothing else we create.
            let mut o: SmallVec<[&mut [T]; 4]> = outs.iter().map(|p| unsafe { std::slice::from_raw_parts_mut(p.0.add(start), len) }).collect();
            // SAFETY: as above; inputs are only read.
            let i: SmallVec<[&[T]; 4]> = ins.iter().map(|p| unsafe { std::slice::from_raw_parts(p.0.add(start), len) as &[T] }).collect();
            f(&mut o, &i)
        };
        let chunks = n.div_ceil(FUSED_CHUNK);
        let results = if chunks == 1 || rayon::current_num_threads() <= 1 { (0..chunks).map(run).collect() } else { (0..chunks).into_par_iter().map(run).collect() };
        for o in outputs {
            o.storage().bump_version();
        }
        Ok(results)
    }
}

/// Whether two contiguous tensors of the same dtype share any element.
fn overlaps(a: &Tensor, b: &Tensor) -> bool {
    if !a.shares_storage(b) || a.numel() == 0 || b.numel() == 0 {
        return false;
    }
    let (a0, b0) = (a.storage_offset(), b.storage_offset());
    a0 < b0 + b.numel() && b0 < a0 + a.numel()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{no_grad, DType, Device};

    fn t(v: &[f32]) -> Tensor {
        Tensor::from_slice(v, &[v.len()], &Device::Cpu).unwrap()
    }

    #[test]
    fn updates_outputs_and_reads_inputs() {
        let p = t(&[1.0, 2.0, 3.0]);
        let m = t(&[0.0; 3]);
        let g = t(&[0.5, 0.5, 1.0]);
        let v0 = p.storage().version();
        let r = Tensor::fused_update::<f32, f32>("test", &[&p, &m], &[&g], |o, i| {
            let (po, mo) = o.split_at_mut(1);
            for ((p, m), g) in po[0].iter_mut().zip(mo[0].iter_mut()).zip(i[0]) {
                *m = 2.0 * g;
                *p -= *m;
            }
            i[0].iter().sum()
        })
        .unwrap();
        assert_eq!(r, vec![2.0]);
        assert_eq!(p.to_vec::<f32>().unwrap(), vec![0.0, 1.0, 1.0]);
        assert_eq!(m.to_vec::<f32>().unwrap(), vec![1.0, 1.0, 2.0]);
        assert_eq!(p.storage().version(), v0 + 1);
    }

    #[test]
    fn chunk_results_come_back_in_order() {
        let n = FUSED_CHUNK * 3 + 7;
        let v: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let x = Tensor::from_slice(&v, &[n], &Device::Cpu).unwrap();
        let r = Tensor::fused_update::<f32, (f32, usize)>("test", &[], &[&x], |_, i| (i[0][0], i[0].len())).unwrap();
        assert_eq!(r, vec![(0.0, FUSED_CHUNK), (FUSED_CHUNK as f32, FUSED_CHUNK), ((2 * FUSED_CHUNK) as f32, FUSED_CHUNK), ((3 * FUSED_CHUNK) as f32, 7)]);
    }

    #[test]
    fn rejects_bad_operands() {
        let a = t(&[1.0, 2.0]);
        let b = t(&[1.0, 2.0, 3.0]);
        let noop = |_: &mut [&mut [f32]], _: &[&[f32]]| ();
        assert!(matches!(Tensor::fused_update::<f32, ()>("x", &[&a], &[&b], noop), Err(TensorError::ShapeMismatch { .. })));
        assert!(matches!(Tensor::fused_update::<f64, ()>("x", &[&a], &[], |_, _| ()), Err(TensorError::DTypeMismatch { .. })));
        // An output aliasing an input.
        let e = Tensor::fused_update::<f32, ()>("x", &[&a], &[&a.detach()], noop).unwrap_err();
        assert!(e.to_string().contains("overlaps"), "{e}");
        // Non-contiguous operand.
        let m = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &Device::Cpu).unwrap();
        let mt = m.t().unwrap();
        assert!(Tensor::fused_update::<f32, ()>("x", &[&m], &[&mt], noop).unwrap_err().to_string().contains("contiguous"));
        assert!(Tensor::fused_update::<f32, ()>("x", &[], &[], noop).is_err());
    }

    #[test]
    fn disjoint_views_of_one_storage_are_fine() {
        let m = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &Device::Cpu).unwrap();
        let r0 = m.select(0, 0).unwrap();
        let r1 = m.select(0, 1).unwrap();
        Tensor::fused_update::<f32, ()>("x", &[&r0], &[&r1], |o, i| o[0].copy_from_slice(i[0])).unwrap();
        assert_eq!(m.to_vec::<f32>().unwrap(), vec![3.0, 4.0, 3.0, 4.0]);
    }

    #[test]
    fn leaf_requiring_grad_needs_no_grad() {
        let p = t(&[1.0]).requires_grad_(true).unwrap();
        let inc = |o: &mut [&mut [f32]], _: &[&[f32]]| o[0][0] += 1.0;
        assert!(matches!(Tensor::fused_update::<f32, ()>("x", &[&p], &[], inc), Err(TensorError::InplaceOnLeaf { .. })));
        let _g = no_grad();
        Tensor::fused_update::<f32, ()>("x", &[&p], &[], inc).unwrap();
        assert_eq!(p.to_vec::<f32>().unwrap(), vec![2.0]);
    }

    #[test]
    fn meta_tensors_compute_nothing() {
        let p = Tensor::zeros(&[4], DType::F32, &Device::Meta).unwrap();
        let r = Tensor::fused_update::<f32, u8>("x", &[&p], &[], |_, _| 1).unwrap();
        assert!(r.is_empty());
    }
}
