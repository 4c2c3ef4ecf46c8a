//! The machinery under every WGSL kernel: resolving tensors to buffer bindings, compiling and
//! caching pipelines, recording dispatches into one command encoder that is submitted in batches,
//! reading back, and the asynchronous error flag.
//!
//! Bindings. A caching-allocator segment is one `wgpu::Buffer`, so several operands of a kernel
//! often live in the same buffer. WebGPU forbids binding one buffer twice in a dispatch when one
//! binding is writable, so operands are grouped by buffer: each distinct buffer is bound once
//! (the range covering its operands) as an array of 32-bit words, and each operand is addressed by
//! its word offset inside that binding, passed as a parameter. Element types are decoded from the
//! words in the shader (see `wgsl.rs`), which also lets one binding hold tensors of different
//! dtypes.
//!
//! Ordering. All work of a device goes through one in-order queue: kernels and host uploads are
//! recorded into one pending encoder in program order, so a block freed by one op and reused by
//! the next is safe, as on a CUDA stream. Reads back to the host submit the pending work and wait:
//! they are the synchronisation points.
//!
//! Errors a kernel detects (an index out of range) are written to a small flag buffer and
//! reported at the next synchronisation, as CUDA reports device-side asserts.

use std::collections::HashMap;
use std::sync::Arc;

use ferrite_memory::gpu::GpuContext;
use parking_lot::Mutex;
use wgpu::util::DeviceExt;

use crate::error::{Result, TensorError};
use crate::{DType, Tensor};

/// Dispatches recorded before the encoder is submitted on its own.
const MAX_PENDING_DISPATCHES: u32 = 256;

/// Threads per workgroup of the one-dimensional kernels.
pub(super) const WG: u32 = 256;

/// How a kernel uses an operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Access {
    Read,
    Write,
    /// Read-modify-write with atomics (scatter-add with duplicate indices).
    Atomic,
}

/// An operand of a launch.
pub(super) struct Operand<'a> {
    pub t: &'a Tensor,
    pub access: Access,
}

pub(super) fn read(t: &Tensor) -> Operand<'_> {
    Operand { t, access: Access::Read }
}

pub(super) fn write(t: &Tensor) -> Operand<'_> {
    Operand { t, access: Access::Write }
}

pub(super) fn atomic(t: &Tensor) -> Operand<'_> {
    Operand { t, access: Access::Atomic }
}

/// Where each operand lives in the kernel's bindings (decided per launch).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct BindingPlan {
    /// Binding slot of each operand.
    pub slot_of: Vec<usize>,
    /// Per slot: (written by some operand, written with sub-word stores so it needs atomics).
    pub slots: Vec<(bool, bool)>,
    /// Whether the kernel binds the error flag (after the data slots, before the parameters).
    pub error_flag: bool,
}

impl BindingPlan {
    /// Binding index of the error flag.
    pub fn flag_binding(&self) -> usize {
        self.slots.len()
    }
    /// Binding index of the parameter array.
    pub fn params_binding(&self) -> usize {
        self.slots.len() + self.error_flag as usize
    }
    /// A short signature for pipeline cache keys.
    pub fn signature(&self) -> String {
        let slots: Vec<String> = self.slots.iter().map(|&(w, a)| format!("{}{}", w as u8, a as u8)).collect();
        format!("{:?}/{}/{}", self.slot_of, slots.join(","), self.error_flag as u8)
    }
}

/// Whether stores of `dtype` touch only part of a 32-bit word (and so need atomics).
pub(super) fn sub_word(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16 | DType::U8 | DType::Bool)
}

/// Operation codes of the error flag.
pub(super) const ERR_OPS: [&str; 6] = ["", "index_select", "index_add", "gather", "scatter_add", "one_hot"];

pub(super) struct Runtime {
    pub ctx: Arc<GpuContext>,
    device_name: String,
    pipelines: Mutex<HashMap<String, wgpu::ComputePipeline>>,
    pending: Mutex<Pending>,
    /// 8 words: [op code, bad index (low, high), dim, size, 0, 0, 0]; all zero when clear.
    error_flag: wgpu::Buffer,
}

