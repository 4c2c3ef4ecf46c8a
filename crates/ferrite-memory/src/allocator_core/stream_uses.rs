//! `record_stream`: a block used on streams other than the one it was allocated on is not
//! reused until the work those streams had queued when it was freed has finished.
//!
//! PyTorch's semantics (`CUDACachingAllocator`'s `recordStream`, `insert_events`,
//! `process_events`, `synchronize_and_free_events`): the caller names the other streams while the
//! block is live; when the caller frees it, one event is recorded on each of those streams and the
//! block waits — freed from the caller's view (`allocated` drops at once), still active and
//! unmergeable from the allocator's — until every event has completed. Each `malloc` first
//! collects the blocks whose events have completed, without waiting; `empty_cache` and the last
//! rung of the OOM ladder wait for all of them, so no segment goes back to the driver while a
//! stream may still read or write it.
//!
//! Only backends whose streams run asynchronously record events
//! ([`crate::raw_memory::RawMemory::asynchronous_streams`]); on the host, `sim` and `meta`
//! devices every op has finished when it returns, so a freed block is reusable at once.
use std::collections::VecDeque;

use super::AllocatorCore;

impl AllocatorCore {
    /// Mark block `idx` (live) as used on `stream` too. The block's own stream needs no mark.
    pub fn record_stream(&mut self, idx: u32, stream: u32) {
        let b = &self.arena[idx];
        if !b.allocated || b.stream == stream {
            return;
        }
        let uses = self.stream_uses.entry(idx).or_default();
        if !uses.contains(&stream) {
            uses.push(stream);
        }
    }

    /// The streams `idx` was marked with, removed; empty when none (the common case, checked
    /// without touching the map).
    #[inline]
    pub(super) fn take_stream_uses(&mut self, idx: u32) -> Vec<u32> {
        if self.stream_uses.is_empty() { Vec::new() } else { self.stream_uses.remove(&idx).unwrap_or_default() }
    }

    /// Whether block `idx` waits for events (freed by its caller, not yet reusable).
    #[inline]
    pub(super) fn is_pending_free(&self, idx: u32) -> bool {
        !self.event_count.is_empty() && self.event_count.contains_key(&idx)
    }

    /// Record one event per stream that used freed block `idx`; the block returns to its pool
    /// when all of them have completed. A backend that cannot record an event (a lost device)
    /// leaves the block out of every pool: it is never handed out again (its segment goes back to
    /// the driver with the allocator), which is the safe side of not knowing.
    pub(super) fn insert_events(&mut self, idx: u32, streams: Vec<u32>) {
        let (mut recorded, mut failed) = (0u32, false);
        for stream in streams {
            match self.raw.record_event(stream) {
                Ok(event) => {
                    self.pending_events.entry(stream).or_default().push_back((event, idx));
                    recorded += 1;
                }
                Err(_) => failed = true,
            }
        }
        // Even with no event recorded the block counts as pending: it must not be merged or reused.
        self.event_count.insert(idx, recorded.max(1));
        if failed {
            // A stream without an event may still use the block: never reuse it.
            self.unrecoverable_pending.push(idx);
        }
    }

    /// Return the blocks whose events have all completed to their pools, without waiting.
    /// Per stream, events complete in order, so each stream's queue is read up to its first
    /// event still running.
    pub(super) fn process_events(&mut self) {
        if self.pending_events.is_empty() {
            return;
        }
        let streams: Vec<u32> = self.pending_events.keys().copied().collect();
        for stream in streams {
            while let Some(&(event, idx)) = self.pending_events.get(&stream).and_then(VecDeque::front) {
                // An event the backend cannot query any more (a lost device) is as good as never
                // completing: the block stays pending.
                if !matches!(self.raw.event_done(event), Ok(true)) {
                    break;
                }
                if let Some(q) = self.pending_events.get_mut(&stream) {
                    q.pop_front();
                }
                self.raw.destroy_event(event);
                self.event_completed(idx);
            }
            if self.pending_events.get(&stream).is_some_and(VecDeque::is_empty) {
                self.pending_events.remove(&stream);
            }
        }
    }

    /// Wait for every recorded event and return their blocks (`empty_cache`, OOM ladder).
    pub(super) fn synchronize_and_free_events(&mut self) {
        let pending = std::mem::take(&mut self.pending_events);
        for (_, queue) in pending {
            for (event, idx) in queue {
                if self.raw.event_wait(event).is_err() {
                    // Not known to be finished: keep the block out of the pools for good.
                    self.raw.destroy_event(event);
                    self.unrecoverable_pending.push(idx);
                    continue;
                }
                self.raw.destroy_event(event);
                self.event_completed(idx);
            }
        }
    }

    fn event_completed(&mut self, idx: u32) {
        let Some(count) = self.event_count.get_mut(&idx) else { return };
        *count -= 1;
        if *count == 0 && !self.unrecoverable_pending.contains(&idx) {
            self.event_count.remove(&idx);
            self.free_block(idx);
        }
    }

    /// Blocks freed by their callers that still wait for events on other streams.
    pub fn pending_free_blocks(&self) -> usize {
        self.event_count.len()
    }
}
