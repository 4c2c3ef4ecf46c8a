//! The one error type of the memory layer.
use thiserror::Error;

use crate::oom::OutOfMemoryReport;

/// Every failure the memory layer can report.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum MemoryError {
    /// A device string that does not name a device.
    #[error("invalid device `{spec}`: {reason}")]
    InvalidDevice { spec: String, reason: String },
    /// An allocation the device cannot satisfy — its capacity, as ferrite accounts for it, or the
    /// memory fraction would be exceeded, or the host cannot back it — with the full picture and
    /// a diagnosis (see [`OutOfMemoryReport`]; its `Display` starts like PyTorch's OOM message).
    /// Not retryable: the allocator has already released its cache and tried again, so the same
    /// request fails until live tensors are freed or the workload shrinks.
    #[error("{report}")]
    OutOfMemory { report: Box<OutOfMemoryReport> },
    /// A GPU driver refused a new buffer where ferrite's accounting had room (or the capacity is
    /// unknown): the card's memory is used up by other processes, or buffers freed a moment ago
    /// are not yet back with the driver. The allocator has released its cache and retried once;
    /// the memory may come back, so this is [retryable](MemoryError::is_retryable). The report
    /// (`driver_refused` set) carries the same picture and suggestions as an out-of-memory error.
    #[error("{report}")]
    DriverRefused { report: Box<OutOfMemoryReport> },
    /// An allocator option (`FERRITE_ALLOC_CONF` / [`crate::AllocatorConfig`]) that is unknown or
    /// has a bad value.
    #[error("invalid allocator option `{key}`{}: {reason}", if value.is_empty() { String::new() } else { format!(" = `{value}`") })]
    InvalidConfig { key: String, value: String, reason: String },
    /// A request the allocator refuses whatever the device: more than 1 EiB.
    #[error("cannot allocate {requested} bytes on {device}: requests of 1 EiB or more are refused")]
    RequestTooLarge { device: String, requested: u64 },
    /// A GPU that cannot be used: no adapter, an index past the last one, a driver that refused
    /// to create the device, or a device lost mid-run. The reason says what exists and what to do.
    #[error("{device} is not available: {reason}")]
    GpuUnavailable { device: String, reason: String },
    /// A `gpu:N` device in a build without GPU support (the `gpu` cargo feature is off).
    #[error(
        "{device} needs GPU support, which this build of ferrite lacks: it was compiled without the `gpu` cargo feature. Rebuild with `--features gpu` (the `ferrite` binary has it by default; a library user adds `features = [\"gpu\"]` to the ferrite dependency)"
    )]
    GpuNotCompiled { device: String },
    /// A single allocation larger than the largest buffer the GPU can create.
    #[error(
        "cannot allocate {requested} bytes on {device}: larger than the largest buffer this GPU can create ({max} bytes, the adapter's max_buffer_size); split the tensor or use a smaller batch"
    )]
    BufferTooLarge { device: String, requested: u64, max: u64 },
    /// A visible-device list (`--devices`, `FERRITE_VISIBLE_DEVICES`) that is empty, garbage, has
    /// a duplicate or names a device this machine does not have.
    #[error(
        "invalid device list `{list}`: {reason}; valid indices: {valid} (write e.g. `--devices 0,1` or FERRITE_VISIBLE_DEVICES=0,1)"
    )]
    InvalidDeviceList { list: String, reason: String, valid: String },
    /// `cuda:N` (or a CUDA listing) where the NVIDIA driver library cannot be loaded: no NVIDIA
    /// driver on this machine, or not on the loader's path. `tried` lists the library names.
    #[error(
        "{device} is not available: the NVIDIA CUDA driver library was not found (tried {tried}). On a machine with an NVIDIA GPU, install the NVIDIA driver (it provides libcuda.so.1; `nvidia-smi` works once it is in place) or add the directory holding libcuda.so.1 to LD_LIBRARY_PATH; without an NVIDIA GPU use `gpu:N` (any GPU through Vulkan, Metal or DX12), `cpu`, or `sim:<gpu>` to simulate one"
    )]
    CudaDriverNotFound { device: String, tried: String },
    /// The NVIDIA driver is older than ferrite needs (its CUDA version, or an entry point it
    /// lacks).
    #[error(
        "{device} is not available: {found}, and ferrite needs a driver for CUDA {required} or newer. Update the NVIDIA driver (`nvidia-smi` shows the installed version and the CUDA version it supports)"
    )]
    CudaDriverTooOld { device: String, found: String, required: String },
    /// A CUDA driver call failed where it should not (initialisation, creating the context).
    /// (The driver's error is boxed: this enum is carried inside every crate's error, which must
    /// stay small.)
    #[error(
        "{device} is not available: the CUDA driver call {} failed with {} ({}). {advice}",
        error.call,
        error.name,
        error.code
    )]
    CudaDriverFailed { device: String, error: Box<crate::cuda::CudaDriverError>, advice: &'static str },
    /// A `cuda:N` past the CUDA devices this process sees (after `CUDA_VISIBLE_DEVICES` and
    /// `FERRITE_VISIBLE_DEVICES`).
    #[error("{device} does not exist: {reason}")]
    CudaDeviceMissing { device: String, visible: usize, reason: String },
    /// `CUDA_VISIBLE_DEVICES` is set and makes no GPU visible; `reason` names the entry that ended
    /// the list, read as CUDA reads it.
    #[error(
        "{device} is not available: CUDA_VISIBLE_DEVICES=`{value}` makes no GPU visible: {reason}. Set it to indices or UUIDs of this machine's GPUs (`nvidia-smi -L` lists them), or unset it"
    )]
    CudaNoVisibleDevice { device: String, value: String, reason: String },
    /// Pinned (page-locked) host memory the driver refused, after the pinned cache was freed and
    /// the request retried (or after an earlier driver failure).
    #[error(
        "cannot allocate {} of pinned host memory ({} held by ferrite's pinned cache): {reason}. Stage fewer or smaller batches in pinned memory, or free the cache (empty_cache)",
        crate::format_size(*requested),
        crate::format_size(*held)
    )]
    PinnedHostFailed { requested: u64, held: u64, reason: String },
    /// An allocation trace that cannot be replayed.
    #[error("invalid allocation trace: {reason}")]
    InvalidTrace { reason: String },
}

impl MemoryError {
    /// The OOM report, if this is an out-of-memory error (capacity exceeded or driver refusal).
    pub fn oom_report(&self) -> Option<&OutOfMemoryReport> {
        match self {
            MemoryError::OutOfMemory { report } | MemoryError::DriverRefused { report } => Some(report),
            _ => None,
        }
    }

    /// Whether the same request may succeed later without the caller freeing anything: only a
    /// driver's refusal ([`MemoryError::DriverRefused`]), whose memory other processes or the
    /// driver may give back.
    pub fn is_retryable(&self) -> bool {
        matches!(self, MemoryError::DriverRefused { .. })
    }
}
