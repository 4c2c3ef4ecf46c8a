//! Segments as `wgpu::Buffer`s.
//!
//! Every segment the caching allocator reserves on `gpu:N` is one storage buffer (usable by any
//! kernel, and as the source and destination of copies) at a fake, never reused device address;
//! a block is the range `[addr, addr + size)` of it, which the kernel backend resolves to
//! (buffer, offset) through [`GpuContext::resolve`](super::GpuContext::resolve). Buffers are
//! created inside an out-of-memory error scope, so a driver refusal becomes
//! [`RawAllocError::DriverRefused`] instead of a panic: the allocator frees its cached segments
//! and retries once, as PyTorch does, and reports a refusal that persists as the retryable
//! `MemoryError::DriverRefused`, apart from `OutOfMemory` (ferrite's own capacity accounting) and
//! `BufferTooLarge` (no freeing helps). Expandable segments need virtual-memory mapping, which
//! wgpu does not offer.

use std::sync::Arc;

use super::GpuContext;
use crate::raw_memory::{RawAllocError, RawMemory, RawSegment, SEGMENT_ALIGN};

/// Raw memory of one GPU.
pub struct WgpuMemory {
    ctx: Arc<GpuContext>,
    reserved: u64,
    next_addr: u64,
}

impl WgpuMemory {
    pub fn new(ctx: Arc<GpuContext>) -> WgpuMemory {
        // Distinct address ranges per GPU, far from host addresses.
        let next_addr = 0x6000_0000_0000 + ((ctx.index() as u64) << 40);
        WgpuMemory { ctx, reserved: 0, next_addr }
    }

    fn create_buffer(&self, size: u64) -> Result<wgpu::Buffer, RawAllocError> {
        let device = self.ctx.device();
        let scope = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("ferrite segment"),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        match pollster::block_on(scope.pop()) {
            None => Ok(buffer),
            Some(_) => Err(RawAllocError::DriverRefused),
        }
    }
}

impl RawMemory for WgpuMemory {
    fn allocate(&mut self, size: u64) -> Result<RawSegment, RawAllocError> {
        if size > self.ctx.limits().max_buffer_size {
            return Err(RawAllocError::TooLarge { max: self.ctx.limits().max_buffer_size });
        }
        if let Some(reason) = self.ctx.lost() {
            return Err(RawAllocError::DeviceLost { reason });
        }
        if let Some(cap) = self.ctx.capacity()
            && self.reserved.saturating_add(size) > cap
        {
            return Err(RawAllocError::CapacityExceeded);
        }
        let buffer = match self.create_buffer(size) {
            Ok(b) => b,
            Err(_) => {
                // Buffers dropped by earlier frees go back to the driver once the GPU has
                // finished with them: wait for that, then try once more.
                let _ = self.ctx.device().poll(wgpu::PollType::wait_indefinitely());
                self.create_buffer(size)?
            }
        };
        let addr = self.next_addr;
        self.next_addr = self
            .next_addr
            .checked_add(size.next_multiple_of(SEGMENT_ALIGN as u64))
            .ok_or(RawAllocError::CapacityExceeded)?;
        self.ctx.insert_segment(addr, buffer, size);
        self.reserved += size;
        Ok(RawSegment { addr, ptr: None, size })
    }

    fn free(&mut self, segment: RawSegment) {
        // Dropping the handle releases the buffer once every submitted command using it is done.
        drop(self.ctx.remove_segment(segment.addr));
        self.reserved -= segment.size;
    }

    fn total_capacity(&self) -> Option<u64> {
        self.ctx.capacity()
    }

    fn usable_capacity(&self) -> Option<u64> {
        self.ctx.capacity()
    }

    fn reserved(&self) -> u64 {
        self.reserved
    }

    fn supports_expandable_segments(&self) -> bool {
        false
    }
}
