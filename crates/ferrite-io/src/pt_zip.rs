//! PyTorch's zip checkpoint format (`torch.save` since 1.6).
//!
//! The archive holds `<name>/data.pkl` (the object tree, tensors as persistent ids) and one record
//! `<name>/data/<key>` per storage. PyTorch stores records uncompressed and 64-byte aligned, so
//! each storage is a slice of the mapped file: nothing is copied, and a storage shared by several
//! views is one slice they all point into. Every record's CRC-32 is checked when it is used, so a
//! flipped bit in the weights is an error instead of a silently different model.

use std::collections::HashMap;
use std::io::Cursor;

use bytes::Bytes;
use zip::{CompressionMethod, ZipArchive};

use crate::error::{IoError, Result};
use crate::pickle::{self, StorageRef};
use crate::value::Value;

fn zip_err(e: zip::result::ZipError) -> IoError {
    IoError::Zip { reason: e.to_string() }
}

/// Reads a zip-format `.pt` file held in `file`.
pub(crate) fn read(file: &Bytes) -> Result<Value> {
    let mut archive = Archive::open(file)?;
    let prefix = archive.prefix()?;
    if let Some(order) = archive.record(&format!("{prefix}byteorder"))? {
        let order = String::from_utf8_lossy(&order).trim().to_string();
        if order != "little" {
            return Err(IoError::ByteOrder { byteorder: order });
        }
    }
    let pkl_name = format!("{prefix}data.pkl");
    let pkl = archive.record(&pkl_name)?.ok_or(IoError::MissingRecord { name: pkl_name })?;
    let program = pickle::run(&pkl)?;
    let mut cache: HashMap<String, Bytes> = HashMap::new();
    program.to_value(pkl.len(), &mut |s: &StorageRef| {
        if let Some(b) = cache.get(&s.key) {
            return Ok(b.clone());
        }
        let name = format!("{prefix}data/{}", s.key);
        let record = archive.record(&name)?.ok_or_else(|| IoError::MissingStorage { key: s.key.clone() })?;
        let es = s.dtype.map(|d| d.size_in_bytes()).unwrap_or(1) as u128;
        let needed = s.numel as u128 * es;
        if needed > record.len() as u128 {
            return Err(IoError::SizeExceedsData {
                what: format!("storage `{}` ({} elements)", s.key, s.numel),
                claimed: needed,
                available: record.len() as u128,
            });
        }
        let b = record.slice(..needed as usize);
        cache.insert(s.key.clone(), b.clone());
        Ok(b)
    })
}

struct Archive<'f> {
    file: &'f Bytes,
    zip: ZipArchive<Cursor<&'f [u8]>>,
}

impl<'f> Archive<'f> {
    fn open(file: &'f Bytes) -> Result<Archive<'f>> {
        let zip = ZipArchive::new(Cursor::new(&file[..])).map_err(zip_err)?;
        Ok(Archive { file, zip })
    }

    /// The top folder (`"name/"`) that holds `data.pkl`.
    fn prefix(&self) -> Result<String> {
        self.zip
            .file_names()
            .filter_map(|n| n.strip_suffix("data.pkl"))
            .find(|p| p.is_empty() || (p.ends_with('/') && p.matches('/').count() == 1))
            .map(str::to_string)
            .ok_or(IoError::MissingRecord { name: "<archive>/data.pkl".to_string() })
    }

    /// The bytes of a stored record (a slice of the file), CRC-checked; `None` if absent.
    fn record(&mut self, name: &str) -> Result<Option<Bytes>> {
        let Some(index) = self.zip.index_for_name(name) else {
            return Ok(None);
        };
        let entry = self.zip.by_index_raw(index).map_err(zip_err)?;
        if entry.compression() != CompressionMethod::Stored {
            return Err(IoError::CompressedRecord { name: name.to_string(), method: entry.compression().to_string() });
        }
        let start =
            entry.data_start().ok_or_else(|| IoError::Zip { reason: format!("record `{name}` has no data offset") })?;
        let size = entry.compressed_size();
        if entry.size() != size {
            return Err(IoError::Zip { reason: format!("stored record `{name}` has different sizes in its headers") });
        }
        let end = start as u128 + size as u128;
        if end > self.file.len() as u128 {
            return Err(IoError::SizeExceedsData {
                what: format!("zip record `{name}` (ending at byte {end})"),
                claimed: end,
                available: self.file.len() as u128,
            });
        }
        let bytes = self.file.slice(start as usize..end as usize);
        let crc = crc32fast::hash(&bytes);
        if crc != entry.crc32() {
            return Err(IoError::Zip {
                reason: format!(
                    "record `{name}` fails its CRC-32 check (stored {:08x}, computed {crc:08x})",
                    entry.crc32()
                ),
            });
        }
        Ok(Some(bytes))
    }
}
