//! The public caching allocator: one per device, thread-safe, RAII blocks.
//!
//! Every tensor buffer in ferrite comes from [`CachingAllocator::allocate`], so the allocator's
//! statistics are the truth about device memory. The hot path (a cached allocation and its free)
//! takes one uncontended lock each and touches no heap: blocks are arena records found through
//! an ordered free set, and a [`Block`] carries its record index back on drop.
use std::collections::BTreeMap;
use std::panic::Location;
use std::ptr::NonNull;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::allocator_core::AllocatorCore;
use crate::block_pool::NIL;
use crate::raw_memory::{HostMemory, MetaMemory, RawMemory, SimMemory};
use crate::snapshot::MemorySnapshot;
use crate::stats::MemoryStats;
use crate::{AllocatorConfig, Device, MemoryError, TraceEntry};

struct Shared {
    device: Device,
    core: Mutex<AllocatorCore>,
}

/// How a block finds its allocator: registry allocators live for the whole process, so their
/// blocks hold a plain `'static` reference and the hot path does no reference counting;
/// private allocators are reference-counted so they outlive their last block.
#[derive(Clone)]
enum SharedRef {
    Static(&'static Shared),
    Counted(Arc<Shared>),
}

impl std::ops::Deref for SharedRef {
    type Target = Shared;
    #[inline]
    fn deref(&self) -> &Shared {
        match self {
            SharedRef::Static(s) => s,
            SharedRef::Counted(a) => a,
        }
    }
}

/// A caching allocator for one device. Use [`crate::allocator`] for the process-wide one of a
/// device, or the constructors here for a private one (tests, replays, planning).
pub struct CachingAllocator {
    shared: SharedRef,
}

/// A device buffer. Returned to its allocator when dropped.
pub struct Block {
    shared: SharedRef,
    ptr: Option<NonNull<u8>>,
    addr: u64,
    size: usize,
    requested: usize,
    idx: u32,
    stream: u32,
}

// SAFETY: a Block exclusively owns its range of a segment; the pointer is only handed out through
// `host_ptr` (writing through it is the caller's `unsafe` business) and the allocator state it
// returns to on drop is behind a mutex.
unsafe impl Send for Block {}
// SAFETY: `&Block` only exposes plain values and the pointer value, never the bytes.
unsafe impl Sync for Block {}

/// The raw memory of `device`, or why the device cannot be used (a GPU that does not exist).
fn default_backend(device: &Device) -> Result<Box<dyn RawMemory>, MemoryError> {
    Ok(match device {
        Device::Cpu => Box::new(HostMemory::new()),
        Device::Sim { profile, .. } => Box::new(SimMemory::new(profile)),
        Device::Meta => Box::new(MetaMemory::new()),
        #[cfg(feature = "gpu")]
        Device::Gpu { index } => Box::new(crate::gpu::memory::WgpuMemory::new(crate::gpu::context(*index)?)),
        #[cfg(not(feature = "gpu"))]
        Device::Gpu { .. } => return Err(crate::gpu::not_compiled(&device.to_string())),
        Device::Cuda { index } => crate::cuda::open_raw_memory(*index)?,
    })
}

/// An allocator core for `device`; an unusable device gets a core that reports why on every
/// allocation (creating an allocator never fails, so `allocator(&device)` never panics).
fn core_for(device: &Device, config: AllocatorConfig) -> AllocatorCore {
    match default_backend(device) {
        Ok(raw) => AllocatorCore::new(device.clone(), config, raw),
        Err(e) => {
            let mut core = AllocatorCore::new(device.clone(), config, Box::new(MetaMemory::new()));
            core.set_device_error(e);
            core
        }
    }
}

impl CachingAllocator {
    /// A private allocator for `device` with PyTorch's default settings (the environment is not
    /// read; see [`CachingAllocator::from_env`]).
    pub fn new(device: Device) -> Self {
        Self::with_config(device, AllocatorConfig::default())
    }

    /// A private allocator with the given settings.
    pub fn with_config(device: Device, config: AllocatorConfig) -> Self {
        let core = core_for(&device, config);
        CachingAllocator { shared: SharedRef::Counted(Arc::new(Shared { device, core: Mutex::new(core) })) }
    }

    /// A private allocator configured from `FERRITE_ALLOC_CONF`.
    pub fn from_env(device: Device) -> Result<Self, MemoryError> {
        Ok(Self::with_config(device, AllocatorConfig::from_env()?))
    }

