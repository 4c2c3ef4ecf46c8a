//! The IDX container format of MNIST and Fashion-MNIST.
//!
//! Layout: two zero bytes, an element-type byte (0x08 = unsigned byte), the number of
//! dimensions, one big-endian `u32` per dimension, then the elements in row-major order. Files
//! arrive from package managers and mirrors, so every field is checked and a bad file is a typed
//! error that says what is wrong — never a panic or a silently short dataset.

use std::path::Path;

use crate::error::DataError;
use crate::file_bytes::read_maybe_gz;

/// An IDX array of unsigned bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxArray {
    pub dims: Vec<usize>,
    pub data: Vec<u8>,
}

/// Element type code for unsigned bytes, the only one (Fashion-)MNIST uses.
pub const IDX_U8: u8 = 0x08;

/// Read an IDX file (gzipped or not).
pub fn read_idx(path: &Path) -> Result<IdxArray, DataError> {
    let bytes = read_maybe_gz(path)?;
    parse_idx(&bytes, path)
}

/// Parse IDX bytes; `path` is only used in error messages.
pub fn parse_idx(bytes: &[u8], path: &Path) -> Result<IdxArray, DataError> {
    let invalid = |reason: String| DataError::InvalidIdx { path: path.to_path_buf(), reason };
    if bytes.len() < 4 {
        return Err(invalid(format!("{} bytes is shorter than the 4-byte magic number", bytes.len())));
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        return Err(invalid(format!(
            "bad magic number {:02x}{:02x}{:02x}{:02x}: an IDX file starts with two zero bytes",
            bytes[0], bytes[1], bytes[2], bytes[3]
        )));
    }
    let kind = bytes[2];
    if kind != IDX_U8 {
        let name = match kind {
            0x09 => "signed byte",
            0x0B => "i16",
            0x0C => "i32",
            0x0D => "f32",
            0x0E => "f64",
            _ => "unknown",
        };
        return Err(invalid(format!(
            "element type 0x{kind:02x} ({name}) is not supported; expected 0x08 (unsigned byte)"
        )));
    }
    let ndim = usize::from(bytes[3]);
    if ndim == 0 {
        return Err(invalid("the header declares 0 dimensions".into()));
    }
    let header = 4 + 4 * ndim;
    if bytes.len() < header {
        return Err(invalid(format!(
            "the header needs {header} bytes for {ndim} dimensions but the file has {}",
            bytes.len()
        )));
    }
    let dims: Vec<usize> =
        bytes[4..header].chunks_exact(4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize).collect();
    let expected = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(|| invalid(format!("dimensions {dims:?} overflow")))?;
    let actual = (bytes.len() - header) as u64;
    if actual < expected {
        return Err(DataError::TruncatedIdx { path: path.to_path_buf(), expected, actual });
    }
    if actual > expected {
        return Err(invalid(format!(
            "{} bytes follow the {expected} data bytes that dimensions {dims:?} announce",
            actual - expected
        )));
    }
    Ok(IdxArray { dims, data: bytes[header..].to_vec() })
}

/// Encode an unsigned-byte IDX array (for tests and for writing subsets).
pub fn encode_idx(dims: &[usize], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, IDX_U8, dims.len() as u8];
    for &d in dims {
        out.extend_from_slice(&(d as u32).to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_typed_errors() {
        let p = Path::new("x.idx");
        let bytes = encode_idx(&[2, 3], &[1, 2, 3, 4, 5, 6]);
        assert_eq!(parse_idx(&bytes, p).unwrap(), IdxArray { dims: vec![2, 3], data: vec![1, 2, 3, 4, 5, 6] });

        let mut bad_magic = bytes.clone();
        bad_magic[0] = 0x1f;
        let e = parse_idx(&bad_magic, p).unwrap_err();
        assert!(e.to_string().contains("magic"), "{e}");

        let mut f32_file = bytes.clone();
        f32_file[2] = 0x0D;
        assert!(parse_idx(&f32_file, p).unwrap_err().to_string().contains("f32"));

        let e = parse_idx(&bytes[..bytes.len() - 2], p).unwrap_err();
        assert!(matches!(e, DataError::TruncatedIdx { expected: 6, actual: 4, .. }), "{e}");

        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(parse_idx(&long, p), Err(DataError::InvalidIdx { .. })));
        assert!(matches!(parse_idx(&[0, 0, 8], p), Err(DataError::InvalidIdx { .. })));
        assert!(matches!(parse_idx(&[0, 0, 8, 0], p), Err(DataError::InvalidIdx { .. })));
        assert!(matches!(parse_idx(&[0, 0, 8, 3, 0, 0], p), Err(DataError::InvalidIdx { .. })));
    }

    proptest! {
        #[test]
        fn any_prefix_or_garbage_is_an_error_not_a_panic(data in proptest::collection::vec(any::<u8>(), 0..64), cut in 0usize..80) {
            let p = Path::new("fuzz.idx");
            let _ = parse_idx(&data, p);
            let bytes = encode_idx(&[4, 4], &[7u8; 16]);
            let cut = cut.min(bytes.len());
            let r = parse_idx(&bytes[..cut], p);
            prop_assert_eq!(r.is_ok(), cut == bytes.len());
        }
    }
}
