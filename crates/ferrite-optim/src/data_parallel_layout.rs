//! How data parallelism lays the trainable parameters out over ranks — ZeRO's flat partition of
//! the optimizer state and DDP's gradient buckets — as pure functions of the parameter sizes.
//!
//! Why here, in the optimizer crate: the sharded training (`ferrite-parallel`) and the memory
//! planner (`ferrite-plan`) sit side by side above it, and the planner must not depend on the
//! training crate; both read the layout from this one place, so the planner's per-rank peak is
//! the layout the ranks really allocate, never a copy that could drift.
//!
//! ZeRO's partition: the parameters laid end to end in one
//! flat index space (registration order), padded to a multiple of the world size, and cut into
//! `world_size` equal ranges; rank `r` owns the values in `[r·P, (r+1)·P)`.
//!
//! Why this layout (DeepSpeed's flat partitioning) and not whole parameters assigned greedily by
//! size (PyTorch's `ZeroRedundancyOptimizer`): every rank holds ⌈N/W⌉ values of optimizer state
//! whatever the parameter sizes, so the per-rank memory is the planner's ZeRO row (total / W) even
//! for a model dominated by one large embedding, where a greedy assignment leaves one rank with
//! the whole embedding; a parameter larger than a partition is simply cut across ranks; and the
//! collectives are MPI's equal-block all-gather and reduce-scatter. The price: a parameter cut
//! between ranks is updated in pieces, which is exact only for element-wise update rules. Every
//! ferrite rule is element-wise (SGD, Adam/AdamW, RMSprop, Adagrad: per-element state, scalar
//! hyper-parameters, a per-parameter step count that is the same in every piece); a rule that
//! needs a whole parameter (LAMB's trust ratio) would need the greedy layout instead.

/// The flat layout of the trainable parameters over `world` ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlatPartition {
    world: usize,
    total: usize,
    per_rank: usize,
    offsets: Vec<usize>,
    numels: Vec<usize>,
}

/// The part of one parameter that one rank owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardPiece {
    /// Index of the parameter (registration order).
    pub param: usize,
    /// First owned element, in the parameter's flattened order.
    pub param_start: usize,
    pub len: usize,
    /// Where the piece sits in the owner's range (0-based, `< per_rank`).
    pub rank_start: usize,
}

impl FlatPartition {
    /// The layout of parameters of `numels` elements over `world` ranks (`world ≥ 1`).
    pub fn new(numels: &[usize], world: usize) -> FlatPartition {
        let world = world.max(1);
        let mut offsets = Vec::with_capacity(numels.len());
        let mut total = 0usize;
        for &n in numels {
            offsets.push(total);
            total += n;
        }
        FlatPartition { world, total, per_rank: total.div_ceil(world), offsets, numels: numels.to_vec() }
    }

    /// Values per rank (the last rank's range may end in padding).
    pub fn per_rank(&self) -> usize {
        self.per_rank
    }

    /// Trainable values in all.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Where parameter `i` starts in the flat index space.
    pub fn offset(&self, i: usize) -> usize {
        self.offsets[i]
    }

    pub fn numel(&self, i: usize) -> usize {
        self.numels[i]
    }

    /// The pieces of parameters rank `rank` owns, in flat order (none for a rank past the end).
    pub fn pieces(&self, rank: usize) -> Vec<ShardPiece> {
        let lo = (rank * self.per_rank).min(self.total);
        let hi = ((rank + 1) * self.per_rank).min(self.total);
        self.overlapping(lo, hi)
            .map(|(param, a, b)| ShardPiece {
                param,
                param_start: a - self.offsets[param],
                len: b - a,
                rank_start: a - rank * self.per_rank,
            })
            .collect()
    }

    /// `(parameter, start, end)` in flat indices for every parameter overlapping `[lo, hi)`.
    pub fn overlapping(&self, lo: usize, hi: usize) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        // The first parameter that ends after `lo`.
        let first = self.offsets.partition_point(|&o| o < lo).saturating_sub(1);
        (first..self.numels.len()).take_while(move |&i| self.offsets[i] < hi).filter_map(move |i| {
            let a = self.offsets[i].max(lo);
            let b = (self.offsets[i] + self.numels[i]).min(hi);
            (a < b).then_some((i, a, b))
        })
    }
}