    /// An allocator that makes exactly the decisions of the real one for `device` (same capacity,
    /// same addresses layout rules) but backs nothing with memory: for replays and planning.
    /// Its blocks have no host pointer.
    pub fn unbacked(device: Device, config: AllocatorConfig) -> Self {
        let raw: Box<dyn RawMemory> = match &device {
            Device::Sim { profile, .. } => Box::new(SimMemory::unbacked(profile)),
            Device::Cpu => match crate::raw_memory::physical_memory() {
                Some(ram) => Box::new(SimMemory::unbacked(&crate::GpuProfile::custom(ram))),
                None => Box::new(MetaMemory::new()),
            },
            Device::Meta => Box::new(MetaMemory::new()),
            // A GPU of unknown capacity: address-only, capacity from the GPU's context when known.
            #[cfg(feature = "gpu")]
            Device::Gpu { index } => match crate::gpu::context(*index).ok().and_then(|c| c.capacity()) {
                Some(cap) => Box::new(SimMemory::unbacked(&crate::GpuProfile::custom(cap))),
                None => Box::new(MetaMemory::new()),
            },
            #[cfg(not(feature = "gpu"))]
            Device::Gpu { .. } => Box::new(MetaMemory::new()),
            // The card's capacity when the driver can tell it (no context is created for it).
            Device::Cuda { index } => {
                match crate::cuda::cuda_devices(false).ok().and_then(|d| d.into_iter().nth(*index)) {
                    Some(c) => Box::new(SimMemory::unbacked(&crate::GpuProfile::custom(c.total_bytes))),
                    None => Box::new(MetaMemory::new()),
                }
            }
        };
        Self::with_backend(device, config, raw)
    }

    /// An allocator over a custom raw memory backend.
    pub fn with_backend(device: Device, config: AllocatorConfig, raw: Box<dyn RawMemory>) -> Self {
        let core = AllocatorCore::new(device.clone(), config, raw);
        CachingAllocator { shared: SharedRef::Counted(Arc::new(Shared { device, core: Mutex::new(core) })) }
    }

    /// An allocator that is never freed (the registry's): its blocks skip reference counting.
    pub(crate) fn process_lifetime(device: Device, config: AllocatorConfig) -> Self {
        let core = core_for(&device, config);
        let shared: &'static Shared = Box::leak(Box::new(Shared { device, core: Mutex::new(core) }));
        CachingAllocator { shared: SharedRef::Static(shared) }
    }

    pub fn device(&self) -> &Device {
        &self.shared.device
    }

    pub(crate) fn begin_watermark(&self) -> u64 {
        self.shared.core.lock().begin_watermark()
    }

    pub(crate) fn watermark(&self, id: u64) -> Option<(u64, u64)> {
        self.shared.core.lock().watermark(id)
    }

    pub(crate) fn end_watermark(&self, id: u64) -> Option<(u64, u64)> {
        self.shared.core.lock().end_watermark(id)
    }

    /// Allocate `size` bytes (uninitialised) on the default stream. `size == 0` gives an empty
    /// block that touches no statistics.
    #[track_caller]
    #[inline]
    pub fn allocate(&self, size: usize) -> Result<Block, MemoryError> {
        self.allocate_impl(size, 0, Location::caller())
    }

    /// Allocate on a given stream; freed blocks are reused only by the same stream.
    #[track_caller]
    #[inline]
    pub fn allocate_on_stream(&self, size: usize, stream: u32) -> Result<Block, MemoryError> {
        self.allocate_impl(size, stream, Location::caller())
    }

    fn allocate_impl(&self, size: usize, stream: u32, loc: &'static Location<'static>) -> Result<Block, MemoryError> {
        if size == 0 {
            return Ok(Block {
                shared: self.shared.clone(),
                ptr: None,
                addr: 0,
                size: 0,
                requested: 0,
                idx: NIL,
                stream,
            });
        }
        let a = self.shared.core.lock().malloc(size as u64, stream, loc)?;
        Ok(Block {
            shared: self.shared.clone(),
            ptr: a.ptr,
            addr: a.addr,
            size: a.size as usize,
            requested: size,
            idx: a.idx,
            stream,
        })
    }

