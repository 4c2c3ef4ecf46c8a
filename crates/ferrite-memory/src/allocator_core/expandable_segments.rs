//! The expandable-segment path of the allocator (PyTorch's `expandable_segments:True`).
//!
//! Fragmentation comes from segments of fixed size: a 20 MiB segment with one live block in it
//! cannot serve a 25 MiB request, however much of it is free. An expandable segment instead
//! reserves address space for the whole device once and maps pages (2 MiB small, 20 MiB large)
//! as blocks need them, so a growing workload extends one contiguous segment. Unmapped space is
//! kept as blocks with `mapped == false` in the pool's `unmapped` set; `empty_cache` and the OOM
//! ladder unmap whole free pages instead of freeing segments. Kept apart from the core so the
//! fixed-segment path there reads as PyTorch's `DeviceCachingAllocator` does.

use std::panic::Location;

use super::{AllocatorCore, SegmentRec};
use crate::block_pool::{BlockRec, FreeKey, NIL};
use crate::history::TraceAction;
use crate::size_rules::{LARGE_BUFFER, SMALL_BUFFER};

impl AllocatorCore {
    /// Best fit while expandable segments exist: PyTorch's variant that, with expandable segments
    /// on, prefers among equal candidates the one with less unmapped space behind it (so growing
    /// segments stay compact), and with them off skips expandable blocks.
    pub(super) fn get_free_block_expandable(&mut self, small: bool, stream: u32, size: u64) -> Option<u32> {
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
        let addr = range.addr;
        let idx = self.install_segment(range, small, stream, true, false, loc);
        let pool = if small { &mut self.small } else { &mut self.large };
        pool.unmapped.insert((stream, addr, idx));
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
    pub(super) fn try_allocate_expandable_block(
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
    pub(super) fn unmap_block(&mut self, idx: u32) -> u32 {
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
    pub(super) fn release_expandable_segment(&mut self, idx: u32) {
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

    /// Unmap every mapped run of `seg` (runs start and end on page boundaries) and return its
    /// address space: the allocator is going away and `seg` was taken out of its slot.
    pub(super) fn unmap_and_release(&mut self, seg: SegmentRec) {
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
