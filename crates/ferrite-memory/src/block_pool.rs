//! Block records and the per-pool free sets of the caching allocator.
//!
//! Blocks live in an arena (`Vec` + free list) and refer to their neighbours by `u32` index, so
//! splitting and merging never touch the heap on the hot path. Free blocks are kept in a
//! [`FreeIndex`] ordered by `(stream, size, addr)`: the first key at or after `(stream, request)`
//! is PyTorch's best fit, smallest block first and lowest address among equals.
//!
//! The index is a segregated fit (in the spirit of TLSF): sizes map to 32 bins per power of two,
//! each bin a small vector sorted by `(size, addr)`, and a two-level bitmap finds the next
//! non-empty bin in O(1). Bins partition the size range in order, so the result is exactly the
//! best fit of an ordered set, at a fraction of a B-tree's cost for the few blocks a bin holds.
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
    /// Backed by memory (always true outside expandable segments).
    pub mapped: bool,
    /// Part of an expandable segment.
    pub expandable: bool,
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

const SUB_BITS: u32 = 5;
const SUBS: usize = 1 << SUB_BITS;
/// Bins for sizes up to 2^63 (in 512-byte units: exact below 64 units, then 32 per power of two).
const NUM_BINS: usize = 2 * SUBS + (54 - SUB_BITS as usize) * SUBS;
const WORDS: usize = NUM_BINS.div_ceil(64);

#[inline]
fn bin_of(size: u64) -> usize {
    let s = size >> 9;
    if s < 2 * SUBS as u64 {
        return s as usize;
    }
    let f = 63 - s.leading_zeros();
    let sub = ((s >> (f - SUB_BITS)) as usize) & (SUBS - 1);
    SUBS + (f - SUB_BITS) as usize * SUBS + sub
}

/// The free blocks of one stream.
#[derive(Debug)]
struct StreamBins {
    bins: Vec<Vec<FreeKey>>,
    bitmap: [u64; WORDS],
    summary: u32,
}

impl StreamBins {
    fn new() -> StreamBins {
        StreamBins { bins: (0..NUM_BINS).map(|_| Vec::new()).collect(), bitmap: [0; WORDS], summary: 0 }
    }

    #[inline]
    fn next_nonempty(&self, from: usize) -> Option<usize> {
        if from >= NUM_BINS {
            return None;
        }
        let w = from / 64;
        let bits = self.bitmap[w] & (!0u64 << (from % 64));
        if bits != 0 {
            return Some(w * 64 + bits.trailing_zeros() as usize);
        }
        let sm = self.summary & (!0u32).checked_shl(w as u32 + 1).unwrap_or(0);
        if sm == 0 {
            return None;
        }
        let w2 = sm.trailing_zeros() as usize;
        Some(w2 * 64 + self.bitmap[w2].trailing_zeros() as usize)
    }

    #[inline]
    fn insert(&mut self, k: FreeKey) -> bool {
        let b = bin_of(k.size);
        let v = &mut self.bins[b];
        if v.is_empty() {
            // The common case: a bin holds at most a few blocks, usually none.
            v.push(k);
        } else {
            match v.binary_search_by(|x| (x.size, x.addr).cmp(&(k.size, k.addr))) {
                Ok(_) => return false,
                Err(pos) => v.insert(pos, k),
            }
        }
        self.bitmap[b / 64] |= 1 << (b % 64);
        self.summary |= 1 << (b / 64);
        true
    }

    #[inline]
    fn remove(&mut self, k: &FreeKey) -> bool {
        let b = bin_of(k.size);
        let v = &mut self.bins[b];
        let found = if v.len() == 1 {
            if (v[0].size, v[0].addr) == (k.size, k.addr) { Ok(0) } else { Err(0) }
        } else {
            v.binary_search_by(|x| (x.size, x.addr).cmp(&(k.size, k.addr)))
        };
        match found {
            Ok(pos) => {
                if pos + 1 == v.len() {
                    v.pop();
                } else {
                    v.remove(pos);
                }
                if v.is_empty() {
                    self.bitmap[b / 64] &= !(1 << (b % 64));
                    if self.bitmap[b / 64] == 0 {
                        self.summary &= !(1 << (b / 64));
                    }
                }
                true
            }
            Err(_) => false,
        }
    }

