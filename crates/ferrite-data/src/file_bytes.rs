//! Reading data files that may or may not be gzip-compressed.
//!
//! Debian ships Fashion-MNIST and the Jargon File gzipped, users often unpack them; a dataset
//! should not care. The gzip magic number decides, not the file name.

use std::io::Read;
use std::path::Path;

use flate2::read::MultiGzDecoder;

use crate::error::DataError;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The contents of `path`, decompressed if it is gzip data.
pub fn read_maybe_gz(path: &Path) -> Result<Vec<u8>, DataError> {
    let raw = std::fs::read(path).map_err(|source| DataError::Io { path: path.to_path_buf(), source })?;
    decompress_if_gz(raw, path)
}

/// `bytes` decompressed if it starts with the gzip magic number, unchanged otherwise.
pub fn decompress_if_gz(bytes: Vec<u8>, path: &Path) -> Result<Vec<u8>, DataError> {
    if !bytes.starts_with(&GZIP_MAGIC) {
        return Ok(bytes);
    }
    let mut out = Vec::with_capacity(bytes.len() * 3);
    MultiGzDecoder::new(bytes.as_slice())
        .read_to_end(&mut out)
        .map_err(|source| DataError::Io { path: path.to_path_buf(), source })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use std::io::Write;

    #[test]
    fn plain_and_gzip_and_corrupt() {
        let p = Path::new("mem");
        assert_eq!(decompress_if_gz(b"hello".to_vec(), p).unwrap(), b"hello");
        let mut enc = GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(b"hello gz").unwrap();
        let gz = enc.finish().unwrap();
        assert_eq!(decompress_if_gz(gz.clone(), p).unwrap(), b"hello gz");
        let truncated = gz[..gz.len() / 2].to_vec();
        assert!(matches!(decompress_if_gz(truncated, p), Err(DataError::Io { .. })));
        assert!(matches!(read_maybe_gz(Path::new("/nonexistent/file")), Err(DataError::Io { .. })));
    }
}
