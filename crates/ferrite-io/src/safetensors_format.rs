//! safetensors files: the interchange format for weights.
//!
//! safetensors is a JSON header plus raw little-endian data, readable by PyTorch, Hugging Face
//! tools, JAX and numpy without any code execution, and loadable by memory map. Parsing and
//! validation of the header are the `safetensors` crate's; this module maps its dtypes to ferrite's,
//! hands out tensors that point into the mapped file, and writes files through [`AtomicFile`] with
//! the same layout the reference implementation produces (tensors sorted by alignment then name,
//! header padded to 8 bytes) plus `"format": "pt"` metadata, which Hugging Face loaders expect.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

use bytes::Bytes;
use ferrite_tensor::DType;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensors};

use crate::atomic_file::AtomicFile;
use crate::error::{IoError, Result};
use crate::mapped_file::map_file;
use crate::raw_tensor::RawTensor;

/// The contents of a safetensors file: tensors in file order and the `__metadata__` strings.
#[derive(Debug, Clone)]
pub struct SafetensorsFile {
    pub tensors: Vec<(String, RawTensor)>,
    pub metadata: BTreeMap<String, String>,
}

fn st_err(e: safetensors::SafeTensorError) -> IoError {
    IoError::Safetensors { reason: e.to_string() }
}

pub(crate) fn to_st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I64 => Dtype::I64,
        DType::I32 => Dtype::I32,
        DType::U8 => Dtype::U8,
        DType::Bool => Dtype::BOOL,
    }
}

fn from_st_dtype(d: Dtype, name: &str) -> Result<DType> {
    Ok(match d {
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I64 => DType::I64,
        Dtype::I32 => DType::I32,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool,
        other => return Err(IoError::UnsupportedDType { dtype: format!("{other:?}"), name: Some(name.to_string()) }),
    })
}

/// Reads a safetensors file by memory map; tensors point into the map.
pub fn read_safetensors(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
    read_safetensors_bytes(&map_file(path)?)
}

/// Reads safetensors data held in `bytes` (tensors share `bytes`).
pub fn read_safetensors_bytes(bytes: &Bytes) -> Result<SafetensorsFile> {
    // Check the header length against the file first, so a header claiming petabytes is reported
    // as such (the crate would also refuse it, less specifically).
    let head = bytes.get(..8).ok_or_else(|| IoError::SizeExceedsData {
        what: "the safetensors header length field".to_string(),
        claimed: 8,
        available: bytes.len() as u128,
    })?;
    let mut a = [0u8; 8];
    a.copy_from_slice(head);
    let n = u64::from_le_bytes(a);
    if n as u128 > bytes.len() as u128 - 8 {
        return Err(IoError::SizeExceedsData {
            what: "the safetensors header length".to_string(),
            claimed: n as u128,
            available: bytes.len() as u128 - 8,
        });
    }
    let (n, meta) = SafeTensors::read_metadata(bytes).map_err(st_err)?;
    let data_start = 8 + n;
    let mut tensors = Vec::new();
    for name in meta.offset_keys() {
        let Some(info) = meta.info(&name) else { continue };
        let dtype = from_st_dtype(info.dtype, &name)?;
        let (s, e) = info.data_offsets;
        // `read_metadata` validated that offsets are contiguous and end exactly at the file end.
        let slice = bytes.slice(data_start + s..data_start + e);
        let t = RawTensor::from_contiguous_bytes(dtype, info.shape.clone(), slice)?;
        tensors.push((name, t));
    }
    let metadata = meta.metadata().clone().unwrap_or_default().into_iter().collect();
    Ok(SafetensorsFile { tensors, metadata })
}

/// Writes `tensors` (names must be unique) and `metadata` to `path` atomically. Views are
/// written as contiguous copies of their elements.
pub fn write_safetensors<'a>(
    path: impl AsRef<Path>,
    tensors: impl IntoIterator<Item = (&'a str, &'a RawTensor)>,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    write_entries_atomically(path, tensors.into_iter().collect(), metadata)
}

pub(crate) fn write_entries_atomically<D: TensorData>(
    path: impl AsRef<Path>,
    list: Vec<(&str, &D)>,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let mut f = AtomicFile::create(path)?;
    write_entries(&mut f, list, metadata).map_err(|e| match e {
        IoError::Os { op, source, .. } => IoError::Os { op, path: f.temp_path().to_path_buf(), source },
        other => other,
    })?;
    f.commit()
}

/// Streams a safetensors file to `out`.
pub fn write_safetensors_to<'a>(
    out: &mut impl Write,
    tensors: impl IntoIterator<Item = (&'a str, &'a RawTensor)>,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    write_entries(out, tensors.into_iter().collect(), metadata)
}

