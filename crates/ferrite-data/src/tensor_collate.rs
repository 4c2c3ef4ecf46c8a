//! Collating samples into batched [`Tensor`]s, in the workers.
//!
//! A training step wants one `[batch, ...]` tensor per field, not a `Vec` of samples. Building it
//! in the worker (as PyTorch's `default_collate` does) keeps the copy off the training thread,
//! and the result is a value the staging step can move to the training device as a whole.
//!
//! Two routes, for two kinds of sample:
//! - samples that already are tensors (or tuples of tensors and numbers) are stacked along a new
//!   first dimension by [`StackCollate`], following `default_collate`: a `Tensor` of shape `s`
//!   becomes `[n, ..s]`, a number becomes a 1-D tensor (`usize` labels become `int64`, like
//!   Python ints), and a tuple is collated field by field;
//! - the built-in datasets collate into one contiguous host buffer first ([`ImageBatch`],
//!   [`TextBatch`]), and [`Tensors`] turns that buffer into tensors with a single copy.
//!
//! Batches are built on the CPU; `.stage_to(device)` moves them (see [`staging`](crate::staging)).

use ferrite_memory::Device;
use ferrite_tensor::{Generator, Tensor, TensorError};

use crate::collate::Collate;
use crate::error::BoxError;
use crate::examples::{ImageBatch, TextBatch};

/// A sample type [`StackCollate`] can batch: how a list of them becomes one batch.
pub trait Stackable: Sized + Send + 'static {
    /// What a batch of these becomes (a tensor, or a tuple of tensors for tuple samples).
    type Batch: Send + 'static;

    /// Combine `samples` (never empty: the loader does not make empty batches) into a batch.
    fn stack(samples: Vec<Self>) -> Result<Self::Batch, BoxError>;
}

/// Stacks the samples of a batch into tensors — `default_collate` for tensors, numbers and
/// tuples of them. See the [module docs](self).
#[derive(Debug, Clone, Copy, Default)]
pub struct StackCollate;

impl<S: Stackable> Collate<S> for StackCollate {
    type Batch = S::Batch;

    fn collate(&self, samples: Vec<S>, _rng: &mut Generator) -> Result<S::Batch, BoxError> {
        if samples.is_empty() {
            return Err("cannot collate an empty batch into tensors".into());
        }
        S::stack(samples)
    }
}

impl Stackable for Tensor {
    type Batch = Tensor;

    /// `[n, ..shape]`; every sample must have the same shape, dtype and device.
    fn stack(samples: Vec<Tensor>) -> Result<Tensor, BoxError> {
        if let Some(batch) = concat_plain_cpu(&samples)? {
            return Ok(batch);
        }
        let refs: Vec<&Tensor> = samples.iter().collect();
        Ok(Tensor::stack(&refs, 0)?)
    }
}

/// The common case — contiguous CPU samples of one shape and dtype, no autograd history — as one
/// buffer concatenation, about twice as fast as the general `Tensor::stack`. `None` for anything
/// else (which `Tensor::stack` handles, or rejects with its own error).
fn concat_plain_cpu(samples: &[Tensor]) -> Result<Option<Tensor>, BoxError> {
    let Some(first) = samples.first() else { return Ok(None) };
    let plain = |t: &Tensor| {
        t.device() == &Device::Cpu
            && t.is_contiguous()
            && !t.requires_grad()
            && t.dtype() == first.dtype()
            && t.shape() == first.shape()
    };
    if !samples.iter().all(plain) {
        return Ok(None);
    }
    let mut shape = Vec::with_capacity(first.rank() + 1);
    shape.push(samples.len());
    shape.extend_from_slice(first.shape());
    fn concat<T: ferrite_tensor::Element>(samples: &[Tensor], shape: &[usize]) -> Result<Tensor, BoxError> {
        let mut data: Vec<T> = Vec::with_capacity(shape.iter().product());
        for t in samples {
            data.extend_from_slice(&t.to_vec::<T>()?);
        }
        Ok(Tensor::from_vec(data, shape, &Device::Cpu)?)
    }
    use ferrite_tensor::DType;
    let out = match first.dtype() {
        DType::F32 => concat::<f32>(samples, &shape)?,
        DType::F64 => concat::<f64>(samples, &shape)?,
        DType::I64 => concat::<i64>(samples, &shape)?,
        DType::I32 => concat::<i32>(samples, &shape)?,
        DType::U8 => concat::<u8>(samples, &shape)?,
        // Half types and bool take the general path.
        _ => return Ok(None),
    };
    Ok(Some(out))
}

