//! Where every random number of an epoch comes from.
//!
//! PyTorch's loader seeds each worker with `base_seed + worker_id`. That makes workers differ, but
//! the augmentation a sample receives then depends on *which worker happened to load it*, which
//! depends on `num_workers`: change the worker count and the epoch changes. ferrite keys the
//! randomness of a sample to the sample's *position in the epoch* instead, so the worker that
//! loads it is irrelevant, and keeps PyTorch's per-worker generator for what is genuinely
//! per-worker (iterable datasets, which shard their stream by worker).
//!
//! # The exact derivation
//!
//! 1. **One base seed per epoch.** Starting an epoch draws `base_seed = loader_generator.next_u64()`
//!    — one 64-bit draw, even with `num_workers == 0` (as PyTorch does). Nothing else ever draws
//!    from the loader's generator, so epoch `e` is a function of the loader seed and `e` alone.
//! 2. **One keystream per epoch.** `Generator::new(base_seed)` is a ChaCha8 keystream of
//!    2^68 32-bit words. It is cut into 2^32 disjoint *streams* of [`STREAM_WORDS`] = 2^36 words;
//!    stream `s` is that generator advanced to word `s * 2^36` (`Generator::at_offset`).
//! 3. **Stream numbers** ([`Stream`]):
//!    - `Sample(k)` = stream `k`, for the `k`-th sample of the epoch in sampler order
//!      (`k < 2^31`). This is the generator `Dataset::get` receives. It does not depend on the
//!      worker, the number of workers or the prefetch depth, so 0, 1, 2 or 4 workers produce
//!      bit-identical batches. It is keyed by position, not by dataset index, so a sample drawn
//!      twice in one epoch (sampling with replacement) gets two different augmentations.
//!    - `Batch(b)` = stream `2^31 + b`, for batch `b` of the epoch (`b < 2^30`); the collate
//!      function receives it (batch-level augmentation such as mixup).
//!    - `Worker(w)` = stream `2^31 + 2^30 + w` (`w < 2^29`): worker `w`'s own generator, the
//!      analogue of PyTorch's per-worker seed, used by iterable datasets.
//!    - `Sampler` = stream `2^32 - 1`: the sampler's shuffle for this epoch.
//!
//! Different streams are disjoint stretches of one keystream, so two samples, two workers, or a
//! worker and a sample never see the same random words — by construction, not by luck of hashing.
//! The only way to break that is to draw more than 2^36 words (256 GiB of randomness) from one
//! stream; the loader checks after every call and reports [`DataError::RandomStreamOverrun`]
//! instead of silently overlapping. Successive epochs use different base seeds and so different
//! keys (they coincide only if two 64-bit draws collide).

use std::fmt;

use ferrite_tensor::Generator;

use crate::error::DataError;

/// Length of every stream, in 32-bit words (2^36 words = 256 GiB of random bits).
pub const STREAM_WORDS: u128 = 1 << 36;

/// Largest number of samples in one epoch (sample streams available).
pub const MAX_SAMPLES_PER_EPOCH: u64 = 1 << 31;
/// Largest number of batches in one epoch (batch streams available).
pub const MAX_BATCHES_PER_EPOCH: u64 = 1 << 30;
/// Largest number of workers (worker streams available).
pub const MAX_WORKERS: u64 = 1 << 29;

const BATCH_BASE: u64 = 1 << 31;
const WORKER_BASE: u64 = (1 << 31) + (1 << 30);
const SAMPLER_SLOT: u64 = (1 << 32) - 1;

/// A named stretch of an epoch's keystream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    /// The `k`-th sample of the epoch, in sampler order.
    Sample(u64),
    /// The `b`-th batch of the epoch.
    Batch(u64),
    /// Background worker `w` (or the main thread as worker 0 when `num_workers == 0`).
    Worker(u64),
    /// The sampler's shuffle.
    Sampler,
}

impl Stream {
    /// The stream's slot number in the epoch keystream (see the module docs).
    pub fn slot(self) -> u64 {
        match self {
            Stream::Sample(k) => {
                debug_assert!(k < MAX_SAMPLES_PER_EPOCH);
                k
            }
            Stream::Batch(b) => {
                debug_assert!(b < MAX_BATCHES_PER_EPOCH);
                BATCH_BASE + b
            }
            Stream::Worker(w) => {
                debug_assert!(w < MAX_WORKERS);
                WORKER_BASE + w
            }
            Stream::Sampler => SAMPLER_SLOT,
        }
    }
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stream::Sample(k) => write!(f, "the random stream of sample {k} of the epoch"),
            Stream::Batch(b) => write!(f, "the random stream of batch {b}"),
            Stream::Worker(w) => write!(f, "the random stream of worker {w}"),
            Stream::Sampler => write!(f, "the sampler's random stream"),
        }
    }
}

