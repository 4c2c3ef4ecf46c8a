//! Turning a list of samples into one batch.
//!
//! Collation runs in the worker that loaded the samples (as in PyTorch), so the training thread
//! receives a finished batch. It receives the batch's own generator (stream `Batch(b)` of the
//! epoch) for batch-level augmentation such as mixup, which is therefore reproducible for any
//! number of workers too.

use std::marker::PhantomData;

use ferrite_tensor::Generator;

use crate::error::BoxError;

/// Combines the samples of one batch.
pub trait Collate<S>: Send + Sync + 'static {
    type Batch: Send + 'static;

    fn collate(&self, samples: Vec<S>, rng: &mut Generator) -> Result<Self::Batch, BoxError>;
}

/// Keeps the samples as a `Vec` (the loader's default).
#[derive(Debug, Clone, Copy, Default)]
pub struct VecCollate;

impl<S: Send + 'static> Collate<S> for VecCollate {
    type Batch = Vec<S>;

    fn collate(&self, samples: Vec<S>, _rng: &mut Generator) -> Result<Vec<S>, BoxError> {
        Ok(samples)
    }
}

/// A collate function from a closure; see [`collate_fn`].
pub struct FnCollate<F, S, B> {
    f: F,
    _types: PhantomData<fn(Vec<S>) -> B>,
}

/// Use a closure `|samples, rng| -> Result<Batch, BoxError>` as the collate step.
pub fn collate_fn<S, B, F>(f: F) -> FnCollate<F, S, B>
where
    F: Fn(Vec<S>, &mut Generator) -> Result<B, BoxError> + Send + Sync + 'static,
{
    FnCollate { f, _types: PhantomData }
}

impl<F, S, B> Collate<S> for FnCollate<F, S, B>
where
    F: Fn(Vec<S>, &mut Generator) -> Result<B, BoxError> + Send + Sync + 'static,
    S: 'static,
    B: Send + 'static,
{
    type Batch = B;

    fn collate(&self, samples: Vec<S>, rng: &mut Generator) -> Result<B, BoxError> {
        (self.f)(samples, rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closure_collate() {
        let c = collate_fn(|s: Vec<u32>, _rng: &mut Generator| Ok(s.iter().sum::<u32>()));
        assert_eq!(c.collate(vec![1, 2, 3], &mut Generator::new(0)).unwrap(), 6);
        assert_eq!(VecCollate.collate(vec![1, 2], &mut Generator::new(0)).unwrap(), vec![1, 2]);
    }
}
