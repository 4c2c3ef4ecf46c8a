//! Recognising a checkpoint file from its first bytes (never from its extension alone: `.pt`
//! files come in two container formats and people rename files).

use std::path::Path;

use crate::error::{IoError, Result};

/// The container formats ferrite reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// `torch.save` since PyTorch 1.6: a zip archive with `data.pkl` and one record per storage.
    PyTorchZip,
    /// `torch.save(..., _use_new_zipfile_serialization=False)` and PyTorch < 1.6: a sequence of
    /// pickles followed by raw storages.
    PyTorchLegacy,
    /// A safetensors file (a little-endian header length, a JSON header, then raw tensor data).
    Safetensors,
}

impl FileFormat {
    /// A short human-readable name (`ferrite inspect` prints it).
    pub fn name(self) -> &'static str {
        match self {
            FileFormat::PyTorchZip => "pytorch-zip",
            FileFormat::PyTorchLegacy => "pytorch-legacy",
            FileFormat::Safetensors => "safetensors",
        }
    }
}

/// The first pickle of a legacy file: protocol 2, the 80-bit magic number 0x1950a86a20f9469cfc6c.
pub(crate) const LEGACY_MAGIC_PICKLE: [u8; 15] =
    [0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, b'.'];

/// Identifies the format of `bytes` (the start of a file named `path`, for messages).
pub fn detect_format(bytes: &[u8], path: &Path) -> Result<FileFormat> {
    let unknown = |reason: String| IoError::UnknownFormat { path: path.to_path_buf(), reason };
    if bytes.is_empty() {
        return Err(unknown("the file is empty (0 bytes); it was probably cut off while being written".into()));
    }
    if bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06") {
        return Ok(FileFormat::PyTorchZip);
    }
    if bytes.starts_with(&LEGACY_MAGIC_PICKLE) {
        return Ok(FileFormat::PyTorchLegacy);
    }
    if bytes.len() >= 9 && bytes[8] == b'{' {
        return Ok(FileFormat::Safetensors);
    }
    if bytes.len() > 262 && &bytes[257..262] == b"ustar" {
        return Err(unknown("it is a tar archive (the pre-0.4 torch.save format), which is not supported; re-save it with a current PyTorch".into()));
    }
    let head: String = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ");
    Err(unknown(format!(
        "unrecognised leading bytes [{head}]; expected a zip archive (torch.save, PyTorch >= 1.6), a legacy torch.save pickle, or a safetensors header"
    )))
}