    /// Bytes held by live blocks (`torch.cuda.memory_allocated`).
    pub fn memory_allocated(&self) -> u64 {
        self.shared.core.lock().stats.allocated_bytes.all.current as u64
    }
    /// Peak of [`Self::memory_allocated`] since creation or the last peak reset.
    pub fn max_memory_allocated(&self) -> u64 {
        self.shared.core.lock().stats.allocated_bytes.all.peak as u64
    }
    /// Bytes reserved in segments (`torch.cuda.memory_reserved`).
    pub fn memory_reserved(&self) -> u64 {
        self.shared.core.lock().stats.reserved_bytes.all.current as u64
    }
    /// Peak of [`Self::memory_reserved`].
    pub fn max_memory_reserved(&self) -> u64 {
        self.shared.core.lock().stats.reserved_bytes.all.peak as u64
    }
    /// Every peak := current.
    pub fn reset_peak_memory_stats(&self) {
        self.shared.core.lock().stats.reset_peaks();
    }
    /// Running totals and event counters := 0.
    pub fn reset_accumulated_memory_stats(&self) {
        self.shared.core.lock().stats.reset_accumulated();
    }
    /// Return every cached segment that holds no live block to the device.
    pub fn empty_cache(&self) {
        self.shared.core.lock().release_cached_blocks();
    }

    /// All statistics (`torch.cuda.memory_stats`, nested).
    pub fn memory_stats(&self) -> MemoryStats {
        self.shared.core.lock().stats.clone()
    }
    /// The flattened view with PyTorch's keys (`allocated_bytes.all.peak`, `num_ooms`, …).
    pub fn memory_stats_flat(&self) -> BTreeMap<String, i64> {
        self.memory_stats().flatten()
    }
    /// The `torch.cuda.memory_summary()` table.
    pub fn memory_summary(&self, abbreviated: bool) -> String {
        let stats = self.memory_stats();
        crate::memory_summary::memory_summary(&stats, &self.shared.device.to_string(), abbreviated)
    }

    /// The settings in force.
    pub fn config(&self) -> AllocatorConfig {
        self.shared.core.lock().config().clone()
    }
    /// Replace the settings (takes effect for the next allocation; cached blocks stay).
    pub fn set_config(&self, config: AllocatorConfig) {
        self.shared.core.lock().set_config(config);
    }
    /// Apply a `PYTORCH_CUDA_ALLOC_CONF`-style string on top of the current settings
    /// (like `torch.cuda.memory._set_allocator_settings`).
    pub fn set_alloc_conf(&self, spec: &str) -> Result<(), MemoryError> {
        let mut core = self.shared.core.lock();
        let mut cfg = core.config().clone();
        cfg.apply(spec)?;
        core.set_config(cfg);
        Ok(())
    }
    pub(crate) fn set_config_error(&self, e: MemoryError) {
        self.shared.core.lock().set_config_error(e);
    }

    /// Cap reserved memory at `fraction × total capacity` (`set_per_process_memory_fraction`).
    pub fn set_per_process_memory_fraction(&self, fraction: f64) -> Result<(), MemoryError> {
        self.shared.core.lock().set_fraction(fraction)
    }
    /// The fraction set by [`Self::set_per_process_memory_fraction`], if any.
    pub fn per_process_memory_fraction(&self) -> Option<f64> {
        self.shared.core.lock().fraction()
    }
    /// `(free, total)` device memory, as `torch.cuda.mem_get_info`; `None` without a fixed capacity.
    pub fn mem_get_info(&self) -> Option<(u64, u64)> {
        self.shared.core.lock().mem_get_info()
    }
    /// Size of the largest cached free block.
    pub fn largest_free_block(&self) -> u64 {
        self.shared.core.lock().largest_free_block()
    }

    /// Start (`Some(max_entries)`) or stop and clear (`None`) recording allocator events.
    pub fn record_memory_history(&self, max_entries: Option<usize>) {
        self.shared.core.lock().record_history(max_entries);
    }
    /// The recorded events, oldest first.
    pub fn memory_history(&self) -> Vec<TraceEntry> {
        self.shared.core.lock().history()
    }
    /// How many events the history holds now (cheap: nothing is copied). A planner marks phases
    /// of a recorded workload with it.
    pub fn memory_history_len(&self) -> usize {
        self.shared.core.lock().history_len()
    }
    /// Segments, blocks, history and settings (`torch.cuda.memory._snapshot`).
    pub fn snapshot(&self) -> MemorySnapshot {
        self.shared.core.lock().snapshot()
    }

    /// Recompute every current statistic from the segments and blocks and compare; also checks
    /// that neighbouring free blocks are merged and blocks tile their segments exactly.
    pub fn check_consistency(&self) -> Result<(), String> {
        self.shared.core.lock().check_consistency()
    }
}

impl std::fmt::Debug for CachingAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingAllocator").field("device", &self.shared.device.to_string()).finish()
    }
}