    #[inline]
    fn best_fit(&self, size: u64) -> Option<FreeKey> {
        let b = bin_of(size);
        let v = &self.bins[b];
        let i = v.partition_point(|x| x.size < size);
        if i < v.len() {
            return Some(v[i]);
        }
        let nb = self.next_nonempty(b + 1)?;
        self.bins[nb].first().copied()
    }

    /// Remove and return the best fit if `accept` agrees to it.
    #[inline]
    fn take_best_fit(&mut self, size: u64, accept: impl FnOnce(&FreeKey) -> bool) -> Option<FreeKey> {
        let b = bin_of(size);
        let v = &self.bins[b];
        let i = v.partition_point(|x| x.size < size);
        let (bin, pos) = if i < v.len() { (b, i) } else { (self.next_nonempty(b + 1)?, 0) };
        let v = &mut self.bins[bin];
        let k = v[pos];
        if !accept(&k) {
            return None;
        }
        if pos + 1 == v.len() {
            v.pop();
        } else {
            v.remove(pos);
        }
        if v.is_empty() {
            self.bitmap[bin / 64] &= !(1 << (bin % 64));
            if self.bitmap[bin / 64] == 0 {
                self.summary &= !(1 << (bin / 64));
            }
        }
        Some(k)
    }

    fn contains(&self, k: &FreeKey) -> bool {
        self.bins[bin_of(k.size)].binary_search_by(|x| (x.size, x.addr).cmp(&(k.size, k.addr))).is_ok()
    }
}

/// Free blocks ordered by `(stream, size, addr)`.
#[derive(Debug, Default)]
pub(crate) struct FreeIndex {
    /// Sorted by stream id.
    streams: Vec<(u32, StreamBins)>,
    len: usize,
}

impl FreeIndex {
    #[inline]
    fn stream(&self, stream: u32) -> Option<&StreamBins> {
        match self.streams.first() {
            Some((s, b)) if *s == stream => Some(b),
            _ => self.streams.iter().find(|(s, _)| *s == stream).map(|(_, b)| b),
        }
    }

    #[inline]
    fn stream_mut(&mut self, stream: u32) -> &mut StreamBins {
        let pos = match self.streams.first() {
            Some((s, _)) if *s == stream => 0,
            _ => match self.streams.binary_search_by_key(&stream, |(s, _)| *s) {
                Ok(p) => p,
                Err(p) => {
                    self.streams.insert(p, (stream, StreamBins::new()));
                    p
                }
            },
        };
        &mut self.streams[pos].1
    }

    #[inline]
    pub fn insert(&mut self, k: FreeKey) -> bool {
        let ok = self.stream_mut(k.stream).insert(k);
        self.len += ok as usize;
        ok
    }

    #[inline]
    pub fn remove(&mut self, k: &FreeKey) -> bool {
        let ok = match self.streams.first_mut() {
            Some((s, b)) if *s == k.stream => b.remove(k),
            _ => self.streams.iter_mut().find(|(s, _)| *s == k.stream).is_some_and(|(_, b)| b.remove(k)),
        };
        self.len -= ok as usize;
        ok
    }

    pub fn contains(&self, k: &FreeKey) -> bool {
        self.stream(k.stream).is_some_and(|b| b.contains(k))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Smallest key of `stream` with at least `size` bytes, lowest address among equals.
    #[inline]
    pub fn best_fit(&self, stream: u32, size: u64) -> Option<FreeKey> {
        self.stream(stream)?.best_fit(size)
    }

    /// Remove and return the best fit of `stream` for `size` if `accept` agrees to it.
    #[inline]
    pub fn take_best_fit(&mut self, stream: u32, size: u64, accept: impl FnOnce(&FreeKey) -> bool) -> Option<FreeKey> {
        let bins = match self.streams.first_mut() {
            Some((s, b)) if *s == stream => b,
            _ => &mut self.streams.iter_mut().find(|(s, _)| *s == stream)?.1,
        };
        let k = bins.take_best_fit(size, accept)?;
        self.len -= 1;
        Some(k)
    }

    /// Keys of `stream` with at least `size` bytes, in `(size, addr)` order.
    pub fn iter_from(&self, stream: u32, size: u64) -> impl Iterator<Item = FreeKey> + '_ {
        self.stream(stream)
            .into_iter()
            .flat_map(move |b| b.bins[bin_of(size)..].iter().flatten().filter(move |k| k.size >= size).copied())
    }

