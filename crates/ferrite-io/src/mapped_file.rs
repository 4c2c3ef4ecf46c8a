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
    require_file(path)?;
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

/// Fails with [`IoError::NotAFile`] when `path` names a directory, a pipe, a socket or a device
/// (none of which can be memory-mapped or replaced atomically), and with the operating system's
/// error when it cannot be inspected. A path that does not exist passes: opening it reports that.
pub fn require_file(path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(IoError::os("inspect", path, e)),
    };
    let ft = meta.file_type();
    let found = if ft.is_file() {
        return Ok(());
    } else if ft.is_dir() {
        "directory"
    } else {
        special_kind(&ft)
    };
    Err(IoError::NotAFile { path: path.to_path_buf(), found })
}

#[cfg(unix)]
fn special_kind(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_fifo() {
        "named pipe"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_block_device() || ft.is_char_device() {
        "device"
    } else {
        "special file"
    }
}

#[cfg(not(unix))]
fn special_kind(_: &std::fs::FileType) -> &'static str {
    "special file"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_and_devices_are_named_not_mapped() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("some_dir.pt");
        std::fs::create_dir(&d).unwrap();
        let err = map_file(&d).unwrap_err();
        assert!(matches!(err, IoError::NotAFile { found: "directory", .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("some_dir.pt` is a directory, not a file") && !msg.contains("os error"), "{msg}");
        #[cfg(unix)]
        {
            let err = map_file("/dev/null").unwrap_err();
            assert!(matches!(err, IoError::NotAFile { found: "device", .. }), "{err}");
        }
        assert!(matches!(map_file(dir.path().join("missing.pt")), Err(IoError::Os { op: "open", .. })));
        std::fs::write(dir.path().join("f.pt"), b"x").unwrap();
        assert!(require_file(dir.path().join("f.pt")).is_ok());
    }
}
