//! Which indices an epoch visits, and in what order.
//!
//! A sampler plans a whole epoch up front from a generator the loader hands it (the epoch's
//! `Sampler` stream), so the order is a pure function of the loader seed and the epoch number, and
//! the loader knows the number of batches before the first one is loaded.

use ferrite_tensor::Generator;

use crate::error::DataError;

/// Produces the dataset indices of one epoch.
pub trait Sampler: Send {
    /// The indices to visit this epoch, in order. `rng` is this epoch's sampler stream.
    fn epoch_indices(&mut self, dataset_len: usize, rng: &mut Generator) -> Vec<usize>;

    /// How many indices [`epoch_indices`](Self::epoch_indices) returns for a dataset of this size.
    fn num_indices(&self, dataset_len: usize) -> usize;
}

/// Produces the batches of one epoch directly (for bucketing by length and similar schemes).
pub trait BatchSampler: Send {
    fn epoch_batches(&mut self, dataset_len: usize, rng: &mut Generator) -> Vec<Vec<usize>>;

    fn num_batches(&self, dataset_len: usize) -> usize;
}

/// `0, 1, 2, ...` — the default without shuffling.
#[derive(Debug, Clone, Copy, Default)]
pub struct SequentialSampler;

impl Sampler for SequentialSampler {
    fn epoch_indices(&mut self, dataset_len: usize, _rng: &mut Generator) -> Vec<usize> {
        (0..dataset_len).collect()
    }

    fn num_indices(&self, dataset_len: usize) -> usize {
        dataset_len
    }
}

/// A fresh random order every epoch (the default with `shuffle(true)`), or `num_samples` draws
/// with replacement.
#[derive(Debug, Clone, Copy, Default)]
pub struct RandomSampler {
    replacement: bool,
    num_samples: Option<usize>,
}

impl RandomSampler {
    /// A permutation of the whole dataset each epoch.
    pub fn new() -> RandomSampler {
        RandomSampler::default()
    }

    /// `num_samples` independent uniform draws per epoch (indices may repeat).
    pub fn with_replacement(num_samples: usize) -> RandomSampler {
        RandomSampler { replacement: true, num_samples: Some(num_samples) }
    }
}

impl Sampler for RandomSampler {
    fn epoch_indices(&mut self, dataset_len: usize, rng: &mut Generator) -> Vec<usize> {
        if self.replacement {
            let n = self.num_indices(dataset_len);
            if dataset_len == 0 {
                return Vec::new();
            }
            (0..n).map(|_| rng.below(dataset_len as u64) as usize).collect()
        } else {
            rng.permutation(dataset_len)
        }
    }

    fn num_indices(&self, dataset_len: usize) -> usize {
        match (self.replacement, dataset_len) {
            // Nothing to draw from: an empty epoch rather than an impossible one.
            (true, 0) => 0,
            (true, _) => self.num_samples.unwrap_or(dataset_len),
            (false, _) => dataset_len,
        }
    }
}

/// A random order over a fixed set of indices (PyTorch's `SubsetRandomSampler`), e.g. a
/// train/validation split of one dataset.
#[derive(Debug, Clone)]
pub struct SubsetRandomSampler {
    indices: Vec<usize>,
}

impl SubsetRandomSampler {
    pub fn new(indices: Vec<usize>) -> SubsetRandomSampler {
        SubsetRandomSampler { indices }
    }
}

impl Sampler for SubsetRandomSampler {
    fn epoch_indices(&mut self, _dataset_len: usize, rng: &mut Generator) -> Vec<usize> {
        let mut v = self.indices.clone();
        rng.shuffle(&mut v);
        v
    }

    fn num_indices(&self, _dataset_len: usize) -> usize {
        self.indices.len()
    }
}

/// Draws index `i` with probability proportional to `weights[i]` (PyTorch's
/// `WeightedRandomSampler`), e.g. to rebalance classes.
#[derive(Debug, Clone)]
pub struct WeightedRandomSampler {
    cumulative: Vec<f64>,
    weights: Vec<f64>,
    num_samples: usize,
    replacement: bool,
}

impl WeightedRandomSampler {
    /// Weights must be finite and non-negative with a positive sum; without replacement,
    /// `num_samples` cannot exceed the number of positive weights.
    pub fn new(weights: Vec<f64>, num_samples: usize, replacement: bool) -> Result<WeightedRandomSampler, DataError> {
        if let Some((i, w)) = weights.iter().enumerate().find(|(_, w)| !w.is_finite() || **w < 0.0) {
            return Err(DataError::InvalidConfig(format!(
                "sampler weight {i} is {w}; weights must be finite and >= 0"
            )));
        }
        let total: f64 = weights.iter().sum();
        if total <= 0.0 {
            return Err(DataError::InvalidConfig("sampler weights sum to 0; at least one must be positive".into()));
        }
        let positive = weights.iter().filter(|w| **w > 0.0).count();
        if !replacement && num_samples > positive {
            return Err(DataError::InvalidConfig(format!(
                "cannot draw {num_samples} samples without replacement from {positive} indices with positive weight"
            )));
        }
        let mut acc = 0.0;
        let cumulative = weights
            .iter()
            .map(|w| {
                acc += w;
                acc
            })
            .collect();
        Ok(WeightedRandomSampler { cumulative, weights, num_samples, replacement })
    }
}

