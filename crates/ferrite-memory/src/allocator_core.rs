//! The caching algorithm itself, on plain `&mut self` (the public [`crate::CachingAllocator`]
//! wraps it in one lock per device).
//!
//! It follows PyTorch's `DeviceCachingAllocator` (native backend) step for step so that
//! `allocated`, `reserved`, peaks and OOM points match what PyTorch users know: best fit from a
//! `(stream, size, addr)`-ordered free set, split and merge within a segment, the oversize rules of
//! `max_split_size`, the OOM recovery ladder (garbage collection, release oversize blocks, release
//! everything cached and retry) and the statistics updates in the same places.
//!
//! Three parts live in modules of their own, as `impl AllocatorCore` blocks over the same fields:
//! [`expandable_segments`] (PyTorch's `expandable_segments:True` path: address space reserved
//! once, pages mapped and unmapped on demand), [`stream_uses`] (`record_stream`: a block used on
//! other streams waits for their events before it is reused) and [`inspection`] (the memory
//! snapshot and the consistency check that recomputes every statistic from the blocks).

mod expandable_segments;
mod inspection;
mod stream_uses;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::panic::Location;
use std::ptr::NonNull;

use crate::block_pool::{Arena, BlockRec, FreeKey, FreePool, NIL};
use crate::history::{HistoryRing, TraceAction};
use crate::oom::{OomFacts, OutOfMemoryReport};
use crate::raw_memory::{RawAllocError, RawMemory, RawSegment};
use crate::size_rules::{MAX_REQUEST, MIN_BLOCK_SIZE, SMALL_SIZE, allocation_size, is_small, round_size};
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
    /// Why the last segment reservation of the current `malloc` failed.
    last_raw_error: Option<RawAllocError>,
    /// Live expandable segments (the fast best-fit path is taken while there are none).
    expandable_live: usize,
    /// Open memory-scope watermarks: (id, peak allocated, peak reserved).
    watermarks: Vec<(u64, u64, u64)>,
    next_watermark: u64,
    /// Streams other than its own that a live block was used on (`record_stream`), by block.
    stream_uses: HashMap<u32, Vec<u32>>,
    /// Events recorded when blocks used on other streams were freed, per stream in recording
    /// order, with the block each one holds back (PyTorch's `cuda_events`).
    pending_events: BTreeMap<u32, VecDeque<(u64, u32)>>,
    /// Events outstanding per freed block that still waits (PyTorch's `event_count`).
    event_count: HashMap<u32, u32>,
    /// Freed blocks whose events could not be recorded or waited for (a lost device): never
    /// reused.
    unrecoverable_pending: Vec<u32>,
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
            stream_uses: HashMap::new(),
            pending_events: BTreeMap::new(),
            event_count: HashMap::new(),
            unrecoverable_pending: Vec::new(),
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

    pub fn history_len(&self) -> usize {
        self.history.as_ref().map_or(0, |h| h.len())
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
        self.process_events();

        let mut found = self.get_free_block(small, stream, size);
        let alloc_size = allocation_size(size);
        if found.is_none() {
            self.last_raw_error = None;
            if self.gc_enabled() {
                self.garbage_collect_cached_blocks();
            }
            found = self.alloc_block(small, stream, size, alloc_size, false, loc);
            // The OOM ladder, for refusals that freeing cached segments can cure.
            if found.is_none() && self.may_retry() && self.release_available_cached_blocks(small, stream, size) {
                found = self.alloc_block(small, stream, size, alloc_size, false, loc);
            }
            if found.is_none() && self.may_retry() {
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

    /// Whether the last refusal could go away by returning cached segments (not a buffer over the
    /// device's limit, a lost device or a missing feature).
    fn may_retry(&self) -> bool {
        self.last_raw_error.as_ref().is_none_or(RawAllocError::is_retryable)
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
        let oversize = size >= self.config.max_split_size;
        let idx = self.install_segment(raw, small, stream, false, oversize, loc);
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

    /// Put `raw` into a free segment slot as one free block spanning all of it (mapped unless the
    /// segment is expandable) and return that block; the caller accounts for it and pools it.
    fn install_segment(
        &mut self,
        raw: RawSegment,
        small: bool,
        stream: u32,
        expandable: bool,
        oversize: bool,
        loc: &'static Location<'static>,
    ) -> u32 {
        let seg = match self.vacant_segments.pop() {
            Some(s) => s,
            None => {
                self.segments.push(None);
                (self.segments.len() - 1) as u32
            }
        };
        let idx = self.arena.insert(BlockRec {
            addr: raw.addr,
            size: raw.size,
            requested: 0,
            prev: NIL,
            next: NIL,
            segment: seg,
            stream,
            allocated: false,
            small,
            oversize: false,
            mapped: !expandable,
            expandable,
            gc_base: 0,
            location: None,
        });
        self.segments[seg as usize] =
            Some(SegmentRec { raw, head: idx, small, stream, oversize, expandable, location: Some(loc) });
        idx
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
        let uses = self.take_stream_uses(idx);
        if !uses.is_empty() && self.raw.asynchronous_streams() {
            self.insert_events(idx, uses);
        } else {
            self.free_block(idx);
        }
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
        if s.allocated || s.mapped != self.arena[dst].mapped || self.is_pending_free(src) {
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
        self.synchronize_and_free_events();
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

    /// Give every segment back to the backend (the allocator is going away; no block is live).
    fn release_everything(&mut self) {
        for si in 0..self.segments.len() {
            match self.segments[si].take() {
                Some(seg) if seg.expandable => self.unmap_and_release(seg),
                Some(seg) => self.raw.free(seg.raw),
                None => {}
            }
        }
    }

    // ---------------------------------------------------------------- OOM

    fn out_of_memory(&mut self, orig: u64, size: u64, alloc_size: u64, stream: u32) -> MemoryError {
        match &self.last_raw_error {
            Some(RawAllocError::TooLarge { max }) => {
                self.stats.num_ooms += 1;
                return MemoryError::BufferTooLarge { device: self.device.to_string(), requested: orig, max: *max };
            }
            Some(RawAllocError::DeviceLost { reason }) => {
                return MemoryError::GpuUnavailable {
                    device: self.device.to_string(),
                    reason: format!(
                        "the device was lost ({reason}); its memory and every tensor on it are gone. Restart the run (resume from the last checkpoint)"
                    ),
                };
            }
            _ => {}
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
        let report = Box::new(OutOfMemoryReport::diagnose(facts));
        if driver_refused { MemoryError::DriverRefused { report } } else { MemoryError::OutOfMemory { report } }
    }

    pub fn largest_free_block(&self) -> u64 {
        self.small.largest().max(self.large.largest())
    }
}

impl Drop for AllocatorCore {
    fn drop(&mut self) {
        // Other streams may still use blocks freed on this allocator: wait before returning memory.
        self.synchronize_and_free_events();
        self.release_everything();
    }
}