/// The randomness of one epoch: its base seed and the keystream derived from it.
#[derive(Clone, Debug)]
pub struct EpochSeed {
    base_seed: u64,
    key: Generator,
}

impl EpochSeed {
    /// The epoch whose base seed is `base_seed`.
    pub fn new(base_seed: u64) -> EpochSeed {
        EpochSeed { base_seed, key: Generator::new(base_seed) }
    }

    /// Draw the next epoch's base seed from the loader's generator (exactly one `next_u64`).
    pub fn draw(loader_generator: &mut Generator) -> EpochSeed {
        EpochSeed::new(loader_generator.next_u64())
    }

    pub fn base_seed(&self) -> u64 {
        self.base_seed
    }

    /// A fresh generator positioned at the start of `stream`.
    pub fn generator(&self, stream: Stream) -> Generator {
        self.key.at_offset(u128::from(stream.slot()) * STREAM_WORDS)
    }

    /// Check that a generator handed out for `stream` stayed inside it. A generator the user
    /// re-seeded is theirs and is not checked.
    pub fn check_within(&self, stream: Stream, rng: &Generator) -> Result<(), DataError> {
        if rng.initial_seed() != self.base_seed {
            return Ok(());
        }
        let start = u128::from(stream.slot()) * STREAM_WORDS;
        let pos = rng.state().word_pos;
        let drawn = pos.wrapping_sub(start);
        if pos >= start && drawn > STREAM_WORDS {
            return Err(DataError::RandomStreamOverrun { stream: stream.to_string(), drawn, limit: STREAM_WORDS });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn slots_are_disjoint_between_kinds() {
        let last_sample = Stream::Sample(MAX_SAMPLES_PER_EPOCH - 1).slot();
        let first_batch = Stream::Batch(0).slot();
        let last_batch = Stream::Batch(MAX_BATCHES_PER_EPOCH - 1).slot();
        let first_worker = Stream::Worker(0).slot();
        let last_worker = Stream::Worker(MAX_WORKERS - 1).slot();
        assert!(last_sample < first_batch);
        assert!(last_batch < first_worker);
        assert!(last_worker < Stream::Sampler.slot());
        // The whole layout fits in ChaCha8's 2^68-word keystream.
        assert!(u128::from(Stream::Sampler.slot() + 1) * STREAM_WORDS <= 1u128 << 68);
    }

    #[test]
    fn stream_start_matches_sequential_position() {
        let e = EpochSeed::new(5);
        let mut direct = e.generator(Stream::Sample(3));
        let mut walked = Generator::new(5);
        walked.skip(3 * STREAM_WORDS);
        assert_eq!(direct.next_u64(), walked.next_u64());
    }

    #[test]
    fn overrun_is_detected_and_in_bounds_is_not() {
        let e = EpochSeed::new(9);
        let mut g = e.generator(Stream::Sample(2));
        for _ in 0..100 {
            g.next_u64();
        }
        assert!(e.check_within(Stream::Sample(2), &g).is_ok());
        g.skip(STREAM_WORDS);
        let err = e.check_within(Stream::Sample(2), &g).unwrap_err();
        assert!(matches!(err, DataError::RandomStreamOverrun { .. }), "{err}");
        // A generator the user re-seeded is not policed.
        g.manual_seed(1);
        assert!(e.check_within(Stream::Sample(2), &g).is_ok());
    }

    proptest! {
        #[test]
        fn distinct_streams_give_distinct_draws(seed in any::<u64>(), a in 0u64..1_000_000, b in 0u64..1_000_000, w in 0u64..64) {
            prop_assume!(a != b);
            let e = EpochSeed::new(seed);
            let xs: Vec<u64> = { let mut g = e.generator(Stream::Sample(a)); (0..4).map(|_| g.next_u64()).collect() };
            let ys: Vec<u64> = { let mut g = e.generator(Stream::Sample(b)); (0..4).map(|_| g.next_u64()).collect() };
            let zs: Vec<u64> = { let mut g = e.generator(Stream::Worker(w)); (0..4).map(|_| g.next_u64()).collect() };
            prop_assert_ne!(&xs, &ys);
            prop_assert_ne!(&xs, &zs);
        }
    }
}