    /// All keys in `(stream, size, addr)` order.
    pub fn iter(&self) -> impl Iterator<Item = &FreeKey> {
        self.streams.iter().flat_map(|(_, b)| b.bins.iter().flatten())
    }

    /// Keys of `stream` smaller than `size`, largest first.
    pub fn below_desc(&self, stream: u32, size: u64) -> Vec<FreeKey> {
        let Some(b) = self.stream(stream) else { return Vec::new() };
        let top = bin_of(size);
        let mut out = Vec::new();
        for bin in (0..=top).rev() {
            out.extend(b.bins[bin].iter().rev().filter(|k| k.size < size));
        }
        out
    }
}

/// Cached free blocks of one pool (small or large).
#[derive(Debug)]
pub(crate) struct FreePool {
    pub set: FreeIndex,
    /// Unmapped ranges of expandable segments, keyed `(stream, addr, block)`.
    pub unmapped: BTreeSet<(u32, u64, u32)>,
    /// Calls of `get_free_block` while garbage collection is on (block ages are measured in it).
    pub call_count: u64,
}

impl FreePool {
    pub fn new() -> FreePool {
        FreePool { set: FreeIndex::default(), unmapped: BTreeSet::new(), call_count: 0 }
    }

    #[inline]
    pub fn remove(&mut self, idx: u32, rec: &BlockRec) {
        let removed = self.set.remove(&FreeKey::of(idx, rec));
        debug_assert!(removed, "cached block missing from its pool");
    }

    /// Smallest cached block of `stream` with at least `size` bytes (lowest address among equals).
    #[inline]
    pub fn best_fit(&self, stream: u32, size: u64) -> Option<FreeKey> {
        self.set.best_fit(stream, size)
    }

    /// Size of the largest cached block.
    pub fn largest(&self) -> u64 {
        self.set.iter().map(|k| k.size).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_are_monotonic() {
        let mut last = 0;
        for s in
            (1..5000u64).map(|i| i * 512).chain((20..63).map(|p| 1u64 << p)).chain((20..63).map(|p| (1u64 << p) - 512))
        {
            let _ = last;
            last = bin_of(s);
            assert!(last < NUM_BINS);
        }
        let sizes: Vec<u64> = (1..200_000u64).step_by(7).map(|i| i * 512).collect();
        assert!(sizes.windows(2).all(|w| bin_of(w[0]) <= bin_of(w[1])));
        assert_eq!(bin_of(u64::MAX - 511), NUM_BINS - 1);
    }

    #[test]
    fn matches_an_ordered_set() {
        let mut idx = FreeIndex::default();
        let mut set = BTreeSet::new();
        let mut x: u64 = 88172645463325252;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..20_000u32 {
            let size = 512 * (1 + rnd() % (1 << (rnd() % 24)));
            let k = FreeKey { stream: (rnd() % 3) as u32, size, addr: rnd() % 1_000_000 * 512, idx: i };
            if rnd() % 3 == 0 {
                if let Some(&old) = set.iter().nth((rnd() % (set.len() as u64 + 1)) as usize) {
                    assert!(idx.remove(&old));
                    set.remove(&old);
                }
            } else if set.iter().all(|o: &FreeKey| (o.stream, o.size, o.addr) != (k.stream, k.size, k.addr)) {
                assert!(idx.insert(k));
                set.insert(k);
            }
            let q = 512 * (1 + rnd() % (1 << (rnd() % 24)));
            let stream = (rnd() % 3) as u32;
            let want = set
                .range(FreeKey { stream, size: q, addr: 0, idx: 0 }..)
                .next()
                .filter(|k| k.stream == stream)
                .copied();
            assert_eq!(idx.best_fit(stream, q), want);
        }
        assert_eq!(idx.len(), set.len());
        assert!(idx.iter().copied().eq(set.iter().copied()));
        let below: Vec<_> = set
            .range(..FreeKey { stream: 1, size: 1 << 20, addr: 0, idx: 0 })
            .rev()
            .take_while(|k| k.stream == 1)
            .copied()
            .collect();
        assert_eq!(idx.below_desc(1, 1 << 20), below);
    }
}
