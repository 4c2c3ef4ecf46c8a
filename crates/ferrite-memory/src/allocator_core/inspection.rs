//! Reading the allocator's block structure without changing it: PyTorch's memory snapshot
//! (`torch.cuda.memory._snapshot()`: segments, their blocks, the trace) and the consistency check
//! that recomputes every statistic from the segments and blocks and compares.
//!
//! The statistics are updated incrementally on every malloc/free/split/merge/map; the check is
//! what keeps those updates honest in tests (property tests run it after every step).

use super::AllocatorCore;
use crate::block_pool::{FreeKey, NIL};
use crate::history::Frame;
use crate::snapshot::{AllocatorSettings, BlockSnapshot, BlockState, MemorySnapshot, SegmentSnapshot};
use crate::stats::MemoryStats;

impl AllocatorCore {
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
                let (mut total, mut allocated, mut requested, mut pending_bytes) = (0, 0, 0, 0);
                while i != NIL && self.arena[i].mapped {
                    let b = &self.arena[i];
                    total += b.size;
                    let pending = self.is_pending_free(i);
                    if b.allocated {
                        allocated += b.size;
                        requested += b.requested;
                    }
                    if pending {
                        pending_bytes += b.size;
                    }
                    blocks.push(BlockSnapshot {
                        address: b.addr,
                        size: b.size,
                        requested_size: b.requested,
                        state: if b.allocated {
                            BlockState::ActiveAllocated
                        } else if pending {
                            BlockState::ActivePendingFree
                        } else {
                            BlockState::Inactive
                        },
                        frames: b.location.map(Frame::from_location).into_iter().collect(),
                    });
                    i = b.next;
                }
                segments.push(SegmentSnapshot {
                    device: self.device.index(),
                    address,
                    total_size: total,
                    allocated_size: allocated,
                    active_size: allocated + pending_bytes,
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
                let pending = self.is_pending_free(i);
                if prev != NIL
                    && !b.allocated
                    && !pending
                    && !self.arena[prev].allocated
                    && !self.is_pending_free(prev)
                    && b.mapped == self.arena[prev].mapped
                {
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
                } else if pending {
                    // Freed by its caller, waiting for other streams: active, in no pool.
                    exp.active.increase(b.small, 1);
                    exp.active_bytes.increase(b.small, b.size);
                    exp.requested_bytes.increase(b.small, b.requested);
                    let pool = if b.small { &self.small } else { &self.large };
                    if pool.set.contains(&FreeKey::of(i, b)) {
                        return Err(format!("segment {si}: block {i} waits for events but is in its pool"));
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