/// What the safetensors writer needs of a tensor: its header entry and its elements. Implemented
/// by [`RawTensor`] and by ferrite's `Tensor` (whose elements are copied out one tensor at a time,
/// so saving a model costs at most one extra tensor of host memory).
pub(crate) trait TensorData {
    fn dtype(&self) -> DType;
    fn shape(&self) -> &[usize];
    /// Writes the elements row-major as little-endian bytes: exactly numel × element size bytes.
    fn write_elements<W: Write>(&self, out: &mut W) -> Result<()>;

    fn nbytes(&self) -> usize {
        self.shape().iter().product::<usize>() * self.dtype().size_in_bytes()
    }
}

impl TensorData for RawTensor {
    fn dtype(&self) -> DType {
        RawTensor::dtype(self)
    }
    fn shape(&self) -> &[usize] {
        RawTensor::shape(self)
    }
    fn write_elements<W: Write>(&self, out: &mut W) -> Result<()> {
        out.write_all(&self.contiguous_bytes()).map_err(|e| IoError::os("write", "<safetensors output>", e))
    }
}

pub(crate) fn write_entries<D: TensorData>(
    out: &mut impl Write,
    mut list: Vec<(&str, &D)>,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    // Largest alignment first, then by name: every tensor starts aligned to its element size.
    list.sort_by(|(ln, lt), (rn, rt)| rt.dtype().size_in_bytes().cmp(&lt.dtype().size_in_bytes()).then(ln.cmp(rn)));
    for w in list.windows(2) {
        if w[0].0 == w[1].0 {
            return Err(IoError::structure(w[0].0, "the same tensor name appears twice"));
        }
    }
    let mut infos = Vec::with_capacity(list.len());
    let mut offset = 0usize;
    for (name, t) in &list {
        let n = t.nbytes();
        infos.push((
            name.to_string(),
            TensorInfo { dtype: to_st_dtype(t.dtype()), shape: t.shape().to_vec(), data_offsets: (offset, offset + n) },
        ));
        offset += n;
    }
    let mut meta: HashMap<String, String> = metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    meta.entry("format".to_string()).or_insert_with(|| "pt".to_string());
    let header = Metadata::new(Some(meta), infos).map_err(st_err)?;
    let mut header =
        serde_json::to_string(&header).map_err(|e| IoError::Safetensors { reason: e.to_string() })?.into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    let os = |e| IoError::os("write", "<safetensors output>", e);
    out.write_all(&(header.len() as u64).to_le_bytes()).map_err(os)?;
    out.write_all(&header).map_err(os)?;
    for (_, t) in &list {
        t.write_elements(out)?;
    }
    out.flush().map_err(os)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_in_memory() {
        let a = RawTensor::from_values(vec![2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let b = RawTensor::from_values(vec![3], &[7i64, 8, 9]).unwrap();
        let c = RawTensor::from_values(vec![2], &[true, false]).unwrap();
        let mut buf = Vec::new();
        let mut meta = BTreeMap::new();
        meta.insert("k".to_string(), "v".to_string());
        write_safetensors_to(&mut buf, [("a", &a), ("b", &b), ("c", &c)], &meta).unwrap();
        let back = read_safetensors_bytes(&Bytes::from(buf)).unwrap();
        let names: Vec<&str> = back.tensors.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["b", "a", "c"], "sorted by alignment, then name");
        assert_eq!(back.tensors[1].1, a);
        assert_eq!(back.tensors[0].1.to_vec::<i64>().unwrap(), vec![7, 8, 9]);
        assert_eq!(back.metadata.get("format").map(String::as_str), Some("pt"));
        assert_eq!(back.metadata.get("k").map(String::as_str), Some("v"));
    }

    #[test]
    fn header_claiming_petabytes_is_refused_without_allocating() {
        let mut f = (1u64 << 50).to_le_bytes().to_vec();
        f.extend_from_slice(b"{}      ");
        let err = read_safetensors_bytes(&Bytes::from(f)).unwrap_err();
        assert!(matches!(err, IoError::SizeExceedsData { claimed, .. } if claimed == 1 << 50), "{err}");
    }

    #[test]
    fn duplicate_names_are_refused() {
        let a = RawTensor::from_values(vec![1], &[1.0f32]).unwrap();
        let err = write_safetensors_to(&mut Vec::new(), [("a", &a), ("a", &a)], &BTreeMap::new()).unwrap_err();
        assert!(err.to_string().contains("twice"));
    }
}
