use thiserror::Error;

/// Every failure the memory layer can report.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum MemoryError {
    /// A device string that does not name a device.
    #[error("invalid device `{spec}`: {reason}")]
    InvalidDevice { spec: String, reason: String },
    /// An allocation that the device cannot satisfy.
    #[error("out of memory on {device}: tried to allocate {requested} bytes")]
    OutOfMemory { device: String, requested: u64 },
}
