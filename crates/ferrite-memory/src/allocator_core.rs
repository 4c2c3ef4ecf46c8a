//! The caching algorithm itself, on plain `&mut self` (the public [`crate::CachingAllocator`]
//! wraps it in one lock per device).
//!
//! It follows PyTorch's `DeviceCachingAllocator` (native backend) step for step so that
//! `allocated`, `reserved`, peaks and OOM points match what PyTorch users know: best fit from a
//! `(stream, size, addr)`-ordered free set, split and merge within a segment, the oversize rules of
//! `max_split_size`, the OOM recovery ladder (garbage collection, release oversize blocks, release
//! everything cached and retry) and the statistics updates in the same places.
use std::panic::Location;
use std::ptr::NonNull;

use crate::block_pool::{Arena, BlockRec, FreeKey, FreePool, NIL};
use crate::history::{Frame, HistoryRing, TraceAction};
use crate::oom::{OomFacts, OutOfMemoryReport};
use crate::raw_memory::{RawAllocError, RawMemory, RawSegment};
use crate::size_rules::{MAX_REQUEST, MIN_BLOCK_SIZE, SMALL_SIZE, allocation_size, is_small, round_size};
use crate::snapshot::{AllocatorSettings, BlockSnapshot, BlockState, MemorySnapshot, SegmentSnapshot};
use crate::stats::MemoryStats;
use crate::{AllocatorConfig, Device, MemoryError};

/// A segment reserved from the backend.
#[derive(Debug)]
struct SegmentRec {
    raw: RawSegment,
    /// First block of the segment (lowest address).
    head: u32,
    small: bool,
    stream: u32,
    /// Counted in `oversize_segments`.
    oversize: bool,
    location: Option<&'static Location<'static>>,
}

/// The fields of a merged-away block that its neighbour needs.
struct SrcLinks {
    addr: u64,
    size: u64,
    prev: u32,
    next: u32,
    segment: u32,
}

/// What `malloc` hands back to the public layer.
pub(crate) struct Allocation {
    pub idx: u32,
    pub addr: u64,
    pub ptr: Option<NonNull<u8>>,
    pub size: u64,
}

pub(crate) struct AllocatorCore {
    device: Device,
    config: AllocatorConfig,
    /// Set when the environment configuration was invalid: every allocation reports it.
    config_error: Option<MemoryError>,
    pub stats: MemoryStats,
    arena: Arena,
    small: FreePool,
    large: FreePool,
    segments: Vec<Option<SegmentRec>>,
    vacant_segments: Vec<u32>,
    raw: Box<dyn RawMemory>,
    /// Bytes reserved in segments (PyTorch `total_allocated_memory`).
    total_reserved: u64,
    /// Limit from the per-process memory fraction.
    allowed_max: Option<u64>,
    fraction: Option<f64>,
    history: Option<HistoryRing>,
    /// Why the last segment reservation failed.
    last_raw_error: Option<RawAllocError>,
}

impl AllocatorCore {
    pub fn new(device: Device, config: AllocatorConfig, raw: Box<dyn RawMemory>) -> AllocatorCore {
        AllocatorCore {
            device,
            stats: MemoryStats::new(config.max_split_size),
            config,
            config_error: None,
            arena: Arena::default(),
            small: FreePool::new(),
            large: FreePool::new(),
            segments: Vec::new(),
            vacant_segments: Vec::new(),
            raw,
            total_reserved: 0,
            allowed_max: None,
            fraction: None,
            history: None,
            last_raw_error: None,
        }
    }

    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    pub fn set_config(&mut self, config: AllocatorConfig) {
        self.stats.set_max_split_size(config.max_split_size);
        self.config = config;
        self.config_error = None;
    }

    pub fn set_config_error(&mut self, e: MemoryError) {
        self.config_error = Some(e);
    }

