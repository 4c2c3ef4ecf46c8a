//! Dataset files: bytes as an IDX array (Fashion-MNIST), gzipped or not, and as the digits CSV.
//! Either a value consistent with its header or a typed error. The CI counterparts are the
//! proptests in `crates/ferrite-data/src/idx.rs` and `file_bytes.rs`.
#![no_main]

use std::path::Path;

use ferrite_data::file_bytes::decompress_if_gz;
use ferrite_data::idx::parse_idx;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let p = Path::new("fuzz.idx");
    if let Ok(a) = parse_idx(data, p) {
        assert_eq!(a.dims.iter().product::<usize>(), a.data.len());
    }
    if let Ok(plain) = decompress_if_gz(data.to_vec(), Path::new("fuzz.idx.gz")) {
        if let Ok(a) = parse_idx(&plain, p) {
            assert_eq!(a.dims.iter().product::<usize>(), a.data.len());
        }
    }
    if let Ok((pixels, labels)) = ferrite_data::digits::parse_csv(&String::from_utf8_lossy(data)) {
        assert_eq!(pixels.len(), labels.len() * 64);
    }
});
