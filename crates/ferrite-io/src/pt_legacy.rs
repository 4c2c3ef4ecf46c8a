//! PyTorch's legacy (pre-1.6, non-zip) checkpoint format.
//!
//! Layout: five pickles back to back — the magic number, the protocol version (1001), a `sys_info`
//! dict (byte order, type sizes), the object tree (tensors as persistent ids), and the list of
//! storage keys — followed, for each key in that list, by an 8-byte little-endian element count and
//! the storage's raw bytes. The element size of each storage comes from the storage class named in
//! the object tree, so the tree is unpickled first and materialised once the data has been located.

use std::collections::HashMap;

use bytes::Bytes;

use crate::error::{IoError, Result};
use crate::format::LEGACY_MAGIC_PICKLE;
use crate::pickle::{self, StorageRef, unpickle_plain};
use crate::value::Value;

const PROTOCOL_VERSION: i64 = 1001;

/// Reads a legacy-format `.pt` file held in `file`.
pub(crate) fn read(file: &Bytes) -> Result<Value> {
    if !file.starts_with(&LEGACY_MAGIC_PICKLE) {
        return Err(IoError::Pickle { offset: 0, reason: "missing the legacy torch.save magic number".into() });
    }
    let mut pos = LEGACY_MAGIC_PICKLE.len();

    let (protocol, n) = at(file, pos, unpickle_plain)?;
    pos += n;
    if protocol.as_int() != Some(PROTOCOL_VERSION) {
        return Err(IoError::Pickle {
            offset: pos,
            reason: format!("unsupported legacy protocol version {protocol:?}"),
        });
    }

    let (sys_info, n) = at(file, pos, unpickle_plain)?;
    pos += n;
    if sys_info.get("little_endian").and_then(Value::as_bool) == Some(false) {
        return Err(IoError::ByteOrder { byteorder: "big".into() });
    }

    let data_start = pos;
    let program = at(file, pos, |d| {
        pickle::run(d).map(|p| {
            let end = p.end;
            (p, end)
        })
    })?
    .0;
    pos += program.end;

    let (keys, n) = at(file, pos, unpickle_plain)?;
    pos += n;
    let keys = keys
        .as_list()
        .ok_or_else(|| IoError::Pickle { offset: pos, reason: "storage key list is not a list".into() })?
        .iter()
        .map(|k| match k {
            Value::Str(s) => Ok(s.clone()),
            Value::Int(i) => Ok(i.to_string()),
            _ => Err(IoError::Pickle { offset: pos, reason: "storage key is not a string".into() }),
        })
        .collect::<Result<Vec<_>>>()?;

    // Element size of each root storage, from the storage class the object tree gave it.
    let mut elem_size: HashMap<&str, usize> = HashMap::new();
    for s in program.storage_refs() {
        elem_size.insert(&s.key, s.dtype.map(|d| d.size_in_bytes()).unwrap_or(1));
    }

    let mut storages: HashMap<String, Bytes> = HashMap::new();
    for key in &keys {
        let es = *elem_size.get(key.as_str()).ok_or_else(|| IoError::MissingStorage { key: key.clone() })?;
        let header = file.get(pos..pos + 8).ok_or_else(|| IoError::SizeExceedsData {
            what: format!("the size field of storage `{key}`"),
            claimed: 8,
            available: file.len().saturating_sub(pos) as u128,
        })?;
        let mut a = [0u8; 8];
        a.copy_from_slice(header);
        let numel = u64::from_le_bytes(a);
        pos += 8;
        let nbytes = numel as u128 * es as u128;
        let left = (file.len() - pos) as u128;
        if nbytes > left {
            return Err(IoError::SizeExceedsData {
                what: format!("storage `{key}` ({numel} elements)"),
                claimed: nbytes,
                available: left,
            });
        }
        storages.insert(key.clone(), file.slice(pos..pos + nbytes as usize));
        pos += nbytes as usize;
    }

    let pkl_len = program.end;
    program
        .to_value(pkl_len, &mut |s: &StorageRef| {
            let b = storages.get(&s.key).ok_or_else(|| IoError::MissingStorage { key: s.key.clone() })?;
            let es = s.dtype.map(|d| d.size_in_bytes()).unwrap_or(1) as u128;
            if s.numel as u128 * es > b.len() as u128 {
                return Err(IoError::SizeExceedsData {
                    what: format!("storage `{}` ({} elements)", s.key, s.numel),
                    claimed: s.numel as u128 * es,
                    available: b.len() as u128,
                });
            }
            Ok(b.clone())
        })
        .map_err(|e| match e {
            IoError::Pickle { offset, reason } => IoError::Pickle { offset: offset + data_start, reason },
            other => other,
        })
}

/// Runs `f` on the file from `pos`, shifting pickle error offsets to file offsets.
fn at<T>(file: &[u8], pos: usize, f: impl FnOnce(&[u8]) -> Result<(T, usize)>) -> Result<(T, usize)> {
    f(file.get(pos..).unwrap_or(&[])).map_err(|e| match e {
        IoError::Pickle { offset, reason } => IoError::Pickle { offset: offset + pos, reason },
        other => other,
    })
}