impl Sampler for WeightedRandomSampler {
    fn epoch_indices(&mut self, _dataset_len: usize, rng: &mut Generator) -> Vec<usize> {
        if self.replacement {
            let total = *self.cumulative.last().unwrap_or(&0.0);
            (0..self.num_samples)
                .map(|_| {
                    let u = rng.uniform_f64() * total;
                    // First index whose cumulative weight exceeds u (never a zero-weight index).
                    self.cumulative.partition_point(|&c| c <= u).min(self.cumulative.len() - 1)
                })
                .collect()
        } else {
            // Efraimidis–Spirakis: key_i = -ln(u_i) / w_i, take the smallest keys.
            let mut keyed: Vec<(f64, usize)> = self
                .weights
                .iter()
                .enumerate()
                .filter(|(_, w)| **w > 0.0)
                .map(|(i, w)| (-(1.0 - rng.uniform_f64()).ln() / w, i))
                .collect();
            keyed.sort_by(|a, b| a.0.total_cmp(&b.0));
            keyed.into_iter().take(self.num_samples).map(|(_, i)| i).collect()
        }
    }

    fn num_indices(&self, _dataset_len: usize) -> usize {
        self.num_samples
    }
}

/// Group a sampler's indices into batches of `batch_size` (the loader's default batch sampler).
pub struct Batching {
    sampler: Box<dyn Sampler>,
    batch_size: usize,
    drop_last: bool,
}

impl Batching {
    pub fn new(sampler: Box<dyn Sampler>, batch_size: usize, drop_last: bool) -> Result<Batching, DataError> {
        if batch_size == 0 {
            return Err(DataError::InvalidConfig("batch_size must be at least 1".into()));
        }
        Ok(Batching { sampler, batch_size, drop_last })
    }
}

impl BatchSampler for Batching {
    fn epoch_batches(&mut self, dataset_len: usize, rng: &mut Generator) -> Vec<Vec<usize>> {
        let indices = self.sampler.epoch_indices(dataset_len, rng);
        let mut batches: Vec<Vec<usize>> = indices.chunks(self.batch_size).map(<[usize]>::to_vec).collect();
        if self.drop_last && batches.last().is_some_and(|b| b.len() < self.batch_size) {
            batches.pop();
        }
        batches
    }

    fn num_batches(&self, dataset_len: usize) -> usize {
        let n = self.sampler.num_indices(dataset_len);
        if self.drop_last { n / self.batch_size } else { n.div_ceil(self.batch_size) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn weighted_never_draws_zero_weight_and_follows_weights() {
        let mut s = WeightedRandomSampler::new(vec![0.0, 1.0, 3.0, 0.0], 4000, true).unwrap();
        let mut g = Generator::new(1);
        let idx = s.epoch_indices(4, &mut g);
        assert!(idx.iter().all(|&i| i == 1 || i == 2));
        let twos = idx.iter().filter(|&&i| i == 2).count() as f64 / 4000.0;
        assert!((twos - 0.75).abs() < 0.05, "{twos}");
        let mut s = WeightedRandomSampler::new(vec![1.0, 0.0, 2.0, 5.0], 3, false).unwrap();
        let mut idx = s.epoch_indices(4, &mut g);
        idx.sort_unstable();
        assert_eq!(idx, [0, 2, 3]);
    }

    #[test]
    fn bad_weights_are_errors() {
        assert!(WeightedRandomSampler::new(vec![f64::NAN], 1, true).is_err());
        assert!(WeightedRandomSampler::new(vec![-1.0, 2.0], 1, true).is_err());
        assert!(WeightedRandomSampler::new(vec![0.0, 0.0], 1, true).is_err());
        assert!(WeightedRandomSampler::new(vec![1.0, 0.0], 2, false).is_err());
        assert!(Batching::new(Box::new(SequentialSampler), 0, false).is_err());
    }

    #[test]
    fn subset_random_is_a_permutation_of_the_subset() {
        let mut s = SubsetRandomSampler::new(vec![5, 7, 9]);
        let mut v = s.epoch_indices(100, &mut Generator::new(2));
        v.sort_unstable();
        assert_eq!(v, [5, 7, 9]);
    }

    proptest! {
        #[test]
        fn batching_covers_every_index_once(n in 0usize..200, bs in 1usize..17, drop_last: bool, seed: u64) {
            let mut b = Batching::new(Box::new(RandomSampler::new()), bs, drop_last).unwrap();
            let batches = b.epoch_batches(n, &mut Generator::new(seed));
            prop_assert_eq!(batches.len(), b.num_batches(n));
            let mut all: Vec<usize> = batches.iter().flatten().copied().collect();
            prop_assert!(batches.iter().all(|x| x.len() == bs || (!drop_last && x.len() < bs)));
            all.sort_unstable();
            let expected = if drop_last { n - n % bs } else { n };
            prop_assert_eq!(all.len(), expected);
            if !drop_last { prop_assert_eq!(all, (0..n).collect::<Vec<_>>()); }
        }

        #[test]
        fn with_replacement_stays_in_range(n in 1usize..50, k in 0usize..100, seed: u64) {
            let mut s = RandomSampler::with_replacement(k);
            let v = s.epoch_indices(n, &mut Generator::new(seed));
            prop_assert_eq!(v.len(), k);
            prop_assert!(v.iter().all(|&i| i < n));
        }
    }
}