macro_rules! stackable_number {
    ($($t:ty),*) => {$(
        impl Stackable for $t {
            type Batch = Tensor;

            /// A 1-D tensor of the values, same dtype.
            fn stack(samples: Vec<$t>) -> Result<Tensor, BoxError> {
                let n = samples.len();
                Ok(Tensor::from_vec(samples, &[n], &Device::Cpu)?)
            }
        }
    )*};
}

stackable_number!(f32, f64, i64, i32, u8);

impl Stackable for usize {
    type Batch = Tensor;

    /// A 1-D `int64` tensor (class labels), as PyTorch collates Python ints.
    fn stack(samples: Vec<usize>) -> Result<Tensor, BoxError> {
        let n = samples.len();
        let values = samples
            .into_iter()
            .map(|v| i64::try_from(v).map_err(|_| format!("label {v} does not fit in int64")))
            .collect::<Result<Vec<i64>, String>>()?;
        Ok(Tensor::from_vec(values, &[n], &Device::Cpu)?)
    }
}

impl<A: Stackable, B: Stackable> Stackable for (A, B) {
    type Batch = (A::Batch, B::Batch);

    fn stack(samples: Vec<(A, B)>) -> Result<Self::Batch, BoxError> {
        let (a, b): (Vec<A>, Vec<B>) = samples.into_iter().unzip();
        Ok((A::stack(a)?, B::stack(b)?))
    }
}

impl<A: Stackable, B: Stackable, C: Stackable> Stackable for (A, B, C) {
    type Batch = (A::Batch, B::Batch, C::Batch);

    fn stack(samples: Vec<(A, B, C)>) -> Result<Self::Batch, BoxError> {
        let n = samples.len();
        let (mut a, mut b, mut c) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        for (x, y, z) in samples {
            a.push(x);
            b.push(y);
            c.push(z);
        }
        Ok((A::stack(a)?, B::stack(b)?, C::stack(c)?))
    }
}

/// A host-side batch that becomes tensors with one copy per field.
pub trait IntoTensors: Send + 'static {
    type Tensors: Send + 'static;

    fn into_tensors(self, device: &Device) -> Result<Self::Tensors, TensorError>;
}

impl IntoTensors for ImageBatch {
    /// `(pixels f32 [n, c, h, w], labels int64 [n])`.
    type Tensors = (Tensor, Tensor);

    fn into_tensors(self, device: &Device) -> Result<(Tensor, Tensor), TensorError> {
        let shape = self.shape();
        let labels: Vec<i64> = self.labels.iter().map(|&l| l as i64).collect();
        let n = labels.len();
        Ok((Tensor::from_vec(self.pixels, &shape, device)?, Tensor::from_vec(labels, &[n], device)?))
    }
}

impl IntoTensors for TextBatch {
    /// `(inputs int64 [n, seq_len], targets int64 [n, seq_len])` — character ids, ready for an
    /// embedding and `cross_entropy`.
    type Tensors = (Tensor, Tensor);

    fn into_tensors(self, device: &Device) -> Result<(Tensor, Tensor), TensorError> {
        let shape = [self.len, self.seq_len];
        let ids = |v: Vec<u32>| v.into_iter().map(i64::from).collect::<Vec<i64>>();
        Ok((Tensor::from_vec(ids(self.inputs), &shape, device)?, Tensor::from_vec(ids(self.targets), &shape, device)?))
    }
}

/// Collate with `C`, then turn its host batch into CPU tensors: `Tensors(ImageCollate::new(shape))`
/// yields `(pixels, labels)` tensors, `Tensors(TextCollate)` yields `(inputs, targets)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tensors<C>(pub C);