#[derive(Default)]
struct Pending {
    encoder: Option<wgpu::CommandEncoder>,
    dispatches: u32,
}

struct Bound {
    buffer: wgpu::Buffer,
    offset: u64,
    size: u64,
}

impl Runtime {
    pub fn new(ctx: Arc<GpuContext>) -> Runtime {
        let error_flag = ctx.device().create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("ferrite error flag"),
            contents: &[0u8; 32],
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        });
        let device_name = format!("gpu:{}", ctx.index());
        Runtime {
            ctx,
            device_name,
            pipelines: Mutex::new(HashMap::new()),
            pending: Mutex::new(Pending::default()),
            error_flag,
        }
    }

    fn gpu_error(&self, op: &'static str, detail: impl Into<String>) -> TensorError {
        TensorError::Gpu { op, device: self.device_name.clone(), detail: detail.into() }
    }

    /// Error if the device is gone or the driver reported an error since the last check.
    fn check_device(&self, op: &'static str) -> Result<()> {
        if let Some(reason) = self.ctx.lost() {
            return Err(self.gpu_error(op, format!("the device was lost ({reason}); results computed since the last synchronisation are gone. Restart the run (resume from the last checkpoint)")));
        }
        if let Some(e) = self.ctx.take_uncaptured_error() {
            return Err(self.gpu_error(op, format!("the driver reported an error: {e}")));
        }
        Ok(())
    }

    /// The (buffer, byte offset of the block, block size) of a tensor's storage.
    fn locate(&self, t: &Tensor, op: &'static str) -> Result<(wgpu::Buffer, u64, u64)> {
        let s = t.storage();
        let (buffer, offset, _) = self
            .ctx
            .resolve(s.addr())
            .ok_or_else(|| self.gpu_error(op, "a tensor's memory is not a live buffer of this GPU (internal error)"))?;
        Ok((buffer, offset, s.block_size() as u64))
    }

    /// Group operands by buffer, decide slots, and compute each operand's word base inside its
    /// binding.
    fn plan(
        &self,
        ops: &[Operand<'_>],
        error_flag: bool,
        op: &'static str,
    ) -> Result<(BindingPlan, Vec<Bound>, Vec<u32>)> {
        let align = self.ctx.limits().min_storage_buffer_offset_alignment.max(4) as u64;
        let max_binding = self.ctx.limits().max_storage_buffer_binding_size;
        let mut bases: Vec<u64> = Vec::new(); // segment base address per slot
        let mut groups: Vec<(wgpu::Buffer, u64, u64, bool, bool)> = Vec::new(); // buffer, lo, hi, written, atomic
        let mut slot_of = Vec::with_capacity(ops.len());
        let mut block_offsets = Vec::with_capacity(ops.len());
        for o in ops {
            let (buffer, off, size) = self.locate(o.t, op)?;
            let base = o.t.storage().addr() - off;
            let slot = match bases.iter().position(|&b| b == base) {
                Some(i) => i,
                None => {
                    bases.push(base);
                    groups.push((buffer, u64::MAX, 0, false, false));
                    bases.len() - 1
                }
            };
            let g = &mut groups[slot];
            g.1 = g.1.min(off);
            g.2 = g.2.max(off + size);
            if o.access != Access::Read {
                g.3 = true;
                g.4 |= o.access == Access::Atomic || sub_word(o.t.dtype());
            }
            slot_of.push(slot);
            block_offsets.push(off);
        }
        let mut bound = Vec::with_capacity(groups.len());
        let mut slots = Vec::with_capacity(groups.len());
        for (buffer, lo, hi, w, a) in groups {
            let lo = lo / align * align;
            let size = (hi - lo).next_multiple_of(4);
            if size > max_binding {
                return Err(TensorError::BindingTooLarge {
                    op,
                    device: self.device_name.clone(),
                    bytes: size,
                    max: max_binding,
                });
            }
            bound.push(Bound { buffer, offset: lo, size });
            slots.push((w, a));
        }
        let word_bases =
            slot_of.iter().zip(&block_offsets).map(|(&s, &off)| ((off - bound[s].offset) / 4) as u32).collect();
        Ok((BindingPlan { slot_of, slots, error_flag }, bound, word_bases))
    }

    fn pipeline(&self, key: &str, source: impl FnOnce() -> String, op: &'static str) -> Result<wgpu::ComputePipeline> {
        if let Some(p) = self.pipelines.lock().get(key) {
            return Ok(p.clone());
        }
        let src = source();
        let device = self.ctx.device();
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(key),
            source: wgpu::ShaderSource::Wgsl(src.as_str().into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(key),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(self.gpu_error(op, format!("the kernel `{key}` failed to compile: {e}")));
        }
        self.pipelines.lock().insert(key.to_string(), pipeline.clone());
        Ok(pipeline)
    }

    /// Record one dispatch. `source` builds the WGSL for the binding plan (called only when the
    /// pipeline is not cached); `params` follow the operands' word bases in the parameter array.
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &self,
        op: &'static str,
        key: &str,
        ops: &[Operand<'_>],
        error_flag: bool,
        params: &[u32],
        workgroups: [u32; 3],
        source: impl FnOnce(&BindingPlan) -> String,
    ) -> Result<()> {
        if workgroups.contains(&0) {
            return Ok(());
        }
        let (plan, bound, word_bases) = self.plan(ops, error_flag, op)?;
        let full_key = format!("{key}|{}", plan.signature());
        let pipeline = self.pipeline(&full_key, || source(&plan), op)?;
        let device = self.ctx.device();
        let mut words = word_bases;
        words.extend_from_slice(params);
        if words.is_empty() {
            words.push(0);
        }
        let params_buf = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("ferrite params"),
            contents: bytemuck::cast_slice(&words),
            usage: wgpu::BufferUsages::STORAGE,
        });
        let mut entries: Vec<wgpu::BindGroupEntry<'_>> = bound
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &b.buffer,
                    offset: b.offset,
                    size: wgpu::BufferSize::new(b.size),
                }),
            })
            .collect();
        if error_flag {
            entries.push(wgpu::BindGroupEntry {
                binding: plan.flag_binding() as u32,
                resource: self.error_flag.as_entire_binding(),
            });
        }
        entries.push(wgpu::BindGroupEntry {
            binding: plan.params_binding() as u32,
            resource: params_buf.as_entire_binding(),
        });
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut pending = self.pending.lock();
        let encoder = pending.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("ferrite") })
        });
        {
            let mut pass =
                encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(workgroups[0], workgroups[1], workgroups[2]);
        }
        pending.dispatches += 1;
        if pending.dispatches >= MAX_PENDING_DISPATCHES {
            self.submit(&mut pending);
        }
        Ok(())
    }

    fn submit(&self, pending: &mut Pending) {
        if let Some(enc) = pending.encoder.take() {
            self.ctx.queue().submit([enc.finish()]);
        }
        pending.dispatches = 0;
    }

    /// Submit everything recorded so far and wait for the GPU to finish it.
    pub fn synchronize(&self, op: &'static str) -> Result<()> {
        {
            let mut pending = self.pending.lock();
            self.submit(&mut pending);
        }
        self.ctx
            .device()
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| self.gpu_error(op, format!("waiting for the GPU failed: {e}")))?;
        self.check_device(op)?;
        self.check_error_flag()
    }

    /// Byte range `[start, start + len)` of a contiguous tensor inside its buffer.
    fn tensor_range(&self, t: &Tensor, op: &'static str) -> Result<(wgpu::Buffer, u64, u64)> {
        let (buffer, off, _) = self.locate(t, op)?;
        Ok((buffer, off + (t.storage_offset() * t.dtype().size_in_bytes()) as u64, t.nbytes() as u64))
    }

    /// Upload `bytes` into the contiguous tensor `dst` (recorded in order with the kernels).
    pub fn write(&self, dst: &Tensor, bytes: &[u8]) -> Result<()> {
        let (buffer, start, len) = self.tensor_range(dst, "write")?;
        if start % 4 != 0 {
            return Err(self.gpu_error("write", "a host upload must start on a 4-byte boundary of its buffer (internal error: uploads go to fresh tensors)"));
        }
        let padded = len.next_multiple_of(4);
        let mut data = bytes.to_vec();
        data.resize(padded as usize, 0);
        let device = self.ctx.device();
        let staging = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("ferrite upload"),
            contents: &data,
            usage: wgpu::BufferUsages::COPY_SRC,
        });
        let mut pending = self.pending.lock();
        let encoder = pending.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("ferrite") })
        });
        encoder.copy_buffer_to_buffer(&staging, 0, &buffer, start, padded);
        Ok(())
    }

    /// Read the contiguous tensor `src` into `out` (a synchronisation point).
    pub fn read(&self, src: &Tensor, out: &mut [u8]) -> Result<()> {
        let (buffer, start, len) = self.tensor_range(src, "read")?;
        let lo = start / 4 * 4;
        let hi = (start + len).next_multiple_of(4);
        let span = hi - lo;
        let device = self.ctx.device();
        // Data, then the error flag, in one mapped buffer.
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("ferrite readback"),
            size: span + 32,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        {
            let mut pending = self.pending.lock();
            let encoder = pending.encoder.get_or_insert_with(|| {
                device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("ferrite") })
            });
            encoder.copy_buffer_to_buffer(&buffer, lo, &staging, 0, span);
            encoder.copy_buffer_to_buffer(&self.error_flag, 0, &staging, span, 32);
            self.submit(&mut pending);
        }
        let slice = staging.slice(..);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| self.gpu_error("read", format!("waiting for the GPU failed: {e}")))?;
        self.check_device("read")?;
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(self.gpu_error("read", format!("mapping the readback buffer failed: {e}"))),
            Err(_) => return Err(self.gpu_error("read", "the readback was never completed")),
        }
        let flag: [u32; 8];
        {
            let view = slice
                .get_mapped_range()
                .map_err(|e| self.gpu_error("read", format!("mapping the readback buffer failed: {e}")))?;
            let skip = (start - lo) as usize;
            out.copy_from_slice(&view[skip..skip + len as usize]);
            flag = bytemuck::pod_read_unaligned(&view[span as usize..span as usize + 32]);
        }
        staging.unmap();
        self.report_flag(flag)
    }

    fn check_error_flag(&self) -> Result<()> {
        let device = self.ctx.device();
        let staging = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("ferrite flag"),
            size: 32,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        enc.copy_buffer_to_buffer(&self.error_flag, 0, &staging, 0, 32);
        self.ctx.queue().submit([enc.finish()]);
        let slice = staging.slice(..);
        slice.map_async(wgpu::MapMode::Read, |_| {});
        device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| self.gpu_error("synchronize", format!("waiting for the GPU failed: {e}")))?;
        let flag: [u32; 8] = {
            let view = slice
                .get_mapped_range()
                .map_err(|e| self.gpu_error("synchronize", format!("mapping the error flag failed: {e}")))?;
            bytemuck::pod_read_unaligned(&view[..32])
        };
        staging.unmap();
        self.report_flag(flag)
    }

    /// Turn a set error flag into the error the CPU backend would have raised, and clear it.
    fn report_flag(&self, flag: [u32; 8]) -> Result<()> {
        if flag[0] == 0 {
            return Ok(());
        }
        self.ctx.queue().write_buffer(&self.error_flag, 0, &[0u8; 32]);
        let op = ERR_OPS.get(flag[0] as usize).copied().unwrap_or("kernel");
        let index = (flag[1] as u64 | ((flag[2] as u64) << 32)) as i64;
        Err(TensorError::IndexOutOfRange { op, index, dim: flag[3] as usize, size: flag[4] as usize })
    }
}
