//! Reading any checkpoint ferrite understands into a [`Value`] tree.
//!
//! The format is recognised from the file's first bytes, so callers (and `ferrite inspect`) need
//! not care whether a `.pt` file is zip or legacy, or whether a `.safetensors` file is a plain
//! state_dict or a ferrite training checkpoint.

use std::path::Path;

use bytes::Bytes;

use crate::checkpoint_format;
use crate::error::Result;
use crate::format::{FileFormat, detect_format};
use crate::mapped_file::map_file;
use crate::safetensors_format::read_safetensors_bytes;
use crate::value::Value;
use crate::{pt_legacy, pt_zip};

/// Reads a `.pt`/`.pth` (zip or legacy), a safetensors file or a ferrite checkpoint.
///
/// PyTorch files give their pickled tree (a state_dict is a dict of tensors; a training
/// checkpoint a nested dict); plain safetensors files give a dict of tensors in file order;
/// ferrite checkpoints give the tree that was saved. Tensors point into the memory-mapped file.
pub fn read(path: impl AsRef<Path>) -> Result<Value> {
    let path = path.as_ref();
    read_bytes_named(&map_file(path)?, path)
}

/// [`read`], also reporting which container format the file was.
pub fn read_with_format(path: impl AsRef<Path>) -> Result<(FileFormat, Value)> {
    let path = path.as_ref();
    let bytes = map_file(path)?;
    let format = detect_format(&bytes, path)?;
    Ok((format, read_bytes_named(&bytes, path)?))
}

/// [`read`] for bytes already in memory.
pub fn read_bytes(bytes: &Bytes) -> Result<Value> {
    read_bytes_named(bytes, Path::new("<memory>"))
}

fn read_bytes_named(bytes: &Bytes, path: &Path) -> Result<Value> {
    match detect_format(bytes, path)? {
        FileFormat::PyTorchZip => pt_zip::read(bytes),
        FileFormat::PyTorchLegacy => pt_legacy::read(bytes),
        FileFormat::Safetensors => {
            let file = read_safetensors_bytes(bytes)?;
            let plain: Vec<(Value, Value)> =
                file.tensors.iter().map(|(n, t)| (Value::Str(n.clone()), Value::Tensor(t.clone()))).collect();
            Ok(checkpoint_format::decode(file)?.unwrap_or(Value::Dict(plain)))
        }
    }
}