    pub fn set_fraction(&mut self, fraction: f64) -> Result<(), MemoryError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(MemoryError::InvalidConfig {
                key: "memory_fraction".into(),
                value: fraction.to_string(),
                reason: "must be within [0, 1]".into(),
            });
        }
        let Some(total) = self.raw.total_capacity() else {
            return Err(MemoryError::InvalidConfig {
                key: "memory_fraction".into(),
                value: fraction.to_string(),
                reason: format!("device {} has no fixed capacity to take a fraction of", self.device),
            });
        };
        self.allowed_max = Some((fraction * total as f64) as u64);
        self.fraction = Some(fraction);
        Ok(())
    }

    pub fn fraction(&self) -> Option<f64> {
        self.fraction
    }

    /// `(free, total)` as `torch.cuda.mem_get_info` reports them.
    pub fn mem_get_info(&self) -> Option<(u64, u64)> {
        Some((self.raw.device_free()?, self.raw.total_capacity()?))
    }

    pub fn record_history(&mut self, max_entries: Option<usize>) {
        self.history = max_entries.map(HistoryRing::new);
    }

    pub fn history(&self) -> Vec<crate::TraceEntry> {
        self.history.as_ref().map(|h| h.entries()).unwrap_or_default()
    }

    #[inline]
    fn trace(&mut self, action: TraceAction, addr: u64, size: u64, stream: u32, loc: Option<&'static Location<'static>>) {
        if let Some(h) = &mut self.history {
            h.record(action, addr, size, stream, loc);
        }
    }

    #[inline]
    fn pool(&mut self, small: bool) -> &mut FreePool {
        if small { &mut self.small } else { &mut self.large }
    }

    #[inline]
    fn gc_enabled(&self) -> bool {
        self.allowed_max.is_some() && self.config.garbage_collection_threshold > 0.0
    }

    // ---------------------------------------------------------------- allocation

    pub fn malloc(
        &mut self,
        orig: u64,
        stream: u32,
        loc: &'static Location<'static>,
    ) -> Result<Allocation, MemoryError> {
        if let Some(e) = &self.config_error {
            return Err(e.clone());
        }
        if orig >= MAX_REQUEST {
            return Err(MemoryError::RequestTooLarge { device: self.device.to_string(), requested: orig });
        }
        let size = round_size(orig, &self.config.roundup_power2_divisions);
        let small = is_small(size);

        let mut found = self.get_free_block(small, stream, size);
        let alloc_size = allocation_size(size);
        if found.is_none() {
            if self.gc_enabled() {
                self.garbage_collect_cached_blocks();
            }
            found = self.alloc_block(small, stream, alloc_size, false, loc);
            if found.is_none() && self.release_available_cached_blocks(small, stream, size) {
                found = self.alloc_block(small, stream, alloc_size, false, loc);
            }
            if found.is_none() {
                self.release_cached_blocks();
                found = self.alloc_block(small, stream, alloc_size, true, loc);
            }
        }
        let Some(idx) = found else {
            return Err(self.out_of_memory(orig, size, alloc_size, stream));
        };
        let split = self.should_split(idx, size);
        Ok(self.alloc_found_block(idx, size, orig, split, loc))
    }

    #[inline]
    fn get_free_block(&mut self, small: bool, stream: u32, size: u64) -> Option<u32> {
        let gc = self.gc_enabled();
        let max_split = self.config.max_split_size;
        let rounding = self.config.max_non_split_rounding;
        let pool = self.pool(small);
        if gc {
            pool.call_count += 1;
        }
        let key = pool.set.take_best_fit(stream, size, |k| {
            if size < max_split {
                // Do not hand an oversize block to a request that is not oversize itself.
                k.size < max_split
            } else {
                // An oversize block may serve an oversize request only within the rounding slack.
                k.size < size.saturating_add(rounding)
            }
        })?;
        Some(key.idx)
    }

    #[inline]
    fn should_split(&self, idx: u32, size: u64) -> bool {
        let b = &self.arena[idx];
        let remaining = b.size - size;
        if b.small {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.config.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// Reserve a new segment; the whole segment becomes one (unsplit, uncached) block.
    fn alloc_block(
        &mut self,
        small: bool,
        stream: u32,
        size: u64,
        is_retry: bool,
        loc: &'static Location<'static>,
    ) -> Option<u32> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if let Some(max) = self.allowed_max
            && self.total_reserved.saturating_add(size) > max
        {
            self.last_raw_error = Some(RawAllocError::CapacityExceeded);
            return None;
        }
        let raw = match self.raw.allocate(size) {
            Ok(r) => r,
            Err(e) => {
                self.last_raw_error = Some(e);
                return None;
            }
        };
        self.total_reserved += size;
        let addr = raw.addr;
        let seg = match self.vacant_segments.pop() {
            Some(s) => s,
            None => {
                self.segments.push(None);
                (self.segments.len() - 1) as u32
            }
        };
        let idx = self.arena.insert(BlockRec {
            addr,
            size,
            requested: 0,
            prev: NIL,
            next: NIL,
            segment: seg,
            stream,
            allocated: false,
            small,
            oversize: false,
            gc_base: 0,
            location: None,
        });
        let oversize = size >= self.config.max_split_size;
        self.segments[seg as usize] = Some(SegmentRec { raw, head: idx, small, stream, oversize, location: Some(loc) });
        self.stats.segment.increase(small, 1);
        self.stats.reserved_bytes.increase(small, size);
        if oversize {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.trace(TraceAction::SegmentAlloc, addr, size, stream, Some(loc));
        Some(idx)
    }

    #[inline]
    fn alloc_found_block(
        &mut self,
        idx: u32,
        size: u64,
        orig: u64,
        split: bool,
        loc: &'static Location<'static>,
    ) -> Allocation {
        let already_split = self.arena[idx].is_split();
        let small = self.arena[idx].small;
        let block = if split {
            let rem = idx;
            let r = &self.arena[rem];
            let (addr, prev, segment, stream) = (r.addr, r.prev, r.segment, r.stream);
            let b = self.arena.insert(BlockRec {
                addr,
                size,
                requested: 0,
                prev,
                next: rem,
                segment,
                stream,
                allocated: false,
                small,
                oversize: false,
                    gc_base: 0,
                location: None,
            });
            if prev != NIL {
                self.arena[prev].next = b;
            } else if let Some(s) = self.segments[segment as usize].as_mut() {
                s.head = b;
            }
            let pool = if small { &mut self.small } else { &mut self.large };
            let r = &mut self.arena[rem];
            // Build the key from values in registers: re-reading the fields just written would
            // stall on store forwarding.
            let rem_addr = addr + size;
            let rem_size = r.size - size;
            r.prev = b;
            r.addr = rem_addr;
            r.size = rem_size;
            r.gc_base = pool.call_count;
            pool.set.insert(FreeKey { stream, size: rem_size, addr: rem_addr, idx: rem });
            if already_split {
                // An already split free block shrinks by `size`.
                self.stats.inactive_split_bytes.decrease(small, size);
            } else {
                // A new free split piece appears.
                self.stats.inactive_split_bytes.increase(small, rem_size);
                self.stats.inactive_split.increase(small, 1);
            }
            b
        } else {
            if already_split {
                let s = self.arena[idx].size;
                self.stats.inactive_split_bytes.decrease(small, s);
                self.stats.inactive_split.decrease(small, 1);
            }
            idx
        };
        let oversize = self.arena[block].size >= self.config.max_split_size;
        let b = &mut self.arena[block];
        b.allocated = true;
        b.requested = orig;
        b.location = Some(loc);
        b.oversize = oversize;
        let (bsize, addr, segment, stream) = (b.size, b.addr, b.segment, b.stream);
        let st = &mut self.stats;
        st.allocation.increase(small, 1);
        st.allocated_bytes.increase(small, bsize);
        st.active.increase(small, 1);
        st.active_bytes.increase(small, bsize);
        st.requested_bytes.increase(small, orig);
        if oversize {
            st.oversize_allocations.increase(1);
        }
        self.trace(TraceAction::Alloc, addr, orig, stream, Some(loc));
        let ptr = self.segments[segment as usize].as_ref().and_then(|s| {
            let base = s.raw.ptr?;
            // SAFETY: the block lies inside its segment, so `addr - segment.addr` is an in-bounds
            // offset of the segment's allocation.
            Some(unsafe { base.add((addr - s.raw.addr) as usize) })
        });
        Allocation { idx: block, addr, ptr, size: bsize }
    }

    // ---------------------------------------------------------------- free

    pub fn free(&mut self, idx: u32) {
        let b = &mut self.arena[idx];
        debug_assert!(b.allocated, "double free of an allocator block");
        b.allocated = false;
        let (small, size, requested, oversize, addr, stream, loc) =
            (b.small, b.size, b.requested, b.oversize, b.addr, b.stream, b.location);
        self.stats.allocation.decrease(small, 1);
        self.stats.allocated_bytes.decrease(small, size);
        self.trace(TraceAction::Free, addr, requested, stream, loc);
        if oversize {
            self.stats.oversize_allocations.decrease(1);
        }
        self.free_block(idx);
    }

    /// Return a block to its pool, merging it with free neighbours.
    #[inline]
    fn free_block(&mut self, idx: u32) {
        let (small, orig_size, requested, prev, next) = {
            let b = &mut self.arena[idx];
            let r = (b.small, b.size, b.requested, b.prev, b.next);
            b.requested = 0;
            b.location = None;
            r
        };
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        let mut size = orig_size;
        for cand in [prev, next] {
            let subsumed = self.try_merge(idx, cand);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
                size += subsumed;
            }
        }
        let pool = if small { &mut self.small } else { &mut self.large };
        let b = &mut self.arena[idx];
        b.gc_base = pool.call_count;
        let (addr, stream, split) = (b.addr, b.stream, b.is_split());
        let inserted = pool.set.insert(FreeKey { stream, size, addr, idx });
        debug_assert!(inserted, "block cached twice");
        if split {
            net_blocks += 1;
            net_bytes += size as i64;
        }
        let st = &mut self.stats;
        match net_blocks.cmp(&0) {
            std::cmp::Ordering::Greater => st.inactive_split.increase(small, net_blocks as u64),
            std::cmp::Ordering::Less => st.inactive_split.decrease(small, (-net_blocks) as u64),
            std::cmp::Ordering::Equal => {}
        }
        match net_bytes.cmp(&0) {
            std::cmp::Ordering::Greater => st.inactive_split_bytes.increase(small, net_bytes as u64),
            std::cmp::Ordering::Less => st.inactive_split_bytes.decrease(small, (-net_bytes) as u64),
            std::cmp::Ordering::Equal => {}
        }
        st.active.decrease(small, 1);
        st.active_bytes.decrease(small, orig_size);
        st.requested_bytes.decrease(small, requested);
    }

    /// Absorb free neighbour `src` into `dst`; returns the bytes absorbed (0 if not possible).
    #[inline]
    fn try_merge(&mut self, dst: u32, src: u32) -> u64 {
        if src == NIL {
            return 0;
        }
        let s = &self.arena[src];
        if s.allocated {
            return 0;
        }
        let key = FreeKey::of(src, s);
        let small = s.small;
        let s = SrcLinks { addr: s.addr, size: s.size, prev: s.prev, next: s.next, segment: s.segment };
        let pool = if small { &mut self.small } else { &mut self.large };
        let removed = pool.set.remove(&key);
        debug_assert!(removed, "cached block missing from its pool");
        if self.arena[dst].prev == src {
            let d = &mut self.arena[dst];
            d.addr = s.addr;
            d.prev = s.prev;
            if s.prev != NIL {
                self.arena[s.prev].next = dst;
            } else if let Some(seg) = self.segments[s.segment as usize].as_mut() {
                seg.head = dst;
            }
        } else {
            self.arena[dst].next = s.next;
            if s.next != NIL {
                self.arena[s.next].prev = dst;
            }
        }
        self.arena[dst].size += s.size;
        self.arena.remove(src);
        s.size
    }

    // ---------------------------------------------------------------- releasing segments

    /// Return the segment of an unsplit cached block to the backend.
    fn release_block(&mut self, idx: u32) {
        let b = self.arena[idx].clone();
        debug_assert!(!b.is_split() && !b.allocated);
        let pool = if b.small { &mut self.small } else { &mut self.large };
        pool.remove(idx, &b);
        self.arena.remove(idx);
        let Some(seg) = self.segments[b.segment as usize].take() else {
            debug_assert!(false, "block without a segment");
            return;
        };
        self.vacant_segments.push(b.segment);
        self.stats.num_device_free += 1;
        self.trace(TraceAction::SegmentFree, b.addr, b.size, b.stream, seg.location);
        self.raw.free(seg.raw);
        self.total_reserved -= b.size;
        self.stats.segment.decrease(b.small, 1);
        self.stats.reserved_bytes.decrease(b.small, b.size);
        if seg.oversize {
            self.stats.oversize_segments.decrease(1);
        }
    }

    /// Release every unsplit cached block of one pool.
    fn release_blocks(&mut self, small: bool) {
        let pool = if small { &self.small } else { &self.large };
        let victims: Vec<u32> = pool.set.iter().filter(|k| !self.arena[k.idx].is_split()).map(|k| k.idx).collect();
        for v in victims {
            self.release_block(v);
        }
    }

    /// `empty_cache` and the last rung of the OOM ladder.
    pub fn release_cached_blocks(&mut self) {
        self.stats.num_sync_all_streams += 1;
        self.release_blocks(false);
        self.release_blocks(true);
    }

    /// With `max_split_size` set: release one oversize cached block big enough for the request,
    /// or else oversize blocks from the largest down until enough bytes are released.
    fn release_available_cached_blocks(&mut self, small: bool, stream: u32, size: u64) -> bool {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let key_size = size.max(max_split);
        let pool = if small { &self.small } else { &self.large };
        if let Some(k) = pool.best_fit(stream, key_size) {
            if self.arena[k.idx].is_split() {
                return false;
            }
            self.release_block(k.idx);
            return true;
        }
        let candidates: Vec<FreeKey> =
            pool.set.below_desc(stream, key_size).into_iter().take_while(|k| k.size >= max_split).collect();
        let mut released = 0u64;
        for k in candidates {
            if released >= key_size {
                break;
            }
            if self.arena[k.idx].is_split() {
                continue;
            }
            released += k.size;
            self.release_block(k.idx);
        }
        released >= key_size
    }

    /// `garbage_collection_threshold`: above `threshold × allowed` reserved bytes, release the
    /// oldest unsplit large cached blocks (age at least the average) until back under it.
    fn garbage_collect_cached_blocks(&mut self) {
        let Some(allowed) = self.allowed_max else { return };
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_reserved <= threshold {
            return;
        }
        let target = self.total_reserved - threshold;
        let now = self.large.call_count;
        let age = |b: &BlockRec| now - b.gc_base;
        let mut total_age: u64 = 0;
        let mut count: u64 = 0;
        for k in self.large.set.iter() {
            let b = &self.arena[k.idx];
            if !b.is_split() {
                total_age += age(b);
                count += 1;
            }
        }
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            let age_threshold = total_age as f64 / count as f64;
            freed = false;
            let victims: Vec<u32> = self
                .large
                .set
                .iter()
                .filter(|k| {
                    let b = &self.arena[k.idx];
                    !b.is_split() && age(b) as f64 >= age_threshold
                })
                .map(|k| k.idx)
                .collect();
            for v in victims {
                let b = &self.arena[v];
                freed = true;
                reclaimed += b.size;
                total_age -= age(b);
                count -= 1;
                self.release_block(v);
            }
        }
    }

    // ---------------------------------------------------------------- OOM

    fn out_of_memory(&mut self, orig: u64, size: u64, alloc_size: u64, stream: u32) -> MemoryError {
        let device_free = self.raw.device_free();
        self.trace(TraceAction::Oom, device_free.unwrap_or(0), size, stream, None);
        self.stats.num_ooms += 1;
        let largest_free_block = self.small.largest().max(self.large.largest());
        let host_refused = self.last_raw_error == Some(RawAllocError::HostRefused);
        let facts = OomFacts {
            device: self.device.to_string(),
            device_kind: self.device.kind(),
            device_index: self.device.index(),
            device_name: self.device.hardware_name(),
            requested_bytes: orig,
            rounded_bytes: size,
            segment_bytes: alloc_size,
            total_capacity: self.raw.total_capacity(),
            // A host refusal below the nominal capacity means the capacity is not really there.
            usable_capacity: if host_refused { Some(self.total_reserved) } else { self.raw.usable_capacity() },
            device_free,
            allowed_bytes: self.allowed_max,
            allocated_bytes: self.stats.allocated_bytes.all.current as u64,
            reserved_bytes: self.stats.reserved_bytes.all.current as u64,
            largest_free_block,
            max_split_size: self.config.max_split_size_limit(),
            host_refused,
        };
        MemoryError::OutOfMemory { report: Box::new(OutOfMemoryReport::diagnose(facts)) }
    }

    pub fn largest_free_block(&self) -> u64 {
        self.small.largest().max(self.large.largest())
    }

    // ---------------------------------------------------------------- inspection

    pub fn snapshot(&self) -> MemorySnapshot {
        let mut segments = Vec::new();
        for seg in self.segments.iter().flatten() {
            let mut blocks = Vec::new();
            let (mut allocated, mut requested) = (0, 0);
            let mut i = seg.head;
            while i != NIL {
                let b = &self.arena[i];
                if b.allocated {
                    allocated += b.size;
                    requested += b.requested;
                }
                blocks.push(BlockSnapshot {
                    address: b.addr,
                    size: b.size,
                    requested_size: b.requested,
                    state: if b.allocated { BlockState::ActiveAllocated } else { BlockState::Inactive },
                    frames: b.location.map(Frame::from_location).into_iter().collect(),
                });
                i = b.next;
            }
            segments.push(SegmentSnapshot {
                device: self.device.index(),
                address: seg.raw.addr,
                total_size: seg.raw.size,
                allocated_size: allocated,
                active_size: allocated,
                requested_size: requested,
                stream: seg.stream,
                segment_type: if seg.small { "small" } else { "large" }.to_string(),
                segment_pool_id: (0, 0),
                is_expandable: false,
                frames: seg.location.map(Frame::from_location).into_iter().collect(),
                blocks,
            });
        }
        segments.sort_by_key(|s| s.address);
        let divisions = self
            .config
            .roundup_power2_divisions
            .iter()
            .enumerate()
            .map(|(i, d)| ((1u64 << i).to_string(), *d))
            .collect();
        MemorySnapshot {
            segments,
            device_traces: vec![self.history()],
            allocator_settings: AllocatorSettings {
                alloc_conf: self.config.to_string(),
                max_split_size: self.stats.max_split_size,
                garbage_collection_threshold: self.config.garbage_collection_threshold,
                expandable_segments: false,
                roundup_power2_divisions: divisions,
            },
        }
    }

    /// Recompute every current statistic from the segments and blocks and compare.
    pub fn check_consistency(&self) -> Result<(), String> {
        let mut exp = MemoryStats::new(self.config.max_split_size);
        let mut cached = 0usize;
        for (si, seg) in self.segments.iter().enumerate() {
            let Some(seg) = seg else { continue };
            exp.segment.increase(seg.small, 1);
            exp.reserved_bytes.increase(seg.small, seg.raw.size);
            if seg.oversize {
                exp.oversize_segments.increase(1);
            }
            let mut i = seg.head;
            let mut expected_addr = seg.raw.addr;
            let mut prev = NIL;
            let mut total = 0;
            let single = self.arena[seg.head].next == NIL;
            while i != NIL {
                let b = &self.arena[i];
                if b.segment as usize != si || b.prev != prev || b.addr != expected_addr || b.small != seg.small {
                    return Err(format!("segment {si}: broken block chain at block {i}"));
                }
                if prev != NIL && !b.allocated && !self.arena[prev].allocated {
                    return Err(format!("segment {si}: two adjacent free blocks were not merged"));
                }
                if b.allocated {
                    exp.allocation.increase(b.small, 1);
                    exp.allocated_bytes.increase(b.small, b.size);
                    exp.active.increase(b.small, 1);
                    exp.active_bytes.increase(b.small, b.size);
                    exp.requested_bytes.increase(b.small, b.requested);
                    if b.oversize {
                        exp.oversize_allocations.increase(1);
                    }
                } else {
                    cached += 1;
                    let pool = if b.small { &self.small } else { &self.large };
                    if !pool.set.contains(&FreeKey::of(i, b)) {
                        return Err(format!("segment {si}: free block {i} is not in its pool"));
                    }
                    if !single {
                        exp.inactive_split.increase(b.small, 1);
                        exp.inactive_split_bytes.increase(b.small, b.size);
                    }
                }
                expected_addr += b.size;
                total += b.size;
                prev = i;
                i = b.next;
            }
            if total != seg.raw.size {
                return Err(format!("segment {si}: blocks cover {total} of {} bytes", seg.raw.size));
            }
        }
        if cached != self.small.set.len() + self.large.set.len() {
            return Err("the free pools hold blocks that belong to no segment".into());
        }
        if self.total_reserved != exp.reserved_bytes.all.current as u64 || self.raw.reserved() != self.total_reserved {
            return Err("reserved byte counters disagree with the segments".into());
        }
        let (have, want) = (&self.stats, &exp);
        let pairs = [
            ("allocation", &have.allocation, &want.allocation),
            ("segment", &have.segment, &want.segment),
            ("active", &have.active, &want.active),
            ("inactive_split", &have.inactive_split, &want.inactive_split),
            ("allocated_bytes", &have.allocated_bytes, &want.allocated_bytes),
            ("reserved_bytes", &have.reserved_bytes, &want.reserved_bytes),
            ("active_bytes", &have.active_bytes, &want.active_bytes),
            ("inactive_split_bytes", &have.inactive_split_bytes, &want.inactive_split_bytes),
            ("requested_bytes", &have.requested_bytes, &want.requested_bytes),
        ];
        for (name, h, w) in pairs {
            for t in crate::StatType::ALL {
                if h.get(t).current != w.get(t).current {
                    return Err(format!(
                        "{name}.{}.current is {} but the blocks say {}",
                        t.key(),
                        h.get(t).current,
                        w.get(t).current
                    ));
                }
            }
        }
        if have.oversize_allocations.current != want.oversize_allocations.current
            || have.oversize_segments.current != want.oversize_segments.current
        {
            return Err("oversize counters disagree with the blocks".into());
        }
        Ok(())
    }
}
