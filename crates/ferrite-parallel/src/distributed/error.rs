//! Errors of multi-process training: variants of the crate's one error type,
//! [`crate::ParallelError`] (`DistributedError` is kept as the name distributed code uses).

/// Every failure of the distributed layer is a [`crate::ParallelError`].
pub type DistributedError = crate::ParallelError;

pub type Result<T, E = DistributedError> = std::result::Result<T, E>;
