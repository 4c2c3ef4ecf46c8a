//! Block records and the per-pool free sets of the caching allocator.
//!
//! Blocks live in an arena (`Vec` + free list) and refer to their neighbours by `u32` index, so
//! splitting and merging never touch the heap on the hot path. Free blocks are found through an
//! ordered set keyed `(stream, size, addr)`: the first key at or after `(stream, request)` is
//! PyTorch's best fit, smallest block first and lowest address among equals.
use std::collections::BTreeSet;
use std::panic::Location;

/// "No block" in neighbour links.
pub(crate) const NIL: u32 = u32::MAX;

/// One block: a contiguous piece of a segment, either handed out or cached.
#[derive(Debug, Clone)]
pub(crate) struct BlockRec {
    pub addr: u64,
    pub size: u64,
    /// Bytes the caller asked for (0 while free).
    pub requested: u64,
    pub prev: u32,
    pub next: u32,
    pub segment: u32,
    pub stream: u32,
    pub allocated: bool,
    pub small: bool,
    /// Counted in `oversize_allocations` (decided at allocation, so a config change cannot
    /// unbalance the statistic).
    pub oversize: bool,
    /// Backed by physical pages (always true outside expandable segments).
    pub mapped: bool,
    /// `get_free_blocks_call_count` of the pool when the block was cached (garbage collection age).
    pub gc_base: u64,
    /// Caller of the allocation that holds the block.
    pub location: Option<&'static Location<'static>>,
}

impl BlockRec {
    #[inline]
    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }
}

/// Storage for block records, addressed by index.
#[derive(Debug, Default)]
pub(crate) struct Arena {
    recs: Vec<BlockRec>,
    vacant: Vec<u32>,
}

impl Arena {
    #[inline]
    pub fn insert(&mut self, rec: BlockRec) -> u32 {
        if let Some(i) = self.vacant.pop() {
            self.recs[i as usize] = rec;
            i
        } else {
            self.recs.push(rec);
            (self.recs.len() - 1) as u32
        }
    }
    #[inline]
    pub fn remove(&mut self, idx: u32) {
        self.vacant.push(idx);
    }
}

impl std::ops::Index<u32> for Arena {
    type Output = BlockRec;
    #[inline]
    fn index(&self, i: u32) -> &BlockRec {
        &self.recs[i as usize]
    }
}

impl std::ops::IndexMut<u32> for Arena {
    #[inline]
    fn index_mut(&mut self, i: u32) -> &mut BlockRec {
        &mut self.recs[i as usize]
    }
}

/// Ordering key of a free block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct FreeKey {
    pub stream: u32,
    pub size: u64,
    pub addr: u64,
    pub idx: u32,
}

impl FreeKey {
    #[inline]
    pub fn of(idx: u32, rec: &BlockRec) -> FreeKey {
        FreeKey { stream: rec.stream, size: rec.size, addr: rec.addr, idx }
    }
}

/// Cached free blocks of one pool (small or large).
#[derive(Debug)]
pub(crate) struct FreePool {
    pub set: BTreeSet<FreeKey>,
    /// Unmapped address ranges of expandable segments, keyed `(stream, addr)`.
    pub unmapped: BTreeSet<(u32, u64, u32)>,
    /// Calls of `get_free_block` while garbage collection is on (block ages are measured in it).
    pub call_count: u64,
}

impl FreePool {
    pub fn new() -> FreePool {
        FreePool { set: BTreeSet::new(), unmapped: BTreeSet::new(), call_count: 0 }
    }

    #[inline]
    pub fn insert(&mut self, idx: u32, rec: &mut BlockRec) {
        rec.gc_base = self.call_count;
        let inserted = self.set.insert(FreeKey::of(idx, rec));
        debug_assert!(inserted, "block cached twice");
    }

    #[inline]
    pub fn remove(&mut self, idx: u32, rec: &BlockRec) {
        let removed = self.set.remove(&FreeKey::of(idx, rec));
        debug_assert!(removed, "cached block missing from its pool");
    }

    /// Smallest cached block of `stream` with at least `size` bytes (lowest address among equals).
    #[inline]
    pub fn best_fit(&self, stream: u32, size: u64) -> Option<FreeKey> {
        let k = self.set.range(FreeKey { stream, size, addr: 0, idx: 0 }..).next()?;
        (k.stream == stream).then_some(*k)
    }

    /// Size of the largest cached block.
    pub fn largest(&self) -> u64 {
        self.set.iter().map(|k| k.size).max().unwrap_or(0)
    }
}
