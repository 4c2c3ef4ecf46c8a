//! The one builder both loaders are configured with.
//!
//! A map-style [`DataLoader`](crate::DataLoader) and an [`IterableLoader`](crate::IterableLoader)
//! take the same options — batch size, `drop_last`, the generator, workers, prefetch, timeout, the
//! collate function and a staging step — and differ only in what they read and how they sample
//! it. So there is one [`LoaderBuilder`] holding the shared options with their setters and
//! checks, parametrised by a [`LoaderSource`]: [`MapStyleSource`](crate::loader::MapStyleSource)
//! adds shuffling and samplers, [`IterableSource`](crate::iterable_loader::IterableSource) nothing.
//! [`DataLoaderBuilder`](crate::DataLoaderBuilder) and
//! [`IterableLoaderBuilder`](crate::IterableLoaderBuilder) name the two.

use std::sync::Arc;
use std::time::Duration;

use ferrite_memory::Device;
use ferrite_tensor::Generator;
use ferrite_tensor::random::with_default_generator;

use crate::collate::Collate;
use crate::error::{BoxError, DataError};
use crate::seeding::MAX_WORKERS;
use crate::staging::{Stager, ToDevice, stager_to};

/// What a loader reads: a map-style dataset with its sampling options, or an iterable dataset.
pub trait LoaderSource {
    /// One item of the dataset, as the collate function receives it.
    type Sample;
}

/// Options of a loader; defaults follow PyTorch (batch size 1, no workers, no timeout, samples
/// kept as a `Vec`). Start one with [`DataLoader::builder`](crate::DataLoader::builder) or
/// [`IterableLoader::builder`](crate::IterableLoader::builder).
pub struct LoaderBuilder<S: LoaderSource, C: Collate<S::Sample>> {
    pub(crate) source: S,
    pub(crate) collate: C,
    pub(crate) stage: Option<Stager<C::Batch>>,
    pub(crate) batch_size: usize,
    pub(crate) drop_last: bool,
    pub(crate) generator: Option<Generator>,
    pub(crate) num_workers: usize,
    /// How many batches may be prepared ahead; each loader reads it its own way (see its
    /// `prefetch` setter) and has its own default.
    pub(crate) prefetch: Option<usize>,
    pub(crate) timeout: Option<Duration>,
    /// A setting that cannot work, reported by `build`.
    pub(crate) config_error: Option<String>,
}

impl<S: LoaderSource, C: Collate<S::Sample>> LoaderBuilder<S, C> {
    pub(crate) fn new(source: S, collate: C) -> Self {
        LoaderBuilder {
            source,
            collate,
            stage: None,
            batch_size: 1,
            drop_last: false,
            generator: None,
            num_workers: 0,
            prefetch: None,
            timeout: None,
            config_error: None,
        }
    }

    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// Drop a batch smaller than `batch_size`: the last of the epoch for a map-style dataset,
    /// the last of each worker's stream for an iterable one (as PyTorch does).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Seed the loader's generator (shorthand for `generator(Generator::new(seed))`).
    pub fn seed(mut self, seed: u64) -> Self {
        self.generator = Some(Generator::new(seed));
        self
    }

    /// The generator every epoch's base seed is drawn from. Without one, the loader's generator
    /// is seeded with one draw from the process-wide default generator when it is built (so
    /// `ferrite_tensor::manual_seed` makes it reproducible).
    pub fn generator(mut self, generator: Generator) -> Self {
        self.generator = Some(generator);
        self
    }

    /// Number of background worker threads; 0 loads batches on the iterating thread.
    pub fn num_workers(mut self, num_workers: usize) -> Self {
        self.num_workers = num_workers;
        self
    }

    /// Fail with [`DataError::Timeout`] when the next batch takes longer than this.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Collate samples with `collate` (must be set before `stage_to`/`stage_with`).
    pub fn collate<C2: Collate<S::Sample>>(self, collate: C2) -> LoaderBuilder<S, C2> {
        let config_error = self.config_error.or_else(|| {
            self.stage.is_some().then(|| {
                "call `collate(..)` before `stage_to(..)`/`stage_with(..)`: staging applies to the collated batch type"
                    .to_string()
            })
        });
        LoaderBuilder {
            source: self.source,
            collate,
            stage: None,
            batch_size: self.batch_size,
            drop_last: self.drop_last,
            generator: self.generator,
            num_workers: self.num_workers,
            prefetch: self.prefetch,
            timeout: self.timeout,
            config_error,
        }
    }

    /// Move every batch to `device` in the workers, right after collation (the `pin_memory` +
    /// `non_blocking` pattern; see [`staging`](crate::staging)).
    pub fn stage_to(mut self, device: Device) -> Self
    where
        C::Batch: ToDevice,
    {
        self.stage = Some(stager_to(device));
        self
    }

    /// Run `f` on every collated batch in the workers (a custom staging step).
    pub fn stage_with(mut self, f: impl Fn(C::Batch) -> Result<C::Batch, BoxError> + Send + Sync + 'static) -> Self {
        self.stage = Some(Arc::new(f));
        self
    }

    /// The checks every loader makes when it is built: a setting recorded as impossible, and
    /// the number of workers the seeding scheme has streams for.
    pub(crate) fn check_shared_options(&mut self) -> Result<(), DataError> {
        if let Some(e) = self.config_error.take() {
            return Err(DataError::InvalidConfig(e));
        }
        if self.num_workers as u64 >= MAX_WORKERS {
            return Err(DataError::InvalidConfig(format!(
                "num_workers = {} exceeds the limit of {}",
                self.num_workers,
                MAX_WORKERS - 1
            )));
        }
        Ok(())
    }
}

/// A loader's generator: the one given, or one seeded from the default generator (drawn only
/// once the loader's options have been checked).
pub(crate) fn generator_or_default(given: Option<Generator>) -> Generator {
    given.unwrap_or_else(|| Generator::new(with_default_generator(|g| g.next_u64())))
}
