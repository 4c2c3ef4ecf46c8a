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
use crate::size_rules::{
    LARGE_BUFFER, MAX_REQUEST, MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE, allocation_size, is_small, round_size,
};
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
    /// An expandable segment: `raw` is reserved address space, mapped page by page.
    expandable: bool,
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
    /// Set when the device itself cannot be used (e.g. `gpu:7` on a one-GPU machine).
    device_error: Option<MemoryError>,
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
    /// Live expandable segments (the fast best-fit path is taken while there are none).
    expandable_live: usize,
    /// Open memory-scope watermarks: (id, peak allocated, peak reserved).
    watermarks: Vec<(u64, u64, u64)>,
    next_watermark: u64,
}

impl AllocatorCore {
    pub fn new(device: Device, config: AllocatorConfig, raw: Box<dyn RawMemory>) -> AllocatorCore {
        AllocatorCore {
            device,
            stats: MemoryStats::new(config.max_split_size),
            config,
            config_error: None,
            device_error: None,
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
            expandable_live: 0,
            watermarks: Vec::new(),
            next_watermark: 0,
        }
    }

    /// Start tracking the peak allocated/reserved bytes from now on (for memory scopes, which
    /// must not reset the allocator's own peak statistics: scopes can nest).
    pub fn begin_watermark(&mut self) -> u64 {
        self.next_watermark += 1;
        let id = self.next_watermark;
        let (a, r) = (self.stats.allocated_bytes.all.current as u64, self.stats.reserved_bytes.all.current as u64);
        self.watermarks.push((id, a, r));
        id
    }

    /// Peak (allocated, reserved) bytes since `begin_watermark(id)`.
    pub fn watermark(&self, id: u64) -> Option<(u64, u64)> {
        self.watermarks.iter().find(|w| w.0 == id).map(|w| (w.1, w.2))
    }

    /// Stop tracking `id`, returning its peaks.
    pub fn end_watermark(&mut self, id: u64) -> Option<(u64, u64)> {
        let i = self.watermarks.iter().position(|w| w.0 == id)?;
        let w = self.watermarks.swap_remove(i);
        Some((w.1, w.2))
    }

