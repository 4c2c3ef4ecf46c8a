//! Opening a checkpoint file as shared bytes backed by a memory map.
//!
//! Mapping instead of reading means a multi-gigabyte checkpoint costs no copy to open, tensors can
//! point straight into the file (`bytes::Bytes` keeps the map alive as long as any tensor uses it),
//! and a loader that only needs shapes (the `meta` device) never touches the data pages.

use std::fs::File;
use std::path::Path;

use bytes::Bytes;

use crate::error::{IoError, Result};

/// The whole file as shared bytes (memory-mapped; empty files give empty bytes).
pub fn map_file(path: impl AsRef<Path>) -> Result<Bytes> {
    let path = path.as_ref();
    let file = File::open(path).map_err(|e| IoError::os("open", path, e))?;
    let len = file.metadata().map_err(|e| IoError::os("stat", path, e))?.len();
    if len == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the map is read-only and every byte is treated as untrusted input (all offsets and
    // lengths read from it are bounds-checked). The remaining hazard of any file mapping — another
    // process truncating or rewriting the file while it is mapped — is excluded by how ferrite
    // writes checkpoints: a new version is written to a temporary file and renamed over the old
    // one, which leaves the mapped inode untouched.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| IoError::os("memory-map", path, e))?;
    Ok(Bytes::from_owner(map))
}