impl Block {
    /// Device address (fake but unique among live blocks for `meta`).
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Host pointer to the bytes: `Some` for `cpu` and `sim`, `None` for `meta`, unbacked
    /// allocators and empty blocks. At least 512-byte aligned.
    pub fn host_ptr(&self) -> Option<NonNull<u8>> {
        self.ptr
    }
    /// Rounded size in bytes (what the allocator accounts).
    pub fn size(&self) -> usize {
        self.size
    }
    /// Size the caller asked for.
    pub fn requested_size(&self) -> usize {
        self.requested
    }
    pub fn device(&self) -> &Device {
        &self.shared.device
    }
    /// Stream the block was allocated on.
    pub fn stream(&self) -> u32 {
        self.stream
    }
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("device", &self.shared.device.to_string())
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("size", &self.size)
            .field("requested", &self.requested)
            .finish()
    }
}

impl Block {
    /// Mark this block as used by work queued on `stream` too (PyTorch's
    /// `Tensor.record_stream`): when it is freed, the allocator records an event on `stream`
    /// and hands the memory out again only after that event has completed. Needed when a tensor
    /// allocated on one stream is read or written by kernels on another, e.g. a copy stream.
    /// Devices whose streams are synchronous (host, `sim`, `meta`) reuse it at once.
    pub fn record_stream(&self, stream: u32) {
        if self.idx != NIL {
            self.shared.core.lock().record_stream(self.idx, stream);
        }
    }
}

impl CachingAllocator {
    /// Blocks freed by their callers that still wait for events on other streams.
    pub fn pending_free_blocks(&self) -> usize {
        self.shared.core.lock().pending_free_blocks()
    }
}

impl Drop for Block {
    #[inline]
    fn drop(&mut self) {
        if self.idx != NIL {
            self.shared.core.lock().free(self.idx);
        }
    }
}

#[cfg(test)]
mod tests {
    /// The no-GPU build: nothing reaches a GPU — no adapters, and an allocator for `gpu:0` says
    /// why on every allocation (the typed error naming the `gpu` feature).
    #[cfg(not(feature = "gpu"))]
    #[test]
    fn without_the_gpu_feature_a_gpu_allocator_names_the_feature() {
        use crate::{CachingAllocator, Device, MemoryError};

        assert!(crate::gpu::list_adapters().is_empty() && !crate::gpu::COMPILED);
        let a = CachingAllocator::new(Device::Gpu { index: 0 });
        let e = a.allocate(1024).unwrap_err();
        assert!(matches!(e, MemoryError::GpuNotCompiled { .. }), "{e:?}");
        assert!(e.to_string().contains("--features gpu"), "{e}");
    }
}

/// Host-backed memory (`raw_memory`) must make the caching allocator decide what the address-only
/// replay of the same sequence decides: the planner predicts a `cpu` or `sim` run by replaying it
/// unbacked.
#[cfg(test)]
mod replay_agreement {
    use crate::{AllocatorConfig, CachingAllocator, Device, GpuProfile};

    const MIB: usize = 1 << 20;

    /// Two 40 MiB free blocks tie on size; the allocator takes the lower address. Which segment
    /// holds the lower address decides whether the 80 MiB request of the end finds a whole free
    /// segment or reserves a new one. Segments of 80 MiB are above glibc's largest mmap
    /// threshold, so the host places them with `mmap` (top-down on Linux).
    fn peak_reserved(a: &CachingAllocator) -> u64 {
        let p = a.allocate(80 * MIB).unwrap();
        drop(p);
        let l1 = a.allocate(40 * MIB).unwrap(); // first segment: [l1][free 40]
        let m = a.allocate(40 * MIB).unwrap(); // first segment full
        let q = a.allocate(80 * MIB).unwrap(); // second segment
        drop(q);
        let l2 = a.allocate(40 * MIB).unwrap(); // second segment: [l2][free 40]
        drop(m); // first segment: [l1][free 40]; two free 40 MiB blocks tie
        let x = a.allocate(20 * MIB).unwrap();
        drop(l2);
        let y = a.allocate(80 * MIB).unwrap();
        let peak = a.max_memory_reserved();
        drop((l1, x, y));
        a.empty_cache();
        peak
    }

    #[test]
    fn host_backed_allocators_decide_as_their_unbacked_replay() {
        let profile = GpuProfile::custom(1 << 40);
        let replayed = peak_reserved(&CachingAllocator::unbacked(
            Device::Sim { profile: profile.clone(), index: 0 },
            AllocatorConfig::default(),
        ));
        let sim = peak_reserved(&CachingAllocator::new(Device::Sim { profile, index: 0 }));
        let cpu = peak_reserved(&CachingAllocator::new(Device::Cpu));
        assert_eq!((sim, cpu), (replayed, replayed), "sim and cpu against the unbacked replay");
    }
}