/// DDP's default bytes of gradients per all-reduce (PyTorch's `bucket_cap_mb`, 25 MiB).
pub const DDP_BUCKET_CAP_BYTES: usize = 25 * 1024 * 1024;
/// DDP's default bytes of the first bucket (PyTorch's `first_bucket_bytes`, 1 MiB).
pub const DDP_FIRST_BUCKET_BYTES: usize = 1024 * 1024;

/// DDP's bucket assignment in reverse parameter order (roughly the order backward produces the
/// gradients, as in PyTorch): the first bucket holds up to `first_cap` bytes of f32 gradients,
/// later ones up to `cap` (a parameter larger than a cap gets a bucket of its own).
pub fn ddp_buckets(numels: &[usize], first_cap: usize, cap: usize) -> Vec<Vec<usize>> {
    let mut buckets: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut bytes = 0usize;
    for i in (0..numels.len()).rev() {
        let b = numels[i] * 4;
        let limit = if buckets.is_empty() { first_cap } else { cap };
        if !current.is_empty() && bytes + b > limit {
            buckets.push(std::mem::take(&mut current));
            bytes = 0;
        }
        current.push(i);
        bytes += b;
    }
    if !current.is_empty() {
        buckets.push(current);
    }
    buckets
}

#[cfg(test)]
mod tests {
    use super::{FlatPartition, ShardPiece, ddp_buckets};

    fn piece(param: usize, param_start: usize, len: usize, rank_start: usize) -> ShardPiece {
        ShardPiece { param, param_start, len, rank_start }
    }

    #[test]
    fn uneven_counts_pad_the_last_rank() {
        // 7 values over 3 ranks: 3, 3, 1 (+2 padding).
        let p = FlatPartition::new(&[4, 3], 3);
        assert_eq!(p.per_rank(), 3);
        assert_eq!(p.pieces(0), vec![piece(0, 0, 3, 0)]);
        assert_eq!(p.pieces(1), vec![piece(0, 3, 1, 0), piece(1, 0, 2, 1)]);
        assert_eq!(p.pieces(2), vec![piece(1, 2, 1, 0)]);
    }

    #[test]
    fn a_parameter_larger_than_a_partition_is_cut_across_ranks() {
        let p = FlatPartition::new(&[2, 10, 1], 3);
        assert_eq!(p.per_rank(), 5);
        assert_eq!(p.pieces(0), vec![piece(0, 0, 2, 0), piece(1, 0, 3, 2)]);
        assert_eq!(p.pieces(1), vec![piece(1, 3, 5, 0)]);
        assert_eq!(p.pieces(2), vec![piece(1, 8, 2, 0), piece(2, 0, 1, 2)]);
    }

    #[test]
    fn every_value_has_exactly_one_owner() {
        for world in 1..6 {
            let numels = [5, 1, 17, 3, 0, 8];
            let p = FlatPartition::new(&numels, world);
            let mut seen = vec![0usize; p.total()];
            for r in 0..world {
                for s in p.pieces(r) {
                    assert!(s.rank_start + s.len <= p.per_rank());
                    for k in 0..s.len {
                        seen[p.offset(s.param) + s.param_start + k] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "world {world}: {seen:?}");
        }
        // More ranks than values: the last ranks own nothing.
        let p = FlatPartition::new(&[1, 1], 3);
        assert_eq!(p.pieces(2), vec![]);
    }

    #[test]
    fn buckets_fill_in_reverse_order_up_to_their_caps() {
        // 6 parameters of 100 values (400 bytes), filled in reverse order.
        let numels = [100; 6];
        assert_eq!(ddp_buckets(&numels, 800, 1600), vec![vec![5, 4], vec![3, 2, 1, 0]]);
        assert_eq!(ddp_buckets(&numels, 10_000, 10_000), vec![vec![5, 4, 3, 2, 1, 0]]);
        assert_eq!(ddp_buckets(&[1000, 10, 10], 100, 100), vec![vec![2, 1], vec![0]]);
    }
}