impl<S, C> Collate<S> for Tensors<C>
where
    C: Collate<S>,
    C::Batch: IntoTensors,
{
    type Batch = <C::Batch as IntoTensors>::Tensors;

    fn collate(&self, samples: Vec<S>, rng: &mut Generator) -> Result<Self::Batch, BoxError> {
        Ok(self.0.collate(samples, rng)?.into_tensors(&Device::Cpu)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch_collate::{ImageCollate, TextCollate};
    use crate::examples::{ImageExample, TextExample};
    use ferrite_tensor::DType;

    #[test]
    fn tensors_and_labels_stack_like_default_collate() {
        let cpu = Device::Cpu;
        let sample = |v: f32, label: usize| (Tensor::from_vec(vec![v; 6], &[2, 3], &cpu).unwrap(), label);
        let (x, y) = StackCollate.collate(vec![sample(1.0, 3), sample(2.0, 7)], &mut Generator::new(0)).unwrap();
        assert_eq!(x.shape(), &[2, 2, 3]);
        assert_eq!(x.to_vec::<f32>().unwrap(), [[1.0f32; 6], [2.0; 6]].concat());
        assert_eq!((y.shape(), y.dtype()), (&[2usize][..], DType::I64));
        assert_eq!(y.to_vec::<i64>().unwrap(), [3, 7]);

        let (a, b, c) = StackCollate.collate(vec![(1.5f64, 2i32, 9u8), (2.5, 3, 8)], &mut Generator::new(0)).unwrap();
        assert_eq!((a.dtype(), b.dtype(), c.dtype()), (DType::F64, DType::I32, DType::U8));
        assert_eq!(b.to_vec::<i32>().unwrap(), [2, 3]);
    }

    #[test]
    fn mismatched_or_empty_samples_are_errors() {
        let cpu = Device::Cpu;
        let a = Tensor::zeros(&[3], DType::F32, &cpu).unwrap();
        let b = Tensor::zeros(&[4], DType::F32, &cpu).unwrap();
        let e = StackCollate.collate(vec![a, b], &mut Generator::new(0)).unwrap_err();
        assert!(e.to_string().contains("equal size"), "{e}");
        assert!(StackCollate.collate(Vec::<Tensor>::new(), &mut Generator::new(0)).is_err());
    }

    #[test]
    fn fast_and_general_stacking_agree() {
        let cpu = Device::Cpu;
        let rows: Vec<Tensor> =
            (0..5).map(|i| Tensor::from_vec(vec![i as i64, 10 + i as i64], &[2], &cpu).unwrap()).collect();
        let fast = concat_plain_cpu(&rows).unwrap().expect("plain samples take the fast path");
        let refs: Vec<&Tensor> = rows.iter().collect();
        let general = Tensor::stack(&refs, 0).unwrap();
        assert_eq!(fast.shape(), general.shape());
        assert_eq!(fast.to_vec::<i64>().unwrap(), general.to_vec::<i64>().unwrap());
        // A sample with autograd history goes through Tensor::stack, which records the graph.
        let w = Tensor::from_vec(vec![1.0f32, 2.0], &[2], &cpu).unwrap().requires_grad_(true).unwrap();
        assert!(concat_plain_cpu(&[w.clone(), w.clone()]).unwrap().is_none());
        let stacked = StackCollate.collate(vec![w.clone(), w], &mut Generator::new(0)).unwrap();
        assert!(stacked.requires_grad());
    }

    #[test]
    fn host_batches_become_tensors_with_their_shapes() {
        let mut g = Generator::new(0);
        let img = |v: f32, label| ImageExample { pixels: vec![v; 4], label };
        let (x, y) = Tensors(ImageCollate::new([1, 2, 2])).collate(vec![img(0.5, 1), img(-1.0, 9)], &mut g).unwrap();
        assert_eq!((x.shape(), x.dtype()), (&[2usize, 1, 2, 2][..], DType::F32));
        assert_eq!(x.to_vec::<f32>().unwrap(), [0.5, 0.5, 0.5, 0.5, -1.0, -1.0, -1.0, -1.0]);
        assert_eq!(y.to_vec::<i64>().unwrap(), [1, 9]);

        let t = |a: u32| TextExample { input: vec![a, a + 1, a + 2], target: vec![a + 1, a + 2, a + 3] };
        let (i, o) = Tensors(TextCollate).collate(vec![t(0), t(10)], &mut g).unwrap();
        assert_eq!((i.shape(), i.dtype()), (&[2usize, 3][..], DType::I64));
        assert_eq!(o.to_vec::<i64>().unwrap(), [1, 2, 3, 11, 12, 13]);
    }
}
