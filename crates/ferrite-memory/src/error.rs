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