    #[inline]
    fn bump_watermarks(&mut self) {
        if self.watermarks.is_empty() {
            return;
        }
        let (a, r) = (self.stats.allocated_bytes.all.current as u64, self.stats.reserved_bytes.all.current as u64);
        for w in &mut self.watermarks {
            w.1 = w.1.max(a);
            w.2 = w.2.max(r);
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

    pub fn set_device_error(&mut self, e: MemoryError) {
        self.device_error = Some(e);
    }

    /// Settings this device's memory cannot honour.
    fn unsupported_config(&self) -> Option<MemoryError> {
        (self.config.expandable_segments && !self.raw.supports_expandable_segments()).then(|| MemoryError::InvalidConfig {
            key: "expandable_segments".into(),
            value: "True".into(),
            reason: format!("{} cannot map memory pages on demand (wgpu has no virtual memory API); remove the option, or use max_split_size_mb to limit fragmentation instead", self.device),
        })
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
                reason: match self.device {
                    Device::Gpu { .. } => format!(
                        "the capacity of {} is unknown (wgpu does not report VRAM); set FERRITE_GPU_MEMORY=<size>, e.g. 24GiB, to give it one",
                        self.device
                    ),
                    _ => format!("device {} has no fixed capacity to take a fraction of", self.device),
                },
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
    fn trace(
        &mut self,
        action: TraceAction,
        addr: u64,
        size: u64,
        stream: u32,
        loc: Option<&'static Location<'static>>,
    ) {
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
        if let Some(e) = self.device_error.as_ref().or(self.config_error.as_ref()) {
            return Err(e.clone());
        }
        if let Some(e) = self.unsupported_config() {
            return Err(e);
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
            found = self.alloc_block(small, stream, size, alloc_size, false, loc);
            if found.is_none() && self.release_available_cached_blocks(small, stream, size) {
                found = self.alloc_block(small, stream, size, alloc_size, false, loc);
            }
            if found.is_none() {
                self.release_cached_blocks();
                found = self.alloc_block(small, stream, size, alloc_size, true, loc);
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
        if self.expandable_live > 0 {
            return self.get_free_block_expandable(small, stream, size);
        }
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

    /// Best fit while expandable segments exist: PyTorch's variant that, with expandable segments
    /// on, prefers among equal candidates the one with less unmapped space behind it (so growing
    /// segments stay compact), and with them off skips expandable blocks.
    fn get_free_block_expandable(&mut self, small: bool, stream: u32, size: u64) -> Option<u32> {
        let gc = self.gc_enabled();
        let max_split = self.config.max_split_size;
        let rounding = self.config.max_non_split_rounding;
        let on = self.config.expandable_segments;
        let arena = &self.arena;
        let pool = if small { &mut self.small } else { &mut self.large };
        if gc {
            pool.call_count += 1;
        }
        let expandable_size = |k: &FreeKey| {
            let n = arena[k.idx].next;
            k.size + if n != NIL && !arena[n].mapped { arena[n].size } else { 0 }
        };
        let key = {
            let mut it = pool.set.iter_from(stream, size).peekable();
            let mut key = it.next()?;
            if arena[key.idx].expandable {
                if on {
                    while arena[key.idx].expandable {
                        match it.peek() {
                            Some(n) if expandable_size(n) < expandable_size(&key) => key = it.next()?,
                            _ => break,
                        }
                    }
                } else {
                    key = it.find(|k| !arena[k.idx].expandable)?;
                }
            }
            key
        };
        if size < max_split && key.size >= max_split {
            return None;
        }
        if size >= max_split && key.size >= size.saturating_add(rounding) {
            return None;
        }
        pool.set.remove(&key);
        Some(key.idx)
    }

    #[inline]
    fn should_split(&self, idx: u32, size: u64) -> bool {
        let b = &self.arena[idx];
        let remaining = b.size - size;
        if b.small || self.config.expandable_segments {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.config.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// Reserve a new segment; the whole segment becomes one (unsplit, uncached) block.
    #[allow(clippy::too_many_arguments)]
    fn alloc_block(
        &mut self,
        small: bool,
        stream: u32,
        request: u64,
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
        if self.config.expandable_segments {
            return self.try_allocate_expandable_block(small, stream, request, loc);
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
            mapped: true,
            expandable: false,
            gc_base: 0,
            location: None,
        });
        let oversize = size >= self.config.max_split_size;
        self.segments[seg as usize] =
            Some(SegmentRec { raw, head: idx, small, stream, oversize, expandable: false, location: Some(loc) });
        self.stats.segment.increase(small, 1);
        self.stats.reserved_bytes.increase(small, size);
        self.bump_watermarks();
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
        let expandable = self.arena[idx].expandable;
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
                mapped: true,
                expandable,
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
            if expandable {
                // Expandable segments are excluded from `inactive_split`, as in PyTorch.
            } else if already_split {
                // An already split free block shrinks by `size`.
                self.stats.inactive_split_bytes.decrease(small, size);
            } else {
                // A new free split piece appears.
                self.stats.inactive_split_bytes.increase(small, rem_size);
                self.stats.inactive_split.increase(small, 1);
            }
            b
        } else {
            if already_split && !expandable {
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
        self.bump_watermarks();
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
        let (small, orig_size, requested, prev, next, expandable) = {
            let b = &mut self.arena[idx];
            let r = (b.small, b.size, b.requested, b.prev, b.next, b.expandable);
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
        if expandable {
            (net_blocks, net_bytes) = (0, 0);
        }
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
        if s.allocated || s.mapped != self.arena[dst].mapped {
            return 0;
        }
        let key = FreeKey::of(src, s);
        let (small, mapped) = (s.small, s.mapped);
        let s = SrcLinks { addr: s.addr, size: s.size, prev: s.prev, next: s.next, segment: s.segment };
        let pool = if small { &mut self.small } else { &mut self.large };
        let removed = if mapped { pool.set.remove(&key) } else { pool.unmapped.remove(&(key.stream, key.addr, src)) };
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

    /// Release every unsplit cached block of one pool, and unmap the free pages of expandable
    /// segments (releasing those left with no mapped page).
    fn release_blocks(&mut self, small: bool) {
        let pool = if small { &self.small } else { &self.large };
        let mut victims = Vec::new();
        let mut to_unmap = Vec::new();
        for k in pool.set.iter() {
            let b = &self.arena[k.idx];
            if b.expandable {
                to_unmap.push(k.idx);
            } else if !b.is_split() {
                victims.push(k.idx);
            }
        }
        for v in victims {
            self.release_block(v);
        }
        for b in to_unmap {
            let b = self.unmap_block(b);
            if !self.arena[b].is_split() && !self.arena[b].mapped {
                self.release_expandable_segment(b);
            }
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
        // An expandable best fit is never released whole: as in PyTorch, fall through to releasing
        // oversize blocks below it.
        if let Some(k) = pool.best_fit(stream, key_size)
            && !self.arena[k.idx].expandable
        {
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
            if self.arena[k.idx].is_split() || self.arena[k.idx].expandable {
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
            if !b.is_split() && !b.expandable {
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
                    !b.is_split() && !b.expandable && age(b) as f64 >= age_threshold
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

    // ---------------------------------------------------------------- expandable segments

    /// Page size of expandable segments: 2 MiB in the small pool, 20 MiB in the large one.
    fn page_size(small: bool) -> u64 {
        if small { SMALL_BUFFER } else { LARGE_BUFFER }
    }

    /// The lowest-address run of free (mapped or unmapped) blocks of `stream` with room for
    /// `size` bytes, or a new expandable segment (address space only) if none has room.
    fn find_expandable_block(
        &mut self,
        small: bool,
        stream: u32,
        size: u64,
        loc: &'static Location<'static>,
    ) -> Option<u32> {
        let pool = if small { &self.small } else { &self.large };
        let candidates: Vec<u32> =
            pool.unmapped.range((stream, 0, 0)..=(stream, u64::MAX, u32::MAX)).map(|k| k.2).collect();
        let free = |b: u32| b != NIL && !self.arena[b].allocated;
        for c in candidates {
            let p = self.arena[c].prev;
            let start = if free(p) { p } else { c };
            let (mut bytes, mut b) = (0, start);
            while bytes < size && free(b) {
                bytes += self.arena[b].size;
                b = self.arena[b].next;
            }
            if bytes >= size {
                return Some(start);
            }
        }
        // Address space for 9/8 of the device, as PyTorch (room to remap pages elsewhere).
        let page = Self::page_size(small);
        let span = match self.raw.total_capacity() {
            Some(t) => t.saturating_add(t / 8),
            None => 1 << 44,
        }
        .max(size)
        .div_ceil(page)
            * page;
        let range = match self.raw.reserve_address_space(span) {
            Ok(r) => r,
            Err(e) => {
                self.last_raw_error = Some(e);
                return None;
            }
        };
        let seg = match self.vacant_segments.pop() {
            Some(s) => s,
            None => {
                self.segments.push(None);
                (self.segments.len() - 1) as u32
            }
        };
        let idx = self.arena.insert(BlockRec {
            addr: range.addr,
            size: span,
            requested: 0,
            prev: NIL,
            next: NIL,
            segment: seg,
            stream,
            allocated: false,
            small,
            oversize: false,
            mapped: false,
            expandable: true,
            gc_base: 0,
            location: None,
        });
        let pool = if small { &mut self.small } else { &mut self.large };
        pool.unmapped.insert((stream, range.addr, idx));
        self.segments[seg as usize] = Some(SegmentRec {
            raw: range,
            head: idx,
            small,
            stream,
            oversize: false,
            expandable: true,
            location: Some(loc),
        });
        self.expandable_live += 1;
        Some(idx)
    }

    /// Map the first `size` bytes (rounded up to pages) of unmapped block `to_map`; the mapped
    /// part joins its free mapped neighbours and is cached. Returns the merged block.
    fn map_block(&mut self, to_map: u32, size: u64, loc: Option<&'static Location<'static>>) -> Option<u32> {
        let b = self.arena[to_map].clone();
        debug_assert!(!b.mapped && size <= b.size);
        let page = Self::page_size(b.small);
        let len = size.div_ceil(page).saturating_mul(page).min(b.size);
        let seg = self.segments[b.segment as usize].as_ref()?;
        let offset = b.addr - seg.raw.addr;
        if let Err(e) = self.raw.map(&seg.raw, offset, len) {
            self.last_raw_error = Some(e);
            return None;
        }
        let pool = if b.small { &mut self.small } else { &mut self.large };
        pool.unmapped.remove(&(b.stream, b.addr, to_map));
        self.arena[to_map].mapped = true;
        if len < b.size {
            let rest = self.arena.insert(BlockRec {
                addr: b.addr + len,
                size: b.size - len,
                prev: to_map,
                mapped: false,
                ..b.clone()
            });
            if b.next != NIL {
                self.arena[b.next].prev = rest;
            }
            self.arena[to_map].next = rest;
            self.arena[to_map].size = len;
            let pool = if b.small { &mut self.small } else { &mut self.large };
            pool.unmapped.insert((b.stream, b.addr + len, rest));
        }
        let (prev, next) = (self.arena[to_map].prev, self.arena[to_map].next);
        self.try_merge(to_map, prev);
        self.try_merge(to_map, next);
        let pool = if b.small { &mut self.small } else { &mut self.large };
        self.arena[to_map].gc_base = pool.call_count;
        pool.set.insert(FreeKey::of(to_map, &self.arena[to_map]));
        self.total_reserved += len;
        self.stats.reserved_bytes.increase(b.small, len);
        self.bump_watermarks();
        self.stats.num_device_alloc += 1;
        self.trace(TraceAction::SegmentMap, b.addr, len, b.stream, loc);
        Some(to_map)
    }

    /// PyTorch's `try_allocate_expandable_block`: map pages at the lowest address with room and
    /// hand out the resulting free block (uncached).
    fn try_allocate_expandable_block(
        &mut self,
        small: bool,
        stream: u32,
        size: u64,
        loc: &'static Location<'static>,
    ) -> Option<u32> {
        let mut c = self.find_expandable_block(small, stream, size, loc)?;
        if !self.arena[c].mapped {
            let want = self.arena[c].size.min(size);
            c = self.map_block(c, want, Some(loc))?;
        }
        while self.arena[c].size < size {
            let remaining = size - self.arena[c].size;
            let n = self.arena[c].next;
            debug_assert!(n != NIL && !self.arena[n].mapped);
            let want = remaining.min(self.arena[n].size);
            c = self.map_block(n, want, Some(loc))?;
        }
        let pool = if small { &mut self.small } else { &mut self.large };
        let removed = pool.set.remove(&FreeKey::of(c, &self.arena[c]));
        debug_assert!(removed);
        Some(c)
    }

    /// Unmap the whole free pages inside cached block `idx` of an expandable segment; partial
    /// pages at either end stay mapped as free blocks. Returns the (possibly merged) block.
    fn unmap_block(&mut self, idx: u32) -> u32 {
        let b = self.arena[idx].clone();
        let Some(seg) = self.segments[b.segment as usize].as_ref() else { return idx };
        let base = seg.raw.addr;
        let page = Self::page_size(b.small);
        let offset = b.addr - base;
        let start = offset.div_ceil(page) * page;
        let end = (offset + b.size) / page * page;
        if end <= start {
            return idx;
        }
        let pool = if b.small { &mut self.small } else { &mut self.large };
        pool.set.remove(&FreeKey::of(idx, &b));
        if start > offset {
            let before = self.arena.insert(BlockRec { size: start - offset, next: idx, ..b.clone() });
            if b.prev != NIL {
                self.arena[b.prev].next = before;
            } else if let Some(s) = self.segments[b.segment as usize].as_mut() {
                s.head = before;
            }
            self.arena[idx].prev = before;
            let pool = if b.small { &mut self.small } else { &mut self.large };
            self.arena[before].gc_base = pool.call_count;
            pool.set.insert(FreeKey::of(before, &self.arena[before]));
        }
        if offset + b.size > end {
            let after =
                self.arena.insert(BlockRec { addr: base + end, size: offset + b.size - end, prev: idx, ..b.clone() });
            if b.next != NIL {
                self.arena[b.next].prev = after;
            }
            self.arena[idx].next = after;
            let pool = if b.small { &mut self.small } else { &mut self.large };
            self.arena[after].gc_base = pool.call_count;
            pool.set.insert(FreeKey::of(after, &self.arena[after]));
        }
        let len = end - start;
        {
            let r = &mut self.arena[idx];
            r.addr = base + start;
            r.size = len;
            r.mapped = false;
        }
        if let Some(seg) = self.segments[b.segment as usize].as_ref() {
            self.raw.unmap(&seg.raw, start, len);
        }
        let (prev, next) = (self.arena[idx].prev, self.arena[idx].next);
        self.try_merge(idx, prev);
        self.try_merge(idx, next);
        let r = &self.arena[idx];
        let key = (r.stream, r.addr, idx);
        let pool = if b.small { &mut self.small } else { &mut self.large };
        pool.unmapped.insert(key);
        self.total_reserved -= len;
        self.stats.reserved_bytes.decrease(b.small, len);
        self.stats.num_device_free += 1;
        let loc = self.segments[b.segment as usize].as_ref().and_then(|s| s.location);
        self.trace(TraceAction::SegmentUnmap, base + start, len, b.stream, loc);
        idx
    }

    /// Return the address space of an expandable segment with no mapped page.
    fn release_expandable_segment(&mut self, idx: u32) {
        let b = self.arena[idx].clone();
        debug_assert!(!b.mapped && !b.is_split());
        let pool = if b.small { &mut self.small } else { &mut self.large };
        pool.unmapped.remove(&(b.stream, b.addr, idx));
        self.arena.remove(idx);
        if let Some(seg) = self.segments[b.segment as usize].take() {
            self.vacant_segments.push(b.segment);
            self.raw.release_address_space(seg.raw);
        }
        self.expandable_live -= 1;
    }

    /// Give every segment back to the backend (the allocator is going away; no block is live).
    fn release_everything(&mut self) {
        for si in 0..self.segments.len() {
            let Some(seg) = self.segments[si].take() else { continue };
            if !seg.expandable {
                self.raw.free(seg.raw);
                continue;
            }
            // Unmap each contiguous mapped run (runs start and end on page boundaries).
            let mut i = seg.head;
            while i != NIL {
                if !self.arena[i].mapped {
                    i = self.arena[i].next;
                    continue;
                }
                let start = self.arena[i].addr;
                let mut len = 0;
                while i != NIL && self.arena[i].mapped {
                    len += self.arena[i].size;
                    i = self.arena[i].next;
                }
                self.raw.unmap(&seg.raw, start - seg.raw.addr, len);
            }
            self.raw.release_address_space(seg.raw);
        }
    }

    // ---------------------------------------------------------------- OOM

    fn out_of_memory(&mut self, orig: u64, size: u64, alloc_size: u64, stream: u32) -> MemoryError {
        if let Some(RawAllocError::TooLarge { max }) = self.last_raw_error {
            self.stats.num_ooms += 1;
            return MemoryError::BufferTooLarge { device: self.device.to_string(), requested: orig, max };
        }
        let device_free = self.raw.device_free();
        self.trace(TraceAction::Oom, device_free.unwrap_or(0), size, stream, None);
        self.stats.num_ooms += 1;
        let largest_free_block = self.small.largest().max(self.large.largest());
        let host_refused = self.last_raw_error == Some(RawAllocError::HostRefused);
        let driver_refused = self.last_raw_error == Some(RawAllocError::DriverRefused);
        let facts = OomFacts {
            device: self.device.to_string(),
            device_kind: self.device.kind(),
            device_index: self.device.index(),
            device_name: self.device.hardware_name(),
            requested_bytes: orig,
            rounded_bytes: size,
            segment_bytes: alloc_size,
            total_capacity: self.raw.total_capacity(),
            // A host or driver refusal below the nominal capacity means the capacity is not there.
            usable_capacity: if host_refused || driver_refused {
                Some(self.total_reserved)
            } else {
                self.raw.usable_capacity()
            },
            device_free,
            allowed_bytes: self.allowed_max,
            allocated_bytes: self.stats.allocated_bytes.all.current as u64,
            reserved_bytes: self.stats.reserved_bytes.all.current as u64,
            largest_free_block,
            max_split_size: self.config.max_split_size_limit(),
            host_refused,
            driver_refused,
            expandable_segments: self.config.expandable_segments,
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
            // One snapshot segment per contiguous mapped range (the whole segment unless expandable).
            let mut i = seg.head;
            while i != NIL {
                while i != NIL && !self.arena[i].mapped {
                    i = self.arena[i].next;
                }
                if i == NIL {
                    break;
                }
                let address = self.arena[i].addr;
                let mut blocks = Vec::new();
                let (mut total, mut allocated, mut requested) = (0, 0, 0);
                while i != NIL && self.arena[i].mapped {
                    let b = &self.arena[i];
                    total += b.size;
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
                    address,
                    total_size: total,
                    allocated_size: allocated,
                    active_size: allocated,
                    requested_size: requested,
                    stream: seg.stream,
                    segment_type: if seg.small { "small" } else { "large" }.to_string(),
                    segment_pool_id: (0, 0),
                    is_expandable: seg.expandable,
                    frames: seg.location.map(Frame::from_location).into_iter().collect(),
                    blocks,
                });
            }
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
                expandable_segments: self.config.expandable_segments,
                roundup_power2_divisions: divisions,
            },
        }
    }

    /// Recompute every current statistic from the segments and blocks and compare.
    pub fn check_consistency(&self) -> Result<(), String> {
        let mut exp = MemoryStats::new(self.config.max_split_size);
        let mut cached = 0usize;
        let mut unmapped = 0usize;
        let mut expandable = 0usize;
        for (si, seg) in self.segments.iter().enumerate() {
            let Some(seg) = seg else { continue };
            if seg.expandable {
                expandable += 1;
            } else {
                exp.segment.increase(seg.small, 1);
                exp.reserved_bytes.increase(seg.small, seg.raw.size);
            }
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
                if b.segment as usize != si
                    || b.prev != prev
                    || b.addr != expected_addr
                    || b.small != seg.small
                    || b.expandable != seg.expandable
                {
                    return Err(format!("segment {si}: broken block chain at block {i}"));
                }
                if prev != NIL && !b.allocated && !self.arena[prev].allocated && b.mapped == self.arena[prev].mapped {
                    return Err(format!("segment {si}: two adjacent free blocks were not merged"));
                }
                if seg.expandable && b.mapped {
                    exp.reserved_bytes.increase(seg.small, b.size);
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
                } else if !b.mapped {
                    unmapped += 1;
                    let pool = if b.small { &self.small } else { &self.large };
                    if !pool.unmapped.contains(&(b.stream, b.addr, i)) {
                        return Err(format!("segment {si}: unmapped block {i} is not in its pool"));
                    }
                } else {
                    cached += 1;
                    let pool = if b.small { &self.small } else { &self.large };
                    if !pool.set.contains(&FreeKey::of(i, b)) {
                        return Err(format!("segment {si}: free block {i} is not in its pool"));
                    }
                    if !single && !b.expandable {
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
        if cached != self.small.set.len() + self.large.set.len()
            || unmapped != self.small.unmapped.len() + self.large.unmapped.len()
        {
            return Err("the free pools hold blocks that belong to no segment".into());
        }
        if expandable != self.expandable_live {
            return Err("expandable segment count is off".into());
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

impl Drop for AllocatorCore {
    fn drop(&mut self) {
        self.release_everything();
    }
}
