//! Each rank of a multi-process run reads its own share of the dataset (PyTorch's
//! `DistributedSampler`).
//!
//! Every rank builds the same epoch order from `(seed, epoch)`, not from the loader's generator, so
//! the shares are disjoint even when each rank seeds its DataLoader differently (which it should:
//! augmentation randomness then differs per rank). The order is padded by repeating its first
//! indices until it divides evenly (`drop_last = false`, PyTorch's default) or cut to a multiple of
//! the number of ranks (`drop_last = true`); rank `r` takes every `num_replicas`-th index starting
//! at `r`. Call [`set_epoch`](DistributedSampler::set_epoch) at the start of every epoch, as in
//! PyTorch, or every epoch repeats the same order; the sampler is `Clone` and its clones share
//! the epoch, so keep one beside the loader that owns the other.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ferrite_tensor::Generator;

use crate::error::DataError;
use crate::sampler::Sampler;

/// One rank's disjoint, equally sized share of a dataset, reshuffled per epoch.
#[derive(Debug, Clone)]
pub struct DistributedSampler {
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    epoch: Arc<AtomicU64>,
}

impl DistributedSampler {
    /// Rank `rank` of `num_replicas`, shuffled with seed 0 and padded (PyTorch's defaults).
    pub fn new(num_replicas: usize, rank: usize) -> Result<DistributedSampler, DataError> {
        if num_replicas == 0 {
            return Err(DataError::InvalidConfig(
                "DistributedSampler needs num_replicas >= 1 (the number of ranks, e.g. the MPI world size)".into(),
            ));
        }
        if rank >= num_replicas {
            return Err(DataError::InvalidConfig(format!(
                "DistributedSampler rank {rank} is out of range: ranks are 0..={} for num_replicas = {num_replicas}",
                num_replicas - 1
            )));
        }
        Ok(DistributedSampler { num_replicas, rank, shuffle: true, seed: 0, drop_last: false, epoch: Arc::default() })
    }

    /// Shuffle each epoch (default `true`); `false` keeps dataset order, interleaved over ranks.
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// The seed every rank must share (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Drop the tail that does not divide evenly instead of padding with repeated samples.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// The epoch whose order the next `epoch_indices` uses; shared by every clone.
    pub fn set_epoch(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Relaxed);
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn num_replicas(&self) -> usize {
        self.num_replicas
    }

    /// How many samples each rank gets for a dataset of `dataset_len`.
    pub fn num_samples(&self, dataset_len: usize) -> usize {
        if self.drop_last { dataset_len / self.num_replicas } else { dataset_len.div_ceil(self.num_replicas) }
    }
}

impl Sampler for DistributedSampler {
    fn epoch_indices(&mut self, dataset_len: usize, _rng: &mut Generator) -> Vec<usize> {
        let mut order: Vec<usize> = if self.shuffle {
            // Same order on every rank: a generator of its own, seeded from (seed, epoch).
            let mut g = Generator::new(self.seed.wrapping_add(self.epoch()));
            g.permutation(dataset_len)
        } else {
            (0..dataset_len).collect()
        };
        let per_rank = self.num_samples(dataset_len);
        let total = per_rank * self.num_replicas;
        if order.len() > total {
            order.truncate(total);
        } else if !order.is_empty() {
            // Pad by repeating the order from its start (several times if it is shorter than the pad).
            let mut i = 0;
            while order.len() < total {
                order.push(order[i]);
                i += 1;
            }
        }
        order.into_iter().skip(self.rank).step_by(self.num_replicas).collect()
    }

    fn num_indices(&self, dataset_len: usize) -> usize {
        self.num_samples(dataset_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(n: usize, ranks: usize, drop_last: bool, epoch: u64) -> Vec<Vec<usize>> {
        (0..ranks)
            .map(|r| {
                let mut s = DistributedSampler::new(ranks, r).unwrap().drop_last(drop_last).seed(7);
                s.set_epoch(epoch);
                // A different loader generator per rank must not change the shares.
                s.epoch_indices(n, &mut Generator::new(r as u64 * 1000 + 3))
            })
            .collect()
    }

    #[test]
    fn shares_are_disjoint_equal_and_cover_the_dataset() {
        let s = shares(10, 2, false, 0);
        assert_eq!(s[0].len(), 5);
        assert_eq!(s[1].len(), 5);
        let mut all: Vec<usize> = s.concat();
        all.sort();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn padding_repeats_the_first_indices_like_pytorch() {
        // 10 samples over 3 ranks: 4 each, 2 padded from the start of the order.
        let s = shares(10, 3, false, 0);
        assert!(s.iter().all(|x| x.len() == 4));
        let mut all: Vec<usize> = s.concat();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 10, "every sample is visited");
        let unshuffled: Vec<Vec<usize>> = (0..3)
            .map(|r| DistributedSampler::new(3, r).unwrap().shuffle(false).epoch_indices(10, &mut Generator::new(0)))
            .collect();
        assert_eq!(unshuffled, vec![vec![0, 3, 6, 9], vec![1, 4, 7, 0], vec![2, 5, 8, 1]]);
    }

    #[test]
    fn drop_last_cuts_the_tail() {
        let s = shares(10, 3, true, 0);
        assert!(s.iter().all(|x| x.len() == 3));
        let mut all: Vec<usize> = s.concat();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 9, "disjoint");
    }

    #[test]
    fn set_epoch_reshuffles_and_clones_share_it() {
        let a = shares(100, 2, false, 0);
        let b = shares(100, 2, false, 1);
        assert_ne!(a[0], b[0]);
        let s = DistributedSampler::new(2, 0).unwrap();
        let mut inside_loader = s.clone();
        s.set_epoch(1);
        assert_eq!(inside_loader.epoch(), 1);
        // seed 0 here, seed 7 in `shares`: compare against a seed-0 sampler at epoch 1.
        let mut fresh = DistributedSampler::new(2, 0).unwrap();
        fresh.set_epoch(1);
        assert_eq!(
            inside_loader.epoch_indices(100, &mut Generator::new(9)),
            fresh.epoch_indices(100, &mut Generator::new(1))
        );
    }

    #[test]
    fn composes_with_loader_workers_and_per_rank_loader_seeds() {
        use crate::{DataLoader, InMemory};
        let load = |rank: usize, epoch: u64| -> Vec<u32> {
            let sampler = DistributedSampler::new(2, rank).unwrap().seed(3);
            let mut loader = DataLoader::builder(InMemory::new((0..37u32).collect()))
                .batch_size(4)
                .sampler(sampler.clone())
                .num_workers(2)
                .seed(100 + rank as u64)
                .build()
                .unwrap();
            sampler.set_epoch(epoch);
            loader.epoch().flat_map(|b| b.unwrap()).collect()
        };
        for epoch in 0..2 {
            let (a, b) = (load(0, epoch), load(1, epoch));
            assert_eq!((a.len(), b.len()), (19, 19));
            let mut all: Vec<u32> = a.iter().chain(&b).copied().collect();
            all.sort_unstable();
            all.dedup();
            assert_eq!(all.len(), 37, "37 samples, one padded: every sample seen");
        }
        assert_ne!(load(0, 0), load(0, 1), "set_epoch reshuffles through the loader");
    }

    #[test]
    fn bad_rank_is_a_typed_error() {
        assert!(DistributedSampler::new(2, 2).is_err());
        assert!(DistributedSampler::new(0, 0).is_err());
    }
}
